/*
 * test_leases.c -- device leases within one process: slots (defaults, GPUARR_SLOTS, desc.slots,
 * gpuarr_device_set_slots), FIFO waits and timeouts with the holders named, placement and
 * affinity, GPUARR_WITH_LEASE, the trace's "lease acquire" event, and every bad argument.
 * The device under test is GPUARR_TEST_DEVICE; tests that need two candidates pair it with the
 * host and skip on the host itself. Threads report through atomics; assertions stay in the main
 * thread (TSan runs this file too).
 */
#include "test_common.h"

#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* A desc for the device under test alone. */
static gpuarr_lease_desc only_test_device(int64_t timeout_ms) {
    gpuarr_lease_desc d;
    memset(&d, 0, sizeof d);
    d.devices = test_device_spec();
    d.timeout_ms = timeout_ms;
    return d;
}

static void expect_slots(gpuarr_device d, int total, int in_use) {
    int t = -1, u = -1;
    TEST_OK(gpuarr_device_get_slots(d, &t, &u));
    cr_assert_eq(t, total, "total %d, expected %d", t, total);
    cr_assert_eq(u, in_use, "in use %d, expected %d", u, in_use);
}

/* Each test (a process of its own) gets its own slot files: parallel test processes never share. */
static char lease_dir[64];

static void remove_dir(const char *dir) {
    char cmd[160];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
}

static void lease_setup(void) {
    snprintf(lease_dir, sizeof lease_dir, "/tmp/gpuarr-test-leases-XXXXXX");
    cr_assert_not_null(mkdtemp(lease_dir));
    cr_assert_eq(setenv("GPUARR_LEASE_DIR", lease_dir, 1), 0);
    test_setup();
}

static void lease_teardown(void) {
    test_teardown();
    if (lease_dir[0]) remove_dir(lease_dir);
}

TestSuite(leases, .init = lease_setup, .fini = lease_teardown);

Test(leases, acquire_takes_a_slot_and_release_gives_it_back) {
    gpuarr_device dev = test_device();
    TEST_OK(gpuarr_device_set_slots(dev, 2));
    gpuarr_lease_desc d = only_test_device(0);
    gpuarr_lease a, b, c = {12345};
    TEST_OK(gpuarr_lease_acquire(&d, &a));
    expect_slots(dev, 2, 1);
    TEST_OK(gpuarr_lease_acquire(&d, &b));
    expect_slots(dev, 2, 2);
    gpuarr_device on;
    TEST_OK(gpuarr_lease_device(a, &on));
    cr_assert_eq(on.id, dev.id, "the lease is on the device its candidates named");
    /* full: timeout 0 tries once, says who holds the slots, and leaves *out alone */
    cr_assert_eq(gpuarr_lease_acquire(&d, &c), GPUARR_ERROR_TIMEOUT);
    cr_assert_eq(c.id, 12345u);
    char pid[64];
    snprintf(pid, sizeof pid, "by pid %ld thread ", (long)getpid());
    cr_assert(strstr(gpuarr_last_error(), "2 of 2 slots in use in this process"), "%s", gpuarr_last_error());
    cr_assert(strstr(gpuarr_last_error(), pid), "%s", gpuarr_last_error());
    cr_assert(strstr(gpuarr_last_error(), "gpuarr_lease_acquire: "), "%s", gpuarr_last_error());
    TEST_OK(gpuarr_lease_release(a));
    expect_slots(dev, 2, 1);
    TEST_OK(gpuarr_lease_acquire(&d, &c));
    TEST_OK(gpuarr_lease_release(b));
    TEST_OK(gpuarr_lease_release(c));
    expect_slots(dev, 2, 0);
}

Test(leases, a_lease_of_several_slots_takes_them_all) {
    gpuarr_device dev = test_device();
    TEST_OK(gpuarr_device_set_slots(dev, 3));
    gpuarr_lease_desc d = only_test_device(0);
    d.slots = 2;
    gpuarr_lease a, b;
    TEST_OK(gpuarr_lease_acquire(&d, &a));
    expect_slots(dev, 3, 2);
    cr_assert_eq(gpuarr_lease_acquire(&d, &b), GPUARR_ERROR_TIMEOUT, "one slot left, two asked");
    cr_assert(strstr(gpuarr_last_error(), "(2 slots, "), "%s", gpuarr_last_error());
    d.slots = 1;
    TEST_OK(gpuarr_lease_acquire(&d, &b));
    TEST_OK(gpuarr_lease_release(a));
    TEST_OK(gpuarr_lease_release(b));
    expect_slots(dev, 3, 0);
}

/* ceil(online CPUs / devices other than the host, a GPU seen by two backends counted once) */
static int default_device_slots(void) {
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    int n = gpuarr_device_count(), devices = 0;
    for (int i = 1; i < n; i++) {
        gpuarr_device_info in, other;
        TEST_OK(gpuarr_device_get_info(gpuarr_device_at(i), &in));
        bool duplicate = false;
        if (in.same_as.id) {
            TEST_OK(gpuarr_device_get_info(in.same_as, &other));
            duplicate = other.backend < in.backend;
        }
        devices += !duplicate;
    }
    return devices ? (int)((cpus + devices - 1) / devices) : 1;
}

Test(leases, default_slots_follow_the_cpu_count) {
    expect_slots(gpuarr_host(), (int)sysconf(_SC_NPROCESSORS_ONLN), 0);
    for (int i = 1; i < gpuarr_device_count(); i++) expect_slots(gpuarr_device_at(i), default_device_slots(), 0);
}

Test(leases, gpuarr_slots_sets_them_per_device) {
    gpuarr_shutdown();
    setenv("GPUARR_SLOTS", "host=3, opencl:*=2,cuda:0=4,cuda:7=9", 1);
    TEST_OK(gpuarr_init(NULL));
    expect_slots(gpuarr_host(), 3, 0);
    gpuarr_device d;
    for (int i = 0; i < 8; i++) {
        char spec[32];
        snprintf(spec, sizeof spec, "opencl:%d", i);
        if (gpuarr_device_find(spec, &d) != GPUARR_OK) continue;
        /* a GPU seen through OpenCL and as cuda:0 has one count: the later item, cuda:0=4, wins */
        gpuarr_device_info in, twin;
        TEST_OK(gpuarr_device_get_info(d, &in));
        bool is_cuda0 = in.same_as.id && gpuarr_device_get_info(in.same_as, &twin) == GPUARR_OK && strcmp(twin.spec, "cuda:0") == 0;
        expect_slots(d, is_cuda0 ? 4 : 2, 0);
    }
    if (gpuarr_device_find("cuda:0", &d) == GPUARR_OK) expect_slots(d, 4, 0);
    gpuarr_desc q;
    TEST_OK(gpuarr_query_desc(&q));
    cr_assert_str_eq(q.slots, "host=3, opencl:*=2,cuda:0=4,cuda:7=9", "the desc in effect shows the variable's text");
    /* desc.slots takes the variable's place */
    gpuarr_shutdown();
    gpuarr_desc desc;
    memset(&desc, 0, sizeof desc);
    desc.slots = "host=5";
    TEST_OK(gpuarr_init(&desc));
    expect_slots(gpuarr_host(), 5, 0);
    if (gpuarr_device_find("opencl:0", &d) == GPUARR_OK) expect_slots(d, default_device_slots(), 0);
    TEST_OK(gpuarr_query_desc(&q));
    cr_assert_str_eq(q.slots, "host=5");
    /* a second init: the same text is fine, another is refused naming the field */
    TEST_OK(gpuarr_init(&desc));
    gpuarr_shutdown();
    desc.slots = "host=6";
    cr_assert_eq(gpuarr_init(&desc), GPUARR_ERROR_INVALID_ARGUMENT);
    cr_assert(strstr(gpuarr_last_error(), "desc->slots differs"), "%s", gpuarr_last_error());
    unsetenv("GPUARR_SLOTS");
}

Test(leases, malformed_slots_fail_init_naming_them) {
    gpuarr_shutdown();
    static const char *bad[] = {"host", "host=0", "host=65537", "gpu=2", "cuda:x=1", "host=2,", "=3", "opencl:1=-1"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        setenv("GPUARR_SLOTS", bad[i], 1);
        cr_assert_eq(gpuarr_init(NULL), GPUARR_ERROR_INVALID_ARGUMENT, "GPUARR_SLOTS=%s", bad[i]);
        cr_assert(strstr(gpuarr_last_error(), "GPUARR_SLOTS=\""), "%s", gpuarr_last_error());
        cr_assert(!gpuarr_is_initialized());
    }
    unsetenv("GPUARR_SLOTS");
    gpuarr_desc desc;
    memset(&desc, 0, sizeof desc);
    desc.slots = "cuda:1=many";
    cr_assert_eq(gpuarr_init(&desc), GPUARR_ERROR_INVALID_ARGUMENT);
    cr_assert(strstr(gpuarr_last_error(), "desc->slots=\"cuda:1=many\": item \"cuda:1=many\""), "%s", gpuarr_last_error());
    TEST_OK(gpuarr_init(NULL)); /* for the fixture's shutdown */
}

Test(leases, a_timeout_waits_that_long) {
    gpuarr_device dev = test_device();
    TEST_OK(gpuarr_device_set_slots(dev, 1));
    gpuarr_lease_desc d = only_test_device(0);
    gpuarr_lease a, b;
    TEST_OK(gpuarr_lease_acquire(&d, &a));
    d.timeout_ms = 150;
    double t0 = now_ms();
    cr_assert_eq(gpuarr_lease_acquire(&d, &b), GPUARR_ERROR_TIMEOUT);
    double waited = now_ms() - t0;
    cr_assert(waited >= 145 && waited < 2000, "waited %.1f ms for a 150 ms timeout", waited);
    cr_assert(strstr(gpuarr_last_error(), "within 150 ms"), "%s", gpuarr_last_error());
    TEST_OK(gpuarr_lease_release(a));
}

/* ---- waiting threads ---- */
typedef struct waiter {
    gpuarr_lease_desc desc;
    atomic_int *order; /* the next place in line */
    int place;         /* where this one got its lease */
    gpuarr_result result;
} waiter;

static void *waiter_thread(void *arg) {
    waiter *w = arg;
    gpuarr_lease l;
    w->result = gpuarr_lease_acquire(&w->desc, &l);
    if (w->result != GPUARR_OK) return NULL;
    w->place = atomic_fetch_add(w->order, 1);
    sleep_ms(20); /* hold it a while: the next must wait for this release */
    w->result = gpuarr_lease_release(l);
    return NULL;
}

Test(leases, waiters_are_served_in_arrival_order) {
    gpuarr_device dev = test_device();
    TEST_OK(gpuarr_device_set_slots(dev, 1));
    gpuarr_lease_desc d = only_test_device(0);
    gpuarr_lease held;
    TEST_OK(gpuarr_lease_acquire(&d, &held));
    enum { N = 4 };
    atomic_int order = 0;
    waiter w[N];
    pthread_t t[N];
    for (int i = 0; i < N; i++) {
        w[i].desc = only_test_device(-1); /* forever */
        w[i].order = &order;
        w[i].place = -1;
        cr_assert_eq(pthread_create(&t[i], NULL, waiter_thread, &w[i]), 0);
        sleep_ms(60); /* so that each is queued before the next arrives */
    }
    expect_slots(dev, 1, 1);
    TEST_OK(gpuarr_lease_release(held));
    for (int i = 0; i < N; i++) pthread_join(t[i], NULL);
    for (int i = 0; i < N; i++) {
        cr_assert_eq(w[i].result, GPUARR_OK, "waiter %d: %s", i, gpuarr_result_name(w[i].result));
        cr_assert_eq(w[i].place, i, "waiter %d was served %d-th", i, w[i].place);
    }
    expect_slots(dev, 1, 0);
}

typedef struct contention {
    gpuarr_lease_desc desc;
    int iterations;
    atomic_int holders, most, failures, done;
} contention;

static void *contender(void *arg) {
    contention *c = arg;
    for (int i = 0; i < c->iterations; i++) {
        gpuarr_lease l;
        if (gpuarr_lease_acquire(&c->desc, &l) != GPUARR_OK) {
            atomic_fetch_add(&c->failures, 1);
            continue;
        }
        int now = atomic_fetch_add(&c->holders, 1) + 1;
        int most = atomic_load(&c->most);
        while (now > most && !atomic_compare_exchange_weak(&c->most, &most, now)) {}
        sched_yield();
        atomic_fetch_sub(&c->holders, 1);
        if (gpuarr_lease_release(l) != GPUARR_OK) atomic_fetch_add(&c->failures, 1);
        atomic_fetch_add(&c->done, 1);
    }
    return NULL;
}

Test(leases, eight_threads_never_exceed_three_slots) {
    gpuarr_device dev = test_device();
    TEST_OK(gpuarr_device_set_slots(dev, 3));
    enum { N = 8 };
    contention c;
    memset(&c, 0, sizeof c);
    c.desc = only_test_device(-1);
    c.iterations = 300;
    pthread_t t[N];
    for (int i = 0; i < N; i++) cr_assert_eq(pthread_create(&t[i], NULL, contender, &c), 0);
    for (int i = 0; i < N; i++) pthread_join(t[i], NULL);
    cr_assert_eq(atomic_load(&c.failures), 0);
    cr_assert_eq(atomic_load(&c.done), N * 300);
    cr_assert(atomic_load(&c.most) <= 3 && atomic_load(&c.most) >= 1, "at most %d holders at once", atomic_load(&c.most));
    expect_slots(dev, 3, 0);
}

Test(leases, raising_the_slots_wakes_a_waiter) {
    gpuarr_device dev = test_device();
    TEST_OK(gpuarr_device_set_slots(dev, 1));
    gpuarr_lease_desc d = only_test_device(0);
    gpuarr_lease held;
    TEST_OK(gpuarr_lease_acquire(&d, &held));
    atomic_int order = 0;
    waiter w = {only_test_device(5000), &order, -1, GPUARR_OK};
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, waiter_thread, &w), 0);
    sleep_ms(50);
    TEST_OK(gpuarr_device_set_slots(dev, 2));
    pthread_join(t, NULL);
    cr_assert_eq(w.result, GPUARR_OK, "%s", gpuarr_result_name(w.result));
    cr_assert_eq(w.place, 0);
    TEST_OK(gpuarr_lease_release(held));
}

/* ---- two candidates: the host and the device under test ---- */
static gpuarr_device second_candidate(void) {
    gpuarr_device dev = test_device();
    if (test_device_is_host(dev)) {
        remove_dir(lease_dir); /* a skipped test's .fini does not run */
        test_skip("needs a device besides the host (GPUARR_TEST_DEVICE=host)");
    }
    TEST_OK(gpuarr_device_set_slots(dev, 2));
    TEST_OK(gpuarr_device_set_slots(gpuarr_host(), 2));
    return dev;
}

static gpuarr_lease_desc pair_desc(gpuarr_placement p, const char *affinity) {
    static char list[64];
    snprintf(list, sizeof list, "host,%s", test_device_spec());
    gpuarr_lease_desc d;
    memset(&d, 0, sizeof d);
    d.devices = list;
    d.placement = p;
    d.affinity = affinity;
    return d;
}

static gpuarr_device lease_on(const gpuarr_lease_desc *d, gpuarr_lease *l) {
    gpuarr_device on = {0};
    TEST_OK(gpuarr_lease_acquire(d, l));
    TEST_OK(gpuarr_lease_device(*l, &on));
    return on;
}

Test(leases, least_leased_spreads_leases) {
    gpuarr_device dev = second_candidate(), host = gpuarr_host();
    gpuarr_lease_desc d = pair_desc(GPUARR_PLACE_LEAST_LEASED, NULL);
    gpuarr_lease l[4];
    gpuarr_device first = lease_on(&d, &l[0]);
    gpuarr_device second = lease_on(&d, &l[1]);
    cr_assert_neq(first.id, second.id, "the second lease goes to the device with no lease");
    cr_assert(first.id == dev.id || first.id == host.id);
    lease_on(&d, &l[2]);
    lease_on(&d, &l[3]);
    expect_slots(dev, 2, 2);
    expect_slots(host, 2, 2);
    for (int i = 0; i < 4; i++) TEST_OK(gpuarr_lease_release(l[i]));
}

Test(leases, round_robin_takes_turns) {
    second_candidate();
    gpuarr_lease_desc d = pair_desc(GPUARR_PLACE_ROUND_ROBIN, NULL);
    gpuarr_lease l;
    gpuarr_device prev = lease_on(&d, &l);
    TEST_OK(gpuarr_lease_release(l));
    for (int i = 0; i < 4; i++) { /* released at once: only the turn decides */
        gpuarr_device on = lease_on(&d, &l);
        cr_assert_neq(on.id, prev.id, "turn %d", i);
        TEST_OK(gpuarr_lease_release(l));
        prev = on;
    }
}

Test(leases, most_free_picks_a_candidate) {
    gpuarr_device dev = second_candidate();
    gpuarr_lease_desc d = pair_desc(GPUARR_PLACE_MOST_FREE, NULL);
    gpuarr_lease l;
    gpuarr_device on = lease_on(&d, &l);
    cr_assert(on.id == dev.id || on.id == gpuarr_host().id);
    TEST_OK(gpuarr_lease_release(l));
}

Test(leases, affinity_keeps_a_key_on_one_device_while_it_has_slots) {
    second_candidate();
    gpuarr_lease_desc d = pair_desc(GPUARR_PLACE_DEFAULT, "job-7");
    gpuarr_lease a, b, c, other;
    gpuarr_device first = lease_on(&d, &a);
    gpuarr_device second = lease_on(&d, &b);
    cr_assert_eq(second.id, first.id, "the same key, the same device, though the other has no lease");
    gpuarr_device third = lease_on(&d, &c);
    cr_assert_neq(third.id, first.id, "its device is full: the key goes elsewhere");
    d.affinity = "job-8";
    gpuarr_lease_desc once = d;
    once.timeout_ms = 0;
    TEST_OK(gpuarr_lease_acquire(&once, &other));
    gpuarr_device on;
    TEST_OK(gpuarr_lease_device(other, &on));
    cr_assert_eq(on.id, third.id, "the only slot left");
    TEST_OK(gpuarr_lease_release(a));
    TEST_OK(gpuarr_lease_release(b));
    TEST_OK(gpuarr_lease_release(c));
    TEST_OK(gpuarr_lease_release(other));
}

Test(leases, memory_bytes_passes_over_a_device_without_that_much_free) {
    gpuarr_lease_desc d = only_test_device(0);
    d.memory_bytes = UINT64_MAX / 2;
    gpuarr_lease l;
    cr_assert_eq(gpuarr_lease_acquire(&d, &l), GPUARR_ERROR_TIMEOUT);
    cr_assert(strstr(gpuarr_last_error(), "too little free memory"), "%s", gpuarr_last_error());
    d.timeout_ms = 120; /* a wait for memory looks again, and still times out */
    double t0 = now_ms();
    cr_assert_eq(gpuarr_lease_acquire(&d, &l), GPUARR_ERROR_TIMEOUT);
    cr_assert(now_ms() - t0 >= 115);
    /* a pool limit counts: 1 MiB left, 2 MiB asked */
    gpuarr_device dev = test_device();
    TEST_OK(gpuarr_pool_set_limit(dev, 1u << 20));
    d.timeout_ms = 0;
    d.memory_bytes = 2u << 20;
    cr_assert_eq(gpuarr_lease_acquire(&d, &l), GPUARR_ERROR_TIMEOUT);
    d.memory_bytes = 1u << 19;
    TEST_OK(gpuarr_lease_acquire(&d, &l));
    TEST_OK(gpuarr_lease_release(l));
}

Test(leases, with_lease_makes_the_device_current_and_releases_it) {
    gpuarr_device dev = test_device();
    TEST_OK(gpuarr_device_set_slots(dev, 1));
    gpuarr_lease_desc d = only_test_device(0);
    int ran = 0;
    GPUARR_WITH_LEASE(&d, leased) {
        cr_assert_eq(leased.id, dev.id);
        cr_assert_eq(gpuarr_current_device().id, dev.id);
        expect_slots(dev, 1, 1);
        ran++;
    }
    cr_assert_eq(ran, 1);
    expect_slots(dev, 1, 0);
    for (int i = 0; i < 3; i++) {
        GPUARR_WITH_LEASE(&d, leased) {
            (void)leased;
            ran++;
            break; /* leaves the scope: released */
        }
    }
    cr_assert_eq(ran, 4);
    expect_slots(dev, 1, 0);
    /* no slot: the block is skipped and the _R form says why */
    gpuarr_lease held;
    TEST_OK(gpuarr_lease_acquire(&d, &held));
    gpuarr_result r = GPUARR_OK;
    GPUARR_WITH_LEASE_R(&d, leased, &r) {
        (void)leased;
        ran++;
    }
    cr_assert_eq(ran, 4);
    cr_assert_eq(r, GPUARR_ERROR_TIMEOUT);
    cr_assert(strstr(gpuarr_last_error(), "gpuarr_scope_enter_lease: "), "%s", gpuarr_last_error());
    TEST_OK(gpuarr_lease_release(held));
    expect_slots(dev, 1, 0);
}

Test(leases, the_trace_shows_an_acquire_and_its_wait) {
    gpuarr_device dev = test_device();
    TEST_OK(gpuarr_device_set_slots(dev, 1));
    char dir[] = "/tmp/gpuarr-lease-trace-XXXXXX", path[128];
    cr_assert_not_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/trace.json", dir);
    TEST_OK(gpuarr_trace_start(path));
    gpuarr_lease_desc d = only_test_device(0);
    gpuarr_lease held, l;
    TEST_OK(gpuarr_lease_acquire(&d, &held));
    d.timeout_ms = 30;
    cr_assert_eq(gpuarr_lease_acquire(&d, &l), GPUARR_ERROR_TIMEOUT);
    TEST_OK(gpuarr_lease_release(held));
    TEST_OK(gpuarr_trace_stop());
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f);
    static char text[1 << 16];
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = '\0';
    cr_assert(strstr(text, "\"name\":\"lease acquire\""), "%s", text);
    cr_assert(strstr(text, "\"waited\":false,\"outcome\":\"granted\""), "%s", text);
    cr_assert(strstr(text, "\"waited\":true,\"outcome\":\"GPUARR_ERROR_TIMEOUT\""), "%s", text);
    unlink(path);
    rmdir(dir);
}

Test(leases, the_default_candidates_are_the_gpus) {
    gpuarr_device gpu;
    gpuarr_lease l;
    if (gpuarr_device_find("gpu", &gpu) != GPUARR_OK) {
        cr_assert_eq(gpuarr_lease_acquire(NULL, &l), GPUARR_ERROR_NO_DEVICE);
        cr_assert(strstr(gpuarr_last_error(), "none of the"), "%s", gpuarr_last_error());
        /* "any": the host when there is no GPU */
        gpuarr_lease_desc d;
        memset(&d, 0, sizeof d);
        d.devices = "any";
        gpuarr_device on = lease_on(&d, &l);
        cr_assert_eq(on.id, gpuarr_host().id);
    } else {
        gpuarr_device on = lease_on(NULL, &l);
        gpuarr_device_info in;
        TEST_OK(gpuarr_device_get_info(on, &in));
        cr_assert_eq(in.type, GPUARR_DEVICE_TYPE_GPU);
    }
    TEST_OK(gpuarr_lease_release(l));
}

Test(leases, bad_arguments_are_named) {
    gpuarr_device dev = test_device();
    TEST_OK(gpuarr_device_set_slots(dev, 1));
    gpuarr_lease l = {777}, ok;
    gpuarr_lease_desc d = only_test_device(0);
    cr_assert_eq(gpuarr_lease_acquire(&d, NULL), GPUARR_ERROR_INVALID_ARGUMENT);
    cr_assert(strstr(gpuarr_last_error(), "out is NULL"), "%s", gpuarr_last_error());
    struct {
        gpuarr_lease_desc d;
        gpuarr_result r;
        const char *words;
    } cases[12];
    int n = 0;
    static char long_key[200];
    memset(long_key, 'k', sizeof long_key - 1);
    for (int i = 0; i < 12; i++) cases[i].d = only_test_device(0);
    cases[n].d.placement = (gpuarr_placement)99, cases[n].r = GPUARR_ERROR_INVALID_ARGUMENT, cases[n++].words = "desc->placement = 99";
    cases[n].d.placement = (gpuarr_placement)-1, cases[n].r = GPUARR_ERROR_INVALID_ARGUMENT, cases[n++].words = "desc->placement = -1";
    cases[n].d.slots = -1, cases[n].r = GPUARR_ERROR_INVALID_ARGUMENT, cases[n++].words = "desc->slots = -1";
    cases[n].d.slots = 70000, cases[n].r = GPUARR_ERROR_INVALID_ARGUMENT, cases[n++].words = "desc->slots = 70000";
    cases[n].d.slots = 2, cases[n].r = GPUARR_ERROR_INVALID_ARGUMENT, cases[n++].words = "more than any candidate has";
    cases[n].d.affinity = "", cases[n].r = GPUARR_ERROR_INVALID_ARGUMENT, cases[n++].words = "desc->affinity is \"\"";
    cases[n].d.affinity = long_key, cases[n].r = GPUARR_ERROR_INVALID_ARGUMENT, cases[n++].words = "desc->affinity is 199 characters";
    cases[n].d.devices = "", cases[n].r = GPUARR_ERROR_INVALID_ARGUMENT, cases[n++].words = "desc->devices is \"\"";
    cases[n].d.devices = "host,,host", cases[n].r = GPUARR_ERROR_INVALID_ARGUMENT, cases[n++].words = "item \"\" is not";
    cases[n].d.devices = "gpus", cases[n].r = GPUARR_ERROR_INVALID_ARGUMENT, cases[n++].words = "desc->devices = \"gpus\": spec";
    cases[n].d.devices = "host,opencl:99", cases[n].r = GPUARR_ERROR_NO_DEVICE, cases[n++].words = "desc->devices = \"host,opencl:99\"";
    for (int i = 0; i < n; i++) {
        gpuarr_result r = gpuarr_lease_acquire(&cases[i].d, &l);
        cr_assert_eq(r, cases[i].r, "case %d: %s: %s", i, gpuarr_result_name(r), gpuarr_last_error());
        cr_assert(strstr(gpuarr_last_error(), cases[i].words), "case %d: %s", i, gpuarr_last_error());
        cr_assert_eq(l.id, 777u, "case %d wrote *out", i);
    }
    /* handles */
    gpuarr_lease zero = {0}, forged = {0xdead0001u};
    cr_assert_eq(gpuarr_lease_release(zero), GPUARR_ERROR_INVALID_HANDLE);
    cr_assert(strstr(gpuarr_last_error(), "l is a zero lease handle"), "%s", gpuarr_last_error());
    cr_assert_eq(gpuarr_lease_release(forged), GPUARR_ERROR_INVALID_HANDLE);
    TEST_OK(gpuarr_lease_acquire(&d, &ok));
    gpuarr_lease near = {ok.id ^ 0x00010000u};
    cr_assert_eq(gpuarr_lease_release(near), GPUARR_ERROR_INVALID_HANDLE, "another generation of the same record");
    cr_assert(strstr(gpuarr_last_error(), "not a live lease"), "%s", gpuarr_last_error());
    gpuarr_device on;
    cr_assert_eq(gpuarr_lease_device(ok, NULL), GPUARR_ERROR_INVALID_ARGUMENT);
    /* slots */
    cr_assert_eq(gpuarr_device_set_slots(dev, 0), GPUARR_ERROR_INVALID_ARGUMENT);
    cr_assert(strstr(gpuarr_last_error(), "slots = 0: must be 1.."), "%s", gpuarr_last_error());
    TEST_OK(gpuarr_device_set_slots(dev, 2));
    TEST_OK(gpuarr_lease_acquire(&d, &l));
    cr_assert_eq(gpuarr_device_set_slots(dev, 1), GPUARR_ERROR_INVALID_ARGUMENT);
    cr_assert(strstr(gpuarr_last_error(), "slots = 1: 2 slots of"), "%s", gpuarr_last_error());
    expect_slots(dev, 2, 2);
    int t, u;
    cr_assert_eq(gpuarr_device_get_slots(dev, NULL, &u), GPUARR_ERROR_INVALID_ARGUMENT);
    cr_assert(strstr(gpuarr_last_error(), "total is NULL"), "%s", gpuarr_last_error());
    cr_assert_eq(gpuarr_device_get_slots(dev, &t, NULL), GPUARR_ERROR_INVALID_ARGUMENT);
    gpuarr_device bad = {0};
    cr_assert_eq(gpuarr_device_get_slots(bad, &t, &u), GPUARR_ERROR_INVALID_HANDLE);
    cr_assert_eq(gpuarr_device_set_slots(bad, 1), GPUARR_ERROR_INVALID_HANDLE);
    /* double release */
    TEST_OK(gpuarr_lease_release(ok));
    cr_assert_eq(gpuarr_lease_release(ok), GPUARR_ERROR_INVALID_HANDLE);
    cr_assert(strstr(gpuarr_last_error(), "was released already"), "%s", gpuarr_last_error());
    cr_assert_eq(gpuarr_lease_device(ok, &on), GPUARR_ERROR_INVALID_HANDLE);
    TEST_OK(gpuarr_lease_release(l));
    expect_slots(dev, 2, 0);
}

Test(leases, shutdown_drops_leases_and_their_handles_go_stale) {
    gpuarr_lease_desc d = only_test_device(0);
    gpuarr_lease l;
    test_device();
    TEST_OK(gpuarr_lease_acquire(&d, &l));
    gpuarr_shutdown(); /* warns about the lease it drops */
    gpuarr_device on;
    cr_assert_eq(gpuarr_lease_device(l, &on), GPUARR_ERROR_NOT_INITIALIZED);
    cr_assert_eq(gpuarr_lease_acquire(&d, &l), GPUARR_ERROR_NOT_INITIALIZED);
    TEST_OK(gpuarr_init(NULL));
    cr_assert_eq(gpuarr_lease_release(l), GPUARR_ERROR_INVALID_HANDLE, "a lease of an earlier gpuarr_init");
    gpuarr_device dev = test_device();
    int t, u;
    TEST_OK(gpuarr_device_get_slots(dev, &t, &u));
    cr_assert_eq(u, 0);
}

/* ---- the slot files (GPUARR_LEASE_DIR) ---- */
static void restart_with_lease_dir(const char *value) {
    gpuarr_shutdown();
    cr_assert_eq(setenv("GPUARR_LEASE_DIR", value, 1), 0);
    TEST_OK(gpuarr_init(NULL));
}

Test(leases, the_folder_is_made_0700_and_a_slot_file_names_its_holder) {
    char sub[128], cmd[256], line[256] = "";
    snprintf(sub, sizeof sub, "%s/sub", lease_dir);
    restart_with_lease_dir(sub);
    test_device();
    gpuarr_lease_desc d = only_test_device(0);
    gpuarr_lease l;
    TEST_OK(gpuarr_lease_acquire(&d, &l));
    struct stat st;
    cr_assert_eq(stat(sub, &st), 0);
    cr_assert_eq(st.st_mode & 0777, 0700);
    snprintf(cmd, sizeof cmd, "cat %s/*.0.slot", sub);
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    if (!fgets(line, sizeof line, p)) line[0] = '\0';
    pclose(p);
    char want[64];
    snprintf(want, sizeof want, "pid %ld thread ", (long)getpid());
    cr_assert(strncmp(line, want, strlen(want)) == 0, "%s", line);
    cr_assert(strstr(line, " program test_leases since "), "%s", line);
    TEST_OK(gpuarr_lease_release(l));
}

Test(leases, lease_dir_off_keeps_leases_in_the_process) {
    restart_with_lease_dir("off");
    test_device();
    gpuarr_lease_desc d = only_test_device(0);
    gpuarr_lease l;
    TEST_OK(gpuarr_lease_acquire(&d, &l));
    char cmd[160];
    snprintf(cmd, sizeof cmd, "test -z \"$(ls -A '%s')\"", lease_dir);
    cr_assert_eq(system(cmd), 0, "no slot file in %s", lease_dir);
    TEST_OK(gpuarr_lease_release(l));
}

Test(leases, a_bad_lease_dir_is_named) {
    gpuarr_shutdown();
    cr_assert_eq(setenv("GPUARR_LEASE_DIR", "relative/path", 1), 0);
    cr_assert_eq(gpuarr_init(NULL), GPUARR_ERROR_INVALID_ARGUMENT);
    cr_assert(strstr(gpuarr_last_error(), "GPUARR_LEASE_DIR=\"relative/path\": an absolute path, or off"), "%s", gpuarr_last_error());
    char file[128], under[160];
    snprintf(file, sizeof file, "%s/file", lease_dir);
    FILE *f = fopen(file, "w");
    cr_assert_not_null(f);
    fclose(f);
    snprintf(under, sizeof under, "%s/sub", file); /* under a plain file: cannot be made */
    cr_assert_eq(setenv("GPUARR_LEASE_DIR", under, 1), 0);
    TEST_OK(gpuarr_init(NULL));
    test_device();
    gpuarr_lease_desc d = only_test_device(0);
    gpuarr_lease l;
    cr_assert_eq(gpuarr_lease_acquire(&d, &l), GPUARR_ERROR_BACKEND);
    cr_assert(strstr(gpuarr_last_error(), under) && strstr(gpuarr_last_error(), "cannot be made: Not a directory"), "%s",
              gpuarr_last_error());
}

/* ---- files another user can plant in a lease folder ---- */
/* The name of the device under test's slot file k in dir, made by one lease taken and given back. */
static void slot_file_of_test_device(const char *dir, int k, char *out, size_t cap) {
    gpuarr_lease_desc d = only_test_device(0);
    gpuarr_lease l[8];
    cr_assert(k < 8);
    TEST_OK(gpuarr_device_set_slots(test_device(), k + 1));
    for (int i = 0; i <= k; i++) TEST_OK(gpuarr_lease_acquire(&d, &l[i]));
    for (int i = 0; i <= k; i++) TEST_OK(gpuarr_lease_release(l[i]));
    char suffix[32];
    snprintf(suffix, sizeof suffix, ".%d.slot", k);
    out[0] = '\0';
    DIR *dd = opendir(dir);
    cr_assert_not_null(dd, "%s", dir);
    for (struct dirent *e; (e = readdir(dd));) {
        size_t n = strlen(e->d_name), m = strlen(suffix);
        if (n > m && strcmp(e->d_name + n - m, suffix) == 0) snprintf(out, cap, "%s/%s", dir, e->d_name);
    }
    closedir(dd);
    cr_assert(out[0], "no slot file %d in %s", k, dir);
}

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f, "%s", path);
    fputs(text, f);
    fclose(f);
}

static void expect_text(const char *path, const char *want) {
    char got[256] = "";
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f, "%s", path);
    size_t n = fread(got, 1, sizeof got - 1, f);
    got[n] = '\0';
    fclose(f);
    cr_assert_str_eq(got, want, "%s was written through a planted symlink", path);
}

static void skip_unless_root(void) {
    if (geteuid() != 0) test_skip("needs root to plant files of another user (uid 65534); make test runs as root");
}

/* A folder of its own under /tmp that uid 65534 could use too (the build folder may not be
   reachable for it): the caller removes it. */
static void shared_parent(char *out, size_t cap) {
    snprintf(out, cap, "/tmp/gpuarr-test-trust-XXXXXX");
    cr_assert_not_null(mkdtemp(out));
    cr_assert_eq(chmod(out, 0755), 0);
}

Test(leases, a_symlink_planted_as_a_slot_file_is_not_written_through) {
    char slot[512], victim[512];
    slot_file_of_test_device(lease_dir, 0, slot, sizeof slot);
    snprintf(victim, sizeof victim, "%s/victim.txt", lease_dir);
    write_text(victim, "my notes\n");
    cr_assert_eq(unlink(slot), 0);
    cr_assert_eq(symlink(victim, slot), 0);
    gpuarr_lease_desc d = only_test_device(0);
    gpuarr_lease l;
    TEST_FAIL_WITH(gpuarr_lease_acquire(&d, &l), GPUARR_ERROR_BACKEND, "is a symlink");
    cr_expect(strstr(gpuarr_last_error(), slot), "the message does not name %s: %s", slot, gpuarr_last_error());
    expect_text(victim, "my notes\n");
}

Test(leases, a_fifo_planted_as_a_slot_file_does_not_hang_the_summary_or_an_acquire) {
    char slot[512], buf[2048];
    slot_file_of_test_device(lease_dir, 0, slot, sizeof slot);
    cr_assert_eq(unlink(slot), 0);
    cr_assert_eq(mkfifo(slot, 0600), 0);
    alarm(20); /* a hang ends the test (SIGALRM) instead of the suite */
    double t0 = now_ms();
    TEST_OK(gpuarr_lease_summary(test_device(), buf, sizeof buf));
    cr_assert(strstr(buf, "slot 0: not usable: the slot file is not a regular file"), "%s", buf);
    gpuarr_lease_desc d = only_test_device(0);
    gpuarr_lease l;
    TEST_FAIL_WITH(gpuarr_lease_acquire(&d, &l), GPUARR_ERROR_BACKEND, "is not a regular file");
    alarm(0);
    cr_assert_lt(now_ms() - t0, 5000.0);
}

Test(leases, a_lease_folder_of_another_user_or_writable_by_others_is_refused_with_the_reason) {
    skip_unless_root();
    char parent[64], dir[128];
    shared_parent(parent, sizeof parent);
    snprintf(dir, sizeof dir, "%s/gpuarr-0", parent); /* as if uid 65534 had made /tmp/gpuarr-<uid> first */
    cr_assert_eq(mkdir(dir, 0700), 0);
    cr_assert_eq(chown(dir, 65534, 65534), 0);
    restart_with_lease_dir(dir);
    gpuarr_lease_desc d = only_test_device(0);
    gpuarr_lease l;
    TEST_FAIL_WITH(gpuarr_lease_acquire(&d, &l), GPUARR_ERROR_BACKEND, "is owned by uid 65534, not by this user (uid 0)");
    cr_expect(strstr(gpuarr_last_error(), dir), "the message does not name %s: %s", dir, gpuarr_last_error());
    char buf[1024];
    TEST_FAIL_WITH(gpuarr_lease_summary(test_device(), buf, sizeof buf), GPUARR_ERROR_BACKEND, "is owned by uid 65534");
    cr_assert_eq(chown(dir, 0, 0), 0);
    cr_assert_eq(chmod(dir, 0777), 0); /* ours, but anyone may plant files in it */
    TEST_FAIL_WITH(gpuarr_lease_acquire(&d, &l), GPUARR_ERROR_BACKEND, "is writable by others (mode 0777)");
    remove_dir(parent);
}

Test(leases, a_lease_folder_that_is_a_symlink_is_refused) {
    char real[128], link[128];
    snprintf(real, sizeof real, "%s/real", lease_dir);
    snprintf(link, sizeof link, "%s/link", lease_dir);
    cr_assert_eq(mkdir(real, 0700), 0);
    cr_assert_eq(symlink(real, link), 0); /* as planted where the folder would be made */
    restart_with_lease_dir(link);
    gpuarr_lease_desc d = only_test_device(0);
    gpuarr_lease l;
    TEST_FAIL_WITH(gpuarr_lease_acquire(&d, &l), GPUARR_ERROR_BACKEND, "is a symlink (not followed)");
    cr_expect(strstr(gpuarr_last_error(), link), "the message does not name %s: %s", link, gpuarr_last_error());
    char cmd[256];
    snprintf(cmd, sizeof cmd, "test -z \"$(ls -A '%s')\"", real);
    cr_assert_eq(system(cmd), 0, "a slot file was made in %s, through the symlink", real);
}

/* A sticky folder shared on purpose (mode 1777): another user's slot file is used, and a symlink
   there is still refused. */
Test(leases, a_sticky_shared_folder_uses_other_users_slot_files_but_never_follows_a_symlink) {
    skip_unless_root();
    char parent[64], dir[128], slot0[512], slot1[512], victim[512];
    shared_parent(parent, sizeof parent);
    snprintf(dir, sizeof dir, "%s/shared", parent);
    cr_assert_eq(mkdir(dir, 0700), 0);
    restart_with_lease_dir(dir);
    slot_file_of_test_device(dir, 1, slot1, sizeof slot1);
    snprintf(slot0, sizeof slot0, "%.*s0.slot", (int)(strlen(slot1) - strlen("1.slot")), slot1);
    cr_assert_eq(chmod(dir, 01777), 0);
    cr_assert_eq(chown(slot0, 65534, 65534), 0); /* as made by another user of the folder */
    snprintf(victim, sizeof victim, "%s/victim.txt", parent);
    write_text(victim, "my notes\n");
    cr_assert_eq(unlink(slot1), 0);
    cr_assert_eq(symlink(victim, slot1), 0);
    restart_with_lease_dir(dir);
    TEST_OK(gpuarr_device_set_slots(test_device(), 2));
    gpuarr_lease_desc d = only_test_device(0);
    gpuarr_lease l, l2;
    TEST_OK(gpuarr_lease_acquire(&d, &l)); /* slot 0, the other user's file */
    TEST_FAIL_WITH(gpuarr_lease_acquire(&d, &l2), GPUARR_ERROR_BACKEND, "is a symlink");
    TEST_OK(gpuarr_lease_release(l));
    expect_text(victim, "my notes\n");
    remove_dir(parent);
}

Test(leases, all_names_every_device_the_host_included_each_physical_device_once) {
    gpuarr_lease_desc d;
    memset(&d, 0, sizeof d);
    d.devices = "all";
    d.placement = GPUARR_PLACE_ROUND_ROBIN;
    int n = gpuarr_device_count(), physical = 0, seen[64] = {0};
    bool duplicate[64] = {false};
    cr_assert(n <= 64);
    for (int k = 0; k < n; k++) { /* a GPU seen through CUDA and OpenCL counts once, as its CUDA view */
        gpuarr_device_info info;
        TEST_OK(gpuarr_device_get_info(gpuarr_device_at(k), &info));
        duplicate[k] = info.same_as.id && info.backend == GPUARR_BACKEND_OPENCL;
        physical += !duplicate[k];
    }
    gpuarr_lease l[64];
    for (int i = 0; i < physical; i++) { /* round robin over the list: each once */
        gpuarr_device on;
        TEST_OK(gpuarr_lease_acquire(&d, &l[i]));
        TEST_OK(gpuarr_lease_device(l[i], &on));
        for (int k = 0; k < n; k++) seen[k] += gpuarr_device_at(k).id == on.id;
    }
    for (int k = 0; k < n; k++) cr_assert_eq(seen[k], duplicate[k] ? 0 : 1, "device %d leased %d times", k, seen[k]);
    for (int i = 0; i < physical; i++) TEST_OK(gpuarr_lease_release(l[i]));
}
