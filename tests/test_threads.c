/*
 * test_threads.c -- gpuarr_init / gpuarr_shutdown reference counting under racing threads,
 * concurrent array work with a shared array retained and released by every thread, and per-thread
 * current device and stream. Written for TSan: pthreads only, assertions in the main thread
 * (worker threads count failures in atomics), deterministic outcomes.
 */
#include "test_common.h"

#include <pthread.h>
#include <stdatomic.h>

enum { NTHREADS = 8 };

/* ---------------------------------------------------------------------------------------------
 * init / shutdown races
 * ------------------------------------------------------------------------------------------- */
typedef struct init_race {
    int iterations;
    int expected_count;     /* 0: do not check */
    uint32_t expected_host; /* 0: do not check */
    const gpuarr_desc *desc;
    bool make_arrays;
    pthread_barrier_t start;
    atomic_int init_failures, count_mismatches, host_mismatches, array_failures;
} init_race;

static void *init_race_thread(void *arg) {
    init_race *r = arg;
    pthread_barrier_wait(&r->start);
    for (int i = 0; i < r->iterations; i++) {
        if (gpuarr_init(r->desc) != GPUARR_OK) {
            atomic_fetch_add(&r->init_failures, 1);
            continue;
        }
        int n = gpuarr_device_count();
        if (n < 1 || (r->expected_count && n != r->expected_count))
            atomic_fetch_add(&r->count_mismatches, 1);
        gpuarr_device h = gpuarr_host();
        if (h.id == 0 || (r->expected_host && h.id != r->expected_host))
            atomic_fetch_add(&r->host_mismatches, 1);
        if (r->make_arrays) {
            int64_t shape[1] = {16};
            gpuarr_array a = {0};
            int32_t v[16];
            if (gpuarr_zeros(h, GPUARR_I32, 1, shape, &a) != GPUARR_OK ||
                gpuarr_to_host_as(a, GPUARR_I32, v, 16) != GPUARR_OK || v[0] != 0 || v[15] != 0 ||
                gpuarr_release(a) != GPUARR_OK)
                atomic_fetch_add(&r->array_failures, 1);
        }
        gpuarr_shutdown();
    }
    return NULL;
}

static void run_init_race(init_race *r) {
    pthread_t t[NTHREADS];
    cr_assert_eq(pthread_barrier_init(&r->start, NULL, NTHREADS), 0);
    for (int i = 0; i < NTHREADS; i++)
        cr_assert_eq(pthread_create(&t[i], NULL, init_race_thread, r), 0);
    for (int i = 0; i < NTHREADS; i++) pthread_join(t[i], NULL);
    pthread_barrier_destroy(&r->start);
    cr_expect_eq(atomic_load(&r->init_failures), 0, "%d gpuarr_init calls failed",
                 atomic_load(&r->init_failures));
    cr_expect_eq(atomic_load(&r->count_mismatches), 0,
                 "%d device counts differed from %d", atomic_load(&r->count_mismatches),
                 r->expected_count);
    cr_expect_eq(atomic_load(&r->host_mismatches), 0, "%d host handles differed from 0x%x",
                 atomic_load(&r->host_mismatches), r->expected_host);
    cr_expect_eq(atomic_load(&r->array_failures), 0, "%d array round trips failed",
                 atomic_load(&r->array_failures));
}

Test(threads, init_and_shutdown_race_while_main_holds_a_reference) {
    TEST_OK(gpuarr_init(NULL));
    (void)test_device();
    init_race r;
    memset(&r, 0, sizeof r);
    r.iterations = 200;
    r.expected_count = gpuarr_device_count();
    r.expected_host = gpuarr_host().id;
    r.make_arrays = true;
    cr_assert(r.expected_count >= 1);
    run_init_race(&r);
    cr_expect(gpuarr_is_initialized(), "main's reference was dropped by other threads");
    cr_expect_eq(gpuarr_device_count(), r.expected_count);
    cr_expect_eq(gpuarr_host().id, r.expected_host);
    gpuarr_shutdown();
    cr_expect(!gpuarr_is_initialized(), "still initialized after the last shutdown");
    cr_expect_eq(gpuarr_device_count(), 0);
}

/* No reference held outside: first init and last shutdown race each other. Only the host is
   enumerated (desc.devices) so that repeated full starts stay cheap. */
Test(threads, first_init_and_last_shutdown_race_without_an_outside_reference) {
    gpuarr_desc desc;
    memset(&desc, 0, sizeof desc);
    desc.devices = "host";
    desc.log_level = GPUARR_LOG_ERROR; /* later callers' desc is ignored with a log message */
    init_race r;
    memset(&r, 0, sizeof r);
    r.iterations = 100;
    r.expected_count = 1;
    r.desc = &desc;
    r.make_arrays = true;
    run_init_race(&r);
    cr_expect(!gpuarr_is_initialized(), "initialized after every thread shut down");
    TEST_OK(gpuarr_init(NULL));
    cr_expect(gpuarr_device_count() >= 1);
    gpuarr_shutdown();
    cr_expect(!gpuarr_is_initialized());
}

/* ---------------------------------------------------------------------------------------------
 * Concurrent array work
 * ------------------------------------------------------------------------------------------- */
enum { WORK_ITERATIONS = 2000, SHARED_N = 257 };

typedef struct array_work {
    gpuarr_device dev;
    gpuarr_array shared;
    pthread_barrier_t start;
    atomic_int failures;
    atomic_int first_failure_line;
    atomic_int iterations_done;
} array_work;

typedef struct array_worker {
    array_work *w;
    uint64_t seed;
} array_worker;

#define WORK_FAIL(w)                                                                               \
    do {                                                                                           \
        atomic_fetch_add(&(w)->failures, 1);                                                       \
        int zero_ = 0;                                                                             \
        atomic_compare_exchange_strong(&(w)->first_failure_line, &zero_, __LINE__);                \
    } while (0)

static double shared_value(size_t i) { return (double)(i % 100) - 50.0; }

/* One iteration: small integers (exact in every dtype) of a random dtype and shape, converted on
   the device to a random dtype, read back as f64 and checked. */
static void work_once(array_work *w, test_rng *rng) {
    gpuarr_dtype s = (gpuarr_dtype)(TEST_FIRST_DTYPE + (int)test_rng_below(rng, TEST_NDTYPES));
    gpuarr_dtype d = (gpuarr_dtype)(TEST_FIRST_DTYPE + (int)test_rng_below(rng, TEST_NDTYPES));
    int ndim = (int)test_rng_below(rng, 4);
    int64_t shape[3];
    for (int i = 0; i < ndim; i++) shape[i] = test_rng_below(rng, 6);
    size_t n = (size_t)test_shape_count(ndim, shape);
    unsigned char in[5 * 5 * 5 * 8 + 8];
    double vals[5 * 5 * 5 + 1], back[5 * 5 * 5 + 1];
    for (size_t i = 0; i < n; i++) {
        int v = s == GPUARR_BOOL ? (int)test_rng_below(rng, 2) : (int)test_rng_below(rng, 101);
        /* store v as dtype s, through the reference (exact for these values) */
        test_store_bits(s, in, i, ref_cast_bits(GPUARR_I32, (uint64_t)(uint32_t)v, s));
        vals[i] = d == GPUARR_BOOL ? (v != 0) : v;
    }
    gpuarr_array a = {0}, b = {0};
    if (gpuarr_from_host_as(w->dev, s, in, ndim, shape, &a) != GPUARR_OK) {
        WORK_FAIL(w);
        return;
    }
    if (gpuarr_convert(a, w->dev, d, &b) != GPUARR_OK) {
        WORK_FAIL(w);
        gpuarr_release(a);
        return;
    }
    if (gpuarr_release(a) != GPUARR_OK) WORK_FAIL(w);
    gpuarr_array_info info;
    if (gpuarr_array_get_info(b, &info) != GPUARR_OK || info.dtype != d || info.ndim != ndim ||
        info.count != (int64_t)n || info.refcount != 1)
        WORK_FAIL(w);
    if (n > 0) {
        if (gpuarr_to_host_as(b, GPUARR_F64, back, n) != GPUARR_OK) WORK_FAIL(w);
        else if (memcmp(back, vals, n * sizeof(double)) != 0) WORK_FAIL(w);
    }
    if (gpuarr_release(b) != GPUARR_OK) WORK_FAIL(w);

    /* the shared array: retain, read, convert, release -- concurrently with every thread */
    if (gpuarr_retain(w->shared) != GPUARR_OK) {
        WORK_FAIL(w);
        return;
    }
    if (test_rng_below(rng, 8) == 0) {
        gpuarr_array c = {0};
        double sv[SHARED_N];
        if (gpuarr_convert(w->shared, w->dev, GPUARR_F64, &c) != GPUARR_OK ||
            gpuarr_to_host_as(c, GPUARR_F64, sv, SHARED_N) != GPUARR_OK)
            WORK_FAIL(w);
        else
            for (size_t i = 0; i < SHARED_N; i++)
                if (sv[i] != shared_value(i)) {
                    WORK_FAIL(w);
                    break;
                }
        if (c.id) gpuarr_release(c);
    }
    if (gpuarr_array_get_info(w->shared, &info) != GPUARR_OK || info.refcount < 2 ||
        info.refcount > NTHREADS + 1)
        WORK_FAIL(w);
    if (gpuarr_release(w->shared) != GPUARR_OK) WORK_FAIL(w);
}

static void *array_work_thread(void *arg) {
    array_worker *me = arg;
    test_rng rng = {me->seed};
    pthread_barrier_wait(&me->w->start);
    for (int i = 0; i < WORK_ITERATIONS; i++) {
        work_once(me->w, &rng);
        atomic_fetch_add(&me->w->iterations_done, 1);
    }
    return NULL;
}

Test(threads, eight_threads_create_convert_and_release_arrays_and_share_one,
     .init = test_setup, .fini = test_teardown) {
    array_work w;
    memset(&w, 0, sizeof w);
    w.dev = test_device();
    int16_t sv[SHARED_N];
    for (size_t i = 0; i < SHARED_N; i++) sv[i] = (int16_t)shared_value(i);
    int64_t shape[1] = {SHARED_N};
    TEST_OK(gpuarr_from_host_as(w.dev, GPUARR_I16, sv, 1, shape, &w.shared));
    cr_assert_eq(pthread_barrier_init(&w.start, NULL, NTHREADS), 0);
    pthread_t t[NTHREADS];
    array_worker workers[NTHREADS];
    for (int i = 0; i < NTHREADS; i++) {
        workers[i].w = &w;
        workers[i].seed = 1000 + (uint64_t)i;
        cr_assert_eq(pthread_create(&t[i], NULL, array_work_thread, &workers[i]), 0);
    }
    for (int i = 0; i < NTHREADS; i++) pthread_join(t[i], NULL);
    pthread_barrier_destroy(&w.start);
    cr_expect_eq(atomic_load(&w.iterations_done), NTHREADS * WORK_ITERATIONS);
    cr_expect_eq(atomic_load(&w.failures), 0, "%d failures, the first at test_threads.c:%d",
                 atomic_load(&w.failures), atomic_load(&w.first_failure_line));
    gpuarr_array_info info;
    TEST_OK(gpuarr_array_get_info(w.shared, &info));
    cr_expect_eq(info.refcount, 1u, "shared array refcount %u after all threads", info.refcount);
    test_expect_array_bytes(w.shared, GPUARR_I16, sv, SHARED_N, "shared array after the threads");
    TEST_OK(gpuarr_release(w.shared));
}

/* Many threads make and drop arrays while others hold them: every handle stays unique among the
   live ones. */
typedef struct handle_churn {
    gpuarr_device dev;
    pthread_barrier_t start;
    atomic_int failures;
    _Atomic uint32_t live[NTHREADS][16];
} handle_churn;

typedef struct churn_arg {
    handle_churn *c;
    int index;
} churn_arg;

static void *churn_thread(void *arg) {
    churn_arg *me = arg;
    handle_churn *c = me->c;
    int64_t shape[1] = {3};
    gpuarr_array mine[16] = {{0}};
    pthread_barrier_wait(&c->start);
    for (int round = 0; round < 200; round++) {
        int k = round % 16;
        if (mine[k].id) {
            int32_t v[3];
            if (gpuarr_to_host_as(mine[k], GPUARR_I32, v, 3) != GPUARR_OK || v[0] != me->index ||
                v[2] != round - 16)
                atomic_fetch_add(&c->failures, 1);
            atomic_store(&c->live[me->index][k], 0);
            if (gpuarr_release(mine[k]) != GPUARR_OK) atomic_fetch_add(&c->failures, 1);
        }
        int32_t in[3] = {me->index, k, round};
        if (gpuarr_from_host_as(c->dev, GPUARR_I32, in, 1, shape, &mine[k]) != GPUARR_OK) {
            atomic_fetch_add(&c->failures, 1);
            mine[k].id = 0;
            continue;
        }
        /* nobody else holds this id right now */
        for (int t = 0; t < NTHREADS; t++)
            for (int j = 0; j < 16; j++)
                if (atomic_load(&c->live[t][j]) == mine[k].id) atomic_fetch_add(&c->failures, 1);
        atomic_store(&c->live[me->index][k], mine[k].id);
    }
    for (int k = 0; k < 16; k++)
        if (mine[k].id) {
            atomic_store(&c->live[me->index][k], 0);
            gpuarr_release(mine[k]);
        }
    return NULL;
}

Test(threads, handles_made_concurrently_are_unique_among_live_arrays, .init = test_setup,
     .fini = test_teardown) {
    handle_churn *c = calloc(1, sizeof *c);
    cr_assert_not_null(c);
    c->dev = test_device();
    cr_assert_eq(pthread_barrier_init(&c->start, NULL, NTHREADS), 0);
    pthread_t t[NTHREADS];
    churn_arg args[NTHREADS];
    for (int i = 0; i < NTHREADS; i++) {
        args[i].c = c;
        args[i].index = i;
        cr_assert_eq(pthread_create(&t[i], NULL, churn_thread, &args[i]), 0);
    }
    for (int i = 0; i < NTHREADS; i++) pthread_join(t[i], NULL);
    pthread_barrier_destroy(&c->start);
    cr_expect_eq(atomic_load(&c->failures), 0, "%d failures (duplicate live handles or wrong data)",
                 atomic_load(&c->failures));
    free(c);
}

/* Lookups of existing handles while other threads create thousands of arrays, so that the
   handle table grows (and its storage moves) under the readers, several times per session. */
enum { GROW_READERS = 4, GROW_WRITERS = 4, GROW_PER_WRITER = 1500, GROW_ROUNDS = 6 };

typedef struct table_growth {
    gpuarr_device dev;
    gpuarr_array fixed[4];
    atomic_int writers_left;
    atomic_int failures;
    atomic_int first_failure_line;
    pthread_barrier_t start;
} table_growth;

static void *growth_reader(void *arg) {
    table_growth *g = arg;
    pthread_barrier_wait(&g->start);
    long reads = 0;
    while (atomic_load(&g->writers_left) > 0 || reads < 1000) {
        gpuarr_array a = g->fixed[reads % 4];
        gpuarr_array_info info;
        if (gpuarr_array_get_info(a, &info) != GPUARR_OK || info.count != 5 + (int64_t)(reads % 4))
            WORK_FAIL(g);
        if (gpuarr_retain(a) != GPUARR_OK || gpuarr_release(a) != GPUARR_OK) WORK_FAIL(g);
        reads++;
    }
    return NULL;
}

static void *growth_writer(void *arg) {
    table_growth *g = arg;
    gpuarr_array *mine = calloc(GROW_PER_WRITER, sizeof *mine);
    int64_t shape[1] = {2};
    uint8_t v[2] = {1, 2};
    pthread_barrier_wait(&g->start);
    for (int i = 0; mine && i < GROW_PER_WRITER; i++)
        if (gpuarr_from_host_as(g->dev, GPUARR_U8, v, 1, shape, &mine[i]) != GPUARR_OK) WORK_FAIL(g);
    for (int i = 0; mine && i < GROW_PER_WRITER; i++)
        if (gpuarr_release(mine[i]) != GPUARR_OK) WORK_FAIL(g);
    if (!mine) WORK_FAIL(g);
    free(mine);
    atomic_fetch_sub(&g->writers_left, 1);
    return NULL;
}

Test(threads, handle_lookups_stay_valid_while_the_handle_table_grows) {
    for (int round = 0; round < GROW_ROUNDS; round++) {
        TEST_OK(gpuarr_init(NULL)); /* a fresh, small handle table each round */
        table_growth g;
        memset(&g, 0, sizeof g);
        g.dev = test_device();
        for (int i = 0; i < 4; i++) {
            int64_t shape[1] = {5 + i};
            TEST_OK(gpuarr_zeros(g.dev, GPUARR_F32, 1, shape, &g.fixed[i]));
        }
        atomic_store(&g.writers_left, GROW_WRITERS);
        cr_assert_eq(pthread_barrier_init(&g.start, NULL, GROW_READERS + GROW_WRITERS), 0);
        pthread_t t[GROW_READERS + GROW_WRITERS];
        for (int i = 0; i < GROW_READERS + GROW_WRITERS; i++)
            cr_assert_eq(pthread_create(&t[i], NULL, i < GROW_READERS ? growth_reader : growth_writer,
                                        &g),
                         0);
        for (int i = 0; i < GROW_READERS + GROW_WRITERS; i++) pthread_join(t[i], NULL);
        pthread_barrier_destroy(&g.start);
        cr_expect_eq(atomic_load(&g.failures), 0,
                     "round %d: %d failures, the first at test_threads.c:%d", round,
                     atomic_load(&g.failures), atomic_load(&g.first_failure_line));
        for (int i = 0; i < 4; i++) TEST_OK(gpuarr_release(g.fixed[i]));
        gpuarr_shutdown();
    }
}

/* Lookups take no lock: one thread makes and releases arrays whose size tells them apart and
   publishes each id with its size; readers look the published id up meanwhile. A lookup gives
   the array the id named, alive, or INVALID_HANDLE: never another array, never freed memory
   (ASan and TSan run this too). */
typedef struct lookup_race {
    gpuarr_device dev;
    _Atomic uint64_t published; /* id << 32 | element count */
    atomic_int done, failures, first_failure_line;
} lookup_race;

static void *lookup_race_writer(void *arg) {
    lookup_race *r = arg;
    for (int i = 0; i < 20000; i++) {
        int64_t shape[1] = {1 + i % 97};
        gpuarr_array a;
        if (gpuarr_empty(r->dev, GPUARR_U8, 1, shape, &a) != GPUARR_OK) WORK_FAIL(r);
        atomic_store(&r->published, (uint64_t)a.id << 32 | (uint64_t)shape[0]);
        if (gpuarr_release(a) != GPUARR_OK) WORK_FAIL(r);
    }
    atomic_store(&r->done, 1);
    return NULL;
}

static void *lookup_race_reader(void *arg) {
    lookup_race *r = arg;
    while (!atomic_load(&r->done)) {
        uint64_t p = atomic_load(&r->published);
        gpuarr_array a = {(uint32_t)(p >> 32)};
        gpuarr_array_info info;
        gpuarr_result res = gpuarr_array_get_info(a, &info);
        if (res == GPUARR_OK && info.count != (int64_t)(p & 0xffffffffu)) WORK_FAIL(r);
        if (res != GPUARR_OK && res != GPUARR_ERROR_INVALID_HANDLE) WORK_FAIL(r);
    }
    return NULL;
}

Test(threads, a_lookup_racing_a_release_gets_the_live_array_or_invalid_handle, .init = test_setup,
     .fini = test_teardown) {
    lookup_race r;
    memset(&r, 0, sizeof r);
    r.dev = test_device();
    int64_t one[1] = {1};
    gpuarr_array first;
    TEST_OK(gpuarr_empty(r.dev, GPUARR_U8, 1, one, &first));
    atomic_store(&r.published, (uint64_t)first.id << 32 | 1u);
    pthread_t t[3];
    cr_assert_eq(pthread_create(&t[0], NULL, lookup_race_writer, &r), 0);
    for (int i = 1; i < 3; i++) cr_assert_eq(pthread_create(&t[i], NULL, lookup_race_reader, &r), 0);
    for (int i = 0; i < 3; i++) pthread_join(t[i], NULL);
    cr_expect_eq(atomic_load(&r.failures), 0, "%d failures, the first at test_threads.c:%d", atomic_load(&r.failures),
                 atomic_load(&r.first_failure_line));
    TEST_OK(gpuarr_release(first));
}

/* ---------------------------------------------------------------------------------------------
 * Per-thread current device and stream
 * ------------------------------------------------------------------------------------------- */
typedef struct current_check {
    gpuarr_device dev;
    gpuarr_device any;
    gpuarr_device other; /* a device other than the thread's initial one, or the same */
    pthread_barrier_t phase;
    atomic_int failures;
    atomic_int first_failure_line;
} current_check;

static void *current_thread(void *arg) {
    current_check *c = arg;
    gpuarr_stream s = {0};
    /* a new thread starts with the "any" device and no stream, whatever main has set */
    if (gpuarr_current_device().id != c->any.id) WORK_FAIL(c);
    if (gpuarr_current_stream().id != 0) WORK_FAIL(c);
    if (gpuarr_set_current_device(c->other) != GPUARR_OK) WORK_FAIL(c);
    if (gpuarr_stream_create(c->other, 0, &s) != GPUARR_OK) WORK_FAIL(c);
    if (gpuarr_set_current_stream(s) != GPUARR_OK) WORK_FAIL(c);
    pthread_barrier_wait(&c->phase); /* everyone has set its own */
    pthread_barrier_wait(&c->phase); /* main has changed its own again */
    if (gpuarr_current_stream().id != s.id) WORK_FAIL(c);
    if (gpuarr_current_device().id != c->other.id) WORK_FAIL(c);
    /* and a scope in this thread does not leak into others */
    GPUARR_WITH_STREAM(s) {
        if (gpuarr_current_stream().id != s.id) WORK_FAIL(c);
    }
    if (gpuarr_current_stream().id != s.id) WORK_FAIL(c);
    pthread_barrier_wait(&c->phase);
    if (gpuarr_set_current_stream((gpuarr_stream){0}) != GPUARR_OK) WORK_FAIL(c);
    if (gpuarr_current_stream().id != 0) WORK_FAIL(c);
    if (gpuarr_stream_destroy(s) != GPUARR_OK) WORK_FAIL(c);
    return NULL;
}

Test(threads, current_device_and_stream_are_per_thread, .init = test_setup,
     .fini = test_teardown) {
    current_check c;
    memset(&c, 0, sizeof c);
    c.dev = test_device();
    TEST_OK(gpuarr_device_find("any", &c.any));
    c.other = c.dev;
    for (int i = 0; i < gpuarr_device_count(); i++)
        if (gpuarr_device_at(i).id != c.any.id) c.other = gpuarr_device_at(i);
    cr_expect_eq(gpuarr_current_device().id, c.any.id, "main's initial current device");
    cr_expect_eq(gpuarr_current_stream().id, 0u, "main's initial current stream");
    gpuarr_stream mine = {0};
    TEST_OK(gpuarr_set_current_device(c.dev));
    TEST_OK(gpuarr_stream_create(c.dev, 0, &mine));
    TEST_OK(gpuarr_set_current_stream(mine));
    cr_expect_eq(gpuarr_current_device().id, c.dev.id);
    cr_assert_eq(pthread_barrier_init(&c.phase, NULL, NTHREADS + 1), 0);
    pthread_t t[NTHREADS];
    for (int i = 0; i < NTHREADS; i++)
        cr_assert_eq(pthread_create(&t[i], NULL, current_thread, &c), 0);
    pthread_barrier_wait(&c.phase);
    cr_expect_eq(gpuarr_current_stream().id, mine.id, "other threads changed main's stream");
    cr_expect_eq(gpuarr_current_device().id, c.dev.id, "other threads changed main's device");
    TEST_OK(gpuarr_set_current_stream((gpuarr_stream){0}));
    TEST_OK(gpuarr_set_current_device(c.any));
    pthread_barrier_wait(&c.phase);
    pthread_barrier_wait(&c.phase);
    for (int i = 0; i < NTHREADS; i++) pthread_join(t[i], NULL);
    pthread_barrier_destroy(&c.phase);
    cr_expect_eq(atomic_load(&c.failures), 0, "%d failures, the first at test_threads.c:%d",
                 atomic_load(&c.failures), atomic_load(&c.first_failure_line));
    cr_expect_eq(gpuarr_current_stream().id, 0u);
    cr_expect_eq(gpuarr_current_device().id, c.any.id);
    TEST_OK(gpuarr_stream_destroy(mine));
}

/* gpuarr_last_error is per thread even while every thread fails at once. */
typedef struct error_race {
    pthread_barrier_t start;
    atomic_int failures;
} error_race;

static void *error_thread(void *arg) {
    error_race *e = arg;
    pthread_barrier_wait(&e->start);
    for (int i = 0; i < 500; i++) {
        gpuarr_array_info info;
        char want[32];
        snprintf(want, sizeof want, "gpuarr_array_get_info");
        if ((i & 1) == 0) {
            if (gpuarr_array_get_info((gpuarr_array){0xfffffff0u}, &info) !=
                GPUARR_ERROR_INVALID_HANDLE)
                atomic_fetch_add(&e->failures, 1);
        } else {
            if (gpuarr_device_find("nonsense", &(gpuarr_device){0}) !=
                GPUARR_ERROR_INVALID_ARGUMENT)
                atomic_fetch_add(&e->failures, 1);
            snprintf(want, sizeof want, "gpuarr_device_find");
        }
        if (!strstr(gpuarr_last_error(), want)) atomic_fetch_add(&e->failures, 1);
    }
    return NULL;
}

Test(threads, last_error_stays_per_thread_while_all_threads_fail, .init = test_setup,
     .fini = test_teardown) {
    error_race e;
    memset(&e, 0, sizeof e);
    cr_assert_eq(pthread_barrier_init(&e.start, NULL, NTHREADS), 0);
    pthread_t t[NTHREADS];
    for (int i = 0; i < NTHREADS; i++)
        cr_assert_eq(pthread_create(&t[i], NULL, error_thread, &e), 0);
    for (int i = 0; i < NTHREADS; i++) pthread_join(t[i], NULL);
    pthread_barrier_destroy(&e.start);
    cr_expect_eq(atomic_load(&e.failures), 0, "%d wrong results or messages",
                 atomic_load(&e.failures));
}

/* ---------------------------------------------------------------------------------------------
 * Per-thread default streams
 * ------------------------------------------------------------------------------------------- */
enum { DEFAULT_N = 1 << 20 };

typedef struct default_check {
    gpuarr_device dev;
    gpuarr_array src;
    gpuarr_array kept;  /* made by the thread that waits for main's device sync */
    gpuarr_array left;  /* made by the thread that exits at once */
    gpuarr_event marker;
    pthread_barrier_t phase;
    atomic_int failures, first_failure_line;
} default_check;

/* Enqueues a cast on the thread's default stream ({0}) and records an event after it, then
   waits while main syncs the device, and exits without syncing anything itself. */
static void *default_waiter(void *arg) {
    default_check *c = arg;
    if (gpuarr_set_current_device(c->dev) != GPUARR_OK) WORK_FAIL(c);
    if (gpuarr_convert_async(c->src, c->dev, GPUARR_F64, (gpuarr_stream){0}, &c->kept) != GPUARR_OK) WORK_FAIL(c);
    if (gpuarr_event_record(c->marker, (gpuarr_stream){0}) != GPUARR_OK) WORK_FAIL(c);
    pthread_barrier_wait(&c->phase); /* main syncs the device now */
    pthread_barrier_wait(&c->phase);
    return NULL;
}

static void *default_leaver(void *arg) {
    default_check *c = arg;
    if (gpuarr_set_current_device(c->dev) != GPUARR_OK) WORK_FAIL(c);
    if (gpuarr_convert_async(c->src, c->dev, GPUARR_I32, (gpuarr_stream){0}, &c->left) != GPUARR_OK) WORK_FAIL(c);
    return NULL; /* with the cast possibly still queued on its default stream */
}

static void expect_default_values(gpuarr_array a, const char *what) {
    double *v = malloc((size_t)DEFAULT_N * sizeof *v);
    cr_assert_not_null(v);
    TEST_OK(gpuarr_to_host_as(a, GPUARR_F64, v, DEFAULT_N));
    size_t bad = DEFAULT_N;
    for (size_t i = 0; i < DEFAULT_N && bad == DEFAULT_N; i++)
        if (v[i] != (double)((int)(i % 3000) - 1500)) bad = i;
    double got = bad < DEFAULT_N ? v[bad] : 0;
    free(v);
    cr_expect_eq(bad, (size_t)DEFAULT_N, "%s: element %zu = %g", what, bad, got);
}

Test(threads, default_streams_are_per_thread_synced_by_the_device_and_finished_at_thread_exit,
     .init = test_setup, .fini = test_teardown) {
    default_check c;
    memset(&c, 0, sizeof c);
    c.dev = test_device();
    float *v = malloc((size_t)DEFAULT_N * sizeof *v);
    cr_assert_not_null(v);
    for (size_t i = 0; i < DEFAULT_N; i++) v[i] = (float)((int)(i % 3000) - 1500);
    int64_t shape[1] = {DEFAULT_N};
    TEST_OK(gpuarr_from_host(c.dev, v, 1, shape, &c.src));
    free(v);
    TEST_OK(gpuarr_event_create(c.dev, 0, &c.marker));
    cr_assert_eq(pthread_barrier_init(&c.phase, NULL, 2), 0);
    pthread_t waiter, leaver;
    cr_assert_eq(pthread_create(&waiter, NULL, default_waiter, &c), 0);
    cr_assert_eq(pthread_create(&leaver, NULL, default_leaver, &c), 0);
    pthread_barrier_wait(&c.phase);
    /* The waiter's work is on its own default stream, which main never named. */
    TEST_OK(gpuarr_device_sync(c.dev));
    bool done = false;
    TEST_OK(gpuarr_event_query(c.marker, &done));
    cr_expect(done, "gpuarr_device_sync returned before another thread's default-stream work");
    pthread_barrier_wait(&c.phase);
    pthread_join(waiter, NULL);
    pthread_join(leaver, NULL);
    cr_assert_eq(atomic_load(&c.failures), 0, "%d failures, the first at test_threads.c:%d",
                 atomic_load(&c.failures), atomic_load(&c.first_failure_line));
    expect_default_values(c.kept, "made on a thread's default stream, synced by the device");
    expect_default_values(c.left, "made on the default stream of a thread that has exited");
    TEST_OK(gpuarr_release(c.kept));
    TEST_OK(gpuarr_release(c.left));
    TEST_OK(gpuarr_release(c.src));
    TEST_OK(gpuarr_event_destroy(c.marker));
    pthread_barrier_destroy(&c.phase);
}
