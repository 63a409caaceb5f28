/*
 * gpuarr_transfer_model.h -- the transfer model (the manual's TRANSFER MODEL section), a layer on
 * the core: included by the implementation of gpuarr.h after the leases, so it uses the core's
 * internals (and gpuarr__lease_key, for the devices' stable names); registers in
 * gpuarr__layer_list.
 *
 * A model per (source device, destination device, source memory kind, cast or not):
 * t = latency + bytes / bandwidth, bytes of the source data. It is fitted from gpuarr_copy
 * itself (synchronous, monotonic clock): 64 KiB, 1 MiB and 16 MiB, the median of 5 each after one
 * warm-up, by least squares on relative error (so the 64 KiB point weighs as much as the 16 MiB
 * one), clamped so that latency >= 0 and bandwidth > 0. A cast is measured f32 -> i32 (equal
 * widths); other casts scale the bytes by (source size + target size) / (2 * source size), the
 * bytes read and written relative to an equal-width cast.
 *
 * Locking: one lock, a leaf: it is never held while a transfer is measured or while any other
 * gpuarr lock is taken. A pair being fitted is marked FITTING; other threads that need it wait on
 * the condition variable (holding nothing) rather than fit it twice. So gpuarr__transfer_predict
 * must be called with no gpuarr lock held (lease, pool, device): the fit it may run allocates and
 * copies through the public calls, which take those.
 *
 * Persistence: <cache dir>/models/<src key>--<dst key>.model, keys as the lease files' (UUID,
 * else PCI address, else host name and spec), a text file that names the host and both devices'
 * driver/platform versions; written whole to a temporary name, then renamed. Read lazily, the
 * first time a pair of devices is needed (or by gpuarr_transfer_models_summary).
 */
#ifndef GPUARR_TRANSFER_MODEL_INCLUDED
#define GPUARR_TRANSFER_MODEL_INCLUDED

#include <math.h>

typedef enum gpuarr__xfer_mem { /* the memory the source data is in */
    GPUARR__XFER_PAGEABLE,      /* ordinary host memory (malloc'd, or a host array not pinned) */
    GPUARR__XFER_PINNED,        /* page-locked host memory (gpuarr_empty_pinned) */
    GPUARR__XFER_DEVICE,        /* device memory of src */
    GPUARR__XFER_MEM_COUNT
} gpuarr__xfer_mem;

static const char *const gpuarr__xfer_mem_names[GPUARR__XFER_MEM_COUNT] = {"pageable", "pinned", "device"};

#define GPUARR__XFER_SIZES 3
#define GPUARR__XFER_REPS 5
#define GPUARR__XFER_FALLBACK_BPS 1e9 /* bytes per second when nothing is modeled */
#define GPUARR__XFER_FILE_MAX 65536

enum { GPUARR__XFER_NONE, GPUARR__XFER_FITTING, GPUARR__XFER_READY, GPUARR__XFER_FAILED };
enum { GPUARR__XFER_MEASURED, GPUARR__XFER_LOADED, GPUARR__XFER_SET };
static const char *const gpuarr__xfer_origin_names[] = {"measured", "loaded", "set"};

typedef struct gpuarr__xfer_model {
    uint8_t state, origin;
    double latency_s, bytes_per_s;
} gpuarr__xfer_model;

typedef struct gpuarr__xfer_state {
    pthread_mutex_t lock;
    pthread_cond_t fitted;      /* broadcast when a fit ends */
    int n;                      /* devices in the registry */
    gpuarr__xfer_model *models; /* [src][dst][mem][cast] */
    bool *loaded;               /* [src][dst]: its file has been read (or there is none to read) */
    char (*keys)[128];          /* by device: its name in file names */
    char host[64];              /* this machine's name, part of every file's key */
    char dir[600];              /* <cache>/models; "" = models are not kept */
    bool lazy;                  /* GPUARR_CALIBRATE: fit a pair the first time it is needed */
    uint64_t fits;              /* measurements run (white-box tests: one per pair, however many threads ask) */
} gpuarr__xfer_state;
static void gpuarr__xfer_layer(gpuarr__layer *l);
/* The layer's state (gpuarr__layer_state): NULL outside its start and stop. */
static gpuarr__xfer_state *gpuarr__xfer_st(void) { return (gpuarr__xfer_state *)gpuarr__layer_state(gpuarr__xfer_layer); }

typedef struct gpuarr__xfer_pair {
    int src, dst;
    gpuarr__xfer_mem mem;
    int cast;
} gpuarr__xfer_pair;

static gpuarr__xfer_model *gpuarr__xfer_at(int src, int dst, gpuarr__xfer_mem mem, int cast) {
    gpuarr__xfer_state *xs = gpuarr__xfer_st();
    return &xs->models[(((size_t)src * (size_t)xs->n + (size_t)dst) * GPUARR__XFER_MEM_COUNT + (size_t)mem) * 2 + (size_t)cast];
}

static int gpuarr__xfer_index(const gpuarr__dev *d) { return d->view; } /* an adopted device: its own view */

/* ---------------------------------------------------------------------------------------------
 * Start and stop (gpuarr_init, the last gpuarr_shutdown)
 * ------------------------------------------------------------------------------------------- */
static gpuarr_result gpuarr__xfer_start(void) {
    size_t n = (size_t)gpuarr__g.device_count;
    gpuarr__xfer_state *xs = (gpuarr__xfer_state *)gpuarr__calloc(sizeof *xs);
    gpuarr__xfer_model *models = (gpuarr__xfer_model *)gpuarr__calloc(sizeof *models * n * n * GPUARR__XFER_MEM_COUNT * 2);
    bool *loaded = (bool *)gpuarr__calloc(sizeof *loaded * n * n);
    char(*keys)[128] = (char(*)[128])gpuarr__calloc(sizeof *keys * n);
    if (!xs || !models || !loaded || !keys) {
        gpuarr__free(xs), gpuarr__free(models), gpuarr__free(loaded), gpuarr__free(keys);
        return gpuarr__fail(GPUARR_ERROR_OUT_OF_MEMORY, "no host memory for the transfer models");
    }
    pthread_mutex_init(&xs->lock, NULL);
    pthread_cond_init(&xs->fitted, NULL);
    xs->n = (int)n;
    xs->models = models;
    xs->loaded = loaded;
    xs->keys = keys;
    xs->lazy = gpuarr__setting_value(GPUARR__SET_CALIBRATE, 1) != 0;
    if (gethostname(xs->host, sizeof xs->host - 1) != 0 || !xs->host[0]) gpuarr__copy_string(xs->host, sizeof xs->host, "localhost");
    for (char *c = xs->host; *c; c++)
        if (*c <= ' ') *c = '_';
    for (size_t i = 0; i < n; i++) gpuarr__lease_key(&gpuarr__g.devices[i].info, keys[i], sizeof keys[i]);
    if (gpuarr__g.config.cache_dir[0]) snprintf(xs->dir, sizeof xs->dir, "%.500s/models", gpuarr__g.config.cache_dir);
    gpuarr__layer_state_set(gpuarr__xfer_layer, xs);
    return GPUARR_OK;
}

static void gpuarr__xfer_stop(void) {
    gpuarr__xfer_state *xs = gpuarr__xfer_st();
    if (!xs) return;
    pthread_cond_destroy(&xs->fitted);
    pthread_mutex_destroy(&xs->lock);
    gpuarr__free(xs->models);
    gpuarr__free(xs->loaded);
    gpuarr__free(xs->keys);
    gpuarr__free(xs);
    gpuarr__layer_state_set(gpuarr__xfer_layer, NULL);
}

/* ---------------------------------------------------------------------------------------------
 * Files
 * ------------------------------------------------------------------------------------------- */
/* The pair's file name in the models folder; false: models are not kept. */
static bool gpuarr__xfer_file(int src, int dst, char *out, size_t cap) {
    gpuarr__xfer_state *xs = gpuarr__xfer_st();
    if (!xs->dir[0]) return false;
    return snprintf(out, cap, "%s--%s.model", xs->keys[src], xs->keys[dst]) < (int)cap;
}

/* The models folder in the cache folder, checked like it (see gpuarr__dir_open) and made only to
   write (make): its descriptor, or -1 (none yet, or refused: said at info level, the cache is
   optional). */
static int gpuarr__xfer_dir_open(bool make) {
    int cache = gpuarr__cache_dir_open();
    if (cache < 0) return -1;
    char why[160];
    bool shared;
    int fd = gpuarr__dir_open_at(cache, "models", make ? GPUARR__DIR_MAKE : 0u, &shared, why, sizeof why);
    bool missing = fd < 0 && errno == ENOENT && !make;
    close(cache);
    if (fd < 0 && !missing) gpuarr__log(GPUARR_LOG_INFO, "the transfer model folder %s %s: models are not kept", gpuarr__xfer_st()->dir, why);
    return fd;
}

/* "host NAME", "src-version TEXT", ...: the key a file must match, in the order it is written. */
static void gpuarr__xfer_key_lines(int src, int dst, char *out, size_t cap) {
    gpuarr__xfer_state *xs = gpuarr__xfer_st();
    char v[2][sizeof gpuarr__g.devices[0].info.version];
    gpuarr__copy_string(v[0], sizeof v[0], gpuarr__g.devices[src].info.version);
    gpuarr__copy_string(v[1], sizeof v[1], gpuarr__g.devices[dst].info.version);
    for (int i = 0; i < 2; i++) /* one line each, whatever a driver puts in its version */
        for (char *c = v[i]; *c; c++)
            if ((unsigned char)*c < ' ') *c = ' ';
    snprintf(out, cap, "host %s\nsrc %s\nsrc-version %s\ndst %s\ndst-version %s\n", xs->host, xs->keys[src], v[0], xs->keys[dst], v[1]);
}

#define GPUARR__XFER_MAGIC "gpuarr-transfer-model 1\n"

/* Writes the pair's ready models (lock held). A folder or file that cannot be written leaves the
   models in this process only (logged at info level: the cache is optional). */
static void gpuarr__xfer_save(int src, int dst) {
    gpuarr__xfer_state *xs = gpuarr__xfer_st();
    char file[400], why[160];
    if (!gpuarr__xfer_file(src, dst, file, sizeof file)) return;
    char *text = (char *)gpuarr__malloc(GPUARR__XFER_FILE_MAX);
    if (!text) return;
    text[0] = '\0';
    gpuarr__append(text, GPUARR__XFER_FILE_MAX, "%s", GPUARR__XFER_MAGIC);
    gpuarr__xfer_key_lines(src, dst, text + strlen(text), GPUARR__XFER_FILE_MAX - strlen(text));
    for (int mem = 0; mem < GPUARR__XFER_MEM_COUNT; mem++)
        for (int cast = 0; cast < 2; cast++) {
            const gpuarr__xfer_model *m = gpuarr__xfer_at(src, dst, (gpuarr__xfer_mem)mem, cast);
            if (m->state == GPUARR__XFER_READY && m->origin != GPUARR__XFER_SET)
                gpuarr__append(text, GPUARR__XFER_FILE_MAX, "model %s %s %.17g %.17g\n", gpuarr__xfer_mem_names[mem], cast ? "cast" : "copy",
                               m->latency_s, m->bytes_per_s);
        }
    gpuarr__append(text, GPUARR__XFER_FILE_MAX, "end\n");
    int dir = gpuarr__xfer_dir_open(true);
    if (dir >= 0 && !gpuarr__file_write_at(dir, file, NULL, 0, text, strlen(text), why, sizeof why))
        gpuarr__log(GPUARR_LOG_INFO, "the transfer model file %s/%s %s", xs->dir, file, why);
    if (dir >= 0) close(dir);
    gpuarr__free(text);
}

/* One "model <mem> <copy|cast> <latency> <bytes/s>" line into out[mem][cast]; false: malformed. */
static bool gpuarr__xfer_parse_model(const char *line, gpuarr__xfer_model out[GPUARR__XFER_MEM_COUNT][2]) {
    char mem[16], kind[8];
    double lat, bps;
    int used = 0;
    if (sscanf(line, "model %15s %7s %lf %lf%n", mem, kind, &lat, &bps, &used) != 4 || line[used] != '\0') return false;
    int m = -1, cast = strcmp(kind, "cast") == 0 ? 1 : strcmp(kind, "copy") == 0 ? 0 : -1;
    for (int i = 0; i < GPUARR__XFER_MEM_COUNT; i++)
        if (strcmp(mem, gpuarr__xfer_mem_names[i]) == 0) m = i;
    if (m < 0 || cast < 0 || !isfinite(lat) || !isfinite(bps) || lat < 0 || bps <= 0) return false;
    out[m][cast].state = GPUARR__XFER_READY;
    out[m][cast].origin = GPUARR__XFER_LOADED;
    out[m][cast].latency_s = lat;
    out[m][cast].bytes_per_s = bps;
    return true;
}

/* Parses a file's text: 1 = its models are in out; 0 = its key is another's (stale); -1 = it is
   malformed or cut short. */
static int gpuarr__xfer_parse(int src, int dst, char *text, gpuarr__xfer_model out[GPUARR__XFER_MEM_COUNT][2]) {
    char key[1024];
    gpuarr__xfer_key_lines(src, dst, key, sizeof key);
    size_t magic = strlen(GPUARR__XFER_MAGIC);
    if (strncmp(text, GPUARR__XFER_MAGIC, magic) != 0) return -1;
    char *p = text + magic;
    /* the key: five lines, each "<name> <text>" */
    static const char *const names[] = {"host ", "src ", "src-version ", "dst ", "dst-version "};
    char *key_start = p;
    for (int i = 0; i < 5; i++) {
        char *nl = strchr(p, '\n');
        if (!nl || strncmp(p, names[i], strlen(names[i])) != 0) return -1;
        p = nl + 1;
    }
    bool same_key = (size_t)(p - key_start) == strlen(key) && strncmp(key_start, key, strlen(key)) == 0;
    bool ended = false;
    while (*p) {
        char *nl = strchr(p, '\n');
        if (!nl) return -1; /* a last line without its newline: cut short */
        *nl = '\0';
        if (ended) return -1;
        if (strcmp(p, "end") == 0) ended = true;
        else if (!gpuarr__xfer_parse_model(p, out)) return -1;
        p = nl + 1;
    }
    if (!ended) return -1;
    return same_key ? 1 : 0;
}

/* Reads the pair's file once (lock held). Models fitted or set here already are kept. */
static void gpuarr__xfer_load(int src, int dst) {
    gpuarr__xfer_state *xs = gpuarr__xfer_st();
    bool *loaded = &xs->loaded[(size_t)src * (size_t)xs->n + (size_t)dst];
    if (*loaded) return;
    *loaded = true;
    char file[400], path[1000], why[160];
    if (!gpuarr__xfer_file(src, dst, file, sizeof file)) return;
    snprintf(path, sizeof path, "%s/%s", xs->dir, file);
    int dir = gpuarr__xfer_dir_open(false);
    if (dir < 0) return;
    size_t got = 0;
    char *text = (char *)gpuarr__file_read_at(dir, file, GPUARR__XFER_FILE_MAX, &got, why, sizeof why);
    close(dir);
    if (!text) {
        if (why[0]) gpuarr__log(GPUARR_LOG_WARN, "the transfer model file %s %s: ignored, and rebuilt when its models are fitted", path, why);
        return;
    }
    gpuarr__xfer_model found[GPUARR__XFER_MEM_COUNT][2];
    memset(found, 0, sizeof found);
    int r = strlen(text) != got ? -1 : gpuarr__xfer_parse(src, dst, text, found);
    gpuarr__free(text);
    if (r < 0) {
        gpuarr__log(GPUARR_LOG_WARN, "the transfer model file %s is corrupted or cut short: ignored, and rebuilt when its models are fitted",
                    path);
        return;
    }
    if (r == 0) {
        gpuarr__log(GPUARR_LOG_INFO, "the transfer model file %s is for another host, device or driver version: its models will be refitted",
                    path);
        return;
    }
    for (int m = 0; m < GPUARR__XFER_MEM_COUNT; m++)
        for (int c = 0; c < 2; c++) {
            gpuarr__xfer_model *dstm = gpuarr__xfer_at(src, dst, (gpuarr__xfer_mem)m, c);
            if (found[m][c].state == GPUARR__XFER_READY && dstm->state == GPUARR__XFER_NONE) *dstm = found[m][c];
        }
}

/* ---------------------------------------------------------------------------------------------
 * Measuring and fitting
 * ------------------------------------------------------------------------------------------- */
/* The median of n values (n <= 16); reorders v. One spike among five moves it not at all. */
static double gpuarr__xfer_median(double *v, int n) {
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && v[j - 1] > v[j]; j--) {
            double t = v[j];
            v[j] = v[j - 1];
            v[j - 1] = t;
        }
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* t = a + x / bps by least squares on relative error (weights 1 / y^2), so that small and large
   transfers count alike; a negative latency or a slope that does not grow is replaced by the fit
   through the origin (latency 0). y must be > 0. */
static void gpuarr__xfer_fit(const double *x, const double *y, int n, double *latency_s, double *bytes_per_s) {
    double sw = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
    for (int i = 0; i < n; i++) {
        double w = 1.0 / (y[i] * y[i]);
        sw += w, sx += w * x[i], sy += w * y[i], sxx += w * x[i] * x[i], sxy += w * x[i] * y[i];
    }
    double det = sw * sxx - sx * sx;
    double b = det > 0 ? (sw * sxy - sx * sy) / det : 0;
    double a = b > 0 ? (sy - b * sx) / sw : -1;
    if (a < 0) a = 0, b = sxy / sxx;
    *latency_s = a;
    *bytes_per_s = 1.0 / b;
}

static double gpuarr__xfer_seconds_since(const struct timespec *t0) {
    struct timespec t1;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double s = (double)(t1.tv_sec - t0->tv_sec) + (double)(t1.tv_nsec - t0->tv_nsec) * 1e-9;
    return s > 1e-9 ? s : 1e-9;
}

/* The median of GPUARR__XFER_REPS synchronous gpuarr_copy calls, after a warm-up. */
static gpuarr_result gpuarr__xfer_time(gpuarr_array to, gpuarr_array from, double *median) {
    double t[GPUARR__XFER_REPS];
    GPUARR__CHECK(gpuarr_copy(to, from));
    for (int i = 0; i < GPUARR__XFER_REPS; i++) {
        struct timespec t0;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        GPUARR__CHECK(gpuarr_copy(to, from));
        t[i] = gpuarr__xfer_seconds_since(&t0);
    }
    *median = gpuarr__xfer_median(t, GPUARR__XFER_REPS);
    return GPUARR_OK;
}

/* The source array of a measurement: on src, or on the host (pinned for dst when mem says so). */
static gpuarr_result gpuarr__xfer_source(const gpuarr__xfer_pair *p, int64_t count, gpuarr_array *out) {
    gpuarr_device src = gpuarr__device_handle(p->src), dst = gpuarr__device_handle(p->dst);
    if (p->mem == GPUARR__XFER_PINNED) {
        float zero = 0;
        GPUARR__CHECK(gpuarr_empty_pinned(dst, GPUARR_F32, 1, &count, out));
        gpuarr_result r = gpuarr_fill_as(*out, GPUARR_F32, &zero);
        if (r != GPUARR_OK) gpuarr_release(*out);
        return r;
    }
    return gpuarr_zeros(src, GPUARR_F32, 1, &count, out);
}

/* One size: seconds per transfer of `bytes` of f32 (to i32 for a cast). */
static gpuarr_result gpuarr__xfer_measure_size(const gpuarr__xfer_pair *p, uint64_t bytes, double *seconds) {
    int64_t count = (int64_t)(bytes / 4);
    gpuarr_array from = {0}, to = {0};
    gpuarr_result r = gpuarr__xfer_source(p, count, &from);
    if (r == GPUARR_OK) r = gpuarr_empty(gpuarr__device_handle(p->dst), p->cast ? GPUARR_I32 : GPUARR_F32, 1, &count, &to);
    if (r == GPUARR_OK) r = gpuarr__xfer_time(to, from, seconds);
    if (from.id) gpuarr_release(from);
    if (to.id) gpuarr_release(to);
    return r;
}

/* Fits p's model from the library's own copies (no lock held). On failure the reason is in the
   thread's error detail. */
static gpuarr_result gpuarr__xfer_measure(const gpuarr__xfer_pair *p, double *latency_s, double *bytes_per_s) {
    static const uint64_t sizes[GPUARR__XFER_SIZES] = {64u << 10, 1u << 20, 16u << 20};
    double x[GPUARR__XFER_SIZES], y[GPUARR__XFER_SIZES];
    for (int i = 0; i < GPUARR__XFER_SIZES; i++) {
        x[i] = (double)sizes[i];
        GPUARR__CHECK(gpuarr__xfer_measure_size(p, sizes[i], &y[i]));
    }
    gpuarr__xfer_fit(x, y, GPUARR__XFER_SIZES, latency_s, bytes_per_s);
    return GPUARR_OK;
}

static void gpuarr__xfer_pair_name(const gpuarr__xfer_pair *p, char *out, size_t cap) {
    snprintf(out, cap, "%s -> %s %s %s", gpuarr__g.devices[p->src].info.spec, gpuarr__g.devices[p->dst].info.spec,
             gpuarr__xfer_mem_names[p->mem], p->cast ? "cast" : "copy");
}

/* Fits p now, waiting for a fit of it another thread runs, and saves the pair's file. `force`:
   replace a model it has (gpuarr_calibrate); else fit only one it lacks (lazily). The public calls
   of the measurement overwrite this thread's api name and error: both are put back, and a failure
   is returned with its reason in *why. */
static gpuarr_result gpuarr__xfer_refit(const gpuarr__xfer_pair *p, bool force, char *why, size_t why_cap) {
    gpuarr__xfer_state *xs = gpuarr__xfer_st();
    gpuarr__xfer_model *m = gpuarr__xfer_at(p->src, p->dst, p->mem, p->cast);
    pthread_mutex_lock(&xs->lock);
    gpuarr__xfer_load(p->src, p->dst);
    while (m->state == GPUARR__XFER_FITTING) pthread_cond_wait(&xs->fitted, &xs->lock);
    if (!force && m->state != GPUARR__XFER_NONE) {
        pthread_mutex_unlock(&xs->lock);
        return GPUARR_OK;
    }
    gpuarr__xfer_model before = *m;
    m->state = GPUARR__XFER_FITTING;
    pthread_mutex_unlock(&xs->lock);

    const char *api = gpuarr__tls.api;
    gpuarr__error_saved saved;
    gpuarr__error_save(&saved);
    double lat = 0, bps = 0;
    gpuarr_result r = gpuarr__xfer_measure(p, &lat, &bps);
    if (r != GPUARR_OK && why) gpuarr__copy_string(why, why_cap, gpuarr__tls.error_detail);
    gpuarr__error_restore(&saved);
    gpuarr__tls.api = api;

    pthread_mutex_lock(&xs->lock);
    xs->fits++;
    if (r == GPUARR_OK) {
        m->state = GPUARR__XFER_READY;
        m->origin = GPUARR__XFER_MEASURED;
        m->latency_s = lat;
        m->bytes_per_s = bps;
        gpuarr__xfer_save(p->src, p->dst);
    } else {
        if (before.state == GPUARR__XFER_READY) *m = before; /* a refit that failed keeps the model */
        else m->state = GPUARR__XFER_FAILED;                 /* not retried lazily */
    }
    pthread_cond_broadcast(&xs->fitted);
    pthread_mutex_unlock(&xs->lock);
    if (r != GPUARR_OK) {
        char name[128];
        gpuarr__xfer_pair_name(p, name, sizeof name);
        gpuarr__log(GPUARR_LOG_INFO, "the transfer model %s could not be fitted: %s", name, why ? why : "");
    }
    return r;
}

/* ---------------------------------------------------------------------------------------------
 * Prediction (the internal interface of the offload layer)
 * ------------------------------------------------------------------------------------------- */
/* The key a transfer is modeled under: pinned counts only from the host to the device whose pinned
   memory it is (the caller says so), device memory only off the host. */
static gpuarr__xfer_mem gpuarr__xfer_canonical(const gpuarr__dev *src, gpuarr__xfer_mem mem, const gpuarr__dev *dst) {
    const gpuarr__dev *h = gpuarr__host_dev();
    if (src != h) return GPUARR__XFER_DEVICE;
    if (mem == GPUARR__XFER_PINNED && dst != h) return GPUARR__XFER_PINNED;
    return GPUARR__XFER_PAGEABLE;
}

/* True when nothing moves: the same device and dtype. The host and a unified device
   (info.host_unified) are not that: gpuarr_convert / gpuarr_copy between them copy the data into
   another array (a new one for gpuarr_convert), so that pair is modeled like any other. */
static bool gpuarr__xfer_nothing_moves(const gpuarr__dev *src, const gpuarr__dev *dst, bool cast) {
    return !cast && src == dst;
}

/* Predicted seconds to move `bytes` (bytes of the source data) from memory of kind `mem` on src
   to dst, converting src_t to dst_t (the cast done on the narrow side as gpuarr_convert does).
   0 s when nothing moves (src == dst, same dtype; a unified device and the host are modeled: the
   data is copied). When the pair has no model yet, fits one first (a few transfers:
   64 KiB, 1 MiB, 16 MiB, median of 5) unless calibration is off (GPUARR_CALIBRATE=off), or its fit
   failed before in this process -- then *modeled = false and *seconds is the fallback: 0 for
   same-device, else bytes / 1 GB/s. Thread-safe; call it with no gpuarr lock held (a fit runs
   the public calls). Never fails for valid devices (a failed fit is logged at info level). */
static gpuarr_result gpuarr__transfer_predict(gpuarr__dev *src, gpuarr__xfer_mem mem, gpuarr__dev *dst, gpuarr_dtype src_t,
                                              gpuarr_dtype dst_t, uint64_t bytes, double *seconds, bool *modeled) {
    gpuarr__xfer_state *xs = gpuarr__xfer_st();
    bool cast = src_t != dst_t && dst_t != GPUARR_DTYPE_INVALID;
    if (bytes == 0 || gpuarr__xfer_nothing_moves(src, dst, cast)) {
        *seconds = 0;
        *modeled = true;
        return GPUARR_OK;
    }
    gpuarr__xfer_pair p = {gpuarr__xfer_index(src), gpuarr__xfer_index(dst), gpuarr__xfer_canonical(src, mem, dst), cast};
    gpuarr__xfer_model *m = gpuarr__xfer_at(p.src, p.dst, p.mem, p.cast);
    pthread_mutex_lock(&xs->lock);
    gpuarr__xfer_load(p.src, p.dst);
    bool fit = xs->lazy && m->state == GPUARR__XFER_NONE;
    pthread_mutex_unlock(&xs->lock);
    if (fit) gpuarr__xfer_refit(&p, false, NULL, 0);
    pthread_mutex_lock(&xs->lock);
    while (m->state == GPUARR__XFER_FITTING) pthread_cond_wait(&xs->fitted, &xs->lock);
    gpuarr__xfer_model got = *m;
    pthread_mutex_unlock(&xs->lock);
    double b = (double)bytes;
    if (got.state != GPUARR__XFER_READY) {
        *seconds = src == dst ? 0 : b / GPUARR__XFER_FALLBACK_BPS;
        *modeled = false;
        return GPUARR_OK;
    }
    if (cast) { /* measured at equal widths: scale by the bytes read and written */
        double s = (double)gpuarr_dtype_size(src_t), t = (double)gpuarr_dtype_size(dst_t);
        if (s > 0 && t > 0) b *= (s + t) / (2 * s);
    }
    *seconds = got.latency_s + b / got.bytes_per_s;
    *modeled = true;
    return GPUARR_OK;
}

/* Tests and tools: set a pair's model by hand (t = latency_s + bytes / bytes_per_s), as if
   calibrated: predictions use it, the summary shows it ("set"); it is not saved to disk (a
   synthetic model must never reach another process); inline: unused until the offload layer
   calls it. Latency < 0 or bandwidth <= 0 (or not
   finite): the pair goes back to having no model. */
static inline void gpuarr__transfer_set_model(gpuarr__dev *src, gpuarr__xfer_mem mem, gpuarr__dev *dst, bool cast, double latency_s,
                                       double bytes_per_s) {
    gpuarr__xfer_state *xs = gpuarr__xfer_st();
    gpuarr__xfer_mem km = gpuarr__xfer_canonical(src, mem, dst);
    gpuarr__xfer_model *m = gpuarr__xfer_at(gpuarr__xfer_index(src), gpuarr__xfer_index(dst), km, cast ? 1 : 0);
    pthread_mutex_lock(&xs->lock);
    gpuarr__xfer_load(gpuarr__xfer_index(src), gpuarr__xfer_index(dst)); /* a later load must not replace it */
    while (m->state == GPUARR__XFER_FITTING) pthread_cond_wait(&xs->fitted, &xs->lock);
    bool valid = isfinite(latency_s) && isfinite(bytes_per_s) && latency_s >= 0 && bytes_per_s > 0;
    m->state = valid ? GPUARR__XFER_READY : GPUARR__XFER_NONE;
    m->origin = GPUARR__XFER_SET;
    m->latency_s = valid ? latency_s : 0;
    m->bytes_per_s = valid ? bytes_per_s : 0;
    pthread_mutex_unlock(&xs->lock);
}

/* ---------------------------------------------------------------------------------------------
 * Calibration: every pair that involves a device
 * ------------------------------------------------------------------------------------------- */
static int gpuarr__xfer_add(gpuarr__xfer_pair *out, int n, int src, int dst, gpuarr__xfer_mem mem, int cast) {
    out[n].src = src, out[n].dst = dst, out[n].mem = mem, out[n].cast = cast;
    return n + 1;
}

/* host <-> e, both ways, pageable and pinned, cast and not (a unified e too: a copy there copies). */
static int gpuarr__xfer_add_host_pairs(gpuarr__xfer_pair *out, int n, int e) {
    for (int cast = 0; cast < 2; cast++) {
        n = gpuarr__xfer_add(out, n, 0, e, GPUARR__XFER_PAGEABLE, cast);
        n = gpuarr__xfer_add(out, n, 0, e, GPUARR__XFER_PINNED, cast);
        n = gpuarr__xfer_add(out, n, e, 0, GPUARR__XFER_DEVICE, cast);
    }
    return n;
}

static bool gpuarr__xfer_usable(int i) {
    gpuarr__dev *d = &gpuarr__g.devices[i];
    return __atomic_load_n(&d->failed, __ATOMIC_ACQUIRE) == 0;
}

/* Every pair gpuarr_calibrate(d) fits; out holds 6 * devices + 2. */
static int gpuarr__xfer_pairs_of(int d, gpuarr__xfer_pair *out) {
    int n = 0, count = gpuarr__g.device_count;
    if (d == 0) {
        n = gpuarr__xfer_add(out, n, 0, 0, GPUARR__XFER_PAGEABLE, 1);
        for (int e = 1; e < count; e++)
            if (gpuarr__xfer_usable(e)) n = gpuarr__xfer_add_host_pairs(out, n, e);
        return n;
    }
    n = gpuarr__xfer_add_host_pairs(out, n, d);
    n = gpuarr__xfer_add(out, n, d, d, GPUARR__XFER_DEVICE, 1);
    for (int e = 1; e < count; e++) {
        if (e == d || !gpuarr__xfer_usable(e)) continue;
        for (int cast = 0; cast < 2; cast++) {
            n = gpuarr__xfer_add(out, n, d, e, GPUARR__XFER_DEVICE, cast);
            n = gpuarr__xfer_add(out, n, e, d, GPUARR__XFER_DEVICE, cast);
        }
    }
    return n;
}

/* ---------------------------------------------------------------------------------------------
 * Public calls
 * ------------------------------------------------------------------------------------------- */
GPUARR_API gpuarr_result gpuarr_transfer_estimate_array(gpuarr_array src, gpuarr_device dst, gpuarr_dtype t, uint64_t bytes,
                                                        double *seconds) {
    GPUARR__BEGIN();
    GPUARR__REQUIRE_PTR(seconds);
    if ((int)t < 0 || (int)t >= GPUARR_DTYPE_COUNT)
        return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "t = %d is not a dtype (0 = src's)", (int)t);
    gpuarr__array *a;
    gpuarr__dev *d;
    GPUARR__CHECK(gpuarr__get_dev(dst, "dst", &d));
    GPUARR__CHECK(gpuarr__get_array(src, "src", &a)); /* a reference, dropped below */
    gpuarr__dev *from = a->dev, *pinned_for = a->pinned_for;
    gpuarr_dtype st = a->dtype;
    uint64_t nbytes = (uint64_t)a->nbytes;
    gpuarr__obj_release(&a->obj);
    if (bytes > nbytes)
        return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "bytes = %llu is more than src's %llu bytes", (unsigned long long)bytes,
                            (unsigned long long)nbytes);
    gpuarr__xfer_mem mem = from != gpuarr__host_dev() ? GPUARR__XFER_DEVICE
                           : pinned_for == d         ? GPUARR__XFER_PINNED
                                                     : GPUARR__XFER_PAGEABLE;
    uint64_t n = bytes ? bytes : nbytes;
    double s;
    bool modeled;
    GPUARR__CHECK(gpuarr__transfer_predict(from, mem, d, st, t ? t : st, n, &s, &modeled));
    *seconds = s;
    return GPUARR_OK;
}

GPUARR_API gpuarr_result gpuarr_transfer_estimate_device(gpuarr_device src, gpuarr_device dst, gpuarr_dtype t, uint64_t bytes,
                                                         double *seconds) {
    GPUARR__BEGIN();
    GPUARR__REQUIRE_PTR(seconds);
    if ((int)t <= 0 || (int)t >= GPUARR_DTYPE_COUNT)
        return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "t = %d is not a dtype", (int)t);
    gpuarr__dev *s_dev, *d_dev;
    GPUARR__CHECK(gpuarr__get_dev(src, "src", &s_dev));
    GPUARR__CHECK(gpuarr__get_dev(dst, "dst", &d_dev));
    gpuarr__xfer_mem mem = s_dev == gpuarr__host_dev() ? GPUARR__XFER_PAGEABLE : GPUARR__XFER_DEVICE;
    double s;
    bool modeled;
    GPUARR__CHECK(gpuarr__transfer_predict(s_dev, mem, d_dev, t, t, bytes, &s, &modeled));
    *seconds = s;
    return GPUARR_OK;
}

GPUARR_API gpuarr_result gpuarr_calibrate(gpuarr_device d) {
    GPUARR__BEGIN();
    gpuarr__dev *dev;
    GPUARR__CHECK(gpuarr__get_dev(d, "d", &dev));
    gpuarr__xfer_pair *pairs = (gpuarr__xfer_pair *)gpuarr__malloc(sizeof *pairs * (size_t)(6 * gpuarr__g.device_count + 2));
    if (!pairs) return gpuarr__fail(GPUARR_ERROR_OUT_OF_MEMORY, "no host memory for the list of pairs");
    int n = gpuarr__xfer_pairs_of(gpuarr__xfer_index(dev), pairs);
    gpuarr_result r = GPUARR_OK;
    char why[512] = "";
    int i = 0;
    for (; i < n && r == GPUARR_OK; i++) r = gpuarr__xfer_refit(&pairs[i], true, why, sizeof why);
    if (r != GPUARR_OK) {
        char name[128];
        gpuarr__xfer_pair_name(&pairs[i - 1], name, sizeof name);
        r = gpuarr__fail(r, "fitting %s: %s", name, why);
    }
    gpuarr__free(pairs);
    return r;
}

GPUARR_API gpuarr_result gpuarr_transfer_models_summary(char *buf, size_t len) {
    GPUARR__BEGIN();
    GPUARR__REQUIRE_PTR(buf);
    if (!len) return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "len is 0");
    gpuarr__xfer_state *xs = gpuarr__xfer_st();
    buf[0] = '\0';
    pthread_mutex_lock(&xs->lock);
    for (int s = 0; s < xs->n; s++)
        for (int d = 0; d < xs->n; d++) {
            gpuarr__xfer_load(s, d);
            for (int mem = 0; mem < GPUARR__XFER_MEM_COUNT; mem++)
                for (int cast = 0; cast < 2; cast++) {
                    const gpuarr__xfer_model *m = gpuarr__xfer_at(s, d, (gpuarr__xfer_mem)mem, cast);
                    if (m->state != GPUARR__XFER_READY) continue;
                    gpuarr__append_line(buf, len, "%s -> %s %s %s: latency %.1f us, %.3f GB/s (%s)\n", gpuarr__g.devices[s].info.spec,
                                        gpuarr__g.devices[d].info.spec, gpuarr__xfer_mem_names[mem], cast ? "cast" : "copy",
                                        m->latency_s * 1e6, m->bytes_per_s * 1e-9, gpuarr__xfer_origin_names[m->origin]);
                }
        }
    pthread_mutex_unlock(&xs->lock);
    return GPUARR_OK;
}

static void gpuarr__xfer_layer(gpuarr__layer *l) {
    l->name = "transfer models";
    l->start = gpuarr__xfer_start;
    l->stop = gpuarr__xfer_stop;
}

#endif /* GPUARR_TRANSFER_MODEL_INCLUDED */
