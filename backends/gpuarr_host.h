/*
 * gpuarr_host.h -- the host backend: always compiled in, always one device ("host").
 *
 * Included by gpuarr.h's implementation only. Device memory is 64-byte aligned host memory from
 * the library's allocator; memory handles are plain pointers. Work is done on the calling thread
 * (split across the core's worker pool when large) before an enqueue returns, so streams are
 * always idle and events complete when recorded: the API, ordering and errors are the real ones.
 */
#ifndef GPUARR_HOST_BACKEND_INCLUDED
#define GPUARR_HOST_BACKEND_INCLUDED

#define GPUARR__HOST_ALIGN 64

typedef struct gpuarr__host_event {
    double recorded_ms; /* monotonic time of the last record; < 0 = never */
} gpuarr__host_event;

/* Any non-NULL value serves as the native stream: there is nothing to queue. A constant, never
   written: not state. */
static const char gpuarr__host_stream_token = 0;

static gpuarr_result gpuarr__host_load(void) { return GPUARR_OK; }
static void gpuarr__host_unload(void) {}
static int gpuarr__host_device_count(void) { return 1; }

/* The value after "key<spaces>:" on the first line of a /proc-style file that starts with key. */
static bool gpuarr__host_read_field(const char *path, const char *key, char *out, size_t cap) {
    FILE *f = fopen(path, "r");
    if (!f) return false;
    char line[512];
    bool found = false;
    size_t klen = strlen(key);
    while (!found && fgets(line, sizeof line, f)) {
        if (strncmp(line, key, klen) != 0) continue;
        char *colon = strchr(line + klen, ':');
        if (!colon) continue;
        char *value = colon + 1;
        while (*value == ' ' || *value == '\t') value++;
        value[strcspn(value, "\n")] = '\0';
        gpuarr__copy_string(out, cap, value);
        found = true;
    }
    fclose(f);
    return found;
}

static uint64_t gpuarr__host_meminfo_bytes(const char *key) {
    char value[64];
    if (!gpuarr__host_read_field("/proc/meminfo", key, value, sizeof value)) return 0;
    return (uint64_t)strtoull(value, NULL, 10) * 1024u; /* reported in kB */
}

static gpuarr_result gpuarr__host_mem_info(gpuarr__dev *d, uint64_t *free_bytes, uint64_t *total_bytes) {
    GPUARR__UNUSED(d);
    uint64_t total = gpuarr__host_meminfo_bytes("MemTotal");
    if (!total) {
        long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
        total = pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : 0;
    }
    uint64_t avail = gpuarr__host_meminfo_bytes("MemAvailable");
    *total_bytes = total;
    *free_bytes = avail ? avail : total;
    return GPUARR_OK;
}

static gpuarr_result gpuarr__host_device_info(int index, gpuarr_device_info *info) {
    GPUARR__UNUSED(index);
    info->type = GPUARR_DEVICE_TYPE_CPU;
    info->host_unified = true;
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    info->compute_units = cpus > 0 ? (int)cpus : 1;
    if (!gpuarr__host_read_field("/proc/cpuinfo", "model name", info->name, sizeof info->name))
        gpuarr__copy_string(info->name, sizeof info->name, "host CPU");
    if (!gpuarr__host_read_field("/proc/cpuinfo", "vendor_id", info->vendor, sizeof info->vendor))
        gpuarr__copy_string(info->vendor, sizeof info->vendor, "unknown");
    char mhz[64];
    if (gpuarr__host_read_field("/proc/cpuinfo", "cpu MHz", mhz, sizeof mhz)) info->clock_mhz = (int)strtol(mhz, NULL, 10);
    struct utsname u;
    if (uname(&u) == 0) snprintf(info->version, sizeof info->version, "%.60s %.60s", u.sysname, u.release);
    gpuarr__host_mem_info(NULL, &info->free_memory, &info->total_memory);
    info->max_alloc_bytes = info->total_memory;
    return GPUARR_OK;
}

static gpuarr_result gpuarr__host_device_open(gpuarr__dev *d) { GPUARR__UNUSED(d); return GPUARR_OK; }
static void gpuarr__host_device_close(gpuarr__dev *d) { GPUARR__UNUSED(d); }

static gpuarr_result gpuarr__host_mem_alloc(gpuarr__dev *d, size_t bytes, void **mem) {
    GPUARR__UNUSED(d);
    void *p = gpuarr__aligned_malloc(bytes, GPUARR__HOST_ALIGN);
    if (!p) {
        uint64_t free_bytes = 0, total = 0;
        gpuarr__host_mem_info(NULL, &free_bytes, &total);
        return gpuarr__fail(GPUARR_ERROR_OUT_OF_MEMORY,
                            "host allocation of %zu bytes failed (host total %llu, available %llu bytes)",
                            bytes, (unsigned long long)total, (unsigned long long)free_bytes);
    }
    gpuarr__advise_huge_pages(p, bytes);
    *mem = p;
    return GPUARR_OK;
}

static void gpuarr__host_mem_free(gpuarr__dev *d, void *mem) { GPUARR__UNUSED(d); gpuarr__aligned_free(mem); }
static void *gpuarr__host_mem_host_ptr(gpuarr__dev *d, void *mem) { GPUARR__UNUSED(d); return mem; }
static size_t gpuarr__host_mem_alignment(gpuarr__dev *d) { GPUARR__UNUSED(d); return GPUARR__HOST_ALIGN; }
/* A pool block is the segment's pointer at an offset. */
static gpuarr_result gpuarr__host_mem_view(gpuarr__dev *d, void *segment, size_t offset, size_t bytes, void **mem, size_t *mem_offset) {
    GPUARR__UNUSED(d);
    GPUARR__UNUSED(bytes);
    *mem = segment;
    *mem_offset = offset;
    return GPUARR_OK;
}
static void gpuarr__host_mem_view_release(gpuarr__dev *d, void *mem) { GPUARR__UNUSED(d); GPUARR__UNUSED(mem); }
/* Host memory needs no staging. */
static gpuarr_result gpuarr__host_pinned_alloc(gpuarr__dev *d, size_t bytes, void **handle, void **host_ptr) {
    GPUARR__UNUSED(d); GPUARR__UNUSED(bytes); GPUARR__UNUSED(handle); GPUARR__UNUSED(host_ptr);
    return gpuarr__fail(GPUARR_ERROR_UNSUPPORTED, "the host has no pinned memory to stage through");
}
static void gpuarr__host_pinned_free(gpuarr__dev *d, void *handle) { GPUARR__UNUSED(d); GPUARR__UNUSED(handle); }
static bool gpuarr__host_host_ptr_pinned(gpuarr__dev *d, const void *p) { GPUARR__UNUSED(d); GPUARR__UNUSED(p); return false; }

static gpuarr_result gpuarr__host_copy_h2d(gpuarr__stream *s, void *dst, size_t dst_off, const void *src, size_t bytes) {
    GPUARR__UNUSED(s);
    gpuarr__cpu_memcpy((unsigned char *)dst + dst_off, src, bytes);
    return GPUARR_OK;
}

static gpuarr_result gpuarr__host_copy_d2h(gpuarr__stream *s, void *dst, const void *src, size_t src_off, size_t bytes) {
    GPUARR__UNUSED(s);
    gpuarr__cpu_memcpy(dst, (const unsigned char *)src + src_off, bytes);
    return GPUARR_OK;
}

static gpuarr_result gpuarr__host_copy_d2d(gpuarr__stream *s, void *dst, size_t dst_off, const void *src,
                                           size_t src_off, size_t bytes) {
    GPUARR__UNUSED(s);
    gpuarr__cpu_memcpy((unsigned char *)dst + dst_off, (const unsigned char *)src + src_off, bytes);
    return GPUARR_OK;
}

static bool gpuarr__host_can_copy_peer(gpuarr__dev *dst, gpuarr__dev *src) {
    GPUARR__UNUSED(dst);
    GPUARR__UNUSED(src);
    return false; /* there is one host device */
}

static gpuarr_result gpuarr__host_copy_peer(gpuarr__stream *s, gpuarr__dev *dst_dev, void *dst, size_t dst_off,
                                            gpuarr__dev *src_dev, const void *src, size_t src_off, size_t bytes) {
    GPUARR__UNUSED(s); GPUARR__UNUSED(dst_dev); GPUARR__UNUSED(dst); GPUARR__UNUSED(dst_off);
    GPUARR__UNUSED(src_dev); GPUARR__UNUSED(src); GPUARR__UNUSED(src_off); GPUARR__UNUSED(bytes);
    return gpuarr__fail(GPUARR_ERROR_UNSUPPORTED, "the host backend has no peer devices");
}

static gpuarr_result gpuarr__host_cast(gpuarr__stream *s, void *dst, size_t dst_off, gpuarr_dtype dst_t,
                                       const void *src, size_t src_off, gpuarr_dtype src_t, size_t count) {
    GPUARR__TRACE_SCOPE(gpuarr__trace_cast, s, dst_t, src_t, count);
    gpuarr__cpu_cast((unsigned char *)dst + dst_off, dst_t, (const unsigned char *)src + src_off, src_t, count);
    return GPUARR_OK;
}

static gpuarr_result gpuarr__host_cast_supported(gpuarr__dev *d, gpuarr_dtype dst_t, gpuarr_dtype src_t) {
    GPUARR__UNUSED(d); GPUARR__UNUSED(dst_t); GPUARR__UNUSED(src_t);
    return GPUARR_OK; /* the host reference casts every pair */
}

/* The stream's work is done already: run it now. */
static gpuarr_result gpuarr__host_launch_host_fn(gpuarr__stream *s, gpuarr__host_fn fn, void *ctx) {
    GPUARR__UNUSED(s);
    fn(ctx);
    return GPUARR_OK;
}

static gpuarr_result gpuarr__host_fill(gpuarr__stream *s, void *dst, size_t dst_off, const void *pattern, size_t pattern_size,
                                       size_t bytes) {
    GPUARR__TRACE_SCOPE(gpuarr__trace_fill, s, bytes, pattern_size);
    gpuarr__cpu_fill((unsigned char *)dst + dst_off, pattern, pattern_size, bytes);
    return GPUARR_OK;
}

static gpuarr_result gpuarr__host_stream_create(gpuarr__dev *d, void **native) {
    GPUARR__UNUSED(d);
    *native = (void *)&gpuarr__host_stream_token;
    return GPUARR_OK;
}
static void gpuarr__host_stream_destroy(gpuarr__dev *d, void *native) { GPUARR__UNUSED(d); GPUARR__UNUSED(native); }
static gpuarr_result gpuarr__host_stream_sync(gpuarr__dev *d, void *native) {
    GPUARR__UNUSED(d); GPUARR__UNUSED(native);
    return GPUARR_OK;
}
static gpuarr_result gpuarr__host_stream_query(gpuarr__dev *d, void *native, bool *done) {
    GPUARR__UNUSED(d); GPUARR__UNUSED(native);
    *done = true;
    return GPUARR_OK;
}

static gpuarr_result gpuarr__host_event_create(gpuarr__dev *d, bool timing, void **native) {
    GPUARR__UNUSED(d); GPUARR__UNUSED(timing);
    gpuarr__host_event *e = (gpuarr__host_event *)gpuarr__malloc(sizeof *e);
    if (!e) return gpuarr__fail(GPUARR_ERROR_OUT_OF_MEMORY, "no host memory for an event");
    e->recorded_ms = -1.0;
    *native = e;
    return GPUARR_OK;
}
static void gpuarr__host_event_destroy(gpuarr__dev *d, void *native) { GPUARR__UNUSED(d); gpuarr__free(native); }
static gpuarr_result gpuarr__host_event_record(gpuarr__dev *d, void *event, void *stream) {
    GPUARR__UNUSED(d); GPUARR__UNUSED(stream);
    ((gpuarr__host_event *)event)->recorded_ms = gpuarr__now_ms();
    return GPUARR_OK;
}
static gpuarr_result gpuarr__host_event_sync(gpuarr__dev *d, void *event) {
    GPUARR__UNUSED(d); GPUARR__UNUSED(event);
    return GPUARR_OK;
}
static gpuarr_result gpuarr__host_event_query(gpuarr__dev *d, void *event, bool *done) {
    GPUARR__UNUSED(d); GPUARR__UNUSED(event);
    *done = true;
    return GPUARR_OK;
}
static gpuarr_result gpuarr__host_event_elapsed(gpuarr__dev *d, void *start, void *end, double *ms) {
    GPUARR__UNUSED(d);
    *ms = ((gpuarr__host_event *)end)->recorded_ms - ((gpuarr__host_event *)start)->recorded_ms;
    return GPUARR_OK;
}
static gpuarr_result gpuarr__host_stream_wait_event(gpuarr__dev *d, void *stream, void *event) {
    GPUARR__UNUSED(d); GPUARR__UNUSED(stream); GPUARR__UNUSED(event);
    return GPUARR_OK; /* the event's work is already done */
}
static gpuarr_result gpuarr__host_activate(gpuarr__dev *d, void **previous) {
    GPUARR__UNUSED(d);
    *previous = NULL;
    return GPUARR_OK;
}
static void gpuarr__host_deactivate(gpuarr__dev *d, void *previous) { GPUARR__UNUSED(d); GPUARR__UNUSED(previous); }

static const gpuarr__interop_HOST gpuarr__host_interop = {GPUARR_BACKEND_HOST, GPUARR__INTEROP_HOST(GPUARR__INTEROP_IMPL)};

/* synchronous, builtin ("host", always kept), its memory is host memory, no allocation limit */
#define GPUARR__HOST_PROC(ret, name, params) gpuarr__host_##name,
static const gpuarr__backend gpuarr__backend_host = {
    GPUARR_BACKEND_HOST, "host", true, true, true, true, NULL, &gpuarr__host_interop, GPUARR__BACKEND_PROCS(GPUARR__HOST_PROC)};
#undef GPUARR__HOST_PROC
#define GPUARR__BACKEND_PTR_HOST (&gpuarr__backend_host)

#endif /* GPUARR_HOST_BACKEND_INCLUDED */
