/*
 * gpuarr_lease.h -- device leases and plans (the manual's LEASES section), a layer on the core:
 * included by the implementation of gpuarr.h after the core (and the local rank layer, whose
 * "local" specs its candidate lists take), so it uses the core's internals; registers in
 * gpuarr__layer_list.
 *
 * Slots are counted per physical device: a GPU seen through CUDA and OpenCL (info.same_as) has
 * one count, kept at the registry index of the view that represents it (gpuarr__is_duplicate's
 * rule: CUDA before OpenCL). A lease remembers the view its candidates named.
 *
 * One lock guards everything here; it is a leaf but for the device memory reads of placement
 * (mem_info, and the pool's lock), which never call back into leases. Waiters queue in arrival
 * order: a waiter may take a slot of device p only when no waiter ahead of it also wants p, so
 * slots of each device are handed out first come, first served, and a waiter for a busy device
 * never holds up one for a free device.
 *
 * Across processes (GPUARR_LEASE_DIR, unless off): slot k of a physical device is the file
 * <dir>/<key>.<k>.slot, key = its UUID, else its PCI address, else host name and spec. A lease
 * holds an flock on one file per slot (opened O_CLOEXEC; a fork handler closes them in the child),
 * so the kernel frees the slot the moment its holder dies. The file says who holds it. Other
 * processes' releases are not announced: a waiter looks again every 25 ms.
 */
#ifndef GPUARR_LEASE_INCLUDED
#define GPUARR_LEASE_INCLUDED

#include <sys/file.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <fcntl.h>

#define GPUARR__LEASE_MAX_SLOTS 65536
#define GPUARR__LEASE_MAX_RECS 65535u /* index + 1 fits the id's low 16 bits */
#define GPUARR__LEASE_KEY_MAX 127

typedef struct gpuarr__lease_rec {
    uint16_t gen;   /* the id's high 16 bits; moves on at each release */
    bool live;
    int view, phys; /* registry indices: the device leased, and the one its slots count at */
    int slots;
    char affinity[GPUARR__LEASE_KEY_MAX + 1]; /* "" = none */
    long pid, tid;  /* the holder, for messages */
    double since_ms;
    int *fds;       /* the locked slot files (across processes), nfds of them; -1 = closed */
    int nfds;
} gpuarr__lease_rec;

typedef struct gpuarr__lease_waiter {
    struct gpuarr__lease_waiter *next;
    const bool *wants; /* by registry index: the physical devices it could take */
} gpuarr__lease_waiter;

typedef struct gpuarr__lease_state {
    pthread_mutex_t lock;
    pthread_cond_t freed; /* broadcast when slots free up, slots grow or a waiter leaves */
    int *total, *in_use;  /* by registry index; used at physical indices only */
    gpuarr__lease_rec *recs;
    uint32_t rec_count, rec_cap;
    gpuarr__lease_waiter *head, *tail;
    int last_view; /* round robin: the registry index leased last, -1 = none */
    int plan_last; /* round robin of gpuarr_plan: the physical device its last plan chose first */
    char dir[512];           /* GPUARR_LEASE_DIR resolved; "" = leases are per process */
    bool dir_made;           /* dir_fd is open (at the first acquire, or the first look at the files) */
    int dir_fd;              /* dir, opened and checked once (gpuarr__dir_open) */
    bool dir_shared;         /* dir is a sticky folder shared with other users: their files are used */
    char (*keys)[128];       /* by registry index: the slot files' name stem */
    char identity[160];      /* "host H program NAME" for the slot files; "" = not read yet */
} gpuarr__lease_state;
static void gpuarr__lease_layer(gpuarr__layer *l);
/* The layer's state (gpuarr__layer_state): NULL outside its start and stop. */
static gpuarr__lease_state *gpuarr__lease_st(void) { return (gpuarr__lease_state *)gpuarr__layer_state(gpuarr__lease_layer); }

/* ---------------------------------------------------------------------------------------------
 * Slots per device: the defaults, then GPUARR_SLOTS or desc.slots
 * ------------------------------------------------------------------------------------------- */
/* The registry index where d's slots are counted. */
static int gpuarr__lease_phys(int index) {
    const gpuarr__dev *d = &gpuarr__g.devices[index];
    return gpuarr__is_duplicate(d) ? (int)(d->info.same_as.id & 0xffffu) - 1 : index;
}

/* One "<device>=<slots>" item: <device> is host, cpu, <backend>, <backend>:* or <backend>:N. */
static bool gpuarr__slots_item(const char *p, size_t len, gpuarr_backend *b, int *index, int *slots) {
    const char *eq = (const char *)memchr(p, '=', len);
    if (!eq) return false;
    size_t n = (size_t)(eq - p);
    long v;
    if (!gpuarr__parse_uint(eq + 1, len - n - 1, GPUARR__LEASE_MAX_SLOTS, &v) || v < 1) return false;
    *slots = (int)v;
    if (n == 3 && strncmp(p, "cpu", 3) == 0) {
        *b = GPUARR_BACKEND_HOST;
        *index = -1;
        return true;
    }
    return gpuarr__parse_backend_spec(p, n, true, b, index);
}

/* Calls fn for each item of a GPUARR_SLOTS text; false at the first malformed one (*bad, *bad_len). */
static bool gpuarr__slots_each(const char *text, void (*fn)(gpuarr_backend, int, int), const char **bad, size_t *bad_len) {
    for (const char *p = text;;) {
        size_t len = strcspn(p, ",");
        while (len && p[0] == ' ') p++, len--;
        while (len && p[len - 1] == ' ') len--;
        gpuarr_backend b;
        int index, slots;
        if (!gpuarr__slots_item(p, len, &b, &index, &slots)) {
            *bad = p;
            *bad_len = len;
            return false;
        }
        if (fn) fn(b, index, slots);
        p += strcspn(p, ",");
        if (!*p) return true;
        p++;
    }
}

static gpuarr_result gpuarr__check_slots(const char *name, const char *value, int *out) {
    const char *bad;
    size_t bad_len;
    *out = 0;
    if (gpuarr__slots_each(value, NULL, &bad, &bad_len)) return GPUARR_OK;
    return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT,
                        "%s=\"%s\": item \"%.*s\" is not <device>=<slots> (device: host, cuda, cuda:*, cuda:N, opencl, "
                        "opencl:*, opencl:N; slots 1..%d)",
                        name, value, (int)bad_len, bad, GPUARR__LEASE_MAX_SLOTS);
}

static void gpuarr__slots_apply(gpuarr_backend b, int index, int slots) {
    bool any = false;
    for (int i = 0; i < gpuarr__g.device_count; i++) {
        const gpuarr_device_info *in = &gpuarr__g.devices[i].info;
        if (in->backend != b || (index >= 0 && in->index != index)) continue;
        gpuarr__lease_st()->total[gpuarr__lease_phys(i)] = slots;
        any = true;
    }
    if (!any)
        gpuarr__log(GPUARR_LOG_INFO, "slots: no %s device%s%.0d here; its item is ignored", gpuarr__backend_names[b],
                    index >= 0 ? " " : "", index >= 0 ? index : 0);
}

/* Every device but the host: ceil(online CPUs / devices other than the host, each physical device
   counted once); the host: the online CPUs. */
static void gpuarr__slots_defaults(void) {
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    if (cpus < 1) cpus = 1;
    if (cpus > GPUARR__LEASE_MAX_SLOTS) cpus = GPUARR__LEASE_MAX_SLOTS;
    int devices = 0;
    for (int i = 1; i < gpuarr__g.device_count; i++) devices += gpuarr__lease_phys(i) == i;
    int per_device = devices ? (int)((cpus + devices - 1) / devices) : 1;
    for (int i = 0; i < gpuarr__g.device_count; i++) gpuarr__lease_st()->total[i] = i == 0 ? (int)cpus : per_device;
}

static long gpuarr__lease_tid(void) {
#ifdef SYS_gettid
    return (long)syscall(SYS_gettid);
#else
    return 0;
#endif
}

/* ---------------------------------------------------------------------------------------------
 * Slot files (across processes)
 * ------------------------------------------------------------------------------------------- */
static gpuarr_result gpuarr__check_lease_dir(const char *name, const char *value, int *out) {
    *out = !gpuarr__streq_nocase(value, "off");
    if (!*out || value[0] == '/') return GPUARR_OK;
    return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "%s=\"%s\": an absolute path, or off", name, value);
}

/* A forked child must not keep its parent's slots alive: it closes its copies of their files
   (the parent's locks stay: they belong to the parent's open files as well). No lock is taken: the
   child has one thread, and a lock another thread held at the fork would stay held. */
static void gpuarr__lease_atfork_child(void) {
    gpuarr__lease_state *ls = gpuarr__lease_st();
    if (!ls) return;
    for (uint32_t i = 0; i < ls->rec_count; i++) {
        gpuarr__lease_rec *r = &ls->recs[i];
        for (int k = 0; k < r->nfds; k++)
            if (r->fds[k] >= 0) close(r->fds[k]), r->fds[k] = -1;
    }
}

/* The name stem of a device's slot files: its UUID, else its PCI address, else host and spec. */
static void gpuarr__lease_key(const gpuarr_device_info *in, char *out, size_t cap) {
    if (in->has_uuid) {
        const uint8_t *u = in->uuid;
        snprintf(out, cap, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0], u[1], u[2], u[3], u[4], u[5],
                 u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
        return;
    }
    if (in->has_pci) {
        snprintf(out, cap, "pci-%04x:%02x:%02x.%x", (unsigned)in->pci_domain, (unsigned)in->pci_bus, (unsigned)in->pci_device,
                 (unsigned)in->pci_function);
        return;
    }
    char host[64] = "localhost";
    if (gethostname(host, sizeof host - 1) != 0) gpuarr__copy_string(host, sizeof host, "localhost");
    host[sizeof host - 1] = '\0';
    snprintf(out, cap, "%s-%s", host, in->spec);
    for (char *c = out; *c; c++)
        if (*c == ':' || *c == '/') *c = '-';
}

static gpuarr_result gpuarr__lease_files_start(void) {
    gpuarr__lease_state *ls = gpuarr__lease_st();
    const char *dir = gpuarr__setting(GPUARR__SET_LEASE_DIR), *xdg = gpuarr__env("XDG_RUNTIME_DIR", GPUARR__ENV_IGNORED);
    if (dir && !gpuarr__setting_value(GPUARR__SET_LEASE_DIR, 1)) return GPUARR_OK; /* off */
    if (dir) gpuarr__copy_string(ls->dir, sizeof ls->dir, dir);
    else if (xdg && xdg[0] == '/') snprintf(ls->dir, sizeof ls->dir, "%.480s/gpuarr", xdg);
    else snprintf(ls->dir, sizeof ls->dir, "/tmp/gpuarr-%lu", (unsigned long)geteuid());
    ls->keys = (char (*)[128])gpuarr__calloc(sizeof *ls->keys * (size_t)gpuarr__g.device_count);
    if (!ls->keys) return gpuarr__fail(GPUARR_ERROR_OUT_OF_MEMORY, "no host memory for the lease files' names");
    for (int i = 0; i < gpuarr__g.device_count; i++) gpuarr__lease_key(&gpuarr__g.devices[i].info, ls->keys[i], sizeof ls->keys[i]);
    if (!gpuarr__g.lease_atfork && pthread_atfork(NULL, NULL, gpuarr__lease_atfork_child) == 0) gpuarr__g.lease_atfork = true;
    return GPUARR_OK;
}

/* A slot file's name in the folder. */
static void gpuarr__lease_name(int phys, int k, char *out, size_t cap) {
    snprintf(out, cap, "%s.%d.slot", gpuarr__lease_st()->keys[phys], k);
}

/* Opens the folder once (lock held), made first when make: only a folder of this user that no one
   else can write, or a sticky one of this user or root (shared on purpose; see LEASES). Without
   make, a missing folder is not an error: *found says whether it is open. */
static gpuarr_result gpuarr__lease_dir_open(bool make, bool *found) {
    gpuarr__lease_state *ls = gpuarr__lease_st();
    *found = ls->dir_made;
    if (ls->dir_made) return GPUARR_OK;
    char why[160];
    int fd = gpuarr__dir_open(ls->dir, (make ? GPUARR__DIR_MAKE : 0u) | GPUARR__DIR_SHARED, &ls->dir_shared, why, sizeof why);
    if (fd < 0 && !make && errno == ENOENT) return GPUARR_OK;
    if (fd < 0)
        return gpuarr__fail(GPUARR_ERROR_BACKEND, "the lease folder %s %s: not used (GPUARR_LEASE_DIR sets another, off none)", ls->dir,
                            why);
    ls->dir_fd = fd;
    ls->dir_made = *found = true;
    return GPUARR_OK;
}

/* Makes the folder at the first acquire (lock held). */
static gpuarr_result gpuarr__lease_dir_make(void) {
    bool found;
    return gpuarr__lease_dir_open(true, &found);
}

/* Who this process is, for its slot files: the host and program names, read once (at the first
   acquire that writes a file; a /proc read costs more than the rest of a lease). Lock held. */
static const char *gpuarr__lease_identity(void) {
    gpuarr__lease_state *ls = gpuarr__lease_st();
    if (ls->identity[0]) return ls->identity;
    char host[64] = "?", comm[64] = "?";
    if (gethostname(host, sizeof host - 1) != 0) host[0] = '?', host[1] = '\0';
    host[sizeof host - 1] = '\0';
    FILE *f = fopen("/proc/self/comm", "r");
    if (f) {
        if (fgets(comm, sizeof comm, f)) comm[strcspn(comm, "\n")] = '\0';
        fclose(f);
    }
    snprintf(ls->identity, sizeof ls->identity, "host %s program %s", host, comm);
    return ls->identity;
}

/* What a slot file says of its holder (lock held): one line padded with spaces to a fixed size,
   so that it overwrites the last holder's in one pwrite, with no ftruncate (which costs more than
   the flock: the file system journals it). A free slot's file keeps its last holder's line;
   readers look at the line only while the file is locked. */
#define GPUARR__LEASE_LINE 192
static void gpuarr__lease_file_write(int fd) {
    char line[GPUARR__LEASE_LINE + 1];
    int n = snprintf(line, sizeof line, "pid %ld thread %ld %s since %lld", (long)getpid(), gpuarr__lease_tid(), gpuarr__lease_identity(),
                     (long long)time(NULL));
    size_t used = n < 0 ? 0 : (size_t)n < GPUARR__LEASE_LINE - 1 ? (size_t)n : GPUARR__LEASE_LINE - 1;
    memset(line + used, ' ', GPUARR__LEASE_LINE - 1 - used);
    line[GPUARR__LEASE_LINE - 1] = '\n';
    if (pwrite(fd, line, GPUARR__LEASE_LINE, 0) < 0) {} /* best effort: only for messages */
}

/* Locks `slots` free slot files of phys into fds: 1, or 0 when too few are free, or -1 (error
   set). The files this process holds are busy to it too (flock is per open file). */
static int gpuarr__lease_files_take(int phys, int slots, int *fds) {
    gpuarr__lease_state *ls = gpuarr__lease_st();
    int got = 0;
    char name[160], why[160];
    for (int k = 0; k < ls->total[phys] && got < slots; k++) {
        gpuarr__lease_name(phys, k, name, sizeof name);
        int fd = gpuarr__file_open_at(ls->dir_fd, name, O_RDWR | O_CREAT, ls->dir_shared, why, sizeof why);
        if (fd < 0) {
            for (int j = 0; j < got; j++) close(fds[j]);
            gpuarr__fail(GPUARR_ERROR_BACKEND, "the slot file %s/%s %s", ls->dir, name, why);
            return -1;
        }
        if (ls->dir_shared) (void)fchmod(fd, 0660); /* the folder's group uses it too (fails on others' files) */
        if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
            close(fd);
            continue;
        }
        gpuarr__lease_file_write(fd);
        fds[got++] = fd;
    }
    if (got == slots) return 1;
    for (int j = 0; j < got; j++) close(fds[j]);
    return 0;
}

static void gpuarr__lease_files_put(gpuarr__lease_rec *r) {
    for (int k = 0; k < r->nfds; k++)
        if (r->fds[k] >= 0) close(r->fds[k]); /* drops the lock */
    gpuarr__free(r->fds);
    r->fds = NULL;
    r->nfds = 0;
}

/* Calls fn for each slot of phys: whether it is held (by anyone, this process too) and what its
   file says of the holder ("" when free or unreadable; a file that cannot be used counts as held,
   saying why). A folder that is refused is an error; one not made yet means every slot is free. */
static gpuarr_result gpuarr__lease_files_each(int phys, void (*fn)(int k, bool held, const char *holder, void *user), void *user) {
    gpuarr__lease_state *ls = gpuarr__lease_st();
    char name[160], text[256], why[160];
    bool found;
    GPUARR__CHECK(gpuarr__lease_dir_open(false, &found));
    for (int k = 0; k < ls->total[phys]; k++) {
        gpuarr__lease_name(phys, k, name, sizeof name);
        text[0] = '\0';
        int fd = found ? gpuarr__file_open_at(ls->dir_fd, name, O_RDONLY, ls->dir_shared, why, sizeof why) : -1;
        bool held = false;
        if (fd < 0 && found && errno != ENOENT) {
            held = true;
            snprintf(text, sizeof text, "not usable: the slot file %s", why);
        }
        if (fd >= 0) {
            held = flock(fd, LOCK_SH | LOCK_NB) != 0;
            if (held) {
                ssize_t n = pread(fd, text, sizeof text - 1, 0);
                text[n > 0 ? n : 0] = '\0';
                size_t len = strcspn(text, "\n");
                while (len && text[len - 1] == ' ') len--; /* the line's padding */
                text[len] = '\0';
            }
            close(fd); /* drops the shared lock taken when it was free */
        }
        fn(k, held, text, user);
    }
    return GPUARR_OK;
}

static gpuarr_result gpuarr__leases_start(void) {
    gpuarr__lease_state *ls = (gpuarr__lease_state *)gpuarr__calloc(sizeof *ls);
    size_t n = (size_t)gpuarr__g.device_count;
    int *counts = (int *)gpuarr__calloc(sizeof(int) * 2 * n);
    if (!ls || !counts) {
        gpuarr__free(ls);
        gpuarr__free(counts);
        return gpuarr__fail(GPUARR_ERROR_OUT_OF_MEMORY, "no host memory for the lease slots");
    }
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&ls->freed, &attr);
    pthread_condattr_destroy(&attr);
    pthread_mutex_init(&ls->lock, NULL);
    ls->total = counts;
    ls->in_use = counts + n;
    ls->last_view = -1;
    ls->plan_last = -1;
    gpuarr__layer_state_set(gpuarr__lease_layer, ls);
    gpuarr__slots_defaults();
    const char *text = gpuarr__setting(GPUARR__SET_SLOTS); /* desc.slots, else GPUARR_SLOTS: checked at read */
    const char *bad;
    size_t bad_len;
    if (text) gpuarr__slots_each(text, gpuarr__slots_apply, &bad, &bad_len);
    return gpuarr__lease_files_start();
}

static void gpuarr__leases_stop(void) {
    gpuarr__lease_state *ls = gpuarr__lease_st();
    if (!ls) return;
    uint32_t live = 0;
    for (uint32_t i = 0; i < ls->rec_count; i++) {
        live += ls->recs[i].live;
        gpuarr__lease_files_put(&ls->recs[i]);
    }
    if (live) gpuarr__log(GPUARR_LOG_WARN, "gpuarr_shutdown dropped %u leases that were never released", live);
    pthread_cond_destroy(&ls->freed);
    pthread_mutex_destroy(&ls->lock);
    if (ls->dir_made) close(ls->dir_fd);
    gpuarr__free(ls->recs);
    gpuarr__free(ls->total);
    gpuarr__free(ls->keys);
    gpuarr__free(ls);
    gpuarr__layer_state_set(gpuarr__lease_layer, NULL);
}

/* ---------------------------------------------------------------------------------------------
 * Handles: (generation << 16) | (record index + 1)
 * ------------------------------------------------------------------------------------------- */
static gpuarr_lease gpuarr__lease_handle(uint32_t index) {
    gpuarr_lease l;
    l.id = (uint32_t)gpuarr__lease_st()->recs[index].gen << 16 | (index + 1u);
    return l;
}

/* The live record of l (lock held). */
static gpuarr_result gpuarr__lease_get(gpuarr_lease l, const char *arg, gpuarr__lease_rec **out) {
    gpuarr__lease_state *ls = gpuarr__lease_st();
    uint32_t index = (l.id & 0xffffu) - 1u;
    uint16_t gen = (uint16_t)(l.id >> 16);
    if (l.id == 0) return gpuarr__fail(GPUARR_ERROR_INVALID_HANDLE, "%s is a zero lease handle", arg);
    if ((l.id & 0xffffu) == 0 || index >= ls->rec_count)
        return gpuarr__fail(GPUARR_ERROR_INVALID_HANDLE, "%s (id 0x%08x) is not a lease of this gpuarr_init (stale or forged)", arg, l.id);
    gpuarr__lease_rec *r = &ls->recs[index];
    if (r->live && r->gen == gen) {
        *out = r;
        return GPUARR_OK;
    }
    if ((uint16_t)(r->gen - 1u) == gen)
        return gpuarr__fail(GPUARR_ERROR_INVALID_HANDLE, "%s (id 0x%08x) was released already", arg, l.id);
    return gpuarr__fail(GPUARR_ERROR_INVALID_HANDLE, "%s (id 0x%08x) is not a live lease (stale or forged)", arg, l.id);
}

/* A free record's index (lock held), or UINT32_MAX when none can be had. */
static uint32_t gpuarr__lease_new_rec(void) {
    gpuarr__lease_state *ls = gpuarr__lease_st();
    for (uint32_t i = 0; i < ls->rec_count; i++)
        if (!ls->recs[i].live) return i;
    if (ls->rec_count == ls->rec_cap) {
        if (ls->rec_cap >= GPUARR__LEASE_MAX_RECS) return UINT32_MAX;
        uint32_t cap = ls->rec_cap ? ls->rec_cap * 2u : 16u;
        if (cap > GPUARR__LEASE_MAX_RECS) cap = GPUARR__LEASE_MAX_RECS;
        gpuarr__lease_rec *recs = (gpuarr__lease_rec *)gpuarr__calloc(sizeof *recs * cap);
        if (!recs) return UINT32_MAX;
        if (ls->recs) memcpy(recs, ls->recs, sizeof *recs * ls->rec_count);
        gpuarr__free(ls->recs);
        ls->recs = recs;
        ls->rec_cap = cap;
    }
    /* a new record's generation comes from the init cycle: a handle from an earlier one is stale */
    ls->recs[ls->rec_count].gen = (uint16_t)(gpuarr__g.epoch * 40503u + 1u);
    return ls->rec_count++;
}

/* ---------------------------------------------------------------------------------------------
 * Candidates: desc.devices as registry indices, each device once
 * ------------------------------------------------------------------------------------------- */
typedef struct gpuarr__lease_cands {
    int *view;  /* registry indices, in the order the list gives them */
    int count;
    bool *wants; /* by registry index: the physical devices among them */
    char local[GPUARR__LOCAL_NOTE]; /* how a "local" item was resolved ("" = none), for messages */
} gpuarr__lease_cands;

static void gpuarr__cands_add(gpuarr__lease_cands *c, int index) {
    for (int i = 0; i < c->count; i++)
        if (c->view[i] == index) return;
    c->view[c->count++] = index;
    c->wants[gpuarr__lease_phys(index)] = true;
}

/* Every GPU, each physical one once (through the view that represents it). */
static int gpuarr__cands_add_gpus(gpuarr__lease_cands *c) {
    int added = 0;
    for (int i = 0; i < gpuarr__g.device_count; i++) {
        const gpuarr__dev *d = &gpuarr__g.devices[i];
        if (d->info.type != GPUARR_DEVICE_TYPE_GPU || gpuarr__is_duplicate(d)) continue;
        gpuarr__cands_add(c, i);
        added++;
    }
    return added;
}

static gpuarr_result gpuarr__cands_item(gpuarr__lease_cands *c, const char *arg, const char *list, const char *p, size_t len) {
    char item[64];
    if (len == 0 || len >= sizeof item)
        return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "%s = \"%s\": item \"%.*s\" is not a device spec", arg, list,
                            (int)len, p);
    memcpy(item, p, len);
    item[len] = '\0';
    gpuarr_backend b;
    int index;
    if (strcmp(item, "all") == 0) { /* every device, the host included, each physical one once */
        for (int i = 0; i < gpuarr__g.device_count; i++)
            if (!gpuarr__is_duplicate(&gpuarr__g.devices[i])) gpuarr__cands_add(c, i);
        return GPUARR_OK;
    }
    if (strcmp(item, "gpu") == 0 || strcmp(item, "any") == 0) {
        if (gpuarr__cands_add_gpus(c)) return GPUARR_OK;
        if (item[0] == 'a') {
            gpuarr__cands_add(c, 0);
            return GPUARR_OK;
        }
        return gpuarr__fail(GPUARR_ERROR_NO_DEVICE, "%s = \"%s\": \"gpu\": none of the %d devices is a GPU", arg, list,
                            gpuarr__g.device_count);
    }
    if (strcmp(item, "host") != 0 && strcmp(item, "cpu") != 0 && gpuarr__parse_backend_spec(item, len, true, &b, &index) && index < 0) {
        int added = 0; /* "cuda", "cuda:*": every device of the backend */
        for (int i = 0; i < gpuarr__g.device_count; i++)
            if (gpuarr__g.devices[i].info.backend == b) gpuarr__cands_add(c, i), added++;
        if (added) return GPUARR_OK;
        return gpuarr__fail(GPUARR_ERROR_NO_DEVICE, "%s = \"%s\": no %s device is present", arg, list, gpuarr__backend_names[b]);
    }
    gpuarr__dev *d;
    gpuarr_result r = gpuarr__is_local_spec(item) ? gpuarr__find_local(item, &d, c->local, sizeof c->local) : gpuarr__find_device(item, &d);
    if (r != GPUARR_OK) { /* the finder's reason, said of this argument */
        char why[sizeof gpuarr__tls.error_detail];
        gpuarr__copy_string(why, sizeof why, gpuarr__tls.error_detail);
        return gpuarr__fail(r, "%s = \"%s\": %s", arg, list, why);
    }
    gpuarr__cands_add(c, (int)(gpuarr__dev_view(d) - gpuarr__g.devices)); /* an adopted device: its own view */
    return GPUARR_OK;
}

/* arg: what the list is called in messages ("desc->devices"). */
static gpuarr_result gpuarr__cands_parse(const char *arg, const char *list, gpuarr__lease_cands *c) {
    size_t n = (size_t)gpuarr__g.device_count;
    c->count = 0;
    c->local[0] = '\0';
    c->view = (int *)gpuarr__calloc(sizeof(int) * n);
    c->wants = (bool *)gpuarr__calloc(sizeof(bool) * n);
    if (!c->view || !c->wants) return gpuarr__fail(GPUARR_ERROR_OUT_OF_MEMORY, "no host memory for the candidate devices");
    for (const char *p = list;;) {
        size_t len = strcspn(p, ",");
        const char *q = p;
        while (len && q[0] == ' ') q++, len--;
        while (len && q[len - 1] == ' ') len--;
        GPUARR__CHECK(gpuarr__cands_item(c, arg, list, q, len));
        p += strcspn(p, ",");
        if (!*p) return GPUARR_OK;
        p++;
    }
}

static void gpuarr__cands_free(gpuarr__lease_cands *c) {
    gpuarr__free(c->view);
    gpuarr__free(c->wants);
}

/* ---------------------------------------------------------------------------------------------
 * Placement (lock held)
 * ------------------------------------------------------------------------------------------- */
/* Free memory of d: the device's (mem_info), less what its pool's limit leaves. */
static uint64_t gpuarr__lease_free_memory(gpuarr__dev *d) {
    uint64_t free_bytes = 0, total = 0;
    if (d->backend->mem_info(d, &free_bytes, &total) != GPUARR_OK) free_bytes = d->info.free_memory;
    pthread_mutex_lock(&d->pool.lock);
    uint64_t limit = d->pool.stats.limit_bytes, allocated = d->pool.stats.allocated_bytes;
    pthread_mutex_unlock(&d->pool.lock);
    if (limit) {
        uint64_t room = limit > allocated ? limit - allocated : 0;
        if (room < free_bytes) free_bytes = room;
    }
    return free_bytes;
}

static bool gpuarr__lease_failed(int view) {
    return gpuarr__dev_failed(&gpuarr__g.devices[view]) || gpuarr__dev_failed(&gpuarr__g.devices[gpuarr__lease_phys(view)]);
}

/* Can `me` (queued, or NULL for a call not queued: behind every waiter) take `slots` on view? */
static bool gpuarr__lease_open(const gpuarr__lease_waiter *me, int view, int slots) {
    gpuarr__lease_state *ls = gpuarr__lease_st();
    int p = gpuarr__lease_phys(view);
    if (gpuarr__lease_failed(view) || ls->total[p] - ls->in_use[p] < slots) return false;
    for (const gpuarr__lease_waiter *w = ls->head; w && w != me; w = w->next)
        if (w->wants[p]) return false; /* an earlier waiter comes first */
    return true;
}

/* less leased than b: a smaller share of its slots in use */
static int gpuarr__lease_cmp_share(int a, int b) {
    gpuarr__lease_state *ls = gpuarr__lease_st();
    int pa = gpuarr__lease_phys(a), pb = gpuarr__lease_phys(b);
    int64_t x = (int64_t)ls->in_use[pa] * ls->total[pb], y = (int64_t)ls->in_use[pb] * ls->total[pa];
    return x < y ? -1 : x > y ? 1 : 0;
}

/* The candidate to lease (its index in c), or -1; excluded[i]: its slot files are taken by other
   processes. mem[i]: candidate i's free memory, read here when needed. */
/* Candidate i's free memory, read at its first need in this pick: reading it is the costly part
   of a lease (a /proc read on the host, a driver call elsewhere), so a pick with one candidate
   and no memory condition reads none. UINT64_MAX = not read yet. */
static uint64_t gpuarr__lease_mem(const gpuarr__lease_cands *c, int i, uint64_t *mem) {
    if (mem[i] == UINT64_MAX) mem[i] = gpuarr__lease_free_memory(&gpuarr__g.devices[c->view[i]]);
    return mem[i];
}

static int gpuarr__lease_pick(const gpuarr__lease_waiter *me, const gpuarr__lease_cands *c, const gpuarr_lease_desc *d, int slots,
                              const bool *excluded, uint64_t *mem, bool *memory_short) {
    gpuarr__lease_state *ls = gpuarr__lease_st();
    int n = c->count, open[64], *ok = n <= 64 ? open : (int *)gpuarr__calloc(sizeof(int) * (size_t)n), count = 0;
    if (!ok) return -1;
    *memory_short = false;
    for (int i = 0; i < n; i++) {
        mem[i] = UINT64_MAX;
        if (excluded[i] || !gpuarr__lease_open(me, c->view[i], slots)) continue;
        if (d->memory_bytes && gpuarr__lease_mem(c, i, mem) < d->memory_bytes) {
            *memory_short = true;
            continue;
        }
        ok[count++] = i;
    }
    int best = -1;
    if (count && d->affinity) /* a device where a lease of this key is live */
        for (uint32_t r = 0; r < ls->rec_count && best < 0; r++) {
            const gpuarr__lease_rec *rec = &ls->recs[r];
            if (!rec->live || strcmp(rec->affinity, d->affinity) != 0) continue;
            for (int k = 0; k < count && best < 0; k++)
                if (gpuarr__lease_phys(c->view[ok[k]]) == rec->phys) best = ok[k];
        }
    if (count && best < 0 && d->placement == GPUARR_PLACE_ROUND_ROBIN) {
        int start = 0; /* after the candidate leased last */
        for (int i = 0; i < n; i++)
            if (c->view[i] == ls->last_view) start = i + 1;
        for (int step = 0; step < n && best < 0; step++)
            for (int k = 0; k < count; k++)
                if (ok[k] == (start + step) % n) best = ok[k];
    }
    if (count && best < 0) {
        best = ok[0];
        for (int k = 1; k < count; k++) {
            int i = ok[k], share = gpuarr__lease_cmp_share(c->view[i], c->view[best]);
            bool better;
            if (d->placement == GPUARR_PLACE_MOST_FREE) {
                uint64_t mi = gpuarr__lease_mem(c, i, mem), mb = gpuarr__lease_mem(c, best, mem);
                better = mi > mb || (mi == mb && share < 0);
            } else {
                better = share < 0 || (share == 0 && gpuarr__lease_mem(c, i, mem) > gpuarr__lease_mem(c, best, mem));
            }
            if (better) best = i;
        }
    }
    if (ok != open) gpuarr__free(ok);
    return best;
}

/* ---------------------------------------------------------------------------------------------
 * Messages
 * ------------------------------------------------------------------------------------------- */
typedef struct gpuarr__lease_holders_out {
    char *buf;
    size_t cap;
    int others;
} gpuarr__lease_holders_out;

/* A slot another process holds, as its file tells, with how long it has held it instead of the
   file's "since UNIX-TIME". */
static void gpuarr__lease_holder_other(int k, bool held, const char *holder, void *user) {
    gpuarr__lease_holders_out *o = (gpuarr__lease_holders_out *)user;
    long pid = 0;
    if (!held || (sscanf(holder, "pid %ld", &pid) == 1 && pid == (long)getpid())) return;
    const char *since = strstr(holder, " since ");
    long long t0 = 0;
    int who = since ? (int)(since - holder) : (int)strlen(holder);
    gpuarr__append(o->buf, o->cap, "%sslot %d %.*s", o->others++ ? ", " : "; in other processes (", k, who, holder[0] ? holder : "held");
    if (since && sscanf(since, " since %lld", &t0) == 1)
        gpuarr__append(o->buf, o->cap, ", held for %lld s", (long long)time(NULL) - t0);
}

/* Who holds the candidates' slots: "opencl:0: 1 of 1 slots in use (pid 12 thread 13 for 5 ms)". */
static void gpuarr__lease_holders(const gpuarr__lease_cands *c, char *buf, size_t cap) {
    gpuarr__lease_state *ls = gpuarr__lease_st();
    double now = gpuarr__now_ms();
    for (int i = 0; i < c->count; i++) {
        int v = c->view[i], p = gpuarr__lease_phys(v);
        gpuarr__dev *d = &gpuarr__g.devices[v];
        gpuarr__append(buf, cap, "%s%s: ", i ? "; " : "", d->info.spec);
        if (gpuarr__lease_failed(v)) {
            gpuarr__append(buf, cap, "failed (%s)", gpuarr__g.devices[v].failure);
            continue;
        }
        gpuarr__append(buf, cap, "%d of %d slots in use in this process", ls->in_use[p], ls->total[p]);
        const char *sep = " by ";
        for (uint32_t r = 0; r < ls->rec_count; r++) {
            const gpuarr__lease_rec *rec = &ls->recs[r];
            if (!rec->live || rec->phys != p) continue;
            gpuarr__append(buf, cap, "%spid %ld thread %ld (%d slot%s, %.0f ms)", sep, rec->pid, rec->tid, rec->slots,
                                 rec->slots == 1 ? "" : "s", now - rec->since_ms);
            sep = ", ";
        }
        if (ls->dir[0]) {
            gpuarr__lease_holders_out out = {buf, cap, 0};
            (void)gpuarr__lease_files_each(p, gpuarr__lease_holder_other, &out); /* a refused folder: no names */
            if (out.others) gpuarr__append(buf, cap, ")");
        }
    }
}

/* ---------------------------------------------------------------------------------------------
 * Acquire and release
 * ------------------------------------------------------------------------------------------- */
static gpuarr_result gpuarr__lease_check_desc(const gpuarr_lease_desc *d) {
    if ((int)d->placement < 0 || d->placement >= GPUARR_PLACEMENT_COUNT)
        return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "desc->placement = %d is not a gpuarr_placement", (int)d->placement);
    if (d->slots < 0 || d->slots > GPUARR__LEASE_MAX_SLOTS)
        return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "desc->slots = %d: must be 0 (= 1) or 1..%d", d->slots, GPUARR__LEASE_MAX_SLOTS);
    if (d->affinity && !*d->affinity)
        return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "desc->affinity is \"\": NULL means no affinity");
    if (d->affinity && strlen(d->affinity) > GPUARR__LEASE_KEY_MAX)
        return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "desc->affinity is %zu characters long: at most %d", strlen(d->affinity),
                            GPUARR__LEASE_KEY_MAX);
    if (d->devices && !*d->devices)
        return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "desc->devices is \"\": NULL means \"gpu\"");
    return GPUARR_OK;
}

static void gpuarr__lease_deadline(int64_t timeout_ms, struct timespec *at) {
    clock_gettime(CLOCK_MONOTONIC, at);
    int64_t ns = (int64_t)at->tv_nsec + (timeout_ms % 1000) * 1000000;
    at->tv_sec += (time_t)(timeout_ms / 1000 + ns / 1000000000);
    at->tv_nsec = (long)(ns % 1000000000);
}

static bool gpuarr__lease_before(const struct timespec *a, const struct timespec *b) {
    return a->tv_sec < b->tv_sec || (a->tv_sec == b->tv_sec && a->tv_nsec < b->tv_nsec);
}

/* The slots of `view` for this lease (lock held). */
static gpuarr_lease gpuarr__lease_grant(uint32_t index, int view, int slots, const char *affinity, int *fds) {
    gpuarr__lease_state *ls = gpuarr__lease_st();
    gpuarr__lease_rec *rec = &ls->recs[index];
    rec->live = true;
    rec->view = view;
    rec->phys = gpuarr__lease_phys(view);
    rec->slots = slots;
    gpuarr__copy_string(rec->affinity, sizeof rec->affinity, affinity ? affinity : "");
    rec->pid = (long)getpid();
    rec->tid = gpuarr__lease_tid();
    rec->since_ms = gpuarr__now_ms();
    rec->fds = fds;
    rec->nfds = fds ? slots : 0;
    ls->in_use[rec->phys] += slots;
    ls->last_view = view;
    return gpuarr__lease_handle(index);
}

static void gpuarr__lease_dequeue(gpuarr__lease_waiter *me) {
    gpuarr__lease_state *ls = gpuarr__lease_st();
    gpuarr__lease_waiter **pp = &ls->head, *prev = NULL;
    while (*pp && *pp != me) prev = *pp, pp = &(*pp)->next;
    if (!*pp) return;
    *pp = me->next;
    if (ls->tail == me) ls->tail = prev;
    pthread_cond_broadcast(&ls->freed); /* those behind it may take what it wanted */
}

/* Places, waits, grants (lock held). */
static gpuarr_result gpuarr__lease_wait(const gpuarr_lease_desc *d, const char *list, const gpuarr__lease_cands *c, int slots,
                                        gpuarr_lease *out, int *view_out, bool *waited) {
    gpuarr__lease_state *ls = gpuarr__lease_st();
    uint64_t *mem = (uint64_t *)gpuarr__calloc(sizeof(uint64_t) * (size_t)c->count);
    bool *excluded = (bool *)gpuarr__calloc(sizeof(bool) * (size_t)c->count);
    if (!mem || !excluded) {
        gpuarr__free(mem);
        gpuarr__free(excluded);
        return gpuarr__fail(GPUARR_ERROR_OUT_OF_MEMORY, "no host memory for placement");
    }
    gpuarr__lease_waiter me = {NULL, c->wants};
    bool queued = false, memory_short = false;
    struct timespec deadline;
    if (d->timeout_ms > 0) gpuarr__lease_deadline(d->timeout_ms, &deadline);
    gpuarr_result r = GPUARR_OK;
    for (;;) {
        int alive = 0;
        for (int i = 0; i < c->count; i++) alive += !gpuarr__lease_failed(c->view[i]);
        if (!alive) {
            char why[768] = "";
            gpuarr__lease_holders(c, why, sizeof why);
            r = gpuarr__fail(GPUARR_ERROR_DEVICE_LOST, "desc->devices = \"%s\"%s%s%s: every candidate has failed: %s", list,
                             c->local[0] ? " (" : "", c->local, c->local[0] ? ")" : "", why);
            break;
        }
        uint32_t index = gpuarr__lease_new_rec();
        if (index == UINT32_MAX) {
            r = gpuarr__fail(GPUARR_ERROR_OUT_OF_MEMORY, "no room for another lease (%u live at most)", GPUARR__LEASE_MAX_RECS);
            break;
        }
        int ci = gpuarr__lease_pick(queued ? &me : NULL, c, d, slots, excluded, mem, &memory_short);
        if (ci >= 0) {
            int view = c->view[ci], *fds = NULL;
            if (ls->dir[0]) { /* and the slots' files, against other processes */
                if ((r = gpuarr__lease_dir_make()) != GPUARR_OK) break;
                if (!(fds = (int *)gpuarr__malloc(sizeof(int) * (size_t)slots))) {
                    r = gpuarr__fail(GPUARR_ERROR_OUT_OF_MEMORY, "no host memory for a lease");
                    break;
                }
                int got = gpuarr__lease_files_take(gpuarr__lease_phys(view), slots, fds);
                if (got <= 0) {
                    gpuarr__free(fds);
                    if (got < 0) {
                        r = GPUARR_ERROR_BACKEND;
                        break;
                    }
                    excluded[ci] = true; /* other processes hold them: look at the others */
                    continue;
                }
            }
            *out = gpuarr__lease_grant(index, view, slots, d->affinity, fds);
            *view_out = view;
            break;
        }
        struct timespec now, until = {0, 0};
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (d->timeout_ms == 0 || (d->timeout_ms > 0 && !gpuarr__lease_before(&now, &deadline))) {
            char why[768] = "";
            gpuarr__lease_holders(c, why, sizeof why);
            r = gpuarr__fail(GPUARR_ERROR_TIMEOUT, "no %d free slot%s on \"%s\"%s%s%s within %lld ms%s: %s", slots, slots == 1 ? "" : "s",
                             list, c->local[0] ? " (" : "", c->local, c->local[0] ? ")" : "", (long long)d->timeout_ms,
                             memory_short ? " (and too little free memory where slots were free)" : "", why);
            break;
        }
        if (!queued) { /* join the queue's end */
            if (ls->tail) ls->tail->next = &me;
            else ls->head = &me;
            ls->tail = &me;
            queued = true;
        }
        *waited = true;
        /* memory and other processes' releases are not announced: look again every 50 / 25 ms */
        bool poll = d->memory_bytes || ls->dir[0];
        if (poll) gpuarr__lease_deadline(ls->dir[0] ? 25 : 50, &until);
        if (d->timeout_ms > 0 && (!poll || gpuarr__lease_before(&deadline, &until))) until = deadline;
        if (d->timeout_ms < 0 && !poll) pthread_cond_wait(&ls->freed, &ls->lock);
        else pthread_cond_timedwait(&ls->freed, &ls->lock, &until);
        memset(excluded, 0, sizeof(bool) * (size_t)c->count);
    }
    if (queued) gpuarr__lease_dequeue(&me);
    gpuarr__free(mem);
    gpuarr__free(excluded);
    return r;
}

static gpuarr_result gpuarr__lease_acquire(const gpuarr_lease_desc *desc, gpuarr_lease *out, gpuarr__dev **dev_out) {
    gpuarr_lease_desc d;
    memset(&d, 0, sizeof d);
    if (desc) d = *desc;
    GPUARR__CHECK(gpuarr__lease_check_desc(&d));
    int slots = d.slots ? d.slots : 1;
    const char *list = d.devices ? d.devices : "gpu";
    GPUARR__TRACE_SCOPE(gpuarr__trace_lease, slots);
    gpuarr__lease_cands c;
    gpuarr_result r = gpuarr__cands_parse("desc->devices", list, &c);
    gpuarr__lease_state *ls = gpuarr__lease_st();
    int view = -1;
    bool waited = false;
    if (r == GPUARR_OK) {
        pthread_mutex_lock(&ls->lock);
        int most = 0, at = 0;
        for (int i = 0; i < c.count; i++)
            if (ls->total[gpuarr__lease_phys(c.view[i])] > most) most = ls->total[gpuarr__lease_phys(c.view[i])], at = c.view[i];
        if (slots > most)
            r = gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "desc->slots = %d: more than any candidate has (%s has %d)", slots,
                             gpuarr__g.devices[at].info.spec, most);
        else
            r = gpuarr__lease_wait(&d, list, &c, slots, out, &view, &waited);
        pthread_mutex_unlock(&ls->lock);
    }
    gpuarr__cands_free(&c);
    gpuarr__trace_lease_end(&gpuarr__trace_sc, view >= 0 ? &gpuarr__g.devices[view] : NULL, r, waited);
    if (r == GPUARR_OK && dev_out) *dev_out = &gpuarr__g.devices[view];
    return r;
}

GPUARR_API gpuarr_result gpuarr_lease_acquire(const gpuarr_lease_desc *desc, gpuarr_lease *out) {
    GPUARR__BEGIN();
    GPUARR__REQUIRE_PTR(out);
    return gpuarr__lease_acquire(desc, out, NULL);
}

static gpuarr_result gpuarr__lease_release(gpuarr_lease l) {
    gpuarr__lease_state *ls = gpuarr__lease_st();
    pthread_mutex_lock(&ls->lock);
    gpuarr__lease_rec *rec;
    gpuarr_result r = gpuarr__lease_get(l, "l", &rec);
    if (r == GPUARR_OK) {
        ls->in_use[rec->phys] -= rec->slots;
        gpuarr__lease_files_put(rec);
        rec->live = false;
        rec->gen++;
        pthread_cond_broadcast(&ls->freed);
    }
    pthread_mutex_unlock(&ls->lock);
    return r;
}

GPUARR_API gpuarr_result gpuarr_lease_release(gpuarr_lease l) {
    GPUARR__BEGIN();
    return gpuarr__lease_release(l);
}

/* A scope's lease, released when it ends: an error is logged, never reported (leave is void). */
static void gpuarr__lease_release_quiet(gpuarr_lease l) {
    gpuarr__error_saved sv;
    gpuarr__error_save(&sv);
    if (gpuarr__lease_release(l) != GPUARR_OK) gpuarr__log(GPUARR_LOG_WARN, "a scope's lease: %s", gpuarr__tls.error_detail);
    gpuarr__error_restore(&sv);
}

GPUARR_API gpuarr_result gpuarr_lease_device(gpuarr_lease l, gpuarr_device *out) {
    GPUARR__BEGIN();
    GPUARR__REQUIRE_PTR(out);
    gpuarr__lease_state *ls = gpuarr__lease_st();
    pthread_mutex_lock(&ls->lock);
    gpuarr__lease_rec *rec;
    gpuarr_result r = gpuarr__lease_get(l, "l", &rec);
    if (r == GPUARR_OK) *out = gpuarr__g.devices[rec->view].info.device;
    pthread_mutex_unlock(&ls->lock);
    return r;
}

GPUARR_API gpuarr_result gpuarr_device_set_slots(gpuarr_device d, int slots) {
    GPUARR__BEGIN();
    gpuarr__dev *dev;
    GPUARR__CHECK(gpuarr__get_dev_any(d, "d", &dev));
    if (slots < 1 || slots > GPUARR__LEASE_MAX_SLOTS)
        return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "slots = %d: must be 1..%d", slots, GPUARR__LEASE_MAX_SLOTS);
    gpuarr__lease_state *ls = gpuarr__lease_st();
    int p = gpuarr__lease_phys((int)(gpuarr__dev_view(dev) - gpuarr__g.devices));
    gpuarr_result r = GPUARR_OK;
    pthread_mutex_lock(&ls->lock);
    if (slots < ls->in_use[p])
        r = gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "slots = %d: %d slots of %s are in use (release leases first)", slots,
                         ls->in_use[p], dev->info.spec);
    else
        ls->total[p] = slots;
    pthread_cond_broadcast(&ls->freed);
    pthread_mutex_unlock(&ls->lock);
    return r;
}

GPUARR_API gpuarr_result gpuarr_device_get_slots(gpuarr_device d, int *total, int *in_use) {
    GPUARR__BEGIN();
    GPUARR__REQUIRE_PTR(total);
    GPUARR__REQUIRE_PTR(in_use);
    gpuarr__dev *dev;
    GPUARR__CHECK(gpuarr__get_dev_any(d, "d", &dev));
    gpuarr__lease_state *ls = gpuarr__lease_st();
    int p = gpuarr__lease_phys((int)(gpuarr__dev_view(dev) - gpuarr__g.devices));
    pthread_mutex_lock(&ls->lock);
    *total = ls->total[p];
    *in_use = ls->in_use[p];
    pthread_mutex_unlock(&ls->lock);
    return GPUARR_OK;
}

typedef struct gpuarr__lease_summary_out {
    char *buf;
    size_t len;
    const char *spec;
} gpuarr__lease_summary_out;

static void gpuarr__lease_summary_line(int k, bool held, const char *holder, void *user) {
    gpuarr__lease_summary_out *o = (gpuarr__lease_summary_out *)user;
    gpuarr__append(o->buf, o->len, "%s slot %d: %s\n", o->spec, k, !held ? "free" : holder[0] ? holder : "held");
}

GPUARR_API gpuarr_result gpuarr_lease_summary(gpuarr_device d, char *buf, size_t len) {
    GPUARR__BEGIN();
    GPUARR__REQUIRE_PTR(buf);
    if (!len) return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "len is 0");
    gpuarr__dev *dev;
    GPUARR__CHECK(gpuarr__get_dev_any(d, "d", &dev));
    gpuarr__lease_state *ls = gpuarr__lease_st();
    int p = gpuarr__lease_phys((int)(gpuarr__dev_view(dev) - gpuarr__g.devices));
    gpuarr__lease_summary_out o = {buf, len, dev->info.spec};
    buf[0] = '\0';
    gpuarr_result res = GPUARR_OK;
    pthread_mutex_lock(&ls->lock);
    if (ls->dir[0]) {
        res = gpuarr__lease_files_each(p, gpuarr__lease_summary_line, &o);
    } else { /* this process's leases take the slots in the order of their records */
        int k = 0;
        char holder[128];
        for (uint32_t r = 0; r < ls->rec_count; r++) {
            const gpuarr__lease_rec *rec = &ls->recs[r];
            if (!rec->live || rec->phys != p) continue;
            snprintf(holder, sizeof holder, "pid %ld thread %ld (this process)", rec->pid, rec->tid);
            for (int j = 0; j < rec->slots; j++) gpuarr__lease_summary_line(k++, true, holder, &o);
        }
        for (; k < ls->total[p]; k++) gpuarr__lease_summary_line(k, false, "", &o);
    }
    pthread_mutex_unlock(&ls->lock);
    return res;
}

GPUARR_API gpuarr_scope gpuarr_scope_enter_lease(const gpuarr_lease_desc *desc) {
    gpuarr__tls.api = __func__;
    if (!gpuarr__initialized())
        return gpuarr__scope_failed(gpuarr__fail(GPUARR_ERROR_NOT_INITIALIZED, "gpuarr is not initialized (call gpuarr_init first)"));
    gpuarr_lease l;
    gpuarr__dev *dev;
    gpuarr_result r = gpuarr__lease_acquire(desc, &l, &dev);
    if (r != GPUARR_OK) return gpuarr__scope_failed(r);
    gpuarr_scope sc = gpuarr__scope_enter(dev, gpuarr__tls.stream_id);
    if (!sc.active) {
        gpuarr__lease_release_quiet(l);
        return sc;
    }
    sc.lease = l;
    return sc;
}

/* ---------------------------------------------------------------------------------------------
 * Plans: a device for each step of a pipeline, chosen before anything runs (the manual's PLANS)
 * ------------------------------------------------------------------------------------------- */
#define GPUARR__PLAN_MAX_STEPS 4096
#define GPUARR__PLAN_NEEDS_KNOWN (GPUARR_NEED_FP64)

/* What a step may count on at d: the device's memory, or its pool's limit when that is lower.
   Capacity, not what is free now: that changes before the step runs (a lease's memory_bytes waits
   for it). */
static uint64_t gpuarr__plan_capacity(gpuarr__dev *d) {
    pthread_mutex_lock(&d->pool.lock);
    uint64_t limit = d->pool.stats.limit_bytes;
    pthread_mutex_unlock(&d->pool.lock);
    return limit && limit < d->info.total_memory ? limit : d->info.total_memory;
}

static bool gpuarr__plan_has_fp64(gpuarr__dev *d) {
    gpuarr__error_saved sv; /* cast_supported words its refusal as an error: not this call's */
    gpuarr__error_save(&sv);
    bool ok = gpuarr__backend_cast_supported(d, GPUARR_F64, GPUARR_F64) == GPUARR_OK;
    gpuarr__error_restore(&sv);
    return ok;
}

/* Whether view v can take step s; if not, why (appended to why). */
static bool gpuarr__plan_fits(const gpuarr_plan_step *s, int v, char *why, size_t cap) {
    gpuarr__dev *d = &gpuarr__g.devices[v];
    char have[32], need[32];
    if (gpuarr__lease_failed(v)) {
        gpuarr__append(why, cap, "; %s has failed", d->info.spec);
        return false;
    }
    if ((s->needs & GPUARR_NEED_FP64) && !gpuarr__plan_has_fp64(d)) {
        gpuarr__append(why, cap, "; %s has no fp64", d->info.spec);
        return false;
    }
    uint64_t room = gpuarr__plan_capacity(d);
    if (s->memory_bytes > room) {
        gpuarr__format_bytes(have, sizeof have, room);
        gpuarr__format_bytes(need, sizeof need, s->memory_bytes);
        gpuarr__append(why, cap, "; %s has %s, the step needs %s", d->info.spec, have, need);
        return false;
    }
    return true;
}

static void gpuarr__plan_step_name(const gpuarr_plan_step *steps, int i, char *out, size_t cap) {
    if (steps[i].name) snprintf(out, cap, "steps[%d] (\"%.64s\")", i, steps[i].name);
    else snprintf(out, cap, "steps[%d]", i);
}

static gpuarr_result gpuarr__plan_check(const gpuarr_plan_step *steps, int count, gpuarr_placement placement) {
    if (count < 1 || count > GPUARR__PLAN_MAX_STEPS)
        return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "count = %d: must be 1..%d", count, GPUARR__PLAN_MAX_STEPS);
    if ((int)placement < 0 || placement >= GPUARR_PLACEMENT_COUNT)
        return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "placement = %d is not a gpuarr_placement", (int)placement);
    for (int i = 0; i < count; i++) {
        char name[96];
        gpuarr__plan_step_name(steps, i, name, sizeof name);
        if (steps[i].needs & ~(uint32_t)GPUARR__PLAN_NEEDS_KNOWN)
            return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "%s: needs = 0x%x has bits that are no GPUARR_NEED_* (0x%x)", name,
                                (unsigned)steps[i].needs, (unsigned)(steps[i].needs & ~(uint32_t)GPUARR__PLAN_NEEDS_KNOWN));
        if (steps[i].devices && !*steps[i].devices)
            return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "%s: devices is \"\": NULL means \"gpu\"", name);
    }
    return GPUARR_OK;
}

/* fits[s * n + v]: view v can take step s. Fails naming the first step no candidate can take. */
static gpuarr_result gpuarr__plan_candidates(const gpuarr_plan_step *steps, int count, bool *fits) {
    int n = gpuarr__g.device_count;
    for (int s = 0; s < count; s++) {
        char name[96], arg[128], why[768] = "";
        gpuarr__plan_step_name(steps, s, name, sizeof name);
        snprintf(arg, sizeof arg, "%s.devices", name);
        gpuarr__lease_cands c;
        gpuarr_result r = gpuarr__cands_parse(arg, steps[s].devices ? steps[s].devices : "gpu", &c);
        bool any = false;
        for (int i = 0; r == GPUARR_OK && i < c.count; i++)
            if (gpuarr__plan_fits(&steps[s], c.view[i], why, sizeof why)) fits[(size_t)s * (size_t)n + (size_t)c.view[i]] = any = true;
        gpuarr__cands_free(&c);
        GPUARR__CHECK(r);
        if (!any) return gpuarr__fail(GPUARR_ERROR_NO_DEVICE, "%s: no device can take it: %s", name, why + 2);
    }
    return GPUARR_OK;
}

/* Of physical devices a and b, which the placement prefers (< 0: a). mem: free memory by registry
   index, read at the first need (UINT64_MAX = not yet). Lease lock held. */
static int gpuarr__plan_prefer(int a, int b, gpuarr_placement placement, uint64_t *mem) {
    if (mem[a] == UINT64_MAX) mem[a] = gpuarr__lease_free_memory(&gpuarr__g.devices[a]);
    if (mem[b] == UINT64_MAX) mem[b] = gpuarr__lease_free_memory(&gpuarr__g.devices[b]);
    int share = gpuarr__lease_cmp_share(a, b), more_free = mem[a] > mem[b] ? -1 : mem[a] < mem[b] ? 1 : 0;
    if (placement == GPUARR_PLACE_MOST_FREE) return more_free ? more_free : share;
    return share ? share : more_free;
}

/* The physical device that takes the most steps not yet placed (ties: the placement's choice),
   or -1 when every step is placed. */
static int gpuarr__plan_next(const bool *fits, const int *where, int count, gpuarr_placement placement, uint64_t *mem) {
    gpuarr__lease_state *ls = gpuarr__lease_st();
    int n = gpuarr__g.device_count, best = -1, best_takes = 0;
    int start = placement == GPUARR_PLACE_ROUND_ROBIN ? ls->plan_last + 1 : 0; /* round robin: the next after the last */
    for (int k = 0; k < n; k++) {
        int p = (start + k) % n, takes = 0;
        if (gpuarr__lease_phys(p) != p) continue;
        for (int s = 0; s < count; s++) {
            if (where[s] >= 0) continue;
            for (int v = 0; v < n; v++)
                if (fits[(size_t)s * (size_t)n + (size_t)v] && gpuarr__lease_phys(v) == p) {
                    takes++;
                    break;
                }
        }
        if (takes > best_takes ||
            (takes && takes == best_takes && placement != GPUARR_PLACE_ROUND_ROBIN && gpuarr__plan_prefer(p, best, placement, mem) < 0))
            best = p, best_takes = takes;
    }
    return best;
}

/* Each step p can take goes to p, through the first view its list names there. */
static void gpuarr__plan_assign(const gpuarr_plan_step *steps, const bool *fits, int *where, int count, int p) {
    int n = gpuarr__g.device_count;
    for (int s = 0; s < count; s++) {
        if (where[s] >= 0) continue;
        gpuarr__lease_cands c; /* parsed before: it cannot fail now */
        if (gpuarr__cands_parse("devices", steps[s].devices ? steps[s].devices : "gpu", &c) == GPUARR_OK)
            for (int i = 0; i < c.count && where[s] < 0; i++)
                if (fits[(size_t)s * (size_t)n + (size_t)c.view[i]] && gpuarr__lease_phys(c.view[i]) == p) where[s] = c.view[i];
        gpuarr__cands_free(&c);
    }
}

static gpuarr_result gpuarr__plan(const gpuarr_plan_step *steps, int count, gpuarr_placement placement, gpuarr_device *out) {
    GPUARR__CHECK(gpuarr__plan_check(steps, count, placement));
    size_t n = (size_t)gpuarr__g.device_count;
    bool *fits = (bool *)gpuarr__calloc(sizeof(bool) * n * (size_t)count);
    int *where = (int *)gpuarr__calloc(sizeof(int) * (size_t)count);
    uint64_t *mem = (uint64_t *)gpuarr__calloc(sizeof(uint64_t) * n);
    gpuarr_result r = fits && where && mem ? gpuarr__plan_candidates(steps, count, fits)
                                           : gpuarr__fail(GPUARR_ERROR_OUT_OF_MEMORY, "no host memory for a plan of %d steps", count);
    if (r == GPUARR_OK) {
        gpuarr__lease_state *ls = gpuarr__lease_st();
        for (size_t i = 0; i < n; i++) mem[i] = UINT64_MAX;
        for (int s = 0; s < count; s++) where[s] = -1;
        pthread_mutex_lock(&ls->lock);
        for (int p, first = 1; (p = gpuarr__plan_next(fits, where, count, placement, mem)) >= 0; first = 0) {
            if (first) ls->plan_last = p;
            gpuarr__plan_assign(steps, fits, where, count, p);
        }
        pthread_mutex_unlock(&ls->lock);
        for (int s = 0; s < count && r == GPUARR_OK; s++)
            if (where[s] < 0) r = gpuarr__fail(GPUARR_ERROR_OUT_OF_MEMORY, "no host memory to place steps[%d]", s);
        for (int s = 0; s < count && r == GPUARR_OK; s++) out[s] = gpuarr__g.devices[where[s]].info.device;
    }
    gpuarr__free(fits);
    gpuarr__free(where);
    gpuarr__free(mem);
    return r;
}

GPUARR_API gpuarr_result gpuarr_plan(const gpuarr_plan_step *steps, int count, gpuarr_placement placement, gpuarr_device *out) {
    GPUARR__BEGIN();
    GPUARR__REQUIRE_PTR(steps);
    GPUARR__REQUIRE_PTR(out);
    return gpuarr__plan(steps, count, placement, out);
}

/* GPUARR_WITH_LEASE: the scope's lease goes with it. */
static void gpuarr__lease_scope_leave(gpuarr_scope *scope) {
    if (scope->lease.id) gpuarr__lease_release_quiet(scope->lease);
}

static void gpuarr__lease_layer(gpuarr__layer *l) {
    l->name = "leases";
    l->start = gpuarr__leases_start;
    l->stop = gpuarr__leases_stop;
    l->scope_leave = gpuarr__lease_scope_leave;
    l->settings[0].id = GPUARR__SET_SLOTS;
    l->settings[0].check = gpuarr__check_slots;
    l->settings[1].id = GPUARR__SET_LEASE_DIR;
    l->settings[1].check = gpuarr__check_lease_dir;
}

#endif /* GPUARR_LEASE_INCLUDED */
