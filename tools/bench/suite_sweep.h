/* suite_sweep.h -- rate against size for plots (gpuarr-bench --csv)
 *
 * --csv FILE ("-": stdout): instead of the tables, a size sweep for plots (tools/bench/bench-plots.sh,
 * `make bench-plots`): sizes by powers of 4 from --sweep-min to --sweep-max (defaults 4K and
 * 256M; K, M, G suffixes), every path against its baselines: host casts (kernel, and
 * gpuarr_convert) against memcpy, once per --host-isa entry; on the first OpenCL device (or
 * --device) uploads (gpuarr_from_host_as, gpuarr_write into an existing array) against
 * clEnqueueWriteBuffer, downloads (gpuarr_to_host_as, gpuarr_read) against clEnqueueReadBuffer,
 * casts (gpuarr_convert) against clEnqueueCopyBuffer and memcpy; on the first CUDA device the
 * same against cuMemcpyHtoD, cuMemcpyDtoH (pageable memory) and cuMemcpyDtoDAsync + sync.
 * Columns: section,path,baseline,isa,device,bytes,gpuarr_seconds,baseline_seconds,gpuarr_GBps,
 * baseline_GBps,ratio,reps,gpuarr_calls,baseline_calls, after `# ` lines describing the machine
 * (see "--csv FILE" below for how each figure is timed). --reps caps the repetitions.
 *
 * Part of gpuarr-bench's one translation unit: gpuarr-bench.c includes it once, after
 * bench_common.h, suite_host.h (the --host-isa loop) and suite_cuda.h (its driver calls). */

/* ---------------------------------------------------------------------------------------------
 * --csv FILE: rate against size, every path against its baselines, for plots
 *
 * Sizes go by powers of 4 from --sweep-min (default 4 KiB) to --sweep-max (default 256 MiB);
 * `bytes` is the size of the source array. In every repetition each baseline and each gpuarr
 * path is timed back to back; a timing repeats a call until it lasts about 1 ms (at most 4096
 * calls; the counts are the last two columns) and gives the time per call. Medians over the
 * repetitions, which are fewer for larger sizes (15 up to 1 MiB, 11 up to 16 MiB, 7 up to
 * 64 MiB, 5 above; never more than --reps). `ratio` is the median over repetitions of gpuarr's
 * rate / the baseline's rate in that repetition (> 1: gpuarr is faster). Rates (GB/s = 1e9
 * bytes/s) count bytes read plus bytes written for casts and memcpy, the bytes moved for
 * transfers.
 * ------------------------------------------------------------------------------------------- */
enum { SWEEP_OPS = 8 };

typedef struct sweep_op {
    void (*run)(void *ctx);
    void *ctx;
    double moved; /* bytes the rate counts */
} sweep_op;

typedef struct sweep_times {
    int reps, calls[SWEEP_OPS];
    double t[SWEEP_OPS][64]; /* seconds per call, per repetition */
} sweep_times;

typedef struct sweep_out {
    FILE *f;
    int max_reps;
    const char *device, *isa;
    size_t bytes;
} sweep_out;

static int sweep_reps(size_t bytes, int max_reps) {
    int r = bytes <= ((size_t)1 << 20) ? 15 : bytes <= ((size_t)16 << 20) ? 11 : bytes <= ((size_t)64 << 20) ? 7 : 5;
    return r < max_reps ? r : max_reps;
}

static double time_calls(const sweep_op *op, int calls) {
    double t0 = now_s();
    for (int i = 0; i < calls; i++) op->run(op->ctx);
    return (now_s() - t0) / calls;
}

static void sweep_measure(const sweep_op *ops, int n, int reps, sweep_times *st) {
    for (int w = 0; w < 2; w++) /* warm-up, then one call each to choose its count */
        for (int i = 0; i < n; i++) {
            double t = time_calls(&ops[i], 1);
            if (w == 1) st->calls[i] = t >= 1e-3 ? 1 : t * 4096 < 1e-3 ? 4096 : (int)(1e-3 / t) + 1;
        }
    st->reps = reps;
    for (int r = 0; r < reps; r++)
        for (int i = 0; i < n; i++) st->t[i][r] = time_calls(&ops[i], st->calls[i]);
}

/* One CSV row: op g against op b. */
static void sweep_row(const sweep_out *o, const char *section, const char *path, const char *baseline, const sweep_op *ops,
                      const sweep_times *st, int g, int b) {
    double tg[64], tb[64], ratio[64];
    for (int r = 0; r < st->reps; r++) {
        tg[r] = st->t[g][r];
        tb[r] = st->t[b][r];
        ratio[r] = (ops[g].moved / tg[r]) / (ops[b].moved / tb[r]);
    }
    double mg = median(tg, st->reps), mb = median(tb, st->reps);
    fprintf(o->f, "%s,%s,%s,%s,%s,%zu,%.9g,%.9g,%.6g,%.6g,%.6g,%d,%d,%d\n", section, path, baseline, o->isa, o->device, o->bytes, mg,
            mb, ops[g].moved / mg / 1e9, ops[b].moved / mb / 1e9, median(ratio, st->reps), st->reps, st->calls[g], st->calls[b]);
    fflush(o->f);
}

/* --- host casts ---------------------------------------------------------------------------- */
typedef struct host_cast_ctx {
    cast_case c;
    unsigned char *a, *b, *m;
    size_t n, src_bytes;
    gpuarr_array src;
} host_cast_ctx;

static void op_memcpy(void *p) {
    host_cast_ctx *x = (host_cast_ctx *)p;
    memcpy(x->m, x->a, x->src_bytes);
    sink = x->m[x->src_bytes / 2];
}
static void op_cast_kernel(void *p) {
    host_cast_ctx *x = (host_cast_ctx *)p;
    gpuarr__cpu_cast(x->b, x->c.dst, x->a, x->c.src, x->n);
    sink = x->b[x->n / 2];
}
static void op_cast_convert(void *p) {
    host_cast_ctx *x = (host_cast_ctx *)p;
    gpuarr_array out;
    if (gpuarr_convert(x->src, gpuarr_host(), x->c.dst, &out) != GPUARR_OK) die("gpuarr_convert");
    gpuarr_release(out);
}

typedef struct sweep_host_arg {
    sweep_out *o;
    size_t min, max;
} sweep_host_arg;

static void sweep_host_casts(void *arg) {
    static const cast_case cases[] = {{GPUARR_F32, GPUARR_F64}, {GPUARR_F64, GPUARR_F32}, {GPUARR_U8, GPUARR_F32},
                                      {GPUARR_F32, GPUARR_F16}, {GPUARR_F32, GPUARR_BF16}};
    sweep_host_arg *h = (sweep_host_arg *)arg;
    sweep_out *o = h->o;
    host_cast_ctx x;
    memset(&x, 0, sizeof x);
    x.a = (unsigned char *)malloc(h->max);
    x.b = (unsigned char *)malloc(h->max * 4);
    x.m = (unsigned char *)malloc(h->max);
    if (!x.a || !x.b || !x.m) die("malloc");
    memset(x.b, 1, h->max * 4); /* fault the destinations in before timing */
    memset(x.m, 1, h->max);
    o->isa = gpuarr__g.host_isa;
    o->device = "host";
    fprintf(stderr, "gpuarr-bench: host casts, kernels %s\n", o->isa);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        x.c = cases[i];
        fill_source(x.a, x.c.src, h->max / gpuarr_dtype_size(x.c.src));
        char path[32];
        snprintf(path, sizeof path, "%s->%s", gpuarr_dtype_name(x.c.src), gpuarr_dtype_name(x.c.dst));
        for (size_t bytes = h->min; bytes <= h->max; bytes *= 4) {
            x.src_bytes = bytes;
            x.n = bytes / gpuarr_dtype_size(x.c.src);
            int64_t shape[1] = {(int64_t)x.n};
            if (gpuarr_from_host_as(gpuarr_host(), x.c.src, x.a, 1, shape, &x.src) != GPUARR_OK) die("gpuarr_from_host_as");
            double moved = (double)(bytes + x.n * gpuarr_dtype_size(x.c.dst));
            sweep_op ops[3] = {{op_memcpy, &x, 2.0 * (double)bytes}, {op_cast_kernel, &x, moved}, {op_cast_convert, &x, moved}};
            sweep_times st;
            o->bytes = bytes;
            sweep_measure(ops, 3, sweep_reps(bytes, o->max_reps), &st);
            sweep_row(o, "host-cast", path, "memcpy", ops, &st, 1, 0);
            sweep_row(o, "host-convert", path, "memcpy", ops, &st, 2, 0);
            gpuarr_release(x.src);
        }
    }
    free(x.a);
    free(x.b);
    free(x.m);
}

/* --- devices: transfers and casts, each backend's raw calls as the baselines ------------------ */
typedef struct dev_sweep_ctx {
    gpuarr_device dev;
    float *src, *dst, *scratch; /* pageable host memory of the largest size */
    size_t bytes;
    gpuarr_array kept; /* an existing array of `bytes` */
    cast_case c;
    gpuarr_array cast_src;
#ifndef GPUARR_NO_OPENCL
    gpuarr__cl_command_queue q;
    gpuarr__cl_mem buf, buf2; /* raw buffers of the baselines */
#endif
#ifndef GPUARR_NO_CUDA
    gpuarr__cu_ptr cbuf, cbuf2;
    gpuarr__cu_stream cstream;
#endif
} dev_sweep_ctx;

/* A backend's baselines: blocking upload and download of the pageable buffer, a device copy. */
typedef struct raw_baselines {
    const char *backend, *write_name, *read_name, *copy_name;
    void (*write)(void *), (*read)(void *), (*copy)(void *);
} raw_baselines;

static void op_host_memcpy(void *p) {
    dev_sweep_ctx *x = (dev_sweep_ctx *)p;
    memcpy(x->scratch, x->src, x->bytes);
    sink = ((unsigned char *)x->scratch)[x->bytes / 2];
}
static void op_ga_from_host(void *p) {
    dev_sweep_ctx *x = (dev_sweep_ctx *)p;
    int64_t shape[1] = {(int64_t)(x->bytes / 4)};
    gpuarr_array a;
    if (gpuarr_from_host_as(x->dev, GPUARR_F32, x->src, 1, shape, &a) != GPUARR_OK) die("gpuarr_from_host_as");
    gpuarr_release(a);
}
static void op_ga_write(void *p) {
    dev_sweep_ctx *x = (dev_sweep_ctx *)p;
    if (gpuarr_write(x->kept, 0, (int64_t)(x->bytes / 4), GPUARR_F32, x->src) != GPUARR_OK) die("gpuarr_write");
}
static void op_ga_to_host(void *p) {
    dev_sweep_ctx *x = (dev_sweep_ctx *)p;
    if (gpuarr_to_host_as(x->kept, GPUARR_F32, x->dst, x->bytes / 4) != GPUARR_OK) die("gpuarr_to_host_as");
}
static void op_ga_read(void *p) {
    dev_sweep_ctx *x = (dev_sweep_ctx *)p;
    if (gpuarr_read(x->kept, 0, (int64_t)(x->bytes / 4), GPUARR_F32, x->dst) != GPUARR_OK) die("gpuarr_read");
}
static void op_ga_convert(void *p) {
    dev_sweep_ctx *x = (dev_sweep_ctx *)p;
    gpuarr_array out;
    if (gpuarr_convert(x->cast_src, x->dev, x->c.dst, &out) != GPUARR_OK) die("gpuarr_convert");
    gpuarr_release(out);
}

/* The sweep on one device; x's host buffers and the raw buffers (of max bytes) are set. */
static void sweep_device(sweep_out *o, dev_sweep_ctx *x, const raw_baselines *raw, size_t min, size_t max) {
    gpuarr_device_info info;
    gpuarr_device_get_info(x->dev, &info);
    char transfer[32], casts[32];
    snprintf(transfer, sizeof transfer, "%s-transfer", raw->backend);
    snprintf(casts, sizeof casts, "%s-cast", raw->backend);
    o->isa = "-";
    o->device = info.spec;
    fprintf(stderr, "gpuarr-bench: %s transfers\n", info.spec);
    fill_source(x->src, GPUARR_F32, max / 4);
    for (size_t bytes = min; bytes <= max; bytes *= 4) {
        x->bytes = bytes;
        int64_t shape[1] = {(int64_t)(bytes / 4)};
        if (gpuarr_from_host_as(x->dev, GPUARR_F32, x->src, 1, shape, &x->kept) != GPUARR_OK) die("gpuarr_from_host_as");
        double b = (double)bytes;
        sweep_op ops[6] = {{raw->write, x, b}, {op_ga_from_host, x, b}, {op_ga_write, x, b},
                           {raw->read, x, b},  {op_ga_to_host, x, b},   {op_ga_read, x, b}};
        sweep_times st;
        o->bytes = bytes;
        sweep_measure(ops, 6, sweep_reps(bytes, o->max_reps), &st);
        sweep_row(o, transfer, "upload: gpuarr_from_host_as (allocates)", raw->write_name, ops, &st, 1, 0);
        sweep_row(o, transfer, "upload: gpuarr_write (existing array)", raw->write_name, ops, &st, 2, 0);
        sweep_row(o, transfer, "download: gpuarr_to_host_as", raw->read_name, ops, &st, 4, 3);
        sweep_row(o, transfer, "download: gpuarr_read", raw->read_name, ops, &st, 5, 3);
        gpuarr_release(x->kept);
    }
    static const cast_case cases[] = {{GPUARR_F32, GPUARR_F64}, {GPUARR_F64, GPUARR_F32}, {GPUARR_F32, GPUARR_F16}};
    fprintf(stderr, "gpuarr-bench: %s casts\n", info.spec);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        x->c = cases[i];
        fill_source(x->src, x->c.src, max / gpuarr_dtype_size(x->c.src));
        char path[32];
        snprintf(path, sizeof path, "%s->%s", gpuarr_dtype_name(x->c.src), gpuarr_dtype_name(x->c.dst));
        for (size_t bytes = min; bytes <= max; bytes *= 4) {
            x->bytes = bytes;
            size_t n = bytes / gpuarr_dtype_size(x->c.src);
            int64_t shape[1] = {(int64_t)n};
            if (gpuarr_from_host_as(x->dev, x->c.src, x->src, 1, shape, &x->cast_src) != GPUARR_OK) die("gpuarr_from_host_as");
            double moved = (double)(bytes + n * gpuarr_dtype_size(x->c.dst));
            sweep_op ops[3] = {{raw->copy, x, 2.0 * (double)bytes}, {op_host_memcpy, x, 2.0 * (double)bytes}, {op_ga_convert, x, moved}};
            sweep_times st;
            o->bytes = bytes;
            sweep_measure(ops, 3, sweep_reps(bytes, o->max_reps), &st);
            sweep_row(o, casts, path, raw->copy_name, ops, &st, 2, 0);
            sweep_row(o, casts, path, "memcpy", ops, &st, 2, 1);
            gpuarr_release(x->cast_src);
        }
    }
}

static void dev_sweep_open(dev_sweep_ctx *x, gpuarr_device dev, size_t max) {
    memset(x, 0, sizeof *x);
    x->dev = dev;
    x->src = (float *)malloc(max);
    x->dst = (float *)malloc(max);
    x->scratch = (float *)malloc(max);
    if (!x->src || !x->dst || !x->scratch) die("malloc");
    memset(x->dst, 0, max);
    memset(x->scratch, 0, max);
}

static void dev_sweep_close(dev_sweep_ctx *x) {
    free(x->src);
    free(x->dst);
    free(x->scratch);
}

#ifndef GPUARR_NO_OPENCL
static void op_cl_write(void *p) {
    dev_sweep_ctx *x = (dev_sweep_ctx *)p;
    if (GPUARR__CL.clEnqueueWriteBuffer(x->q, x->buf, GPUARR__CL_TRUE, 0, x->bytes, x->src, 0, NULL, NULL) != GPUARR__CL_SUCCESS)
        die("clEnqueueWriteBuffer");
}
static void op_cl_read(void *p) {
    dev_sweep_ctx *x = (dev_sweep_ctx *)p;
    if (GPUARR__CL.clEnqueueReadBuffer(x->q, x->buf, GPUARR__CL_TRUE, 0, x->bytes, x->dst, 0, NULL, NULL) != GPUARR__CL_SUCCESS)
        die("clEnqueueReadBuffer");
}
static void op_cl_copy(void *p) { /* the source's bytes, device to device */
    dev_sweep_ctx *x = (dev_sweep_ctx *)p;
    if (GPUARR__CL.clEnqueueCopyBuffer(x->q, x->buf, x->buf2, 0, 0, x->bytes, 0, NULL, NULL) != GPUARR__CL_SUCCESS ||
        GPUARR__CL.clFinish(x->q) != GPUARR__CL_SUCCESS)
        die("clEnqueueCopyBuffer");
}

static void sweep_opencl_device(sweep_out *o, gpuarr_device dev, size_t min, size_t max) {
    static const raw_baselines raw = {"opencl", "clEnqueueWriteBuffer", "clEnqueueReadBuffer", "clEnqueueCopyBuffer",
                                      op_cl_write, op_cl_read, op_cl_copy};
    gpuarr__cl_state *cl = &GPUARR__CL;
    dev_sweep_ctx x;
    dev_sweep_open(&x, dev, max);
    void *ctx = NULL, *queue = NULL;
    gpuarr_stream s;
    if (gpuarr_stream_create(dev, 0, &s) != GPUARR_OK || gpuarr_opencl_context_raw(dev, &ctx) != GPUARR_OK ||
        gpuarr_opencl_queue_raw(s, &queue) != GPUARR_OK)
        die("opencl setup");
    x.q = (gpuarr__cl_command_queue)queue;
    gpuarr__cl_int e = 0;
    x.buf = cl->clCreateBuffer((gpuarr__cl_context)ctx, GPUARR__CL_MEM_READ_WRITE, max, NULL, &e);
    x.buf2 = cl->clCreateBuffer((gpuarr__cl_context)ctx, GPUARR__CL_MEM_READ_WRITE, max, NULL, &e);
    if (!x.buf || !x.buf2) die("clCreateBuffer");
    sweep_device(o, &x, &raw, min, max);
    cl->clReleaseMemObject(x.buf);
    cl->clReleaseMemObject(x.buf2);
    gpuarr_stream_destroy(s);
    dev_sweep_close(&x);
}
#endif

#ifndef GPUARR_NO_CUDA
static void op_cu_write(void *p) {
    dev_sweep_ctx *x = (dev_sweep_ctx *)p;
    cu_check(CU.p_cuMemcpyHtoD_v2(x->cbuf, x->src, x->bytes), "cuMemcpyHtoD");
}
static void op_cu_read(void *p) {
    dev_sweep_ctx *x = (dev_sweep_ctx *)p;
    cu_check(CU.p_cuMemcpyDtoH_v2(x->dst, x->cbuf, x->bytes), "cuMemcpyDtoH");
}
static void op_cu_copy(void *p) {
    dev_sweep_ctx *x = (dev_sweep_ctx *)p;
    cu_check(CU.p_cuMemcpyDtoDAsync_v2(x->cbuf2, x->cbuf, x->bytes, x->cstream), "cuMemcpyDtoDAsync");
    cu_check(CU.p_cuStreamSynchronize(x->cstream), "cuStreamSynchronize");
}

static void sweep_cuda_device(sweep_out *o, gpuarr_device dev, size_t min, size_t max) {
    static const raw_baselines raw = {"cuda", "cuMemcpyHtoD", "cuMemcpyDtoH", "cuMemcpyDtoDAsync+sync", op_cu_write, op_cu_read, op_cu_copy};
    struct CUctx_st *ctx = NULL;
    if (gpuarr_cuda_context(dev, &ctx) != GPUARR_OK) die("gpuarr_cuda_context");
    cu_check(CU.p_cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
    dev_sweep_ctx x;
    dev_sweep_open(&x, dev, max);
    cu_check(CU.p_cuMemAlloc_v2(&x.cbuf, max), "cuMemAlloc");
    cu_check(CU.p_cuMemAlloc_v2(&x.cbuf2, max), "cuMemAlloc");
    cu_check(CU.p_cuStreamCreate(&x.cstream, GPUARR__CU_STREAM_NON_BLOCKING), "cuStreamCreate");
    sweep_device(o, &x, &raw, min, max);
    CU.p_cuStreamDestroy_v2(x.cstream);
    CU.p_cuMemFree_v2(x.cbuf);
    CU.p_cuMemFree_v2(x.cbuf2);
    dev_sweep_close(&x);
}
#endif

/* The first device of `backend` (or the one --device names); false when there is none. */
static bool sweep_backend(sweep_out *o, gpuarr_backend backend, const char *only, size_t min, size_t max) {
    for (int i = 0; i < gpuarr_device_count(); i++) {
        gpuarr_device_info info;
        gpuarr_device_get_info(gpuarr_device_at(i), &info);
        if (info.backend != backend || (only && strcmp(only, info.spec) != 0)) continue;
#ifndef GPUARR_NO_OPENCL
        if (backend == GPUARR_BACKEND_OPENCL) sweep_opencl_device(o, info.device, min, max);
#endif
#ifndef GPUARR_NO_CUDA
        if (backend == GPUARR_BACKEND_CUDA) sweep_cuda_device(o, info.device, min, max);
#endif
        return true;
    }
    return false;
}

static void sweep(const char *file, const cpu_desc *cpu, size_t min, size_t max, int max_reps, bool host, bool opencl, bool cuda,
                  const char *only) {
    FILE *f = strcmp(file, "-") == 0 ? stdout : fopen(file, "w");
    if (!f) {
        fprintf(stderr, "gpuarr-bench: cannot write %s\n", file);
        exit(1);
    }
    double t0 = now_s();
    sweep_out o = {f, max_reps, "host", "-", 0};
    print_machine(f, "# ", cpu);
    fprintf(f, "# sweep: %zu .. %zu bytes by powers of 4, at most %d repetitions\n", min, max, max_reps);
    fprintf(f, "section,path,baseline,isa,device,bytes,gpuarr_seconds,baseline_seconds,gpuarr_GBps,baseline_GBps,ratio,reps,gpuarr_calls,baseline_calls\n");
    if (host) {
        sweep_host_arg h = {&o, min, max};
        for_each_host_isa(sweep_host_casts, &h, f, "# ", "");
    }
    /* --device SPEC: that device's backend alone */
    if (opencl && (!only || strncmp(only, "opencl", 6) == 0) && !sweep_backend(&o, GPUARR_BACKEND_OPENCL, only, min, max))
        fprintf(f, "# opencl: no OpenCL device%s%s: no OpenCL rows\n", only ? " " : "", only ? only : "");
    if (cuda && (!only || strncmp(only, "cuda", 4) == 0) && !sweep_backend(&o, GPUARR_BACKEND_CUDA, only, min, max))
        fprintf(f, "# cuda: no CUDA device%s%s: no CUDA rows\n", only ? " " : "", only ? only : "");
    fprintf(f, "# done in %.1f s\n", now_s() - t0);
    fprintf(stderr, "gpuarr-bench: sweep done in %.1f s\n", now_s() - t0);
    if (f != stdout) fclose(f);
}
