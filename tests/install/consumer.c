/* A program built against an installed gpuarr (make install-check, tests/install/check.sh): through
   pkg-config's gpuarr and CMake's gpuarr::gpuarr it compiles the implementation itself
   (CONSUMER_WITH_IMPLEMENTATION); through gpuarr-lib it links libgpuarr, shared or static, and
   includes the header alone. It does real work on the host device and exits non-zero on any
   wrong value. CONSUMER_HOW names the way it was built, for the output. */
#ifdef CONSUMER_WITH_IMPLEMENTATION
#define GPUARR_IMPLEMENTATION
#endif
#include <gpuarr.h>

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#ifndef CONSUMER_HOW
#define CONSUMER_HOW "consumer"
#endif

#define CHECK(cond)                                                                            \
    do {                                                                                       \
        if (!(cond)) {                                                                         \
            fprintf(stderr, "%s: %s:%d: %s failed: %s\n", CONSUMER_HOW, __FILE__, __LINE__, #cond, \
                    gpuarr_last_error());                                                      \
            return 1;                                                                          \
        }                                                                                      \
    } while (0)

int main(void) {
    /* the header's version and the implementation's: they differ when a program built against
       one header links a library built from another */
    CHECK(strcmp(GPUARR_VERSION_STRING, gpuarr_version_string()) == 0);
    CHECK(GPUARR_VERSION_NUMBER ==
          GPUARR_VERSION_MAJOR * 10000 + GPUARR_VERSION_MINOR * 100 + GPUARR_VERSION_PATCH);

    CHECK(gpuarr_init(NULL) == GPUARR_OK);
    gpuarr_device host = gpuarr_host();
    const float in[6] = {1.5f, -2.75f, 3e9f, 100.0f, -0.5f, 7.0f};
    /* f32 -> i32 truncates toward zero and saturates (the manual's CONVERSION RULES) */
    const int32_t want[6] = {1, -2, INT32_MAX, 100, 0, 7};
    int64_t shape[2] = {2, 3};
    gpuarr_array a, b;
    CHECK(gpuarr_empty(host, GPUARR_F32, 2, shape, &a) == GPUARR_OK);
    CHECK(gpuarr_write(a, 0, 6, GPUARR_F32, in) == GPUARR_OK);
    CHECK(gpuarr_convert(a, host, GPUARR_I32, &b) == GPUARR_OK);

    float back[6];
    int32_t got[6];
    CHECK(gpuarr_read(a, 0, 6, GPUARR_F32, back) == GPUARR_OK);
    CHECK(gpuarr_to_host(b, got, 6) == GPUARR_OK); /* typed: gpuarr__to_host_named, i32 */
    for (int i = 0; i < 6; i++) {
        CHECK(back[i] == in[i]);
        CHECK(got[i] == want[i]);
    }
    CHECK(gpuarr_fill(a, 0.25) == GPUARR_OK); /* typed: gpuarr__fill_named, f64 cast to f32 */
    CHECK(gpuarr_read(a, 0, 6, GPUARR_F32, back) == GPUARR_OK);
    for (int i = 0; i < 6; i++) CHECK(back[i] == 0.25f);

    CHECK(gpuarr_release(a) == GPUARR_OK);
    CHECK(gpuarr_release(b) == GPUARR_OK);
    gpuarr_shutdown();
    printf("%s: GPUARR_VERSION_STRING %s, gpuarr_version_string() %s, GPUARR_VERSION_NUMBER %d: "
           "f32 written, read back and converted to i32 on the host: ok\n",
           CONSUMER_HOW, GPUARR_VERSION_STRING, gpuarr_version_string(), GPUARR_VERSION_NUMBER);
    return 0;
}
