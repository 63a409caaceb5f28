/* gpuarr_cuda_adopt: a device of a CUDA context the caller made (cuCtxCreate). Run on the fake
   driver (tests/fake_cuda) by make test, and on a GPU where there is one; skips, saying why,
   where there is no CUDA device. The driver's own entry points are reached with dlsym, as a
   program using the driver API would call them. */
#define _POSIX_C_SOURCE 200809L
#include <criterion/criterion.h>
#include <dlfcn.h>
#include <stdlib.h>
#include "test_common.h"

TestSuite(cuda_adopt, .init = test_setup, .fini = test_teardown);

typedef struct driver {
    int (*ctx_create)(struct CUctx_st **, unsigned int, int); /* cuCtxCreate_v2: every driver since CUDA 3.2 */
    int (*ctx_destroy)(struct CUctx_st *);
    int (*ctx_get_current)(struct CUctx_st **);
    int (*ctx_set_current)(struct CUctx_st *);
    int (*ctx_pop)(struct CUctx_st **);
    int (*mem_alloc)(unsigned long long *, size_t);
    int (*mem_free)(unsigned long long);
    int (*htod)(unsigned long long, const void *, size_t);
    int (*stream_create)(struct CUstream_st **, unsigned int);
    int (*stream_destroy)(struct CUstream_st *);
} driver;

#define DRIVER_SYM(field, name)                                                                   \
    do {                                                                                          \
        void *sym_ = dlsym(lib, name);                                                            \
        cr_assert(sym_, "the driver has no %s", name);                                            \
        memcpy(&drv->field, &sym_, sizeof sym_);                                                  \
    } while (0)

/* cuda:0 and the driver gpuarr loaded, or a skip saying why there is none. */
static gpuarr_device load_driver(driver *drv) {
    gpuarr_device d = {0};
    if (gpuarr_device_find("cuda:0", &d) != GPUARR_OK) test_skip("no CUDA device: %s", gpuarr_last_error());
    const char *path = getenv("GPUARR_CUDA_LIBRARY");
    void *lib = dlopen(path ? path : "libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    cr_assert(lib, "cuda:0 without its driver loaded?");
    DRIVER_SYM(ctx_create, "cuCtxCreate_v2");
    DRIVER_SYM(ctx_destroy, "cuCtxDestroy_v2");
    DRIVER_SYM(ctx_get_current, "cuCtxGetCurrent");
    DRIVER_SYM(ctx_set_current, "cuCtxSetCurrent");
    DRIVER_SYM(ctx_pop, "cuCtxPopCurrent_v2");
    DRIVER_SYM(mem_alloc, "cuMemAlloc_v2");
    DRIVER_SYM(mem_free, "cuMemFree_v2");
    DRIVER_SYM(htod, "cuMemcpyHtoD_v2");
    DRIVER_SYM(stream_create, "cuStreamCreate");
    DRIVER_SYM(stream_destroy, "cuStreamDestroy_v2");
    return d;
}

/* A new context of device 0, not left current (cuCtxCreate pushes it). */
static struct CUctx_st *make_context(const driver *drv) {
    struct CUctx_st *ctx = NULL, *popped = NULL;
    cr_assert_eq(drv->ctx_create(&ctx, 0, 0), 0, "cuCtxCreate");
    cr_assert_eq(drv->ctx_pop(&popped), 0);
    cr_assert_eq(popped, ctx);
    return ctx;
}

static void expect_message(const char *part) {
    cr_assert(strstr(gpuarr_last_error(), part), "the message lacks \"%s\": %s", part, gpuarr_last_error());
}

Test(cuda_adopt, an_adopted_context_is_a_device_of_its_own_linked_to_the_primary_view_of_its_gpu) {
    driver drv;
    gpuarr_device primary = load_driver(&drv);
    struct CUctx_st *ctx = make_context(&drv), *got = NULL, *primary_ctx = NULL;
    gpuarr_device d;
    TEST_OK(gpuarr_cuda_adopt(ctx, &d));
    gpuarr_device_info info, pinfo;
    TEST_OK(gpuarr_device_get_info(d, &info));
    TEST_OK(gpuarr_device_get_info(primary, &pinfo));
    cr_assert(info.adopted);
    cr_assert(!pinfo.adopted);
    cr_assert_eq(info.same_as.id, primary.id, "same_as is not cuda:0");
    cr_assert_eq(info.backend, GPUARR_BACKEND_CUDA);
    char want[32];
    snprintf(want, sizeof want, "cuda:%d", info.index);
    cr_assert_str_eq(info.spec, want);
    cr_assert_geq(info.index, 1, "an adopted device comes after those gpuarr_init found");
    TEST_OK(gpuarr_cuda_context(d, &got));
    TEST_OK(gpuarr_cuda_context(primary, &primary_ctx));
    cr_assert_eq(got, ctx);
    cr_assert_neq(primary_ctx, ctx);
    int ordinal = -1;
    TEST_OK(gpuarr_cuda_device_ordinal(d, &ordinal));
    cr_assert_eq(ordinal, 0);
    gpuarr_device found;
    TEST_OK(gpuarr_device_find(info.spec, &found));
    cr_assert_eq(found.id, d.id);
    TEST_OK(gpuarr_device_remove(d));
    cr_assert_eq(drv.ctx_destroy(ctx), 0);
}

/* Arrays of the adopted context, of cuda:0 (the same GPU, its primary context) and of the host,
   converted and copied every way, with a cast on each GPU device. */
Test(cuda_adopt, arrays_move_between_the_adopted_context_the_primary_context_and_the_host) {
    driver drv;
    gpuarr_device primary = load_driver(&drv);
    struct CUctx_st *ctx = make_context(&drv), *before = NULL, *after = NULL;
    gpuarr_device d;
    TEST_OK(gpuarr_cuda_adopt(ctx, &d));
    enum { N = 4099 };
    static float x[N];
    static double y[N];
    for (int i = 0; i < N; i++) x[i] = (float)i * 0.5f - 7.0f;
    int64_t shape[1] = {N};
    gpuarr_array a, b, c, h, e;
    drv.ctx_get_current(&before);
    TEST_OK(gpuarr_from_host(d, x, 1, shape, &a));         /* host -> adopted */
    TEST_OK(gpuarr_convert(a, primary, GPUARR_F64, &b));   /* adopted -> primary, a cast */
    TEST_OK(gpuarr_convert(b, d, GPUARR_F32, &c));         /* primary -> adopted, a cast */
    TEST_OK(gpuarr_convert(c, d, GPUARR_F64, &e));         /* a cast in the adopted context */
    TEST_OK(gpuarr_convert(e, gpuarr_host(), GPUARR_F64, &h));
    drv.ctx_get_current(&after);
    cr_assert_eq(after, before, "gpuarr left the adopted context current");
    TEST_OK(gpuarr_to_host(h, y, N));
    for (int i = 0; i < N; i++) cr_assert(y[i] == (double)x[i], "element %d: %g, want %g", i, y[i], (double)x[i]);
    memset(y, 0, sizeof y);
    TEST_OK(gpuarr_to_host(b, y, N));
    for (int i = 0; i < N; i++) cr_assert(y[i] == (double)x[i], "cuda:0 element %d: %g", i, y[i]);
    gpuarr_array copy;
    TEST_OK(gpuarr_empty(d, GPUARR_F64, 1, shape, &copy));
    TEST_OK(gpuarr_copy(copy, b)); /* primary -> adopted, same dtype */
    memset(y, 0, sizeof y);
    TEST_OK(gpuarr_to_host(copy, y, N));
    for (int i = 0; i < N; i++) cr_assert(y[i] == (double)x[i], "copied element %d: %g", i, y[i]);
    gpuarr_array arrs[] = {a, b, c, e, h, copy};
    for (size_t i = 0; i < sizeof arrs / sizeof arrs[0]; i++) TEST_OK(gpuarr_release(arrs[i]));
    TEST_OK(gpuarr_device_remove(d));
    cr_assert_eq(drv.ctx_destroy(ctx), 0);
}

/* The other GPU too (peer to peer where the fake allows, else through the host). */
Test(cuda_adopt, arrays_move_between_the_adopted_context_and_another_gpu) {
    driver drv;
    load_driver(&drv);
    gpuarr_device other;
    if (gpuarr_device_find("cuda:1", &other) != GPUARR_OK) test_skip("one GPU only: %s", gpuarr_last_error());
    struct CUctx_st *ctx = make_context(&drv);
    gpuarr_device d;
    TEST_OK(gpuarr_cuda_adopt(ctx, &d));
    int32_t x[1000], y[1000];
    for (int i = 0; i < 1000; i++) x[i] = i * 3 - 500;
    int64_t shape[1] = {1000};
    gpuarr_array a, b, c;
    TEST_OK(gpuarr_from_host(d, x, 1, shape, &a));
    TEST_OK(gpuarr_convert(a, other, GPUARR_I64, &b));
    TEST_OK(gpuarr_convert(b, d, GPUARR_I32, &c));
    TEST_OK(gpuarr_to_host(c, y, 1000));
    cr_assert_arr_eq(x, y, sizeof x);
    TEST_OK(gpuarr_release(a));
    TEST_OK(gpuarr_release(b));
    TEST_OK(gpuarr_release(c));
    TEST_OK(gpuarr_device_remove(d));
    cr_assert_eq(drv.ctx_destroy(ctx), 0);
}

static int release_calls;
static void count_release(void *data, void *user) {
    (void)data;
    (void)user;
    release_calls++;
}

Test(cuda_adopt, wrapping_takes_pointers_and_streams_of_the_adopted_context_only) {
    driver drv;
    gpuarr_device primary = load_driver(&drv);
    struct CUctx_st *ctx = make_context(&drv), *before = NULL;
    gpuarr_device d;
    TEST_OK(gpuarr_cuda_adopt(ctx, &d));
    drv.ctx_get_current(&before);
    /* memory and a stream of the caller's context */
    unsigned long long mine = 0;
    struct CUstream_st *stream = NULL;
    float x[64], y[64];
    for (int i = 0; i < 64; i++) x[i] = (float)i + 0.25f;
    cr_assert_eq(drv.ctx_set_current(ctx), 0);
    cr_assert_eq(drv.mem_alloc(&mine, sizeof x), 0);
    cr_assert_eq(drv.htod(mine, x, sizeof x), 0);
    cr_assert_eq(drv.stream_create(&stream, 1), 0);
    cr_assert_eq(drv.ctx_set_current(before), 0);
    int64_t shape[1] = {64};
    gpuarr_array w;
    release_calls = 0;
    TEST_OK(gpuarr_cuda_wrap_ptr(d, (void *)(uintptr_t)mine, GPUARR_F32, 1, shape, count_release, NULL, &w));
    gpuarr_stream s;
    TEST_OK(gpuarr_cuda_wrap_stream(d, stream, &s));
    gpuarr_array on_primary;
    TEST_OK(gpuarr_convert_async(w, primary, GPUARR_F32, s, &on_primary));
    TEST_OK(gpuarr_stream_sync(s));
    TEST_OK(gpuarr_to_host(on_primary, y, 64));
    cr_assert_arr_eq(x, y, sizeof x);
    /* cuda:0's memory and stream are refused on d, and d's on cuda:0, each saying why */
    void *theirs = NULL;
    TEST_OK(gpuarr_cuda_ptr(on_primary, &theirs));
    gpuarr_array refused;
    cr_assert_eq(gpuarr_cuda_wrap_ptr(d, theirs, GPUARR_F32, 1, shape, NULL, NULL, &refused), GPUARR_ERROR_INVALID_ARGUMENT);
    expect_message("adopted context");
    cr_assert_eq(gpuarr_cuda_wrap_ptr(primary, (void *)(uintptr_t)mine, GPUARR_F32, 1, shape, NULL, NULL, &refused),
                 GPUARR_ERROR_INVALID_ARGUMENT);
    expect_message("primary context");
    gpuarr_stream ps, refused_stream;
    struct CUstream_st *primary_stream = NULL;
    TEST_OK(gpuarr_stream_create(primary, 0, &ps));
    TEST_OK(gpuarr_cuda_stream(ps, &primary_stream));
    cr_assert_eq(gpuarr_cuda_wrap_stream(d, primary_stream, &refused_stream), GPUARR_ERROR_INVALID_ARGUMENT);
    expect_message("adopted context");
    cr_assert_eq(gpuarr_cuda_wrap_stream(primary, stream, &refused_stream), GPUARR_ERROR_INVALID_ARGUMENT);
    expect_message("primary context");
    TEST_OK(gpuarr_stream_destroy(ps));
    TEST_OK(gpuarr_release(on_primary));
    TEST_OK(gpuarr_release(w));
    TEST_OK(gpuarr_stream_destroy(s));
    TEST_OK(gpuarr_device_sync(d));
    cr_assert_eq(release_calls, 1, "the wrapped pointer's release ran %d times", release_calls);
    TEST_OK(gpuarr_device_remove(d));
    cr_assert_eq(drv.ctx_set_current(ctx), 0);
    cr_assert_eq(drv.stream_destroy(stream), 0);
    cr_assert_eq(drv.mem_free(mine), 0);
    cr_assert_eq(drv.ctx_set_current(before), 0);
    cr_assert_eq(drv.ctx_destroy(ctx), 0);
}

Test(cuda_adopt, a_removed_device_is_refused_by_name) {
    driver drv;
    load_driver(&drv);
    struct CUctx_st *ctx = make_context(&drv);
    gpuarr_device d;
    TEST_OK(gpuarr_cuda_adopt(ctx, &d));
    gpuarr_device_info info;
    TEST_OK(gpuarr_device_get_info(d, &info));
    gpuarr_array a;
    int64_t shape[1] = {4};
    TEST_OK(gpuarr_zeros(d, GPUARR_F32, 1, shape, &a));
    cr_assert_eq(gpuarr_device_remove(d), GPUARR_ERROR_INVALID_ARGUMENT, "removed with an array alive");
    expect_message("alive");
    TEST_OK(gpuarr_release(a));
    TEST_OK(gpuarr_device_remove(d));
    cr_assert_neq(gpuarr_zeros(d, GPUARR_F32, 1, shape, &a), GPUARR_OK, "a removed device made an array");
    struct CUctx_st *got = NULL;
    cr_assert_neq(gpuarr_cuda_context(d, &got), GPUARR_OK);
    gpuarr_device again;
    cr_assert_eq(gpuarr_device_find(info.spec, &again), GPUARR_ERROR_NO_DEVICE);
    expect_message("removed");
    /* gpuarr let go of the context: the caller may adopt it anew, then destroy it */
    TEST_OK(gpuarr_cuda_adopt(ctx, &again));
    cr_assert_neq(again.id, d.id);
    TEST_OK(gpuarr_device_remove(again));
    cr_assert_eq(drv.ctx_destroy(ctx), 0);
}

Test(cuda_adopt, contexts_that_are_not_usable_or_taken_already_are_refused_saying_why) {
    driver drv;
    gpuarr_device primary = load_driver(&drv);
    gpuarr_device d = {0}, d2 = {0};
    cr_assert_eq(gpuarr_cuda_adopt(NULL, &d), GPUARR_ERROR_INVALID_ARGUMENT);
    expect_message("NULL");
    cr_assert_eq(gpuarr_cuda_adopt(make_context(&drv), NULL), GPUARR_ERROR_INVALID_ARGUMENT);
    struct CUctx_st *ctx = make_context(&drv), *primary_ctx = NULL;
    TEST_OK(gpuarr_cuda_adopt(ctx, &d));
    gpuarr_device_info info;
    TEST_OK(gpuarr_device_get_info(d, &info));
    cr_assert_eq(gpuarr_cuda_adopt(ctx, &d2), GPUARR_ERROR_INVALID_ARGUMENT);
    expect_message(info.spec);
    TEST_OK(gpuarr_cuda_context(primary, &primary_ctx));
    cr_assert_eq(gpuarr_cuda_adopt(primary_ctx, &d2), GPUARR_ERROR_INVALID_ARGUMENT);
    expect_message("primary context");
    expect_message("cuda:0");
    TEST_OK(gpuarr_device_remove(d));
    cr_assert_eq(drv.ctx_destroy(ctx), 0);
    cr_assert_eq(gpuarr_cuda_adopt(ctx, &d2), GPUARR_ERROR_INVALID_ARGUMENT, "a destroyed context was adopted");
    expect_message("not a usable CUDA context");
    static char garbage[256];
    cr_assert_eq(gpuarr_cuda_adopt((struct CUctx_st *)(void *)garbage, &d2), GPUARR_ERROR_INVALID_ARGUMENT);
    expect_message("not a usable CUDA context");
    cr_assert_eq(d2.id, 0u, "a refused adoption wrote its out handle");
}

/* A healthy adopted device resets without touching the caller's context, which stays usable. */
Test(cuda_adopt, reset_of_an_adopted_device_keeps_the_callers_context) {
    driver drv;
    load_driver(&drv);
    struct CUctx_st *ctx = make_context(&drv), *before = NULL;
    gpuarr_device d;
    TEST_OK(gpuarr_cuda_adopt(ctx, &d));
    unsigned long long mine = 0;
    drv.ctx_get_current(&before);
    cr_assert_eq(drv.ctx_set_current(ctx), 0);
    cr_assert_eq(drv.mem_alloc(&mine, 4096), 0);
    cr_assert_eq(drv.ctx_set_current(before), 0);
    int64_t shape[1] = {8};
    gpuarr_array a;
    TEST_OK(gpuarr_zeros(d, GPUARR_F64, 1, shape, &a));
    TEST_OK(gpuarr_release(a));
    TEST_OK(gpuarr_device_reset(d));
    TEST_OK(gpuarr_zeros(d, GPUARR_F64, 1, shape, &a));
    double y[8] = {1};
    TEST_OK(gpuarr_to_host(a, y, 8));
    cr_assert(y[0] == 0.0 && y[7] == 0.0);
    TEST_OK(gpuarr_release(a));
    TEST_OK(gpuarr_device_remove(d));
    cr_assert_eq(drv.ctx_set_current(ctx), 0);
    cr_assert_eq(drv.mem_free(mine), 0, "the caller's memory went with the reset");
    cr_assert_eq(drv.ctx_set_current(before), 0);
    cr_assert_eq(drv.ctx_destroy(ctx), 0);
}

/* gpuarr_shutdown with an adopted device still there lets go of the context: the caller destroys
   it after, and nothing of gpuarr's is left in the driver. */
Test(cuda_adopt, shutdown_lets_go_of_an_adopted_context) {
    driver drv;
    load_driver(&drv);
    struct CUctx_st *ctx = make_context(&drv);
    gpuarr_device d;
    TEST_OK(gpuarr_cuda_adopt(ctx, &d));
    int64_t shape[1] = {100};
    gpuarr_array a, b;
    TEST_OK(gpuarr_zeros(d, GPUARR_F32, 1, shape, &a));
    TEST_OK(gpuarr_convert(a, d, GPUARR_F16, &b)); /* a kernel module in the context */
    TEST_OK(gpuarr_release(a));
    TEST_OK(gpuarr_release(b));
    const char *path = getenv("GPUARR_CUDA_LIBRARY");
    void *lib = dlopen(path ? path : "libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    unsigned long long (*live)(void) = NULL;
    void *sym = lib ? dlsym(lib, "fake_cuda_live_objects") : NULL;
    memcpy(&live, &sym, sizeof sym);
    gpuarr_shutdown();
    if (live) cr_assert_eq(live(), 0ull, "%llu driver objects left after gpuarr_shutdown", live());
    cr_assert_eq(drv.ctx_destroy(ctx), 0, "the context is the caller's to destroy");
    TEST_OK(gpuarr_init(NULL)); /* for the fixture's teardown */
}
