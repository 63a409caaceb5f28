/*
 * gpuarr_transfer_model.h -- TEMPORARY STAND-IN (branch wip-offload, issue 18 part O).
 *
 * The real transfer model (issue 18 part T: fitted per device pair, persisted, lazily calibrated)
 * replaces this file at merge. This stand-in has exactly the two internal functions of the shared
 * design, implemented simply: a pair's model exists only when gpuarr__transfer_set_model set it;
 * otherwise *modeled = false and *seconds is the fallback (0 when nothing moves, else
 * bytes / 1 GB/s). Nothing of part O may depend on more than these two signatures.
 */
#ifndef GPUARR_TRANSFER_MODEL_INCLUDED
#define GPUARR_TRANSFER_MODEL_INCLUDED

typedef enum gpuarr__xfer_mem {   /* the memory the source data is in */
    GPUARR__XFER_PAGEABLE,        /* ordinary host memory (malloc'd, or a host array not pinned) */
    GPUARR__XFER_PINNED,          /* page-locked host memory (gpuarr_empty_pinned) */
    GPUARR__XFER_DEVICE,          /* device memory of src */
    GPUARR__XFER_MEM_COUNT
} gpuarr__xfer_mem;

#define GPUARR__XFER_STANDIN_MAX 256
typedef struct gpuarr__xfer_standin {
    const gpuarr__dev *src, *dst;
    gpuarr__xfer_mem mem;
    bool cast;
    double latency_s, bytes_per_s;
} gpuarr__xfer_standin;
/* stand-in only: the one table, compared by device address (never dereferenced) */
static struct {
    pthread_mutex_t lock;
    gpuarr__xfer_standin models[GPUARR__XFER_STANDIN_MAX];
    int count;
} gpuarr__xfer_standin_table = {PTHREAD_MUTEX_INITIALIZER, {{NULL, NULL, GPUARR__XFER_PAGEABLE, false, 0, 0}}, 0};

GPUARR__FOR_BACKENDS static void gpuarr__transfer_set_model(gpuarr__dev *src, gpuarr__xfer_mem mem, gpuarr__dev *dst, bool cast, double latency_s,
                                       double bytes_per_s) {
    pthread_mutex_lock(&gpuarr__xfer_standin_table.lock);
    int i = 0;
    for (; i < gpuarr__xfer_standin_table.count; i++) {
        gpuarr__xfer_standin *m = &gpuarr__xfer_standin_table.models[i];
        if (m->src == src && m->dst == dst && m->mem == mem && m->cast == cast) break;
    }
    if (i < GPUARR__XFER_STANDIN_MAX) {
        gpuarr__xfer_standin *m = &gpuarr__xfer_standin_table.models[i];
        m->src = src, m->dst = dst, m->mem = mem, m->cast = cast;
        m->latency_s = latency_s, m->bytes_per_s = bytes_per_s;
        if (i == gpuarr__xfer_standin_table.count) gpuarr__xfer_standin_table.count++;
    }
    pthread_mutex_unlock(&gpuarr__xfer_standin_table.lock);
}

static gpuarr_result gpuarr__transfer_predict(gpuarr__dev *src, gpuarr__xfer_mem mem, gpuarr__dev *dst, gpuarr_dtype src_t,
                                              gpuarr_dtype dst_t, uint64_t bytes, double *seconds, bool *modeled) {
    bool cast = src_t != dst_t;
    bool same = src == dst || (!cast && (src->info.host_unified || src->backend->host_memory) &&
                               (dst->info.host_unified || dst->backend->host_memory));
    if (same && !cast) {
        *seconds = 0;
        *modeled = true;
        return GPUARR_OK;
    }
    pthread_mutex_lock(&gpuarr__xfer_standin_table.lock);
    *modeled = false;
    for (int i = 0; i < gpuarr__xfer_standin_table.count; i++) {
        const gpuarr__xfer_standin *m = &gpuarr__xfer_standin_table.models[i];
        if (m->src == src && m->dst == dst && m->mem == mem && m->cast == cast) {
            *seconds = m->latency_s + (double)bytes / m->bytes_per_s;
            *modeled = true;
        }
    }
    pthread_mutex_unlock(&gpuarr__xfer_standin_table.lock);
    if (!*modeled) *seconds = same ? 0 : (double)bytes / 1e9;
    return GPUARR_OK;
}

#endif /* GPUARR_TRANSFER_MODEL_INCLUDED */
