/*
 * test_alloc_faults.c -- allocation failure injection through gpuarr_desc.allocator. A counting
 * allocator fails exactly its Nth call after being armed; for N = 1, 2, 3 ... each operation
 * must either fail with GPUARR_ERROR_OUT_OF_MEMORY (out handle untouched, sources intact, the
 * library still usable) or succeed, and after shutdown every allocation has been freed.
 */
#include "test_common.h"

#include <stdatomic.h>

#define SENTINEL 0xdeadbeefu
enum { MAX_N = 400, HEADER = 16 };
#define MAGIC 0x6770756172726179ull /* "gpuarray" */

/* ---------------------------------------------------------------------------------------------
 * The counting allocator
 * ------------------------------------------------------------------------------------------- */
typedef struct fault_alloc {
    atomic_long calls;       /* alloc_fn calls since the session began */
    atomic_long live;        /* allocations not yet freed */
    atomic_long fail_at;     /* 0: disarmed; else fail the fail_at-th call after arming */
    atomic_long armed_calls; /* calls since arming */
    atomic_long injected;    /* failures returned */
    atomic_long bad_frees;   /* free_fn of a pointer this allocator did not return */
} fault_alloc;

static fault_alloc fa;

static void *fa_alloc(size_t size, void *user) {
    fault_alloc *f = user;
    atomic_fetch_add(&f->calls, 1);
    if (atomic_load(&f->fail_at) > 0) {
        long k = atomic_fetch_add(&f->armed_calls, 1) + 1;
        if (k == atomic_load(&f->fail_at)) {
            atomic_fetch_add(&f->injected, 1);
            return NULL;
        }
    }
    if (size > SIZE_MAX - HEADER) return NULL;
    unsigned char *p = malloc(size + HEADER);
    if (!p) return NULL;
    uint64_t magic = MAGIC;
    memcpy(p, &magic, sizeof magic);
    atomic_fetch_add(&f->live, 1);
    return p + HEADER;
}

static void fa_free(void *ptr, void *user) {
    fault_alloc *f = user;
    if (!ptr) return;
    unsigned char *p = (unsigned char *)ptr - HEADER;
    uint64_t magic;
    memcpy(&magic, p, sizeof magic);
    if (magic != MAGIC) { /* not ours (or freed twice): count it, do not touch it further */
        atomic_fetch_add(&f->bad_frees, 1);
        return;
    }
    magic = 0;
    memcpy(p, &magic, sizeof magic);
    atomic_fetch_sub(&f->live, 1);
    free(p);
}

static void fa_reset(void) {
    atomic_store(&fa.calls, 0);
    atomic_store(&fa.live, 0);
    atomic_store(&fa.fail_at, 0);
    atomic_store(&fa.armed_calls, 0);
    atomic_store(&fa.injected, 0);
    atomic_store(&fa.bad_frees, 0);
}
static void fa_arm(long n) {
    atomic_store(&fa.armed_calls, 0);
    atomic_store(&fa.injected, 0);
    atomic_store(&fa.fail_at, n);
}
static void fa_disarm(void) { atomic_store(&fa.fail_at, 0); }

static gpuarr_desc fa_desc(void) {
    gpuarr_desc d;
    memset(&d, 0, sizeof d);
    d.allocator.alloc_fn = fa_alloc;
    d.allocator.free_fn = fa_free;
    d.allocator.user_data = &fa;
    d.log_level = GPUARR_LOG_OFF; /* hundreds of expected failures */
    return d;
}

/* Starts a session with the counting allocator, nothing armed. */
static gpuarr_device session_begin(void) {
    fa_reset();
    gpuarr_desc d = fa_desc();
    gpuarr_result r = gpuarr_init(&d);
    cr_assert_eq(r, GPUARR_OK, "gpuarr_init with the counting allocator = %s: %s",
                 gpuarr_result_name(r), gpuarr_last_error());
    return test_device();
}

/* Ends it: nothing armed, everything released by the caller; no leaks. */
static void session_end(const char *what, long n) {
    fa_disarm();
    gpuarr_shutdown();
    cr_assert(!gpuarr_is_initialized(), "%s, N=%ld: still initialized after shutdown", what, n);
    cr_assert_eq(atomic_load(&fa.live), 0, "%s, N=%ld: %ld allocations leaked", what, n,
                 atomic_load(&fa.live));
    cr_assert_eq(atomic_load(&fa.bad_frees), 0,
                 "%s, N=%ld: %ld frees of pointers the allocator did not return", what, n,
                 atomic_load(&fa.bad_frees));
}

/* One failed call: the specific code and a message naming the function. */
static void expect_oom(gpuarr_result r, const char *fname, long n) {
    cr_assert_eq(r, GPUARR_ERROR_OUT_OF_MEMORY, "%s with allocation %ld failing = %s: %s", fname,
                 n, gpuarr_result_name(r), gpuarr_last_error());
    cr_assert(strstr(gpuarr_last_error(), fname) != NULL,
              "%s, N=%ld: message \"%s\" does not name the function", fname, n,
              gpuarr_last_error());
}

/* The loop ends once an operation succeeds without an injected failure. */
static bool loop_done(gpuarr_result r) {
    return r == GPUARR_OK && atomic_load(&fa.injected) == 0;
}

static void report(const char *what, long ooms, long last_n, bool must_allocate) {
    cr_log_info("%s: %ld injected failures returned OUT_OF_MEMORY, succeeded at N=%ld", what, ooms,
                last_n);
    if (must_allocate)
        cr_expect(ooms > 0, "%s: no allocation of the host array went through the allocator "
                            "(gpuarr_desc.allocator is for all library host memory)",
                  what);
}

/* ---------------------------------------------------------------------------------------------
 * Sources with known data
 * ------------------------------------------------------------------------------------------- */
enum { SMALL_N = 7, LARGE_N = 1 << 20 };

/* -100..99: exact in every dtype the conversions below produce (bf16 included) */
static float src_value(size_t i) { return (float)((int)(i % 200) - 100); }

static float *src_data(size_t n) {
    float *v = malloc(n * sizeof *v);
    cr_assert_not_null(v);
    for (size_t i = 0; i < n; i++) v[i] = src_value(i);
    return v;
}

static gpuarr_array make_src(gpuarr_device dev, const float *v, size_t n) {
    int64_t shape[1] = {(int64_t)n};
    gpuarr_array a = {0};
    TEST_OK(gpuarr_from_host_as(dev, GPUARR_F32, v, 1, shape, &a));
    return a;
}

static void check_values(gpuarr_array a, const float *v, size_t n, const char *what, long fault) {
    double *back = malloc(n * sizeof *back);
    cr_assert_not_null(back);
    gpuarr_result r = gpuarr_to_host_as(a, GPUARR_F64, back, n);
    cr_assert_eq(r, GPUARR_OK, "%s, N=%ld: reading back = %s: %s", what, fault,
                 gpuarr_result_name(r), gpuarr_last_error());
    for (size_t i = 0; i < n; i++)
        if (back[i] != (double)v[i]) {
            double got = back[i];
            free(back);
            cr_assert_fail("%s, N=%ld: element %zu = %g, want %g", what, fault, i, got,
                           (double)v[i]);
        }
    free(back);
    gpuarr_array_info info;
    TEST_OK(gpuarr_array_get_info(a, &info));
    cr_assert_eq(info.count, (int64_t)n);
}

/* ---------------------------------------------------------------------------------------------
 * gpuarr_convert
 * ------------------------------------------------------------------------------------------- */
typedef enum convert_target { TO_TEST_DEVICE, TO_HOST } convert_target;

static void convert_under_faults(size_t n, gpuarr_dtype t, convert_target where, bool async,
                                 const char *what) {
    float *v = src_data(n);
    long ooms = 0, last = 0;
    bool dev_is_host = false;
    const char *fname = async ? "gpuarr_convert_async" : "gpuarr_convert";
    for (long k = 1;; k++) {
        cr_assert(k <= MAX_N, "%s: still failing with N=%d", what, MAX_N);
        gpuarr_device dev = session_begin();
        dev_is_host = test_device_is_host(dev);
        gpuarr_device dst = where == TO_HOST ? gpuarr_host() : dev;
        gpuarr_array src = make_src(dev, v, n);
        gpuarr_array out = {SENTINEL};
        fa_arm(k);
        gpuarr_result r = async ? gpuarr_convert_async(src, dst, t, (gpuarr_stream){0}, &out)
                                : gpuarr_convert(src, dst, t, &out);
        bool done = loop_done(r);
        fa_disarm();
        if (r == GPUARR_OK && async) TEST_OK(gpuarr_device_sync(dst));
        if (r != GPUARR_OK) {
            expect_oom(r, fname, k);
            cr_assert_eq(out.id, SENTINEL, "%s, N=%ld: out written on failure", what, k);
            ooms++;
            /* the library still works in this session */
            gpuarr_result again = gpuarr_convert(src, dst, t, &out);
            cr_assert_eq(again, GPUARR_OK, "%s, N=%ld: retry after the failure = %s: %s", what,
                         k, gpuarr_result_name(again), gpuarr_last_error());
        }
        check_values(out, v, n, what, k);
        gpuarr_array_info info;
        TEST_OK(gpuarr_array_get_info(out, &info));
        cr_assert_eq(info.dtype, t ? t : GPUARR_F32);
        cr_assert_eq(info.device.id, dst.id);
        TEST_OK(gpuarr_release(out));
        check_values(src, v, n, "source after the conversion", k); /* source intact */
        TEST_OK(gpuarr_array_get_info(src, &info));
        cr_assert_eq(info.refcount, 1u, "%s, N=%ld: source refcount %u", what, k, info.refcount);
        TEST_OK(gpuarr_release(src));
        session_end(what, k);
        last = k;
        if (done) break;
    }
    bool same_device = where == TO_HOST ? dev_is_host : true;
    bool same_dtype = t == GPUARR_DTYPE_INVALID || t == GPUARR_F32;
    bool copies = !(same_device && same_dtype); /* else the identity: src itself, retained */
    /* on the host every new array's memory is library host memory (device memory and pinned
       buffers of GPU backends need not be) */
    report(what, ooms, last, copies && dev_is_host);
    free(v);
}

Test(alloc_faults, convert_with_a_dtype_change_fails_cleanly_at_every_allocation) {
    convert_under_faults(SMALL_N, GPUARR_F64, TO_TEST_DEVICE, false, "convert f32->f64 small");
    convert_under_faults(SMALL_N, GPUARR_F16, TO_TEST_DEVICE, false, "convert f32->f16 small");
}

Test(alloc_faults, convert_of_a_large_array_fails_cleanly_at_every_allocation) {
    convert_under_faults(LARGE_N, GPUARR_F64, TO_TEST_DEVICE, false, "convert f32->f64 large");
    convert_under_faults(LARGE_N, GPUARR_BF16, TO_HOST, false, "convert f32->bf16 large to host");
}

Test(alloc_faults, convert_without_a_dtype_change_fails_cleanly_at_every_allocation) {
    convert_under_faults(SMALL_N, GPUARR_DTYPE_INVALID, TO_HOST, false, "convert to host, dtype 0");
    convert_under_faults(SMALL_N, GPUARR_F32, TO_TEST_DEVICE, false,
                         "convert on the device, same dtype (identity)");
    convert_under_faults(LARGE_N, GPUARR_F32, TO_HOST, false, "convert large to host, same dtype");
}

Test(alloc_faults, convert_async_fails_cleanly_at_every_allocation) {
    convert_under_faults(SMALL_N, GPUARR_I32, TO_TEST_DEVICE, true, "convert_async f32->i32");
    convert_under_faults(LARGE_N, GPUARR_F64, TO_HOST, true, "convert_async f32->f64 to host");
}

/* ---------------------------------------------------------------------------------------------
 * Creating arrays
 * ------------------------------------------------------------------------------------------- */
typedef enum create_kind { CREATE_EMPTY, CREATE_ZEROS, CREATE_FROM_HOST } create_kind;

static void create_under_faults(create_kind kind, size_t n, bool on_host, const char *what) {
    float *v = src_data(n);
    const char *fname = kind == CREATE_EMPTY   ? "gpuarr_empty"
                        : kind == CREATE_ZEROS ? "gpuarr_zeros"
                                               : "gpuarr_from_host_as";
    long ooms = 0, last = 0;
    bool dev_is_host = false;
    int64_t shape[2] = {(int64_t)n, 1};
    for (long k = 1;; k++) {
        cr_assert(k <= MAX_N, "%s: still failing with N=%d", what, MAX_N);
        gpuarr_device dev = session_begin();
        if (on_host) dev = gpuarr_host();
        dev_is_host = test_device_is_host(dev);
        gpuarr_array keep = make_src(dev, v, n); /* an existing array that must survive */
        gpuarr_array out = {SENTINEL};
        fa_arm(k);
        gpuarr_result r = kind == CREATE_EMPTY ? gpuarr_empty(dev, GPUARR_F32, 2, shape, &out)
                          : kind == CREATE_ZEROS
                              ? gpuarr_zeros(dev, GPUARR_F32, 2, shape, &out)
                              : gpuarr_from_host_as(dev, GPUARR_F32, v, 2, shape, &out);
        bool done = loop_done(r);
        fa_disarm();
        if (r != GPUARR_OK) {
            expect_oom(r, fname, k);
            cr_assert_eq(out.id, SENTINEL, "%s, N=%ld: out written on failure", what, k);
            ooms++;
        } else {
            gpuarr_array_info info;
            TEST_OK(gpuarr_array_get_info(out, &info));
            cr_assert_eq(info.count, (int64_t)n);
            if (kind == CREATE_FROM_HOST) check_values(out, v, n, what, k);
            TEST_OK(gpuarr_release(out));
        }
        check_values(keep, v, n, "existing array", k);
        TEST_OK(gpuarr_release(keep));
        session_end(what, k);
        last = k;
        if (done) break;
    }
    report(what, ooms, last, dev_is_host);
    free(v);
}

Test(alloc_faults, empty_fails_cleanly_at_every_allocation) {
    create_under_faults(CREATE_EMPTY, SMALL_N, false, "empty");
    create_under_faults(CREATE_EMPTY, LARGE_N, true, "empty on the host");
}

Test(alloc_faults, zeros_fails_cleanly_at_every_allocation) {
    create_under_faults(CREATE_ZEROS, LARGE_N, false, "zeros");
}

Test(alloc_faults, from_host_as_fails_cleanly_at_every_allocation) {
    create_under_faults(CREATE_FROM_HOST, SMALL_N, false, "from_host_as small");
    create_under_faults(CREATE_FROM_HOST, LARGE_N, false, "from_host_as large");
    create_under_faults(CREATE_FROM_HOST, SMALL_N, true, "from_host_as on the host");
}

Test(alloc_faults, to_host_as_with_a_cast_fails_cleanly_at_every_allocation) {
    float *v = src_data(LARGE_N);
    double *back = malloc((size_t)LARGE_N * sizeof *back);
    cr_assert_not_null(back);
    for (long k = 1;; k++) {
        cr_assert(k <= MAX_N, "to_host_as: still failing with N=%d", MAX_N);
        gpuarr_device dev = session_begin();
        gpuarr_array src = make_src(dev, v, LARGE_N);
        fa_arm(k);
        gpuarr_result r = gpuarr_to_host_as(src, GPUARR_F64, back, LARGE_N);
        bool done = loop_done(r);
        fa_disarm();
        if (r != GPUARR_OK) expect_oom(r, "gpuarr_to_host_as", k);
        else
            for (size_t i = 0; i < LARGE_N; i += 997)
                cr_assert_eq(back[i], (double)v[i], "N=%ld: element %zu", k, i);
        check_values(src, v, LARGE_N, "source of to_host_as", k);
        TEST_OK(gpuarr_release(src));
        session_end("to_host_as", k);
        if (done) break;
    }
    free(back);
    free(v);
}

/* ---------------------------------------------------------------------------------------------
 * gpuarr_wrap_host
 * ------------------------------------------------------------------------------------------- */
static atomic_int wrap_releases;
static void count_release(void *data, void *user) {
    (void)data;
    (void)user;
    atomic_fetch_add(&wrap_releases, 1);
}

Test(alloc_faults, wrap_host_fails_cleanly_and_never_calls_release_on_failure) {
    float *v = src_data(SMALL_N);
    long ooms = 0, last = 0;
    int64_t shape[1] = {SMALL_N};
    for (long k = 1;; k++) {
        cr_assert(k <= MAX_N, "wrap_host: still failing with N=%d", MAX_N);
        (void)session_begin();
        atomic_store(&wrap_releases, 0);
        gpuarr_array out = {SENTINEL};
        fa_arm(k);
        gpuarr_result r = gpuarr_wrap_host(v, GPUARR_F32, 1, shape, count_release, v, &out);
        bool done = loop_done(r);
        fa_disarm();
        if (r != GPUARR_OK) {
            expect_oom(r, "gpuarr_wrap_host", k);
            cr_assert_eq(out.id, SENTINEL, "wrap_host, N=%ld: out written on failure", k);
            cr_assert_eq(atomic_load(&wrap_releases), 0,
                         "wrap_host, N=%ld: release callback called by a failed wrap", k);
            ooms++;
        } else {
            check_values(out, v, SMALL_N, "wrapped", k);
            cr_assert_eq(atomic_load(&wrap_releases), 0);
            TEST_OK(gpuarr_release(out));
            cr_assert_eq(atomic_load(&wrap_releases), 1, "wrap_host, N=%ld: %d release calls", k,
                         atomic_load(&wrap_releases));
        }
        session_end("wrap_host", k);
        cr_assert_eq(atomic_load(&wrap_releases), r == GPUARR_OK ? 1 : 0,
                     "wrap_host, N=%ld: release callback ran at shutdown", k);
        last = k;
        if (done) break;
    }
    report("wrap_host", ooms, last, false);
    for (size_t i = 0; i < SMALL_N; i++) cr_assert_eq(v[i], src_value(i), "wrapped data changed");
    free(v);
}

/* ---------------------------------------------------------------------------------------------
 * Streams and events
 * ------------------------------------------------------------------------------------------- */
Test(alloc_faults, stream_and_event_create_fail_cleanly_at_every_allocation) {
    for (int which = 0; which < 2; which++) {
        const char *fname = which ? "gpuarr_event_create" : "gpuarr_stream_create";
        for (long k = 1;; k++) {
            cr_assert(k <= MAX_N, "%s: still failing with N=%d", fname, MAX_N);
            gpuarr_device dev = session_begin();
            gpuarr_stream s = {SENTINEL};
            gpuarr_event e = {SENTINEL};
            fa_arm(k);
            gpuarr_result r = which ? gpuarr_event_create(dev, GPUARR_EVENT_TIMING, &e)
                                    : gpuarr_stream_create(dev, 0, &s);
            bool done = loop_done(r);
            fa_disarm();
            if (r != GPUARR_OK) {
                expect_oom(r, fname, k);
                cr_assert_eq(which ? e.id : s.id, SENTINEL, "%s, N=%ld: out written", fname, k);
            } else if (which) {
                TEST_OK(gpuarr_event_destroy(e));
            } else {
                TEST_OK(gpuarr_stream_sync(s));
                TEST_OK(gpuarr_stream_destroy(s));
            }
            session_end(fname, k);
            if (done) break;
        }
    }
}

/* ---------------------------------------------------------------------------------------------
 * gpuarr_init
 * ------------------------------------------------------------------------------------------- */
Test(alloc_faults, init_fails_cleanly_at_every_allocation_and_a_later_init_works) {
    long ooms = 0, k;
    for (k = 1;; k++) {
        cr_assert(k <= MAX_N, "gpuarr_init: still failing with N=%d", MAX_N);
        fa_reset();
        gpuarr_desc d = fa_desc();
        fa_arm(k);
        gpuarr_result r = gpuarr_init(&d);
        bool done = loop_done(r);
        fa_disarm();
        if (r != GPUARR_OK) {
            expect_oom(r, "gpuarr_init", k);
            cr_assert(!gpuarr_is_initialized(), "N=%ld: failed init left it initialized", k);
            cr_assert_eq(gpuarr_device_count(), 0);
            cr_assert_eq(atomic_load(&fa.live), 0, "failed gpuarr_init, N=%ld: %ld leaked", k,
                         atomic_load(&fa.live));
            cr_assert_eq(atomic_load(&fa.bad_frees), 0);
            ooms++;
        } else {
            cr_assert(gpuarr_device_count() >= 1);
            session_end("gpuarr_init", k);
        }
        if (done) break;
    }
    cr_log_info("gpuarr_init: %ld allocations, each failure gave OUT_OF_MEMORY", ooms);
    /* a normal init (default allocator) and one with the counting allocator still work */
    TEST_OK(gpuarr_init(NULL));
    cr_assert(gpuarr_device_count() >= 1);
    gpuarr_shutdown();
    gpuarr_device dev = session_begin();
    float v[3] = {1, 2, 3};
    gpuarr_array a = make_src(dev, v, 3);
    check_values(a, v, 3, "after the init failures", 0);
    TEST_OK(gpuarr_release(a));
    session_end("final session", 0);
}

/* The allocator sees the library's host memory at all. */
Test(alloc_faults, the_allocator_receives_the_library_host_allocations) {
    (void)session_begin();
    long after_init = atomic_load(&fa.calls);
    int64_t shape[1] = {1000};
    gpuarr_array a = {0};
    TEST_OK(gpuarr_zeros(gpuarr_host(), GPUARR_F64, 1, shape, &a));
    long after_zeros = atomic_load(&fa.calls);
    cr_expect_gt(after_zeros, after_init,
                 "a 8000-byte host array made no allocator call (%ld calls after init)",
                 after_init);
    cr_expect_gt(atomic_load(&fa.live), 0, "no live allocations while an array is alive");
    TEST_OK(gpuarr_release(a));
    session_end("allocator sees host memory", 0);
}
