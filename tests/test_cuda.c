/* CUDA-specific behaviour. The generic suite also runs on cuda:0 (GPUARR_TEST_DEVICE=cuda:0, as
   tools/gpu-check.sh does), which covers every cast kernel against the reference. Tests that need
   a GPU skip, saying why, where there is none; the ones about a missing or broken driver run
   everywhere. */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include <criterion/criterion.h>
#include <dirent.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include "test_common.h"

TestSuite(cuda, .init = test_setup, .fini = test_teardown);

static void setenv_or_die(const char *k, const char *v) { cr_assert_eq(setenv(k, v, 1), 0); }

static void reinit_with(const char *key, const char *value) {
    gpuarr_shutdown();
    setenv_or_die(key, value);
    gpuarr_result r = gpuarr_init(NULL);
    unsetenv(key);
    cr_assert_eq(r, GPUARR_OK, "gpuarr_init with %s=%s: %s", key, value, gpuarr_last_error());
}

/* cuda:N, or a skip that says why there is none (no driver, no GPU, ...). A CUDA machine with
   GPUARR_TEST_REQUIRE=1 and GPUARR_TEST_DEVICE=cuda:* (tools/gpu-check.sh) fails instead. */
static gpuarr_device cuda_device(int n) {
    char spec[32];
    snprintf(spec, sizeof spec, "cuda:%d", n);
    gpuarr_device d = {0};
    gpuarr_result r = gpuarr_device_find(spec, &d);
    const char *want = getenv("GPUARR_TEST_DEVICE");
    if (r != GPUARR_OK && test_devices_required() && want && strncmp(want, "cuda", 4) == 0)
        cr_assert_fail("%s is absent but GPUARR_TEST_DEVICE=%s and GPUARR_TEST_REQUIRE=1: %s", spec, want, gpuarr_last_error());
    if (r != GPUARR_OK) test_skip("no GPU here: %s", gpuarr_last_error());
    return d;
}

static void expect_f32_to_f16(gpuarr_array h16, const float *src, size_t n) {
    uint16_t *got = malloc(n * 2);
    cr_assert(got);
    TEST_OK(gpuarr_to_host_as(h16, GPUARR_F16, got, n));
    for (size_t i = 0; i < n; i++) {
        uint64_t want = ref_cast_bits(GPUARR_F32, test_f32_bits(src[i]), GPUARR_F16);
        cr_assert_eq(got[i], want, "element %zu: f32 0x%08x -> f16: got 0x%04x, want 0x%04llx", i, test_f32_bits(src[i]), got[i],
                     (unsigned long long)want);
    }
    free(got);
}

/* f32 -> f16 on the GPU, for values around every f16 boundary (subnormals, overflow, NaN). */
static void cast_on_the_gpu(gpuarr_device d) {
    enum { N = 1 << 20 };
    float *src = malloc(sizeof(float) * N);
    cr_assert(src);
    test_rng rng = {42};
    test_fill_random(GPUARR_F32, src, N, &rng);
    int64_t shape[1] = {N};
    gpuarr_array a, b;
    TEST_OK(gpuarr_from_host(d, src, 1, shape, &a));
    TEST_OK(gpuarr_convert(a, d, GPUARR_F16, &b)); /* on the device */
    expect_f32_to_f16(b, src, N);
    TEST_OK(gpuarr_release(a));
    TEST_OK(gpuarr_release(b));
    free(src);
}

/* ---- without a usable driver: run everywhere ---------------------------------------------- */
Test(cuda, without_the_driver_there_are_no_cuda_devices_and_the_rest_works) {
    reinit_with("GPUARR_CUDA_LIBRARY", "/nonexistent/libcuda.so.1");
    for (int i = 0; i < gpuarr_device_count(); i++) {
        gpuarr_device_info info;
        TEST_OK(gpuarr_device_get_info(gpuarr_device_at(i), &info));
        cr_assert_neq(info.backend, GPUARR_BACKEND_CUDA, "%s listed without a driver", info.spec);
    }
    gpuarr_device d;
    cr_assert_eq(gpuarr_device_find("cuda:0", &d), GPUARR_ERROR_NO_DEVICE);
    cr_assert(strstr(gpuarr_last_error(), "libcuda"), "the reason is not given: %s", gpuarr_last_error());
    double in[3] = {1.5, -2.5, 3.25};
    float out[3];
    int64_t shape[1] = {3};
    gpuarr_array a;
    TEST_OK(gpuarr_from_host(gpuarr_host(), in, 1, shape, &a));
    TEST_OK(gpuarr_to_host(a, out, 3));
    cr_assert(out[2] == 3.25f);
    struct CUstream_st *st = NULL;
    void *p = NULL;
    cr_assert_eq(gpuarr_cuda_ptr(a, &p), GPUARR_ERROR_INVALID_ARGUMENT, "a host array has no CUDA pointer");
    cr_assert(strstr(gpuarr_last_error(), "not on a CUDA device"), "%s", gpuarr_last_error());
    gpuarr_stream s;
    TEST_OK(gpuarr_stream_create(gpuarr_host(), 0, &s));
    cr_assert_eq(gpuarr_cuda_stream(s, &st), GPUARR_ERROR_INVALID_ARGUMENT);
    cr_assert_eq(gpuarr_cuda_wrap_stream(gpuarr_host(), NULL, &s), GPUARR_ERROR_INVALID_ARGUMENT);
    TEST_OK(gpuarr_stream_destroy(s));
    TEST_OK(gpuarr_release(a));
}

/* The toolkit's stub library has every entry point, and cuInit fails in it (the situation of a
   container with a mismatched driver): no CUDA devices, and the reason is kept. */
Test(cuda, a_driver_that_cannot_start_gives_no_devices_and_says_why) {
    const char *home = getenv("CUDA_HOME");
    char stub[512];
    snprintf(stub, sizeof stub, "%s/lib64/stubs/libcuda.so", home && *home ? home : "/usr/local/cuda");
    void *probe = dlopen(stub, RTLD_NOW | RTLD_LOCAL);
    if (!probe) test_skip("no CUDA toolkit stub driver at %s (set CUDA_HOME)", stub);
    dlclose(probe);
    reinit_with("GPUARR_CUDA_LIBRARY", stub);
    gpuarr_device d;
    cr_assert_eq(gpuarr_device_find("cuda:0", &d), GPUARR_ERROR_NO_DEVICE);
    cr_assert(strstr(gpuarr_last_error(), "cuInit failed"), "%s", gpuarr_last_error());
    cr_assert(strstr(gpuarr_last_error(), "STUB"), "the driver's error is not named: %s", gpuarr_last_error());
    TEST_OK(gpuarr_device_find("any", &d));
}

/* ---- on a GPU ------------------------------------------------------------------------------ */
Test(cuda, device_info_describes_the_gpu) {
    gpuarr_device d = cuda_device(0);
    gpuarr_device_info info;
    TEST_OK(gpuarr_device_get_info(d, &info));
    cr_assert_eq(info.type, GPUARR_DEVICE_TYPE_GPU);
    cr_assert_gt(info.compute_capability_major, 0);
    cr_assert_gt(info.compute_units, 0);
    cr_assert_gt(info.clock_mhz, 0);
    cr_assert_gt(info.total_memory, (uint64_t)1 << 28);
    cr_assert_leq(info.free_memory, info.total_memory);
    cr_assert_gt(info.copy_engines, 0);
    cr_assert(info.has_pci && strlen(info.pci_bus_id) == 12, "PCI address \"%s\"", info.pci_bus_id);
    cr_assert(info.has_uuid);
    int ordinal = -1;
    TEST_OK(gpuarr_cuda_device_ordinal(d, &ordinal));
    cr_assert_eq(ordinal, 0);
    /* the same GPU through OpenCL (NVIDIA's driver) is linked, and counted once */
    if (info.same_as.id) {
        gpuarr_device_info other;
        TEST_OK(gpuarr_device_get_info(info.same_as, &other));
        cr_assert_eq(other.backend, GPUARR_BACKEND_OPENCL);
        cr_assert_eq(other.same_as.id, d.id);
        gpuarr_device gpu;
        TEST_OK(gpuarr_device_find("gpu", &gpu));
        cr_assert_neq(gpu.id, other.device.id, "gpu picked the OpenCL view of a CUDA GPU");
    }
}

Test(cuda, casts_run_from_the_committed_ptx) {
    reinit_with("GPUARR_CUDA_KERNELS", "ptx");
    cast_on_the_gpu(cuda_device(0));
}

Test(cuda, casts_run_from_nvrtc) {
    gpuarr_shutdown();
    setenv_or_die("GPUARR_CUDA_KERNELS", "nvrtc");
    setenv_or_die("GPUARR_CACHE_DIR", "off");
    TEST_OK(gpuarr_init(NULL));
    gpuarr_device d = cuda_device(0);
    float x[4] = {1, 2, 3, 4};
    int64_t shape[1] = {4};
    gpuarr_array a, b;
    TEST_OK(gpuarr_from_host(d, x, 1, shape, &a));
    gpuarr_result r = gpuarr_convert(a, d, GPUARR_F16, &b);
    if (r != GPUARR_OK && strstr(gpuarr_last_error(), "NVRTC not found")) test_skip("%s", gpuarr_last_error());
    TEST_OK(r);
    TEST_OK(gpuarr_release(a));
    TEST_OK(gpuarr_release(b));
    cast_on_the_gpu(d);
}

/* The cache file "cuda-<key>.cubin" in dir. */
static void cubin_file(const char *dir, char *out, size_t cap) {
    DIR *dd = opendir(dir);
    cr_assert_not_null(dd, "%s", dir);
    out[0] = '\0';
    for (struct dirent *e; (e = readdir(dd));)
        if (strncmp(e->d_name, "cuda-", 5) == 0 && strstr(e->d_name, ".cubin")) snprintf(out, cap, "%s/%s", dir, e->d_name);
    closedir(dd);
    cr_assert(out[0], "no cubin in %s", dir);
}

static uint64_t fnv1a(const unsigned char *p, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

static void cast_f32_to_f16(gpuarr_device d) {
    float x[4] = {1, 2, 3, 4};
    int64_t shape[1] = {4};
    gpuarr_array a, b;
    TEST_OK(gpuarr_from_host(d, x, 1, shape, &a));
    gpuarr_result r = gpuarr_convert(a, d, GPUARR_F16, &b);
    if (r != GPUARR_OK && strstr(gpuarr_last_error(), "NVRTC not found")) test_skip("%s", gpuarr_last_error());
    TEST_OK(r);
    expect_f32_to_f16(b, x, 4);
    TEST_OK(gpuarr_release(a));
    TEST_OK(gpuarr_release(b));
}

/* A cached cubin whose header checks out but that the driver refuses (not a cubin of this GPU) is
   compiled again and replaced, instead of failing every cast. */
Test(cuda, a_cached_cubin_the_driver_refuses_is_compiled_again_and_replaced) {
    char dir[64], file[512];
    snprintf(dir, sizeof dir, "/tmp/gpuarr-test-cubin-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
    gpuarr_shutdown();
    setenv_or_die("GPUARR_CUDA_KERNELS", "nvrtc");
    setenv_or_die("GPUARR_CACHE_DIR", dir);
    TEST_OK(gpuarr_init(NULL));
    gpuarr_device d = cuda_device(0);
    cast_f32_to_f16(d);
    cubin_file(dir, file, sizeof file);
    struct { /* the cache header of the manual (KERNEL CACHE) */
        char magic[16];
        uint32_t version, header_size;
        uint64_t size, hash, key;
    } h;
    static const unsigned char junk[64] = "this is no cubin of any GPU";
    memset(&h, 0, sizeof h);
    memcpy(h.magic, "gpuarr-cache\n\0\0", 16);
    h.version = 1;
    h.header_size = sizeof h;
    h.size = sizeof junk;
    h.hash = fnv1a(junk, sizeof junk);
    h.key = strtoull(strrchr(file, '/') + 1 + 5, NULL, 16);
    FILE *f = fopen(file, "wb");
    cr_assert_not_null(f);
    fwrite(&h, 1, sizeof h, f);
    fwrite(junk, 1, sizeof junk, f);
    fclose(f);
    gpuarr_shutdown();
    TEST_OK(gpuarr_init(NULL));
    cast_f32_to_f16(cuda_device(0));
    unsigned char head[sizeof h + 4];
    f = fopen(file, "rb");
    cr_assert_not_null(f);
    cr_assert_eq(fread(head, 1, sizeof head, f), sizeof head);
    fclose(f);
    cr_assert(memcmp(head + sizeof h, "\x7f" "ELF", 4) == 0, "%s still holds the refused cubin", file);
    unsetenv("GPUARR_CUDA_KERNELS");
    unsetenv("GPUARR_CACHE_DIR");
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    cr_assert_eq(system(cmd), 0);
}

Test(cuda, without_any_kernel_a_cast_fails_with_both_reasons_and_copies_still_work) {
    gpuarr_shutdown();
    setenv_or_die("GPUARR_CUDA_KERNELS", "nvrtc");
    setenv_or_die("GPUARR_NVRTC_LIBRARY", "/nonexistent/libnvrtc.so");
    setenv_or_die("GPUARR_CACHE_DIR", "off");
    TEST_OK(gpuarr_init(NULL));
    gpuarr_device d = cuda_device(0);
    float x[4] = {1, 2, 3, 4}, y[4];
    int64_t shape[1] = {4};
    gpuarr_array a, b = {0xdeadbeefu};
    TEST_OK(gpuarr_from_host(d, x, 1, shape, &a));
    cr_assert_eq(gpuarr_convert(a, d, GPUARR_F16, &b), GPUARR_ERROR_BACKEND);
    cr_assert(strstr(gpuarr_last_error(), "NVRTC") && strstr(gpuarr_last_error(), "f32->f16"), "%s", gpuarr_last_error());
    cr_assert_eq(b.id, 0xdeadbeefu);
    TEST_OK(gpuarr_to_host(a, y, 4));
    cr_assert(y[3] == 4.0f);
    TEST_OK(gpuarr_release(a));
}

static void count_release(void *data, void *user) {
    (void)data;
    ++*(int *)user;
}

Test(cuda, native_pointers_and_streams_go_both_ways_without_taking_ownership) {
    gpuarr_device d = cuda_device(0);
    enum { N = 1000 };
    float x[N];
    for (int i = 0; i < N; i++) x[i] = (float)i * 0.5f;
    int64_t shape[1] = {N}, half[1] = {N / 2};
    gpuarr_array a, w;
    TEST_OK(gpuarr_from_host(d, x, 1, shape, &a));
    void *p = NULL;
    TEST_OK(gpuarr_cuda_ptr(a, &p));
    cr_assert(p);
    int released = 0;
    /* the second half of a's memory, as an array of its own */
    TEST_OK(gpuarr_cuda_wrap_ptr(d, (char *)p + N / 2 * sizeof(float), GPUARR_F32, 1, half, count_release, &released, &w));
    float y[N / 2];
    TEST_OK(gpuarr_to_host(w, y, N / 2));
    cr_assert(y[0] == x[N / 2] && y[N / 2 - 1] == x[N - 1]);
    TEST_OK(gpuarr_release(w));
    cr_assert_eq(released, 1);
    /* bad pointers are refused, and the caller keeps them */
    cr_assert_eq(gpuarr_cuda_wrap_ptr(d, x, GPUARR_F32, 1, shape, count_release, &released, &w), GPUARR_ERROR_INVALID_ARGUMENT);
    cr_assert(strstr(gpuarr_last_error(), "not CUDA device memory"), "%s", gpuarr_last_error());
    /* p lies inside a pool segment, so only an array longer than any segment overruns it */
    int64_t huge[1] = {(int64_t)1 << 32};
    cr_assert_eq(gpuarr_cuda_wrap_ptr(d, (char *)p + 4, GPUARR_F32, 1, huge, count_release, &released, &w), GPUARR_ERROR_INVALID_ARGUMENT);
    cr_assert(strstr(gpuarr_last_error(), "the array needs"), "%s", gpuarr_last_error());
    cr_assert_eq(gpuarr_cuda_wrap_ptr(d, (char *)p + 2, GPUARR_F32, 1, half, count_release, &released, &w), GPUARR_ERROR_INVALID_ARGUMENT);
    cr_assert(strstr(gpuarr_last_error(), "aligned"), "%s", gpuarr_last_error());
    cr_assert_eq(released, 1);
    /* a gpuarr stream's CUstream, wrapped again, orders work with the original */
    gpuarr_stream s, again, legacy;
    struct CUstream_st *native = NULL;
    TEST_OK(gpuarr_stream_create(d, 0, &s));
    TEST_OK(gpuarr_cuda_stream(s, &native));
    cr_assert(native);
    TEST_OK(gpuarr_cuda_wrap_stream(d, native, &again));
    gpuarr_array b;
    TEST_OK(gpuarr_convert_async(a, d, GPUARR_F64, again, &b));
    TEST_OK(gpuarr_stream_destroy(again)); /* does not destroy the CUstream s still uses */
    TEST_OK(gpuarr_stream_sync(s));
    double z[N];
    TEST_OK(gpuarr_to_host(b, z, N));
    cr_assert(z[N - 1] == (double)x[N - 1]);
    TEST_OK(gpuarr_cuda_wrap_stream(d, NULL, &legacy)); /* the legacy default stream */
    TEST_OK(gpuarr_stream_sync(legacy));
    TEST_OK(gpuarr_stream_destroy(legacy));
    /* b was made on `again`, whose CUstream goes with s: releasing b afterwards must not touch it
       (an H100's driver crashed in cuEventRecord on it; the fake driver counts such calls) */
    unsigned long long (*destroyed_uses)(void) = NULL;
    const char *lib = getenv("GPUARR_CUDA_LIBRARY");
    void *driver = dlopen(lib ? lib : "libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (driver) *(void **)&destroyed_uses = dlsym(driver, "fake_cuda_destroyed_stream_uses");
    unsigned long long before = destroyed_uses ? destroyed_uses() : 0;
    TEST_OK(gpuarr_stream_destroy(s));
    TEST_OK(gpuarr_release(a));
    TEST_OK(gpuarr_release(b));
    if (destroyed_uses) cr_assert_eq(destroyed_uses(), before, "a destroyed CUstream was used %llu times", destroyed_uses() - before);
}

/* GPUARR_WITH_DEVICE makes the primary context current and puts the previous one back. */
Test(cuda, a_device_scope_makes_the_primary_context_current_and_restores_it) {
    gpuarr_device d = cuda_device(0);
    void *driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    cr_assert(driver, "a CUDA device without libcuda.so.1?");
    int (*get_current)(struct CUctx_st **) = NULL;
    void *sym = dlsym(driver, "cuCtxGetCurrent");
    memcpy(&get_current, &sym, sizeof sym);
    cr_assert(get_current);
    struct CUctx_st *primary = NULL, *before = NULL, *inside = NULL, *after = NULL;
    TEST_OK(gpuarr_cuda_context(d, &primary));
    get_current(&before);
    GPUARR_WITH_DEVICE(d) { get_current(&inside); }
    get_current(&after);
    cr_assert_eq(inside, primary);
    cr_assert_eq(after, before);
    /* gpuarr's own calls leave the thread's context as they found it */
    float x[2] = {1, 2};
    int64_t shape[1] = {2};
    gpuarr_array a;
    TEST_OK(gpuarr_from_host(d, x, 1, shape, &a));
    get_current(&after);
    cr_assert_eq(after, before);
    TEST_OK(gpuarr_release(a));
    dlclose(driver);
}

/* gpuarr_set_current_device keeps the device's primary context current (as cudaSetDevice does)
   until the thread's current device changes; {0}, another device and the last gpuarr_shutdown
   put back the context the thread had before. */
Test(cuda, set_current_device_puts_the_threads_context_back_on_any_and_at_shutdown) {
    gpuarr_device d = cuda_device(0);
    void *driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    cr_assert(driver, "a CUDA device without libcuda.so.1?");
    int (*get_current)(struct CUctx_st **) = NULL;
    int (*set_current)(struct CUctx_st *) = NULL;
    void *sym = dlsym(driver, "cuCtxGetCurrent");
    memcpy(&get_current, &sym, sizeof sym);
    sym = dlsym(driver, "cuCtxSetCurrent");
    memcpy(&set_current, &sym, sizeof sym);
    cr_assert(get_current && set_current);
    struct CUctx_st *original = NULL, *primary = NULL, *theirs = NULL, *now = NULL;
    get_current(&original);
    TEST_OK(gpuarr_cuda_context(d, &primary));
    gpuarr_device d1;
    if (gpuarr_device_find("cuda:1", &d1) == GPUARR_OK) TEST_OK(gpuarr_cuda_context(d1, &theirs)); /* the thread's own */
    cr_assert_eq(set_current(theirs), 0);
    TEST_OK(gpuarr_set_current_device(d));
    get_current(&now);
    cr_assert_eq(now, primary, "set_current_device did not make cuda:0's context current");
    TEST_OK(gpuarr_set_current_device((gpuarr_device){0}));
    get_current(&now);
    cr_assert_eq(now, theirs, "after set_current_device({0}) the context is %p, not the thread's %p", (void *)now, (void *)theirs);
    TEST_OK(gpuarr_set_current_device(d));
    TEST_OK(gpuarr_set_current_device(gpuarr_host()));
    get_current(&now);
    cr_assert_eq(now, theirs, "after set_current_device(host) the context is %p, not the thread's %p", (void *)now, (void *)theirs);
    TEST_OK(gpuarr_set_current_device(d));
    gpuarr_shutdown();
    get_current(&now);
    cr_assert_eq(now, theirs, "after gpuarr_shutdown the context is %p, not the thread's %p", (void *)now, (void *)theirs);
    set_current(original);
    dlclose(driver);
}

/* Pageable uploads and downloads of 1 MiB and more go through the pinned ring. */
Test(cuda, large_pageable_transfers_are_staged_and_exact) {
    gpuarr_device d = cuda_device(0);
    enum { N = 5000003 };
    double *src = malloc(sizeof(double) * N);
    float *back = malloc(sizeof(float) * N);
    cr_assert(src && back);
    test_rng rng = {9};
    test_fill_random(GPUARR_F64, src, N, &rng);
    int64_t shape[1] = {N};
    gpuarr_array h, f;
    TEST_OK(gpuarr_wrap_host(src, GPUARR_F64, 1, shape, NULL, NULL, &h));
    TEST_OK(gpuarr_convert(h, d, GPUARR_F32, &f)); /* narrowed on the host into the chunks */
    TEST_OK(gpuarr_to_host(f, back, N));
    for (size_t i = 0; i < N; i++) {
        uint64_t want = ref_cast_bits(GPUARR_F64, test_f64_bits(src[i]), GPUARR_F32);
        cr_assert_eq(test_f32_bits(back[i]), want, "element %zu", i);
    }
    gpuarr_pool_stats pin;
    TEST_OK(gpuarr_pool_get_pinned_stats(d, &pin));
    cr_assert_gt(pin.total_allocations, 0, "not staged");
    TEST_OK(gpuarr_release(h));
    TEST_OK(gpuarr_release(f));
    free(src);
    free(back);
}

Test(cuda, two_gpus_copy_peer_to_peer_or_through_the_host) {
    gpuarr_device d0 = cuda_device(0);
    gpuarr_device d1;
    if (gpuarr_device_find("cuda:1", &d1) != GPUARR_OK) test_skip("one GPU only: %s", gpuarr_last_error());
    enum { N = 3000001 };
    float *x = malloc(sizeof(float) * N);
    cr_assert(x);
    test_rng rng = {5};
    test_fill_random(GPUARR_F32, x, N, &rng);
    int64_t shape[1] = {N};
    gpuarr_array a, b;
    TEST_OK(gpuarr_from_host(d0, x, 1, shape, &a));
    TEST_OK(gpuarr_convert(a, d1, GPUARR_F16, &b)); /* narrowed on cuda:0, then copied */
    expect_f32_to_f16(b, x, N);
    TEST_OK(gpuarr_release(a));
    TEST_OK(gpuarr_release(b));
    free(x);
}

/* CUDA <-> OpenCL through pinned host memory, with a dtype change on each hop, async on streams
   of both devices (the OpenCL device is PoCL's in make test). */
Test(cuda, conversions_between_cuda_and_opencl_are_exact_on_every_hop) {
    gpuarr_device g = cuda_device(0), cl;
    if (gpuarr_device_find("opencl:0", &cl) != GPUARR_OK) test_skip("no OpenCL device: %s", gpuarr_last_error());
    enum { N = 3000017 };
    float *x = malloc(sizeof(float) * N);
    double *back = malloc(sizeof(double) * N);
    cr_assert(x && back);
    for (size_t i = 0; i < N; i++) x[i] = (float)((int)(i % 4001) - 2000); /* exact in i16, f16 and wider */
    int64_t shape[1] = {N};
    gpuarr_array a, on_cl, again, host;
    gpuarr_stream sg, sc;
    TEST_OK(gpuarr_stream_create(g, 0, &sg));
    TEST_OK(gpuarr_stream_create(cl, 0, &sc));
    TEST_OK(gpuarr_from_host(g, x, 1, shape, &a));
    TEST_OK(gpuarr_convert_async(a, cl, GPUARR_I16, sg, &on_cl));     /* narrowed on the GPU, then across */
    TEST_OK(gpuarr_convert_async(on_cl, g, GPUARR_F16, sc, &again));  /* i16 -> f16 on either side */
    TEST_OK(gpuarr_convert_async(again, gpuarr_host(), GPUARR_F64, sg, &host));
    TEST_OK(gpuarr_stream_sync(sg));
    TEST_OK(gpuarr_to_host(host, back, N));
    for (size_t i = 0; i < N; i++)
        if (back[i] != (double)x[i]) cr_assert_fail("element %zu: %g, want %g", i, back[i], (double)x[i]);
    gpuarr_array_info info;
    TEST_OK(gpuarr_array_get_info(on_cl, &info));
    cr_assert_eq(info.device.id, cl.id);
    TEST_OK(gpuarr_release(a));
    TEST_OK(gpuarr_release(on_cl));
    TEST_OK(gpuarr_release(again));
    TEST_OK(gpuarr_release(host));
    TEST_OK(gpuarr_stream_destroy(sg));
    TEST_OK(gpuarr_stream_destroy(sc));
    free(x);
    free(back);
}

/* ---- async calls never wait: on the fake driver, where queued work runs only when waited for ---- */
typedef unsigned long long (*ops_run_fn)(void);

/* The fake driver's count of operations run, or a skip on a real driver (whose work may run at
   once, so the count would prove nothing). */
static ops_run_fn fake_ops_counter(void) {
    const char *lib = getenv("GPUARR_CUDA_LIBRARY");
    void *driver = dlopen(lib ? lib : "libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    ops_run_fn fn = NULL;
    if (driver) *(void **)&fn = dlsym(driver, "fake_cuda_ops_run");
    if (!fn) test_skip("the driver is not tests/fake_cuda (no fake_cuda_ops_run)");
    return fn;
}

/* out (dtype t) against the reference cast of src (dtype st), every element. */
static void expect_cast(gpuarr_array out, gpuarr_dtype st, const void *src, gpuarr_dtype t, size_t n, const char *what) {
    unsigned char *got = malloc(n * 8);
    cr_assert(got);
    TEST_OK(gpuarr_to_host_as(out, t, got, n));
    for (size_t i = 0; i < n; i++) {
        uint64_t want = ref_cast_bits(st, test_load_bits(st, src, i), t), have = test_load_bits(t, got, i);
        if (have != want) cr_assert_fail("%s: element %zu: got 0x%llx, want 0x%llx", what, i, (unsigned long long)have, (unsigned long long)want);
    }
    free(got);
}

/* gpuarr_convert_async(src, dst, t) must return before any of its work has run; then the result
   is exact once waited for. */
static void expect_async_returns_first(ops_run_fn ops_run, gpuarr_array src, gpuarr_dtype st, const void *data, gpuarr_device dst,
                                       gpuarr_dtype t, size_t n, const char *what) {
    gpuarr_array out;
    unsigned long long before = ops_run();
    TEST_OK(gpuarr_convert_async(src, dst, t, (gpuarr_stream){0}, &out));
    unsigned long long after = ops_run();
    cr_assert_eq(after, before, "%s: %llu operations ran inside gpuarr_convert_async", what, after - before);
    expect_cast(out, st, data, t, n, what);
    TEST_OK(gpuarr_release(out));
}

Test(cuda, async_conversions_return_before_any_of_their_work_runs) {
    gpuarr_device g = cuda_device(0), g1 = {0}, cl = {0}, host = gpuarr_host();
    ops_run_fn ops_run = fake_ops_counter();
    enum { N = (1 << 20) + 7 }; /* 1 MiB even as u8: where synchronous calls stage */
    unsigned char *u8 = malloc(N);
    double *f64 = malloc(sizeof(double) * N);
    cr_assert(u8 && f64);
    test_rng rng = {77};
    test_fill_random(GPUARR_U8, u8, N, &rng);
    for (size_t i = 0; i < N; i++) f64[i] = (double)((int)(i % 70001) - 35000) / 8.0; /* exact in f32 */
    int64_t shape[1] = {N};
    gpuarr_array h8, h64, g8, g64;
    TEST_OK(gpuarr_from_host(host, u8, 1, shape, &h8));
    TEST_OK(gpuarr_from_host(host, f64, 1, shape, &h64));
    TEST_OK(gpuarr_from_host(g, u8, 1, shape, &g8));
    TEST_OK(gpuarr_from_host(g, f64, 1, shape, &g64));
    expect_async_returns_first(ops_run, h8, GPUARR_U8, u8, g, GPUARR_U8, N, "host u8 -> cuda:0 u8");
    expect_async_returns_first(ops_run, h64, GPUARR_F64, f64, g, GPUARR_F32, N, "host f64 -> cuda:0 f32 (narrowed on the host)");
    expect_async_returns_first(ops_run, h8, GPUARR_U8, u8, g, GPUARR_F64, N, "host u8 -> cuda:0 f64 (widened on the GPU)");
    expect_async_returns_first(ops_run, g8, GPUARR_U8, u8, host, GPUARR_U8, N, "cuda:0 u8 -> host u8");
    expect_async_returns_first(ops_run, g64, GPUARR_F64, f64, host, GPUARR_F16, N, "cuda:0 f64 -> host f16 (narrowed on the GPU)");
    expect_async_returns_first(ops_run, g8, GPUARR_U8, u8, host, GPUARR_F64, N, "cuda:0 u8 -> host f64 (widened on the host)");
    enum { BIG = (5 << 20) + 3 }; /* 40 MiB of f64: more chunks than the ring has slots */
    double *big = malloc(sizeof(double) * BIG);
    cr_assert(big);
    for (size_t i = 0; i < BIG; i++) big[i] = (double)i * 0.5;
    int64_t big_shape[1] = {BIG};
    gpuarr_array hbig, gbig;
    TEST_OK(gpuarr_from_host(host, big, 1, big_shape, &hbig));
    TEST_OK(gpuarr_from_host(g, big, 1, big_shape, &gbig));
    expect_async_returns_first(ops_run, hbig, GPUARR_F64, big, g, GPUARR_F64, BIG, "host f64 -> cuda:0 f64, 40 MiB");
    expect_async_returns_first(ops_run, gbig, GPUARR_F64, big, host, GPUARR_F64, BIG, "cuda:0 f64 -> host f64, 40 MiB");
    TEST_OK(gpuarr_release(hbig));
    TEST_OK(gpuarr_release(gbig));
    free(big);
    if (gpuarr_device_find("cuda:1", &g1) == GPUARR_OK) { /* peer copies, or through the host with FAKE_CUDA_PEER=0 */
        expect_async_returns_first(ops_run, g8, GPUARR_U8, u8, g1, GPUARR_F64, N, "cuda:0 u8 -> cuda:1 f64");
        expect_async_returns_first(ops_run, g64, GPUARR_F64, f64, g1, GPUARR_F32, N, "cuda:0 f64 -> cuda:1 f32");
    }
    if (gpuarr_device_find("opencl:0", &cl) == GPUARR_OK) { /* through the host to another backend */
        gpuarr_array c8;
        expect_async_returns_first(ops_run, g64, GPUARR_F64, f64, cl, GPUARR_F32, N, "cuda:0 f64 -> opencl:0 f32");
        expect_async_returns_first(ops_run, g8, GPUARR_U8, u8, cl, GPUARR_I32, N, "cuda:0 u8 -> opencl:0 i32");
        TEST_OK(gpuarr_from_host(cl, u8, 1, shape, &c8));
        expect_async_returns_first(ops_run, c8, GPUARR_U8, u8, g, GPUARR_F64, N, "opencl:0 u8 -> cuda:0 f64");
        TEST_OK(gpuarr_release(c8));
    }
    TEST_OK(gpuarr_release(h8));
    TEST_OK(gpuarr_release(h64));
    TEST_OK(gpuarr_release(g8));
    TEST_OK(gpuarr_release(g64));
    free(u8);
    free(f64);
}

/* {0} is the calling thread's own default stream: a different CUstream on each thread. */
static void *probe_default_cu_stream(void *arg) {
    struct CUstream_st **out = arg;
    gpuarr_device d;
    if (gpuarr_device_find("cuda:0", &d) == GPUARR_OK && gpuarr_set_current_device(d) == GPUARR_OK)
        gpuarr_cuda_stream((gpuarr_stream){0}, out);
    return NULL;
}

Test(cuda, each_thread_has_its_own_default_stream) {
    gpuarr_device d = cuda_device(0);
    struct CUstream_st *mine = NULL, *again = NULL, *theirs = NULL;
    TEST_OK(gpuarr_set_current_device(d));
    TEST_OK(gpuarr_cuda_stream((gpuarr_stream){0}, &mine));
    TEST_OK(gpuarr_cuda_stream((gpuarr_stream){0}, &again));
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, probe_default_cu_stream, &theirs), 0);
    pthread_join(t, NULL);
    TEST_OK(gpuarr_set_current_device((gpuarr_device){0}));
    cr_assert(mine && theirs, "no default stream");
    cr_expect_eq(mine, again, "two default streams on one thread");
    cr_expect_neq(mine, theirs, "two threads share a default stream");
}

/* A pinned host array (gpuarr_empty_pinned) and its GPU: every copy, synchronous or async, is
   one DMA operation on the stream (no staging chunks, no host functions), and async ones return
   before it runs; the same copies from pageable memory take more operations. Counted on the fake
   driver, which runs queued work only when waited for. */
static unsigned long long copies_there_and_back(ops_run_fn ops_run, gpuarr_array from, gpuarr_array dev, gpuarr_array to, gpuarr_stream s,
                                                const char *what) {
    unsigned long long start = ops_run();
    TEST_OK(gpuarr_copy_async(dev, from, s));
    cr_assert_eq(ops_run(), start, "%s: gpuarr_copy_async ran work before returning", what);
    TEST_OK(gpuarr_copy_async(to, dev, s));
    TEST_OK(gpuarr_stream_sync(s));
    return ops_run() - start;
}

Test(cuda, pinned_host_arrays_copy_to_and_from_their_gpu_in_one_dma_each) {
    gpuarr_device g = cuda_device(0), host = gpuarr_host();
    ops_run_fn ops_run = fake_ops_counter();
    enum { N = (5 << 20) + 3 }; /* 20 MiB of f32: a pageable copy of it takes several staging chunks */
    int64_t shape[1] = {N};
    gpuarr_pool_stats before, during;
    TEST_OK(gpuarr_pool_get_pinned_stats(g, &before));
    gpuarr_array pinned, dev, back, pageable, pageable_back;
    TEST_OK(gpuarr_empty_pinned(g, GPUARR_F32, 1, shape, &pinned));
    TEST_OK(gpuarr_empty(g, GPUARR_F32, 1, shape, &dev));
    TEST_OK(gpuarr_empty_pinned(g, GPUARR_F32, 1, shape, &back));
    TEST_OK(gpuarr_empty(host, GPUARR_F32, 1, shape, &pageable));
    TEST_OK(gpuarr_empty(host, GPUARR_F32, 1, shape, &pageable_back));
    gpuarr_array_info info;
    TEST_OK(gpuarr_array_get_info(pinned, &info));
    cr_assert(info.pinned && info.host_accessible && info.device.id == host.id, "not a pinned host array");
    float *p, *q, *pp;
    TEST_OK(gpuarr_host_data(pinned, (void **)&p));
    TEST_OK(gpuarr_host_data(back, (void **)&q));
    TEST_OK(gpuarr_host_data(pageable, (void **)&pp));
    for (size_t i = 0; i < N; i++) p[i] = pp[i] = (float)i * 0.25f;
    gpuarr_stream s;
    TEST_OK(gpuarr_stream_create(g, 0, &s));

    TEST_OK(gpuarr_pool_get_pinned_stats(g, &before));
    unsigned long long pinned_ops = copies_there_and_back(ops_run, pinned, dev, back, s, "pinned");
    TEST_OK(gpuarr_pool_get_pinned_stats(g, &during));
    cr_expect_eq(during.total_allocated_bytes, before.total_allocated_bytes, "copies of pinned arrays took %llu bytes of pinned staging",
                 (unsigned long long)(during.total_allocated_bytes - before.total_allocated_bytes));
    cr_assert_eq(memcmp(p, q, sizeof(float) * N), 0, "pinned -> cuda:0 -> pinned changed the data");
    unsigned long long pageable_ops = copies_there_and_back(ops_run, pageable, dev, pageable_back, s, "pageable");
    cr_expect_lt(pinned_ops, pageable_ops, "pinned copies ran %llu operations, pageable ones %llu: pinned ones were staged too",
                 pinned_ops, pageable_ops);
    cr_expect_leq(pinned_ops, 4ull, "two pinned copies ran as %llu operations (2 DMAs and their 2 ready events expected)", pinned_ops);

    memset(q, 0, sizeof(float) * N); /* synchronous range writes and reads from pinned memory: no staging either */
    TEST_OK(gpuarr_pool_get_pinned_stats(g, &before));
    TEST_OK(gpuarr_write(dev, 0, N, GPUARR_F32, p));
    TEST_OK(gpuarr_read(dev, 0, N, GPUARR_F32, q));
    TEST_OK(gpuarr_pool_get_pinned_stats(g, &during));
    cr_expect_eq(during.total_allocated_bytes, before.total_allocated_bytes, "a write and a read of pinned memory were staged");
    cr_assert_eq(memcmp(p, q, sizeof(float) * N), 0, "gpuarr_write/gpuarr_read through pinned memory changed the data");

    TEST_OK(gpuarr_stream_destroy(s));
    gpuarr_array all[5] = {pinned, dev, back, pageable, pageable_back};
    for (int i = 0; i < 5; i++) TEST_OK(gpuarr_release(all[i]));
    TEST_OK(gpuarr_pool_get_pinned_stats(g, &during));
    cr_expect_eq(during.allocated_bytes, 0ull, "the pinned arrays' memory did not go back to the pinned pool (%llu bytes left)",
                 (unsigned long long)during.allocated_bytes);
}

/* ---- a stream's host functions and an event recorded between them (tests/fuzz/corpus/api/
   api-batch-cuda-opencl-host-fn-wait-cycle) ---- */
/* Stream s runs host function first, then the record of event e, then host function second;
   second returns only once another thread's cuEventSynchronize(e) has. The driver completes e
   after `first` whatever runs later on s, so that wait must return while `second` runs. The fake
   driver runs s's queue on the thread that syncs it: its cuEventSynchronize, asleep behind the
   running `first`, used to wake to `second` running and wait for it too (a deadlock; gpuarr met
   it as a CUDA host function waiting for an OpenCL marker behind an OpenCL host call that waited
   for an event of that CUDA stream recorded before the host function). */
typedef struct host_fn_order {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    bool first_running, waiter_calling, waiter_done, second_timed_out;
    int sync_result;
    struct CUctx_st *ctx;
    struct CUevent_st *event;
    int (*set_current)(struct CUctx_st *);
    int (*event_sync)(struct CUevent_st *);
} host_fn_order;

/* Waits (the lock held) until *flag, for at most `seconds`; false on timeout. */
static bool host_fn_order_wait(host_fn_order *o, const bool *flag, int seconds) {
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += seconds;
    while (!*flag)
        if (pthread_cond_timedwait(&o->cond, &o->lock, &until) != 0) return *flag;
    return true;
}

static void host_fn_order_first(void *user) {
    host_fn_order *o = user;
    pthread_mutex_lock(&o->lock);
    o->first_running = true;
    pthread_cond_broadcast(&o->cond);
    host_fn_order_wait(o, &o->waiter_calling, 10);
    pthread_mutex_unlock(&o->lock);
    struct timespec nap = {0, 200 * 1000 * 1000}; /* the waiter gets into cuEventSynchronize, behind this function */
    nanosleep(&nap, NULL);
}

static void host_fn_order_second(void *user) {
    host_fn_order *o = user;
    pthread_mutex_lock(&o->lock);
    o->second_timed_out = !host_fn_order_wait(o, &o->waiter_done, 10);
    pthread_mutex_unlock(&o->lock);
}

static void *host_fn_order_waiter(void *user) {
    host_fn_order *o = user;
    o->set_current(o->ctx);
    pthread_mutex_lock(&o->lock);
    host_fn_order_wait(o, &o->first_running, 10);
    o->waiter_calling = true;
    pthread_cond_broadcast(&o->cond);
    pthread_mutex_unlock(&o->lock);
    int r = o->event_sync(o->event);
    pthread_mutex_lock(&o->lock);
    o->sync_result = r;
    o->waiter_done = true;
    pthread_cond_broadcast(&o->cond);
    pthread_mutex_unlock(&o->lock);
    return NULL;
}

Test(cuda, an_event_recorded_between_two_host_functions_completes_while_the_second_runs, .timeout = 60) {
    gpuarr_device d = cuda_device(0);
    const char *lib = getenv("GPUARR_CUDA_LIBRARY");
    void *driver = dlopen(lib ? lib : "libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    cr_assert(driver, "a CUDA device without its driver loaded?");
    int (*get_current)(struct CUctx_st **) = NULL;
    int (*stream_create)(struct CUstream_st **, unsigned int) = NULL;
    int (*stream_sync)(struct CUstream_st *) = NULL;
    int (*stream_destroy)(struct CUstream_st *) = NULL;
    int (*launch_host_fn)(struct CUstream_st *, void (*)(void *), void *) = NULL;
    int (*event_create)(struct CUevent_st **, unsigned int) = NULL;
    int (*event_record)(struct CUevent_st *, struct CUstream_st *) = NULL;
    int (*event_destroy)(struct CUevent_st *) = NULL;
    host_fn_order o;
    memset(&o, 0, sizeof o);
    struct {
        const char *name;
        void *fn;
    } syms[] = {{"cuCtxGetCurrent", &get_current},      {"cuCtxSetCurrent", &o.set_current},  {"cuStreamCreate", &stream_create},
                {"cuStreamSynchronize", &stream_sync},  {"cuStreamDestroy_v2", &stream_destroy}, {"cuLaunchHostFunc", &launch_host_fn},
                {"cuEventCreate", &event_create},       {"cuEventRecord", &event_record},     {"cuEventSynchronize", &o.event_sync},
                {"cuEventDestroy_v2", &event_destroy}};
    for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++) {
        void *sym = dlsym(driver, syms[i].name);
        cr_assert(sym, "the driver has no %s", syms[i].name);
        memcpy(syms[i].fn, &sym, sizeof sym);
    }
    struct CUctx_st *before = NULL;
    struct CUstream_st *s = NULL;
    get_current(&before);
    TEST_OK(gpuarr_cuda_context(d, &o.ctx));
    cr_assert_eq(o.set_current(o.ctx), 0);
    cr_assert_eq(stream_create(&s, 1u /* CU_STREAM_NON_BLOCKING */), 0);
    cr_assert_eq(event_create(&o.event, 2u /* CU_EVENT_DISABLE_TIMING */), 0);
    pthread_mutex_init(&o.lock, NULL);
    pthread_cond_init(&o.cond, NULL);
    cr_assert_eq(launch_host_fn(s, host_fn_order_first, &o), 0);
    cr_assert_eq(event_record(o.event, s), 0);
    cr_assert_eq(launch_host_fn(s, host_fn_order_second, &o), 0);
    pthread_t waiter;
    cr_assert_eq(pthread_create(&waiter, NULL, host_fn_order_waiter, &o), 0);
    cr_assert_eq(stream_sync(s), 0); /* on the fake driver this thread runs `first`, the record and `second` */
    pthread_join(waiter, NULL);
    cr_expect_eq(o.sync_result, 0, "cuEventSynchronize: %d", o.sync_result);
    cr_expect(!o.second_timed_out, "cuEventSynchronize of an event recorded before a host function waited for that host function");
    cr_assert_eq(event_destroy(o.event), 0);
    cr_assert_eq(stream_destroy(s), 0);
    pthread_cond_destroy(&o.cond);
    pthread_mutex_destroy(&o.lock);
    o.set_current(before);
    dlclose(driver);
}

/* ---- stream order across threads: the driver (here, the fake one) keeps it whoever waits ---- */
typedef struct order_probe {
    pthread_mutex_t lock;
    pthread_cond_t changed;
    bool first_entered, first_may_return, first_done, second_ran_early, second_ran;
} order_probe;

/* X's host function: says it has started, then returns only when the test lets it. */
static void order_first_fn(void *user) {
    order_probe *p = (order_probe *)user;
    pthread_mutex_lock(&p->lock);
    p->first_entered = true;
    pthread_cond_broadcast(&p->changed);
    while (!p->first_may_return) pthread_cond_wait(&p->changed, &p->lock);
    p->first_done = true;
    pthread_mutex_unlock(&p->lock);
}

/* S's host function, queued after S's wait for X's: X's must be done. */
static void order_second_fn(void *user) {
    order_probe *p = (order_probe *)user;
    pthread_mutex_lock(&p->lock);
    p->second_ran_early = !p->first_done;
    p->second_ran = true;
    pthread_mutex_unlock(&p->lock);
}

struct CUevent_st;
typedef struct order_driver {
    int (*ctx_set_current)(struct CUctx_st *);
    int (*stream_create)(struct CUstream_st **, unsigned int);
    int (*stream_destroy)(struct CUstream_st *);
    int (*stream_sync)(struct CUstream_st *);
    int (*stream_wait_event)(struct CUstream_st *, struct CUevent_st *, unsigned int);
    int (*launch_host_fn)(struct CUstream_st *, void (*)(void *), void *);
    int (*event_create)(struct CUevent_st **, unsigned int);
    int (*event_destroy)(struct CUevent_st *);
    int (*event_record)(struct CUevent_st *, struct CUstream_st *);
    int (*event_sync)(struct CUevent_st *);
    struct CUctx_st *ctx;
    struct CUstream_st *s;
    struct CUevent_st *after_second;
} order_driver;

static void *order_sync_stream(void *arg) { /* thread A: runs S, and so its wait for X */
    order_driver *drv = (order_driver *)arg;
    drv->ctx_set_current(drv->ctx);
    return (void *)(intptr_t)drv->stream_sync(drv->s);
}

static void *order_sync_event(void *arg) { /* thread B: waits for S through its second op */
    order_driver *drv = (order_driver *)arg;
    drv->ctx_set_current(drv->ctx);
    return (void *)(intptr_t)drv->event_sync(drv->after_second);
}

#define ORDER_SYM(field, name)                                                                    \
    do {                                                                                          \
        void *sym_ = dlsym(driver, name);                                                         \
        cr_assert(sym_, "the driver has no %s", name);                                            \
        memcpy(&drv.field, &sym_, sizeof sym_);                                                   \
    } while (0)

/* Stream S waits for an event of stream X, whose host function is running; meanwhile another
   thread waits for S's next op. That op must not run before the wait is over: the fake driver
   ran it at once (its stream looked idle while a wait drained another stream), which the 8-thread
   soak saw as wrong bytes (tests/fuzz: a from_host then read differing). */
Test(cuda, a_stream_waiting_for_another_runs_its_later_work_after_the_wait_whichever_thread_asks) {
    gpuarr_device d = cuda_device(0);
    const char *lib = getenv("GPUARR_CUDA_LIBRARY");
    void *driver = dlopen(lib ? lib : "libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    cr_assert(driver, "a CUDA device without its driver loaded?");
    order_driver drv;
    memset(&drv, 0, sizeof drv);
    ORDER_SYM(ctx_set_current, "cuCtxSetCurrent");
    ORDER_SYM(stream_create, "cuStreamCreate");
    ORDER_SYM(stream_destroy, "cuStreamDestroy_v2");
    ORDER_SYM(stream_sync, "cuStreamSynchronize");
    ORDER_SYM(stream_wait_event, "cuStreamWaitEvent");
    ORDER_SYM(launch_host_fn, "cuLaunchHostFunc");
    ORDER_SYM(event_create, "cuEventCreate");
    ORDER_SYM(event_destroy, "cuEventDestroy_v2");
    ORDER_SYM(event_record, "cuEventRecord");
    ORDER_SYM(event_sync, "cuEventSynchronize");
    TEST_OK(gpuarr_cuda_context(d, &drv.ctx));
    cr_assert_eq(drv.ctx_set_current(drv.ctx), 0);
    order_probe p;
    memset(&p, 0, sizeof p);
    pthread_mutex_init(&p.lock, NULL);
    pthread_cond_init(&p.changed, NULL);
    struct CUstream_st *x = NULL;
    struct CUevent_st *after_first = NULL;
    cr_assert_eq(drv.stream_create(&x, 1), 0);
    cr_assert_eq(drv.stream_create(&drv.s, 1), 0);
    cr_assert_eq(drv.event_create(&after_first, 2), 0); /* 2: CU_EVENT_DISABLE_TIMING */
    cr_assert_eq(drv.event_create(&drv.after_second, 2), 0);
    cr_assert_eq(drv.launch_host_fn(x, order_first_fn, &p), 0);
    cr_assert_eq(drv.event_record(after_first, x), 0);
    cr_assert_eq(drv.stream_wait_event(drv.s, after_first, 0), 0);
    cr_assert_eq(drv.launch_host_fn(drv.s, order_second_fn, &p), 0);
    cr_assert_eq(drv.event_record(drv.after_second, drv.s), 0);

    pthread_t a, b;
    cr_assert_eq(pthread_create(&a, NULL, order_sync_stream, &drv), 0);
    pthread_mutex_lock(&p.lock); /* X's host function runs (on A, with the fake driver): S is in its wait */
    while (!p.first_entered) pthread_cond_wait(&p.changed, &p.lock);
    pthread_mutex_unlock(&p.lock);
    cr_assert_eq(pthread_create(&b, NULL, order_sync_event, &drv), 0);
    struct timespec nap = {0, 200 * 1000 * 1000}; /* time for B to run S's next op, were it free to */
    nanosleep(&nap, NULL);
    pthread_mutex_lock(&p.lock);
    bool early = p.second_ran;
    p.first_may_return = true;
    pthread_cond_broadcast(&p.changed);
    pthread_mutex_unlock(&p.lock);
    void *ra = NULL, *rb = NULL;
    pthread_join(a, &ra);
    pthread_join(b, &rb);
    cr_expect_eq((intptr_t)ra, 0, "cuStreamSynchronize: %d", (int)(intptr_t)ra);
    cr_expect_eq((intptr_t)rb, 0, "cuEventSynchronize: %d", (int)(intptr_t)rb);
    cr_expect(p.second_ran, "S's host function never ran");
    cr_expect(!early && !p.second_ran_early, "S's host function ran while S still waited for X's (stream order broken by a second waiter)");
    drv.event_destroy(after_first);
    drv.event_destroy(drv.after_second);
    drv.stream_destroy(x);
    drv.stream_destroy(drv.s);
    pthread_cond_destroy(&p.changed);
    pthread_mutex_destroy(&p.lock);
}

/* A block reused on another stream makes that stream wait for its earlier users' work, which
   may still write it. An array nobody used on that stream (gpuarr_empty, released at once) must
   still go back in that stream's order: freed without it, the next array (another thread's, in
   the fuzz soak) got the block with no wait and the late write landed in it. Deterministic on
   the fake driver, whose streams run only when waited for. */
Test(cuda, a_block_whose_earlier_writes_are_pending_is_not_reused_before_them_via_an_unused_array) {
    gpuarr_device g = cuda_device(0);
    enum { N = 1 << 19, K = 16 }; /* 2 MiB: a segment of its own, so that no free neighbour keeps the old events */
    int64_t shape[1] = {N};
    int32_t old[K], back[K];
    for (int i = 0; i < K; i++) old[i] = 1000 + i;
    gpuarr_stream s0, s1;
    TEST_OK(gpuarr_stream_create(g, 0, &s0));
    TEST_OK(gpuarr_stream_create(g, 0, &s1));
    gpuarr_array o, e, y;
    TEST_OK(gpuarr_empty(g, GPUARR_I32, 1, shape, &o));
    TEST_OK(gpuarr_write_async(o, 0, K, GPUARR_DTYPE_INVALID, old, s0)); /* queued on s0, not run */
    TEST_OK(gpuarr_release(o));                                          /* its block: freed in s0's order */
    TEST_OK(gpuarr_set_current_stream(s1));
    TEST_OK(gpuarr_empty(g, GPUARR_I32, 1, shape, &e)); /* the block, for s1: s1 waits for s0 */
    TEST_OK(gpuarr_release(e));                          /* never used on s1 */
    gpuarr_stream none = {0};
    TEST_OK(gpuarr_set_current_stream(none));
    TEST_OK(gpuarr_zeros(g, GPUARR_I32, 1, shape, &y)); /* on the thread's default stream */
    TEST_OK(gpuarr_stream_sync(s0));                     /* the old write runs now, if it has not */
    TEST_OK(gpuarr_read(y, 0, K, GPUARR_DTYPE_INVALID, back));
    for (int i = 0; i < K; i++)
        cr_assert_eq(back[i], 0, "element %d of the zeros is %d: the old array's queued write landed in the new one", i, back[i]);
    TEST_OK(gpuarr_release(y));
    TEST_OK(gpuarr_stream_destroy(s0));
    TEST_OK(gpuarr_stream_destroy(s1));
}
