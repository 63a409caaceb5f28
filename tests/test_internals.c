/*
 * test_internals.c -- white-box tests of the core's private machinery that the public API cannot
 * reach cheaply: how a failure is carried inside (code, function and reason apart, the message
 * joined at the public boundary), lookups that must not record an error, where the process-wide
 * state lives. This file compiles the implementation itself (it is linked without gpuarr.o).
 */
#define GPUARR_IMPLEMENTATION
#include "test_common.h"

#include <ctype.h>

static void init_host_only(void) {
    gpuarr_desc desc;
    memset(&desc, 0, sizeof desc);
    desc.devices = "host";
    gpuarr_result r = gpuarr_init(&desc);
    cr_assert_eq(r, GPUARR_OK, "gpuarr_init = %s: %s", gpuarr_result_name(r), gpuarr_last_error());
}

TestSuite(internals, .init = init_host_only, .fini = gpuarr_shutdown);

Test(internals, a_failure_carries_its_code_function_and_reason_apart_and_the_message_joins_them) {
    cr_assert_eq(gpuarr_retain((gpuarr_array){0}), GPUARR_ERROR_INVALID_HANDLE);
    cr_assert_eq(gpuarr__tls.error_code, GPUARR_ERROR_INVALID_HANDLE);
    cr_assert_str_eq(gpuarr__tls.error_api, "gpuarr_retain");
    cr_assert_str_eq(gpuarr__tls.error_detail, "a is a zero array handle (never created)");
    cr_assert_str_eq(gpuarr_last_error(), "gpuarr_retain: a is a zero array handle (never created)");
    const char *first = gpuarr_last_error();
    cr_assert_eq(gpuarr_last_error(), first, "the message is not kept between calls");
    /* the function name does not take room from the reason */
    char reason[sizeof gpuarr__tls.error_detail];
    memset(reason, 'x', sizeof reason - 1);
    reason[sizeof reason - 1] = '\0';
    gpuarr__tls.api = "gpuarr_test";
    gpuarr__fail(GPUARR_ERROR_BACKEND, "%s", reason);
    cr_assert_str_eq(gpuarr__tls.error_detail, reason);
    cr_assert_eq(strlen(gpuarr_last_error()), strlen("gpuarr_test: ") + strlen(reason));
}

Test(internals, looking_up_a_destroyed_current_stream_records_no_error) {
    gpuarr_stream s;
    TEST_OK(gpuarr_stream_create(gpuarr_host(), 0, &s));
    TEST_OK(gpuarr_set_current_stream(s));
    TEST_OK(gpuarr_stream_destroy(s));
    cr_assert_eq(gpuarr_retain((gpuarr_array){0}), GPUARR_ERROR_INVALID_HANDLE);
    const char *before = gpuarr_last_error();
    gpuarr__thread_state saved = gpuarr__tls;
    cr_assert_null(gpuarr__current_stream_obj());
    cr_assert_eq(gpuarr__tls.stream_id, 0u, "the destroyed stream is still current");
    cr_assert_eq(gpuarr__tls.error_code, saved.error_code);
    cr_assert_eq(gpuarr__tls.error_api, saved.error_api);
    cr_assert_eq(gpuarr__tls.error_formatted, true, "the lookup touched the last error");
    cr_assert_eq(memcmp(gpuarr__tls.error_detail, saved.error_detail, sizeof saved.error_detail), 0);
    cr_assert_str_eq(gpuarr_last_error(), before);
}

/* STYLE rule 10: no file-level state outside the one global struct. Scans the sources for
   file-scope `static` objects that are not constant. Allowed: the global state itself, the
   per-thread state, NVRTC's and the trace's (process-wide by design: tools use NVRTC without
   gpuarr_init, and a trace runs across gpuarr_shutdown, which clears the global struct: its
   state, the flag every hook reads, each thread's buffer and open scope) and the per-thread
   default stream key. Run from the repository root, as make does. */
static bool state_allowed(const char *name) {
    static const char *const allowed[] = {"gpuarr__g", "gpuarr__tls", "gpuarr__nvrtc", "gpuarr__thread_key_once",
                                          "gpuarr__thread_key", "gpuarr__thread_key_ok", "gpuarr__thread_serials",
                                          "gpuarr__trace", "gpuarr__trace_on", "gpuarr__trace_mine", "gpuarr__trace_top"};
    for (size_t i = 0; i < sizeof allowed / sizeof allowed[0]; i++)
        if (strcmp(name, allowed[i]) == 0) return true;
    return false;
}

static int count_file_state(const char *path, char *found, size_t cap) {
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f, "cannot open %s (run from the repository root)", path);
    char line[4096];
    int count = 0;
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "static ", 7) != 0 || strncmp(line, "static const ", 13) == 0 || strncmp(line, "static inline ", 14) == 0)
            continue;
        size_t end = strcspn(line, "=;[");
        if (memchr(line, '(', end)) continue; /* a function */
        while (end > 0 && (line[end - 1] == ' ' || line[end - 1] == '\n')) end--;
        size_t start = end;
        while (start > 0 && (isalnum((unsigned char)line[start - 1]) || line[start - 1] == '_')) start--;
        char name[128];
        snprintf(name, sizeof name, "%.*s", (int)(end - start), line + start);
        if (state_allowed(name)) continue;
        count++;
        size_t used = strlen(found);
        snprintf(found + used, cap - used, " %s:%s", path, name);
    }
    fclose(f);
    return count;
}

Test(internals, no_file_level_state_outside_the_global_struct) {
    static const char *const files[] = {"gpuarr.h", "backends/gpuarr_host.h", "backends/gpuarr_opencl.h", "backends/gpuarr_cuda.h"};
    char found[2048] = "";
    int count = 0;
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) count += count_file_state(files[i], found, sizeof found);
    cr_assert_eq(count, 0, "file-level state:%s", found);
}

/* ---- handle tables, driven directly with placeholder objects ---- */
static void keep_obj(gpuarr__obj *o) { (void)o; }

static uint32_t insert_placeholder(gpuarr__table *t, gpuarr__obj *obj) {
    uint32_t id = 0;
    obj->refs = 1;
    obj->destroy = keep_obj;
    cr_assert_eq(gpuarr__table_insert(t, obj, &id), GPUARR_OK, "%s", gpuarr_last_error());
    return id;
}

static void release_placeholder(gpuarr__table *t, uint32_t id) {
    gpuarr__obj *dropped = NULL;
    cr_assert_eq(gpuarr__table_release(t, id, "a", &dropped), GPUARR_OK, "%s", gpuarr_last_error());
    cr_assert_not_null(dropped);
}

static int compare_u32(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

static bool id_is_live(gpuarr__table *t, uint32_t id) {
    gpuarr__obj *o = gpuarr__table_lookup(t, id);
    if (o) gpuarr__obj_release(o);
    return o != NULL;
}

/* The default reuse delay: one create/release at a time walks every freed slot in turn. A
   released id must stay dead over a million releases (with a 10-bit generation it came back
   after 1023 reuses of its slot, about 1.05 million releases). */
Test(internals, a_released_id_stays_dead_over_a_million_releases) {
    gpuarr__table *t = &gpuarr__g.arrays;
    enum { DELAY = 1100, CYCLES = 1200000 };
    static gpuarr__obj objs[DELAY + 1];
    static uint32_t ids[DELAY];
    for (int i = 0; i < DELAY; i++) ids[i] = insert_placeholder(t, &objs[i]);
    for (int i = 0; i < DELAY; i++) release_placeholder(t, ids[i]);
    for (int i = 0; i < CYCLES; i++) {
        uint32_t id = insert_placeholder(t, &objs[DELAY]);
        for (int j = 0; j < DELAY; j += 97)
            if (id == ids[j]) cr_assert_fail("cycle %d: released id 0x%08x is live again", i, id);
        release_placeholder(t, id);
    }
    for (int j = 0; j < DELAY; j++) cr_assert(!id_is_live(t, ids[j]), "released id 0x%08x is live", ids[j]);
}

/* One slot reused back to back (the reuse delay bypassed) through its whole generation period:
   each of its 65536 ids is different and, once released, stays dead for the rest of the period
   (with a 10-bit generation an id came back after 1023 reuses). */
Test(internals, a_slot_reused_through_its_whole_generation_period_never_revives_an_id) {
    gpuarr__table *t = &gpuarr__g.arrays;
    enum { PERIOD = 65536 };
    static uint32_t ids[PERIOD];
    static gpuarr__obj obj;
    ids[0] = insert_placeholder(t, &obj);
    release_placeholder(t, ids[0]);
    t->free_count += GPUARR__MIN_FREE_SLOTS; /* the freed slot is taken again at once, every time */
    for (int i = 1; i < PERIOD; i++) {
        ids[i] = insert_placeholder(t, &obj);
        cr_assert(!id_is_live(t, ids[0]), "reuse %d: the first id 0x%08x is live again", i, ids[0]);
        cr_assert(!id_is_live(t, ids[i - 1]), "reuse %d: the previous id 0x%08x is live again", i, ids[i - 1]);
        release_placeholder(t, ids[i]);
    }
    t->free_count -= GPUARR__MIN_FREE_SLOTS;
    cr_assert_eq(t->used, 1u, "the test used more than one slot");
    qsort(ids, PERIOD, sizeof ids[0], compare_u32);
    for (int i = 1; i < PERIOD; i++) cr_assert_neq(ids[i], ids[i - 1], "one slot handed out the id 0x%08x twice", ids[i]);
}

/* Two tables whose tweaks agree would hand out the same first id: the array's. The stream gets
   another, and the array's id given as a stream is refused, saying what it is. */
Test(internals, an_id_is_never_live_in_two_tables_at_once) {
    gpuarr__table *arrays = &gpuarr__g.arrays, *streams = &gpuarr__g.streams;
    cr_assert(arrays->used == 0 && streams->used == 0, "the tables are not fresh");
    streams->tweak = arrays->tweak;
    static gpuarr__obj a, s;
    uint32_t array_id = insert_placeholder(arrays, &a), stream_id = insert_placeholder(streams, &s);
    cr_assert_neq(stream_id, array_id);
    cr_assert(!id_is_live(streams, array_id));
    gpuarr__tls.api = "gpuarr_test";
    cr_assert_eq(gpuarr__table_retain(streams, array_id, "s"), GPUARR_ERROR_INVALID_HANDLE);
    cr_assert(strstr(gpuarr_last_error(), "is an array handle, not a stream handle"), "%s", gpuarr_last_error());
    release_placeholder(streams, stream_id);
    release_placeholder(arrays, array_id);
}

/* The manual's limit: 65536 live handles of a kind; one more is OUT_OF_MEMORY, saying why. */
Test(internals, a_table_holds_65536_live_handles_and_refuses_one_more) {
    gpuarr__table *t = &gpuarr__g.events;
    enum { LIMIT = 65536 };
    static gpuarr__obj objs[LIMIT + 1];
    static uint32_t ids[LIMIT];
    for (int i = 0; i < LIMIT; i++) ids[i] = insert_placeholder(t, &objs[i]);
    uint32_t id = 0xdeadbeefu;
    gpuarr__tls.api = "gpuarr_test";
    cr_assert_eq(gpuarr__table_insert(t, &objs[LIMIT], &id), GPUARR_ERROR_OUT_OF_MEMORY);
    cr_assert_eq(id, 0xdeadbeefu);
    cr_assert_str_eq(gpuarr_last_error(), "gpuarr_test: more than 65536 live event handles");
    for (int i = 0; i < LIMIT; i++) release_placeholder(t, ids[i]);
}

/* Each backend's fill proc, called directly (gpuarr_zeros uses only its one-byte form): 1, 2, 4
   and 8-byte patterns at an offset that is a multiple of the pattern but not of 8, over a length
   that is not a multiple of 8 either, read back bit for bit with the bytes around untouched. The
   large fill takes the host's streaming path (unaligned head and tail). Devices: the host,
   opencl:0 and cuda:0 (the fake driver under GPUARR_CUDA_LIBRARY) where present. */
static void init_all_devices(void) { test_setup(); }

static void check_backend_fill(const char *spec, gpuarr_backend backend, bool required) {
    static const unsigned char pattern[8] = {0x01, 0x82, 0x43, 0xc4, 0x25, 0xa6, 0x67, 0xe8};
    gpuarr_device d;
    gpuarr_result r = gpuarr_device_find(spec, &d);
    if (r == GPUARR_ERROR_NO_DEVICE && !required) test_skip("%s: no such device here (%s)", spec, gpuarr_last_error());
    TEST_OK(r);
    const size_t sizes[] = {1024, ((size_t)33 << 20) + 64};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        size_t n = sizes[k];
        unsigned char *init = malloc(n), *got = malloc(n);
        cr_assert(init && got);
        for (size_t i = 0; i < n; i++) init[i] = (unsigned char)(0x5a ^ (i * 7));
        for (size_t ps = 1; ps <= 8; ps *= 2) {
            size_t off = 5 * ps, bytes = n - 64 - 2 * ps; /* ends 64 - 3 ps bytes before the end */
            gpuarr_array a;
            int64_t shape = (int64_t)n;
            TEST_OK(gpuarr_from_host_as(d, GPUARR_U8, init, 1, &shape, &a));
            gpuarr__array *arr;
            gpuarr__tls.api = "gpuarr_test";
            TEST_OK(gpuarr__get_array(a, "a", &arr));
            cr_assert_eq(arr->dev->backend->id, backend, "%s: the array is not on the device's backend", spec);
            gpuarr__stream *s;
            TEST_OK(gpuarr__stream_for(arr->dev, NULL, &s));
            r = arr->dev->backend->fill(s, arr->mem, arr->offset + off, pattern, ps, bytes, false);
            cr_assert_eq(r, GPUARR_OK, "%s: fill(%zu-byte pattern) = %s: %s", spec, ps, gpuarr_result_name(r), gpuarr_last_error());
            TEST_OK(gpuarr__stream_sync_raw(s));
            gpuarr__obj_release(&s->obj);
            gpuarr__obj_release(&arr->obj);
            TEST_OK(gpuarr_to_host_as(a, GPUARR_U8, got, n));
            TEST_OK(gpuarr_release(a));
            for (size_t i = 0; i < n; i++) {
                unsigned char want = i >= off && i < off + bytes ? pattern[(i - off) % ps] : init[i];
                cr_assert_eq(got[i], want, "%s: %zu-byte pattern, %zu bytes at %zu: byte %zu is 0x%02x, not 0x%02x", spec, ps, bytes, off, i,
                             got[i], want);
            }
        }
        free(init);
        free(got);
    }
}

Test(backend_fill, host, .init = init_all_devices, .fini = test_teardown) { check_backend_fill("host", GPUARR_BACKEND_HOST, true); }
Test(backend_fill, opencl, .init = init_all_devices, .fini = test_teardown) {
    check_backend_fill("opencl:0", GPUARR_BACKEND_OPENCL, test_devices_required());
}
Test(backend_fill, cuda, .init = init_all_devices, .fini = test_teardown) { check_backend_fill("cuda:0", GPUARR_BACKEND_CUDA, false); }

/* The per-thread array caches: a thread's exit gives its cache, and the blocks in it, back to the
   pool (nothing stays counted as allocated, no cache is left on the pool's list). */
static void *make_and_free_small_arrays(void *arg) {
    (void)arg;
    int64_t shape[1] = {4096};
    gpuarr_array a[3];
    for (int round = 0; round < 2; round++) { /* the second from the thread's cache */
        for (int i = 0; i < 3; i++)
            if (gpuarr_empty(gpuarr_host(), GPUARR_U8, 1, shape, &a[i]) != GPUARR_OK) return (void *)1;
        for (int i = 0; i < 3; i++) gpuarr_release(a[i]);
    }
    gpuarr__pool *p = &gpuarr__host_dev()->pool;
    pthread_mutex_lock(&p->lock);
    bool cached = p->tcaches && p->stats.allocations == 3; /* raw counts: the cached ones */
    pthread_mutex_unlock(&p->lock);
    return cached ? NULL : (void *)2;
}

Test(internals, a_thread_that_exits_gives_its_cached_arrays_back_to_the_pool) {
    pthread_t t;
    void *ret = NULL;
    cr_assert_eq(pthread_create(&t, NULL, make_and_free_small_arrays, NULL), 0);
    pthread_join(t, &ret);
    cr_assert_null(ret, "the thread's arrays were not cached (%p)", ret);
    gpuarr__pool *p = &gpuarr__host_dev()->pool;
    pthread_mutex_lock(&p->lock);
    gpuarr__tcache *left = p->tcaches;
    uint64_t allocations = p->stats.allocations, hits = p->stats.cache_hits;
    pthread_mutex_unlock(&p->lock);
    cr_assert_null(left, "the exited thread's cache is still on the pool's list");
    cr_assert_eq(allocations, 0u, "%llu blocks still counted as allocated", (unsigned long long)allocations);
    cr_assert_eq(hits, 5u, "%llu hits", (unsigned long long)hits); /* 2 from the pool, 3 from the cache, folded in */
}
