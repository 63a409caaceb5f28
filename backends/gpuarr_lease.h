/*
 * gpuarr_lease.h -- device leases (the manual's LEASES section), part of the core (not a
 * backend): included by the implementation of gpuarr.h after everything else, so it uses the
 * core's internals.
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
 */
#ifndef GPUARR_LEASE_INCLUDED
#define GPUARR_LEASE_INCLUDED

#include <sys/syscall.h>

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
} gpuarr__lease_state;

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
        gpuarr__g.leases->total[gpuarr__lease_phys(i)] = slots;
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
    for (int i = 0; i < gpuarr__g.device_count; i++) gpuarr__g.leases->total[i] = i == 0 ? (int)cpus : per_device;
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
    gpuarr__g.leases = ls;
    gpuarr__slots_defaults();
    const char *text = gpuarr__setting(GPUARR__SET_SLOTS); /* desc.slots, else GPUARR_SLOTS: checked at read */
    const char *bad;
    size_t bad_len;
    if (text) gpuarr__slots_each(text, gpuarr__slots_apply, &bad, &bad_len);
    return GPUARR_OK;
}

static void gpuarr__leases_stop(void) {
    gpuarr__lease_state *ls = gpuarr__g.leases;
    if (!ls) return;
    uint32_t live = 0;
    for (uint32_t i = 0; i < ls->rec_count; i++) live += ls->recs[i].live;
    if (live) gpuarr__log(GPUARR_LOG_WARN, "gpuarr_shutdown dropped %u leases that were never released", live);
    pthread_cond_destroy(&ls->freed);
    pthread_mutex_destroy(&ls->lock);
    gpuarr__free(ls->recs);
    gpuarr__free(ls->total);
    gpuarr__free(ls);
    gpuarr__g.leases = NULL;
}

/* ---------------------------------------------------------------------------------------------
 * Handles: (generation << 16) | (record index + 1)
 * ------------------------------------------------------------------------------------------- */
static gpuarr_lease gpuarr__lease_handle(uint32_t index) {
    gpuarr_lease l;
    l.id = (uint32_t)gpuarr__g.leases->recs[index].gen << 16 | (index + 1u);
    return l;
}

/* The live record of l (lock held). */
static gpuarr_result gpuarr__lease_get(gpuarr_lease l, const char *arg, gpuarr__lease_rec **out) {
    gpuarr__lease_state *ls = gpuarr__g.leases;
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
    gpuarr__lease_state *ls = gpuarr__g.leases;
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

static gpuarr_result gpuarr__cands_item(gpuarr__lease_cands *c, const char *list, const char *p, size_t len) {
    char item[64];
    if (len == 0 || len >= sizeof item)
        return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "desc->devices = \"%s\": item \"%.*s\" is not a device spec", list,
                            (int)len, p);
    memcpy(item, p, len);
    item[len] = '\0';
    gpuarr_backend b;
    int index;
    if (strcmp(item, "gpu") == 0 || strcmp(item, "any") == 0) {
        if (gpuarr__cands_add_gpus(c)) return GPUARR_OK;
        if (item[0] == 'a') {
            gpuarr__cands_add(c, 0);
            return GPUARR_OK;
        }
        return gpuarr__fail(GPUARR_ERROR_NO_DEVICE, "desc->devices = \"%s\": \"gpu\": none of the %d devices is a GPU", list,
                            gpuarr__g.device_count);
    }
    if (strcmp(item, "host") != 0 && strcmp(item, "cpu") != 0 && gpuarr__parse_backend_spec(item, len, true, &b, &index) && index < 0) {
        int added = 0; /* "cuda", "cuda:*": every device of the backend */
        for (int i = 0; i < gpuarr__g.device_count; i++)
            if (gpuarr__g.devices[i].info.backend == b) gpuarr__cands_add(c, i), added++;
        if (added) return GPUARR_OK;
        return gpuarr__fail(GPUARR_ERROR_NO_DEVICE, "desc->devices = \"%s\": no %s device is present", list, gpuarr__backend_names[b]);
    }
    gpuarr__dev *d;
    gpuarr_result r = gpuarr__find_device(item, &d);
    if (r != GPUARR_OK) { /* the finder's reason, said of this argument */
        char why[sizeof gpuarr__tls.error_detail];
        gpuarr__copy_string(why, sizeof why, gpuarr__tls.error_detail);
        return gpuarr__fail(r, "desc->devices = \"%s\": %s", list, why);
    }
    gpuarr__cands_add(c, (int)(d - gpuarr__g.devices));
    return GPUARR_OK;
}

static gpuarr_result gpuarr__cands_parse(const char *list, gpuarr__lease_cands *c) {
    size_t n = (size_t)gpuarr__g.device_count;
    c->count = 0;
    c->view = (int *)gpuarr__calloc(sizeof(int) * n);
    c->wants = (bool *)gpuarr__calloc(sizeof(bool) * n);
    if (!c->view || !c->wants) return gpuarr__fail(GPUARR_ERROR_OUT_OF_MEMORY, "no host memory for the candidate devices");
    for (const char *p = list;;) {
        size_t len = strcspn(p, ",");
        const char *q = p;
        while (len && q[0] == ' ') q++, len--;
        while (len && q[len - 1] == ' ') len--;
        GPUARR__CHECK(gpuarr__cands_item(c, list, q, len));
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
    gpuarr__lease_state *ls = gpuarr__g.leases;
    int p = gpuarr__lease_phys(view);
    if (gpuarr__lease_failed(view) || ls->total[p] - ls->in_use[p] < slots) return false;
    for (const gpuarr__lease_waiter *w = ls->head; w && w != me; w = w->next)
        if (w->wants[p]) return false; /* an earlier waiter comes first */
    return true;
}

/* less leased than b: a smaller share of its slots in use */
static int gpuarr__lease_cmp_share(int a, int b) {
    gpuarr__lease_state *ls = gpuarr__g.leases;
    int pa = gpuarr__lease_phys(a), pb = gpuarr__lease_phys(b);
    int64_t x = (int64_t)ls->in_use[pa] * ls->total[pb], y = (int64_t)ls->in_use[pb] * ls->total[pa];
    return x < y ? -1 : x > y ? 1 : 0;
}

/* The view to lease, or -1. mem[i]: candidate i's free memory, read here when needed. */
static int gpuarr__lease_pick(const gpuarr__lease_waiter *me, const gpuarr__lease_cands *c, const gpuarr_lease_desc *d, int slots,
                              uint64_t *mem, bool *memory_short) {
    gpuarr__lease_state *ls = gpuarr__g.leases;
    bool need_mem = d->memory_bytes || d->placement == GPUARR_PLACE_MOST_FREE || d->placement == GPUARR_PLACE_DEFAULT ||
                    d->placement == GPUARR_PLACE_LEAST_LEASED;
    int n = c->count, open[64], *ok = n <= 64 ? open : (int *)gpuarr__calloc(sizeof(int) * (size_t)n), count = 0;
    if (!ok) return -1;
    *memory_short = false;
    for (int i = 0; i < n; i++) {
        if (!gpuarr__lease_open(me, c->view[i], slots)) continue;
        mem[i] = need_mem ? gpuarr__lease_free_memory(&gpuarr__g.devices[c->view[i]]) : 0;
        if (d->memory_bytes && mem[i] < d->memory_bytes) {
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
            bool better = d->placement == GPUARR_PLACE_MOST_FREE
                              ? mem[i] > mem[best] || (mem[i] == mem[best] && share < 0)
                              : share < 0 || (share == 0 && mem[i] > mem[best]);
            if (better) best = i;
        }
    }
    if (ok != open) gpuarr__free(ok);
    return best < 0 ? -1 : c->view[best];
}

/* ---------------------------------------------------------------------------------------------
 * Messages
 * ------------------------------------------------------------------------------------------- */
static void gpuarr__lease_append(char *buf, size_t cap, const char *fmt, ...) GPUARR__PRINTF(3, 4);
static void gpuarr__lease_append(char *buf, size_t cap, const char *fmt, ...) {
    size_t used = strlen(buf);
    if (used + 1 >= cap) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + used, cap - used, fmt, ap);
    va_end(ap);
}

/* Who holds the candidates' slots: "opencl:0: 1 of 1 slots in use (pid 12 thread 13 for 5 ms)". */
static void gpuarr__lease_holders(const gpuarr__lease_cands *c, char *buf, size_t cap) {
    gpuarr__lease_state *ls = gpuarr__g.leases;
    double now = gpuarr__now_ms();
    for (int i = 0; i < c->count; i++) {
        int v = c->view[i], p = gpuarr__lease_phys(v);
        gpuarr__dev *d = &gpuarr__g.devices[v];
        gpuarr__lease_append(buf, cap, "%s%s: ", i ? "; " : "", d->info.spec);
        if (gpuarr__lease_failed(v)) {
            gpuarr__lease_append(buf, cap, "failed (%s)", gpuarr__g.devices[v].failure);
            continue;
        }
        gpuarr__lease_append(buf, cap, "%d of %d slots in use", ls->in_use[p], ls->total[p]);
        const char *sep = " by ";
        for (uint32_t r = 0; r < ls->rec_count; r++) {
            const gpuarr__lease_rec *rec = &ls->recs[r];
            if (!rec->live || rec->phys != p) continue;
            gpuarr__lease_append(buf, cap, "%spid %ld thread %ld (%d slot%s, %.0f ms)", sep, rec->pid, rec->tid, rec->slots,
                                 rec->slots == 1 ? "" : "s", now - rec->since_ms);
            sep = ", ";
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

static long gpuarr__lease_tid(void) {
#ifdef SYS_gettid
    return (long)syscall(SYS_gettid);
#else
    return 0;
#endif
}

/* The slots of `view` for this lease (lock held). */
static gpuarr_lease gpuarr__lease_grant(uint32_t index, int view, int slots, const char *affinity) {
    gpuarr__lease_state *ls = gpuarr__g.leases;
    gpuarr__lease_rec *rec = &ls->recs[index];
    rec->live = true;
    rec->view = view;
    rec->phys = gpuarr__lease_phys(view);
    rec->slots = slots;
    gpuarr__copy_string(rec->affinity, sizeof rec->affinity, affinity ? affinity : "");
    rec->pid = (long)getpid();
    rec->tid = gpuarr__lease_tid();
    rec->since_ms = gpuarr__now_ms();
    ls->in_use[rec->phys] += slots;
    ls->last_view = view;
    return gpuarr__lease_handle(index);
}

static void gpuarr__lease_dequeue(gpuarr__lease_waiter *me) {
    gpuarr__lease_state *ls = gpuarr__g.leases;
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
    gpuarr__lease_state *ls = gpuarr__g.leases;
    uint64_t *mem = (uint64_t *)gpuarr__calloc(sizeof(uint64_t) * (size_t)c->count);
    if (!mem) return gpuarr__fail(GPUARR_ERROR_OUT_OF_MEMORY, "no host memory for placement");
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
            r = gpuarr__fail(GPUARR_ERROR_DEVICE_LOST, "desc->devices = \"%s\": every candidate has failed: %s", list, why);
            break;
        }
        uint32_t index = gpuarr__lease_new_rec();
        if (index == UINT32_MAX) {
            r = gpuarr__fail(GPUARR_ERROR_OUT_OF_MEMORY, "no room for another lease (%u live at most)", GPUARR__LEASE_MAX_RECS);
            break;
        }
        int view = gpuarr__lease_pick(queued ? &me : NULL, c, d, slots, mem, &memory_short);
        if (view >= 0) {
            *out = gpuarr__lease_grant(index, view, slots, d->affinity);
            *view_out = view;
            break;
        }
        struct timespec now, until = {0, 0};
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (d->timeout_ms == 0 || (d->timeout_ms > 0 && !gpuarr__lease_before(&now, &deadline))) {
            char why[768] = "";
            gpuarr__lease_holders(c, why, sizeof why);
            r = gpuarr__fail(GPUARR_ERROR_TIMEOUT, "no %d free slot%s on \"%s\" within %lld ms%s: %s", slots, slots == 1 ? "" : "s", list,
                             (long long)d->timeout_ms,
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
        /* memory is not announced: a wait for it looks again every 50 ms */
        if (d->memory_bytes) gpuarr__lease_deadline(50, &until);
        if (d->timeout_ms > 0 && (!d->memory_bytes || gpuarr__lease_before(&deadline, &until))) until = deadline;
        if (d->timeout_ms < 0 && !d->memory_bytes) pthread_cond_wait(&ls->freed, &ls->lock);
        else pthread_cond_timedwait(&ls->freed, &ls->lock, &until);
    }
    if (queued) gpuarr__lease_dequeue(&me);
    gpuarr__free(mem);
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
    gpuarr_result r = gpuarr__cands_parse(list, &c);
    gpuarr__lease_state *ls = gpuarr__g.leases;
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
    gpuarr__lease_state *ls = gpuarr__g.leases;
    pthread_mutex_lock(&ls->lock);
    gpuarr__lease_rec *rec;
    gpuarr_result r = gpuarr__lease_get(l, "l", &rec);
    if (r == GPUARR_OK) {
        ls->in_use[rec->phys] -= rec->slots;
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
    gpuarr__lease_state *ls = gpuarr__g.leases;
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
    gpuarr__lease_state *ls = gpuarr__g.leases;
    int p = gpuarr__lease_phys((int)(dev - gpuarr__g.devices));
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
    gpuarr__lease_state *ls = gpuarr__g.leases;
    int p = gpuarr__lease_phys((int)(dev - gpuarr__g.devices));
    pthread_mutex_lock(&ls->lock);
    *total = ls->total[p];
    *in_use = ls->in_use[p];
    pthread_mutex_unlock(&ls->lock);
    return GPUARR_OK;
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

#endif /* GPUARR_LEASE_INCLUDED */
