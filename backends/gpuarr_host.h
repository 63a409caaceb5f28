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
static size_t gpuarr__host_mem_alignment(gpuarr__dev *d) { GPUARR__UNUSED(d); return GPUARR__HOST_ALIGN; }

static gpuarr_result gpuarr__host_copy_h2d(gpuarr__stream *s, void *dst, size_t dst_off, const void *src, size_t bytes, bool async) {
    GPUARR__UNUSED(s);
    GPUARR__UNUSED(async);
    gpuarr__cpu_memcpy((unsigned char *)dst + dst_off, src, bytes);
    return GPUARR_OK;
}

static gpuarr_result gpuarr__host_copy_d2h(gpuarr__stream *s, void *dst, const void *src, size_t src_off, size_t bytes, bool async) {
    GPUARR__UNUSED(s);
    GPUARR__UNUSED(async);
    gpuarr__cpu_memcpy(dst, (const unsigned char *)src + src_off, bytes);
    return GPUARR_OK;
}

static gpuarr_result gpuarr__host_copy_d2d(gpuarr__stream *s, void *dst, size_t dst_off, const void *src,
                                           size_t src_off, size_t bytes) {
    GPUARR__UNUSED(s);
    gpuarr__cpu_memcpy((unsigned char *)dst + dst_off, (const unsigned char *)src + src_off, bytes);
    return GPUARR_OK;
}

static gpuarr_result gpuarr__host_cast(gpuarr__stream *s, void *dst, size_t dst_off, gpuarr_dtype dst_t,
                                       const void *src, size_t src_off, gpuarr_dtype src_t, size_t count) {
    GPUARR__TRACE_SCOPE(gpuarr__trace_cast, s, dst_t, src_t, count);
    gpuarr__cpu_cast((unsigned char *)dst + dst_off, dst_t, (const unsigned char *)src + src_off, src_t, count);
    return GPUARR_OK;
}

static gpuarr_result gpuarr__host_fill(gpuarr__stream *s, void *dst, size_t dst_off, const void *pattern, size_t pattern_size,
                                       size_t bytes, bool async) {
    GPUARR__UNUSED(async);
    GPUARR__TRACE_SCOPE(gpuarr__trace_fill, s, bytes, pattern_size);
    gpuarr__cpu_fill((unsigned char *)dst + dst_off, pattern, pattern_size, bytes);
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
static gpuarr_result gpuarr__host_event_elapsed(gpuarr__dev *d, void *start, void *end, double *ms) {
    GPUARR__UNUSED(d);
    *ms = ((gpuarr__host_event *)end)->recorded_ms - ((gpuarr__host_event *)start)->recorded_ms;
    return GPUARR_OK;
}

/* ---------------------------------------------------------------------------------------------
 * Telemetry: memory from /proc/meminfo, CPU utilization from /proc/stat, the CPU's temperature
 * from hwmon. Every path is read under gpuarr__g.host_telemetry.fs_root ("" = the real /proc and
 * /sys; white-box tests point it at fixture files).
 * ------------------------------------------------------------------------------------------- */
static FILE *gpuarr__host_open_fs(const char *path) {
    char full[512];
    int n = snprintf(full, sizeof full, "%s%s", gpuarr__g.host_telemetry.fs_root, path);
    if (n < 0 || (size_t)n >= sizeof full) return NULL;
    return fopen(full, "r");
}

/* An unsigned decimal at *p (after blanks), moving p past it; false if there is none or it
   does not fit in 64 bits. */
static bool gpuarr__host_parse_u64(const char **p, uint64_t *out) {
    const char *s = *p;
    while (*s == ' ' || *s == '\t') s++;
    if (*s < '0' || *s > '9') return false;
    uint64_t v = 0;
    for (; *s >= '0' && *s <= '9'; s++) {
        uint64_t digit = (uint64_t)(*s - '0');
        if (v > (UINT64_MAX - digit) / 10u) return false;
        v = v * 10u + digit;
    }
    *p = s;
    *out = v;
    return true;
}

/* "MemTotal:  16314080 kB": the bytes of one /proc/meminfo line; false if absent or malformed. */
static bool gpuarr__host_meminfo_line(const char *line, const char *key, uint64_t *bytes) {
    size_t n = strlen(key);
    if (strncmp(line, key, n) != 0 || line[n] != ':') return false;
    const char *p = line + n + 1;
    uint64_t kb;
    if (!gpuarr__host_parse_u64(&p, &kb) || kb > UINT64_MAX / 1024u) return false;
    while (*p == ' ' || *p == '\t') p++;
    if (strncmp(p, "kB", 2) != 0) return false;
    *bytes = kb * 1024u;
    return true;
}

static void gpuarr__host_telemetry_memory(gpuarr_telemetry *out) {
    FILE *f = gpuarr__host_open_fs("/proc/meminfo");
    if (!f) return;
    char line[256];
    uint64_t total = 0, avail = 0;
    bool have_total = false, have_avail = false;
    while (fgets(line, sizeof line, f)) {
        if (!have_total) have_total = gpuarr__host_meminfo_line(line, "MemTotal", &total);
        if (!have_avail) have_avail = gpuarr__host_meminfo_line(line, "MemAvailable", &avail);
    }
    fclose(f);
    if (!have_total || total == 0) return;
    out->memory_total = total;
    out->valid |= (uint32_t)GPUARR_TELEMETRY_MEMORY_TOTAL;
    if (!have_avail || avail > total) return;
    out->memory_free = avail;
    out->memory_used = total - avail;
    out->valid |= (uint32_t)GPUARR_TELEMETRY_MEMORY_USAGE;
}

/* The first line of /proc/stat, "cpu  user nice system idle iowait irq softirq steal ...": the
   ticks spent busy and in all (guest time is already in user and nice). At least user, nice,
   system and idle; false if malformed. */
static bool gpuarr__host_stat_sample(uint64_t *busy, uint64_t *total) {
    FILE *f = gpuarr__host_open_fs("/proc/stat");
    if (!f) return false;
    char line[512];
    bool ok = fgets(line, sizeof line, f) != NULL && strncmp(line, "cpu ", 4) == 0;
    fclose(f);
    if (!ok) return false;
    const char *p = line + 4;
    uint64_t v[8] = {0}, sum = 0;
    int n = 0;
    while (n < 8 && gpuarr__host_parse_u64(&p, &v[n])) {
        if (sum > UINT64_MAX - v[n]) return false;
        sum += v[n++];
    }
    if (n < 4 || (*p != '\n' && *p != '\0' && *p != ' ')) return false;
    uint64_t idle = v[3] + v[4]; /* idle and iowait */
    *busy = sum - idle;
    *total = sum;
    return true;
}

/* CPU utilization since the previous call in this gpuarr_init cycle (the first: since boot).
   Two calls within one tick report the previous value again. */
static void gpuarr__host_telemetry_cpu(gpuarr_telemetry *out) {
    uint64_t busy, total;
    if (!gpuarr__host_stat_sample(&busy, &total)) return;
    pthread_mutex_lock(&gpuarr__g.host_telemetry.lock);
    uint64_t busy0 = 0, total0 = 0;
    if (gpuarr__g.host_telemetry.sampled && total >= gpuarr__g.host_telemetry.total && busy >= gpuarr__g.host_telemetry.busy) {
        busy0 = gpuarr__g.host_telemetry.busy;
        total0 = gpuarr__g.host_telemetry.total;
    } /* else the first sample, or the counters went back (another fs_root): since boot */
    int pct = gpuarr__g.host_telemetry.last_pct;
    if (total > total0) {
        uint64_t db = busy - busy0, dt = total - total0;
        pct = (int)((db * 100u + dt / 2u) / dt);
        if (pct > 100) pct = 100;
    }
    gpuarr__g.host_telemetry.sampled = true;
    gpuarr__g.host_telemetry.busy = busy;
    gpuarr__g.host_telemetry.total = total;
    gpuarr__g.host_telemetry.last_pct = pct;
    pthread_mutex_unlock(&gpuarr__g.host_telemetry.lock);
    out->gpu_utilization_pct = pct;
    out->valid |= (uint32_t)GPUARR_TELEMETRY_GPU_UTILIZATION;
}

/* One line holding a signed decimal (hwmon's millidegrees); false if malformed. */
static bool gpuarr__host_read_long(const char *path, long *out) {
    FILE *f = gpuarr__host_open_fs(path);
    if (!f) return false;
    char line[64];
    bool ok = fgets(line, sizeof line, f) != NULL;
    fclose(f);
    if (!ok) return false;
    char *end;
    errno = 0;
    long v = strtol(line, &end, 10);
    if (end == line || errno || (*end != '\n' && *end != '\0')) return false;
    *out = v;
    return true;
}

/* The first hwmon device (by number) whose name is a CPU sensor gpuarr knows, and its first
   temperature input (by number) that reads. */
static void gpuarr__host_telemetry_temperature(gpuarr_telemetry *out) {
    static const char *const sensors[] = {"k10temp", "coretemp", "zenpower", "cpu_thermal"};
    char path[128], name[64];
    for (int h = 0; h < 64; h++) {
        snprintf(path, sizeof path, "/sys/class/hwmon/hwmon%d/name", h);
        FILE *f = gpuarr__host_open_fs(path);
        if (!f) continue;
        bool got = fgets(name, sizeof name, f) != NULL;
        fclose(f);
        if (!got) continue;
        name[strcspn(name, "\n")] = '\0';
        bool cpu = false;
        for (size_t i = 0; i < sizeof sensors / sizeof sensors[0]; i++) cpu = cpu || strcmp(name, sensors[i]) == 0;
        if (!cpu) continue;
        for (int t = 1; t <= 64; t++) {
            long milli;
            snprintf(path, sizeof path, "/sys/class/hwmon/hwmon%d/temp%d_input", h, t);
            if (!gpuarr__host_read_long(path, &milli) || milli < -273150 || milli > 1000000) continue;
            out->temperature_c = (double)milli / 1000.0;
            out->valid |= (uint32_t)GPUARR_TELEMETRY_TEMPERATURE;
            return;
        }
    }
}

static void gpuarr__host_telemetry(gpuarr__dev *d, gpuarr_telemetry *out) {
    GPUARR__UNUSED(d);
    gpuarr__host_telemetry_memory(out);
    gpuarr__host_telemetry_cpu(out);
    gpuarr__host_telemetry_temperature(out);
}

static const gpuarr__interop_HOST gpuarr__host_interop = {GPUARR_BACKEND_HOST, GPUARR__INTEROP_HOST(GPUARR__INTEROP_IMPL)};

/* The host's table. Synchronous, so it leaves the stream procedures and the event waits NULL;
   no driver to load, nothing to open, no pinned memory, no peers, no context to activate: those
   are NULL too. */
static void gpuarr__host_backend_fill(gpuarr__backend *b) {
    b->id = GPUARR_BACKEND_HOST;
    b->name = "host";
    b->flags = GPUARR__BACKEND_SYNCHRONOUS | GPUARR__BACKEND_BUILTIN | GPUARR__BACKEND_HOST_MEMORY | GPUARR__BACKEND_PAGEABLE_ASYNC;
    b->max_alloc_name = NULL; /* no allocation limit of its own */
    b->interop = &gpuarr__host_interop;
    b->device_count = gpuarr__host_device_count;
    b->device_info = gpuarr__host_device_info;
    b->mem_info = gpuarr__host_mem_info;
    b->mem_alloc = gpuarr__host_mem_alloc;
    b->mem_free = gpuarr__host_mem_free;
    b->mem_alignment = gpuarr__host_mem_alignment;
    b->copy_h2d = gpuarr__host_copy_h2d;
    b->copy_d2h = gpuarr__host_copy_d2h;
    b->copy_d2d = gpuarr__host_copy_d2d;
    b->cast = gpuarr__host_cast;
    b->fill = gpuarr__host_fill;
    b->event_create = gpuarr__host_event_create;
    b->event_destroy = gpuarr__host_event_destroy;
    b->event_record = gpuarr__host_event_record;
    b->event_elapsed = gpuarr__host_event_elapsed;
    b->telemetry = gpuarr__host_telemetry;
}
#define GPUARR__BACKEND_FILL_HOST gpuarr__host_backend_fill

#endif /* GPUARR_HOST_BACKEND_INCLUDED */
