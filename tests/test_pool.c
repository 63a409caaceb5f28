/* Memory pools: caching, the out-of-memory ladder step by step, stream-ordered reuse, limits,
   configuration, fault injection, and a stress run. On GPUARR_TEST_DEVICE (host or opencl:0);
   the stream tests need an asynchronous device and skip (with the reason) on the host. */
#define _POSIX_C_SOURCE 200809L
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdlib.h>
#include "test_common.h"

#define MiB ((int64_t)1 << 20)

TestSuite(pool, .init = test_setup, .fini = test_teardown);

static gpuarr_pool_stats stats_of(gpuarr_device d) {
    gpuarr_pool_stats st;
    TEST_OK(gpuarr_pool_get_stats(d, &st));
    return st;
}

static gpuarr_array bytes_array(gpuarr_device d, int64_t bytes) {
    int64_t shape[1] = {bytes};
    gpuarr_array a;
    TEST_OK(gpuarr_empty(d, GPUARR_U8, 1, shape, &a));
    return a;
}

/* Restarts gpuarr with a desc (after the fixture's init). */
static void reinit(const char *alloc_conf, bool host_fallback) {
    gpuarr_shutdown();
    gpuarr_desc desc = {0};
    desc.alloc_conf = alloc_conf;
    desc.oom_host_fallback = host_fallback;
    TEST_OK(gpuarr_init(&desc));
}

Test(pool, a_freed_block_is_reused_without_a_new_device_allocation) {
    gpuarr_device d = test_device();
    gpuarr_array a = bytes_array(d, 3 * MiB);
    gpuarr_pool_stats st = stats_of(d);
    cr_assert_eq(st.backend_allocs, 1u);
    cr_assert_eq(st.allocated_bytes, (uint64_t)(3 * MiB));
    cr_assert_eq(st.requested_bytes, (uint64_t)(3 * MiB));
    TEST_OK(gpuarr_release(a));
    for (int i = 0; i < 50; i++) TEST_OK(gpuarr_release(bytes_array(d, 3 * MiB - i * 1000)));
    st = stats_of(d);
    cr_assert_eq(st.backend_allocs, 1u, "%llu device allocations for one size", (unsigned long long)st.backend_allocs);
    cr_assert_eq(st.cache_hits, 50u);
    cr_assert_eq(st.allocated_bytes, 0u);
    cr_assert_eq(st.reserved_bytes, (uint64_t)(4 * MiB)); /* 3 MiB rounded to 2 MiB segments */
    TEST_OK(gpuarr_pool_trim(d));
    st = stats_of(d);
    cr_assert_eq(st.reserved_bytes, 0u);
    cr_assert_eq(st.backend_frees, 1u);
}

Test(pool, small_arrays_share_segments_and_neighbours_merge_when_freed) {
    gpuarr_device d = test_device();
    gpuarr_array a[64];
    for (int i = 0; i < 64; i++) a[i] = bytes_array(d, 16 * 1024);
    gpuarr_pool_stats st = stats_of(d);
    cr_assert_eq(st.segments, 1u, "64 x 16 KiB should fit one 2 MiB segment, not %llu", (unsigned long long)st.segments);
    cr_assert_eq(st.allocations, 64u);
    for (int i = 0; i < 64; i += 2) TEST_OK(gpuarr_release(a[i]));
    for (int i = 1; i < 64; i += 2) TEST_OK(gpuarr_release(a[i]));
    size_t nseg = 0, nblk = 0;
    gpuarr_pool_segment_info segs[4];
    gpuarr_pool_block_info blocks[8];
    TEST_OK(gpuarr_pool_snapshot(d, segs, 4, &nseg, blocks, 8, &nblk));
    cr_assert_eq(nseg, 1u);
    cr_assert_eq(nblk, 1u, "the freed neighbours did not merge: %zu blocks", nblk);
    cr_assert(!blocks[0].allocated && blocks[0].size == 2u << 20);
}

/* Small blocks freed with no work pending wait whole in a short quick list for the next
   allocation of their size; when the index alone cannot serve a request, they are merged back
   first, so they never make the pool grow. */
Test(pool, freed_small_blocks_held_for_reuse_are_merged_before_the_pool_grows) {
    gpuarr_device d = test_device();
    gpuarr_array a[32];
    for (int i = 0; i < 32; i++) a[i] = bytes_array(d, 64 * 1024); /* one 2 MiB segment, full */
    gpuarr_pool_stats st = stats_of(d);
    cr_assert_eq(st.segments, 1u);
    uint64_t backend_allocs = st.backend_allocs;
    for (int i = 0; i < 32; i += 2) TEST_OK(gpuarr_release(a[i])); /* these wait whole */
    for (int i = 1; i < 32; i += 2) TEST_OK(gpuarr_release(a[i])); /* no free neighbour in the index */
    gpuarr_array big = bytes_array(d, 1 * MiB);
    st = stats_of(d);
    cr_assert_eq(st.segments, 1u, "a 1 MiB array in a segment of free 64 KiB blocks took %llu segments", (unsigned long long)st.segments);
    cr_assert_eq(st.backend_allocs, backend_allocs);
    gpuarr_array again = bytes_array(d, 64 * 1024); /* reused at once, counted as a hit */
    gpuarr_pool_stats after = stats_of(d);
    cr_assert_eq(after.cache_hits, st.cache_hits + 1);
    cr_assert_eq(after.allocated_bytes, (uint64_t)(MiB + 64 * 1024));
    TEST_OK(gpuarr_release(again));
    TEST_OK(gpuarr_release(big));
    TEST_OK(gpuarr_pool_trim(d));
    st = stats_of(d);
    cr_assert_eq(st.reserved_bytes, 0u, "trim left %llu bytes", (unsigned long long)st.reserved_bytes);
    cr_assert_eq(st.allocated_bytes, 0u);
}

/* The summary and the snapshot describe what is there. */
Test(pool, summary_and_snapshot_report_the_pool) {
    gpuarr_device d = test_device();
    gpuarr_array a = bytes_array(d, 5 * MiB), b = bytes_array(d, 1000);
    char text[2048];
    TEST_OK(gpuarr_pool_summary(d, text, sizeof text));
    cr_assert(strstr(text, "allocated") && strstr(text, "reserved") && strstr(text, "cache hits"), "%s", text);
    size_t nseg = 0, nblk = 0;
    TEST_OK(gpuarr_pool_snapshot(d, NULL, 0, &nseg, NULL, 0, &nblk));
    cr_assert_eq(nseg, 2u);
    cr_assert_geq(nblk, 3u); /* 5 MiB block + its segment's rest, the small block (+ its rest) */
    cr_assert_eq(gpuarr_pool_summary(d, text, 0), GPUARR_ERROR_INVALID_ARGUMENT);
    TEST_OK(gpuarr_release(a));
    TEST_OK(gpuarr_release(b));
}

/* ---- the out-of-memory ladder ---- */

typedef struct handler_log {
    int calls;
    uint64_t asked[8];
    gpuarr_array to_free; /* released by the handler when set */
    bool retry;
} handler_log;

static bool log_handler(gpuarr_device d, uint64_t requested, void *user) {
    (void)d;
    handler_log *h = user;
    if (h->calls < 8) h->asked[h->calls] = requested;
    h->calls++;
    if (h->to_free.id) {
        gpuarr_release(h->to_free);
        h->to_free.id = 0;
    }
    return h->retry;
}

Test(pool, a_request_that_cannot_fit_walks_every_step_then_reports_the_numbers) {
    gpuarr_device d = test_device();
    TEST_OK(gpuarr_pool_set_limit(d, (uint64_t)(16 * MiB)));
    handler_log h1 = {0}, h2 = {0};
    TEST_OK(gpuarr_oom_handler_add(log_handler, &h1));
    TEST_OK(gpuarr_oom_handler_add(log_handler, &h2));
    gpuarr_array held = bytes_array(d, 8 * MiB);
    int64_t shape[1] = {12 * MiB};
    gpuarr_array out = {0xdeadbeefu};
    cr_assert_eq(gpuarr_empty(d, GPUARR_U8, 1, shape, &out), GPUARR_ERROR_OUT_OF_MEMORY);
    cr_assert_eq(out.id, 0xdeadbeefu);
    cr_assert_eq(h1.calls, 1);
    cr_assert_eq(h2.calls, 1);
    cr_assert_eq(h1.asked[0], (uint64_t)(12 * MiB), "handler asked with %llu", (unsigned long long)h1.asked[0]);
    gpuarr_pool_stats st = stats_of(d);
    cr_assert_eq(st.oom_handler_calls, 2u);
    cr_assert_eq(st.oom_oversize_releases, 0u);
    cr_assert_eq(st.oom_waits, 1u);
    cr_assert_eq(st.oom_trims, 1u);
    cr_assert_eq(st.oom_retries, 2u); /* after the wait, after the trim */
    cr_assert_eq(st.oom_failures, 1u);
    const char *msg = gpuarr_last_error();
    cr_assert(strstr(msg, "12582912 bytes requested"), "%s", msg);
    cr_assert(strstr(msg, "pool limit 16777216") && strstr(msg, "allocated 8388608") && strstr(msg, "cached 0"), "%s", msg);
    cr_assert(strstr(msg, "device total") && strstr(msg, "free"), "%s", msg);
    TEST_OK(gpuarr_oom_handler_remove(log_handler, &h1));
    TEST_OK(gpuarr_oom_handler_remove(log_handler, &h2));
    cr_assert_eq(gpuarr_oom_handler_remove(log_handler, &h2), GPUARR_ERROR_INVALID_ARGUMENT);
    TEST_OK(gpuarr_release(held));
}

Test(pool, a_handler_that_frees_memory_gets_its_retry_and_nothing_further_runs) {
    gpuarr_device d = test_device();
    TEST_OK(gpuarr_pool_set_limit(d, (uint64_t)(16 * MiB)));
    handler_log h = {0};
    h.to_free = bytes_array(d, 10 * MiB); /* the user's cache, freed on request */
    h.retry = true;
    TEST_OK(gpuarr_oom_handler_add(log_handler, &h));
    TEST_OK(gpuarr_pool_trim(d)); /* nothing cached: the 10 MiB are live */
    gpuarr_array big = bytes_array(d, 9 * MiB); /* 10 + 9 > 16: handler, which frees 10, retry */
    gpuarr_pool_stats st = stats_of(d);
    cr_assert_eq(h.calls, 1);
    cr_assert_eq(st.oom_handler_calls, 1u);
    cr_assert_eq(st.oom_retries, 1u);
    cr_assert_eq(st.oom_waits + st.oom_trims + st.oom_failures, 0u);
    TEST_OK(gpuarr_oom_handler_remove(log_handler, &h));
    TEST_OK(gpuarr_release(big));
}

Test(pool, oversized_cached_blocks_go_back_before_anything_else) {
    reinit("max_split_size:8M", false);
    gpuarr_device d = test_device();
    TEST_OK(gpuarr_pool_set_limit(d, (uint64_t)(100 * MiB)));
    TEST_OK(gpuarr_release(bytes_array(d, 90 * MiB))); /* cached, and too big to split */
    gpuarr_array a = bytes_array(d, 40 * MiB);         /* 90 + 40 > 100: the 90 goes back */
    gpuarr_pool_stats st = stats_of(d);
    cr_assert_eq(st.oom_oversize_releases, 1u);
    cr_assert_eq(st.oom_retries, 1u);
    cr_assert_eq(st.oom_waits + st.oom_trims + st.oom_failures, 0u);
    cr_assert_eq(st.reserved_bytes, (uint64_t)(40 * MiB));
    TEST_OK(gpuarr_release(a));
}

Test(pool, cached_segments_are_trimmed_when_nothing_else_helps) {
    gpuarr_device d = test_device();
    TEST_OK(gpuarr_pool_set_limit(d, (uint64_t)(100 * MiB)));
    gpuarr_array a = bytes_array(d, 30 * MiB), b = bytes_array(d, 30 * MiB), c = bytes_array(d, 30 * MiB);
    TEST_OK(gpuarr_release(a));
    TEST_OK(gpuarr_release(c)); /* two separate cached 30 MiB segments, b still live */
    gpuarr_array big = bytes_array(d, 60 * MiB); /* no cached block fits; 90 + 60 > 100 */
    gpuarr_pool_stats st = stats_of(d);
    cr_assert_eq(st.oom_oversize_releases, 0u, "30 MiB segments are not oversize for 60 MiB");
    cr_assert_eq(st.oom_waits, 1u);
    cr_assert_eq(st.oom_trims, 1u);
    cr_assert_eq(st.oom_failures, 0u);
    cr_assert_eq(st.reserved_bytes, (uint64_t)(90 * MiB));
    TEST_OK(gpuarr_release(b));
    TEST_OK(gpuarr_release(big));
}

Test(pool, injected_faults_drive_the_ladder_deterministically) {
    gpuarr_device d = test_device();
    TEST_OK(gpuarr_pool_inject_faults(d, 1, 0)); /* the next device allocation fails once */
    gpuarr_array a = bytes_array(d, 4 * MiB);
    gpuarr_pool_stats st = stats_of(d);
    cr_assert_eq(st.oom_waits, 1u, "the first retry (after the wait) should have succeeded");
    cr_assert_eq(st.oom_failures, 0u);
    TEST_OK(gpuarr_release(a));
    TEST_OK(gpuarr_pool_inject_faults(d, 0, 2 * MiB)); /* everything above 2 MiB fails */
    TEST_OK(gpuarr_pool_trim(d));
    int64_t shape[1] = {3 * MiB};
    gpuarr_array out = {0xdeadbeefu};
    cr_assert_eq(gpuarr_empty(d, GPUARR_U8, 1, shape, &out), GPUARR_ERROR_OUT_OF_MEMORY);
    cr_assert(strstr(gpuarr_last_error(), "injected"), "%s", gpuarr_last_error());
    cr_assert_eq(out.id, 0xdeadbeefu);
    TEST_OK(gpuarr_release(bytes_array(d, 1 * MiB))); /* small ones still work */
    TEST_OK(gpuarr_pool_inject_faults(d, 0, 0));
}

Test(pool, the_faults_environment_variable_arms_the_same_injection) {
    gpuarr_shutdown();
    char spec[64];
    snprintf(spec, sizeof spec, "%s:above=1M", test_device_spec());
    cr_assert_eq(setenv("GPUARR_FAULTS", spec, 1), 0);
    gpuarr_result r = gpuarr_init(NULL);
    unsetenv("GPUARR_FAULTS");
    TEST_OK(r);
    gpuarr_device d = test_device();
    int64_t shape[1] = {2 * MiB};
    gpuarr_array out;
    cr_assert_eq(gpuarr_empty(d, GPUARR_U8, 1, shape, &out), GPUARR_ERROR_OUT_OF_MEMORY);
    gpuarr_shutdown();
    cr_assert_eq(setenv("GPUARR_FAULTS", "nosuchdevice:nth=1", 1), 0);
    cr_assert_eq(gpuarr_init(NULL), GPUARR_ERROR_INVALID_ARGUMENT);
    cr_assert(strstr(gpuarr_last_error(), "GPUARR_FAULTS"), "%s", gpuarr_last_error());
    unsetenv("GPUARR_FAULTS");
    TEST_OK(gpuarr_init(NULL));
}

Test(pool, out_of_device_memory_can_place_arrays_on_the_host_when_asked) {
    gpuarr_device d = test_device();
    if (test_device_is_host(d)) test_skip("the host has no host to fall back to");
    reinit(NULL, true);
    d = test_device();
    TEST_OK(gpuarr_pool_set_limit(d, (uint64_t)(8 * MiB)));
    int64_t shape[1] = {16 * MiB / 4};
    gpuarr_array a;
    /* a success like any other, so `!= GPUARR_OK` checks keep working; the info says where */
    cr_assert_eq(gpuarr_zeros(d, GPUARR_F32, 1, shape, &a), GPUARR_OK);
    gpuarr_array_info info;
    TEST_OK(gpuarr_array_get_info(a, &info));
    cr_assert_eq(info.device.id, gpuarr_host().id);
    cr_assert(info.host_fallback, "the info does not say the array was placed by the fallback");
    float *p;
    TEST_OK(gpuarr_host_data(a, (void **)&p));
    cr_assert(p[0] == 0.0f && p[shape[0] - 1] == 0.0f);
    cr_assert_eq(stats_of(d).host_fallbacks, 1u);
    TEST_OK(gpuarr_release(a));
    float in[4] = {1, 2, 3, 4};
    int64_t four[1] = {4};
    gpuarr_array small, big;
    TEST_OK(gpuarr_from_host(d, in, 1, four, &small));
    cr_assert_eq(gpuarr_convert(small, gpuarr_host(), 0, &big), GPUARR_OK); /* no fallback: the host was asked for */
    TEST_OK(gpuarr_array_get_info(big, &info));
    cr_assert(!info.host_fallback);
    TEST_OK(gpuarr_release(big));
    TEST_OK(gpuarr_release(small));
    /* without the opt-in it is an error */
    reinit(NULL, false);
    d = test_device();
    TEST_OK(gpuarr_pool_set_limit(d, (uint64_t)(8 * MiB)));
    cr_assert_eq(gpuarr_zeros(d, GPUARR_F32, 1, shape, &a), GPUARR_ERROR_OUT_OF_MEMORY);
}

Test(pool, lowering_the_limit_sheds_cache_but_never_live_arrays) {
    gpuarr_device d = test_device();
    gpuarr_array live = bytes_array(d, 6 * MiB);
    TEST_OK(gpuarr_release(bytes_array(d, 10 * MiB)));
    cr_assert_eq(stats_of(d).reserved_bytes, (uint64_t)(16 * MiB));
    TEST_OK(gpuarr_pool_set_limit(d, (uint64_t)(7 * MiB)));
    gpuarr_pool_stats st = stats_of(d);
    cr_assert_eq(st.reserved_bytes, (uint64_t)(6 * MiB), "the cached 10 MiB stayed");
    cr_assert_eq(st.limit_bytes, (uint64_t)(7 * MiB));
    TEST_OK(gpuarr_release(live));
    TEST_OK(gpuarr_pool_set_limit(d, 0));
}

Test(pool, without_caching_every_array_is_a_device_allocation) {
    reinit("caching:0", false);
    gpuarr_device d = test_device();
    for (int i = 0; i < 10; i++) TEST_OK(gpuarr_release(bytes_array(d, 1000 + i)));
    gpuarr_pool_stats st = stats_of(d);
    cr_assert_eq(st.backend_allocs, 10u);
    cr_assert_eq(st.backend_frees, 10u);
    cr_assert_eq(st.cache_hits, 0u);
    cr_assert_eq(st.reserved_bytes, 0u);
}

Test(pool, a_release_threshold_returns_cache_at_sync_points) {
    reinit("release_threshold:4M", false);
    gpuarr_device d = test_device();
    TEST_OK(gpuarr_release(bytes_array(d, 16 * MiB)));
    TEST_OK(gpuarr_release(bytes_array(d, 32 * MiB)));
    TEST_OK(gpuarr_stream_sync((gpuarr_stream){0}));
    TEST_OK(gpuarr_device_sync(d));
    gpuarr_pool_stats st = stats_of(d);
    if (test_device_is_host(d)) TEST_OK(gpuarr_pool_trim(d)); /* the host has no sync points */
    st = stats_of(d);
    cr_assert_leq(st.reserved_bytes - st.allocated_bytes, (uint64_t)(4 * MiB), "%llu cached",
                  (unsigned long long)(st.reserved_bytes - st.allocated_bytes));
    cr_assert_eq(st.release_threshold_bytes, (uint64_t)(4 * MiB));
}

Test(pool, the_configuration_names_a_bad_key_or_value) {
    gpuarr_shutdown();
    static const char *const bad[][2] = {
        {"limit:lots", "bad value"}, {"colour:blue", "unknown key \"colour\""}, {"caching:2", "bad value"},
        {"limit:150%", "bad value"}, {"release_threshold", "not key:value"}, {"max_split_size:-3", "bad value"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        gpuarr_desc desc = {0};
        desc.alloc_conf = bad[i][0];
        cr_assert_eq(gpuarr_init(&desc), GPUARR_ERROR_INVALID_ARGUMENT, "%s", bad[i][0]);
        cr_assert(strstr(gpuarr_last_error(), bad[i][1]) && strstr(gpuarr_last_error(), "GPUARR_ALLOC_CONF"), "%s -> %s",
                  bad[i][0], gpuarr_last_error());
    }
    cr_assert_eq(setenv("GPUARR_ALLOC_CONF", "host_limit:50%,release_threshold:none,max_split_size:64MiB,caching:1", 1), 0);
    TEST_OK(gpuarr_init(NULL));
    unsetenv("GPUARR_ALLOC_CONF");
    gpuarr_device_info info;
    TEST_OK(gpuarr_device_get_info(gpuarr_host(), &info));
    gpuarr_pool_stats st = stats_of(gpuarr_host());
    cr_assert_eq(st.limit_bytes, info.total_memory / 100 * 50);
    cr_assert_eq(st.release_threshold_bytes, UINT64_MAX);
}

/* ---- stream-ordered reuse (needs an asynchronous device) ---- */

static gpuarr_device async_device(void) {
    gpuarr_device d = test_device();
    if (test_device_is_host(d)) test_skip("the host runs work when it is enqueued: there is no stream order to check");
    return d;
}

/* A block freed on s1 while work writing it is still queued there is handed to an allocation on
   s2: s2 must wait for s1, or s1's late write lands in s2's array. */
Test(pool, a_block_freed_on_one_stream_waits_for_that_stream_before_another_reuses_it) {
    gpuarr_device d = async_device();
    enum { N = 1 << 22 };
    int64_t shape[1] = {N};
    float *ones = malloc(sizeof(float) * N), *back = malloc(sizeof(float) * N);
    cr_assert(ones && back);
    for (int i = 0; i < N; i++) ones[i] = 1.0f;
    gpuarr_array src;
    TEST_OK(gpuarr_from_host(d, ones, 1, shape, &src));
    gpuarr_stream s1, s2;
    TEST_OK(gpuarr_stream_create(d, 0, &s1));
    TEST_OK(gpuarr_stream_create(d, 0, &s2));
    for (int k = 0; k < 24; k++) { /* a long queue on s1 */
        gpuarr_array busy;
        TEST_OK(gpuarr_convert_async(src, d, k % 2 ? GPUARR_F64 : GPUARR_F16, s1, &busy));
        TEST_OK(gpuarr_release(busy));
    }
    gpuarr_array late; /* i32 ones, written at the end of s1's queue, released at once */
    TEST_OK(gpuarr_convert_async(src, d, GPUARR_I32, s1, &late));
    TEST_OK(gpuarr_release(late));
    gpuarr_pool_stats before = stats_of(d);
    gpuarr_array mine;
    GPUARR_WITH_STREAM(s2) { TEST_OK(gpuarr_zeros(d, GPUARR_I32, 1, shape, &mine)); } /* same size: reuses it */
    gpuarr_pool_stats after = stats_of(d);
    cr_assert_eq(after.backend_allocs, before.backend_allocs, "the freed block was not reused: the test proves nothing");
    cr_assert_gt(after.cross_stream_waits, before.cross_stream_waits, "s2 reused s1's block without waiting");
    TEST_OK(gpuarr_stream_sync(s1));
    TEST_OK(gpuarr_to_host_as(mine, GPUARR_F32, back, N));
    for (int i = 0; i < N; i += 997) cr_assert_eq(back[i], 0.0f, "element %d: s1's late write landed in s2's array", i);
    TEST_OK(gpuarr_release(mine));
    TEST_OK(gpuarr_release(src));
    TEST_OK(gpuarr_stream_destroy(s1));
    TEST_OK(gpuarr_stream_destroy(s2));
    free(ones);
    free(back);
}

Test(pool, the_stream_that_freed_a_block_reuses_it_without_waiting) {
    gpuarr_device d = async_device();
    int64_t shape[1] = {1 << 20};
    gpuarr_stream s;
    TEST_OK(gpuarr_stream_create(d, 0, &s));
    gpuarr_array a, b, c;
    TEST_OK(gpuarr_zeros(d, GPUARR_F32, 1, shape, &a));
    TEST_OK(gpuarr_convert_async(a, d, GPUARR_I32, s, &b));
    TEST_OK(gpuarr_release(b)); /* freed on s, work pending */
    gpuarr_pool_stats before = stats_of(d);
    TEST_OK(gpuarr_convert_async(a, d, GPUARR_I32, s, &c)); /* same stream, same size */
    gpuarr_pool_stats after = stats_of(d);
    cr_assert_eq(after.backend_allocs, before.backend_allocs);
    cr_assert_eq(after.cross_stream_waits, before.cross_stream_waits, "the owner stream waited for itself");
    TEST_OK(gpuarr_stream_sync(s));
    TEST_OK(gpuarr_release(a));
    TEST_OK(gpuarr_release(c));
    TEST_OK(gpuarr_stream_destroy(s));
}

Test(pool, record_stream_makes_a_free_wait_for_that_stream_too) {
    gpuarr_device d = async_device();
    int64_t shape[1] = {1 << 20};
    gpuarr_stream other;
    TEST_OK(gpuarr_stream_create(d, 0, &other));
    gpuarr_array a;
    TEST_OK(gpuarr_zeros(d, GPUARR_F32, 1, shape, &a));
    TEST_OK(gpuarr_array_record_stream(a, other));
    TEST_OK(gpuarr_release(a));
    size_t nseg = 0, nblk = 0;
    gpuarr_pool_block_info blocks[16];
    TEST_OK(gpuarr_pool_snapshot(d, NULL, 0, &nseg, blocks, 16, &nblk));
    uint32_t events = 0;
    for (size_t i = 0; i < nblk && i < 16; i++) events += blocks[i].pending_events;
    cr_assert_geq(events, 1u, "the free recorded no event on the recorded stream");
    gpuarr_stream wrong_device = {0};
    (void)wrong_device;
    TEST_OK(gpuarr_stream_destroy(other));
}

/* ---- stress ---- */

typedef struct stress_ctx {
    gpuarr_device devices[4];
    int ndevices;
    int ops;
    unsigned seed;
    int failures;
} stress_ctx;

static void *stress_thread(void *arg) {
    stress_ctx *c = arg;
    test_rng rng = {c->seed};
    gpuarr_array live[8] = {{0}};
    for (int i = 0; i < c->ops; i++) {
        int slot = (int)test_rng_below(&rng, 8);
        gpuarr_device d = c->devices[test_rng_below(&rng, (uint32_t)c->ndevices)];
        if (live[slot].id) {
            uint32_t what = test_rng_below(&rng, 4);
            if (what == 0) { /* convert to another device and dtype, keep the result */
                gpuarr_array out;
                gpuarr_dtype t = (gpuarr_dtype)(1 + test_rng_below(&rng, TEST_NDTYPES));
                if (gpuarr_convert(live[slot], d, t, &out) != GPUARR_OK) c->failures++;
                else {
                    gpuarr_release(live[slot]);
                    live[slot] = out;
                }
            } else {
                if (gpuarr_release(live[slot]) != GPUARR_OK) c->failures++;
                live[slot].id = 0;
            }
        } else {
            int64_t shape[1] = {(int64_t)(1 + test_rng_below(&rng, 64 * 1024))};
            gpuarr_dtype t = (gpuarr_dtype)(1 + test_rng_below(&rng, TEST_NDTYPES));
            if (gpuarr_empty(d, t, 1, shape, &live[slot]) != GPUARR_OK) c->failures++;
        }
    }
    for (int s = 0; s < 8; s++)
        if (live[s].id) gpuarr_release(live[s]);
    return NULL;
}

/* GPUARR_STRESS_OPS operations per thread (make check: 100000; make test: fewer). */
Test(pool, sixteen_threads_of_random_allocations_leave_nothing_behind, .timeout = 600) {
    const char *env = getenv("GPUARR_STRESS_OPS");
    int ops = env ? atoi(env) : 2000;
    stress_ctx ctx[16];
    pthread_t threads[16];
    gpuarr_device devs[4];
    int n = 0;
    devs[n++] = gpuarr_host();
    for (int i = 0; i < 2; i++) {
        char spec[32];
        snprintf(spec, sizeof spec, "opencl:%d", i);
        if (gpuarr_device_find(spec, &devs[n]) == GPUARR_OK) n++;
    }
    for (int t = 0; t < 16; t++) {
        memcpy(ctx[t].devices, devs, sizeof devs);
        ctx[t].ndevices = n;
        ctx[t].ops = ops;
        ctx[t].seed = 1000u + (unsigned)t;
        ctx[t].failures = 0;
        cr_assert_eq(pthread_create(&threads[t], NULL, stress_thread, &ctx[t]), 0);
    }
    for (int t = 0; t < 16; t++) pthread_join(threads[t], NULL);
    for (int t = 0; t < 16; t++) cr_assert_eq(ctx[t].failures, 0, "thread %d: %d failed operations", t, ctx[t].failures);
    for (int i = 0; i < n; i++) {
        TEST_OK(gpuarr_device_sync(devs[i]));
        gpuarr_pool_stats st = stats_of(devs[i]);
        cr_assert_eq(st.allocated_bytes, 0u, "device %d: %llu bytes still allocated", i, (unsigned long long)st.allocated_bytes);
        cr_assert_eq(st.allocations, 0u);
        TEST_OK(gpuarr_pool_trim(devs[i]));
        st = stats_of(devs[i]);
        cr_assert_eq(st.reserved_bytes, 0u, "device %d: trim left %llu bytes", i, (unsigned long long)st.reserved_bytes);
    }
}

Test(pool, reset_peaks_brings_the_peaks_down_to_the_current_values) {
    gpuarr_device d = test_device();
    gpuarr_array big = bytes_array(d, (int64_t)8 << 20), small = bytes_array(d, 4096);
    TEST_OK(gpuarr_release(big));
    TEST_OK(gpuarr_device_sync(d));
    gpuarr_pool_stats before = stats_of(d);
    cr_assert_gt(before.peak_allocated_bytes, before.allocated_bytes, "the 8 MiB array left no peak above the current");
    TEST_OK(gpuarr_pool_reset_peaks(d));
    gpuarr_pool_stats after = stats_of(d);
    cr_expect_eq(after.peak_allocated_bytes, after.allocated_bytes);
    cr_expect_eq(after.peak_requested_bytes, after.requested_bytes);
    cr_expect_eq(after.peak_reserved_bytes, after.reserved_bytes);
    cr_expect_eq(after.peak_allocations, after.allocations);
    cr_expect_eq(after.total_allocated_bytes, before.total_allocated_bytes, "totals are not peaks: kept");
    cr_expect_eq(gpuarr_pool_reset_peaks((gpuarr_device){0}), GPUARR_ERROR_INVALID_HANDLE);
    TEST_OK(gpuarr_release(small));
}

/* ---- the per-thread cache of freed small arrays ---- */

/* A thread that makes and frees n arrays of `bytes` (they stay in its cache), then waits at
   `cached` and `go` (when set), then does it again. */
typedef struct cache_worker {
    gpuarr_device d;
    int64_t bytes;
    int n;
    pthread_barrier_t *cached, *go;
    int failures;
} cache_worker;

static void cache_worker_round(cache_worker *w) {
    int64_t shape[1] = {w->bytes};
    gpuarr_array a[8];
    for (int i = 0; i < w->n; i++)
        if (gpuarr_empty(w->d, GPUARR_U8, 1, shape, &a[i]) != GPUARR_OK) w->failures++, a[i].id = 0;
    for (int i = 0; i < w->n; i++)
        if (a[i].id && gpuarr_release(a[i]) != GPUARR_OK) w->failures++;
}

static void *cache_worker_run(void *arg) {
    cache_worker *w = arg;
    cache_worker_round(w);
    if (w->cached) pthread_barrier_wait(w->cached);
    if (w->go) pthread_barrier_wait(w->go);
    cache_worker_round(w);
    return NULL;
}

/* Starts a worker that holds its cached arrays until release_worker. */
static void start_holding_worker(cache_worker *w, pthread_t *t, pthread_barrier_t b[2], gpuarr_device d, int64_t bytes, int n) {
    pthread_barrier_init(&b[0], NULL, 2);
    pthread_barrier_init(&b[1], NULL, 2);
    *w = (cache_worker){.d = d, .bytes = bytes, .n = n, .cached = &b[0], .go = &b[1]};
    cr_assert_eq(pthread_create(t, NULL, cache_worker_run, w), 0);
    pthread_barrier_wait(&b[0]);
}

static void release_worker(cache_worker *w, pthread_t t, pthread_barrier_t b[2]) {
    pthread_barrier_wait(&b[1]);
    pthread_join(t, NULL);
    pthread_barrier_destroy(&b[0]);
    pthread_barrier_destroy(&b[1]);
    cr_assert_eq(w->failures, 0);
}

Test(pool, arrays_in_a_threads_cache_count_as_free_and_its_reuse_as_hits) {
    gpuarr_device d = test_device();
    cache_worker w;
    pthread_t t;
    pthread_barrier_t b[2];
    start_holding_worker(&w, &t, b, d, 4000, 4);
    gpuarr_pool_stats mid = stats_of(d); /* the worker's 4 arrays are freed, kept in its cache */
    cr_assert_eq(mid.allocated_bytes, 0u, "%llu bytes", (unsigned long long)mid.allocated_bytes);
    cr_assert_eq(mid.requested_bytes, 0u);
    cr_assert_eq(mid.allocations, 0u);
    cr_assert_eq(mid.reserved_bytes, 2u << 20);
    gpuarr_array other = bytes_array(d, MiB); /* from the pool, which counts the cached 4 in its peak */
    cr_assert_eq(stats_of(d).allocations, 1u);
    cr_assert_eq(stats_of(d).peak_allocations, 5u);
    TEST_OK(gpuarr_release(other));
    mid = stats_of(d);
    release_worker(&w, t, b); /* its second round comes from its cache */
    gpuarr_pool_stats end = stats_of(d);
    cr_assert_eq(end.cache_hits, mid.cache_hits + 4, "%llu hits after %llu", (unsigned long long)end.cache_hits,
                 (unsigned long long)mid.cache_hits);
    cr_assert_eq(end.total_allocations, mid.total_allocations + 4);
    cr_assert_eq(end.total_requested_bytes, mid.total_requested_bytes + 4 * 4000);
    cr_assert_eq(end.total_allocated_bytes - mid.total_allocated_bytes, 4u * 4096);
    cr_assert_eq(end.allocated_bytes, 0u);
    cr_assert_eq(end.requested_bytes, 0u);
    cr_assert_eq(end.allocations, 0u);
    gpuarr_array x = bytes_array(d, 4000); /* the exited thread's arrays went back to the pool */
    cr_assert_eq(stats_of(d).requested_bytes, 4000u);
    TEST_OK(gpuarr_release(x));
    TEST_OK(gpuarr_pool_trim(d));
    cr_assert_eq(stats_of(d).reserved_bytes, 0u);
}

Test(pool, a_trim_on_another_thread_returns_what_a_running_threads_cache_holds) {
    gpuarr_device d = test_device();
    cache_worker w;
    pthread_t t;
    pthread_barrier_t b[2];
    start_holding_worker(&w, &t, b, d, 64 * 1024, 4);
    cr_assert_eq(stats_of(d).reserved_bytes, 2u << 20);
    TEST_OK(gpuarr_pool_trim(d)); /* the segment holds only the worker's cached blocks */
    gpuarr_pool_stats st = stats_of(d);
    cr_assert_eq(st.reserved_bytes, 0u, "trim left %llu bytes held in a thread's cache", (unsigned long long)st.reserved_bytes);
    cr_assert_eq(st.backend_frees, 1u);
    release_worker(&w, t, b); /* its cache was emptied under it: it allocates afresh */
    st = stats_of(d);
    cr_assert_eq(st.allocated_bytes, 0u);
    cr_assert_eq(st.allocations, 0u);
    cr_assert_eq(st.backend_allocs, 2u);
}

Test(pool, the_out_of_memory_ladder_takes_back_arrays_other_threads_hold_in_their_caches) {
    gpuarr_device d = test_device();
    TEST_OK(gpuarr_pool_set_limit(d, (uint64_t)(4 * MiB)));
    cache_worker w;
    pthread_t t;
    pthread_barrier_t b[2];
    start_holding_worker(&w, &t, b, d, 64 * 1024, 4); /* 2 MiB reserved for its cached blocks */
    gpuarr_array big = bytes_array(d, 3 * MiB);        /* a 4 MiB segment: only once those go back */
    gpuarr_pool_stats st = stats_of(d);
    cr_assert_eq(st.oom_trims, 1u);
    cr_assert_eq(st.oom_failures, 0u);
    cr_assert_eq(st.reserved_bytes, (uint64_t)(4 * MiB));
    TEST_OK(gpuarr_release(big));
    TEST_OK(gpuarr_pool_trim(d));
    release_worker(&w, t, b);
    TEST_OK(gpuarr_pool_set_limit(d, 0));
}

Test(pool, lowering_the_limit_sheds_what_thread_caches_hold) {
    gpuarr_device d = test_device();
    cache_worker w;
    pthread_t t;
    pthread_barrier_t b[2];
    start_holding_worker(&w, &t, b, d, 8 * 1024, 4);
    TEST_OK(gpuarr_pool_set_limit(d, (uint64_t)MiB));
    cr_assert_eq(stats_of(d).reserved_bytes, 0u, "the limit left a segment held by a thread's cache");
    TEST_OK(gpuarr_pool_set_limit(d, 0));
    release_worker(&w, t, b);
}

/* A released array's record and block are reused whole by the thread's next array of its size:
   the released id must stay dead, among many live ones. */
Test(pool, a_released_id_stays_dead_when_its_array_record_is_reused) {
    gpuarr_device d = test_device();
    enum { LIVE = 2000 };
    gpuarr_array *live = malloc(sizeof *live * LIVE);
    cr_assert(live);
    for (int i = 0; i < LIVE; i++) live[i] = bytes_array(d, 4096);
    gpuarr_array gone = live[LIVE / 2];
    TEST_OK(gpuarr_release(gone));
    gpuarr_array again = bytes_array(d, 4096); /* from the thread's cache */
    cr_assert_neq(again.id, gone.id);
    gpuarr_array_info info;
    cr_assert_eq(gpuarr_array_get_info(gone, &info), GPUARR_ERROR_INVALID_HANDLE);
    cr_assert(strstr(gpuarr_last_error(), "released"), "%s", gpuarr_last_error());
    cr_assert_eq(gpuarr_release(gone), GPUARR_ERROR_INVALID_HANDLE);
    TEST_OK(gpuarr_array_get_info(again, &info));
    cr_assert_eq(info.nbytes, 4096u);
    cr_assert_eq(info.refcount, 1u);
    for (int i = 0; i < LIVE; i++)
        if (i != LIVE / 2) TEST_OK(gpuarr_release(live[i]));
    TEST_OK(gpuarr_release(again));
    cr_assert_eq(stats_of(d).allocations, 0u);
    free(live);
}

/* The same as the first stream test, with a block small enough for the thread caches: a block
   freed with work pending on its stream is never served from one. */
Test(pool, a_small_block_freed_on_one_stream_waits_for_that_stream_before_another_reuses_it) {
    gpuarr_device d = async_device();
    enum { N = 1024 };
    int64_t shape[1] = {N};
    float ones[N];
    for (int i = 0; i < N; i++) ones[i] = 1.0f;
    gpuarr_array src, late, mine;
    TEST_OK(gpuarr_from_host(d, ones, 1, shape, &src));
    gpuarr_stream s1, s2;
    TEST_OK(gpuarr_stream_create(d, 0, &s1));
    TEST_OK(gpuarr_stream_create(d, 0, &s2));
    TEST_OK(gpuarr_convert_async(src, d, GPUARR_I32, s1, &late));
    TEST_OK(gpuarr_release(late)); /* freed on s1, its write perhaps still queued */
    gpuarr_pool_stats before = stats_of(d);
    GPUARR_WITH_STREAM(s2) { TEST_OK(gpuarr_zeros(d, GPUARR_I32, 1, shape, &mine)); }
    gpuarr_pool_stats after = stats_of(d);
    cr_assert_eq(after.backend_allocs, before.backend_allocs);
    cr_assert_gt(after.cross_stream_waits, before.cross_stream_waits, "s2 reused s1's block without waiting");
    TEST_OK(gpuarr_stream_sync(s1));
    TEST_OK(gpuarr_release(mine));
    TEST_OK(gpuarr_release(src));
    TEST_OK(gpuarr_stream_destroy(s1));
    TEST_OK(gpuarr_stream_destroy(s2));
}
