/*
 * gpuarr_trace.h -- the trace recorder (the manual's TRACING section), a layer on the core. The
 * hooks it records from are the core's (GPUARR__TRACE_SCOPE and the gpuarr__trace_* prototypes in
 * "Tracing: the hooks"): one line at each call site of the core and the backends, dead code when
 * GPUARR_NO_TRACE is defined. This file defines what those hooks do while a trace records, and
 * gpuarr_trace_start / gpuarr_trace_stop.
 *
 * Included by the implementation of gpuarr.h after the core; registers in gpuarr__layer_list.
 */
#ifndef GPUARR_TRACE_LAYER_INCLUDED
#define GPUARR_TRACE_LAYER_INCLUDED

/* ---------------------------------------------------------------------------------------------
 * Tracing: the recorder. Each thread appends finished events to a buffer of its own (fixed
 * capacity: GPUARR_TRACE_EVENTS, default 65536; a full buffer drops the thread's further events
 * and counts them); gpuarr_trace_stop gathers every buffer, including those of threads that
 * exited meanwhile (handed over by a thread-exit destructor), and writes Chrome trace-event JSON.
 * The recorder's state is its own, not gpuarr__g's: a trace may start before gpuarr_init and run
 * across gpuarr_shutdown, which clears gpuarr__g.
 * ------------------------------------------------------------------------------------------- */
#define GPUARR__TRACE_EVENTS_DEFAULT 65536
#define GPUARR__TRACE_EVENTS_MAX (1 << 24)
#define GPUARR__TRACE_STREAM_TID 100000 /* a stream's track: this + its serial; threads count from 1 */

typedef struct gpuarr__trace_ring {
    pthread_mutex_t lock; /* the owner appends, the writer reads: contended only at a stop */
    struct gpuarr__trace_ring *next;
    uint32_t tid;         /* the thread's track */
    uint32_t key_epoch;   /* the thread key that holds it (gpuarr__trace.key_epoch) */
    uint32_t session;     /* the trace its events belong to */
    uint32_t capacity, count;
    uint64_t dropped;
    gpuarr__trace_event *events;
} gpuarr__trace_ring;

typedef struct gpuarr__trace_state {
    pthread_mutex_t lock;        /* start, stop, the two lists and the key */
    pthread_key_t key;           /* its destructor hands an exiting thread's buffer over */
    bool key_ok;
    uint32_t key_epoch;          /* counts keys made: one is deleted when tracing ends with the library */
    bool from_env;               /* started by GPUARR_TRACE: the last gpuarr_shutdown stops it */
    uint32_t session;            /* atomic: the running trace's number, 0 before the first */
    uint32_t capacity;           /* events per thread in this trace */
    uint32_t next_tid;
    uint64_t t0;                 /* the start, CLOCK_MONOTONIC ns */
    int64_t offset;              /* host clock - device clock (gpuarr__trace_resolve); one for all */
    bool offset_known;
    gpuarr__trace_ring *live;    /* buffers of running threads */
    gpuarr__trace_ring *retired; /* buffers of threads that exited during this trace */
    FILE *file;
    char path[GPUARR__SETTING_MAX_TEXT + 1];
} gpuarr__trace_state;
#if defined(__GNUC__) || defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
#endif
static gpuarr__trace_state gpuarr__trace = {PTHREAD_MUTEX_INITIALIZER};
#if defined(__GNUC__) || defined(__clang__)
#pragma GCC diagnostic pop
#endif
static GPUARR__THREAD_LOCAL gpuarr__trace_ring *gpuarr__trace_mine;

/* The recorder's memory outlives init cycles, so never the desc's allocator. */
static void *gpuarr__trace_malloc(size_t n) {
#ifdef GPUARR_MALLOC
    return GPUARR_MALLOC(n);
#else
    return malloc(n);
#endif
}
static void gpuarr__trace_free_mem(void *p) {
#ifdef GPUARR_FREE
    GPUARR_FREE(p);
#else
    free(p);
#endif
}

/* An event's commands let go unread (a resolve has read every one by then: there should be none). */
static void gpuarr__trace_discard(gpuarr__trace_event *e) {
    if (!e->first || !gpuarr__initialized()) return; /* without the backend: kept, not called */
    e->clock->release(e->first);
    e->clock->release(e->last);
    e->first = e->last = NULL;
}
static void gpuarr__trace_ring_free(gpuarr__trace_ring *r) {
    for (uint32_t i = 0; i < r->count; i++) gpuarr__trace_discard(&r->events[i]);
    pthread_mutex_destroy(&r->lock);
    gpuarr__trace_free_mem(r->events);
    gpuarr__trace_free_mem(r);
}

/* A thread ends: its buffer goes to the writer if it holds events of the running trace. */
static void gpuarr__trace_thread_exit(void *p) {
    gpuarr__trace_ring *r = (gpuarr__trace_ring *)p;
    pthread_mutex_lock(&gpuarr__trace.lock);
    for (gpuarr__trace_ring **at = &gpuarr__trace.live; *at; at = &(*at)->next)
        if (*at == r) {
            *at = r->next;
            break;
        }
    bool keep = (r->count || r->dropped) && r->session == gpuarr__trace.session && __atomic_load_n(&gpuarr__trace_on, __ATOMIC_RELAXED);
    if (keep) {
        r->next = gpuarr__trace.retired;
        gpuarr__trace.retired = r;
    }
    pthread_mutex_unlock(&gpuarr__trace.lock);
    if (gpuarr__trace_mine == r) gpuarr__trace_mine = NULL;
    if (!keep) gpuarr__trace_ring_free(r);
}

/* The thread key exists while tracing may happen: made by the first event after none, deleted
   when the library is shut down with no trace running (gpuarr__trace_at_shutdown), so that a
   library unloaded after that (a plugin's dlclose) leaves no destructor behind. Lock held. */
static void gpuarr__trace_key_make(void) {
    if (gpuarr__trace.key_ok) return;
    gpuarr__trace.key_ok = pthread_key_create(&gpuarr__trace.key, gpuarr__trace_thread_exit) == 0;
    if (gpuarr__trace.key_ok) __atomic_store_n(&gpuarr__trace.key_epoch, gpuarr__trace.key_epoch + 1, __ATOMIC_RELAXED);
}
static void gpuarr__trace_key_delete(void) {
    if (!gpuarr__trace.key_ok) return;
    pthread_key_delete(gpuarr__trace.key); /* threads' buffers stay on the live list, reused */
    gpuarr__trace.key_ok = false;
}

/* This thread's buffer, made at its first event (and put under the current key). */
static gpuarr__trace_ring *gpuarr__trace_ring_mine(void) {
    gpuarr__trace_ring *r = gpuarr__trace_mine;
    if (r && r->key_epoch == __atomic_load_n(&gpuarr__trace.key_epoch, __ATOMIC_RELAXED)) return r;
    if (!r) {
        r = (gpuarr__trace_ring *)gpuarr__trace_malloc(sizeof *r);
        if (!r) return NULL;
        memset(r, 0, sizeof *r);
        pthread_mutex_init(&r->lock, NULL);
    }
    pthread_mutex_lock(&gpuarr__trace.lock);
    if (!r->tid) {
        r->tid = ++gpuarr__trace.next_tid;
        r->next = gpuarr__trace.live;
        gpuarr__trace.live = r;
    }
    gpuarr__trace_key_make();
    if (gpuarr__trace.key_ok) pthread_setspecific(gpuarr__trace.key, r);
    __atomic_store_n(&r->key_epoch, gpuarr__trace.key_epoch, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&gpuarr__trace.lock);
    gpuarr__trace_mine = r;
    return r;
}

/* false: dropped (the buffer is full, or there is none). */
static bool gpuarr__trace_append(const gpuarr__trace_event *ev) {
    gpuarr__trace_ring *r = gpuarr__trace_ring_mine();
    if (!r) return false;
    uint32_t session = __atomic_load_n(&gpuarr__trace.session, __ATOMIC_ACQUIRE);
    uint32_t capacity = __atomic_load_n(&gpuarr__trace.capacity, __ATOMIC_RELAXED);
    pthread_mutex_lock(&r->lock);
    if (r->session != session) { /* the first event of a new trace: start over */
        r->session = session;
        for (uint32_t i = 0; i < r->count; i++) gpuarr__trace_discard(&r->events[i]); /* none: read at the stop */
        r->count = 0;
        r->dropped = 0;
        if (r->capacity != capacity) {
            gpuarr__trace_free_mem(r->events);
            r->events = (gpuarr__trace_event *)gpuarr__trace_malloc(sizeof *r->events * capacity);
            r->capacity = r->events ? capacity : 0;
        }
    }
    bool kept = r->count < r->capacity;
    if (kept) r->events[r->count++] = *ev;
    else r->dropped++;
    pthread_mutex_unlock(&r->lock);
    return kept;
}

static GPUARR__THREAD_LOCAL gpuarr__trace_scope *gpuarr__trace_top; /* innermost open scope on a stream track */

static GPUARR__FOR_BACKENDS void gpuarr__trace_rec_command(void *command, const gpuarr__trace_clock *clock) {
    gpuarr__trace_scope *sc = gpuarr__trace_top;
    if (!sc || sc->ev.backend != (uint8_t)clock->backend || (sc->ev.clock && sc->ev.clock != clock)) return;
    clock->retain(command);
    uint64_t now = gpuarr__trace_now();
    if (!sc->ev.first) {
        sc->ev.first = command;
        sc->ev.first_host = now;
        clock->retain(command);
    }
    if (sc->ev.last) clock->release(sc->ev.last);
    sc->ev.last = command;
    sc->ev.last_host = now;
    sc->ev.clock = clock;
}

/* Reads a recorded event's commands' device times and lets them go. The device's clock is put on
   the host's through an offset: each command was queued (device time Q) before the host read its
   clock after the enqueue (H), so H - Q is the offset plus that call's duration; the smallest over
   the trace (gpuarr__trace.offset) is the best estimate. Here the event keeps its last command's
   end in device time (device_timed 2); gpuarr__trace_apply converts it once all are read. */
static void gpuarr__trace_resolve(gpuarr__trace_event *e) {
    if (!e->first) return;
    const gpuarr__trace_clock *c = e->clock;
    uint64_t q0 = 0, s0 = 0, e0 = 0, q1 = 0, s1 = 0, e1 = 0;
    if (c->times(e->first, &q0, &s0, &e0) && c->times(e->last, &q1, &s1, &e1) && e1 >= q1) {
        int64_t o0 = (int64_t)(e->first_host - q0), o1 = (int64_t)(e->last_host - q1), o = o0 < o1 ? o0 : o1;
        if (!gpuarr__trace.offset_known || o < gpuarr__trace.offset) gpuarr__trace.offset = o;
        gpuarr__trace.offset_known = true;
        e->last_host = e1;
        e->device_timed = 2;
    }
    c->release(e->first);
    c->release(e->last);
    e->first = e->last = NULL;
}

/* The event spans its call and, once converted, its commands' run on the device (the device
   starts after the enqueue, itself after the event began: only the end moves). */
static void gpuarr__trace_apply(gpuarr__trace_event *e) {
    if (e->device_timed != 2) return;
    uint64_t end = (uint64_t)((int64_t)e->last_host + gpuarr__trace.offset);
    if (end > e->ts + e->dur) e->dur = end - e->ts;
    e->device_timed = 1;
}

/* A scope's commands go on to the one around it on the same device. */
static void gpuarr__trace_hand_out(gpuarr__trace_scope *sc) {
    gpuarr__trace_scope *o = sc->outer;
    const gpuarr__trace_clock *c = sc->ev.clock;
    if (!o || !sc->ev.first || o->ev.backend != sc->ev.backend || o->ev.index != sc->ev.index || (o->ev.clock && o->ev.clock != c)) return;
    if (!o->ev.first) {
        c->retain(sc->ev.first);
        o->ev.first = sc->ev.first;
        o->ev.first_host = sc->ev.first_host;
    }
    c->retain(sc->ev.last);
    if (o->ev.last) c->release(o->ev.last);
    o->ev.last = sc->ev.last;
    o->ev.last_host = sc->ev.last_host;
    o->ev.clock = c;
}

static void gpuarr__trace_rec_finish(gpuarr__trace_scope *sc) {
    uint64_t end = gpuarr__trace_now();
    sc->ev.dur = end > sc->ev.ts ? end - sc->ev.ts : 0;
    if (sc->stacked) {
        gpuarr__trace_top = sc->outer;
        gpuarr__trace_hand_out(sc);
    }
    if (!gpuarr__trace_append(&sc->ev) && sc->ev.first) { /* dropped: its commands go now */
        sc->ev.clock->release(sc->ev.first);
        sc->ev.clock->release(sc->ev.last);
    }
}

/* Every recorded command's times, read while its backend is loaded (trace lock held): at a stop,
   and at the last gpuarr_shutdown before the backends unload. A command not complete by then
   leaves its event with host times only. */
static void gpuarr__trace_resolve_all(void) {
    gpuarr__trace_ring *lists[2] = {gpuarr__trace.live, gpuarr__trace.retired};
    for (int pass = 0; pass < 2; pass++)
        for (int l = 0; l < 2; l++)
            for (gpuarr__trace_ring *r = lists[l]; r; r = r->next) {
                pthread_mutex_lock(&r->lock);
                for (uint32_t i = 0; i < r->count; i++) {
                    if (pass == 0) gpuarr__trace_resolve(&r->events[i]);
                    else gpuarr__trace_apply(&r->events[i]);
                }
                pthread_mutex_unlock(&r->lock);
            }
}

/* ---- the hooks' halves that run while a trace records ---- */
static void gpuarr__trace_open(gpuarr__trace_scope *sc, gpuarr__trace_kind kind, const char *name, gpuarr__dev *d, gpuarr__stream *s) {
    memset(&sc->ev, 0, sizeof sc->ev);
    sc->ev.kind = (uint8_t)kind;
    sc->ev.name = name;
    if (s) d = s->dev;
    if (d) {
        sc->ev.backend = (uint8_t)d->info.backend;
        sc->ev.index = (int16_t)d->info.index;
    }
    sc->ev.track = s ? s->serial : 0;
    sc->on = true;
    sc->stacked = s != NULL;
    if (sc->stacked) {
        sc->outer = gpuarr__trace_top;
        gpuarr__trace_top = sc;
    }
    sc->ev.ts = gpuarr__trace_now();
}

static uint64_t gpuarr__trace_pack_dev(const gpuarr__dev *d) { return d ? (uint64_t)d->info.backend << 16 | (uint16_t)d->info.index : 0; }

static void gpuarr__trace_rec_call(gpuarr__trace_scope *sc, gpuarr__dev *dst, gpuarr__dev *src, size_t count, bool async) {
    gpuarr__trace_open(sc, GPUARR__TRACE_CALL, gpuarr__tls.api ? gpuarr__tls.api : "gpuarr", dst, NULL);
    sc->ev.a = count;
    sc->ev.b = gpuarr__trace_pack_dev(src);
    sc->ev.s1 = async ? "async" : "sync";
}

/* How bytes between host memory and d travel: the transfer engine's own choice. */
static const char *gpuarr__trace_path(gpuarr__dev *d, const void *host, size_t bytes, bool host_work, bool async) {
    switch (gpuarr__host_path(d, host, bytes, host_work, async)) {
    case GPUARR__PATH_STAGED: return "staged";
    case GPUARR__PATH_HOST_TEMP: return "host-temp";
    case GPUARR__PATH_QUEUED: return "queued";
    default: return d->info.host_unified ? "mapped" : "direct";
    }
}

static void gpuarr__trace_rec_transfer(gpuarr__trace_scope *sc, gpuarr__stream *ss, gpuarr__stream *ds, const struct gpuarr__view *dst,
                                   const struct gpuarr__view *src, size_t n, bool async) {
    gpuarr__dev *sd = src->dev, *dd = dst->dev;
    bool at_dest = gpuarr__cast_side(src->dtype, dst->dtype) == GPUARR__CAST_AT_DEST;
    gpuarr_dtype wire = at_dest ? src->dtype : dst->dtype; /* the narrower dtype travels */
    size_t bytes = n * gpuarr__dtype_sizes[wire];
    const char *name, *dir, *path;
    gpuarr__stream *on = ss;
    if (sd == dd) {
        name = gpuarr__backend_has(sd->backend, GPUARR__BACKEND_HOST_MEMORY) ? "transfer h2h" : "transfer d2d";
        dir = gpuarr__backend_has(sd->backend, GPUARR__BACKEND_HOST_MEMORY) ? "h2h" : "d2d";
        path = "local";
    } else if (gpuarr__backend_has(sd->backend, GPUARR__BACKEND_HOST_MEMORY)) {
        name = "transfer h2d", dir = "h2d", on = ds;
        path = gpuarr__trace_path(dd, gpuarr__view_host_ptr(*src), bytes, wire != src->dtype, async);
    } else if (gpuarr__backend_has(dd->backend, GPUARR__BACKEND_HOST_MEMORY)) {
        name = "transfer d2h", dir = "d2h";
        path = gpuarr__trace_path(sd, gpuarr__view_host_ptr(*dst), bytes, wire != dst->dtype, async);
    } else {
        name = "transfer d2d", dir = "d2d";
        bool peer = sd->backend == dd->backend && !gpuarr__g.no_peer_copies && gpuarr__backend_can_copy_peer(dd, sd);
        path = peer ? "peer" : "bounce"; /* bounce: through host memory */
        if (!peer) on = ds;
    }
    gpuarr__trace_open(sc, GPUARR__TRACE_TRANSFER, name, NULL, on);
    sc->ev.a = bytes;
    sc->ev.b = n;
    sc->ev.s1 = dir;
    sc->ev.s2 = path;
}

static void gpuarr__trace_rec_cast(gpuarr__trace_scope *sc, gpuarr__stream *s, gpuarr_dtype to, gpuarr_dtype from, size_t count) {
    gpuarr__trace_open(sc, GPUARR__TRACE_CAST, "cast", NULL, s);
    sc->ev.a = count;
    sc->ev.s1 = gpuarr__dtype_valid(from) ? gpuarr__dtype_names[from] : "?";
    sc->ev.s2 = gpuarr__dtype_valid(to) ? gpuarr__dtype_names[to] : "?";
}

static void gpuarr__trace_rec_fill(gpuarr__trace_scope *sc, gpuarr__stream *s, size_t bytes, size_t pattern_size) {
    gpuarr__trace_open(sc, GPUARR__TRACE_FILL, "fill", NULL, s);
    sc->ev.a = bytes;
    sc->ev.b = pattern_size;
}

/* s1: where the code came from (the backend sets it: GPUARR__TRACE_SET(s1, ...)), s2: "true"
   when a cached binary was loaded instead of compiling. */
static GPUARR__FOR_BACKENDS void gpuarr__trace_rec_kernel(gpuarr__trace_scope *sc, gpuarr__dev *d, int from, int to) {
    gpuarr__trace_open(sc, GPUARR__TRACE_KERNEL, "kernel build", d, NULL);
    sc->ev.a = (uint64_t)from;
    sc->ev.b = (uint64_t)to;
    sc->ev.s1 = "source";
    sc->ev.s2 = "false";
}

static void gpuarr__trace_rec_alloc(gpuarr__trace_scope *sc, gpuarr__dev *d, bool pinned, size_t bytes, const char *cache) {
    gpuarr__trace_open(sc, GPUARR__TRACE_ALLOC, "alloc", d, NULL);
    sc->ev.a = bytes;
    sc->ev.s1 = pinned ? "pinned" : "device";
    sc->ev.s2 = cache;
}

static void gpuarr__trace_rec_free(gpuarr__trace_scope *sc, gpuarr__dev *d, bool pinned, size_t bytes, const char *to) {
    gpuarr__trace_open(sc, GPUARR__TRACE_FREE, "free", d, NULL);
    sc->ev.a = bytes;
    sc->ev.s1 = pinned ? "pinned" : "device";
    sc->ev.s2 = to;
}

/* s waits for `after`'s work so far, or (after NULL) for event e. */
static void gpuarr__trace_rec_wait(gpuarr__trace_scope *sc, gpuarr__stream *s, gpuarr__stream *after, gpuarr__event *e) {
    gpuarr__trace_open(sc, GPUARR__TRACE_WAIT, "stream wait", NULL, s);
    sc->ev.a = after ? after->serial : 0;
    sc->ev.b = gpuarr__trace_pack_dev(after ? after->dev : e ? e->dev : NULL);
    sc->ev.s1 = after ? "stream" : "event";
}

static void gpuarr__trace_rec_oom(uint64_t t0, gpuarr__dev *d, const char *step, size_t requested, gpuarr_result r) {
    gpuarr__trace_scope sc;
    gpuarr__trace_open(&sc, GPUARR__TRACE_OOM, step, d, NULL);
    sc.ev.ts = t0;
    sc.ev.a = requested;
    sc.ev.s1 = r == GPUARR_OK ? "served" : r == GPUARR_ERROR_OUT_OF_MEMORY ? "still out of memory" : gpuarr_result_name(r);
    gpuarr__trace_rec_finish(&sc);
}

/* s1: the outcome ("granted" or the result's name); a: slots, b: 1 when the call waited. The
   device is set when the lease is granted. */
static void gpuarr__trace_rec_lease(gpuarr__trace_scope *sc, int slots) {
    gpuarr__trace_open(sc, GPUARR__TRACE_LEASE, "lease acquire", NULL, NULL);
    sc->ev.a = (uint64_t)slots;
}

static void gpuarr__trace_rec_lease_end(gpuarr__trace_scope *sc, gpuarr__dev *d, gpuarr_result r, bool waited) {
    if (!sc->on) return;
    if (d) {
        sc->ev.backend = (uint8_t)d->info.backend;
        sc->ev.index = (int16_t)d->info.index;
    }
    sc->ev.b = waited;
    sc->ev.s1 = r == GPUARR_OK ? "granted" : gpuarr_result_name(r);
}

/* ---- writing the file ---- */
static int gpuarr__trace_order(const void *pa, const void *pb) {
    const gpuarr__trace_event *a = (const gpuarr__trace_event *)pa, *b = (const gpuarr__trace_event *)pb;
    if (a->track != b->track) return a->track < b->track ? -1 : 1;
    if (a->ts != b->ts) return a->ts < b->ts ? -1 : 1;
    if (a->dur != b->dur) return a->dur > b->dur ? -1 : 1; /* a parent before the children it starts with */
    if (a->kind != b->kind) return a->kind < b->kind ? -1 : 1; /* the same span: a transfer around its cast */
    return 0;
}

/* A stream runs its work in order, but threads enqueue on one stream concurrently and their
   host-side times overlap: an event that overlaps an earlier one on its stream without fitting
   inside it starts when that one ends. true if anything moved (sort again). */
static bool gpuarr__trace_in_order(gpuarr__trace_event *ev, size_t n, uint64_t *stack) {
    bool moved = false;
    for (size_t i = 0, j; i < n; i = j) {
        for (j = i; j < n && ev[j].track == ev[i].track; j++) {}
        if (ev[i].track < GPUARR__TRACE_STREAM_TID) continue;
        size_t depth = 0;
        for (size_t k = i; k < j; k++) {
            uint64_t end = ev[k].ts + ev[k].dur;
            while (depth && stack[depth - 1] <= ev[k].ts) depth--;
            while (depth && end > stack[depth - 1]) {
                ev[k].ts = stack[--depth];
                moved = true;
                while (depth && stack[depth - 1] <= ev[k].ts) depth--;
            }
            ev[k].dur = end - ev[k].ts;
            stack[depth++] = end;
        }
    }
    return moved;
}

static void gpuarr__trace_put_dev(FILE *f, const char *key, uint64_t packed) {
    int backend = (int)(packed >> 16), index = (int)(int16_t)(uint16_t)(packed & 0xffffu);
    if (backend <= 0 || backend >= GPUARR_BACKEND_COUNT) fprintf(f, ",\"%s\":\"?\"", key);
    else if (backend == GPUARR_BACKEND_HOST) fprintf(f, ",\"%s\":\"host\"", key);
    else fprintf(f, ",\"%s\":\"%s:%d\"", key, gpuarr__backend_names[backend], index);
}

static void gpuarr__trace_put_args(FILE *f, const gpuarr__trace_event *e) {
    uint64_t dev = (uint64_t)e->backend << 16 | (uint16_t)e->index;
    unsigned long long a = (unsigned long long)e->a, b = (unsigned long long)e->b;
    fprintf(f, "\"args\":{\"timing\":\"%s\"", e->device_timed ? "host+device" : "host");
    switch ((gpuarr__trace_kind)e->kind) {
    case GPUARR__TRACE_CALL:
        gpuarr__trace_put_dev(f, "src", e->b);
        gpuarr__trace_put_dev(f, "dst", dev);
        fprintf(f, ",\"count\":%llu,\"mode\":\"%s\"", a, e->s1);
        break;
    case GPUARR__TRACE_TRANSFER:
        gpuarr__trace_put_dev(f, "device", dev);
        fprintf(f, ",\"bytes\":%llu,\"count\":%llu,\"direction\":\"%s\",\"path\":\"%s\"", a, b, e->s1, e->s2);
        break;
    case GPUARR__TRACE_CAST:
        gpuarr__trace_put_dev(f, "device", dev);
        fprintf(f, ",\"from\":\"%s\",\"to\":\"%s\",\"count\":%llu", e->s1, e->s2, a);
        break;
    case GPUARR__TRACE_FILL:
        gpuarr__trace_put_dev(f, "device", dev);
        fprintf(f, ",\"bytes\":%llu,\"pattern_size\":%llu", a, b);
        break;
    case GPUARR__TRACE_KERNEL:
        gpuarr__trace_put_dev(f, "device", dev);
        fprintf(f, ",\"kernel\":\"cast %s->%s\",\"origin\":\"%s\",\"cached\":%s", a < GPUARR_DTYPE_COUNT ? gpuarr__dtype_names[a] : "?",
                b < GPUARR_DTYPE_COUNT ? gpuarr__dtype_names[b] : "?", e->s1, e->s2);
        break;
    case GPUARR__TRACE_ALLOC:
    case GPUARR__TRACE_FREE:
        gpuarr__trace_put_dev(f, "device", dev);
        fprintf(f, ",\"pool\":\"%s\",\"bytes\":%llu,\"%s\":\"%s\"", e->s1, a, e->kind == GPUARR__TRACE_ALLOC ? "cache" : "to", e->s2);
        break;
    case GPUARR__TRACE_OOM:
        gpuarr__trace_put_dev(f, "device", dev);
        fprintf(f, ",\"requested\":%llu,\"outcome\":\"%s\"", a, e->s1);
        break;
    case GPUARR__TRACE_WAIT:
        gpuarr__trace_put_dev(f, "device", dev);
        if (e->a) {
            gpuarr__trace_put_dev(f, "after_device", e->b);
            fprintf(f, ",\"after_stream\":%llu", a);
        } else {
            gpuarr__trace_put_dev(f, "event_device", e->b);
        }
        break;
    case GPUARR__TRACE_LEASE:
        if (e->backend) gpuarr__trace_put_dev(f, "device", dev);
        fprintf(f, ",\"slots\":%llu,\"waited\":%s,\"outcome\":\"%s\"", a, b ? "true" : "false", e->s1 ? e->s1 : "?");
        break;
    default: break;
    }
    fputc('}', f);
}

static void gpuarr__trace_put_json_string(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c < 0x20) fprintf(f, "\\u%04x", c);
        else fputc(c, f);
    }
    fputc('"', f);
}

typedef struct gpuarr__trace_thread {
    uint32_t tid;
    uint64_t dropped;
} gpuarr__trace_thread;

/* Copies r's events of this trace into *ev (grown as needed), with their final track. */
static bool gpuarr__trace_gather_one(gpuarr__trace_ring *r, uint32_t session, gpuarr__trace_event **ev, size_t *n, size_t *cap,
                                     gpuarr__trace_thread *thread) {
    bool ok = true;
    pthread_mutex_lock(&r->lock);
    thread->tid = r->tid;
    thread->dropped = 0;
    if (r->session == session) {
        thread->dropped = r->dropped;
        if (*n + r->count > *cap) {
            size_t want = GPUARR__MAX(*cap * 2, *n + r->count);
            gpuarr__trace_event *grown = (gpuarr__trace_event *)gpuarr__trace_malloc(sizeof **ev * GPUARR__MAX(want, (size_t)1));
            if (grown) {
                if (*n) memcpy(grown, *ev, sizeof **ev * *n);
                gpuarr__trace_free_mem(*ev);
                *ev = grown;
                *cap = want;
            } else {
                ok = false;
            }
        }
        for (uint32_t i = 0; ok && i < r->count; i++) {
            gpuarr__trace_event e = r->events[i];
            e.track = e.track ? GPUARR__TRACE_STREAM_TID + e.track : r->tid;
            (*ev)[(*n)++] = e;
        }
        r->count = 0;
        r->dropped = 0;
        r->session = 0; /* its next event starts over */
    }
    pthread_mutex_unlock(&r->lock);
    return ok;
}

static void gpuarr__trace_write_events(FILE *f, const gpuarr__trace_event *ev, size_t n, const gpuarr__trace_thread *threads,
                                       size_t nthreads, uint64_t dropped) {
    long pid = (long)getpid();
    fprintf(f, "{\"displayTimeUnit\":\"ns\",\"otherData\":{\"library\":\"gpuarr %s\",\"dropped_events\":%llu,\"events_per_thread\":%u,"
               "\"timing\":\"host: read on the calling thread around each call; host+device: until its OpenCL commands ended on the device\",\"file\":",
            GPUARR_VERSION_STRING, (unsigned long long)dropped, gpuarr__trace.capacity);
    gpuarr__trace_put_json_string(f, gpuarr__trace.path);
    fprintf(f, "},\n\"traceEvents\":[\n");
    fprintf(f, "{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":%ld,\"tid\":0,\"ts\":0,\"args\":{\"name\":\"gpuarr\"}}", pid);
    for (size_t i = 0; i < nthreads; i++)
        fprintf(f, ",\n{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":%ld,\"tid\":%u,\"ts\":0,\"args\":{\"name\":\"thread %u\",\"dropped_events\":%llu}}",
                pid, threads[i].tid, threads[i].tid, (unsigned long long)threads[i].dropped);
    for (size_t i = 0; i < n; i++) {
        const gpuarr__trace_event *e = &ev[i];
        if (e->track >= GPUARR__TRACE_STREAM_TID && (i == 0 || ev[i - 1].track != e->track)) {
            fprintf(f, ",\n{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":%ld,\"tid\":%llu,\"ts\":0,\"args\":{\"name\":\"stream ", pid,
                    (unsigned long long)e->track);
            if (e->backend == GPUARR_BACKEND_HOST) fprintf(f, "host");
            else fprintf(f, "%s:%d", e->backend < GPUARR_BACKEND_COUNT ? gpuarr__backend_names[e->backend] : "?", e->index);
            fprintf(f, "#%llu\"}}", (unsigned long long)(e->track - GPUARR__TRACE_STREAM_TID));
        }
        uint64_t ts = e->ts - gpuarr__trace.t0;
        fprintf(f, ",\n{\"ph\":\"X\",\"name\":\"%s\",\"cat\":\"gpuarr\",\"pid\":%ld,\"tid\":%llu,\"ts\":%llu.%03llu,\"dur\":%llu.%03llu,", e->name,
                pid, (unsigned long long)e->track, (unsigned long long)(ts / 1000u), (unsigned long long)(ts % 1000u),
                (unsigned long long)(e->dur / 1000u), (unsigned long long)(e->dur % 1000u));
        gpuarr__trace_put_args(f, e);
        fputc('}', f);
    }
    fprintf(f, "\n]}\n");
}

/* Stops the running trace and writes its file (gpuarr__trace.lock held). */
static gpuarr_result gpuarr__trace_stop_locked(void) {
    __atomic_store_n(&gpuarr__trace_on, 0u, __ATOMIC_RELAXED);
    if (gpuarr__initialized()) gpuarr__trace_resolve_all();
    uint32_t session = gpuarr__trace.session;
    size_t nthreads = 0, n = 0, cap = 0;
    for (gpuarr__trace_ring *r = gpuarr__trace.live; r; r = r->next) nthreads++;
    for (gpuarr__trace_ring *r = gpuarr__trace.retired; r; r = r->next) nthreads++;
    gpuarr__trace_thread *threads = (gpuarr__trace_thread *)gpuarr__trace_malloc(sizeof *threads * (nthreads + 1));
    gpuarr__trace_event *ev = NULL;
    bool ok = threads != NULL;
    size_t t = 0;
    uint64_t dropped = 0;
    gpuarr__trace_ring *lists[2] = {gpuarr__trace.live, gpuarr__trace.retired};
    for (int l = 0; l < 2; l++)
        for (gpuarr__trace_ring *r = lists[l]; r && ok; r = r->next) {
            gpuarr__trace_thread th;
            size_t before = n;
            ok = gpuarr__trace_gather_one(r, session, &ev, &n, &cap, &th);
            if (n > before || th.dropped) threads[t++] = th;
            dropped += th.dropped;
        }
    while (gpuarr__trace.retired) {
        gpuarr__trace_ring *r = gpuarr__trace.retired;
        gpuarr__trace.retired = r->next;
        gpuarr__trace_ring_free(r);
    }
    /* an event begun before this trace started (ts < t0) is not part of it */
    size_t kept = 0;
    for (size_t i = 0; ok && i < n; i++)
        if (ev[i].ts >= gpuarr__trace.t0) ev[kept++] = ev[i];
    n = kept;
    uint64_t *stack = ok && n ? (uint64_t *)gpuarr__trace_malloc(sizeof *stack * n) : NULL;
    if (n && !stack) ok = false;
    if (ok && n) {
        int rounds = 0;
        do qsort(ev, n, sizeof *ev, gpuarr__trace_order);
        while (gpuarr__trace_in_order(ev, n, stack) && ++rounds < 8);
        qsort(ev, n, sizeof *ev, gpuarr__trace_order);
    }
    gpuarr__trace_free_mem(stack);
    FILE *f = gpuarr__trace.file;
    gpuarr__trace.file = NULL;
    gpuarr_result r = GPUARR_OK;
    if (!ok) {
        fprintf(f, "{\"displayTimeUnit\":\"ns\",\"traceEvents\":[]}\n");
        r = gpuarr__fail(GPUARR_ERROR_OUT_OF_MEMORY, "no host memory to gather the trace's events; %s holds an empty trace", gpuarr__trace.path);
    } else {
        gpuarr__trace_write_events(f, ev, n, threads, t, dropped);
    }
    bool written = !ferror(f);
    if (fclose(f) != 0) written = false;
    if (r == GPUARR_OK && !written) r = gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "writing %s failed: %s", gpuarr__trace.path, strerror(errno));
    gpuarr__trace_free_mem(ev);
    gpuarr__trace_free_mem(threads);
    gpuarr__trace.from_env = false;
    return r;
}

/* GPUARR_TRACE_EVENTS: a thread's capacity, 1 to 2^24 events. */
static gpuarr_result gpuarr__check_trace_events(const char *name, const char *value, int *out) {
    long v;
    if (!gpuarr__parse_uint(value, strlen(value), GPUARR__TRACE_EVENTS_MAX, &v) || v < 1)
        return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "%s=\"%s\": expected a number of events from 1 to %d", name, value,
                            GPUARR__TRACE_EVENTS_MAX);
    *out = (int)v;
    return GPUARR_OK;
}

/* Starts a trace into path (gpuarr__trace.lock held). */

/* What the core's hooks call while a trace records (gpuarr__trace_recorder). */
static const gpuarr__trace_hooks gpuarr__trace_rec_hooks = {
    gpuarr__trace_rec_finish, gpuarr__trace_rec_call,  gpuarr__trace_rec_transfer, gpuarr__trace_rec_cast,
    gpuarr__trace_rec_fill,   gpuarr__trace_rec_kernel, gpuarr__trace_rec_alloc,  gpuarr__trace_rec_free,
    gpuarr__trace_rec_wait,   gpuarr__trace_rec_oom,    gpuarr__trace_rec_lease,  gpuarr__trace_rec_lease_end,
    gpuarr__trace_rec_command};

static gpuarr_result gpuarr__trace_start_locked(const char *path, bool from_env) {
    if (!path || !*path) return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "path is %s", path ? "empty" : "NULL");
    if (strlen(path) > GPUARR__SETTING_MAX_TEXT)
        return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "path is %zu characters long; at most %d are accepted", strlen(path),
                            GPUARR__SETTING_MAX_TEXT);
    if (__atomic_load_n(&gpuarr__trace_on, __ATOMIC_RELAXED))
        return gpuarr__fail(GPUARR_ERROR_UNSUPPORTED, "a trace is already being recorded to %s (one at a time: gpuarr_trace_stop it first)",
                            gpuarr__trace.path);
#ifdef GPUARR_NO_TRACE
    GPUARR__UNUSED(from_env);
    return gpuarr__fail(GPUARR_ERROR_UNSUPPORTED, "tracing is compiled out of this build (GPUARR_NO_TRACE)");
#else
    /* the capacity: GPUARR_TRACE_EVENTS as gpuarr_init read it, else (not initialized) as it is now */
    int capacity = GPUARR__TRACE_EVENTS_DEFAULT;
    const char *events = gpuarr__initialized() ? gpuarr__setting(GPUARR__SET_TRACE_EVENTS)
                                                 : gpuarr__env("GPUARR_TRACE_EVENTS", GPUARR__ENV_KEPT);
    if (events && *events) GPUARR__CHECK(gpuarr__check_trace_events("GPUARR_TRACE_EVENTS", events, &capacity));
    FILE *f = fopen(path, "w");
    if (!f) return gpuarr__fail(GPUARR_ERROR_INVALID_ARGUMENT, "cannot write the trace to %s: %s", path, strerror(errno));
    gpuarr__trace.file = f;
    gpuarr__copy_string(gpuarr__trace.path, sizeof gpuarr__trace.path, path);
    gpuarr__trace.from_env = from_env;
    gpuarr__trace.t0 = gpuarr__trace_now();
    gpuarr__trace.offset_known = false;
    __atomic_store_n(&gpuarr__trace.capacity, (uint32_t)capacity, __ATOMIC_RELAXED);
    uint32_t session = gpuarr__trace.session + 1 ? gpuarr__trace.session + 1 : 1;
    __atomic_store_n(&gpuarr__trace.session, session, __ATOMIC_RELEASE);
    __atomic_store_n(&gpuarr__trace_recorder, &gpuarr__trace_rec_hooks, __ATOMIC_RELEASE); /* before the hooks run */
    __atomic_store_n(&gpuarr__trace_on, 1u, __ATOMIC_RELEASE);
    return GPUARR_OK;
#endif
}

GPUARR_API gpuarr_result gpuarr_trace_start(const char *path) {
    gpuarr__tls.api = __func__;
    pthread_mutex_lock(&gpuarr__trace.lock);
    gpuarr_result r = gpuarr__trace_start_locked(path, false);
    pthread_mutex_unlock(&gpuarr__trace.lock);
    return r;
}

GPUARR_API gpuarr_result gpuarr_trace_stop(void) {
    gpuarr__tls.api = __func__;
    pthread_mutex_lock(&gpuarr__trace.lock);
    gpuarr_result r = __atomic_load_n(&gpuarr__trace_on, __ATOMIC_RELAXED)
                          ? gpuarr__trace_stop_locked()
                          : gpuarr__fail(GPUARR_ERROR_UNSUPPORTED, "no trace is being recorded (gpuarr_trace_start, or GPUARR_TRACE)");
    if (!gpuarr__initialized()) gpuarr__trace_key_delete(); /* see gpuarr__trace_key_make */
    pthread_mutex_unlock(&gpuarr__trace.lock);
    return r;
}

/* gpuarr_init: GPUARR_TRACE starts a trace, unless one is running already (it goes on). */
static gpuarr_result gpuarr__trace_at_init(void) {
    const char *path = gpuarr__setting(GPUARR__SET_TRACE);
    if (!path) return GPUARR_OK;
    pthread_mutex_lock(&gpuarr__trace.lock);
    gpuarr_result r = GPUARR_OK;
    if (__atomic_load_n(&gpuarr__trace_on, __ATOMIC_RELAXED)) {
        if (strcmp(path, gpuarr__trace.path) != 0)
            gpuarr__log(GPUARR_LOG_WARN, "GPUARR_TRACE=%s: a trace is already being recorded to %s; it goes on", path, gpuarr__trace.path);
    } else {
        r = gpuarr__trace_start_locked(path, true);
        if (r != GPUARR_OK) r = gpuarr__fail(r, "GPUARR_TRACE=%s: %s", path, gpuarr__tls.error_detail);
    }
    pthread_mutex_unlock(&gpuarr__trace.lock);
    return r;
}

/* The last gpuarr_shutdown, before the backends unload: the recorded commands' device times. */
static void gpuarr__trace_before_teardown(void) {
    pthread_mutex_lock(&gpuarr__trace.lock);
    gpuarr__trace_resolve_all();
    pthread_mutex_unlock(&gpuarr__trace.lock);
}

/* The last gpuarr_shutdown: a trace GPUARR_TRACE started is written now; with no trace running,
   the thread key goes. */
static void gpuarr__trace_at_shutdown(void) {
    pthread_mutex_lock(&gpuarr__trace.lock);
    if (gpuarr__trace.from_env && __atomic_load_n(&gpuarr__trace_on, __ATOMIC_RELAXED) && gpuarr__trace_stop_locked() != GPUARR_OK)
        gpuarr__log(GPUARR_LOG_ERROR, "GPUARR_TRACE: %s", gpuarr__tls.error_detail);
    if (!__atomic_load_n(&gpuarr__trace_on, __ATOMIC_RELAXED)) gpuarr__trace_key_delete();
    pthread_mutex_unlock(&gpuarr__trace.lock);
}

static void gpuarr__trace_layer(gpuarr__layer *l) {
    l->name = "trace";
    l->start = gpuarr__trace_at_init;
    l->before_teardown = gpuarr__trace_before_teardown;
    l->after_teardown = gpuarr__trace_at_shutdown;
    l->settings[0].id = GPUARR__SET_TRACE_EVENTS;
    l->settings[0].check = gpuarr__check_trace_events;
}

#endif /* GPUARR_TRACE_LAYER_INCLUDED */
