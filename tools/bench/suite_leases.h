/* suite_leases.h -- what leases cost (gpuarr-bench --leases)
 *
 * --leases (alone; bench/results/leases.md, `make bench-leases`): what leases cost (LEASES in
 * gpuarr.h), in one run. (a) gpuarr_lease_acquire + gpuarr_lease_release, timeout 0, uncontended,
 * on host and opencl:0, with GPUARR_LEASE_DIR=off and with a fresh folder (flock'ed slot files),
 * the library restarted for each setting, and on host with placement ROUND_ROBIN too (the default
 * placement reads free memory: the host's from /proc/meminfo); baselines: two clock reads (the
 * floor of every per-pair time), an uncontended pthread mutex lock + unlock, a raw open + flock +
 * unlock + close in the same folder, and that with the holder's line a lease writes; median, p95
 * and max ns. (b) Across processes: 1 and 2 fresh processes (exec'd
 * peers, `--lease-peer`, each with its own gpuarr_init) taking the host's one slot in a shared
 * folder, N acquire (timeout -1) + release pairs each, tight and with 1 ms held / 1 ms pause;
 * pairs/s and the acquire's median, p95 and max. (c) Oversubscription: 8 threads on "opencl:*"
 * (2 devices with POCL_DEVICES="pthread pthread"; a line says so when there are not 2), a batch of
 * --lease-jobs jobs (default 256), each a lease, a 1 MiB f32 upload, a cast on the device to f64
 * or f16, the download (4 elements checked: a wrong result fails the run) and the releases, with
 * 1, 2, 4 and 1024 ("unlimited") slots per device, --reps repetitions (default 3) interleaved:
 * wall, jobs/s, input GB/s, p50 and p95 latency from wanting the lease to releasing it, p95 of
 * the time held, jobs per device.
 *
 * Part of gpuarr-bench's one translation unit: gpuarr-bench.c includes it once, after
 * bench_common.h. */

/* ---------------------------------------------------------------------------------------------
 * --leases: what a lease costs, alone, across processes, and with 8 threads on 2 devices
 * ------------------------------------------------------------------------------------------- */
/* The p-th percentile (0..1, nearest rank) of v; sorts v. */
static double percentile(double *v, int n, double p) {
    qsort(v, (size_t)n, sizeof *v, compare_doubles);
    int k = (int)ceil(p * n) - 1;
    return v[k < 0 ? 0 : k >= n ? n - 1 : k];
}

static double lease_now_ns(void) { return now_s() * 1e9; }

/* A fresh folder for slot files, so that no other program's leases (or an earlier run's files)
   are counted; lease_dir_remove deletes it and what the library left in it. */
static void lease_dir_make(char *dir, size_t size) {
    snprintf(dir, size, "/tmp/gpuarr-bench-leases-XXXXXX");
    if (!mkdtemp(dir)) {
        fprintf(stderr, "gpuarr-bench: mkdtemp %s failed\n", dir);
        exit(1);
    }
}

static void lease_dir_remove(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    char path[600];
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        unlink(path);
    }
    closedir(d);
    rmdir(dir);
}

/* The library restarted with GPUARR_LEASE_DIR = dir ("off": per process). The folder is read at
   gpuarr_init only, so changing it takes a shutdown and an init (main's reference is the one
   dropped and taken again: the count stays 1). */
static void lease_restart(const char *dir) {
    gpuarr_shutdown();
    setenv("GPUARR_LEASE_DIR", dir, 1);
    if (gpuarr_init(NULL) != GPUARR_OK) die("gpuarr_init (GPUARR_LEASE_DIR)");
}

typedef struct lease_row {
    const char *what, *where;
    double *ns; /* one sample per pair, every round pooled */
    int n;
} lease_row;

static void lease_row_print(lease_row *r) {
    double med = percentile(r->ns, r->n, 0.5), p95 = percentile(r->ns, r->n, 0.95);
    printf("| %s | %s | %.0f | %.0f | %.0f | %d |\n", r->what, r->where, med, p95, r->ns[r->n - 1], r->n);
}

enum { LEASE_PAIRS = 2000, LEASE_ROUNDS = 3 };

/* n acquire(timeout 0)+release pairs on spec, each timed alone, appended to row. The default
   placement reads each open candidate's free memory (the host's: /proc/meminfo); ROUND_ROBIN
   reads none, which shows what that read costs. */
static void lease_time_pairs(const char *spec, gpuarr_placement placement, int n, lease_row *row) {
    gpuarr_lease_desc ld;
    memset(&ld, 0, sizeof ld);
    ld.devices = spec;
    ld.placement = placement;
    for (int i = -100; i < n; i++) { /* 100 untimed first: the folder and its files made, caches warm */
        gpuarr_lease l;
        double t0 = lease_now_ns();
        if (gpuarr_lease_acquire(&ld, &l) != GPUARR_OK) die("gpuarr_lease_acquire");
        if (gpuarr_lease_release(l) != GPUARR_OK) die("gpuarr_lease_release");
        double t = lease_now_ns() - t0;
        if (i >= 0) row->ns[row->n++] = t;
    }
}

/* The floor under every per-pair figure: two clock reads with nothing between them. */
static void lease_time_clock(int n, lease_row *row) {
    for (int i = 0; i < n; i++) {
        double t0 = lease_now_ns();
        row->ns[row->n++] = lease_now_ns() - t0;
    }
}

/* What the per-process path is built on: an uncontended mutex. */
static void lease_time_mutex(int n, lease_row *row) {
    pthread_mutex_t m = PTHREAD_MUTEX_INITIALIZER;
    for (int i = 0; i < n; i++) {
        double t0 = lease_now_ns();
        pthread_mutex_lock(&m);
        pthread_mutex_unlock(&m);
        row->ns[row->n++] = lease_now_ns() - t0;
    }
    pthread_mutex_destroy(&m);
}

/* What one slot costs the OS: the file opened, locked, unlocked and closed, as a lease does (it
   also writes its holder's line into the file, which this does not). */
static void lease_time_flock(const char *dir, int n, lease_row *row) {
    char path[600];
    snprintf(path, sizeof path, "%s/raw-baseline.slot", dir);
    for (int i = -100; i < n; i++) {
        double t0 = lease_now_ns();
        int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
        if (fd < 0 || flock(fd, LOCK_EX | LOCK_NB) != 0 || flock(fd, LOCK_UN) != 0) {
            fprintf(stderr, "gpuarr-bench: open+flock %s failed\n", path);
            exit(1);
        }
        close(fd);
        double t = lease_now_ns() - t0;
        if (i >= 0) row->ns[row->n++] = t;
    }
    unlink(path);
}

/* The raw slot again, with what a lease adds to it (gpuarr__lease_file_write): the holder's
   line, padded to 192 bytes and written with one pwrite at the take (the host and program names
   are read once per process, here before the loop); the release only closes. */
static void lease_time_flock_line(const char *dir, int n, lease_row *row) {
    char path[600], host[64] = "?", comm[64] = "?", line[193];
    snprintf(path, sizeof path, "%s/raw-baseline-line.slot", dir);
    if (gethostname(host, sizeof host - 1) != 0) host[0] = 0;
    host[sizeof host - 1] = 0;
    FILE *f = fopen("/proc/self/comm", "r");
    if (f) {
        if (!fgets(comm, sizeof comm, f)) comm[0] = 0;
        comm[strcspn(comm, "\n")] = 0;
        fclose(f);
    }
    for (int i = -100; i < n; i++) {
        double t0 = lease_now_ns();
        int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
        if (fd < 0 || flock(fd, LOCK_EX | LOCK_NB) != 0) {
            fprintf(stderr, "gpuarr-bench: open+flock %s failed\n", path);
            exit(1);
        }
        int len = snprintf(line, sizeof line, "pid %ld host %s program %s since %lld", (long)getpid(), host, comm, (long long)time(NULL));
        size_t used = len < 0 ? 0 : (size_t)len < 191 ? (size_t)len : 191;
        memset(line + used, ' ', 191 - used);
        line[191] = '\n';
        if (pwrite(fd, line, 192, 0) != 192 || flock(fd, LOCK_UN) != 0) {
            fprintf(stderr, "gpuarr-bench: writing %s failed\n", path);
            exit(1);
        }
        close(fd);
        double t = lease_now_ns() - t0;
        if (i >= 0) row->ns[row->n++] = t;
    }
    unlink(path);
}

/* a. One process: each setting in LEASE_ROUNDS rounds (the library restarted for each folder
   setting in every round, so that neither setting always runs first), samples pooled. */
static void bench_lease_latency(bool have_opencl) {
    enum { ROWS = 10 };
    lease_row rows[ROWS] = {{"two clock reads, nothing between (timer floor)", "-", NULL, 0},
                            {"pthread_mutex lock + unlock, uncontended", "-", NULL, 0},
                            {"gpuarr_lease_acquire + release, host", "off (per process)", NULL, 0},
                            {"gpuarr_lease_acquire + release, host, placement ROUND_ROBIN (no free-memory read)", "off (per process)", NULL, 0},
                            {"gpuarr_lease_acquire + release, opencl:0", "off (per process)", NULL, 0},
                            {"raw: open + flock(EX\\|NB) + flock(UN) + close", "folder", NULL, 0},
                            {"raw, plus the holder's line (one pwrite of 192 bytes)", "folder", NULL, 0},
                            {"gpuarr_lease_acquire + release, host", "folder (flock'ed files)", NULL, 0},
                            {"gpuarr_lease_acquire + release, host, placement ROUND_ROBIN (no free-memory read)", "folder (flock'ed files)", NULL, 0},
                            {"gpuarr_lease_acquire + release, opencl:0", "folder (flock'ed files)", NULL, 0}};
    for (int i = 0; i < ROWS; i++)
        if (!(rows[i].ns = (double *)malloc(sizeof(double) * LEASE_PAIRS * LEASE_ROUNDS))) die("malloc");
    char dir[64];
    lease_dir_make(dir, sizeof dir);
    for (int r = 0; r < LEASE_ROUNDS; r++) {
        for (int k = 0; k < 2; k++) {
            bool files = (r + k) & 1;
            lease_restart(files ? dir : "off");
            int at = files ? 7 : 2; /* this setting's three lease rows */
            if (!files) {
                lease_time_clock(LEASE_PAIRS, &rows[0]);
                lease_time_mutex(LEASE_PAIRS, &rows[1]);
            } else {
                lease_time_flock(dir, LEASE_PAIRS, &rows[5]);
                lease_time_flock_line(dir, LEASE_PAIRS, &rows[6]);
            }
            lease_time_pairs("host", GPUARR_PLACE_DEFAULT, LEASE_PAIRS, &rows[at]);
            lease_time_pairs("host", GPUARR_PLACE_ROUND_ROBIN, LEASE_PAIRS, &rows[at + 1]);
            if (have_opencl) lease_time_pairs("opencl:0", GPUARR_PLACE_DEFAULT, LEASE_PAIRS, &rows[at + 2]);
        }
    }
    printf("### Acquire + release, one process, uncontended (timeout 0)\n\n"
           "%d rounds x %d pairs per row, each pair timed alone (two clock reads around it: the first row is that floor); "
           "GPUARR_LEASE_DIR=off and a fresh folder (%s) alternate, the library restarted for each; ns per pair.\n\n",
           LEASE_ROUNDS, LEASE_PAIRS, dir);
    printf("| operation | lease folder | median ns | p95 ns | max ns | pairs |\n|---|---|---|---|---|---|\n");
    for (int i = 0; i < ROWS; i++) {
        if (rows[i].n) lease_row_print(&rows[i]);
        free(rows[i].ns);
    }
    if (!have_opencl) printf("\nopencl:0 rows left out: no OpenCL device.\n");
    lease_dir_remove(dir);
}

/* b. Across processes: `--lease-peer N HOLD_US PAUSE_US START` runs in a fresh process (exec'd,
   so it inits on its own, as two programs would), GPUARR_LEASE_DIR and GPUARR_SLOTS=host=1 set by
   the parent: at wall-clock time START it does N pairs of acquire(host, timeout -1), HOLD_US of
   holding, release, PAUSE_US of pause; prints its wall time, then each acquire's ns. */
static void lease_sleep_us(long us) {
    if (us <= 0) return;
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    nanosleep(&ts, NULL);
}

static double wall_clock_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int lease_peer(int n, long hold_us, long pause_us, double start) {
    if (n < 1 || gpuarr_init(NULL) != GPUARR_OK) die("lease peer: gpuarr_init");
    double *ns = (double *)malloc(sizeof(double) * (size_t)n);
    if (!ns) die("malloc");
    gpuarr_lease_desc ld;
    memset(&ld, 0, sizeof ld);
    ld.devices = "host";
    ld.timeout_ms = -1;
    bool late = wall_clock_s() > start;
    while (wall_clock_s() < start) lease_sleep_us(100);
    double t0 = now_s();
    for (int i = 0; i < n; i++) {
        gpuarr_lease l;
        double a = lease_now_ns();
        if (gpuarr_lease_acquire(&ld, &l) != GPUARR_OK) die("lease peer: gpuarr_lease_acquire");
        ns[i] = lease_now_ns() - a;
        lease_sleep_us(hold_us);
        if (gpuarr_lease_release(l) != GPUARR_OK) die("lease peer: gpuarr_lease_release");
        lease_sleep_us(pause_us);
    }
    printf("%.6f %d\n", now_s() - t0, late);
    for (int i = 0; i < n; i++) printf("%.0f\n", ns[i]);
    free(ns);
    gpuarr_shutdown();
    return 0;
}

typedef struct lease_peer_run {
    int procs, n;
    long hold_us, pause_us;
    double wall_s[2], *ns; /* procs * n acquire times */
    bool late;
} lease_peer_run;

/* Starts procs peers on one folder, all at the same wall-clock time (1.5 s ahead: long enough
   for exec and init), and gathers their figures. popen spawns them, so nothing of this process
   (PoCL's threads, the library) is forked into them. */
static void lease_peers(const char *self, const char *dir, lease_peer_run *pr) {
    FILE *p[2];
    char cmd[1024];
    double start = wall_clock_s() + 1.5;
    for (int k = 0; k < pr->procs; k++) {
        snprintf(cmd, sizeof cmd, "GPUARR_DEVICES=host GPUARR_SLOTS=host=1 GPUARR_LEASE_DIR='%s' '%s' --lease-peer %d %ld %ld %.6f", dir, self,
                 pr->n, pr->hold_us, pr->pause_us, start);
        if (!(p[k] = popen(cmd, "r"))) die("popen (lease peer)");
    }
    pr->late = false;
    for (int k = 0; k < pr->procs; k++) {
        int late = 0;
        if (fscanf(p[k], "%lf %d", &pr->wall_s[k], &late) != 2) die("lease peer output");
        pr->late |= late != 0;
        for (int i = 0; i < pr->n; i++)
            if (fscanf(p[k], "%lf", &pr->ns[k * pr->n + i]) != 1) die("lease peer output");
        if (pclose(p[k]) != 0) die("lease peer exit");
    }
}

static void lease_peer_row(const char *self, const char *dir, int procs, int n, long hold_us, long pause_us) {
    lease_peer_run pr = {procs, n, hold_us, pause_us, {0, 0}, NULL, false};
    if (!(pr.ns = (double *)malloc(sizeof(double) * (size_t)(procs * n)))) die("malloc");
    lease_peers(self, dir, &pr);
    int total = procs * n, waited = 0;
    double wall = pr.wall_s[0] > pr.wall_s[procs - 1] ? pr.wall_s[0] : pr.wall_s[procs - 1];
    for (int i = 0; i < total; i++) waited += pr.ns[i] > 1e6;
    double med = percentile(pr.ns, total, 0.5), p95 = percentile(pr.ns, total, 0.95), max = pr.ns[total - 1];
    printf("| %d | %d | %ld / %ld | %.3f", procs, n, hold_us, pause_us, pr.wall_s[0]);
    if (procs > 1) printf(" / %.3f", pr.wall_s[1]);
    printf(" | %.0f | %.0f | %.0f | %.0f | %d of %d |%s\n", total / wall, med, p95, max, waited, total,
           pr.late ? " a peer started late" : "");
    free(pr.ns);
}

static void bench_lease_procs(const char *self) {
    char dir[64];
    lease_dir_make(dir, sizeof dir);
    printf("\n### Across processes: 1 slot on the host, shared through one folder\n\n"
           "Peers are fresh processes (exec'd, each with its own gpuarr_init; GPUARR_DEVICES=host GPUARR_SLOTS=host=1 "
           "GPUARR_LEASE_DIR=%s), started at one wall-clock time. Each does N pairs of acquire (timeout -1) + hold + release + pause. "
           "1 process is the uncontended baseline of the same run. A waiter in another process polls every 25 ms (see LEASES).\n\n",
           dir);
    printf("| processes | pairs each | hold / pause us | wall s (each) | pairs/s, total | acquire median ns | p95 ns | max ns | "
           "acquires > 1 ms |\n|---|---|---|---|---|---|---|---|---|\n");
    lease_peer_row(self, dir, 1, 2000, 0, 0);
    lease_peer_row(self, dir, 2, 2000, 0, 0);
    lease_peer_row(self, dir, 1, 100, 1000, 1000);
    lease_peer_row(self, dir, 2, 100, 1000, 1000);
    lease_dir_remove(dir);
}

/* c. Oversubscription: workers take jobs from one counter; each job is a lease on "opencl:*", a
   1 MiB f32 upload, a cast on the device (f64 for even jobs, f16 for odd), the download, and the
   releases. Latency runs from wanting the lease to having released it (waiting included); held
   is the lease's own time. */
enum { LEASE_WORKERS = 8, LEASE_JOB_FLOATS = 1 << 18, LEASE_MAX_DEVS = 8 };

typedef struct lease_batch {
    const float *src;
    int jobs;
    atomic_int next, failed;
    double *latency_ns, *held_ns;
    atomic_int per_dev[LEASE_MAX_DEVS];
} lease_batch;

/* A few elements of the result against the host's own conversion of the source. */
static bool lease_job_check(const float *src, gpuarr_dtype t, const void *out) {
    static const int idx[4] = {0, 1, LEASE_JOB_FLOATS / 2 + 7, LEASE_JOB_FLOATS - 1};
    for (int k = 0; k < 4; k++) {
        int i = idx[k];
        if (t == GPUARR_F64 && ((const double *)out)[i] != (double)src[i]) return false;
        if (t == GPUARR_F16 && ((const gpuarr_f16 *)out)[i].bits != gpuarr_f16_from_float(src[i]).bits) return false;
    }
    return true;
}

/* The work under the lease; false (with the reason on stderr) when a call fails or the check does. */
static bool lease_job_work(gpuarr_device dev, const float *src, gpuarr_dtype t, void *out) {
    int64_t shape[1] = {LEASE_JOB_FLOATS};
    gpuarr_array a = {0}, b = {0};
    bool ok = gpuarr_from_host_as(dev, GPUARR_F32, src, 1, shape, &a) == GPUARR_OK && gpuarr_convert(a, dev, t, &b) == GPUARR_OK &&
              gpuarr_to_host_as(b, t, out, LEASE_JOB_FLOATS) == GPUARR_OK;
    if (!ok) fprintf(stderr, "gpuarr-bench: lease job: %s\n", gpuarr_last_error());
    else if (!(ok = lease_job_check(src, t, out))) fprintf(stderr, "gpuarr-bench: lease job: wrong %s result\n", gpuarr_dtype_name(t));
    if (a.id) gpuarr_release(a);
    if (b.id) gpuarr_release(b);
    return ok;
}

static void *lease_worker(void *arg) {
    lease_batch *b = (lease_batch *)arg;
    void *out = malloc(sizeof(double) * LEASE_JOB_FLOATS);
    gpuarr_lease_desc ld;
    memset(&ld, 0, sizeof ld);
    ld.devices = "opencl:*";
    ld.timeout_ms = -1;
    for (int j; out && (j = atomic_fetch_add(&b->next, 1)) < b->jobs;) {
        gpuarr_lease l;
        gpuarr_device dev;
        double want = lease_now_ns();
        if (gpuarr_lease_acquire(&ld, &l) != GPUARR_OK || gpuarr_lease_device(l, &dev) != GPUARR_OK) {
            fprintf(stderr, "gpuarr-bench: lease job: %s\n", gpuarr_last_error());
            atomic_fetch_add(&b->failed, 1);
            continue;
        }
        double got = lease_now_ns();
        if (!lease_job_work(dev, b->src, j % 2 ? GPUARR_F16 : GPUARR_F64, out)) atomic_fetch_add(&b->failed, 1);
        gpuarr_device_info info;
        if (gpuarr_device_get_info(dev, &info) == GPUARR_OK && info.index >= 0 && info.index < LEASE_MAX_DEVS)
            atomic_fetch_add(&b->per_dev[info.index], 1);
        gpuarr_lease_release(l);
        double done = lease_now_ns();
        b->latency_ns[j] = done - want;
        b->held_ns[j] = done - got;
    }
    free(out);
    return NULL;
}

typedef struct lease_rep {
    double wall_s, p50_ms, p95_ms, held_p95_ms;
    int per_dev[LEASE_MAX_DEVS];
} lease_rep;

/* One batch with `slots` on each OpenCL device. */
static lease_rep lease_batch_run(const float *src, int jobs, int slots, int ndev) {
    for (int d = 0; d < ndev; d++) {
        gpuarr_device dev;
        char spec[32];
        snprintf(spec, sizeof spec, "opencl:%d", d);
        if (gpuarr_device_find(spec, &dev) != GPUARR_OK || gpuarr_device_set_slots(dev, slots) != GPUARR_OK) die("gpuarr_device_set_slots");
    }
    lease_batch b;
    memset(&b, 0, sizeof b);
    b.src = src;
    b.jobs = jobs;
    b.latency_ns = (double *)malloc(sizeof(double) * (size_t)jobs);
    b.held_ns = (double *)malloc(sizeof(double) * (size_t)jobs);
    if (!b.latency_ns || !b.held_ns) die("malloc");
    pthread_t th[LEASE_WORKERS];
    double t0 = now_s();
    for (int i = 0; i < LEASE_WORKERS; i++)
        if (pthread_create(&th[i], NULL, lease_worker, &b) != 0) die("pthread_create");
    for (int i = 0; i < LEASE_WORKERS; i++) pthread_join(th[i], NULL);
    lease_rep r;
    r.wall_s = now_s() - t0;
    if (atomic_load(&b.failed)) {
        fprintf(stderr, "gpuarr-bench: --leases: %d of %d jobs failed (slots %d)\n", atomic_load(&b.failed), jobs, slots);
        exit(1);
    }
    r.p50_ms = percentile(b.latency_ns, jobs, 0.5) * 1e-6;
    r.p95_ms = percentile(b.latency_ns, jobs, 0.95) * 1e-6;
    r.held_p95_ms = percentile(b.held_ns, jobs, 0.95) * 1e-6;
    for (int d = 0; d < LEASE_MAX_DEVS; d++) r.per_dev[d] = atomic_load(&b.per_dev[d]);
    free(b.latency_ns);
    free(b.held_ns);
    return r;
}

static int compare_reps(const void *a, const void *b) {
    double x = ((const lease_rep *)a)->wall_s, y = ((const lease_rep *)b)->wall_s;
    return x < y ? -1 : x > y;
}

static void lease_oversub_print(int slots, lease_rep *reps, int nrep, int jobs, int ndev) {
    qsort(reps, (size_t)nrep, sizeof *reps, compare_reps);
    const lease_rep *m = &reps[nrep / 2];
    char label[32], spread[160] = "", split[64] = "";
    snprintf(label, sizeof label, slots >= 1024 ? "unlimited (%d)" : "%d", slots);
    for (int i = 0; i < nrep; i++)
        snprintf(spread + strlen(spread), sizeof spread - strlen(spread), "%s%.3f", i ? " / " : "", reps[i].wall_s);
    for (int d = 0; d < ndev; d++)
        snprintf(split + strlen(split), sizeof split - strlen(split), "%s%d", d ? " / " : "", m->per_dev[d]);
    double gb = (double)jobs * LEASE_JOB_FLOATS * 4 / 1e9;
    printf("| %s | %.3f | %s | %.0f | %.3f | %.1f | %.1f | %.1f | %s |\n", label, m->wall_s, spread, jobs / m->wall_s, gb / m->wall_s,
           m->p50_ms, m->p95_ms, m->held_p95_ms, split);
}

/* The number of OpenCL devices present (opencl:0, 1, ... until one is missing). */
static int lease_opencl_count(void) {
    int n = 0;
    char spec[32];
    for (;; n++) {
        gpuarr_device d;
        snprintf(spec, sizeof spec, "opencl:%d", n);
        if (gpuarr_device_find(spec, &d) != GPUARR_OK) return n;
    }
}

static void bench_lease_oversub(int jobs, int nrep) {
    enum { SETTINGS = 4 };
    static const int slot_settings[SETTINGS] = {1, 2, 4, 1024};
    int ndev = lease_opencl_count();
    printf("\n### Oversubscription: %d workers, candidates \"opencl:*\", %d jobs per batch\n\n", LEASE_WORKERS, jobs);
    if (ndev != 2) printf("**%d OpenCL devices here, not the 2 this section is meant for** (POCL_DEVICES=\"pthread pthread\" gives 2).\n\n", ndev);
    if (ndev == 0) return;
    if (ndev > LEASE_MAX_DEVS) ndev = LEASE_MAX_DEVS;
    char dir[64];
    lease_dir_make(dir, sizeof dir);
    lease_restart(dir);
    float *src = (float *)malloc(sizeof(float) * LEASE_JOB_FLOATS);
    if (!src) die("malloc");
    fill_source(src, GPUARR_F32, LEASE_JOB_FLOATS);
    lease_batch_run(src, 4 * ndev, 1024, ndev); /* untimed: kernels built, pools and caches warm */
    lease_rep reps[SETTINGS][16];
    for (int r = 0; r < nrep; r++) /* settings interleaved, so that a noisy spell hits them all */
        for (int s = 0; s < SETTINGS; s++) reps[s][r] = lease_batch_run(src, jobs, slot_settings[s], ndev);
    printf("Each job: gpuarr_lease_acquire (timeout -1) on \"opencl:*\", gpuarr_from_host_as of 1 MiB of f32 onto the leased device, "
           "gpuarr_convert on it to f64 (even jobs) or f16 (odd), gpuarr_to_host_as back, 4 elements checked against the host's "
           "conversion, releases. Slots set by gpuarr_device_set_slots on each device; slot files in a fresh folder (%s). "
           "%d repetitions per setting, settings interleaved; the row is the median repetition by wall time. "
           "Latency: from wanting the lease to having released it (waiting included); held: the lease's own time. "
           "GB/s: input bytes (%d MiB per batch) / wall.\n\n",
           dir, nrep, jobs);
    printf("| slots per device | wall s | wall s, every rep (sorted) | jobs/s | GB/s in | job p50 ms | job p95 ms | held p95 ms | "
           "jobs per device |\n|---|---|---|---|---|---|---|---|---|\n");
    for (int s = 0; s < SETTINGS; s++) lease_oversub_print(slot_settings[s], reps[s], nrep, jobs, ndev);
    free(src);
    lease_dir_remove(dir);
}

static void bench_leases(const char *self, int jobs, int nrep) {
    char *saved = getenv("GPUARR_LEASE_DIR") ? strdup(getenv("GPUARR_LEASE_DIR")) : NULL;
    bool have_opencl = lease_opencl_count() > 0;
    bench_lease_latency(have_opencl);
    bench_lease_procs(self);
    bench_lease_oversub(jobs, nrep);
    gpuarr_shutdown();
    if (saved) setenv("GPUARR_LEASE_DIR", saved, 1);
    else unsetenv("GPUARR_LEASE_DIR");
    free(saved);
    if (gpuarr_init(NULL) != GPUARR_OK) die("gpuarr_init");
}
