/*
 * test_trace.c -- the trace (GPUARR_TRACE, gpuarr_trace_start/stop) on the test device: a known
 * sequence of calls gives the events it should, with their names and args, in order on each
 * stream's track and nested on each track; the file is valid Chrome trace-event JSON
 * (tests/python/check_trace.py, run through system()); a full per-thread buffer counts what it
 * drops; a trace runs across gpuarr_shutdown; GPUARR_TRACE writes at the last shutdown; threads
 * that exit hand their events over; and each misuse fails with its own result and message.
 *
 * The writer puts one event per line; the checks below read the lines (the Python checker
 * parses the file as JSON and validates the format on its own).
 */
#include "test_common.h"

#include <pthread.h>
#include <unistd.h>

/* ---------------------------------------------------------------------------------------------
 * Reading a trace back
 * ------------------------------------------------------------------------------------------- */
typedef struct trace_ev {
    char name[64];
    char ph;
    long tid;
    double ts, dur;
    char line[512]; /* the args, for field lookups */
} trace_ev;

typedef struct trace_file {
    trace_ev *ev;
    int n;
    long long dropped;
    char track_name[64][64]; /* thread_name by slot: see track_slot */
    long track_tid[64];
    int ntracks;
} trace_file;

/* "key":"value" in line into out; false if absent. */
static bool field_str(const char *line, const char *key, char *out, size_t cap) {
    char pat[80];
    snprintf(pat, sizeof pat, "\"%s\":\"", key);
    const char *p = strstr(line, pat);
    if (!p) return false;
    p += strlen(pat);
    size_t i = 0;
    while (p[i] && p[i] != '"' && i + 1 < cap) {
        out[i] = p[i];
        i++;
    }
    out[i] = '\0';
    return true;
}

/* "key":number in line; NAN if absent. */
static double field_num(const char *line, const char *key) {
    char pat[80];
    snprintf(pat, sizeof pat, "\"%s\":", key);
    const char *p = strstr(line, pat);
    if (!p) return NAN;
    char *end;
    double v = strtod(p + strlen(pat), &end);
    return end == p + strlen(pat) ? NAN : v;
}

static void trace_read(const char *path, trace_file *t) {
    memset(t, 0, sizeof *t);
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f, "the trace %s was not written", path);
    char line[2048];
    int cap = 0;
    bool header = false;
    while (fgets(line, sizeof line, f)) {
        if (strstr(line, "\"displayTimeUnit\"")) {
            header = true;
            t->dropped = (long long)field_num(line, "dropped_events");
        }
        char ph[4] = "";
        if (!field_str(line, "ph", ph, sizeof ph)) continue;
        char name[64] = "";
        field_str(line, "name", name, sizeof name);
        long tid = (long)field_num(line, "tid");
        if (ph[0] == 'M') {
            if (strcmp(name, "thread_name") == 0 && t->ntracks < 64) {
                const char *args = strstr(line, "\"args\"");
                cr_assert_not_null(args);
                field_str(args, "name", t->track_name[t->ntracks], sizeof t->track_name[0]);
                t->track_tid[t->ntracks++] = tid;
            }
            continue;
        }
        if (t->n == cap) {
            cap = cap ? cap * 2 : 256;
            t->ev = realloc(t->ev, sizeof *t->ev * (size_t)cap);
            cr_assert_not_null(t->ev);
        }
        trace_ev *e = &t->ev[t->n++];
        memset(e, 0, sizeof *e);
        snprintf(e->name, sizeof e->name, "%s", name);
        e->ph = ph[0];
        e->tid = tid;
        e->ts = field_num(line, "ts");
        e->dur = field_num(line, "dur");
        const char *args = strstr(line, "\"args\"");
        snprintf(e->line, sizeof e->line, "%s", args ? args : "");
    }
    fclose(f);
    cr_assert(header, "%s has no displayTimeUnit line", path);
}

static const char *track_name(const trace_file *t, long tid) {
    for (int i = 0; i < t->ntracks; i++)
        if (t->track_tid[i] == tid) return t->track_name[i];
    return NULL;
}

/* The first event named name whose args contain `has` (NULL: any), from index `from` on. */
static int find_ev(const trace_file *t, int from, const char *name, const char *has) {
    for (int i = from; i < t->n; i++)
        if (strcmp(t->ev[i].name, name) == 0 && (!has || strstr(t->ev[i].line, has))) return i;
    return -1;
}

static int count_ev(const trace_file *t, const char *name) {
    int n = 0;
    for (int i = 0; i < t->n; i++) n += strcmp(t->ev[i].name, name) == 0;
    return n;
}

/* tests/python/check_trace.py on the file (from the repository root, as make runs the tests). */
static void check_with_python(const char *path, const char *extra) {
    const char *script = "tests/python/check_trace.py";
    if (access(script, R_OK) != 0) test_skip("%s not found: run the test from the repository root", script);
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "python3 %s %s %s >&2", script, path, extra ? extra : "");
    int rc = system(cmd);
    cr_assert_eq(rc, 0, "%s: the trace %s failed tests/python/check_trace.py (see its output above)", cmd, path);
}

static void temp_path(char *out, size_t cap, const char *what) {
    snprintf(out, cap, "/tmp/gpuarr-test-trace-%ld-%s.json", (long)getpid(), what);
}

static bool device_is_async(gpuarr_device d) {
    gpuarr_device_info info;
    TEST_OK(gpuarr_device_get_info(d, &info));
    return info.backend != GPUARR_BACKEND_HOST;
}

/* ---------------------------------------------------------------------------------------------
 * The known sequence: create, upload, convert with a cast, fill, a cross-stream use, release
 * ------------------------------------------------------------------------------------------- */
enum { N = 1024 };

static void run_sequence(gpuarr_device dev) {
    float v[N];
    for (int i = 0; i < N; i++) v[i] = (float)i;
    int64_t shape[1] = {N};
    gpuarr_array a = {0}, b = {0}, c = {0}, d = {0};
    TEST_OK(gpuarr_from_host(dev, v, 1, shape, &a));  /* create + upload */
    TEST_OK(gpuarr_convert(a, dev, GPUARR_I32, &b));   /* a cast */
    float seven = 7;
    TEST_OK(gpuarr_fill_as(a, GPUARR_F32, &seven));    /* a fill */
    gpuarr_stream s1 = {0}, s2 = {0};
    TEST_OK(gpuarr_stream_create(dev, 0, &s1));
    TEST_OK(gpuarr_stream_create(dev, 0, &s2));
    TEST_OK(gpuarr_convert_async(b, dev, GPUARR_F64, s1, &c)); /* produced on s1 ... */
    TEST_OK(gpuarr_convert_async(c, dev, GPUARR_F32, s2, &d)); /* ... used on s2: s2 waits for s1 */
    TEST_OK(gpuarr_stream_sync(s2));
    float back[N];
    TEST_OK(gpuarr_to_host(d, back, N));
    cr_expect_eq(back[N - 1], (float)(N - 1), "the sequence computed %g, want %d", (double)back[N - 1], N - 1);
    TEST_OK(gpuarr_stream_destroy(s1));
    TEST_OK(gpuarr_stream_destroy(s2));
    TEST_OK(gpuarr_release(a));
    TEST_OK(gpuarr_release(b));
    TEST_OK(gpuarr_release(c));
    TEST_OK(gpuarr_release(d));
}

TestSuite(trace, .init = test_setup, .fini = test_teardown);

Test(trace, records_the_events_of_a_known_sequence) {
    gpuarr_device dev = test_device();
    bool async = device_is_async(dev);
    char path[256];
    temp_path(path, sizeof path, "sequence");
    TEST_OK(gpuarr_trace_start(path));
    run_sequence(dev);
    TEST_OK(gpuarr_trace_stop());
    check_with_python(path, "--expect cast --expect fill --expect alloc --expect free");
    trace_file t;
    trace_read(path, &t);
    cr_expect_eq(t.dropped, 0, "dropped_events = %lld with room for 65536 per thread", t.dropped);

    /* the upload: 1024 f32 = 4096 bytes, on the default stream of the device */
    const char *up = async ? "transfer h2d" : "transfer h2h";
    int iu = find_ev(&t, 0, up, "\"bytes\":4096");
    cr_assert_geq(iu, 0, "no \"%s\" event of 4096 bytes", up);
    char dir[16] = "", via[16] = "";
    cr_expect(field_str(t.ev[iu].line, "direction", dir, sizeof dir) && strcmp(dir, async ? "h2d" : "h2h") == 0, "direction %s", dir);
    cr_expect(field_str(t.ev[iu].line, "path", via, sizeof via), "the upload has no path");
    if (async)
        cr_expect(strcmp(via, "direct") == 0 || strcmp(via, "mapped") == 0 || strcmp(via, "staged") == 0, "4 KiB went by path %s", via);
    const char *stream = track_name(&t, t.ev[iu].tid);
    cr_assert_not_null(stream, "the upload's track %ld has no thread_name", t.ev[iu].tid);
    char want[64];
    snprintf(want, sizeof want, "stream %s#", test_device_spec());
    cr_expect(strncmp(stream, want, strlen(want)) == 0, "the upload's track is named \"%s\", want \"%s<n>\"", stream, want);

    /* the cast f32 -> i32 of 1024 elements, on the same stream, after the upload, inside the
       conversion's transfer (same track) */
    int ic = find_ev(&t, 0, "cast", "\"from\":\"f32\",\"to\":\"i32\",\"count\":1024");
    cr_assert_geq(ic, 0, "no cast f32->i32 of 1024 elements");
    cr_expect_eq(t.ev[ic].tid, t.ev[iu].tid, "the cast ran on track %ld, the upload on %ld (both the default stream)", t.ev[ic].tid,
                 t.ev[iu].tid);
    cr_expect_geq(t.ev[ic].ts, t.ev[iu].ts + t.ev[iu].dur - 5e-4, "the cast starts before the upload ends");
    /* OpenCL commands have timing events: a synchronous cast's event covers its run on the device */
    char timing[16] = "";
    field_str(t.ev[ic].line, "timing", timing, sizeof timing);
    if (strncmp(test_device_spec(), "opencl", 6) == 0)
        cr_expect_str_eq(timing, "host+device", "the cast on %s is timed \"%s\"", test_device_spec(), timing);
    else
        cr_expect_str_eq(timing, "host", "the cast on %s is timed \"%s\"", test_device_spec(), timing);
    const char *local = async ? "transfer d2d" : "transfer h2h";
    int parent = -1;
    for (int i = 0; i < t.n; i++)
        if (strcmp(t.ev[i].name, local) == 0 && t.ev[i].tid == t.ev[ic].tid && t.ev[i].ts <= t.ev[ic].ts + 5e-4 &&
            t.ev[i].ts + t.ev[i].dur + 5e-4 >= t.ev[ic].ts + t.ev[ic].dur && strstr(t.ev[i].line, "\"path\":\"local\""))
            parent = i;
    cr_expect_geq(parent, 0, "the cast is not nested in a \"%s\" (path local) on its track", local);

    /* the fill: 4096 bytes of a 4-byte pattern, after the cast on that stream */
    int ifl = find_ev(&t, 0, "fill", "\"bytes\":4096,\"pattern_size\":4");
    cr_assert_geq(ifl, 0, "no fill of 4096 bytes");
    cr_expect_eq(t.ev[ifl].tid, t.ev[ic].tid, "the fill is on another track than the cast");
    cr_expect_gt(t.ev[ifl].ts, t.ev[ic].ts, "the fill comes before the cast on the stream's track");

    /* the two conversions on s1 and s2: each its own stream track; s2 waits for s1 on a device */
    int i64 = find_ev(&t, 0, "cast", "\"from\":\"i32\",\"to\":\"f64\"");
    int i32 = find_ev(&t, 0, "cast", "\"from\":\"f64\",\"to\":\"f32\"");
    cr_assert(i64 >= 0 && i32 >= 0, "no casts i32->f64 and f64->f32 (the streams' conversions)");
    cr_expect_neq(t.ev[i64].tid, t.ev[i32].tid, "s1 and s2 share a track");
    cr_expect_neq(t.ev[i64].tid, t.ev[ic].tid, "s1 shares the default stream's track");
    if (async) {
        int iw = -1;
        for (int i = 0; i < t.n; i++)
            if (strcmp(t.ev[i].name, "stream wait") == 0 && t.ev[i].tid == t.ev[i32].tid) iw = i;
        cr_expect_geq(iw, 0, "no \"stream wait\" on s2's track (%s): s2 uses what s1 produces", track_name(&t, t.ev[i32].tid));
        if (iw >= 0) cr_expect(t.ev[iw].ts < t.ev[i32].ts, "s2's wait comes after its cast");
    }

    /* allocations and frees on the calling thread's track, the conversions' call events too */
    int ia = find_ev(&t, 0, "alloc", "\"bytes\":4096");
    cr_assert_geq(ia, 0, "no alloc of 4096 bytes");
    const char *thread = track_name(&t, t.ev[ia].tid);
    cr_expect(thread && strncmp(thread, "thread ", 7) == 0, "alloc's track is \"%s\", not a thread's", thread ? thread : "(none)");
    char cache[16] = "";
    cr_expect(field_str(t.ev[ia].line, "cache", cache, sizeof cache) &&
                  (!strcmp(cache, "hit") || !strcmp(cache, "miss") || !strcmp(cache, "thread")),
              "alloc cache = \"%s\"", cache);
    cr_expect_geq(find_ev(&t, 0, "free", NULL), 0, "no free");
    int iconv = find_ev(&t, 0, "gpuarr_convert", "\"mode\":\"sync\"");
    cr_expect_geq(iconv, 0, "no gpuarr_convert call event");
    if (iconv >= 0) cr_expect_eq(t.ev[iconv].tid, t.ev[ia].tid, "gpuarr_convert's event is not on the thread's track");
    free(t.ev);
    unlink(path);
}

/* Every X event of a track either follows the previous ones or lies inside the one open. */
Test(trace, events_nest_on_every_track) {
    gpuarr_device dev = test_device();
    char path[256];
    temp_path(path, sizeof path, "nest");
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    TEST_OK(gpuarr_trace_start(path));
    run_sequence(dev);
    run_sequence(dev);
    TEST_OK(gpuarr_trace_stop());
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double traced_us = (double)(t1.tv_sec - t0.tv_sec) * 1e6 + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-3;
    trace_file t;
    trace_read(path, &t);
    cr_assert_gt(t.n, 20, "only %d events for two sequences", t.n);
    for (int i = 0; i < t.n; i++) {
        cr_assert(t.ev[i].ph == 'X' && t.ev[i].dur >= 0 && t.ev[i].ts >= 0, "event %d (%s): ph %c, ts %g, dur %g", i, t.ev[i].name,
                  t.ev[i].ph, t.ev[i].ts, t.ev[i].dur);
        /* nothing ends after the trace stopped (a device time from a driver that got it wrong,
           as NVIDIA's OpenCL for markers: run with FAULT_OPENCL_PROFILING=marker-end-far) */
        cr_assert_leq(t.ev[i].dur, traced_us, "event %d (%s) lasts %.0f us, longer than the %.0f us traced", i, t.ev[i].name,
                      t.ev[i].dur, traced_us);
        cr_assert_not_null(track_name(&t, t.ev[i].tid), "event %d (%s) is on track %ld, which has no name", i, t.ev[i].name, t.ev[i].tid);
    }
    /* the writer sorts by track, then start: check nesting with a stack, as a viewer draws it */
    double end[64];
    int depth = 0;
    for (int i = 0; i < t.n; i++) {
        if (i && t.ev[i].tid != t.ev[i - 1].tid) depth = 0;
        if (i && t.ev[i].tid == t.ev[i - 1].tid)
            cr_assert_geq(t.ev[i].ts, t.ev[i - 1].ts, "track %ld is not in order of start at event %d", t.ev[i].tid, i);
        double e = t.ev[i].ts + t.ev[i].dur;
        while (depth && end[depth - 1] <= t.ev[i].ts + 5e-4) depth--; /* ns-exact times, float sums */
        if (depth)
            cr_assert_leq(e, end[depth - 1] + 5e-4, "track %s: %s (%.3f..%.3f) overlaps the event open around it (to %.3f)",
                          track_name(&t, t.ev[i].tid), t.ev[i].name, t.ev[i].ts, e, end[depth - 1]);
        cr_assert_lt(depth, 64);
        end[depth++] = e;
    }
    check_with_python(path, "--min-events 20");
    free(t.ev);
    unlink(path);
}

Test(trace, a_trace_runs_across_gpuarr_shutdown) {
    gpuarr_device dev = test_device();
    char path[256];
    temp_path(path, sizeof path, "shutdown");
    TEST_OK(gpuarr_trace_start(path));
    run_sequence(dev);
    gpuarr_shutdown(); /* the fixture's reference: the library stops, the trace goes on */
    cr_assert(!gpuarr_is_initialized());
    TEST_OK(gpuarr_init(NULL));
    dev = test_device();
    run_sequence(dev);
    TEST_OK(gpuarr_trace_stop());
    trace_file t;
    trace_read(path, &t);
    cr_expect_eq(count_ev(&t, "gpuarr_convert"), 2, "%d gpuarr_convert events, want one from each init cycle",
                 count_ev(&t, "gpuarr_convert"));
    cr_expect_eq(count_ev(&t, "fill"), 2, "%d fills, want one from each init cycle", count_ev(&t, "fill"));
    check_with_python(path, NULL);
    free(t.ev);
    unlink(path);
}

/* ---------------------------------------------------------------------------------------------
 * Misuse: one result and message each
 * ------------------------------------------------------------------------------------------- */
Test(trace, misuse_fails_with_its_own_result) {
    char path[256];
    temp_path(path, sizeof path, "misuse");
    TEST_FAIL_WITH(gpuarr_trace_stop(), GPUARR_ERROR_UNSUPPORTED, "no trace is being recorded");
    TEST_FAIL_WITH(gpuarr_trace_start(NULL), GPUARR_ERROR_INVALID_ARGUMENT, "path is NULL");
    TEST_FAIL_WITH(gpuarr_trace_start(""), GPUARR_ERROR_INVALID_ARGUMENT, "path is empty");
    TEST_FAIL_WITH(gpuarr_trace_start("/nonexistent-gpuarr-dir/trace.json"), GPUARR_ERROR_INVALID_ARGUMENT,
                   "cannot write the trace to /nonexistent-gpuarr-dir/trace.json");
    cr_expect(strstr(gpuarr_last_error(), "gpuarr_trace_start") != NULL, "the message does not name the call: %s", gpuarr_last_error());
    TEST_OK(gpuarr_trace_start(path));
    TEST_FAIL_WITH(gpuarr_trace_start(path), GPUARR_ERROR_UNSUPPORTED, "already being recorded");
    TEST_OK(gpuarr_trace_stop());
    TEST_FAIL_WITH(gpuarr_trace_stop(), GPUARR_ERROR_UNSUPPORTED, "no trace is being recorded");
    check_with_python(path, NULL); /* an empty trace is still a valid file */
    unlink(path);
}

/* ---------------------------------------------------------------------------------------------
 * Without the fixture: settings read at gpuarr_init
 * ------------------------------------------------------------------------------------------- */
TestSuite(trace_env);

/* GPUARR_TRACE_EVENTS=8: each thread keeps its first 8 events and counts the rest. */
Test(trace_env, a_full_buffer_counts_what_it_drops) {
    setenv("GPUARR_TRACE_EVENTS", "8", 1);
    TEST_OK(gpuarr_init(NULL));
    gpuarr_device dev = test_device();
    char path[256];
    temp_path(path, sizeof path, "dropped");
    TEST_OK(gpuarr_trace_start(path));
    int64_t shape[1] = {256};
    for (int i = 0; i < 50; i++) {
        gpuarr_array a;
        TEST_OK(gpuarr_empty(dev, GPUARR_F32, 1, shape, &a)); /* an alloc */
        TEST_OK(gpuarr_release(a));                         /* a free */
    }
    TEST_OK(gpuarr_trace_stop());
    gpuarr_shutdown();
    trace_file t;
    trace_read(path, &t);
    int on_thread = 0;
    for (int i = 0; i < t.n; i++) on_thread += strcmp(t.ev[i].name, "alloc") == 0 || strcmp(t.ev[i].name, "free") == 0;
    cr_expect_eq(on_thread, 8, "%d alloc/free events kept, want the buffer's 8", on_thread);
    cr_expect_geq(t.dropped, 100 - 8, "dropped_events = %lld, want at least %d", t.dropped, 100 - 8);
    check_with_python(path, NULL);
    free(t.ev);
    unlink(path);
}

Test(trace_env, bad_settings_fail_gpuarr_init) {
    setenv("GPUARR_TRACE_EVENTS", "0", 1);
    TEST_FAIL_WITH(gpuarr_init(NULL), GPUARR_ERROR_INVALID_ARGUMENT, "GPUARR_TRACE_EVENTS=\"0\"");
    setenv("GPUARR_TRACE_EVENTS", "lots", 1);
    TEST_FAIL_WITH(gpuarr_init(NULL), GPUARR_ERROR_INVALID_ARGUMENT, "GPUARR_TRACE_EVENTS=\"lots\"");
    unsetenv("GPUARR_TRACE_EVENTS");
    setenv("GPUARR_TRACE", "/nonexistent-gpuarr-dir/trace.json", 1);
    TEST_FAIL_WITH(gpuarr_init(NULL), GPUARR_ERROR_INVALID_ARGUMENT, "GPUARR_TRACE=/nonexistent-gpuarr-dir/trace.json");
    cr_expect(!gpuarr_is_initialized(), "gpuarr_init succeeded with an unwritable GPUARR_TRACE");
}

/* GPUARR_TRACE: the trace starts at gpuarr_init and is written at the last gpuarr_shutdown. */
Test(trace_env, gpuarr_trace_is_written_at_the_last_shutdown) {
    char path[256];
    temp_path(path, sizeof path, "env");
    setenv("GPUARR_TRACE", path, 1);
    TEST_OK(gpuarr_init(NULL));
    TEST_OK(gpuarr_init(NULL)); /* a second reference: its shutdown is not the last */
    TEST_FAIL_WITH(gpuarr_trace_start(path), GPUARR_ERROR_UNSUPPORTED, "already being recorded");
    run_sequence(test_device());
    gpuarr_shutdown();
    FILE *f = fopen(path, "r"); /* made at the start, written at the end */
    cr_assert_not_null(f, "GPUARR_TRACE=%s: no file after gpuarr_init", path);
    cr_expect_eq(fgetc(f), EOF, "%s has content before the last gpuarr_shutdown", path);
    fclose(f);
    gpuarr_shutdown();
    trace_file t;
    trace_read(path, &t);
    cr_expect_geq(find_ev(&t, 0, "cast", NULL), 0, "the trace GPUARR_TRACE started has no cast");
    TEST_FAIL_WITH(gpuarr_trace_stop(), GPUARR_ERROR_UNSUPPORTED, "no trace is being recorded");
    check_with_python(path, "--expect cast");
    free(t.ev);
    unlink(path);
}

/* ---------------------------------------------------------------------------------------------
 * Threads: each has its own track; one that exits hands its events over
 * ------------------------------------------------------------------------------------------- */
enum { NTHREADS = 4, PER_THREAD = 25 };

static void *thread_work(void *arg) {
    gpuarr_device dev = *(gpuarr_device *)arg;
    int64_t shape[1] = {512};
    for (int i = 0; i < PER_THREAD; i++) {
        gpuarr_array a, b;
        if (gpuarr_zeros(dev, GPUARR_F32, 1, shape, &a) != GPUARR_OK) return (void *)1;
        if (gpuarr_convert(a, dev, GPUARR_I16, &b) != GPUARR_OK) return (void *)1;
        gpuarr_release(a);
        gpuarr_release(b);
    }
    return NULL;
}

Test(trace, threads_that_exit_hand_their_events_over) {
    gpuarr_device dev = test_device();
    char path[256];
    temp_path(path, sizeof path, "threads");
    TEST_OK(gpuarr_trace_start(path));
    pthread_t th[NTHREADS];
    for (int i = 0; i < NTHREADS; i++) cr_assert_eq(pthread_create(&th[i], NULL, thread_work, &dev), 0);
    for (int i = 0; i < NTHREADS; i++) {
        void *rv = NULL;
        pthread_join(th[i], &rv);
        cr_expect_null(rv, "thread %d failed: %s", i, gpuarr_last_error());
    }
    TEST_OK(gpuarr_trace_stop()); /* every thread has exited: their buffers were handed over */
    trace_file t;
    trace_read(path, &t);
    long tids[NTHREADS + 8];
    int ntids = 0, casts = 0;
    for (int i = 0; i < t.n; i++) {
        if (strcmp(t.ev[i].name, "gpuarr_convert") != 0) continue;
        bool seen = false;
        for (int k = 0; k < ntids; k++) seen |= tids[k] == t.ev[i].tid;
        if (!seen && ntids < NTHREADS + 8) tids[ntids++] = t.ev[i].tid;
        casts++;
    }
    cr_expect_eq(casts, NTHREADS * PER_THREAD, "%d gpuarr_convert events, want %d", casts, NTHREADS * PER_THREAD);
    cr_expect_eq(ntids, NTHREADS, "the conversions are on %d thread tracks, want %d", ntids, NTHREADS);
    check_with_python(path, NULL);
    free(t.ev);
    unlink(path);
}

/* ---------------------------------------------------------------------------------------------
 * The out-of-memory ladder: each rung is an event
 * ------------------------------------------------------------------------------------------- */
Test(trace, the_oom_ladder_records_each_step) {
    gpuarr_device dev = test_device();
    char path[256];
    temp_path(path, sizeof path, "oom");
    TEST_OK(gpuarr_pool_set_limit(dev, (uint64_t)4 << 20));
    TEST_OK(gpuarr_trace_start(path));
    int64_t shape[1] = {(int64_t)16 << 20};
    gpuarr_array a;
    gpuarr_result r = gpuarr_empty(dev, GPUARR_U8, 1, shape, &a);
    cr_expect_eq(r, GPUARR_ERROR_OUT_OF_MEMORY, "16 MiB under a 4 MiB limit: %s", gpuarr_result_name(r));
    if (r == GPUARR_OK) gpuarr_release(a);
    TEST_OK(gpuarr_trace_stop());
    trace_file t;
    trace_read(path, &t);
    int ia = find_ev(&t, 0, "alloc", "\"bytes\":16777216");
    int it = find_ev(&t, 0, "oom: trim cache", "\"outcome\":\"still out of memory\"");
    cr_expect_geq(find_ev(&t, 0, "oom: release oversize cached", NULL), 0, "no \"oom: release oversize cached\" step");
    cr_expect_geq(find_ev(&t, 0, "oom: wait for pending frees", NULL), 0, "no \"oom: wait for pending frees\" step");
    cr_assert(ia >= 0 && it >= 0, "no alloc of 16 MiB with an \"oom: trim cache\" step");
    cr_expect(t.ev[it].tid == t.ev[ia].tid && t.ev[it].ts >= t.ev[ia].ts && t.ev[it].ts + t.ev[it].dur <= t.ev[ia].ts + t.ev[ia].dur + 5e-4,
              "the ladder's step is not inside the allocation's event");
    check_with_python(path, NULL);
    free(t.ev);
    unlink(path);
}

/* ---------------------------------------------------------------------------------------------
 * Before gpuarr_init: the calls work, and GPUARR_TRACE_EVENTS is read by the start itself
 * ------------------------------------------------------------------------------------------- */
Test(trace_env, a_trace_may_start_before_gpuarr_init) {
    char path[256];
    temp_path(path, sizeof path, "preinit");
    setenv("GPUARR_TRACE_EVENTS", "none", 1);
    TEST_FAIL_WITH(gpuarr_trace_start(path), GPUARR_ERROR_INVALID_ARGUMENT, "GPUARR_TRACE_EVENTS=\"none\"");
    setenv("GPUARR_TRACE_EVENTS", "3", 1);
    TEST_OK(gpuarr_trace_start(path));
    unsetenv("GPUARR_TRACE_EVENTS");
    TEST_OK(gpuarr_init(NULL));
    run_sequence(test_device());
    gpuarr_shutdown();
    TEST_OK(gpuarr_trace_stop());
    trace_file t;
    trace_read(path, &t);
    /* a thread's buffer holds its events for every track: 3 per recording thread in all */
    int threads = 0;
    for (int i = 0; i < t.ntracks; i++) threads += strncmp(t.track_name[i], "thread ", 7) == 0;
    cr_expect(t.n >= 3 && t.n <= 3 * threads, "%d events from %d threads with GPUARR_TRACE_EVENTS=3 when the trace started", t.n, threads);
    cr_expect_gt(t.dropped, 0, "nothing dropped with 3 events per thread");
    check_with_python(path, NULL);
    free(t.ev);
    unlink(path);
}
