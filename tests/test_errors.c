/*
 * test_errors.c -- every bad input gives its specific gpuarr_result, a gpuarr_last_error()
 * message that names the function, leaves *out untouched and leaves the caller's arrays intact.
 */
#include "test_common.h"

#include <pthread.h>

TestSuite(errors, .init = test_setup, .fini = test_teardown);
TestSuite(errors_uninit); /* tests that control gpuarr_init / gpuarr_shutdown themselves */

#define SENTINEL 0xdeadbeefu

/* Makes the thread's last error name some other function first, so that a stale message cannot
   satisfy the check of the call under test. */
static void set_marker(const char *fname) {
    if (strstr(fname, "gpuarr_retain"))
        (void)gpuarr_release((gpuarr_array){0});
    else
        (void)gpuarr_retain((gpuarr_array){0});
}

static void check_failure(gpuarr_result got, gpuarr_result want, const char *fname,
                          const char *text, int line) {
    const char *m = gpuarr_last_error();
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", m ? m : "(null)");
    cr_expect_eq(got, want, "line %d: %s = %s, want %s (last error: \"%s\")", line, text,
                 gpuarr_result_name(got), gpuarr_result_name(want), msg);
    cr_expect(m != NULL && m[0] != '\0', "line %d: %s: gpuarr_last_error() is empty", line, text);
    cr_expect(strstr(msg, fname) != NULL, "line %d: %s: last error \"%s\" does not name %s", line,
              text, msg, fname);
}

#define EXPECT_FAIL(want, fname, call)                                                             \
    do {                                                                                           \
        set_marker(fname);                                                                         \
        gpuarr_result ef_r_ = (call);                                                              \
        check_failure(ef_r_, (want), (fname), #call, __LINE__);                                    \
    } while (0)

#define EXPECT_UNCHANGED(handle)                                                                   \
    cr_expect_eq((handle).id, SENTINEL, "line %d: %s written on failure: 0x%x", __LINE__, #handle, \
                 (handle).id)

/* A source array with known data; checked again at the end of each test. */
static const int32_t src_values[6] = {1, -2, 3, -4, 5, 0x7fffffff};

static gpuarr_array make_src(gpuarr_device dev) {
    int64_t shape[2] = {2, 3};
    gpuarr_array a = {0};
    TEST_OK(gpuarr_from_host_as(dev, GPUARR_I32, src_values, 2, shape, &a));
    return a;
}
static void check_src(gpuarr_array a) {
    test_expect_array_bytes(a, GPUARR_I32, src_values, 6, "source array after failed calls");
    gpuarr_array_info info;
    TEST_OK(gpuarr_array_get_info(a, &info));
    cr_expect_eq(info.refcount, 1u, "a failed call changed the source refcount to %u",
                 info.refcount);
    cr_expect_eq(info.ndim, 2);
    cr_expect_eq(info.shape[0], 2);
    cr_expect_eq(info.shape[1], 3);
}

/* ---------------------------------------------------------------------------------------------
 * NULL pointers
 * ------------------------------------------------------------------------------------------- */
Test(errors, null_out_pointers_are_invalid_arguments) {
    gpuarr_device dev = test_device();
    gpuarr_array src = make_src(dev);
    int64_t shape[1] = {4};
    float data[4] = {0};
    EXPECT_FAIL(GPUARR_ERROR_INVALID_ARGUMENT, "gpuarr_empty",
                gpuarr_empty(dev, GPUARR_F32, 1, shape, NULL));
    EXPECT_FAIL(GPUARR_ERROR_INVALID_ARGUMENT, "gpuarr_zeros",
                gpuarr_zeros(dev, GPUARR_F32, 1, shape, NULL));
    EXPECT_FAIL(GPUARR_ERROR_INVALID_ARGUMENT, "gpuarr_from_host_as",
                gpuarr_from_host_as(dev, GPUARR_F32, data, 1, shape, NULL));
    EXPECT_FAIL(GPUARR_ERROR_INVALID_ARGUMENT, "gpuarr_convert",
                gpuarr_convert(src, dev, GPUARR_F64, NULL));
    EXPECT_FAIL(GPUARR_ERROR_INVALID_ARGUMENT, "gpuarr_convert_async",
                gpuarr_convert_async(src, dev, GPUARR_F64, (gpuarr_stream){0}, NULL));
    EXPECT_FAIL(GPUARR_ERROR_INVALID_ARGUMENT, "gpuarr_device_find",
                gpuarr_device_find("host", NULL));
    EXPECT_FAIL(GPUARR_ERROR_INVALID_ARGUMENT, "gpuarr_array_get_info",
                gpuarr_array_get_info(src, NULL));
    EXPECT_FAIL(GPUARR_ERROR_INVALID_ARGUMENT, "gpuarr_device_get_info",
                gpuarr_device_get_info(dev, NULL));
    EXPECT_FAIL(GPUARR_ERROR_INVALID_ARGUMENT, "gpuarr_stream_create",
                gpuarr_stream_create(dev, 0, NULL));
    EXPECT_FAIL(GPUARR_ERROR_INVALID_ARGUMENT, "gpuarr_event_create",
                gpuarr_event_create(dev, 0, NULL));
    EXPECT_FAIL(GPUARR_ERROR_INVALID_ARGUMENT, "gpuarr_host_data", gpuarr_host_data(src, NULL));
    EXPECT_FAIL(GPUARR_ERROR_INVALID_ARGUMENT, "gpuarr_query_desc", gpuarr_query_desc(NULL));
    gpuarr_stream s = {0};
    TEST_OK(gpuarr_stream_create(dev, 0, &s));
    EXPECT_FAIL(GPUARR_ERROR_INVALID_ARGUMENT, "gpuarr_stream_query",
                gpuarr_stream_query(s, NULL));
    EXPECT_FAIL(GPUARR_ERROR_INVALID_ARGUMENT, "gpuarr_stream_get_device",
                gpuarr_stream_get_device(s, NULL));
    gpuarr_event e = {0};
    TEST_OK(gpuarr_event_create(dev, 0, &e));
    EXPECT_FAIL(GPUARR_ERROR_INVALID_ARGUMENT, "gpuarr_event_query", gpuarr_event_query(e, NULL));
    TEST_OK(gpuarr_event_destroy(e));
    TEST_OK(gpuarr_stream_destroy(s));
    check_src(src);
    TEST_OK(gpuarr_release(src));
}

Test(errors, identity_convert_with_a_null_out_does_not_retain) {
    gpuarr_device dev = test_device();
    gpuarr_array src = make_src(dev);
    EXPECT_FAIL(GPUARR_ERROR_INVALID_ARGUMENT, "gpuarr_convert",
                gpuarr_convert(src, dev, GPUARR_DTYPE_INVALID, NULL));
    EXPECT_FAIL(GPUARR_ERROR_INVALID_ARGUMENT, "gpuarr_convert",
                gpuarr_convert(src, dev, GPUARR_I32, NULL));
    check_src(src); /* refcount still 1 */
    TEST_OK(gpuarr_release(src));
}

Test(errors, null_host_data_with_elements_is_an_invalid_argument) {
    gpuarr_device dev = test_device();
    gpuarr_array src = make_src(dev);
    int64_t shape[1] = {4};
    gpuarr_array out = {SENTINEL};
    EXPECT_FAIL(GPUARR_ERROR_INVALID_ARGUMENT, "gpuarr_from_host_as",
                gpuarr_from_host_as(dev, GPUARR_F32, NULL, 1, shape, &out));
    EXPECT_UNCHANGED(out);
    EXPECT_FAIL(GPUARR_ERROR_INVALID_ARGUMENT, "gpuarr_to_host_as",
                gpuarr_to_host_as(src, GPUARR_I32, NULL, 6));
    EXPECT_FAIL(GPUARR_ERROR_INVALID_ARGUMENT, "gpuarr_wrap_host",
                gpuarr_wrap_host(NULL, GPUARR_F32, 1, shape, NULL, NULL, &out));
    EXPECT_UNCHANGED(out);
    check_src(src);
    TEST_OK(gpuarr_release(src));
}

/* ---------------------------------------------------------------------------------------------
 * Shapes and dtypes
 * ------------------------------------------------------------------------------------------- */
Test(errors, null_shape_with_dimensions_is_an_invalid_argument) {
    gpuarr_device dev = test_device();
    gpuarr_array src = make_src(dev);
    float data[4] = {0};
    gpuarr_array out = {SENTINEL};
    EXPECT_FAIL(GPUARR_ERROR_INVALID_ARGUMENT, "gpuarr_empty",
                gpuarr_empty(dev, GPUARR_F32, 2, NULL, &out));
    EXPECT_UNCHANGED(out);
    EXPECT_FAIL(GPUARR_ERROR_INVALID_ARGUMENT, "gpuarr_zeros",
                gpuarr_zeros(dev, GPUARR_F32, 1, NULL, &out));
    EXPECT_UNCHANGED(out);
    EXPECT_FAIL(GPUARR_ERROR_INVALID_ARGUMENT, "gpuarr_from_host_as",
                gpuarr_from_host_as(dev, GPUARR_F32, data, 1, NULL, &out));
    EXPECT_UNCHANGED(out);
    EXPECT_FAIL(GPUARR_ERROR_INVALID_ARGUMENT, "gpuarr_wrap_host",
                gpuarr_wrap_host(data, GPUARR_F32, 1, NULL, NULL, NULL, &out));
    EXPECT_UNCHANGED(out);
    check_src(src);
    TEST_OK(gpuarr_release(src));
}

Test(errors, ndim_outside_0_to_8_is_an_invalid_argument) {
    gpuarr_device dev = test_device();
    gpuarr_array src = make_src(dev);
    int64_t shape[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
    float data[1] = {0};
    gpuarr_array out = {SENTINEL};
    EXPECT_FAIL(GPUARR_ERROR_INVALID_ARGUMENT, "gpuarr_empty",
                gpuarr_empty(dev, GPUARR_F32, -1, shape, &out));
    EXPECT_UNCHANGED(out);
    EXPECT_FAIL(GPUARR_ERROR_INVALID_ARGUMENT, "gpuarr_empty",
                gpuarr_empty(dev, GPUARR_F32, 9, shape, &out));
    EXPECT_UNCHANGED(out);
    EXPECT_FAIL(GPUARR_ERROR_INVALID_ARGUMENT, "gpuarr_zeros",
                gpuarr_zeros(dev, GPUARR_F32, 9, shape, &out));
    EXPECT_UNCHANGED(out);
    EXPECT_FAIL(GPUARR_ERROR_INVALID_ARGUMENT, "gpuarr_from_host_as",
                gpuarr_from_host_as(dev, GPUARR_F32, data, -1, shape, &out));
    EXPECT_UNCHANGED(out);
    EXPECT_FAIL(GPUARR_ERROR_INVALID_ARGUMENT, "gpuarr_from_host_as",
                gpuarr_from_host_as(dev, GPUARR_F32, data, 9, shape, &out));
    EXPECT_UNCHANGED(out);
    EXPECT_FAIL(GPUARR_ERROR_INVALID_ARGUMENT, "gpuarr_empty",
                gpuarr_empty(dev, GPUARR_F32, INT32_MIN, shape, &out));
    EXPECT_UNCHANGED(out);
    /* 8 is allowed */
    TEST_OK(gpuarr_empty(dev, GPUARR_F32, 8, shape, &out));
    TEST_OK(gpuarr_release(out));
    check_src(src);
    TEST_OK(gpuarr_release(src));
}

Test(errors, negative_dimension_is_an_invalid_argument) {
    gpuarr_device dev = test_device();
    gpuarr_array src = make_src(dev);
    int64_t shape[3] = {2, -3, 4};
    int64_t shape_min[1] = {INT64_MIN};
    float data[8] = {0};
    gpuarr_array out = {SENTINEL};
    EXPECT_FAIL(GPUARR_ERROR_INVALID_ARGUMENT, "gpuarr_empty",
                gpuarr_empty(dev, GPUARR_F32, 3, shape, &out));
    EXPECT_UNCHANGED(out);
    EXPECT_FAIL(GPUARR_ERROR_INVALID_ARGUMENT, "gpuarr_zeros",
                gpuarr_zeros(dev, GPUARR_F32, 1, shape_min, &out));
    EXPECT_UNCHANGED(out);
    EXPECT_FAIL(GPUARR_ERROR_INVALID_ARGUMENT, "gpuarr_from_host_as",
                gpuarr_from_host_as(dev, GPUARR_F32, data, 3, shape, &out));
    EXPECT_UNCHANGED(out);
    /* the message names the offending dimension */
    (void)gpuarr_empty(dev, GPUARR_F32, 3, shape, &out);
    cr_expect(strstr(gpuarr_last_error(), "shape[1]") != NULL,
              "message \"%s\" does not name shape[1]", gpuarr_last_error());
    check_src(src);
    TEST_OK(gpuarr_release(src));
}

Test(errors, byte_size_overflow_is_reported_as_overflow) {
    gpuarr_device dev = test_device();
    gpuarr_array src = make_src(dev);
    int64_t big2[2] = {INT64_MAX, 2};
    int64_t square[2] = {1ll << 40, 1ll << 40};
    int64_t count_ok_bytes_not[1] = {INT64_MAX / 2}; /* count fits, count * 8 does not */
    int64_t half[2] = {1ll << 62, 2};
    float data[1] = {0};
    gpuarr_array out = {SENTINEL};
    EXPECT_FAIL(GPUARR_ERROR_OVERFLOW, "gpuarr_empty",
                gpuarr_empty(dev, GPUARR_U8, 2, big2, &out));
    EXPECT_UNCHANGED(out);
    EXPECT_FAIL(GPUARR_ERROR_OVERFLOW, "gpuarr_empty",
                gpuarr_empty(dev, GPUARR_F32, 2, square, &out));
    EXPECT_UNCHANGED(out);
    EXPECT_FAIL(GPUARR_ERROR_OVERFLOW, "gpuarr_zeros",
                gpuarr_zeros(dev, GPUARR_F64, 1, count_ok_bytes_not, &out));
    EXPECT_UNCHANGED(out);
    EXPECT_FAIL(GPUARR_ERROR_OVERFLOW, "gpuarr_zeros",
                gpuarr_zeros(dev, GPUARR_U8, 2, half, &out));
    EXPECT_UNCHANGED(out);
    EXPECT_FAIL(GPUARR_ERROR_OVERFLOW, "gpuarr_from_host_as",
                gpuarr_from_host_as(dev, GPUARR_F32, data, 2, square, &out));
    EXPECT_UNCHANGED(out);
    EXPECT_FAIL(GPUARR_ERROR_OVERFLOW, "gpuarr_wrap_host",
                gpuarr_wrap_host(data, GPUARR_F32, 2, big2, NULL, NULL, &out));
    EXPECT_UNCHANGED(out);
    check_src(src);
    TEST_OK(gpuarr_release(src));
}

Test(errors, invalid_dtypes_are_invalid_arguments) {
    gpuarr_device dev = test_device();
    gpuarr_array src = make_src(dev);
    int64_t shape[1] = {4};
    float data[4] = {0};
    gpuarr_array out = {SENTINEL};
    const gpuarr_dtype bad[3] = {GPUARR_DTYPE_INVALID, (gpuarr_dtype)99, GPUARR_DTYPE_COUNT};
    for (int i = 0; i < 3; i++) {
        EXPECT_FAIL(GPUARR_ERROR_INVALID_ARGUMENT, "gpuarr_empty",
                    gpuarr_empty(dev, bad[i], 1, shape, &out));
        EXPECT_UNCHANGED(out);
        EXPECT_FAIL(GPUARR_ERROR_INVALID_ARGUMENT, "gpuarr_zeros",
                    gpuarr_zeros(dev, bad[i], 1, shape, &out));
        EXPECT_UNCHANGED(out);
        EXPECT_FAIL(GPUARR_ERROR_INVALID_ARGUMENT, "gpuarr_from_host_as",
                    gpuarr_from_host_as(dev, bad[i], data, 1, shape, &out));
        EXPECT_UNCHANGED(out);
    }
    /* for target dtypes 0 means "keep"; 99 is invalid */
    EXPECT_FAIL(GPUARR_ERROR_INVALID_ARGUMENT, "gpuarr_convert",
                gpuarr_convert(src, dev, (gpuarr_dtype)99, &out));
    EXPECT_UNCHANGED(out);
    EXPECT_FAIL(GPUARR_ERROR_INVALID_ARGUMENT, "gpuarr_convert",
                gpuarr_convert(src, gpuarr_host(), (gpuarr_dtype)-1, &out));
    EXPECT_UNCHANGED(out);
    EXPECT_FAIL(GPUARR_ERROR_INVALID_ARGUMENT, "gpuarr_convert_async",
                gpuarr_convert_async(src, dev, (gpuarr_dtype)99, (gpuarr_stream){0}, &out));
    EXPECT_UNCHANGED(out);
    int32_t back[6];
    EXPECT_FAIL(GPUARR_ERROR_INVALID_ARGUMENT, "gpuarr_to_host_as",
                gpuarr_to_host_as(src, (gpuarr_dtype)99, back, 6));
    check_src(src);
    TEST_OK(gpuarr_release(src));
}

/* ---------------------------------------------------------------------------------------------
 * Handles
 * ------------------------------------------------------------------------------------------- */
static void expect_dead_array(gpuarr_array h, gpuarr_device dev, const char *what) {
    gpuarr_array out = {SENTINEL};
    gpuarr_array_info info;
    int32_t back[8];
    void *p = NULL;
    cr_log_info("dead array %s: id 0x%x", what, h.id);
    EXPECT_FAIL(GPUARR_ERROR_INVALID_HANDLE, "gpuarr_array_get_info",
                gpuarr_array_get_info(h, &info));
    EXPECT_FAIL(GPUARR_ERROR_INVALID_HANDLE, "gpuarr_retain", gpuarr_retain(h));
    EXPECT_FAIL(GPUARR_ERROR_INVALID_HANDLE, "gpuarr_release", gpuarr_release(h));
    EXPECT_FAIL(GPUARR_ERROR_INVALID_HANDLE, "gpuarr_convert",
                gpuarr_convert(h, dev, GPUARR_F32, &out));
    EXPECT_UNCHANGED(out);
    EXPECT_FAIL(GPUARR_ERROR_INVALID_HANDLE, "gpuarr_convert",
                gpuarr_convert(h, dev, GPUARR_DTYPE_INVALID, &out));
    EXPECT_UNCHANGED(out);
    EXPECT_FAIL(GPUARR_ERROR_INVALID_HANDLE, "gpuarr_convert_async",
                gpuarr_convert_async(h, dev, GPUARR_F32, (gpuarr_stream){0}, &out));
    EXPECT_UNCHANGED(out);
    EXPECT_FAIL(GPUARR_ERROR_INVALID_HANDLE, "gpuarr_to_host_as",
                gpuarr_to_host_as(h, GPUARR_I32, back, 8));
    EXPECT_FAIL(GPUARR_ERROR_INVALID_HANDLE, "gpuarr_host_data", gpuarr_host_data(h, &p));
}

Test(errors, released_array_handle_is_invalid) {
    gpuarr_device dev = test_device();
    gpuarr_array src = make_src(dev);
    gpuarr_array a = make_src(dev);
    TEST_OK(gpuarr_release(a));
    expect_dead_array(a, dev, "released");
    check_src(src);
    TEST_OK(gpuarr_release(src));
}

Test(errors, double_release_is_an_invalid_handle) {
    gpuarr_device dev = test_device();
    gpuarr_array src = make_src(dev);
    gpuarr_array a = make_src(dev);
    TEST_OK(gpuarr_retain(a));
    TEST_OK(gpuarr_release(a));
    TEST_OK(gpuarr_release(a));
    EXPECT_FAIL(GPUARR_ERROR_INVALID_HANDLE, "gpuarr_release", gpuarr_release(a));
    EXPECT_FAIL(GPUARR_ERROR_INVALID_HANDLE, "gpuarr_release", gpuarr_release(a));
    check_src(src);
    TEST_OK(gpuarr_release(src));
}

Test(errors, forged_array_handles_are_invalid) {
    gpuarr_device dev = test_device();
    gpuarr_array src = make_src(dev);
    expect_dead_array((gpuarr_array){0}, dev, "{0}");
    expect_dead_array((gpuarr_array){12345}, dev, "{12345}");
    expect_dead_array((gpuarr_array){0xffffffffu}, dev, "{0xffffffff}");
    expect_dead_array((gpuarr_array){src.id ^ 0x80000000u}, dev, "src with the top bit flipped");
    expect_dead_array((gpuarr_array){src.id + 1}, dev, "src + 1");
    check_src(src);
    TEST_OK(gpuarr_release(src));
}

static int compare_ids(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

/* With hundreds of arrays alive, ids near a live one (id +- k, id with one bit flipped) must not
   name live arrays (beyond chance: about 2^-32 * live each), and each is refused. */
Test(errors, ids_near_hundreds_of_live_arrays_are_not_array_handles) {
    gpuarr_device dev = test_device();
    enum { LIVE = 300 };
    gpuarr_array live[LIVE];
    uint32_t sorted[LIVE];
    int64_t shape[1] = {1};
    for (int i = 0; i < LIVE; i++) {
        TEST_OK(gpuarr_empty(dev, GPUARR_U8, 1, shape, &live[i]));
        sorted[i] = live[i].id;
    }
    qsort(sorted, LIVE, sizeof sorted[0], compare_ids);
    int hits = 0, tried = 0;
    for (int i = 0; i < LIVE; i++) {
        for (int c = 0; c < 64; c++) {
            uint32_t id = live[i].id, k = (uint32_t)(c % 16) + 1u;
            uint32_t near = c < 16 ? id + k : c < 32 ? id - k : id ^ (1u << (c - 32));
            if (bsearch(&near, sorted, LIVE, sizeof sorted[0], compare_ids)) {
                hits++;
                continue;
            }
            tried++;
            gpuarr_array_info info;
            gpuarr_result r = gpuarr_array_get_info((gpuarr_array){near}, &info);
            cr_assert_eq(r, GPUARR_ERROR_INVALID_HANDLE, "id 0x%08x near live 0x%08x: %s (%s)", near, id, gpuarr_result_name(r),
                         gpuarr_last_error());
        }
    }
    cr_assert_leq(hits, 2, "ids are predictable: %d of %d ids near a live array id name live arrays", hits, hits + tried);
    for (int i = 0; i < LIVE; i++) TEST_OK(gpuarr_release(live[i]));
}

Test(errors, stale_handle_stays_invalid_after_its_slot_is_reused) {
    gpuarr_device dev = test_device();
    gpuarr_array src = make_src(dev);
    enum { ROUNDS = 100 };
    uint32_t old[ROUNDS];
    for (int i = 0; i < ROUNDS; i++) {
        gpuarr_array a = make_src(dev);
        for (int j = 0; j < i; j++)
            cr_assert_neq(a.id, old[j], "round %d: new array reuses the released handle 0x%x of "
                                        "round %d",
                          i, a.id, j);
        old[i] = a.id;
        TEST_OK(gpuarr_release(a));
        /* a new allocation most likely takes the freed slot; the old handle must stay dead */
        gpuarr_array b = make_src(dev);
        gpuarr_array_info info;
        EXPECT_FAIL(GPUARR_ERROR_INVALID_HANDLE, "gpuarr_array_get_info",
                    gpuarr_array_get_info(a, &info));
        EXPECT_FAIL(GPUARR_ERROR_INVALID_HANDLE, "gpuarr_release", gpuarr_release(a));
        TEST_OK(gpuarr_array_get_info(b, &info)); /* ... and the new one is untouched */
        cr_assert_eq(info.refcount, 1u);
        TEST_OK(gpuarr_release(b));
    }
    check_src(src);
    TEST_OK(gpuarr_release(src));
}

Test(errors, invalid_device_handles_are_invalid_handles) {
    gpuarr_device dev = test_device();
    gpuarr_array src = make_src(dev);
    int64_t shape[1] = {4};
    float data[4] = {0};
    const gpuarr_device bad[3] = {{0}, {999}, {0xffffffffu}};
    for (int i = 0; i < 3; i++) {
        gpuarr_array out = {SENTINEL};
        gpuarr_stream s = {SENTINEL};
        gpuarr_event e = {SENTINEL};
        gpuarr_device_info info;
        cr_log_info("device handle 0x%x", bad[i].id);
        EXPECT_FAIL(GPUARR_ERROR_INVALID_HANDLE, "gpuarr_empty",
                    gpuarr_empty(bad[i], GPUARR_F32, 1, shape, &out));
        EXPECT_UNCHANGED(out);
        EXPECT_FAIL(GPUARR_ERROR_INVALID_HANDLE, "gpuarr_zeros",
                    gpuarr_zeros(bad[i], GPUARR_F32, 1, shape, &out));
        EXPECT_UNCHANGED(out);
        EXPECT_FAIL(GPUARR_ERROR_INVALID_HANDLE, "gpuarr_from_host_as",
                    gpuarr_from_host_as(bad[i], GPUARR_F32, data, 1, shape, &out));
        EXPECT_UNCHANGED(out);
        EXPECT_FAIL(GPUARR_ERROR_INVALID_HANDLE, "gpuarr_convert",
                    gpuarr_convert(src, bad[i], GPUARR_F32, &out));
        EXPECT_UNCHANGED(out);
        EXPECT_FAIL(GPUARR_ERROR_INVALID_HANDLE, "gpuarr_device_get_info",
                    gpuarr_device_get_info(bad[i], &info));
        EXPECT_FAIL(GPUARR_ERROR_INVALID_HANDLE, "gpuarr_device_sync", gpuarr_device_sync(bad[i]));
        EXPECT_FAIL(GPUARR_ERROR_INVALID_HANDLE, "gpuarr_stream_create",
                    gpuarr_stream_create(bad[i], 0, &s));
        EXPECT_UNCHANGED(s);
        EXPECT_FAIL(GPUARR_ERROR_INVALID_HANDLE, "gpuarr_event_create",
                    gpuarr_event_create(bad[i], 0, &e));
        EXPECT_UNCHANGED(e);
        /* (set_current_device({0}) resets to the default device, like set_current_stream) */
        if (bad[i].id != 0)
            EXPECT_FAIL(GPUARR_ERROR_INVALID_HANDLE, "gpuarr_set_current_device",
                        gpuarr_set_current_device(bad[i]));
    }
    cr_expect_eq(gpuarr_device_at(-1).id, 0u);
    cr_expect_eq(gpuarr_device_at(gpuarr_device_count()).id, 0u);
    check_src(src);
    TEST_OK(gpuarr_release(src));
}

Test(errors, to_host_with_too_small_a_count_is_an_invalid_argument) {
    gpuarr_device dev = test_device();
    gpuarr_array src = make_src(dev);
    int32_t back[6];
    for (int i = 0; i < 6; i++) back[i] = 0x55;
    EXPECT_FAIL(GPUARR_ERROR_INVALID_ARGUMENT, "gpuarr_to_host_as",
                gpuarr_to_host_as(src, GPUARR_I32, back, 5));
    EXPECT_FAIL(GPUARR_ERROR_INVALID_ARGUMENT, "gpuarr_to_host_as",
                gpuarr_to_host_as(src, GPUARR_F64, back, 0));
    for (int i = 0; i < 6; i++) cr_expect_eq(back[i], 0x55, "failed to_host_as wrote back[%d]", i);
    check_src(src);
    TEST_OK(gpuarr_release(src));
}

/* ---------------------------------------------------------------------------------------------
 * Device specs
 * ------------------------------------------------------------------------------------------- */
Test(errors, malformed_device_specs_are_invalid_arguments) {
    gpuarr_device dev = test_device();
    gpuarr_array src = make_src(dev);
    static const char *const bad[] = {"gpu:x", "cuda:-1", "foo", "", "cuda:1x", "cuda:",
                                      "opencl:", "cuda:+1", "opencl:0:1", "hostx"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        gpuarr_device out = {SENTINEL};
        cr_log_info("spec \"%s\"", bad[i]);
        EXPECT_FAIL(GPUARR_ERROR_INVALID_ARGUMENT, "gpuarr_device_find",
                    gpuarr_device_find(bad[i], &out));
        EXPECT_UNCHANGED(out);
    }
    gpuarr_device out = {SENTINEL};
    EXPECT_FAIL(GPUARR_ERROR_INVALID_ARGUMENT, "gpuarr_device_find",
                gpuarr_device_find(NULL, &out));
    EXPECT_UNCHANGED(out);
    /* the well-formed ones work */
    TEST_OK(gpuarr_device_find("host", &out));
    cr_expect_eq(out.id, gpuarr_host().id);
    TEST_OK(gpuarr_device_find("cpu", &out));
    cr_expect_eq(out.id, gpuarr_host().id);
    TEST_OK(gpuarr_device_find("any", &out));
    check_src(src);
    TEST_OK(gpuarr_release(src));
}

Test(errors, absent_devices_are_no_device) {
    gpuarr_device dev = test_device();
    gpuarr_array src = make_src(dev);
    static const char *const absent[] = {"cuda:97", "opencl:99", "cuda:7"};
    for (size_t i = 0; i < sizeof absent / sizeof absent[0]; i++) {
        gpuarr_device out = {SENTINEL};
        gpuarr_result r = gpuarr_device_find(absent[i], &out);
        if (r == GPUARR_OK) { /* a machine with 8 CUDA devices has cuda:7 */
            cr_log_info("%s is present here; not an absent device", absent[i]);
            continue;
        }
        EXPECT_FAIL(GPUARR_ERROR_NO_DEVICE, "gpuarr_device_find", gpuarr_device_find(absent[i], &out));
        EXPECT_UNCHANGED(out);
    }
    check_src(src);
    TEST_OK(gpuarr_release(src));
}

Test(errors, gpu_spec_without_a_gpu_is_no_device) {
    int gpus = 0;
    for (int i = 0; i < gpuarr_device_count(); i++) {
        gpuarr_device_info info;
        TEST_OK(gpuarr_device_get_info(gpuarr_device_at(i), &info));
        if (info.type == GPUARR_DEVICE_TYPE_GPU) gpus++;
    }
    gpuarr_device out = {SENTINEL};
    if (gpus > 0) {
        TEST_OK(gpuarr_device_find("gpu", &out));
        gpuarr_device_info info;
        TEST_OK(gpuarr_device_get_info(out, &info));
        cr_expect_eq(info.type, GPUARR_DEVICE_TYPE_GPU, "\"gpu\" found a non-GPU device");
        return;
    }
    EXPECT_FAIL(GPUARR_ERROR_NO_DEVICE, "gpuarr_device_find", gpuarr_device_find("gpu", &out));
    EXPECT_UNCHANGED(out);
    TEST_OK(gpuarr_device_find("any", &out));
    cr_expect_eq(out.id, gpuarr_host().id, "\"any\" without a GPU is not the host");
}

/* ---------------------------------------------------------------------------------------------
 * Not initialized
 * ------------------------------------------------------------------------------------------- */
static void expect_not_initialized(const char *when) {
    int64_t shape[1] = {4};
    float data[4] = {0};
    gpuarr_array out = {SENTINEL};
    gpuarr_device dout = {SENTINEL};
    gpuarr_stream sout = {SENTINEL};
    gpuarr_event eout = {SENTINEL};
    gpuarr_device d1 = {1};
    gpuarr_array_info ainfo;
    gpuarr_device_info dinfo;
    gpuarr_desc desc;
    cr_log_info("%s", when);
    cr_expect(!gpuarr_is_initialized(), "%s: gpuarr_is_initialized() is true", when);
    cr_expect_eq(gpuarr_device_count(), 0, "%s: device count %d", when, gpuarr_device_count());
    cr_expect_eq(gpuarr_host().id, 0u, "%s: gpuarr_host() not {0}", when);
    cr_expect_eq(gpuarr_device_at(0).id, 0u, "%s: gpuarr_device_at(0) not {0}", when);
    EXPECT_FAIL(GPUARR_ERROR_NOT_INITIALIZED, "gpuarr_empty",
                gpuarr_empty(d1, GPUARR_F32, 1, shape, &out));
    EXPECT_UNCHANGED(out);
    EXPECT_FAIL(GPUARR_ERROR_NOT_INITIALIZED, "gpuarr_zeros",
                gpuarr_zeros(d1, GPUARR_F32, 1, shape, &out));
    EXPECT_UNCHANGED(out);
    EXPECT_FAIL(GPUARR_ERROR_NOT_INITIALIZED, "gpuarr_from_host_as",
                gpuarr_from_host_as(d1, GPUARR_F32, data, 1, shape, &out));
    EXPECT_UNCHANGED(out);
    EXPECT_FAIL(GPUARR_ERROR_NOT_INITIALIZED, "gpuarr_wrap_host",
                gpuarr_wrap_host(data, GPUARR_F32, 1, shape, NULL, NULL, &out));
    EXPECT_UNCHANGED(out);
    EXPECT_FAIL(GPUARR_ERROR_NOT_INITIALIZED, "gpuarr_device_find",
                gpuarr_device_find("host", &dout));
    EXPECT_UNCHANGED(dout);
    EXPECT_FAIL(GPUARR_ERROR_NOT_INITIALIZED, "gpuarr_device_get_info",
                gpuarr_device_get_info(d1, &dinfo));
    EXPECT_FAIL(GPUARR_ERROR_NOT_INITIALIZED, "gpuarr_stream_create",
                gpuarr_stream_create(d1, 0, &sout));
    EXPECT_UNCHANGED(sout);
    EXPECT_FAIL(GPUARR_ERROR_NOT_INITIALIZED, "gpuarr_event_create",
                gpuarr_event_create(d1, 0, &eout));
    EXPECT_UNCHANGED(eout);
    EXPECT_FAIL(GPUARR_ERROR_NOT_INITIALIZED, "gpuarr_convert",
                gpuarr_convert((gpuarr_array){1}, d1, GPUARR_F32, &out));
    EXPECT_UNCHANGED(out);
    EXPECT_FAIL(GPUARR_ERROR_NOT_INITIALIZED, "gpuarr_array_get_info",
                gpuarr_array_get_info((gpuarr_array){1}, &ainfo));
    EXPECT_FAIL(GPUARR_ERROR_NOT_INITIALIZED, "gpuarr_retain", gpuarr_retain((gpuarr_array){1}));
    EXPECT_FAIL(GPUARR_ERROR_NOT_INITIALIZED, "gpuarr_release", gpuarr_release((gpuarr_array){1}));
    EXPECT_FAIL(GPUARR_ERROR_NOT_INITIALIZED, "gpuarr_query_desc", gpuarr_query_desc(&desc));
    EXPECT_FAIL(GPUARR_ERROR_NOT_INITIALIZED, "gpuarr_set_current_device",
                gpuarr_set_current_device(d1));
    /* the name functions still work */
    cr_expect_str_eq(gpuarr_result_name(GPUARR_ERROR_NOT_INITIALIZED),
                     "GPUARR_ERROR_NOT_INITIALIZED");
    cr_expect_eq(gpuarr_dtype_size(GPUARR_F64), 8u);
    cr_expect_str_eq(gpuarr_version_string(), GPUARR_VERSION_STRING);
}

Test(errors_uninit, calls_before_init_are_not_initialized) {
    gpuarr_shutdown(); /* harmless when not initialized */
    expect_not_initialized("before gpuarr_init");
}

Test(errors_uninit, calls_after_the_last_shutdown_are_not_initialized) {
    TEST_OK(gpuarr_init(NULL));
    TEST_OK(gpuarr_init(NULL));
    gpuarr_shutdown();
    cr_expect(gpuarr_is_initialized(), "one of two references dropped: no longer initialized");
    gpuarr_device h = gpuarr_host();
    cr_expect_neq(h.id, 0u);
    gpuarr_shutdown();
    expect_not_initialized("after the last gpuarr_shutdown");
    gpuarr_shutdown(); /* harmless */
    gpuarr_shutdown();
    expect_not_initialized("after extra gpuarr_shutdown calls");
    /* and a new init works again */
    TEST_OK(gpuarr_init(NULL));
    cr_expect(gpuarr_device_count() >= 1);
    gpuarr_shutdown();
}

Test(errors_uninit, arrays_of_a_finished_session_are_invalid_in_the_next) {
    TEST_OK(gpuarr_init(NULL));
    gpuarr_array a = {0};
    int64_t shape[1] = {3};
    TEST_OK(gpuarr_zeros(gpuarr_host(), GPUARR_F32, 1, shape, &a));
    gpuarr_shutdown();
    TEST_OK(gpuarr_init(NULL));
    gpuarr_array_info info;
    EXPECT_FAIL(GPUARR_ERROR_INVALID_HANDLE, "gpuarr_array_get_info", gpuarr_array_get_info(a, &info));
    gpuarr_shutdown();
}

/* ---------------------------------------------------------------------------------------------
 * Streams and events
 * ------------------------------------------------------------------------------------------- */
Test(errors, stream_flags_must_be_zero) {
    gpuarr_device dev = test_device();
    gpuarr_array src = make_src(dev);
    gpuarr_stream s = {SENTINEL};
    EXPECT_FAIL(GPUARR_ERROR_INVALID_ARGUMENT, "gpuarr_stream_create",
                gpuarr_stream_create(dev, 1, &s));
    EXPECT_UNCHANGED(s);
    EXPECT_FAIL(GPUARR_ERROR_INVALID_ARGUMENT, "gpuarr_stream_create",
                gpuarr_stream_create(dev, 0x80000000u, &s));
    EXPECT_UNCHANGED(s);
    check_src(src);
    TEST_OK(gpuarr_release(src));
}

Test(errors, destroyed_streams_and_events_are_invalid_handles) {
    gpuarr_device dev = test_device();
    gpuarr_array src = make_src(dev);
    gpuarr_stream s = {0};
    gpuarr_event e = {0};
    TEST_OK(gpuarr_stream_create(dev, 0, &s));
    TEST_OK(gpuarr_event_create(dev, 0, &e));
    TEST_OK(gpuarr_stream_destroy(s));
    TEST_OK(gpuarr_event_destroy(e));
    bool done = false;
    gpuarr_array out = {SENTINEL};
    gpuarr_device dout = {SENTINEL};
    gpuarr_stream live = {0};
    TEST_OK(gpuarr_stream_create(dev, 0, &live));
    gpuarr_event live_e = {0};
    TEST_OK(gpuarr_event_create(dev, 0, &live_e));
    const gpuarr_stream dead_streams[3] = {s, {12345}, {0xffffffffu}};
    for (int i = 0; i < 3; i++) {
        gpuarr_stream d = dead_streams[i];
        EXPECT_FAIL(GPUARR_ERROR_INVALID_HANDLE, "gpuarr_stream_sync", gpuarr_stream_sync(d));
        EXPECT_FAIL(GPUARR_ERROR_INVALID_HANDLE, "gpuarr_stream_query", gpuarr_stream_query(d, &done));
        EXPECT_FAIL(GPUARR_ERROR_INVALID_HANDLE, "gpuarr_stream_get_device",
                    gpuarr_stream_get_device(d, &dout));
        EXPECT_UNCHANGED(dout);
        EXPECT_FAIL(GPUARR_ERROR_INVALID_HANDLE, "gpuarr_stream_destroy", gpuarr_stream_destroy(d));
        EXPECT_FAIL(GPUARR_ERROR_INVALID_HANDLE, "gpuarr_stream_wait", gpuarr_stream_wait(d, live_e));
        EXPECT_FAIL(GPUARR_ERROR_INVALID_HANDLE, "gpuarr_event_record", gpuarr_event_record(live_e, d));
        EXPECT_FAIL(GPUARR_ERROR_INVALID_HANDLE, "gpuarr_set_current_stream",
                    gpuarr_set_current_stream(d));
        EXPECT_FAIL(GPUARR_ERROR_INVALID_HANDLE, "gpuarr_convert_async",
                    gpuarr_convert_async(src, dev, GPUARR_F32, d, &out));
        EXPECT_UNCHANGED(out);
    }
    const gpuarr_event dead_events[3] = {e, {0}, {0xffffffffu}};
    for (int i = 0; i < 3; i++) {
        gpuarr_event d = dead_events[i];
        double ms = -1;
        EXPECT_FAIL(GPUARR_ERROR_INVALID_HANDLE, "gpuarr_event_sync", gpuarr_event_sync(d));
        EXPECT_FAIL(GPUARR_ERROR_INVALID_HANDLE, "gpuarr_event_query", gpuarr_event_query(d, &done));
        EXPECT_FAIL(GPUARR_ERROR_INVALID_HANDLE, "gpuarr_event_record", gpuarr_event_record(d, live));
        EXPECT_FAIL(GPUARR_ERROR_INVALID_HANDLE, "gpuarr_event_destroy", gpuarr_event_destroy(d));
        EXPECT_FAIL(GPUARR_ERROR_INVALID_HANDLE, "gpuarr_stream_wait", gpuarr_stream_wait(live, d));
        EXPECT_FAIL(GPUARR_ERROR_INVALID_HANDLE, "gpuarr_event_elapsed_ms",
                    gpuarr_event_elapsed_ms(d, live_e, &ms));
        cr_expect_eq(ms, -1.0, "failed elapsed_ms wrote *ms");
    }
    TEST_OK(gpuarr_event_destroy(live_e));
    TEST_OK(gpuarr_stream_destroy(live));
    check_src(src);
    TEST_OK(gpuarr_release(src));
}

Test(errors, elapsed_time_needs_events_created_with_timing) {
    gpuarr_device dev = test_device();
    gpuarr_array src = make_src(dev);
    gpuarr_stream s = {0};
    gpuarr_event a = {0}, b = {0}, ta = {0};
    TEST_OK(gpuarr_stream_create(dev, 0, &s));
    TEST_OK(gpuarr_event_create(dev, 0, &a));
    TEST_OK(gpuarr_event_create(dev, 0, &b));
    TEST_OK(gpuarr_event_create(dev, GPUARR_EVENT_TIMING, &ta));
    TEST_OK(gpuarr_event_record(a, s));
    TEST_OK(gpuarr_event_record(ta, s));
    TEST_OK(gpuarr_event_record(b, s));
    TEST_OK(gpuarr_stream_sync(s));
    double ms = -7;
    EXPECT_FAIL(GPUARR_ERROR_INVALID_ARGUMENT, "gpuarr_event_elapsed_ms",
                gpuarr_event_elapsed_ms(a, b, &ms));
    EXPECT_FAIL(GPUARR_ERROR_INVALID_ARGUMENT, "gpuarr_event_elapsed_ms",
                gpuarr_event_elapsed_ms(ta, b, &ms));
    EXPECT_FAIL(GPUARR_ERROR_INVALID_ARGUMENT, "gpuarr_event_elapsed_ms",
                gpuarr_event_elapsed_ms(a, ta, &ms));
    EXPECT_FAIL(GPUARR_ERROR_INVALID_ARGUMENT, "gpuarr_event_elapsed_ms",
                gpuarr_event_elapsed_ms(ta, ta, NULL));
    cr_expect_eq(ms, -7.0, "failed elapsed_ms wrote *ms");
    TEST_OK(gpuarr_event_destroy(a));
    TEST_OK(gpuarr_event_destroy(b));
    TEST_OK(gpuarr_event_destroy(ta));
    TEST_OK(gpuarr_stream_destroy(s));
    check_src(src);
    TEST_OK(gpuarr_release(src));
}

Test(errors, elapsed_time_of_a_never_recorded_event_is_an_invalid_argument) {
    gpuarr_device dev = test_device();
    gpuarr_array src = make_src(dev);
    gpuarr_stream s = {0};
    gpuarr_event recorded = {0}, never = {0};
    TEST_OK(gpuarr_stream_create(dev, 0, &s));
    TEST_OK(gpuarr_event_create(dev, GPUARR_EVENT_TIMING, &recorded));
    TEST_OK(gpuarr_event_create(dev, GPUARR_EVENT_TIMING, &never));
    TEST_OK(gpuarr_event_record(recorded, s));
    TEST_OK(gpuarr_stream_sync(s));
    double ms = -7;
    EXPECT_FAIL(GPUARR_ERROR_INVALID_ARGUMENT, "gpuarr_event_elapsed_ms",
                gpuarr_event_elapsed_ms(recorded, never, &ms));
    EXPECT_FAIL(GPUARR_ERROR_INVALID_ARGUMENT, "gpuarr_event_elapsed_ms",
                gpuarr_event_elapsed_ms(never, recorded, &ms));
    cr_expect_eq(ms, -7.0, "failed elapsed_ms wrote *ms");
    TEST_OK(gpuarr_event_destroy(recorded));
    TEST_OK(gpuarr_event_destroy(never));
    TEST_OK(gpuarr_stream_destroy(s));
    check_src(src);
    TEST_OK(gpuarr_release(src));
}

Test(errors, event_record_with_a_stream_of_another_device_is_an_invalid_argument) {
    gpuarr_device dev = test_device();
    gpuarr_device other = {0};
    for (int i = 0; i < gpuarr_device_count(); i++)
        if (gpuarr_device_at(i).id != dev.id) {
            other = gpuarr_device_at(i);
            break;
        }
    if (other.id == 0)
        test_skip("needs 2+ devices, this machine has %d (only %s)", gpuarr_device_count(),
                     test_device_spec());
    gpuarr_array src = make_src(dev);
    gpuarr_stream s_other = {0};
    gpuarr_event e = {0};
    TEST_OK(gpuarr_stream_create(other, 0, &s_other));
    TEST_OK(gpuarr_event_create(dev, 0, &e));
    EXPECT_FAIL(GPUARR_ERROR_INVALID_ARGUMENT, "gpuarr_event_record",
                gpuarr_event_record(e, s_other));
    TEST_OK(gpuarr_event_destroy(e));
    TEST_OK(gpuarr_stream_destroy(s_other));
    check_src(src);
    TEST_OK(gpuarr_release(src));
}

Test(errors, wrap_host_of_misaligned_memory_is_an_invalid_argument) {
    gpuarr_device dev = test_device();
    gpuarr_array src = make_src(dev);
    _Alignas(16) unsigned char storage[64] = {0};
    int64_t shape[1] = {4};
    gpuarr_array out = {SENTINEL};
    EXPECT_FAIL(GPUARR_ERROR_INVALID_ARGUMENT, "gpuarr_wrap_host",
                gpuarr_wrap_host(storage + 1, GPUARR_F32, 1, shape, NULL, NULL, &out));
    EXPECT_UNCHANGED(out);
    EXPECT_FAIL(GPUARR_ERROR_INVALID_ARGUMENT, "gpuarr_wrap_host",
                gpuarr_wrap_host(storage + 2, GPUARR_I64, 1, shape, NULL, NULL, &out));
    EXPECT_UNCHANGED(out);
    EXPECT_FAIL(GPUARR_ERROR_INVALID_ARGUMENT, "gpuarr_wrap_host",
                gpuarr_wrap_host(storage + 1, GPUARR_F16, 1, shape, NULL, NULL, &out));
    EXPECT_UNCHANGED(out);
    /* one-byte types need no alignment */
    TEST_OK(gpuarr_wrap_host(storage + 1, GPUARR_U8, 1, shape, NULL, NULL, &out));
    TEST_OK(gpuarr_release(out));
    check_src(src);
    TEST_OK(gpuarr_release(src));
}

Test(errors, host_data_of_a_device_array_is_unsupported) {
    gpuarr_device dev = test_device();
    gpuarr_array src = make_src(dev);
    gpuarr_array_info info;
    TEST_OK(gpuarr_array_get_info(src, &info));
    if (info.host_accessible) {
        TEST_OK(gpuarr_release(src));
        test_skip("arrays on %s are host accessible", test_device_spec());
    }
    void *p = (void *)&p;
    EXPECT_FAIL(GPUARR_ERROR_UNSUPPORTED, "gpuarr_host_data", gpuarr_host_data(src, &p));
    cr_expect_eq(p, (void *)&p, "failed gpuarr_host_data wrote *out");
    check_src(src);
    TEST_OK(gpuarr_release(src));
}

/* ---------------------------------------------------------------------------------------------
 * gpuarr_init: desc and environment
 * ------------------------------------------------------------------------------------------- */
static void *only_alloc(size_t size, void *user) { (void)user; return malloc(size); }
static void only_free(void *p, void *user) { (void)user; free(p); }

static void expect_init_fails(const gpuarr_desc *desc, const char *also_names) {
    EXPECT_FAIL(GPUARR_ERROR_INVALID_ARGUMENT, "gpuarr_init", gpuarr_init(desc));
    if (also_names)
        cr_expect(strstr(gpuarr_last_error(), also_names) != NULL,
                  "gpuarr_init message \"%s\" does not name %s", gpuarr_last_error(), also_names);
    cr_expect(!gpuarr_is_initialized(), "a failed gpuarr_init left the library initialized");
    cr_expect_eq(gpuarr_device_count(), 0);
}

Test(errors_uninit, init_with_half_an_allocator_is_an_invalid_argument) {
    gpuarr_desc desc;
    memset(&desc, 0, sizeof desc);
    desc.allocator.alloc_fn = only_alloc;
    expect_init_fails(&desc, NULL);
    memset(&desc, 0, sizeof desc);
    desc.allocator.free_fn = only_free;
    expect_init_fails(&desc, NULL);
    /* both work */
    desc.allocator.alloc_fn = only_alloc;
    TEST_OK(gpuarr_init(&desc));
    gpuarr_shutdown();
}

static void expect_env_rejected(const char *name, const char *value) {
    cr_log_info("%s=%s", name, value);
    cr_assert_eq(setenv(name, value, 1), 0);
    expect_init_fails(NULL, name);
    gpuarr_desc zero;
    memset(&zero, 0, sizeof zero);
    expect_init_fails(&zero, name); /* a zeroed desc reads the environment too */
    unsetenv(name);
    TEST_OK(gpuarr_init(NULL)); /* the same process initializes once the value is gone */
    gpuarr_shutdown();
}

Test(errors_uninit, malformed_GPUARR_LOG_fails_init_naming_it) {
    expect_env_rejected("GPUARR_LOG", "verbose");
    expect_env_rejected("GPUARR_LOG", "loud");
    expect_env_rejected("GPUARR_LOG", "warn,debug");
}

Test(errors_uninit, malformed_GPUARR_DEVICES_fails_init_naming_it) {
    expect_env_rejected("GPUARR_DEVICES", "bogus:0");
    expect_env_rejected("GPUARR_DEVICES", "cuda:x");
    expect_env_rejected("GPUARR_DEVICES", "host;cuda");
}

Test(errors_uninit, malformed_GPUARR_THREADS_fails_init_naming_it) {
    expect_env_rejected("GPUARR_THREADS", "0");
    expect_env_rejected("GPUARR_THREADS", "abc");
    expect_env_rejected("GPUARR_THREADS", "-1");
    expect_env_rejected("GPUARR_THREADS", "257");
    expect_env_rejected("GPUARR_THREADS", "4x");
}

Test(errors_uninit, malformed_GPUARR_HOST_ISA_fails_init_naming_it) {
    expect_env_rejected("GPUARR_HOST_ISA", "sse9");
    expect_env_rejected("GPUARR_HOST_ISA", "avx2,baseline");
}

Test(errors_uninit, valid_environment_values_are_accepted) {
    static const char *const levels[] = {"off", "error", "warn", "info", "debug"};
    for (int i = 0; i < 5; i++) {
        setenv("GPUARR_LOG", levels[i], 1);
        TEST_OK(gpuarr_init(NULL));
        gpuarr_desc d;
        TEST_OK(gpuarr_query_desc(&d));
        cr_expect_eq(d.log_level, (gpuarr_log_level)(GPUARR_LOG_OFF + i),
                     "GPUARR_LOG=%s resolved to %d", levels[i], (int)d.log_level);
        gpuarr_shutdown();
    }
    unsetenv("GPUARR_LOG");
    setenv("GPUARR_THREADS", "3", 1);
    TEST_OK(gpuarr_init(NULL));
    gpuarr_desc d;
    TEST_OK(gpuarr_query_desc(&d));
    cr_expect_eq(d.host_threads, 3, "GPUARR_THREADS=3 resolved to %d", d.host_threads);
    gpuarr_shutdown();
    unsetenv("GPUARR_THREADS");
    setenv("GPUARR_DEVICES", "host", 1);
    TEST_OK(gpuarr_init(NULL));
    cr_expect_eq(gpuarr_device_count(), 1, "GPUARR_DEVICES=host: %d devices",
                 gpuarr_device_count());
    gpuarr_shutdown();
    unsetenv("GPUARR_DEVICES");
}

Test(errors_uninit, desc_fields_override_the_environment) {
    setenv("GPUARR_THREADS", "abc", 1);
    setenv("GPUARR_LOG", "verbose", 1);
    gpuarr_desc desc;
    memset(&desc, 0, sizeof desc);
    desc.host_threads = 2;
    desc.log_level = GPUARR_LOG_ERROR;
    TEST_OK(gpuarr_init(&desc));
    gpuarr_desc d;
    TEST_OK(gpuarr_query_desc(&d));
    cr_expect_eq(d.host_threads, 2);
    cr_expect_eq(d.log_level, GPUARR_LOG_ERROR);
    gpuarr_shutdown();
    unsetenv("GPUARR_THREADS");
    unsetenv("GPUARR_LOG");
}

Test(errors_uninit, invalid_desc_fields_fail_init) {
    gpuarr_desc desc;
    memset(&desc, 0, sizeof desc);
    desc.devices = "bogus:0";
    expect_init_fails(&desc, NULL);
    memset(&desc, 0, sizeof desc);
    desc.host_threads = -1;
    expect_init_fails(&desc, NULL);
    memset(&desc, 0, sizeof desc);
    desc.log_level = (gpuarr_log_level)99;
    expect_init_fails(&desc, NULL);
    TEST_OK(gpuarr_init(NULL));
    gpuarr_shutdown();
}

/* ---------------------------------------------------------------------------------------------
 * Per-thread last error
 * ------------------------------------------------------------------------------------------- */
static void *fail_in_thread(void *arg) {
    char *seen = arg;
    snprintf(seen, 256, "%s", gpuarr_last_error()); /* fresh thread: "" */
    (void)gpuarr_stream_sync((gpuarr_stream){0xffffffffu});
    snprintf(seen + 256, 256, "%s", gpuarr_last_error());
    return NULL;
}

Test(errors, last_error_is_per_thread) {
    gpuarr_array_info info;
    EXPECT_FAIL(GPUARR_ERROR_INVALID_HANDLE, "gpuarr_array_get_info",
                gpuarr_array_get_info((gpuarr_array){12345}, &info));
    char seen[512] = {0};
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, fail_in_thread, seen), 0);
    pthread_join(t, NULL);
    cr_expect_str_eq(seen, "", "a new thread sees another thread's error: \"%s\"", seen);
    cr_expect(strstr(seen + 256, "gpuarr_stream_sync") != NULL, "thread error: \"%s\"",
              seen + 256);
    cr_expect(strstr(gpuarr_last_error(), "gpuarr_array_get_info") != NULL,
              "another thread's failure replaced this thread's error: \"%s\"",
              gpuarr_last_error());
}

/* ---------------------------------------------------------------------------------------------
 * Names
 * ------------------------------------------------------------------------------------------- */
Test(errors_uninit, result_names_and_strings_are_distinct_and_complete) {
    struct { gpuarr_result r; const char *name; const char *text; } all[] = {
#define ROW(NAME, value, text) {GPUARR_##NAME, "GPUARR_" #NAME, text},
        GPUARR_RESULT_LIST(ROW)
#undef ROW
    };
    size_t n = sizeof all / sizeof all[0];
    cr_assert_eq(n, (size_t)GPUARR_RESULT_COUNT);
    for (size_t i = 0; i < n; i++) {
        const char *name = gpuarr_result_name(all[i].r), *str = gpuarr_result_string(all[i].r);
        cr_assert_not_null(name);
        cr_assert_not_null(str);
        cr_expect_str_eq(name, all[i].name);
        cr_expect_str_eq(str, all[i].text);
        cr_expect(str[0] != '\0');
        for (size_t j = 0; j < i; j++) {
            cr_expect_str_neq(name, gpuarr_result_name(all[j].r));
            cr_expect_str_neq(str, gpuarr_result_string(all[j].r));
        }
    }
    /* unknown codes never crash and never pose as a known one */
    static const int unknown[] = {2, -(int)GPUARR_RESULT_COUNT, -99, 12345, INT32_MIN}; /* -COUNT: just past the list */
    for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++) {
        const char *name = gpuarr_result_name((gpuarr_result)unknown[i]);
        const char *str = gpuarr_result_string((gpuarr_result)unknown[i]);
        cr_assert_not_null(name, "result_name(%d) is NULL", unknown[i]);
        cr_assert_not_null(str, "result_string(%d) is NULL", unknown[i]);
        for (size_t j = 0; j < n; j++) cr_expect_str_neq(name, all[j].name);
    }
}

Test(errors_uninit, dtype_sizes_and_names_match_the_table) {
    static const char *const names[] = {"bool", "i8", "u8", "i16", "u16", "i32", "u32",
                                        "i64", "u64", "f16", "bf16", "f32", "f64"};
    static const size_t sizes[] = {1, 1, 1, 2, 2, 4, 4, 8, 8, 2, 2, 4, 8};
    cr_assert_eq((int)GPUARR_DTYPE_COUNT, 14);
    for (int t = TEST_FIRST_DTYPE; t <= TEST_LAST_DTYPE; t++) {
        cr_expect_eq(gpuarr_dtype_size((gpuarr_dtype)t), sizes[t - 1], "size of %s",
                     names[t - 1]);
        cr_expect_str_eq(gpuarr_dtype_name((gpuarr_dtype)t), names[t - 1]);
        cr_expect_eq(gpuarr_dtype_from_name(names[t - 1]), (gpuarr_dtype)t, "from_name(%s)",
                     names[t - 1]);
    }
    static const int invalid[] = {0, 14, 99, -1};
    for (size_t i = 0; i < sizeof invalid / sizeof invalid[0]; i++) {
        cr_expect_eq(gpuarr_dtype_size((gpuarr_dtype)invalid[i]), 0u, "size of dtype %d",
                     invalid[i]);
        cr_expect_str_eq(gpuarr_dtype_name((gpuarr_dtype)invalid[i]), "invalid", "name of %d",
                         invalid[i]);
    }
    cr_expect_eq(gpuarr_dtype_from_name("f128"), GPUARR_DTYPE_INVALID);
    cr_expect_eq(gpuarr_dtype_from_name(""), GPUARR_DTYPE_INVALID);
    cr_expect_eq(gpuarr_dtype_from_name("invalid"), GPUARR_DTYPE_INVALID);
    cr_expect_str_eq(gpuarr_backend_name(GPUARR_BACKEND_HOST), "host");
    cr_expect(gpuarr_backend_compiled(GPUARR_BACKEND_HOST));
    cr_expect(!gpuarr_backend_compiled(GPUARR_BACKEND_INVALID));
}
