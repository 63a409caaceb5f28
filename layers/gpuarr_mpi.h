/* gpuarr_mpi.h -- the opt-in MPI layer (the manual's MPI section), a layer on the core. Included
   by the implementation when GPUARR_MPI is defined; <mpi.h> came first (the declarations check);
   registers in gpuarr__layer_list.

   A message is a 32-byte header (the sender's dtype, element count and chunk size) followed by
   the elements in chunks, every part on the caller's comm, peer and tag. Two messages to one
   peer with one tag are never interleaved: a send waits to post its first part until the sends
   before it to that (comm, peer, tag) have posted their last, and a receive until the receives
   before it that could match the same messages have posted theirs (MPI's order does the rest).
   Each transfer is a small state machine moved on by every gpuarr_mpi_wait of the process: two
   chunks in flight, one copied between the device and pinned host memory on a gpuarr stream
   while the other travels. gpuarr__mpi.lock guards the table and every MPI call of a transfer;
   a wait lets it go between polls, so the waits of other threads poll too. */

#if defined(OPEN_MPI) && OPEN_MPI && !defined(GPUARR__MPI_NO_EXT)
#include <mpi-ext.h> /* MPIX_CUDA_AWARE_SUPPORT, MPIX_Query_cuda_support */
#endif
#if defined(MPIX_CUDA_AWARE_SUPPORT) && MPIX_CUDA_AWARE_SUPPORT
#define GPUARR__MPI_CUDA_AWARE_BUILD 1
#else
#define GPUARR__MPI_CUDA_AWARE_BUILD 0
#endif

#define GPUARR__MPI_MAGIC 0x67614d31u /* "1Mag": a gpuarr message header */
#define GPUARR__MPI_MAX_REQUESTS 4096
#define GPUARR__MPI_DEFAULT_CHUNK ((uint64_t)4 << 20)
#define GPUARR__MPI_MAX_CHUNK ((uint64_t)1 << 30) /* an MPI count is an int */
#define GPUARR__MPI_DEFAULT_TIMEOUT_MS 60000L
#define GPUARR__MPI_SHUTDOWN_MS 1000 /* the last gpuarr_shutdown: what MPI gets to let go of cancelled transfers */

typedef struct gpuarr__mpi_header {
    uint32_t magic;
    int32_t dtype;
    int64_t count;
    int64_t chunk_elems;
    int64_t reserved;
} gpuarr__mpi_header;

typedef struct gpuarr__mpi_req {
    bool used, finished, is_send, started, direct, drain;
    bool waited;                /* a gpuarr_mpi_wait has it: a second one is refused */
    bool recorded[2];           /* ev[i] was recorded: synced before buf[i] goes */
    long timeout_ms;            /* GPUARR_MPI_TIMEOUT_MS, read when the transfer was made */
    uint16_t gen;
    uint16_t cycle_gen;         /* gen when this gpuarr_init cycle began: ids below are older */
    gpuarr_result result;
    char error[1024];
    gpuarr_array a;             /* retained while the transfer runs */
    gpuarr_device dev;          /* a's device */
    int64_t first, count;
    gpuarr_dtype wire;          /* the sender's dtype: what travels */
    size_t wsize;
    int peer, tag;              /* as given (a receive may name MPI_ANY_*) */
    int src, rtag;              /* a receive's matched source and tag, from the header */
    MPI_Comm comm;
    gpuarr__mpi_header *hdr;   /* its own memory: a cancelled receive may outlive the slot */
    MPI_Request hreq;
    bool hdr_done;
    unsigned char *base;        /* direct: the array's memory at `first` */
    int64_t chunk_elems, nchunks, next_copy, next_post, next_done;
    MPI_Request mreq[2];
    gpuarr_stream stream;       /* {0}: see gpuarr__mpi_staging */
    gpuarr_array buf[2];
    unsigned char *bufp[2];
    gpuarr_event ev[2];
    uint64_t seq;               /* order of creation: who posts first */
} gpuarr__mpi_req;

/* A cancelled transfer whose MPI requests have not completed yet: its memory is kept until
   they do (MPI may still write into it). */
typedef struct gpuarr__mpi_zombie {
    MPI_Request r[3];
    MPI_Comm comm;              /* its MPI_Test runs under MPI_ERRORS_RETURN too */
    gpuarr_array keep[3];
    gpuarr__array *held[3];     /* left to MPI for good (gpuarr__mpi.left): references never dropped */
    gpuarr__mpi_header *hdr;
    struct gpuarr__mpi_zombie *next;
} gpuarr__mpi_zombie;

static struct {
    pthread_mutex_t lock;
    gpuarr__mpi_req *reqs; /* GPUARR__MPI_MAX_REQUESTS slots, made at first use */
    int top;               /* slots [top, max) are unused: the scans stop there */
    uint64_t seq;
    gpuarr__mpi_zombie *zombies;
    double moved_at; /* when a transfer of the process last moved: the timeouts' clock */
    pthread_mutex_t eh_lock; /* the error handler swaps (gpuarr__mpi_eh_enter) */
    struct gpuarr__mpi_swap *swaps;
    gpuarr__mpi_zombie *left; /* what a last gpuarr_shutdown left to MPI for good, kept reachable */
    bool hooked;              /* atomic: gpuarr_mpi was used; from then on every last shutdown ends its transfers */
} gpuarr__mpi = {PTHREAD_MUTEX_INITIALIZER, NULL, 0, 0, NULL, 0, PTHREAD_MUTEX_INITIALIZER, NULL, NULL, false};

/* The call's name back in the thread's error state before failing under it. */
#define GPUARR__MPI_FAIL(fn, ...) (gpuarr__tls.api = (fn), gpuarr__fail(__VA_ARGS__))

/* The name errors of the state machine are made under: left out of their messages. */
static const char gpuarr__mpi_inside[] = "gpuarr_mpi";
/* A gpuarr call inside a transfer's step: its name stays on its own error only. */
#define GPUARR__MPI_INNER(expr)                                                                \
    do {                                                                                       \
        gpuarr_result gpuarr__ri = (expr);                                                     \
        gpuarr__tls.api = gpuarr__mpi_inside;                                                  \
        if (gpuarr__ri != GPUARR_OK) return gpuarr__ri;                                        \
    } while (0)

/* An error a gpuarr call inside made, given the MPI call's name: "api: inner: reason". */
static gpuarr_result gpuarr__mpi_rename(const char *api, gpuarr_result r) {
    char detail[sizeof gpuarr__tls.error_detail];
    snprintf(detail, sizeof detail, "%s", gpuarr_last_error());
    return GPUARR__MPI_FAIL(api, r, "%s", detail);
}

/* ---- settings, read when a transfer is made: GPUARR_MPI_CHUNK, _TIMEOUT_MS, _CUDA_AWARE ---- */
static gpuarr_result gpuarr__mpi_chunk_bytes(const char *api, uint64_t *out) {
    const char *v = gpuarr__env("GPUARR_MPI_CHUNK", GPUARR__ENV_KEPT);
    *out = GPUARR__MPI_DEFAULT_CHUNK;
    if (!v || !*v) return GPUARR_OK;
    uint64_t b = 0;
    if (!gpuarr__parse_bytes(v, strlen(v), &b) || b < 8 || b > GPUARR__MPI_MAX_CHUNK)
        return GPUARR__MPI_FAIL(api, GPUARR_ERROR_INVALID_ARGUMENT,
                                "GPUARR_MPI_CHUNK = \"%s\": expected bytes from 8 to 1G (K, M, G suffixes)", v);
    *out = b;
    return GPUARR_OK;
}

static gpuarr_result gpuarr__mpi_timeout_ms(const char *api, long *out) {
    const char *v = gpuarr__env("GPUARR_MPI_TIMEOUT_MS", GPUARR__ENV_KEPT);
    *out = GPUARR__MPI_DEFAULT_TIMEOUT_MS;
    if (!v || !*v) return GPUARR_OK;
    long ms = 0;
    if (strcmp(v, "-1") == 0) ms = -1;
    else if (!gpuarr__parse_uint(v, strlen(v), 999999999L, &ms))
        return GPUARR__MPI_FAIL(api, GPUARR_ERROR_INVALID_ARGUMENT,
                                "GPUARR_MPI_TIMEOUT_MS = \"%s\": expected milliseconds >= 0, or -1 (forever)", v);
    *out = ms;
    return GPUARR_OK;
}

/* 1: cuda arrays go straight to MPI; 0: staged. */
static gpuarr_result gpuarr__mpi_cuda_aware(const char *api, int *out) {
    const char *v = gpuarr__env("GPUARR_MPI_CUDA_AWARE", GPUARR__ENV_IGNORED);
    *out = 0;
    if (v && *v && gpuarr__streq_nocase(v, "off")) return GPUARR_OK;
    if (v && *v && gpuarr__streq_nocase(v, "on")) {
        *out = 1;
        return GPUARR_OK;
    }
    if (v && *v && !gpuarr__streq_nocase(v, "auto"))
        return GPUARR__MPI_FAIL(api, GPUARR_ERROR_INVALID_ARGUMENT, "GPUARR_MPI_CUDA_AWARE = \"%s\": expected on, off or auto", v);
#if GPUARR__MPI_CUDA_AWARE_BUILD
    *out = MPIX_Query_cuda_support() == 1;
#endif
    return GPUARR_OK;
}

/* ---- MPI errors: the comm's handler is MPI_ERRORS_RETURN during gpuarr's calls only ---- */
typedef struct gpuarr__mpi_eh {
    MPI_Comm comm;
    bool swapped;
} gpuarr__mpi_eh;

/* A comm whose handler gpuarr has swapped: the caller's, put back when the last of the calls
   inside (on any thread) leaves; a second swap saving MPI_ERRORS_RETURN would lose it. */
typedef struct gpuarr__mpi_swap {
    MPI_Comm comm;
    MPI_Errhandler saved;
    int users;
    struct gpuarr__mpi_swap *next;
} gpuarr__mpi_swap;

static void gpuarr__mpi_eh_enter(gpuarr__mpi_eh *eh, MPI_Comm comm) {
    eh->comm = comm;
    eh->swapped = false;
    if (comm == MPI_COMM_NULL) return;
    pthread_mutex_lock(&gpuarr__mpi.eh_lock);
    gpuarr__mpi_swap *w = gpuarr__mpi.swaps;
    while (w && w->comm != comm) w = w->next;
    if (w) {
        w->users++;
        eh->swapped = true;
    } else if ((w = (gpuarr__mpi_swap *)calloc(1, sizeof *w)) != NULL) {
        if (MPI_Comm_get_errhandler(comm, &w->saved) == MPI_SUCCESS) {
            if (MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN) == MPI_SUCCESS) {
                w->comm = comm;
                w->users = 1;
                w->next = gpuarr__mpi.swaps;
                gpuarr__mpi.swaps = w;
                eh->swapped = true;
            } else {
                MPI_Errhandler_free(&w->saved);
            }
        }
        if (!eh->swapped) free(w);
    }
    pthread_mutex_unlock(&gpuarr__mpi.eh_lock);
}

static void gpuarr__mpi_eh_leave(gpuarr__mpi_eh *eh) {
    if (!eh->swapped) return;
    pthread_mutex_lock(&gpuarr__mpi.eh_lock);
    for (gpuarr__mpi_swap **p = &gpuarr__mpi.swaps; *p; p = &(*p)->next) {
        gpuarr__mpi_swap *w = *p;
        if (w->comm != eh->comm || --w->users > 0) continue;
        MPI_Comm_set_errhandler(w->comm, w->saved);
        MPI_Errhandler_free(&w->saved);
        *p = w->next;
        free(w);
        break;
    }
    pthread_mutex_unlock(&gpuarr__mpi.eh_lock);
    eh->swapped = false;
}

/* An MPI error code as a gpuarr result, MPI's words in the message. */
static gpuarr_result gpuarr__mpi_error(int code, const char *what) {
    char text[MPI_MAX_ERROR_STRING + 1];
    int len = 0, cls = 0;
    if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) len = snprintf(text, sizeof text, "MPI error %d", code);
    text[len < 0 ? 0 : GPUARR__MIN(len, MPI_MAX_ERROR_STRING)] = '\0';
    MPI_Error_class(code, &cls);
    gpuarr_result r = GPUARR_ERROR_BACKEND;
    if (cls == MPI_ERR_RANK || cls == MPI_ERR_TAG || cls == MPI_ERR_COMM || cls == MPI_ERR_COUNT || cls == MPI_ERR_TRUNCATE ||
        cls == MPI_ERR_ARG || cls == MPI_ERR_TYPE || cls == MPI_ERR_OP || cls == MPI_ERR_BUFFER)
        r = GPUARR_ERROR_INVALID_ARGUMENT;
    else if (cls == MPI_ERR_NO_MEM)
        r = GPUARR_ERROR_OUT_OF_MEMORY;
    return gpuarr__fail(r, "%s: %s", what, text);
}

/* ---- requests ---- */
static gpuarr_result gpuarr__mpi_table(void) {
    if (gpuarr__mpi.reqs) return GPUARR_OK;
    gpuarr__mpi.reqs = (gpuarr__mpi_req *)calloc(GPUARR__MPI_MAX_REQUESTS, sizeof *gpuarr__mpi.reqs);
    return gpuarr__mpi.reqs ? GPUARR_OK : gpuarr__fail(GPUARR_ERROR_OUT_OF_MEMORY, "no memory for the MPI request table");
}

static uint32_t gpuarr__mpi_id(const gpuarr__mpi_req *q) {
    return ((uint32_t)q->gen << 16) | (uint32_t)(q - gpuarr__mpi.reqs + 1);
}

static gpuarr__mpi_req *gpuarr__mpi_lookup(uint32_t id) {
    uint32_t index = id & 0xffffu;
    if (!gpuarr__mpi.reqs || index == 0 || index > GPUARR__MPI_MAX_REQUESTS) return NULL;
    gpuarr__mpi_req *q = &gpuarr__mpi.reqs[index - 1];
    return q->used && q->gen == (uint16_t)(id >> 16) ? q : NULL;
}

/* Waits for the device copies q queued: a staging buffer goes back to the pool (where the next
   owner gets it at once) only once no copy into or out of it is left. */
static void gpuarr__mpi_req_quiesce(gpuarr__mpi_req *q) {
    gpuarr__error_saved sv;
    gpuarr__error_save(&sv);
    for (int i = 0; i < 2; i++)
        if (q->recorded[i] && q->ev[i].id) gpuarr_event_sync(q->ev[i]);
    q->recorded[0] = q->recorded[1] = false;
    gpuarr__error_restore(&sv);
}

/* Frees what the request holds; its MPI requests are all complete or handed to a zombie. */
static void gpuarr__mpi_req_free(gpuarr__mpi_req *q) {
    gpuarr__mpi_req_quiesce(q);
    gpuarr__error_saved sv;
    gpuarr__error_save(&sv);
    for (int i = 0; i < 2; i++) {
        if (q->buf[i].id) gpuarr_release(q->buf[i]);
        if (q->ev[i].id) gpuarr_event_destroy(q->ev[i]);
    }
    if (q->a.id) gpuarr_release(q->a);
    free(q->hdr);
    gpuarr__error_restore(&sv);
    uint16_t gen = (uint16_t)(q->gen + 1), cycle_gen = q->cycle_gen;
    memset(q, 0, sizeof *q);
    q->gen = gen ? gen : 1;
    q->cycle_gen = cycle_gen;
    q->hreq = q->mreq[0] = q->mreq[1] = MPI_REQUEST_NULL; /* not 0: MPI_REQUEST_NULL need not be */
    while (gpuarr__mpi.top > 0 && !gpuarr__mpi.reqs[gpuarr__mpi.top - 1].used) gpuarr__mpi.top--;
}

/* Frees what a zombie kept: MPI is done with its requests (or finalized: it writes no more). */
static void gpuarr__mpi_zombie_free(gpuarr__mpi_zombie *z) {
    for (int i = 0; i < 3; i++)
        if (z->keep[i].id) gpuarr_release(z->keep[i]);
    free(z->hdr);
    free(z);
}

/* Keeps h's memory for good: a reference to its array that nothing drops, so neither a release
   nor the last gpuarr_shutdown frees memory MPI may still write. Returns the array's bytes. */
static size_t gpuarr__mpi_hold_forever(gpuarr_array h, gpuarr__array **out) {
    *out = NULL;
    if (!h.id) return 0;
    gpuarr__error_saved sv;
    gpuarr__error_save(&sv);
    if (gpuarr__get_array(h, "a", out) != GPUARR_OK) *out = NULL;
    gpuarr__error_restore(&sv);
    return *out ? (*out)->nbytes : 0;
}

static void gpuarr__mpi_zombie_reap(void) {
    for (gpuarr__mpi_zombie **p = &gpuarr__mpi.zombies; *p;) {
        gpuarr__mpi_zombie *z = *p;
        bool all = true;
        gpuarr__mpi_eh eh;
        gpuarr__mpi_eh_enter(&eh, z->comm);
        for (int i = 0; i < 3; i++) {
            if (z->r[i] == MPI_REQUEST_NULL) continue;
            int flag = 0; /* an erring MPI_Test keeps the memory: MPI may still touch it */
            if (MPI_Test(&z->r[i], &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS) flag = 0;
            all = all && flag;
        }
        gpuarr__mpi_eh_leave(&eh);
        if (!all) {
            p = &z->next;
            continue;
        }
        *p = z->next;
        gpuarr__mpi_zombie_free(z);
    }
}

/* Cancels what q posted and frees it; memory MPI may still touch waits in a zombie. */
static void gpuarr__mpi_req_cancel(gpuarr__mpi_req *q) {
    gpuarr__mpi_req_quiesce(q); /* the memory may go to a zombie, then to the pool */
    MPI_Request rs[3] = {q->hreq, q->mreq[0], q->mreq[1]};
    bool pending = false;
    for (int i = 0; i < 3; i++) {
        if (rs[i] == MPI_REQUEST_NULL) continue;
        MPI_Cancel(&rs[i]);
        int flag = 0;
        MPI_Test(&rs[i], &flag, MPI_STATUS_IGNORE);
        pending = pending || !flag;
    }
    q->hreq = q->mreq[0] = q->mreq[1] = MPI_REQUEST_NULL;
    gpuarr__mpi_zombie *z = pending ? (gpuarr__mpi_zombie *)calloc(1, sizeof *z) : NULL;
    if (z) {
        memcpy(z->r, rs, sizeof rs);
        z->comm = q->comm;
        z->keep[0] = q->a, z->keep[1] = q->buf[0], z->keep[2] = q->buf[1];
        z->hdr = q->hdr;
        q->a.id = q->buf[0].id = q->buf[1].id = 0;
        q->hdr = NULL;
        z->next = gpuarr__mpi.zombies;
        gpuarr__mpi.zombies = z;
    } else if (pending) { /* no memory for the record: keep the memory alive for good */
        gpuarr__array *held = NULL;
        gpuarr_array hs[3] = {q->a, q->buf[0], q->buf[1]};
        for (int i = 0; i < 3; i++) gpuarr__mpi_hold_forever(hs[i], &held);
        q->hdr = NULL; /* and the rest goes with the request */
    }
}

/* Ends q with the error now in the thread's state, prefixed with what q was; an error of a
   gpuarr call inside keeps that call's name. */
static void gpuarr__mpi_req_error(gpuarr__mpi_req *q, gpuarr_result r) {
    const char *why = gpuarr__tls.error_api == gpuarr__mpi_inside ? gpuarr__tls.error_detail : gpuarr_last_error();
    snprintf(q->error, sizeof q->error, "the %s %s rank %d (tag %d): %.900s", q->is_send ? "send" : "receive",
             q->is_send ? "to" : "from", q->src, q->rtag, why);
    q->result = r;
    q->finished = true;
    gpuarr__mpi_req_cancel(q);
}

/* ---- the state machine ---- */
/* Chunks of chunk_elems (> 0) that count elements (>= 0) take, rounded up without adding first:
   a peer's count may be close to INT64_MAX. */
static int64_t gpuarr__mpi_nchunks(int64_t count, int64_t chunk_elems) {
    return count / chunk_elems + (count % chunk_elems != 0);
}

static int64_t gpuarr__mpi_chunk_len(const gpuarr__mpi_req *q, int64_t k) {
    int64_t left = q->count - k * q->chunk_elems;
    return left < q->chunk_elems ? left : q->chunk_elems;
}

/* Staging buffers (pinned, from dev's pool), for chunks of q->chunk_elems. The copies go on the
   stream {0} (the calling thread's current or default stream on the device): making a stream per
   transfer costs more than a small message (a command queue on OpenCL). Each chunk's copy and
   its event are queued in one step, so a step on another thread, on another stream, is as safe:
   a buffer is reused only after its event (or its MPI request) has completed. */
static gpuarr_result gpuarr__mpi_staging(gpuarr__mpi_req *q, gpuarr_device where) {
    int64_t n = q->count < q->chunk_elems ? q->count : q->chunk_elems;
    int64_t bytes = n * (int64_t)q->wsize;
    for (int i = 0; i < 2 && i < q->nchunks; i++) {
        GPUARR__MPI_INNER(gpuarr_empty_pinned(where, GPUARR_U8, 1, &bytes, &q->buf[i]));
        void *p = NULL;
        GPUARR__MPI_INNER(gpuarr_host_data(q->buf[i], &p));
        q->bufp[i] = (unsigned char *)p;
        GPUARR__MPI_INNER(gpuarr_event_create(where, 0, &q->ev[i]));
    }
    return GPUARR_OK;
}

/* Whether an earlier live transfer must post all its parts before q posts its first. */
static bool gpuarr__mpi_blocked(const gpuarr__mpi_req *q) {
    for (int i = 0; i < gpuarr__mpi.top; i++) {
        const gpuarr__mpi_req *o = &gpuarr__mpi.reqs[i];
        if (!o->used || o == q || o->finished || o->seq > q->seq || o->is_send != q->is_send || o->comm != q->comm) continue;
        bool all_posted = o->started && (o->is_send || o->hdr_done) && o->next_post == o->nchunks;
        if (all_posted) continue;
        bool peer = o->peer == q->peer || (!q->is_send && (o->peer == MPI_ANY_SOURCE || q->peer == MPI_ANY_SOURCE));
        bool tag = o->tag == q->tag || (!q->is_send && (o->tag == MPI_ANY_TAG || q->tag == MPI_ANY_TAG));
        if (peer && tag) return true;
    }
    return false;
}

static gpuarr_result gpuarr__mpi_start(gpuarr__mpi_req *q) {
    int rc;
    if (q->is_send) {
        q->hdr->magic = GPUARR__MPI_MAGIC;
        q->hdr->dtype = (int32_t)q->wire;
        q->hdr->count = q->count;
        q->hdr->chunk_elems = q->chunk_elems;
        if (!q->direct) GPUARR__CHECK(gpuarr__mpi_staging(q, q->dev)); /* before the header: all or nothing */
        rc = MPI_Isend(q->hdr, (int)sizeof *q->hdr, MPI_BYTE, q->peer, q->tag, q->comm, &q->hreq);
        if (rc != MPI_SUCCESS) return gpuarr__mpi_error(rc, "MPI_Isend of the header");
    } else {
        rc = MPI_Irecv(q->hdr, (int)sizeof *q->hdr, MPI_BYTE, q->peer, q->tag, q->comm, &q->hreq);
        if (rc != MPI_SUCCESS) return gpuarr__mpi_error(rc, "MPI_Irecv of the header");
    }
    q->started = true;
    return GPUARR_OK;
}

/* The header arrived: check it against what the receive expects. A mismatch still takes the
   message's chunks (dropped), so that the next message on this peer and tag is not spoiled. */
static gpuarr_result gpuarr__mpi_recv_header(gpuarr__mpi_req *q, const MPI_Status *st) {
    int bytes = 0;
    MPI_Get_count(st, MPI_BYTE, &bytes);
    q->src = st->MPI_SOURCE;
    q->rtag = st->MPI_TAG;
    if (bytes != (int)sizeof *q->hdr || q->hdr->magic != GPUARR__MPI_MAGIC)
        return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "rank %d sent %d bytes with tag %d that are not a gpuarr_mpi message",
                            q->src, bytes, q->rtag);
    gpuarr_dtype sent = (gpuarr_dtype)q->hdr->dtype;
    bool ok_dtype = gpuarr_dtype_size(sent) != 0;
    if (!ok_dtype || q->hdr->count < 0 || q->hdr->chunk_elems <= 0 ||
        (uint64_t)q->hdr->chunk_elems > GPUARR__MPI_MAX_CHUNK / gpuarr_dtype_size(sent))
        return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "rank %d sent a damaged gpuarr_mpi header (dtype %d, count %lld)",
                            q->src, (int)q->hdr->dtype, (long long)q->hdr->count);
    /* no sender's array holds more (gpuarr's arrays are at most PTRDIFF_MAX bytes): a count like
       that would only be drained, chunk by chunk, for as long as the timeout lets it */
    if ((uint64_t)q->hdr->count > (uint64_t)PTRDIFF_MAX / gpuarr_dtype_size(sent))
        return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT,
                            "rank %d sent a header for %lld elements of %s (tag %d): more bytes than an array can hold "
                            "(PTRDIFF_MAX); refused, its chunks not taken",
                            q->src, (long long)q->hdr->count, gpuarr_dtype_name(sent), q->rtag);
    gpuarr_result r = GPUARR_OK;
    if (sent != q->wire || q->hdr->count != q->count)
        r = gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT,
                         "rank %d sent %lld elements of %s (tag %d); this receive expected %lld elements of %s",
                         q->src, (long long)q->hdr->count, gpuarr_dtype_name(sent), q->rtag, (long long)q->count,
                         gpuarr_dtype_name(q->wire));
    /* from here on the message's layout is the sender's */
    q->drain = r != GPUARR_OK;
    if (q->drain) gpuarr__copy_string(q->error, sizeof q->error, gpuarr__tls.error_detail);
    q->wire = sent;
    q->wsize = gpuarr_dtype_size(sent);
    q->count = q->hdr->count;
    q->chunk_elems = q->hdr->chunk_elems;
    q->nchunks = gpuarr__mpi_nchunks(q->count, q->chunk_elems);
    if (q->drain) q->direct = false;
    if (!q->direct) {
        gpuarr_result s = gpuarr__mpi_staging(q, q->drain ? gpuarr_host() : q->dev);
        if (s != GPUARR_OK && q->drain) { /* no buffer to drain into: fail now, chunks left behind */
            char why[sizeof gpuarr__tls.error_detail];
            gpuarr__copy_string(why, sizeof why, gpuarr__tls.error_detail);
            q->drain = false;
            return gpuarr__fail(s, "%.400s; and its chunks cannot be drained (%.400s): this peer and tag are out of step",
                                q->error[0] ? q->error : "mismatch", why);
        }
        if (r == GPUARR_OK) r = s;
    }
    return r;
}

static unsigned char *gpuarr__mpi_chunk_ptr(gpuarr__mpi_req *q, int64_t k) {
    return q->direct ? q->base + (size_t)(k * q->chunk_elems) * q->wsize : q->bufp[k % 2];
}

static gpuarr_result gpuarr__mpi_step_send(gpuarr__mpi_req *q, bool *moved) {
    while (q->next_copy < q->nchunks && q->next_copy < q->next_done + 2) { /* the buffer is free */
        int64_t k = q->next_copy, n = gpuarr__mpi_chunk_len(q, k);
        if (!q->direct) {
            GPUARR__MPI_INNER(gpuarr_read_async(q->a, q->first + k * q->chunk_elems, n, q->wire, q->bufp[k % 2], q->stream));
            GPUARR__MPI_INNER(gpuarr_event_record(q->ev[k % 2], q->stream));
            q->recorded[k % 2] = true; /* synced before the buffer goes */
        }
        q->next_copy++;
        *moved = true;
    }
    while (q->next_post < q->next_copy) {
        int64_t k = q->next_post;
        bool ready = true;
        if (!q->direct) GPUARR__MPI_INNER(gpuarr_event_query(q->ev[k % 2], &ready));
        if (!ready) break;
        int rc = MPI_Isend(gpuarr__mpi_chunk_ptr(q, k), (int)((size_t)gpuarr__mpi_chunk_len(q, k) * q->wsize), MPI_BYTE,
                           q->peer, q->tag, q->comm, &q->mreq[k % 2]);
        if (rc != MPI_SUCCESS) return gpuarr__mpi_error(rc, "MPI_Isend");
        q->next_post++;
        *moved = true;
    }
    while (q->next_done < q->next_post) {
        int flag = 0, rc = MPI_Test(&q->mreq[q->next_done % 2], &flag, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) return gpuarr__mpi_error(rc, "MPI_Test of a chunk's send");
        if (!flag) break;
        q->next_done++;
        *moved = true;
    }
    return GPUARR_OK;
}

static gpuarr_result gpuarr__mpi_step_recv(gpuarr__mpi_req *q, bool *moved) {
    /* post a chunk's receive once its buffer's previous chunk is written out */
    while (q->next_post < q->nchunks && q->next_post < q->next_done + 2) {
        int64_t k = q->next_post;
        int rc = MPI_Irecv(gpuarr__mpi_chunk_ptr(q, k), (int)((size_t)gpuarr__mpi_chunk_len(q, k) * q->wsize), MPI_BYTE,
                           q->src, q->rtag, q->comm, &q->mreq[k % 2]);
        if (rc != MPI_SUCCESS) return gpuarr__mpi_error(rc, "MPI_Irecv");
        q->next_post++;
        *moved = true;
    }
    while (q->next_copy < q->next_post) { /* arrived: write it into the array, cast on the way */
        int64_t k = q->next_copy, n = gpuarr__mpi_chunk_len(q, k);
        int flag = 0;
        MPI_Status st;
        int rc = MPI_Test(&q->mreq[k % 2], &flag, &st);
        if (rc != MPI_SUCCESS) return gpuarr__mpi_error(rc, "MPI_Test of a chunk's receive");
        if (!flag) break;
        int bytes = 0;
        MPI_Get_count(&st, MPI_BYTE, &bytes);
        if ((size_t)bytes != (size_t)n * q->wsize)
            return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "chunk %lld from rank %d holds %d bytes, expected %zu",
                                (long long)k, q->src, bytes, (size_t)n * q->wsize);
        if (!q->direct && !q->drain) {
            GPUARR__MPI_INNER(gpuarr_write_async(q->a, q->first + k * q->chunk_elems, n, q->wire, q->bufp[k % 2], q->stream));
            GPUARR__MPI_INNER(gpuarr_event_record(q->ev[k % 2], q->stream));
            q->recorded[k % 2] = true;
        }
        q->next_copy++;
        *moved = true;
    }
    while (q->next_done < q->next_copy) {
        bool ready = true;
        if (!q->direct && !q->drain) GPUARR__MPI_INNER(gpuarr_event_query(q->ev[q->next_done % 2], &ready));
        if (!ready) break;
        q->next_done++;
        *moved = true;
    }
    return GPUARR_OK;
}

/* One step of q: what can go on without waiting. */
static gpuarr_result gpuarr__mpi_step(gpuarr__mpi_req *q, bool *moved) {
    if (!q->started) {
        if (gpuarr__mpi_blocked(q)) return GPUARR_OK;
        GPUARR__CHECK(gpuarr__mpi_start(q));
        *moved = true;
    }
    if (q->hreq != MPI_REQUEST_NULL) {
        int flag = 0;
        MPI_Status st;
        int rc = MPI_Test(&q->hreq, &flag, &st);
        if (rc != MPI_SUCCESS) return gpuarr__mpi_error(rc, q->is_send ? "MPI_Test of the header's send" : "MPI_Test of the header");
        if (flag) {
            *moved = true;
            q->hdr_done = true;
            if (!q->is_send) {
                gpuarr_result r = gpuarr__mpi_recv_header(q, &st);
                if (r != GPUARR_OK && !q->drain) return r;
                if (r != GPUARR_OK) { /* keep the mismatch's message for the end of the drain */
                    gpuarr__copy_string(q->error, sizeof q->error, gpuarr__tls.error_detail);
                    q->result = r;
                }
            }
        }
    }
    if (!q->is_send && !q->hdr_done) return GPUARR_OK;
    gpuarr_result r = q->is_send ? gpuarr__mpi_step_send(q, moved) : gpuarr__mpi_step_recv(q, moved);
    if (r == GPUARR_OK && q->hdr_done && q->next_done == q->nchunks) q->finished = true;
    return r;
}

/* Moves every live transfer on; errors end the transfer they belong to. */
static bool gpuarr__mpi_progress(void) {
    bool moved = false;
    gpuarr__mpi_zombie_reap();
    for (int i = 0; i < gpuarr__mpi.top; i++) {
        gpuarr__mpi_req *q = &gpuarr__mpi.reqs[i];
        if (!q->used || q->finished) continue;
        gpuarr__mpi_eh eh;
        gpuarr__mpi_eh_enter(&eh, q->comm);
        gpuarr__tls.api = gpuarr__mpi_inside;
        gpuarr_result r = gpuarr__mpi_step(q, &moved);
        if (r != GPUARR_OK) gpuarr__mpi_req_error(q, r);
        gpuarr__mpi_eh_leave(&eh);
        if (r != GPUARR_OK) moved = true;
    }
    if (moved) gpuarr__mpi.moved_at = gpuarr__now_ms();
    return moved;
}

/* ---- the calls ---- */
static gpuarr_result gpuarr__mpi_check_peer(const char *api, const char *arg, int peer, bool recv, int tag, MPI_Comm comm) {
    if (comm == MPI_COMM_NULL) return GPUARR__MPI_FAIL(api, GPUARR_ERROR_INVALID_ARGUMENT, "comm is MPI_COMM_NULL");
    int size = 0, inter = 0;
    int rc = MPI_Comm_test_inter(comm, &inter);
    if (rc == MPI_SUCCESS) rc = inter ? MPI_Comm_remote_size(comm, &size) : MPI_Comm_size(comm, &size);
    if (rc != MPI_SUCCESS) return (gpuarr__tls.api = api, gpuarr__mpi_error(rc, "comm"));
    bool any = recv && peer == MPI_ANY_SOURCE;
    if (peer != MPI_PROC_NULL && !any && (peer < 0 || peer >= size))
        return GPUARR__MPI_FAIL(api, GPUARR_ERROR_INVALID_ARGUMENT, "%s = %d is not a rank of comm (0..%d)%s", arg, peer,
                                size - 1, recv ? ", MPI_ANY_SOURCE or MPI_PROC_NULL" : " or MPI_PROC_NULL");
    void *ub = NULL;
    int flag = 0;
    MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &flag);
    int tag_ub = flag && ub ? *(int *)ub : 32767;
    if (!(recv && tag == MPI_ANY_TAG) && (tag < 0 || tag > tag_ub))
        return GPUARR__MPI_FAIL(api, GPUARR_ERROR_INVALID_ARGUMENT, "tag = %d is not within 0..%d (MPI_TAG_UB)%s", tag, tag_ub,
                                recv ? " or MPI_ANY_TAG" : "");
    return GPUARR_OK;
}

/* A new transfer of a's elements [first, first + count); *out its slot, not started. */
static gpuarr_result gpuarr__mpi_new(const char *api, bool is_send, gpuarr_array a, int64_t first, int64_t count,
                                     gpuarr_dtype sent, int peer, int tag, MPI_Comm comm, gpuarr__mpi_req **out) {
    gpuarr_array_info info;
    gpuarr_result r = gpuarr_array_get_info(a, &info);
    if (r != GPUARR_OK) return gpuarr__mpi_rename(api, r);
    if (first < 0 || first > info.count || count < -1 || (count >= 0 && count > info.count - first)) {
        char end[48]; /* first + count, which may not fit an int64_t */
        if (count < 0) snprintf(end, sizeof end, "%lld", (long long)info.count);
        else if (first > 0 && count > INT64_MAX - first) snprintf(end, sizeof end, "%lld + %lld", (long long)first, (long long)count);
        else snprintf(end, sizeof end, "%lld", (long long)(first + count));
        return GPUARR__MPI_FAIL(api, GPUARR_ERROR_INVALID_ARGUMENT, "elements [%lld, %s%s) are not within a's %lld (first >= 0, count >= -1)",
                                (long long)first, end, count < -1 ? " (count < -1)" : "", (long long)info.count);
    }
    if (!is_send && sent != 0 && gpuarr_dtype_size(sent) == 0)
        return GPUARR__MPI_FAIL(api, GPUARR_ERROR_INVALID_ARGUMENT, "sent = %d is not a gpuarr_dtype", (int)sent);
    if (!is_send && info.read_only) return GPUARR__MPI_FAIL(api, GPUARR_ERROR_INVALID_ARGUMENT, "a is read-only");
    GPUARR__CHECK(gpuarr__mpi_check_peer(api, is_send ? "dest" : "source", peer, !is_send, tag, comm));
    uint64_t chunk = 0;
    int aware = 0;
    long timeout = 0; /* every variable read now: a malformed one fails before anything is posted */
    GPUARR__CHECK(gpuarr__mpi_timeout_ms(api, &timeout));
    GPUARR__CHECK(gpuarr__mpi_chunk_bytes(api, &chunk));
    GPUARR__CHECK(gpuarr__mpi_cuda_aware(api, &aware));
    if (gpuarr__mpi_table() != GPUARR_OK) return GPUARR__MPI_FAIL(api, GPUARR_ERROR_OUT_OF_MEMORY, "no memory for the MPI request table");
    gpuarr__mpi_req *q = NULL;
    for (int i = 0; i < GPUARR__MPI_MAX_REQUESTS && !q; i++)
        if (!gpuarr__mpi.reqs[i].used) q = &gpuarr__mpi.reqs[i];
    if (q && (int)(q - gpuarr__mpi.reqs) >= gpuarr__mpi.top) gpuarr__mpi.top = (int)(q - gpuarr__mpi.reqs) + 1;
    if (!q) return GPUARR__MPI_FAIL(api, GPUARR_ERROR_OUT_OF_MEMORY, "%d gpuarr_mpi transfers are pending already", GPUARR__MPI_MAX_REQUESTS);
    if (!q->gen) q->gen = 1;
    q->used = true;
    q->is_send = is_send;
    q->timeout_ms = timeout;
    q->dev = info.device;
    q->first = first;
    q->count = count < 0 ? info.count - first : count;
    q->wire = is_send || !sent ? info.dtype : sent;
    q->wsize = gpuarr_dtype_size(q->wire);
    q->peer = q->src = peer;
    q->tag = q->rtag = tag;
    q->comm = comm;
    q->hreq = q->mreq[0] = q->mreq[1] = MPI_REQUEST_NULL;
    q->chunk_elems = (int64_t)(chunk / q->wsize);
    if (q->chunk_elems < 1) q->chunk_elems = 1;
    q->nchunks = gpuarr__mpi_nchunks(q->count, q->chunk_elems);
    q->seq = ++gpuarr__mpi.seq;
    q->hdr = (gpuarr__mpi_header *)calloc(1, sizeof *q->hdr);
    bool cuda = false; /* the backend, without gpuarr_device_get_info's query of free memory */
    gpuarr__array *arr = NULL;
    r = gpuarr__get_array(a, "a", &arr);
    if (r == GPUARR_OK) {
        cuda = arr->dev->backend->id == GPUARR_BACKEND_CUDA;
        /* the transfer's own handle on a's array, holding the reference gpuarr__get_array took:
           the caller may release a while the transfer runs, and a release of a too many is refused
           as for any stale handle instead of taking the transfer's reference */
        r = gpuarr__table_insert(&gpuarr__g.arrays, &arr->obj, &q->a.id);
        if (r != GPUARR_OK) gpuarr__obj_release(&arr->obj);
    }
    bool same = q->wire == info.dtype;
    void *p = NULL;
    if (r == GPUARR_OK && same && info.device.id == gpuarr_host().id) { /* host memory: MPI reads and writes it itself */
        r = gpuarr_array_sync(a);
        if (r == GPUARR_OK) r = gpuarr_host_data(a, &p);
        q->direct = true;
    } else if (r == GPUARR_OK && same && cuda && aware) { /* CUDA-aware MPI takes the device pointer */
        r = gpuarr_array_sync(a);
        if (r == GPUARR_OK) r = gpuarr_cuda_ptr(a, &p);
        q->direct = true;
    }
    q->base = p ? (unsigned char *)p + (size_t)first * info.itemsize : NULL;
    if (r == GPUARR_OK && !q->hdr) r = gpuarr__fail(GPUARR_ERROR_OUT_OF_MEMORY, "no memory for a message header");
    if (r != GPUARR_OK) {
        r = gpuarr__mpi_rename(api, r);
        gpuarr__mpi_req_free(q);
        return r;
    }
    if (peer == MPI_PROC_NULL) { /* nothing to move, as in MPI */
        q->started = q->hdr_done = q->finished = true;
        q->nchunks = 0;
    }
    *out = q;
    return GPUARR_OK;
}

/* Waits for n transfers (all made by one call: one GPUARR_MPI_TIMEOUT_MS); the first error wins,
   the others are cancelled. The limit is on standing still: it counts from the last time any
   transfer of the process moved (gpuarr__mpi.moved_at, whoever's poll saw it), or from this
   wait's start. The lock is let go between polls, so the waits of other threads poll too; only
   this wait frees qs (they are marked waited), so they stay valid. Called and returns locked. */
static gpuarr_result gpuarr__mpi_wait_many(const char *api, gpuarr__mpi_req **qs, int n) {
    gpuarr_result r = GPUARR_OK;
    long timeout = qs[0]->timeout_ms;
    for (int i = 0; i < n; i++) qs[i]->waited = true;
    double start = gpuarr__now_ms(), idle_since = 0;
    for (;;) {
        bool all = true;
        for (int i = 0; i < n; i++) all = all && qs[i]->finished;
        if (all) break;
        bool failed = false;
        for (int i = 0; i < n; i++) failed = failed || (qs[i]->finished && qs[i]->result != GPUARR_OK);
        if (failed) break;
        bool moved = gpuarr__mpi_progress();
        double now = gpuarr__now_ms();
        double still = now - (gpuarr__mpi.moved_at > start ? gpuarr__mpi.moved_at : start);
        if (!moved && timeout >= 0 && still > (double)timeout) {
            for (int i = 0; i < n; i++) {
                gpuarr__mpi_req *q = qs[i];
                if (q->finished) continue;
                snprintf(q->error, sizeof q->error,
                         "the %s %s rank %d (tag %d) did not move for %ld ms (GPUARR_MPI_TIMEOUT_MS): "
                         "cancelled, %lld of %lld chunks done%s",
                         q->is_send ? "send" : "receive", q->is_send ? "to" : "from", q->src, q->rtag, timeout,
                         (long long)q->next_done, (long long)q->nchunks, q->hdr_done ? "" : ", no header yet");
                q->result = GPUARR_ERROR_TIMEOUT;
                q->finished = true;
                gpuarr__mpi_eh eh;
                gpuarr__mpi_eh_enter(&eh, q->comm);
                gpuarr__mpi_req_cancel(q);
                gpuarr__mpi_eh_leave(&eh);
            }
            break;
        }
        pthread_mutex_unlock(&gpuarr__mpi.lock); /* other threads' waits poll in between */
        if (moved) idle_since = 0;
        else if (idle_since == 0)
            idle_since = now;
        else if (now - idle_since > 0.2) { /* polled 200 us in vain: sleep between polls */
            struct timespec ts = {0, now - idle_since < 10 ? 20000 : 1000000}; /* 20 us, after 10 ms 1 ms */
            nanosleep(&ts, NULL);
        }
        pthread_mutex_lock(&gpuarr__mpi.lock);
    }
    /* the first error (in argument order), then cancel and free everything */
    int bad = -1;
    for (int i = 0; i < n && bad < 0; i++)
        if (qs[i]->finished && qs[i]->result != GPUARR_OK) bad = i;
    if (bad >= 0) {
        r = qs[bad]->result;
        GPUARR__MPI_FAIL(api, r, "%s", qs[bad]->error);
    }
    for (int i = 0; i < n; i++) {
        if (!qs[i]->finished) {
            gpuarr__mpi_eh eh;
            gpuarr__mpi_eh_enter(&eh, qs[i]->comm);
            gpuarr__mpi_req_cancel(qs[i]);
            gpuarr__mpi_eh_leave(&eh);
        }
        gpuarr__mpi_req_free(qs[i]);
    }
    gpuarr__tls.api = api;
    return r;
}

/* ---- the last gpuarr_shutdown: no transfer outlives the memory MPI reads or writes ---- */
/* Ends every transfer in the table: what it posted is cancelled (its memory goes to a zombie
   where MPI has not let go of it yet) and the rest freed. After MPI_Finalize MPI may not be
   called and writes nothing more: the memory is freed at once. Returns how many there were. */
static int gpuarr__mpi_end_all(bool mpi_live) {
    int ended = 0;
    for (int i = 0; i < gpuarr__mpi.top; i++) { /* top drops as the last used slots go */
        gpuarr__mpi_req *q = &gpuarr__mpi.reqs[i];
        if (!q->used) continue;
        ended++;
        if (mpi_live) {
            gpuarr__mpi_eh eh;
            gpuarr__mpi_eh_enter(&eh, q->comm);
            gpuarr__mpi_req_cancel(q);
            gpuarr__mpi_eh_leave(&eh);
        }
        gpuarr__mpi_req_free(q);
    }
    return ended;
}

/* A zombie MPI did not let go of in time: its requests are freed (MPI_Request_free lets MPI
   finish them on its own, safe since the memory stays) and its memory kept for good, reachable
   from gpuarr__mpi.left. Returns the bytes kept. */
static size_t gpuarr__mpi_zombie_leave(gpuarr__mpi_zombie *z) {
    size_t bytes = z->hdr ? sizeof *z->hdr : 0;
    gpuarr__mpi_eh eh;
    gpuarr__mpi_eh_enter(&eh, z->comm);
    for (int i = 0; i < 3; i++)
        if (z->r[i] != MPI_REQUEST_NULL) MPI_Request_free(&z->r[i]);
    gpuarr__mpi_eh_leave(&eh);
    for (int i = 0; i < 3; i++) {
        bytes += gpuarr__mpi_hold_forever(z->keep[i], &z->held[i]);
        if (z->keep[i].id) gpuarr_release(z->keep[i]);
        z->keep[i].id = 0;
    }
    z->next = gpuarr__mpi.left;
    gpuarr__mpi.left = z;
    return bytes;
}

/* MPI gets GPUARR__MPI_SHUTDOWN_MS to complete what the zombies hold; what it still holds then
   is left to it. Returns the bytes left. */
static size_t gpuarr__mpi_zombies_settle(void) {
    double until = gpuarr__now_ms() + GPUARR__MPI_SHUTDOWN_MS;
    for (;;) {
        gpuarr__mpi_zombie_reap();
        if (!gpuarr__mpi.zombies || gpuarr__now_ms() > until) break;
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    size_t bytes = 0;
    while (gpuarr__mpi.zombies) {
        gpuarr__mpi_zombie *z = gpuarr__mpi.zombies;
        gpuarr__mpi.zombies = z->next;
        bytes += gpuarr__mpi_zombie_leave(z);
    }
    return bytes;
}

/* From here on every id handed out so far is of an earlier cycle (gpuarr__mpi_earlier). */
static void gpuarr__mpi_new_cycle(void) {
    for (int i = 0; gpuarr__mpi.reqs && i < GPUARR__MPI_MAX_REQUESTS; i++) gpuarr__mpi.reqs[i].cycle_gen = gpuarr__mpi.reqs[i].gen;
}

/* Whether id's generation came before its slot's at the last gpuarr_shutdown (within half the
   16-bit ring: older ids are not told apart from forged ones). */
static bool gpuarr__mpi_earlier(uint32_t id) {
    uint32_t index = id & 0xffffu;
    uint16_t gen = (uint16_t)(id >> 16);
    if (!gpuarr__mpi.reqs || index == 0 || index > GPUARR__MPI_MAX_REQUESTS || gen == 0) return false;
    uint16_t behind = (uint16_t)(gpuarr__mpi.reqs[index - 1].cycle_gen - gen);
    return behind != 0 && behind < 0x8000u;
}

/* Run by the last gpuarr_shutdown (the layer's before_teardown), while arrays still work, once
   gpuarr_mpi has been used in this process. */
static void gpuarr__mpi_last_shutdown(void) {
    if (!__atomic_load_n(&gpuarr__mpi.hooked, __ATOMIC_ACQUIRE)) return;
    pthread_mutex_lock(&gpuarr__mpi.lock);
    if (gpuarr__mpi.top || gpuarr__mpi.zombies) {
        int up = 0, down = 0;
        MPI_Initialized(&up); /* both may be called at any time, from any thread */
        MPI_Finalized(&down);
        bool live = up && !down;
        int ended = gpuarr__mpi_end_all(live);
        size_t left = 0;
        if (live) left = gpuarr__mpi_zombies_settle();
        while (!live && gpuarr__mpi.zombies) {
            gpuarr__mpi_zombie *z = gpuarr__mpi.zombies;
            gpuarr__mpi.zombies = z->next;
            gpuarr__mpi_zombie_free(z);
        }
        if (ended)
            gpuarr__log(GPUARR_LOG_WARN, "gpuarr_shutdown ended %d gpuarr_mpi transfers that were never waited for (%s)", ended,
                        live ? "cancelled" : "MPI was finalized already: their memory freed");
        if (left)
            gpuarr__log(GPUARR_LOG_WARN,
                        "gpuarr_shutdown left %zu bytes to MPI for good: transfers MPI could neither cancel nor complete "
                        "within %d ms (never freed: MPI may still read or write them)",
                        left, GPUARR__MPI_SHUTDOWN_MS);
    }
    gpuarr__mpi_new_cycle();
    pthread_mutex_unlock(&gpuarr__mpi.lock);
}

/* gpuarr and MPI both up; the last gpuarr_shutdown will end what this call leaves pending. */
static gpuarr_result gpuarr__mpi_ready(const char *api) {
    gpuarr__tls.api = api;
    if (!gpuarr__initialized()) return gpuarr__fail(GPUARR_ERROR_NOT_INITIALIZED, "gpuarr is not initialized (call gpuarr_init first)");
    int mpi_up = 0, mpi_down = 0;
    MPI_Initialized(&mpi_up);
    MPI_Finalized(&mpi_down);
    if (!mpi_up || mpi_down)
        return gpuarr__fail(GPUARR_ERROR_NOT_INITIALIZED, "MPI is %s", mpi_down ? "finalized already" : "not initialized (call MPI_Init first)");
    if (!__atomic_load_n(&gpuarr__mpi.hooked, __ATOMIC_ACQUIRE)) __atomic_store_n(&gpuarr__mpi.hooked, true, __ATOMIC_RELEASE);
    return GPUARR_OK;
}

static gpuarr_result gpuarr__mpi_post(const char *api, bool is_send, gpuarr_array a, int64_t first, int64_t count,
                                      gpuarr_dtype sent, int peer, int tag, MPI_Comm comm, gpuarr_mpi_request *req) {
    GPUARR__CHECK(gpuarr__mpi_ready(api));
    pthread_mutex_lock(&gpuarr__mpi.lock);
    gpuarr__mpi_eh eh;
    gpuarr__mpi_eh_enter(&eh, comm);
    gpuarr__mpi_req *q = NULL;
    gpuarr_result r = gpuarr__mpi_new(api, is_send, a, first, count, sent, peer, tag, comm, &q);
    gpuarr__mpi_eh_leave(&eh);
    if (r == GPUARR_OK && req) {
        gpuarr__mpi_progress(); /* post what can be posted now */
        req->id = gpuarr__mpi_id(q);
    } else if (r == GPUARR_OK) {
        r = gpuarr__mpi_wait_many(api, &q, 1);
    }
    pthread_mutex_unlock(&gpuarr__mpi.lock);
    return r;
}

GPUARR_API gpuarr_result gpuarr_mpi_send(gpuarr_array a, int64_t first, int64_t count, int dest, int tag, MPI_Comm comm) {
    return gpuarr__mpi_post(__func__, true, a, first, count, GPUARR_DTYPE_INVALID, dest, tag, comm, NULL);
}

GPUARR_API gpuarr_result gpuarr_mpi_recv(gpuarr_array a, int64_t first, int64_t count, gpuarr_dtype sent, int source, int tag,
                                         MPI_Comm comm) {
    return gpuarr__mpi_post(__func__, false, a, first, count, sent, source, tag, comm, NULL);
}

GPUARR_API gpuarr_result gpuarr_mpi_isend(gpuarr_array a, int64_t first, int64_t count, int dest, int tag, MPI_Comm comm,
                                          gpuarr_mpi_request *req) {
    GPUARR__BEGIN();
    GPUARR__REQUIRE_PTR(req);
    return gpuarr__mpi_post(__func__, true, a, first, count, GPUARR_DTYPE_INVALID, dest, tag, comm, req);
}

GPUARR_API gpuarr_result gpuarr_mpi_irecv(gpuarr_array a, int64_t first, int64_t count, gpuarr_dtype sent, int source, int tag,
                                          MPI_Comm comm, gpuarr_mpi_request *req) {
    GPUARR__BEGIN();
    GPUARR__REQUIRE_PTR(req);
    return gpuarr__mpi_post(__func__, false, a, first, count, sent, source, tag, comm, req);
}

GPUARR_API gpuarr_result gpuarr_mpi_wait(gpuarr_mpi_request *req) {
    GPUARR__BEGIN();
    GPUARR__REQUIRE_PTR(req);
    GPUARR__CHECK(gpuarr__mpi_ready(__func__));
    if (req->id == 0) return GPUARR_OK;
    pthread_mutex_lock(&gpuarr__mpi.lock);
    gpuarr__mpi_req *q = gpuarr__mpi_lookup(req->id);
    gpuarr_result r;
    if (!q && gpuarr__mpi_earlier(req->id))
        r = gpuarr__fail(GPUARR_ERROR_INVALID_HANDLE,
                         "req {%u} is from an earlier gpuarr_init: the last gpuarr_shutdown since ended its transfer", req->id);
    else if (!q)
        r = gpuarr__fail(GPUARR_ERROR_INVALID_HANDLE, "req {%u} is not a pending gpuarr_mpi request (waited for already, or forged)",
                         req->id);
    else if (q->waited)
        r = gpuarr__fail(GPUARR_ERROR_INVALID_HANDLE, "req {%u} is being waited for by another thread", req->id);
    else {
        r = gpuarr__mpi_wait_many(__func__, &q, 1);
        req->id = 0;
    }
    pthread_mutex_unlock(&gpuarr__mpi.lock);
    return r;
}

GPUARR_API gpuarr_result gpuarr_mpi_sendrecv(gpuarr_array send, int64_t send_first, int64_t send_count, int dest, int send_tag,
                                             gpuarr_array recv, int64_t recv_first, int64_t recv_count, gpuarr_dtype sent,
                                             int source, int recv_tag, MPI_Comm comm) {
    GPUARR__CHECK(gpuarr__mpi_ready(__func__));
    /* both halves checked before either posts anything: a receive posted, then cancelled, could
       already have matched (and lost) the peer's next message */
    pthread_mutex_lock(&gpuarr__mpi.lock);
    gpuarr__mpi_eh eh;
    gpuarr__mpi_eh_enter(&eh, comm);
    gpuarr__mpi_req *qs[2] = {NULL, NULL};
    gpuarr_result r = gpuarr__mpi_new(__func__, false, recv, recv_first, recv_count, sent, source, recv_tag, comm, &qs[0]);
    if (r == GPUARR_OK) {
        r = gpuarr__mpi_new(__func__, true, send, send_first, send_count, GPUARR_DTYPE_INVALID, dest, send_tag, comm, &qs[1]);
        if (r != GPUARR_OK) gpuarr__mpi_req_free(qs[0]); /* not started: nothing to cancel */
    }
    gpuarr__mpi_eh_leave(&eh);
    if (r == GPUARR_OK) r = gpuarr__mpi_wait_many(__func__, qs, 2);
    pthread_mutex_unlock(&gpuarr__mpi.lock);
    return r;
}

/* ---- the device of a rank ---- */
GPUARR_API gpuarr_result gpuarr_mpi_device(MPI_Comm comm, gpuarr_device *out) {
    GPUARR__BEGIN();
    GPUARR__REQUIRE_PTR(out);
    GPUARR__CHECK(gpuarr__mpi_ready(__func__));
    if (comm == MPI_COMM_NULL) return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "comm is MPI_COMM_NULL");
    gpuarr__mpi_eh eh;
    gpuarr__mpi_eh_enter(&eh, comm);
    MPI_Comm local = MPI_COMM_NULL;
    int rank = 0;
    int rc = MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &local);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_rank(local, &rank);
    if (local != MPI_COMM_NULL) MPI_Comm_free(&local);
    gpuarr__mpi_eh_leave(&eh);
    if (rc != MPI_SUCCESS) return gpuarr__mpi_error(rc, "MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)");
    char spec[32];
    snprintf(spec, sizeof spec, "local:%d", rank);
    gpuarr_result r = gpuarr_device_find(spec, out);
    if (r != GPUARR_OK) {
        char detail[sizeof gpuarr__tls.error_detail];
        snprintf(detail, sizeof detail, "%s", gpuarr_last_error());
        return GPUARR__MPI_FAIL(__func__, r, "node-local rank %d: %s", rank, detail);
    }
    return GPUARR_OK;
}

/* ---- allreduce: through host memory, f16 and bf16 as f32 ---- */
static MPI_Datatype gpuarr__mpi_type(gpuarr_dtype t, bool wrap) {
    switch (t) {
    case GPUARR_BOOL: return MPI_UINT8_T;
    case GPUARR_I8: return wrap ? MPI_UINT8_T : MPI_INT8_T;
    case GPUARR_U8: return MPI_UINT8_T;
    case GPUARR_I16: return wrap ? MPI_UINT16_T : MPI_INT16_T;
    case GPUARR_U16: return MPI_UINT16_T;
    case GPUARR_I32: return wrap ? MPI_UINT32_T : MPI_INT32_T;
    case GPUARR_U32: return MPI_UINT32_T;
    case GPUARR_I64: return wrap ? MPI_UINT64_T : MPI_INT64_T;
    case GPUARR_U64: return MPI_UINT64_T;
    case GPUARR_F64: return MPI_DOUBLE;
    default: return MPI_FLOAT; /* f16, bf16 (read as f32), f32 */
    }
}

GPUARR_API gpuarr_result gpuarr_mpi_allreduce(gpuarr_array a, gpuarr_mpi_op op, MPI_Comm comm) {
    GPUARR__BEGIN();
    GPUARR__CHECK(gpuarr__mpi_ready(__func__));
    if ((int)op < 0 || op >= GPUARR_MPI_OP_COUNT)
        return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "op = %d is not a gpuarr_mpi_op", (int)op);
    if (comm == MPI_COMM_NULL) return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "comm is MPI_COMM_NULL");
    gpuarr_array_info info;
    gpuarr_result r = gpuarr_array_get_info(a, &info);
    if (r != GPUARR_OK) return gpuarr__mpi_rename(__func__, r);
    /* gpuarr_array_get_info named itself in the thread's error state: the failures below are this call's */
    if (info.read_only) return GPUARR__MPI_FAIL(__func__, GPUARR_ERROR_INVALID_ARGUMENT, "a is read-only");
    if (info.count > INT_MAX)
        return GPUARR__MPI_FAIL(__func__, GPUARR_ERROR_INVALID_ARGUMENT, "a holds %lld elements: at most INT_MAX", (long long)info.count);
    bool half = info.dtype == GPUARR_F16 || info.dtype == GPUARR_BF16;
    gpuarr_dtype ht = half ? GPUARR_F32 : info.dtype;
    size_t bytes = (size_t)info.count * gpuarr_dtype_size(ht);
    void *host = malloc(bytes ? bytes : 1);
    if (!host) return GPUARR__MPI_FAIL(__func__, GPUARR_ERROR_OUT_OF_MEMORY, "no host memory for the %zu bytes of a", bytes);
    r = info.count ? gpuarr_read(a, 0, info.count, ht, host) : GPUARR_OK;
    if (r == GPUARR_OK) {
        /* bool: sum and max are "any" (logical or), min "all"; integer sums wrap (unsigned types) */
        MPI_Op mop = op == GPUARR_MPI_SUM ? MPI_SUM : op == GPUARR_MPI_MIN ? MPI_MIN : MPI_MAX;
        if (info.dtype == GPUARR_BOOL) mop = op == GPUARR_MPI_MIN ? MPI_LAND : MPI_LOR;
        MPI_Datatype mt = gpuarr__mpi_type(info.dtype, op == GPUARR_MPI_SUM);
        gpuarr__mpi_eh eh;
        gpuarr__mpi_eh_enter(&eh, comm);
        int rc = MPI_Allreduce(MPI_IN_PLACE, host, (int)info.count, mt, mop, comm);
        gpuarr__mpi_eh_leave(&eh);
        gpuarr__tls.api = __func__;
        if (rc != MPI_SUCCESS) r = gpuarr__mpi_error(rc, "MPI_Allreduce");
    }
    if (r == GPUARR_OK && info.count) r = gpuarr_write(a, 0, info.count, ht, host);
    free(host);
    if (r != GPUARR_OK && gpuarr__tls.error_api != __func__) r = gpuarr__mpi_rename(__func__, r);
    return r;
}

static void gpuarr__mpi_layer(gpuarr__layer *l) {
    l->name = "mpi";
    l->before_teardown = gpuarr__mpi_last_shutdown;
}
