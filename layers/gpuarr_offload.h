/*
 * gpuarr_offload.h -- tasks, their per-device models, gpuarr_offload and gpuarr_map (the
 * manual's OFFLOAD section), a layer on the core: included by the implementation of gpuarr.h after
 * the leases and the transfer model, whose calls it uses, and the core's internals; registers in
 * gpuarr__layer_list.
 *
 * A model belongs to a (task name, device) pair, not to a task handle: a program that makes the
 * same task again, or runs again, finds what was measured (in the cache folder). It is per device
 * view, not per physical device: a GPU seen through CUDA and OpenCL runs two different
 * implementations, whose times have nothing to do with each other.
 *
 * One lock guards everything here (tasks, models, statistics, queued work). It is held only for
 * bookkeeping and for writing a model's small file, never while an implementation, a transfer or
 * a lease wait runs, and it is taken before the lease lock, never after.
 */
#ifndef GPUARR_OFFLOAD_INCLUDED
#define GPUARR_OFFLOAD_INCLUDED

#include <dirent.h>

#define GPUARR__TASK_NAME_MAX 63
#define GPUARR__TASK_MAX_RECS 65535u  /* index + 1 fits the id's low 16 bits */
#define GPUARR__MODEL_WINDOW 32       /* recent samples a model keeps */
#define GPUARR__MODEL_FILE_MAX (1024 + GPUARR__MODEL_WINDOW * 64) /* bytes: a larger model file is refused unread */
#define GPUARR__MODEL_TRUSTED 5       /* samples before outliers are refused */
#define GPUARR__MODEL_OUTLIER 3.0     /* a sample outside prediction x3 or /3 is an outlier */
#define GPUARR__MODEL_SHIFT 4         /* outliers in a row on one side: the device changed, start over */
#define GPUARR__MODEL_KNOWN 2         /* samples that make a device measured (no more exploration) */
#define GPUARR__EXPLORE_MAX (GPUARR__MODEL_KNOWN + 1) /* exploration runs per (task, device) and process:
                                                    a warm-up, then the samples that make it measured */
#define GPUARR__EXPLORE_RANGE 10.0    /* explore only where the estimate is within 10x of the best */
#define GPUARR__SIZE_RANGE 4.0        /* a size 4x beyond the sizes a model measured is a new size: explored, not judged */
#define GPUARR__SIZE_EXPLORE_MAX 2    /* explorations of a new size per (task, device, size octave) and process:
                                         a warm-up, then a sample */
#define GPUARR__OCTAVES 64            /* size octaves counted (larger sizes share the last) */
#define GPUARR__TWIN_RANGE 3.0        /* a model 3x slower than its twins' is not trusted */
#define GPUARR__DECLINE_RANGE 4.0     /* gpuarr_map: a device 4x slower than the best leaves it the items */
#define GPUARR__OFFLOAD_RULE_BYTES ((uint64_t)1 << 20) /* the 1 MiB rule */
#define GPUARR__MAP_MAX_STREAMS 16

/* A model over a window of recent samples: the median time per size octave (bn, bt: sorted by
   size), interpolated between them; a + b * n is the robust line through them, whose slope b
   carries the model beyond the largest size measured. And what this process saw of it. */
typedef struct gpuarr__tmodel {
    struct gpuarr__tmodel *next;
    char task[GPUARR__TASK_NAME_MAX + 1];
    int dev;                      /* registry index */
    double n[GPUARR__MODEL_WINDOW], t[GPUARR__MODEL_WINDOW]; /* a ring */
    int count, head;
    double bn[GPUARR__MODEL_WINDOW], bt[GPUARR__MODEL_WINDOW]; /* bucket medians, by size */
    int buckets;
    double lo, hi;                /* the smallest and largest size among the samples */
    double shift_n[GPUARR__MODEL_SHIFT], shift_t[GPUARR__MODEL_SHIFT]; /* the outliers in a row */
    int shift_count, shift_side;
    uint64_t rejected;
    double a, b;
    bool dirty;                   /* samples the file lacks */
    bool warmed;                  /* a run of this process finished there: later runs are no warm-up */
    double saved_ms;
    uint64_t calls, explorations, changed;
    int unmeasured_explorations;  /* of them, while the device was not measured (GPUARR__EXPLORE_MAX) */
    unsigned char size_explorations[GPUARR__OCTAVES]; /* of them, of a new size, per octave (GPUARR__SIZE_EXPLORE_MAX) */
    double predicted_s, measured_s;
} gpuarr__tmodel;

typedef struct gpuarr__task_rec {
    gpuarr_task_desc desc;        /* desc.name points at name, desc.kernel_scalars[i] (set) at scalars[i] */
    char name[GPUARR__TASK_NAME_MAX + 1];
    uint64_t scalars[GPUARR_KERNEL_MAX_PARAMS]; /* a kernel's scalars, copied (8 bytes hold any of its types) */
    uint32_t refs;                /* the handle's, and one per call running it (lock held) */
    double out_bytes_per_size;    /* output bytes per unit of size, from the last run; < 0 = unknown */
} gpuarr__task_rec;

typedef struct gpuarr__task_slot {
    uint16_t gen;                 /* the id's high 16 bits; moves on at each destroy */
    gpuarr__task_rec *rec;        /* NULL = free */
} gpuarr__task_slot;

typedef struct gpuarr__offload_state {
    pthread_mutex_t lock;
    gpuarr__task_slot *slots;
    uint32_t count, cap;
    gpuarr__tmodel *models;
    double *queued_s;             /* by registry index: predicted seconds of work running or waiting there */
    char host[64];                /* host name, part of a model's key */
    bool scanned;                 /* the cache folder's models were read (gpuarr_task_models_summary) */
} gpuarr__offload_state;
static void gpuarr__offload_layer(gpuarr__layer *l);
/* The layer's state (gpuarr__layer_state): NULL outside its start and stop. */
static gpuarr__offload_state *gpuarr__offload_st(void) { return (gpuarr__offload_state *)gpuarr__layer_state(gpuarr__offload_layer); }

/* ---------------------------------------------------------------------------------------------
 * GPUARR_OFFLOAD, start and stop
 * ------------------------------------------------------------------------------------------- */
static gpuarr_result gpuarr__check_offload(const char *name, const char *value, int *out) {
    static const char *const words[] = {"auto", "host", "gpu"};
    static const int values[] = {GPUARR_OFFLOAD_AUTO, GPUARR_OFFLOAD_HOST, GPUARR_OFFLOAD_GPU};
    return gpuarr__check_keyword(name, value, words, values, 3, "auto, host or gpu", out);
}

static gpuarr_result gpuarr__offload_start(void) {
    gpuarr__offload_state *os = (gpuarr__offload_state *)gpuarr__calloc(sizeof *os);
    double *queued = (double *)gpuarr__calloc(sizeof(double) * (size_t)gpuarr__g.device_count);
    if (!os || !queued) {
        gpuarr__free(os);
        gpuarr__free(queued);
        return gpuarr__fail(GPUARR_ERROR_OUT_OF_MEMORY, "no host memory for the offload state");
    }
    pthread_mutex_init(&os->lock, NULL);
    os->queued_s = queued;
    if (gethostname(os->host, sizeof os->host - 1) != 0) gpuarr__copy_string(os->host, sizeof os->host, "localhost");
    os->host[sizeof os->host - 1] = '\0';
    gpuarr__layer_state_set(gpuarr__offload_layer, os);
    return GPUARR_OK;
}

static void gpuarr__model_save(gpuarr__tmodel *m);

static void gpuarr__offload_stop(void) {
    gpuarr__offload_state *os = gpuarr__offload_st();
    if (!os) return;
    uint32_t live = 0;
    for (uint32_t i = 0; i < os->count; i++) {
        gpuarr__task_rec *rec = os->slots[i].rec;
        if (rec) live++, gpuarr__free(rec);
    }
    if (live) gpuarr__log(GPUARR_LOG_WARN, "gpuarr_shutdown dropped %u tasks that were never destroyed", live);
    for (gpuarr__tmodel *m = os->models, *next; m; m = next) {
        next = m->next;
        if (m->dirty) gpuarr__model_save(m);
        gpuarr__free(m);
    }
    pthread_mutex_destroy(&os->lock);
    gpuarr__free(os->slots);
    gpuarr__free(os->queued_s);
    gpuarr__free(os);
    gpuarr__layer_state_set(gpuarr__offload_layer, NULL);
}

/* ---------------------------------------------------------------------------------------------
 * The fit: medians per size bucket, then Theil-Sen through them. A bucket is a power of two of
 * n, so a burst of samples at one size counts as one point and a few slow runs (a cold cache, a
 * clock ramping up) move its median little; Theil-Sen's slope is the median of the slopes between
 * buckets, which an odd bad bucket does not swing either.
 * ------------------------------------------------------------------------------------------- */
static int gpuarr__cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The median of v[0..count) (reorders v). */
static double gpuarr__median(double *v, int count) {
    qsort(v, (size_t)count, sizeof *v, gpuarr__cmp_double);
    return count % 2 ? v[count / 2] : 0.5 * (v[count / 2 - 1] + v[count / 2]);
}

static int gpuarr__size_bucket(double n) { /* floor(log2(n + 1)), without libm */
    int e = 0;
    for (double x = n + 1.0; x >= 2.0 && e < 1100; x *= 0.5) e++;
    return e;
}

/* Fits t = a + b * n to count samples (a, b >= 0), and gives the bucket medians (bn, bt,
   *buckets of them, sorted by size). One bucket only: t proportional to n (b = t / n), the
   likelier shape for a kernel over n elements than a constant. */
static void gpuarr__fit(const double *n, const double *t, int count, double *a, double *b, double *bn, double *bt, int *nbuckets) {
    double vn[GPUARR__MODEL_WINDOW], vt[GPUARR__MODEL_WINDOW];
    double slopes[GPUARR__MODEL_WINDOW * GPUARR__MODEL_WINDOW / 2];
    bool used[GPUARR__MODEL_WINDOW] = {false};
    int buckets = 0;
    for (int i = 0; i < count; i++) {
        if (used[i]) continue;
        int k = 0, bucket = gpuarr__size_bucket(n[i]);
        for (int j = i; j < count; j++)
            if (!used[j] && gpuarr__size_bucket(n[j]) == bucket) used[j] = true, vn[k] = n[j], vt[k] = t[j], k++;
        bn[buckets] = gpuarr__median(vn, k);
        bt[buckets] = gpuarr__median(vt, k);
        for (int j = buckets++; j > 0 && bn[j - 1] > bn[j]; j--) { /* insertion: by size */
            double sn = bn[j], st = bt[j];
            bn[j] = bn[j - 1], bt[j] = bt[j - 1], bn[j - 1] = sn, bt[j - 1] = st;
        }
    }
    *nbuckets = buckets;
    *a = 0, *b = 0;
    if (buckets == 0) return;
    if (buckets == 1) {
        if (bn[0] > 0) *b = bt[0] / bn[0];
        else *a = bt[0];
        return;
    }
    int ns = 0;
    for (int i = 0; i < buckets; i++)
        for (int j = i + 1; j < buckets; j++) slopes[ns++] = (bt[j] - bt[i]) / (bn[j] - bn[i]);
    *b = gpuarr__median(slopes, ns);
    if (*b < 0) *b = 0;
    for (int i = 0; i < buckets; i++) vt[i] = bt[i] - *b * bn[i];
    *a = gpuarr__median(vt, buckets);
    if (*a < 0) *a = 0;
}

/* The predicted time at size n, piecewise: between two bucket medians on the line joining them;
   beyond the largest, its median plus the robust slope; below the smallest, its median (a call
   smaller than any measured costs at least what the smallest did: the fixed cost, which a line
   fitted over a wide range of sizes would lose). */
static double gpuarr__model_predict(const gpuarr__tmodel *m, double n) {
    int last = m->buckets - 1;
    if (last < 0) return 0;
    if (n <= m->bn[0]) return m->bt[0];
    if (n >= m->bn[last]) return m->bt[last] + m->b * (n - m->bn[last]);
    int i = 1;
    while (m->bn[i] < n) i++;
    double f = (n - m->bn[i - 1]) / (m->bn[i] - m->bn[i - 1]);
    return m->bt[i - 1] + f * (m->bt[i] - m->bt[i - 1]);
}

static void gpuarr__model_refit(gpuarr__tmodel *m) {
    gpuarr__fit(m->n, m->t, m->count, &m->a, &m->b, m->bn, m->bt, &m->buckets);
    m->lo = m->hi = m->count ? m->n[0] : 0;
    for (int i = 1; i < m->count; i++) {
        if (m->n[i] < m->lo) m->lo = m->n[i];
        if (m->n[i] > m->hi) m->hi = m->n[i];
    }
}

/* Whether size n is a new size for m: more than 4x beyond the sizes it measured. */
static bool gpuarr__model_new_size(const gpuarr__tmodel *m, double n) {
    return m->count > 0 && (n > GPUARR__SIZE_RANGE * m->hi || n * GPUARR__SIZE_RANGE < m->lo);
}

static void gpuarr__model_push(gpuarr__tmodel *m, double n, double t) {
    m->n[m->head] = n;
    m->t[m->head] = t;
    m->head = (m->head + 1) % GPUARR__MODEL_WINDOW;
    if (m->count < GPUARR__MODEL_WINDOW) m->count++;
}

/* Adds a measurement (lock held): false when refused as an outlier. GPUARR__MODEL_SHIFT outliers
   in a row on the same side mean the device itself changed (another load, a clock cap): the
   window starts over from them, so a model cannot stay wrong forever. A new size is not judged:
   an extrapolation is no measure of what is normal there. */
static bool gpuarr__model_add(gpuarr__tmodel *m, double n, double t) {
    if (m->count >= GPUARR__MODEL_TRUSTED && !gpuarr__model_new_size(m, n)) {
        double p = gpuarr__model_predict(m, n);
        if (p > 0 && (t > GPUARR__MODEL_OUTLIER * p || t < p / GPUARR__MODEL_OUTLIER)) {
            int side = t > p ? 1 : -1;
            if (side != m->shift_side) m->shift_count = 0, m->shift_side = side;
            m->shift_n[m->shift_count] = n;
            m->shift_t[m->shift_count] = t;
            m->rejected++;
            if (++m->shift_count < GPUARR__MODEL_SHIFT) return false;
            m->count = m->head = 0;
            for (int i = 0; i < GPUARR__MODEL_SHIFT; i++) gpuarr__model_push(m, m->shift_n[i], m->shift_t[i]);
            m->shift_count = 0;
            gpuarr__model_refit(m);
            m->dirty = true;
            return true;
        }
    }
    m->shift_count = 0;
    gpuarr__model_push(m, n, t);
    gpuarr__model_refit(m);
    m->dirty = true;
    return true;
}

/* ---------------------------------------------------------------------------------------------
 * Persistence: a text file per (task, device) in the cache folder, "task-<name>-<hash>.model",
 * hash of the key: host name, backend, the device's UUID (else PCI address, else spec), its name
 * and driver version. A key that differs (another driver) is another file, so a changed device
 * starts from nothing instead of from times that no longer hold.
 * ------------------------------------------------------------------------------------------- */
static void gpuarr__model_key(int dev, char *out, size_t cap) {
    const gpuarr_device_info *in = &gpuarr__g.devices[dev].info;
    char id[GPUARR__LEASE_KEY_MAX + 1];
    gpuarr__lease_key(in, id, sizeof id);
    snprintf(out, cap, "host=%s backend=%s device=%s name=%s driver=%s", gpuarr__offload_st()->host, gpuarr__backend_names[in->backend], id,
             in->name, in->version);
}

/* The model file's name in the cache folder. */
static void gpuarr__model_file(const char *task, int dev, char *out, size_t cap) {
    char key[640];
    gpuarr__model_key(dev, key, sizeof key);
    const char *pieces[2] = {task, key};
    snprintf(out, cap, "task-%s-%016llx.model", task, (unsigned long long)gpuarr__hash_pieces(GPUARR__HASH_SEED, pieces, 2));
}

static void gpuarr__model_save(gpuarr__tmodel *m) {
    char file[128], key[640], why[160];
    m->saved_ms = gpuarr__now_ms();
    int dir = gpuarr__cache_dir_open(); /* made with its parents: a model is worth keeping where no kernel was ever cached */
    if (dir < 0) return;
    gpuarr__model_file(m->task, m->dev, file, sizeof file);
    gpuarr__model_key(m->dev, key, sizeof key);
    size_t cap = GPUARR__MODEL_FILE_MAX;
    char *text = (char *)gpuarr__malloc(cap);
    int len = text ? snprintf(text, cap, "gpuarr task model 1\ntask %s\nkey %s\nrejected %llu\nsamples %d\n", m->task, key,
                              (unsigned long long)m->rejected, m->count)
                   : -1;
    for (int i = 0; i < m->count && len > 0 && (size_t)len < cap; i++) {
        int k = (m->head - m->count + i + 2 * GPUARR__MODEL_WINDOW) % GPUARR__MODEL_WINDOW; /* oldest first */
        len += snprintf(text + len, cap - (size_t)len, "%.17g %.17g\n", m->n[k], m->t[k]);
    }
    if (len > 0 && (size_t)len < cap) len += snprintf(text + len, cap - (size_t)len, "end\n");
    if (len > 0 && (size_t)len < cap) {
        if (gpuarr__file_write_at(dir, file, NULL, 0, text, (size_t)len, why, sizeof why)) m->dirty = false;
        else gpuarr__log(GPUARR_LOG_INFO, "the task model file %s/%s %s", gpuarr__g.config.cache_dir, file, why);
    }
    gpuarr__free(text);
    close(dir);
}

/* The next line of *p (cut at '\n'), or NULL at the end. */
static char *gpuarr__next_line(char **p) {
    char *line = *p;
    if (!line || !*line) return NULL;
    char *nl = strchr(line, '\n');
    if (nl) *nl = '\0', *p = nl + 1;
    else *p = line + strlen(line);
    return line;
}

/* Parses a model file's text into m: NULL when good, else what is wrong (*other_key: a good
   file of another device or driver, to be replaced without a word). */
static const char *gpuarr__model_parse(gpuarr__tmodel *m, char *text, const char *key, bool *other_key) {
    char *p = text, *line;
    *other_key = false;
    if (!(line = gpuarr__next_line(&p)) || strcmp(line, "gpuarr task model 1") != 0) return "not a gpuarr task model (version 1)";
    if (!(line = gpuarr__next_line(&p)) || strncmp(line, "task ", 5) != 0 || strcmp(line + 5, m->task) != 0) return "bad task line";
    if (!(line = gpuarr__next_line(&p)) || strncmp(line, "key ", 4) != 0) return "bad key line";
    if (strcmp(line + 4, key) != 0) {
        *other_key = true;
        return "another device's key";
    }
    unsigned long long rejected;
    int count;
    char extra;
    if (!(line = gpuarr__next_line(&p)) || sscanf(line, "rejected %llu%c", &rejected, &extra) != 1) return "bad rejected line";
    if (!(line = gpuarr__next_line(&p)) || sscanf(line, "samples %d%c", &count, &extra) != 1 || count < 0 ||
        count > GPUARR__MODEL_WINDOW)
        return "bad samples line";
    double n[GPUARR__MODEL_WINDOW], t[GPUARR__MODEL_WINDOW];
    for (int i = 0; i < count; i++)
        if (!(line = gpuarr__next_line(&p)) || sscanf(line, "%lf %lf%c", &n[i], &t[i], &extra) != 2 || !(n[i] >= 0 && n[i] <= 1e300) ||
            !(t[i] >= 0 && t[i] <= 1e300))
            return "bad sample line";
    if (!(line = gpuarr__next_line(&p)) || strcmp(line, "end") != 0) return "truncated (no end line)";
    for (int i = 0; i < count; i++) gpuarr__model_push(m, n[i], t[i]);
    m->rejected = rejected;
    gpuarr__model_refit(m);
    return NULL;
}

/* Reads m's file if there is one (lock held). A corrupted file is ignored with a warning and
   rewritten at the next save (dirty). */
static void gpuarr__model_load(gpuarr__tmodel *m) {
    char file[128], key[640], why[160];
    int dir = gpuarr__cache_dir_open();
    if (dir < 0) return;
    gpuarr__model_file(m->task, m->dev, file, sizeof file);
    size_t size;
    char *text = (char *)gpuarr__file_read_at(dir, file, GPUARR__MODEL_FILE_MAX, &size, why, sizeof why);
    close(dir);
    if (!text && !why[0]) return; /* none yet */
    bool other = false;
    const char *bad = !text ? why : strlen(text) != size ? "contains a NUL byte" : NULL;
    if (!bad) {
        gpuarr__model_key(m->dev, key, sizeof key);
        bad = gpuarr__model_parse(m, text, key, &other);
    }
    if (bad) {
        m->count = m->head = 0;
        m->rejected = 0;
        m->dirty = true;
        if (!other)
            gpuarr__log(GPUARR_LOG_WARN, "ignoring the %s task model file %s/%s (%s); it will be rebuilt", text ? "corrupted" : "refused",
                        gpuarr__g.config.cache_dir, file, bad);
    }
    gpuarr__free(text);
}

/* The model of (task, dev), made and loaded from its file the first time (lock held); NULL when
   out of memory. */
static gpuarr__tmodel *gpuarr__model_get(const char *task, int dev) {
    gpuarr__offload_state *os = gpuarr__offload_st();
    for (gpuarr__tmodel *m = os->models; m; m = m->next)
        if (m->dev == dev && strcmp(m->task, task) == 0) return m;
    gpuarr__tmodel *m = (gpuarr__tmodel *)gpuarr__calloc(sizeof *m);
    if (!m) return NULL;
    gpuarr__copy_string(m->task, sizeof m->task, task);
    m->dev = dev;
    gpuarr__model_load(m);
    m->next = os->models;
    os->models = m;
    return m;
}

/* Adds a run's time, and saves: at once while the model is young (what a short program measured
   is not lost), then at most once a second, and at shutdown (lock held). The first run of the
   task on the device in this process is a warm-up: it may include one-off work (PoCL building the
   kernel, first touches of memory), up to 100x the steady time. While the model is young (fewer
   than GPUARR__MODEL_TRUSTED samples, before the outlier rule guards it) that time is not added:
   a young model has nothing to judge it against, and one inflated sample made the device look so
   slow that it was never run again to correct it. A trusted model judges the warm-up like any run.
   Every run that started before the first one finished is a warm-up too (gpuarr_map's streams
   start together, and share the one-off work): warmup is gpuarr__model_warmup's answer at the
   run's start. Returns whether the time was added. */
static bool gpuarr__model_warmup(const gpuarr__tmodel *m) { return !m->warmed; } /* at a run's start */

static bool gpuarr__model_measured(gpuarr__tmodel *m, double n, double t, bool warmup) {
    m->warmed = true;
    if (warmup && m->count < GPUARR__MODEL_TRUSTED) return false;
    if (!gpuarr__model_add(m, n, t)) return false;
    if (m->count <= GPUARR__MODEL_TRUSTED || gpuarr__now_ms() - m->saved_ms > 1000.0) gpuarr__model_save(m);
    return true;
}

/* ---------------------------------------------------------------------------------------------
 * Task handles: (generation << 16) | (slot index + 1)
 * ------------------------------------------------------------------------------------------- */
static bool gpuarr__task_name_ok(const char *s) {
    size_t n = strlen(s);
    if (n < 1 || n > GPUARR__TASK_NAME_MAX) return false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '.' || c == '-'))
            return false;
    }
    return true;
}

/* A kernel task's desc (rec's copy): checked against the kernel, its defaults filled in (name,
   n_in, n_out, in_dtype) and its scalars copied into rec. */
static gpuarr_result gpuarr__task_kernel_desc(gpuarr_task_desc *d, gpuarr__task_rec *rec) {
    const gpuarr_kernel *k = d->kernel;
    if (gpuarr__kernel_check(k) != GPUARR_OK) {
        char why[sizeof gpuarr__tls.error_detail];
        gpuarr__copy_string(why, sizeof why, gpuarr__tls.error_detail);
        return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "desc->kernel: %.900s", why);
    }
    for (int b = 0; b < GPUARR_TASK_MAX_BACKENDS; b++)
        if (d->impl[b])
            return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "desc->impl[%d] and desc->kernel are both set: a task has implementations "
                                "or a kernel", b);
    int counts[GPUARR_PARAM_INOUT + 1] = {0};
    for (int i = 0; i < GPUARR_KERNEL_MAX_PARAMS; i++) {
        const gpuarr_kernel_param *p = i < k->nparams ? &k->params[i] : NULL;
        if (p && p->kind == GPUARR_PARAM_INOUT)
            return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "desc->kernel %s: parameter %s is INOUT, but a task never writes its "
                                "inputs (an IN and an OUT parameter instead)", k->name, p->name);
        if (p && p->kind == GPUARR_PARAM_SCALAR && !d->kernel_scalars[i])
            return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "desc->kernel_scalars[%d] is NULL, but kernel %s's parameter %s is a "
                                "SCALAR (%s): its value's address", i, k->name, p->name, p->type);
        if ((!p || p->kind != GPUARR_PARAM_SCALAR) && d->kernel_scalars[i])
            return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "desc->kernel_scalars[%d] is set, but %s%s%s: must be NULL", i,
                                p ? "parameter " : "the kernel has fewer parameters", p ? p->name : "", p ? " is an array" : "");
        if (!p) continue;
        if (p->kind == GPUARR_PARAM_SCALAR) {
            memcpy(&rec->scalars[i], d->kernel_scalars[i], gpuarr__dtype_sizes[p->dtype]);
            d->kernel_scalars[i] = &rec->scalars[i];
        } else if (p->kind == GPUARR_PARAM_IN && counts[p->kind] < GPUARR_TASK_MAX_ARRAYS) {
            gpuarr_dtype *t = &d->in_dtype[counts[p->kind]];
            if (*t && *t != p->dtype)
                return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "desc->in_dtype[%d] = %d, but kernel %s's IN parameter %s is %s (0 = "
                                    "the parameter's)", counts[p->kind], (int)*t, k->name, p->name, gpuarr__dtype_names[p->dtype]);
            *t = p->dtype;
        }
        counts[p->kind]++;
    }
    static const char *const what[] = {"", "", "IN", "OUT"};
    for (int kind = GPUARR_PARAM_IN; kind <= GPUARR_PARAM_OUT; kind++) {
        int *n = kind == GPUARR_PARAM_IN ? &d->n_in : &d->n_out;
        if (counts[kind] < 1 || counts[kind] > GPUARR_TASK_MAX_ARRAYS)
            return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "desc->kernel %s has %d %s parameters: a task's kernel needs 1..%d "
                                "(outputs are made like the first input)", k->name, counts[kind], what[kind], GPUARR_TASK_MAX_ARRAYS);
        if (*n && *n != counts[kind])
            return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "desc->%s = %d, but kernel %s has %d %s parameters (0 = the kernel's)",
                                kind == GPUARR_PARAM_IN ? "n_in" : "n_out", *n, k->name, counts[kind], what[kind]);
        *n = counts[kind];
    }
    if (!d->name) d->name = k->name;
    return GPUARR_OK;
}

static gpuarr_result gpuarr__task_check_desc(const gpuarr_task_desc *d) {
    if (!d->name) return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "desc->name is NULL");
    if (!gpuarr__task_name_ok(d->name))
        return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "desc->name = \"%.80s\": 1 to %d characters of A-Z a-z 0-9 _ . - (it names files)",
                            d->name, GPUARR__TASK_NAME_MAX);
    if (d->n_in < 1 || d->n_in > GPUARR_TASK_MAX_ARRAYS)
        return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "desc->n_in = %d: must be 1..%d", d->n_in, GPUARR_TASK_MAX_ARRAYS);
    if (d->n_out < 1 || d->n_out > GPUARR_TASK_MAX_ARRAYS)
        return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "desc->n_out = %d: must be 1..%d", d->n_out, GPUARR_TASK_MAX_ARRAYS);
    for (int i = 0; i < GPUARR_TASK_MAX_ARRAYS; i++)
        if (d->in_dtype[i] && (!gpuarr__dtype_valid(d->in_dtype[i]) || i >= d->n_in))
            return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "desc->in_dtype[%d] = %d: %s", i, (int)d->in_dtype[i],
                                i >= d->n_in ? "past n_in (must be 0)" : "not a gpuarr_dtype (0 = as given)");
    if (d->impl[GPUARR_BACKEND_INVALID])
        return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "desc->impl[0] is set: index by backend (impl[GPUARR_BACKEND_HOST], ...)");
    for (int b = GPUARR_BACKEND_COUNT; b < GPUARR_TASK_MAX_BACKENDS; b++)
        if (d->impl[b]) return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "desc->impl[%d] is set: no backend has that number", b);
    for (int b = 1; b < GPUARR_BACKEND_COUNT; b++)
        if (d->impl[b]) return GPUARR_OK;
    if (d->kernel) return GPUARR_OK; /* checked by gpuarr__task_kernel_desc */
    return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "desc->impl: no implementation for any backend (set at least one, or desc->kernel)");
}

static gpuarr_task gpuarr__task_handle(uint32_t index) {
    gpuarr_task t;
    t.id = (uint32_t)gpuarr__offload_st()->slots[index].gen << 16 | (index + 1u);
    return t;
}

/* The live record of t (lock held). */
static gpuarr_result gpuarr__task_get(gpuarr_task t, const char *arg, gpuarr__task_rec **out) {
    gpuarr__offload_state *os = gpuarr__offload_st();
    uint32_t index = (t.id & 0xffffu) - 1u;
    uint16_t gen = (uint16_t)(t.id >> 16);
    if (t.id == 0) return gpuarr__fail(GPUARR_ERROR_INVALID_HANDLE, "%s is a zero task handle", arg);
    if ((t.id & 0xffffu) == 0 || index >= os->count)
        return gpuarr__fail(GPUARR_ERROR_INVALID_HANDLE, "%s (id 0x%08x) is not a task of this gpuarr_init (stale or forged)", arg, t.id);
    gpuarr__task_slot *s = &os->slots[index];
    if (s->rec && s->gen == gen) {
        *out = s->rec;
        return GPUARR_OK;
    }
    if ((uint16_t)(s->gen - 1u) == gen)
        return gpuarr__fail(GPUARR_ERROR_INVALID_HANDLE, "%s (id 0x%08x) was destroyed already", arg, t.id);
    return gpuarr__fail(GPUARR_ERROR_INVALID_HANDLE, "%s (id 0x%08x) is not a live task (stale or forged)", arg, t.id);
}

/* A free slot's index (lock held), or UINT32_MAX. */
static uint32_t gpuarr__task_new_slot(void) {
    gpuarr__offload_state *os = gpuarr__offload_st();
    for (uint32_t i = 0; i < os->count; i++)
        if (!os->slots[i].rec) return i;
    if (os->count == os->cap) {
        if (os->cap >= GPUARR__TASK_MAX_RECS) return UINT32_MAX;
        uint32_t cap = os->cap ? os->cap * 2u : 16u;
        if (cap > GPUARR__TASK_MAX_RECS) cap = GPUARR__TASK_MAX_RECS;
        gpuarr__task_slot *slots = (gpuarr__task_slot *)gpuarr__calloc(sizeof *slots * cap);
        if (!slots) return UINT32_MAX;
        if (os->slots) memcpy(slots, os->slots, sizeof *slots * os->count);
        gpuarr__free(os->slots);
        os->slots = slots;
        os->cap = cap;
    }
    /* a new slot's generation comes from the init cycle: a handle from an earlier one is stale */
    os->slots[os->count].gen = (uint16_t)(gpuarr__g.epoch * 40503u + 7u);
    return os->count++;
}

static void gpuarr__task_unref(gpuarr__task_rec *rec) { /* lock held */
    if (--rec->refs == 0) gpuarr__free(rec);
}

GPUARR_API gpuarr_result gpuarr_task_create(const gpuarr_task_desc *desc, gpuarr_task *out) {
    GPUARR__BEGIN();
    GPUARR__REQUIRE_PTR(desc);
    GPUARR__REQUIRE_PTR(out);
    gpuarr__task_rec *rec = (gpuarr__task_rec *)gpuarr__calloc(sizeof *rec);
    if (!rec) return gpuarr__fail(GPUARR_ERROR_OUT_OF_MEMORY, "no host memory for a task");
    rec->desc = *desc;
    gpuarr_result r = rec->desc.kernel ? gpuarr__task_kernel_desc(&rec->desc, rec) : GPUARR_OK;
    if (r == GPUARR_OK) r = gpuarr__task_check_desc(&rec->desc);
    if (r != GPUARR_OK) {
        gpuarr__free(rec);
        return r;
    }
    gpuarr__copy_string(rec->name, sizeof rec->name, rec->desc.name);
    rec->desc.name = rec->name;
    rec->refs = 1;
    rec->out_bytes_per_size = -1;
    gpuarr__offload_state *os = gpuarr__offload_st();
    pthread_mutex_lock(&os->lock);
    uint32_t index = gpuarr__task_new_slot();
    if (index != UINT32_MAX) {
        os->slots[index].rec = rec;
        *out = gpuarr__task_handle(index);
    }
    pthread_mutex_unlock(&os->lock);
    if (index != UINT32_MAX) return GPUARR_OK;
    gpuarr__free(rec);
    return gpuarr__fail(GPUARR_ERROR_OUT_OF_MEMORY, "no room for another task (%u live at most)", GPUARR__TASK_MAX_RECS);
}

GPUARR_API gpuarr_result gpuarr_task_destroy(gpuarr_task t) {
    GPUARR__BEGIN();
    gpuarr__offload_state *os = gpuarr__offload_st();
    pthread_mutex_lock(&os->lock);
    gpuarr__task_rec *rec;
    gpuarr_result r = gpuarr__task_get(t, "t", &rec);
    if (r == GPUARR_OK) {
        gpuarr__task_slot *s = &os->slots[(t.id & 0xffffu) - 1u];
        s->rec = NULL;
        s->gen++;
        gpuarr__task_unref(rec); /* a call running it keeps the record until it ends */
    }
    pthread_mutex_unlock(&os->lock);
    return r;
}

/* ---------------------------------------------------------------------------------------------
 * One call's view of its arguments
 * ------------------------------------------------------------------------------------------- */
typedef struct gpuarr__off_call {
    const char *api;
    gpuarr__task_rec *task;           /* referenced */
    gpuarr_offload_desc d;
    gpuarr_offload_policy policy;     /* resolved: AUTO, HOST or GPU */
    gpuarr__dev *out_dev;             /* NULL = where computed */
    int cand[64];                     /* registry indices that may run it */
    int ncand;
} gpuarr__off_call;

/* Re-fails with r and "<prefix>: <the reason an inner call gave>" under the call's own name. */
static gpuarr_result gpuarr__off_wrap(const char *api, gpuarr_result r, const char *fmt, ...) GPUARR__PRINTF(3, 4);
static gpuarr_result gpuarr__off_wrap(const char *api, gpuarr_result r, const char *fmt, ...) {
    char prefix[256], why[sizeof gpuarr__tls.error_detail];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    gpuarr__copy_string(why, sizeof why, gpuarr__tls.error_detail);
    gpuarr__tls.api = api;
    return gpuarr__fail(r, "%s: %.900s", prefix, why);
}

static gpuarr_result gpuarr__off_check_desc(const gpuarr_offload_desc *d) {
    if ((int)d->policy < 0 || d->policy >= GPUARR_OFFLOAD_POLICY_COUNT)
        return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "desc->policy = %d is not a gpuarr_offload_policy", (int)d->policy);
    if (d->devices && !*d->devices) return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "desc->devices is \"\": NULL means \"all\"");
    if (d->out_dtype && !gpuarr__dtype_valid(d->out_dtype))
        return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "desc->out_dtype = %d is not a gpuarr_dtype (0 = as computed)", (int)d->out_dtype);
    if (d->streams < 0 || d->streams > GPUARR__MAP_MAX_STREAMS)
        return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "desc->streams = %d: must be 0 (= 2) or 1..%d", d->streams, GPUARR__MAP_MAX_STREAMS);
    return GPUARR_OK;
}

/* Whether the task runs on d: an implementation for its backend, or a kernel and a backend that
   runs portable kernels. */
static bool gpuarr__task_runs_on(const gpuarr__task_rec *t, const gpuarr__dev *d) {
    return t->desc.kernel ? d->backend->kernel_launch != NULL : t->desc.impl[d->info.backend] != NULL;
}

/* The candidates that may run the task under the policy, or why none. */
static gpuarr_result gpuarr__off_candidates(gpuarr__off_call *c) {
    const char *list = c->d.devices ? c->d.devices : "all";
    gpuarr__lease_cands lc;
    gpuarr_result r = gpuarr__cands_parse("desc->devices", list, &lc);
    bool host_listed = false, any_impl = false;
    c->ncand = 0;
    for (int i = 0; r == GPUARR_OK && i < lc.count && c->ncand < 64; i++) {
        gpuarr__dev *d = &gpuarr__g.devices[lc.view[i]];
        bool host = d == gpuarr__host_dev(), impl = gpuarr__task_runs_on(c->task, d);
        host_listed |= host;
        any_impl |= impl;
        if (!impl || gpuarr__dev_failed(d)) continue;
        if ((c->policy == GPUARR_OFFLOAD_HOST && !host) || (c->policy == GPUARR_OFFLOAD_GPU && host)) continue;
        c->cand[c->ncand++] = lc.view[i];
    }
    gpuarr__cands_free(&lc);
    if (r != GPUARR_OK || c->ncand) return r;
    const char *task = c->task->name;
    if (c->policy == GPUARR_OFFLOAD_HOST && !host_listed)
        return gpuarr__fail(GPUARR_ERROR_NO_DEVICE, "the policy is HOST, but desc->devices = \"%s\" leaves the host out", list);
    if (c->policy == GPUARR_OFFLOAD_HOST && !gpuarr__task_runs_on(c->task, gpuarr__host_dev()))
        return gpuarr__fail(GPUARR_ERROR_UNSUPPORTED, "the policy is HOST, but task \"%s\" has no host implementation (impl[GPUARR_BACKEND_HOST])",
                            task);
    if (!any_impl && c->task->desc.kernel)
        return gpuarr__fail(GPUARR_ERROR_UNSUPPORTED, "task \"%s\" is kernel %s, but no candidate in \"%s\" runs portable kernels", task,
                            c->task->desc.kernel->name, list);
    if (!any_impl)
        return gpuarr__fail(GPUARR_ERROR_UNSUPPORTED, "task \"%s\" has no implementation for the backend of any candidate in \"%s\"", task, list);
    if (c->policy == GPUARR_OFFLOAD_GPU)
        return gpuarr__fail(GPUARR_ERROR_NO_DEVICE,
                            "the policy is GPU, but no device other than the host in \"%s\" has an implementation of task \"%s\" and has not failed",
                            list, task);
    return gpuarr__fail(GPUARR_ERROR_DEVICE_LOST, "every candidate in \"%s\" with an implementation of task \"%s\" has failed", list, task);
}

/* Checks the arguments common to gpuarr_offload and gpuarr_map and takes a reference on the task. */
static gpuarr_result gpuarr__off_begin(gpuarr__off_call *c, gpuarr_task t, const gpuarr_offload_desc *desc) {
    memset(c, 0, sizeof *c);
    c->api = gpuarr__tls.api;
    if (desc) c->d = *desc;
    GPUARR__CHECK(gpuarr__off_check_desc(&c->d));
    if (c->d.out_device.id) GPUARR__CHECK(gpuarr__get_dev(c->d.out_device, "desc->out_device", &c->out_dev));
    c->policy = c->d.policy ? c->d.policy
                            : (gpuarr_offload_policy)gpuarr__setting_value(GPUARR__SET_OFFLOAD, GPUARR_OFFLOAD_AUTO);
    gpuarr__offload_state *os = gpuarr__offload_st();
    pthread_mutex_lock(&os->lock);
    gpuarr_result r = gpuarr__task_get(t, "t", &c->task);
    if (r == GPUARR_OK) c->task->refs++;
    pthread_mutex_unlock(&os->lock);
    if (r != GPUARR_OK) return r;
    r = gpuarr__off_candidates(c);
    if (r != GPUARR_OK) {
        pthread_mutex_lock(&os->lock);
        gpuarr__task_unref(c->task);
        pthread_mutex_unlock(&os->lock);
    }
    return r;
}

static void gpuarr__off_end(gpuarr__off_call *c) {
    pthread_mutex_lock(&gpuarr__offload_st()->lock);
    gpuarr__task_unref(c->task);
    pthread_mutex_unlock(&gpuarr__offload_st()->lock);
}

/* Every input array of one item, checked: a live handle (INVALID_HANDLE naming in[k]). */
static gpuarr_result gpuarr__off_check_inputs(const gpuarr_array *in, int first, int n) {
    for (int i = 0; i < n; i++) {
        gpuarr__array *a;
        char arg[32];
        snprintf(arg, sizeof arg, "in[%d]", first + i);
        GPUARR__CHECK(gpuarr__get_array(in[first + i], arg, &a));
        gpuarr__obj_release(&a->obj);
    }
    return GPUARR_OK;
}

/* ---------------------------------------------------------------------------------------------
 * Prediction and choice (lock held)
 * ------------------------------------------------------------------------------------------- */
typedef struct gpuarr__off_item {   /* what a choice needs of one item's inputs */
    gpuarr__dev *dev[GPUARR_TASK_MAX_ARRAYS];
    gpuarr__xfer_mem mem[GPUARR_TASK_MAX_ARRAYS];
    gpuarr_dtype dtype[GPUARR_TASK_MAX_ARRAYS];
    uint64_t bytes[GPUARR_TASK_MAX_ARRAYS];
    uint64_t total_bytes;
    double size;
} gpuarr__off_item;

static gpuarr_result gpuarr__off_describe(const gpuarr__task_rec *task, const gpuarr_array *in, gpuarr__off_item *it) {
    memset(it, 0, sizeof *it);
    int n_in = task->desc.n_in;
    int64_t first_count = 0;
    for (int i = 0; i < n_in; i++) {
        gpuarr__array *a;
        char arg[32];
        snprintf(arg, sizeof arg, "in[%d]", i);
        GPUARR__CHECK(gpuarr__get_array(in[i], arg, &a));
        it->dev[i] = a->dev;
        it->mem[i] = a->pinned_for ? GPUARR__XFER_PINNED : gpuarr__backend_has(a->dev->backend, GPUARR__BACKEND_HOST_MEMORY) ? GPUARR__XFER_PAGEABLE : GPUARR__XFER_DEVICE;
        it->dtype[i] = a->dtype;
        it->bytes[i] = a->nbytes;
        it->total_bytes += a->nbytes;
        if (i == 0) first_count = a->count;
        gpuarr__obj_release(&a->obj);
    }
    const char *api = gpuarr__tls.api;
    it->size = task->desc.size ? (double)task->desc.size(in, n_in, task->desc.user_data) : (double)first_count;
    gpuarr__tls.api = api; /* the size function may call gpuarr */
    return GPUARR_OK;
}

/* Seconds to bring the inputs to dev and (out_dev set) the outputs to out_dev. */
static double gpuarr__off_transfers(const gpuarr__off_call *c, const gpuarr__off_item *it, gpuarr__dev *dev) {
    double total = 0, s;
    bool modeled;
    for (int i = 0; i < c->task->desc.n_in; i++) {
        gpuarr_dtype to = c->task->desc.in_dtype[i] ? c->task->desc.in_dtype[i] : it->dtype[i];
        gpuarr__transfer_predict(it->dev[i], it->mem[i], dev, it->dtype[i], to, it->bytes[i], &s, &modeled);
        total += s;
    }
    if (c->out_dev) {
        /* outputs: as many bytes per unit of size as the last run made; before any, as in[0] */
        double per = c->task->out_bytes_per_size;
        uint64_t bytes = per >= 0 ? (uint64_t)(per * it->size) : it->bytes[0] * (uint64_t)c->task->desc.n_out;
        gpuarr_dtype t = c->d.out_dtype ? c->d.out_dtype : it->dtype[0];
        gpuarr__transfer_predict(dev, gpuarr__backend_has(dev->backend, GPUARR__BACKEND_HOST_MEMORY) ? GPUARR__XFER_PAGEABLE : GPUARR__XFER_DEVICE, c->out_dev, t, t, bytes, &s,
                                 &modeled);
        total += s;
    }
    return total;
}

static bool gpuarr__twins(int i, int j) {
    const gpuarr_device_info *a = &gpuarr__g.devices[i].info, *b = &gpuarr__g.devices[j].info;
    return i != j && a->backend == b->backend && a->compute_units == b->compute_units && strcmp(a->name, b->name) == 0 &&
           strcmp(a->vendor, b->vendor) == 0;
}

/* The compute estimate of the task on dev at size n; *known: measured enough to be trusted.
   -1 when nothing was measured there. The sanity bound between twins: a model more than 3x
   slower than the median of its measured twins' (same backend, name, vendor, compute units) at
   the same size is taken for a poisoned one (a spike, a one-off slow run that made the device
   look slow so it never runs again to correct it): its twins' median stands in and it may be
   explored again. A model too fast corrects itself: it is chosen, and measured. */
static double gpuarr__off_compute(const char *task, int dev, double n, bool *known) {
    gpuarr__tmodel *m = gpuarr__model_get(task, dev);
    *known = false;
    if (!m || m->count == 0) return -1;
    double p = gpuarr__model_predict(m, n), twins[64];
    int k = 0;
    for (int j = 0; j < gpuarr__g.device_count && k < 64; j++) {
        if (!gpuarr__twins(dev, j)) continue;
        gpuarr__tmodel *o = gpuarr__model_get(task, j);
        if (o && o->count >= GPUARR__MODEL_KNOWN) twins[k++] = gpuarr__model_predict(o, n);
    }
    double med = k ? gpuarr__median(twins, k) : 0;
    if (k && p > GPUARR__TWIN_RANGE * med) return med;
    *known = m->count >= GPUARR__MODEL_KNOWN;
    return p;
}

/* Whether any candidate has a measurement: the models need one to compare the others against. */
static bool gpuarr__off_measured(const char *task, const int *cand, int ncand) {
    for (int i = 0; i < ncand; i++) {
        gpuarr__tmodel *m = gpuarr__model_get(task, cand[i]);
        if (m && m->count) return true;
    }
    return false;
}

/* The 1 MiB rule, while nothing is measured: more than 1 MiB of input goes to the best device
   other than the host (a GPU before any other, then gpuarr__better_gpu), the rest to the host. */
static int gpuarr__off_rule(const gpuarr__off_call *c, const gpuarr__off_item *it, const int *cand, int ncand) {
    int best = -1, host = -1;
    for (int i = 0; i < ncand; i++) {
        const gpuarr__dev *d = &gpuarr__g.devices[cand[i]];
        if (d == gpuarr__host_dev()) {
            host = cand[i];
            continue;
        }
        const gpuarr__dev *b = best >= 0 ? &gpuarr__g.devices[best] : NULL;
        if (!b || (d->info.type == GPUARR_DEVICE_TYPE_GPU && b->info.type != GPUARR_DEVICE_TYPE_GPU) ||
            (d->info.type == b->info.type && gpuarr__better_gpu(&d->info, &b->info)))
            best = cand[i];
    }
    GPUARR__UNUSED(c);
    if (host >= 0 && (best < 0 || it->total_bytes <= GPUARR__OFFLOAD_RULE_BYTES)) return host;
    return best;
}

typedef struct gpuarr__off_choice {
    int dev;            /* registry index */
    double predicted;   /* compute seconds the model expects (0 when unknown) */
    double cost;        /* the whole cost: transfers + compute + queue */
    bool explored, changed;
    int octave;         /* an exploration of a new size: its octave; -1 = not one */
    bool warmup;        /* started before any run of the task there finished in this process */
} gpuarr__off_choice;

static int gpuarr__octave(double n) {
    int o = gpuarr__size_bucket(n);
    return o < GPUARR__OCTAVES ? o : GPUARR__OCTAVES - 1;
}

/* Whether candidate i may be explored (its cost within 10x of the best's): a device not yet
   measured, a few times; a measured one at a new size, a few times per size octave. *octave:
   which octave, or -1 for the former. */
static bool gpuarr__off_explorable(const gpuarr__tmodel *m, bool known, double size, double cost, double best_cost, int *octave) {
    *octave = -1;
    if (!m || cost > GPUARR__EXPLORE_RANGE * best_cost) return false;
    if (!known) return m->unmeasured_explorations < GPUARR__EXPLORE_MAX;
    *octave = gpuarr__octave(size);
    return gpuarr__model_new_size(m, size) && m->size_explorations[*octave] < GPUARR__SIZE_EXPLORE_MAX;
}

/* Chooses among cand[0..ncand) (lock held). */
static void gpuarr__off_choose(const gpuarr__off_call *c, const gpuarr__off_item *it, const int *cand, int ncand, gpuarr__off_choice *out) {
    gpuarr__offload_state *os = gpuarr__offload_st();
    const char *task = c->task->name;
    memset(out, 0, sizeof *out);
    if (!gpuarr__off_measured(task, cand, ncand)) {
        out->dev = gpuarr__off_rule(c, it, cand, ncand);
        return;
    }
    double cost[64], comp[64], least_comp = -1;
    bool known[64];
    for (int i = 0; i < ncand; i++) {
        comp[i] = gpuarr__off_compute(task, cand[i], it->size, &known[i]);
        if (comp[i] >= 0 && (least_comp < 0 || comp[i] < least_comp)) least_comp = comp[i];
    }
    int best = -1;
    for (int i = 0; i < ncand; i++) { /* an unmeasured device: as fast as the fastest measured one, to judge exploring it */
        double compute = comp[i] >= 0 ? comp[i] : least_comp;
        cost[i] = gpuarr__off_transfers(c, it, &gpuarr__g.devices[cand[i]]) + compute + os->queued_s[cand[i]];
        if (comp[i] >= 0 && (best < 0 || cost[i] < cost[best])) best = i;
    }
    int explore = -1, explore_octave = -1; /* one candidate: nothing to compare, nothing to explore */
    for (int i = 0; i < ncand && ncand > 1; i++) {
        int octave;
        if (!gpuarr__off_explorable(gpuarr__model_get(task, cand[i]), known[i], it->size, cost[i], cost[best], &octave) ||
            (octave >= 0 && i == best)) /* the best at a new size runs there anyway: no exploration */
            continue;
        if (explore < 0 || cost[i] < cost[explore]) explore = i, explore_octave = octave;
    }
    int pick = explore >= 0 ? explore : best;
    out->dev = cand[pick];
    out->predicted = comp[pick] >= 0 ? comp[pick] : 0;
    out->cost = cost[pick];
    out->explored = explore >= 0;
    out->changed = explore >= 0 && explore != best;
    out->octave = explore_octave;
}

/* Counts a choice in the statistics and its compute in the device's queue, and tells whether the
   run is a warm-up (lock held). */
static void gpuarr__off_started(const gpuarr__off_call *c, gpuarr__off_choice *ch) {
    gpuarr__tmodel *m = gpuarr__model_get(c->task->name, ch->dev);
    if (m && ch->explored) {
        m->explorations++, m->changed += ch->changed;
        if (ch->octave >= 0) m->size_explorations[ch->octave]++;
        else m->unmeasured_explorations++;
    }
    ch->warmup = m ? gpuarr__model_warmup(m) : false;
    gpuarr__offload_st()->queued_s[ch->dev] += ch->predicted;
}

/* A run's end: its time into the model and the statistics, its compute out of the queue. */
static void gpuarr__off_finished(gpuarr__off_call *c, const gpuarr__off_choice *ch, double size, bool ran, double seconds,
                                 double out_bytes) {
    gpuarr__offload_state *os = gpuarr__offload_st();
    pthread_mutex_lock(&os->lock);
    os->queued_s[ch->dev] -= ch->predicted;
    if (os->queued_s[ch->dev] < 1e-12) os->queued_s[ch->dev] = 0;
    gpuarr__tmodel *m = gpuarr__model_get(c->task->name, ch->dev);
    if (ran && m) {
        m->calls++;
        m->predicted_s += ch->predicted;
        m->measured_s += seconds;
        gpuarr__model_measured(m, size, seconds, ch->warmup);
        if (size > 0) c->task->out_bytes_per_size = out_bytes / size;
    }
    pthread_mutex_unlock(&os->lock);
}

/* The candidates with a free lease slot, when any has one (lock order: offload, then leases). */
static int gpuarr__off_free_slots(const int *cand, int ncand, int *out) {
    gpuarr__lease_state *ls = gpuarr__lease_st();
    int n = 0;
    pthread_mutex_lock(&ls->lock);
    for (int i = 0; i < ncand; i++) {
        int p = gpuarr__lease_phys(cand[i]);
        if (ls->in_use[p] < ls->total[p]) out[n++] = cand[i];
    }
    pthread_mutex_unlock(&ls->lock);
    return n;
}

/* ---------------------------------------------------------------------------------------------
 * Running one item on a device
 * ------------------------------------------------------------------------------------------- */
/* Releases the arrays made so far, keeping the error and the name of the call running. */
static void gpuarr__off_release_all(gpuarr_array *a, int n) {
    gpuarr__error_saved sv;
    const char *api = gpuarr__tls.api;
    gpuarr__error_save(&sv);
    for (int i = 0; i < n; i++)
        if (a[i].id) gpuarr_release(a[i]), a[i].id = 0;
    gpuarr__error_restore(&sv);
    gpuarr__tls.api = api;
}

/* Moves the inputs to dev as the task's dtypes (moved[] made; released by the caller). */
static gpuarr_result gpuarr__off_move_inputs(const gpuarr__off_call *c, const gpuarr_array *in, gpuarr__dev *dev, gpuarr_array *moved) {
    for (int i = 0; i < c->task->desc.n_in; i++) {
        gpuarr_result r = gpuarr_convert(in[i], dev->info.device, c->task->desc.in_dtype[i], &moved[i]);
        if (r != GPUARR_OK) return gpuarr__off_wrap(c->api, r, "moving in[%d] to %s", i, dev->info.spec);
    }
    gpuarr__tls.api = c->api;
    return GPUARR_OK;
}

/* A kernel task's implementation: its OUT arrays made on the current device like in[0] (shape),
   then the kernel over its default launch (1-D over its first array) on s. */
static gpuarr_result gpuarr__off_kernel_impl(const gpuarr_task_desc *td, const gpuarr_array *in, gpuarr_array *out, gpuarr_stream s) {
    const gpuarr_kernel *k = td->kernel;
    gpuarr_array_info info;
    GPUARR__CHECK(gpuarr_array_get_info(in[0], &info));
    gpuarr_kernel_arg args[GPUARR_KERNEL_MAX_PARAMS];
    memset(args, 0, sizeof args);
    int n_in = 0, n_out = 0;
    for (int i = 0; i < k->nparams; i++) {
        const gpuarr_kernel_param *p = &k->params[i];
        if (p->kind == GPUARR_PARAM_SCALAR) args[i].scalar = td->kernel_scalars[i];
        else if (p->kind == GPUARR_PARAM_IN) args[i].array = in[n_in++];
        else {
            GPUARR__CHECK(gpuarr_empty(info.device, p->dtype, info.ndim, info.shape, &out[n_out]));
            args[i].array = out[n_out++];
        }
    }
    gpuarr_launch l;
    memset(&l, 0, sizeof l);
    l.stream = s;
    return gpuarr_kernel_launch(k, &l, args);
}

/* Calls the implementation on s and waits for it: *seconds = its time. */
static gpuarr_result gpuarr__off_call_impl(const gpuarr__off_call *c, gpuarr__dev *dev, const gpuarr_array *moved, gpuarr_array *made,
                                           gpuarr_stream s, double *seconds) {
    const gpuarr_task_desc *td = &c->task->desc;
    gpuarr__tls.error_code = GPUARR_OK; /* to tell the implementation's own failure from an older one */
    gpuarr__tls.error_api = NULL;
    double t0 = gpuarr__now_ms();
    gpuarr_result r = td->kernel ? gpuarr__off_kernel_impl(td, moved, made, s)
                                 : td->impl[dev->info.backend](moved, td->n_in, made, td->n_out, s, td->user_data);
    if (r == GPUARR_OK) r = gpuarr_stream_sync(s);
    *seconds = (gpuarr__now_ms() - t0) * 1e-3;
    if (r == GPUARR_OK) {
        gpuarr__tls.api = c->api;
        return GPUARR_OK;
    }
    if (gpuarr__tls.error_code == r && gpuarr__tls.error_api)
        return gpuarr__off_wrap(c->api, r, "task \"%s\" on %s", td->name, dev->info.spec);
    gpuarr__tls.api = c->api;
    return gpuarr__fail(r, "task \"%s\" on %s: the implementation returned %s", td->name, dev->info.spec, gpuarr_result_name(r));
}

/* The implementation's outputs: each a live array (else GPUARR_ERROR_BACKEND); *bytes their size. */
static gpuarr_result gpuarr__off_check_outputs(const gpuarr__off_call *c, gpuarr__dev *dev, const gpuarr_array *made, double *bytes) {
    *bytes = 0;
    for (int j = 0; j < c->task->desc.n_out; j++) {
        gpuarr__obj *o;
        if (!made[j].id || gpuarr__table_get(&gpuarr__g.arrays, made[j].id, "out", &o) != GPUARR_OK)
            return gpuarr__fail(GPUARR_ERROR_BACKEND, "task \"%s\" on %s returned GPUARR_OK without making out[%d] (it is %s)", c->task->name,
                                dev->info.spec, j, made[j].id ? "not a live array" : "{0}");
        *bytes += (double)((gpuarr__array *)o)->nbytes;
        gpuarr__obj_release(o);
    }
    return GPUARR_OK;
}

/* The outputs where the caller wants them (made[] released and replaced when they move). */
static gpuarr_result gpuarr__off_deliver(const gpuarr__off_call *c, gpuarr_array *made) {
    if (!c->out_dev && !c->d.out_dtype) return GPUARR_OK;
    for (int j = 0; j < c->task->desc.n_out; j++) {
        gpuarr_array moved;
        gpuarr__array *a;
        GPUARR__CHECK(gpuarr__get_array(made[j], "out", &a));
        gpuarr_device to = c->out_dev ? c->out_dev->info.device : a->dev->info.device;
        gpuarr__obj_release(&a->obj);
        gpuarr_result r = gpuarr_convert(made[j], to, c->d.out_dtype, &moved);
        if (r != GPUARR_OK) return gpuarr__off_wrap(c->api, r, "giving out[%d] back", j);
        gpuarr_release(made[j]);
        made[j] = moved;
    }
    gpuarr__tls.api = c->api;
    return GPUARR_OK;
}

/* Runs one item on dev (current there) with stream s: out[0..n_out) written on success only. */
static gpuarr_result gpuarr__off_run(const gpuarr__off_call *c, gpuarr__dev *dev, const gpuarr_array *in, gpuarr_array *out,
                                     gpuarr_stream s, double *seconds, double *out_bytes) {
    gpuarr_array moved[GPUARR_TASK_MAX_ARRAYS] = {{0}}, made[GPUARR_TASK_MAX_ARRAYS] = {{0}};
    int n_in = c->task->desc.n_in, n_out = c->task->desc.n_out;
    gpuarr_result r = gpuarr__off_move_inputs(c, in, dev, moved);
    if (r == GPUARR_OK) r = gpuarr__off_call_impl(c, dev, moved, made, s, seconds);
    gpuarr__off_release_all(moved, n_in);
    if (r == GPUARR_OK) r = gpuarr__off_check_outputs(c, dev, made, out_bytes);
    if (r == GPUARR_OK) r = gpuarr__off_deliver(c, made);
    gpuarr__tls.api = c->api;
    if (r != GPUARR_OK) {
        gpuarr__off_release_all(made, n_out);
        return r;
    }
    memcpy(out, made, sizeof *out * (size_t)n_out);
    return GPUARR_OK;
}

/* A stream of dev made current on this thread, for the implementation (the previous device back
   by gpuarr__off_leave). */
static gpuarr_result gpuarr__off_enter(const gpuarr__off_call *c, gpuarr__dev *dev, gpuarr_stream *s, gpuarr_device *previous) {
    *previous = gpuarr_current_device();
    gpuarr_result r = gpuarr_set_current_device(dev->info.device);
    if (r == GPUARR_OK) r = gpuarr_stream_create(dev->info.device, 0, s);
    if (r != GPUARR_OK) {
        gpuarr__error_saved sv;
        gpuarr__error_save(&sv);
        gpuarr_set_current_device(*previous);
        gpuarr__error_restore(&sv);
        return gpuarr__off_wrap(c->api, r, "preparing %s", dev->info.spec);
    }
    gpuarr__tls.api = c->api;
    return GPUARR_OK;
}

static void gpuarr__off_leave(const gpuarr__off_call *c, gpuarr_stream s, gpuarr_device previous) {
    gpuarr__error_saved sv;
    gpuarr__error_save(&sv);
    gpuarr_stream_destroy(s);
    gpuarr_set_current_device(previous);
    gpuarr__error_restore(&sv);
    gpuarr__tls.api = c->api;
}

/* A lease on dev, waiting as long as it takes (desc->lease). */
static gpuarr_result gpuarr__off_lease(const gpuarr__off_call *c, gpuarr__dev *dev, gpuarr_lease *l) {
    gpuarr_lease_desc ld;
    memset(&ld, 0, sizeof ld);
    ld.devices = dev->info.spec;
    ld.timeout_ms = -1;
    gpuarr_result r = gpuarr__lease_acquire(&ld, l, NULL);
    return r == GPUARR_OK ? r : gpuarr__off_wrap(c->api, r, "a lease on %s", dev->info.spec);
}

/* ---------------------------------------------------------------------------------------------
 * gpuarr_offload
 * ------------------------------------------------------------------------------------------- */
static gpuarr_result gpuarr__offload(gpuarr__off_call *c, const gpuarr_array *in, gpuarr_array *out, gpuarr_device *ran_on) {
    gpuarr__off_item it;
    GPUARR__CHECK(gpuarr__off_describe(c->task, in, &it));
    gpuarr__offload_state *os = gpuarr__offload_st();
    gpuarr__off_choice ch;
    int free_cand[64], nfree = c->d.lease ? gpuarr__off_free_slots(c->cand, c->ncand, free_cand) : 0;
    pthread_mutex_lock(&os->lock);
    gpuarr__off_choose(c, &it, nfree ? free_cand : c->cand, nfree ? nfree : c->ncand, &ch);
    gpuarr__off_started(c, &ch);
    pthread_mutex_unlock(&os->lock);
    gpuarr__dev *dev = &gpuarr__g.devices[ch.dev];
    gpuarr_lease lease = {0};
    gpuarr_stream s = {0};
    gpuarr_device previous = {0};
    double seconds = 0, out_bytes = 0;
    gpuarr_result r = c->d.lease ? gpuarr__off_lease(c, dev, &lease) : GPUARR_OK;
    bool entered = false;
    if (r == GPUARR_OK) r = gpuarr__off_enter(c, dev, &s, &previous), entered = r == GPUARR_OK;
    if (r == GPUARR_OK) r = gpuarr__off_run(c, dev, in, out, s, &seconds, &out_bytes);
    if (entered) gpuarr__off_leave(c, s, previous);
    if (lease.id) gpuarr__lease_release_quiet(lease);
    gpuarr__off_finished(c, &ch, it.size, r == GPUARR_OK, seconds, out_bytes);
    if (r == GPUARR_OK && ran_on) *ran_on = dev->info.device;
    return r;
}

GPUARR_API gpuarr_result gpuarr_offload(gpuarr_task t, const gpuarr_array *in, int n_in, gpuarr_array *out, int n_out,
                                        const gpuarr_offload_desc *desc, gpuarr_device *ran_on) {
    GPUARR__BEGIN();
    GPUARR__REQUIRE_PTR(in);
    GPUARR__REQUIRE_PTR(out);
    gpuarr__off_call c;
    GPUARR__CHECK(gpuarr__off_begin(&c, t, desc));
    gpuarr_result r = GPUARR_OK;
    if (n_in != c.task->desc.n_in || n_out != c.task->desc.n_out)
        r = gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "%s = %d, but task \"%s\" has %d", n_in != c.task->desc.n_in ? "n_in" : "n_out",
                         n_in != c.task->desc.n_in ? n_in : n_out, c.task->name, n_in != c.task->desc.n_in ? c.task->desc.n_in : c.task->desc.n_out);
    if (r == GPUARR_OK) r = gpuarr__offload(&c, in, out, ran_on);
    gpuarr__off_end(&c);
    return r;
}

/* ---------------------------------------------------------------------------------------------
 * gpuarr_map: worker threads, desc->streams of them per candidate device, each with its own
 * stream, take items from one shared counter in index order. A thread's upload of its next item
 * runs while the other threads of its device compute, so transfers and compute overlap, and a
 * faster device simply comes back for items more often: the queue deals by speed by itself. The
 * models weigh in where that is not enough: a device whose measured time for an item is more
 * than 4x the best candidate's leaves the items to the others (its threads stop), so a slow
 * device does not take the last items and hold up the end.
 * ------------------------------------------------------------------------------------------- */
typedef struct gpuarr__map_job {
    gpuarr__off_call *c;
    const gpuarr_array *in;
    gpuarr_array *out;
    int n_items;
    pthread_mutex_t lock;         /* next, failed and the error (the offload lock is taken apart from it) */
    int next;
    bool stop;
    int failed;                   /* the lowest index among the items that failed; -1 = none */
    gpuarr_result error;
    char why[sizeof gpuarr__tls.error_detail];
    gpuarr_result worker_error;   /* a worker that could not start (its stream), when no item failed */
    char worker_why[sizeof gpuarr__tls.error_detail];
    gpuarr_device *ran_on;        /* NULL, or each item's device, for desc->item_devices on success */
} gpuarr__map_job;

typedef struct gpuarr__map_worker {
    gpuarr__map_job *job;
    int dev;
    pthread_t thread;
    bool started;
} gpuarr__map_worker;

static void gpuarr__map_fail(gpuarr__map_job *job, int item, gpuarr_result r) {
    pthread_mutex_lock(&job->lock);
    job->stop = true;
    if (item >= 0 && (job->failed < 0 || item < job->failed)) {
        job->failed = item;
        job->error = r;
        gpuarr__copy_string(job->why, sizeof job->why, gpuarr__tls.error_detail);
    } else if (item < 0 && !job->worker_error) {
        job->worker_error = r;
        gpuarr__copy_string(job->worker_why, sizeof job->worker_why, gpuarr__tls.error_detail);
    }
    pthread_mutex_unlock(&job->lock);
}

/* Whether dev should leave item `item` to faster devices (offload lock held). */
static bool gpuarr__map_declines(const gpuarr__off_call *c, int dev, const gpuarr__off_item *it) {
    bool known;
    double mine = gpuarr__off_compute(c->task->name, dev, it->size, &known);
    if (!known) return false;
    for (int i = 0; i < c->ncand; i++) {
        bool k;
        double other = gpuarr__off_compute(c->task->name, c->cand[i], it->size, &k);
        if (k && other * GPUARR__DECLINE_RANGE < mine) return true;
    }
    return false;
}

/* The next item for a worker of dev, or -1: none left, stopped, or left to faster devices. */
static int gpuarr__map_take(gpuarr__map_worker *w, gpuarr__off_item *it, gpuarr__off_choice *ch) {
    gpuarr__map_job *job = w->job;
    pthread_mutex_lock(&job->lock);
    int i = job->stop || job->next >= job->n_items ? -1 : job->next;
    if (i >= 0 && gpuarr__off_describe(job->c->task, job->in + (size_t)i * (size_t)job->c->task->desc.n_in, it) != GPUARR_OK) {
        pthread_mutex_unlock(&job->lock);
        gpuarr__map_fail(job, i, gpuarr__tls.error_code);
        return -1;
    }
    if (i >= 0) {
        gpuarr__offload_state *os = gpuarr__offload_st();
        pthread_mutex_lock(&os->lock);
        bool decline = gpuarr__map_declines(job->c, w->dev, it);
        if (!decline) {
            memset(ch, 0, sizeof *ch);
            ch->dev = w->dev;
            bool known;
            double p = gpuarr__off_compute(job->c->task->name, w->dev, it->size, &known);
            ch->predicted = p > 0 ? p : 0;
            gpuarr__off_started(job->c, ch);
        }
        pthread_mutex_unlock(&os->lock);
        if (decline) i = -1;
        else job->next++;
    }
    pthread_mutex_unlock(&job->lock);
    return i;
}

static void *gpuarr__map_thread(void *arg) {
    gpuarr__map_worker *w = (gpuarr__map_worker *)arg;
    gpuarr__map_job *job = w->job;
    gpuarr__off_call *c = job->c;
    gpuarr__dev *dev = &gpuarr__g.devices[w->dev];
    gpuarr__tls.api = c->api;
    gpuarr_stream s;
    gpuarr_device previous;
    if (gpuarr__off_enter(c, dev, &s, &previous) != GPUARR_OK) {
        gpuarr__map_fail(job, -1, gpuarr__tls.error_code);
        return NULL;
    }
    int n_in = c->task->desc.n_in, n_out = c->task->desc.n_out;
    gpuarr__off_item it;
    gpuarr__off_choice ch;
    for (int i; (i = gpuarr__map_take(w, &it, &ch)) >= 0;) {
        gpuarr_lease lease = {0};
        double seconds = 0, out_bytes = 0;
        gpuarr_result r = c->d.lease ? gpuarr__off_lease(c, dev, &lease) : GPUARR_OK;
        if (r == GPUARR_OK)
            r = gpuarr__off_run(c, dev, job->in + (size_t)i * (size_t)n_in, job->out + (size_t)i * (size_t)n_out, s, &seconds, &out_bytes);
        if (lease.id) gpuarr__lease_release_quiet(lease);
        gpuarr__off_finished(c, &ch, it.size, r == GPUARR_OK, seconds, out_bytes);
        if (r != GPUARR_OK) gpuarr__map_fail(job, i, r);
        else if (job->ran_on) job->ran_on[i] = dev->info.device; /* item i is this thread's alone */
    }
    gpuarr__off_leave(c, s, previous);
    return NULL;
}

/* Starts the workers, waits for them; false when not one thread could be started. */
static bool gpuarr__map_workers(gpuarr__map_job *job, gpuarr__map_worker *w, int count) {
    int started = 0;
    for (int i = 0; i < count; i++) {
        w[i].started = pthread_create(&w[i].thread, NULL, gpuarr__map_thread, &w[i]) == 0;
        started += w[i].started;
    }
    for (int i = 0; i < count; i++)
        if (w[i].started) pthread_join(w[i].thread, NULL);
    GPUARR__UNUSED(job);
    return started > 0;
}

static gpuarr_result gpuarr__map(gpuarr__off_call *c, const gpuarr_array *in, int n_items, gpuarr_array *out, int *failed_item) {
    int streams = c->d.streams ? c->d.streams : 2, count = c->ncand * streams;
    int free_cand[64], nfree = c->d.lease ? gpuarr__off_free_slots(c->cand, c->ncand, free_cand) : 0;
    if (nfree) memcpy(c->cand, free_cand, sizeof(int) * (size_t)nfree), c->ncand = nfree, count = nfree * streams;
    gpuarr__map_worker *w = (gpuarr__map_worker *)gpuarr__calloc(sizeof *w * (size_t)count);
    gpuarr_device *ran_on = c->d.item_devices ? (gpuarr_device *)gpuarr__calloc(sizeof *ran_on * (size_t)n_items) : NULL;
    if (!w || (c->d.item_devices && !ran_on)) {
        gpuarr__free(w);
        gpuarr__free(ran_on);
        return gpuarr__fail(GPUARR_ERROR_OUT_OF_MEMORY, "no host memory for %d map workers and %d items' devices", count, n_items);
    }
    gpuarr__map_job job;
    memset(&job, 0, sizeof job);
    job.c = c, job.in = in, job.out = out, job.n_items = n_items, job.failed = -1, job.ran_on = ran_on;
    pthread_mutex_init(&job.lock, NULL);
    for (int i = 0; i < count; i++) w[i].job = &job, w[i].dev = c->cand[i / streams];
    bool any = gpuarr__map_workers(&job, w, count);
    pthread_mutex_destroy(&job.lock);
    gpuarr__free(w);
    gpuarr__tls.api = c->api;
    if (job.failed < 0 && job.next < n_items) { /* no worker was left to take the rest */
        job.failed = job.next;
        job.error = job.worker_error ? job.worker_error : GPUARR_ERROR_BACKEND;
        gpuarr__copy_string(job.why, sizeof job.why, job.worker_error ? job.worker_why : any ? "no worker could take it" : "no worker thread could be started");
    }
    if (job.failed < 0 && ran_on) memcpy(c->d.item_devices, ran_on, sizeof *ran_on * (size_t)n_items);
    gpuarr__free(ran_on);
    if (job.failed < 0) return GPUARR_OK;
    gpuarr__off_release_all(out, n_items * c->task->desc.n_out);
    if (failed_item) *failed_item = job.failed;
    return gpuarr__fail(job.error, "item %d: %.900s", job.failed, job.why);
}

GPUARR_API gpuarr_result gpuarr_map(gpuarr_task t, const gpuarr_array *in, int n_items, gpuarr_array *out,
                                    const gpuarr_offload_desc *desc, int *failed_item) {
    GPUARR__BEGIN();
    GPUARR__REQUIRE_PTR(in);
    GPUARR__REQUIRE_PTR(out);
    if (n_items < 1 || n_items > (1 << 24))
        return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "n_items = %d: must be 1..%d", n_items, 1 << 24);
    gpuarr__off_call c;
    GPUARR__CHECK(gpuarr__off_begin(&c, t, desc));
    /* every item's inputs are checked before any runs, so a bad handle is an argument error, not item k's */
    gpuarr_result r = GPUARR_OK;
    for (int i = 0; r == GPUARR_OK && i < n_items; i++) r = gpuarr__off_check_inputs(in, i * c.task->desc.n_in, c.task->desc.n_in);
    if (r == GPUARR_OK) {
        memset(out, 0, sizeof *out * (size_t)n_items * (size_t)c.task->desc.n_out);
        r = gpuarr__map(&c, in, n_items, out, failed_item);
    }
    gpuarr__off_end(&c);
    return r;
}

/* ---------------------------------------------------------------------------------------------
 * Statistics and the summary
 * ------------------------------------------------------------------------------------------- */
GPUARR_API gpuarr_result gpuarr_task_get_stats(gpuarr_task t, gpuarr_device d, gpuarr_task_stats *out) {
    GPUARR__BEGIN();
    GPUARR__REQUIRE_PTR(out);
    gpuarr__dev *dev;
    GPUARR__CHECK(gpuarr__get_dev_any(d, "d", &dev));
    gpuarr__offload_state *os = gpuarr__offload_st();
    pthread_mutex_lock(&os->lock);
    gpuarr__task_rec *rec;
    gpuarr_result r = gpuarr__task_get(t, "t", &rec);
    gpuarr__tmodel *m = r == GPUARR_OK ? gpuarr__model_get(rec->name, (int)(gpuarr__dev_view(dev) - gpuarr__g.devices)) : NULL;
    if (r == GPUARR_OK && !m) r = gpuarr__fail(GPUARR_ERROR_OUT_OF_MEMORY, "no host memory for a task model");
    if (r == GPUARR_OK) {
        memset(out, 0, sizeof *out);
        out->calls = m->calls;
        out->explorations = m->explorations;
        out->changed_by_exploration = m->changed;
        out->predicted_s = m->predicted_s;
        out->measured_s = m->measured_s;
        out->model_a_s = m->a;
        out->model_b_s = m->b;
        out->samples = (uint64_t)m->count;
        out->rejected = m->rejected;
    }
    pthread_mutex_unlock(&os->lock);
    return r;
}

/* Reads every task model in the cache folder that belongs to a device of this process (lock held). */
static void gpuarr__models_scan(void) {
    gpuarr__offload_state *os = gpuarr__offload_st();
    const char *base = gpuarr__g.config.cache_dir;
    if (os->scanned || !base[0]) return;
    os->scanned = true;
    DIR *dir = opendir(base);
    if (!dir) return;
    for (struct dirent *e; (e = readdir(dir));) {
        size_t n = strlen(e->d_name);
        if (strncmp(e->d_name, "task-", 5) != 0 || n < 5 + 1 + 17 + 6 || strcmp(e->d_name + n - 6, ".model") != 0) continue;
        char task[GPUARR__TASK_NAME_MAX + 1], file[128];
        size_t tn = n - 5 - 17 - 6; /* "task-" name "-" 16 hex ".model" */
        if (tn > GPUARR__TASK_NAME_MAX) continue;
        memcpy(task, e->d_name + 5, tn);
        task[tn] = '\0';
        for (int d = 0; d < gpuarr__g.device_count; d++) /* the device whose key makes this name */
            if (gpuarr__model_file(task, d, file, sizeof file), strcmp(file, e->d_name) == 0) gpuarr__model_get(task, d);
    }
    closedir(dir);
}

GPUARR_API gpuarr_result gpuarr_task_models_summary(char *buf, size_t len) {
    GPUARR__BEGIN();
    GPUARR__REQUIRE_PTR(buf);
    if (len == 0) return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "len is 0");
    gpuarr__offload_state *os = gpuarr__offload_st();
    buf[0] = '\0';
    pthread_mutex_lock(&os->lock);
    gpuarr__models_scan();
    int lines = 0;
    for (gpuarr__tmodel *m = os->models; m; m = m->next) {
        if (!m->count && !m->calls) continue;
        gpuarr__append_line(buf, len,
                             "task %s on %s: t = %.3g s + %.3g s * size (%d samples, %llu rejected); %llu calls, %llu explorations "
                             "(%llu changed the choice), predicted %.3g s, measured %.3g s\n",
                             m->task, gpuarr__g.devices[m->dev].info.spec, m->a, m->b, m->count, (unsigned long long)m->rejected,
                             (unsigned long long)m->calls, (unsigned long long)m->explorations, (unsigned long long)m->changed,
                             m->predicted_s, m->measured_s);
        lines++;
    }
    if (!lines) gpuarr__append_line(buf, len, "no task models\n");
    pthread_mutex_unlock(&os->lock);
    return GPUARR_OK;
}

static void gpuarr__offload_layer(gpuarr__layer *l) {
    l->name = "offload";
    l->start = gpuarr__offload_start;
    l->stop = gpuarr__offload_stop;
    l->settings[0].id = GPUARR__SET_OFFLOAD;
    l->settings[0].check = gpuarr__check_offload;
}

#endif /* GPUARR_OFFLOAD_INCLUDED */
