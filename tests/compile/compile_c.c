/* Compile test, C11: the header included plainly first, then again with the implementation
   (which must still work), every _Generic association, scopes and the cleanup variant. */
#define _DEFAULT_SOURCE 1 /* the plain include reads libc's feature macros: see HOW TO USE IT */
#include "gpuarr.h"
#define GPUARR_IMPLEMENTATION
#include "gpuarr.h"
#include "gpuarr.h" /* a second implementation include in one unit is ignored */

#include <stdio.h>
#include <string.h>

#define EXPECT(cond)                                                                           \
    do {                                                                                       \
        if (!(cond)) {                                                                         \
            fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #cond, gpuarr_last_error()); \
            return 1;                                                                          \
        }                                                                                      \
    } while (0)

/* Round-trips one element through the generic entry points and checks the dtype chosen. */
#define ROUND_TRIP(T, expected_dtype)                                                          \
    do {                                                                                       \
        T in[2] = {(T)1, (T)0}, out[2];                                                        \
        const T *cin = in;                                                                     \
        gpuarr_array a, b;                                                                     \
        gpuarr_array_info info;                                                                \
        EXPECT(gpuarr_from_host(host, in, 1, shape, &a) == GPUARR_OK);                         \
        EXPECT(gpuarr_from_host(host, cin, 1, shape, &b) == GPUARR_OK);                        \
        EXPECT(gpuarr_array_get_info(a, &info) == GPUARR_OK && info.dtype == (expected_dtype)); \
        EXPECT(gpuarr_to_host(b, out, 2) == GPUARR_OK && out[0] == in[0]);                     \
        gpuarr_release(a);                                                                     \
        gpuarr_release(b);                                                                     \
    } while (0)

/* GPUARR_VERSION_NUMBER: usable in #if, the formula of the three parts (which must stay below 100
   each for it to order versions), 100 for 0.1.0; main checks the string against the parts. */
#if !defined(GPUARR_VERSION_NUMBER) || \
    GPUARR_VERSION_NUMBER != GPUARR_VERSION_MAJOR * 10000 + GPUARR_VERSION_MINOR * 100 + GPUARR_VERSION_PATCH
#error "GPUARR_VERSION_NUMBER is not MAJOR * 10000 + MINOR * 100 + PATCH"
#endif
_Static_assert(GPUARR_VERSION_MINOR < 100 && GPUARR_VERSION_PATCH < 100,
               "GPUARR_VERSION_NUMBER needs minor and patch below 100");
_Static_assert(!(GPUARR_VERSION_MAJOR == 0 && GPUARR_VERSION_MINOR == 1 && GPUARR_VERSION_PATCH == 0) ||
                   GPUARR_VERSION_NUMBER == 100,
               "GPUARR_VERSION_NUMBER of 0.1.0 is 100");

static int scoped_return(gpuarr_device d) {
    GPUARR_SCOPED_DEVICE(d);
    return gpuarr_current_device().id == d.id ? 0 : 1;
}

int main(void) {
    {
        char parts[32];
        snprintf(parts, sizeof parts, "%d.%d.%d", GPUARR_VERSION_MAJOR, GPUARR_VERSION_MINOR, GPUARR_VERSION_PATCH);
        EXPECT(strcmp(parts, GPUARR_VERSION_STRING) == 0);
        EXPECT(strcmp(gpuarr_version_string(), GPUARR_VERSION_STRING) == 0);
    }
    EXPECT(gpuarr_init(NULL) == GPUARR_OK);
    gpuarr_device host = gpuarr_host();
    int64_t shape[1] = {2};
    ROUND_TRIP(bool, GPUARR_BOOL);
    ROUND_TRIP(signed char, GPUARR_I8);
    ROUND_TRIP(unsigned char, GPUARR_U8);
    ROUND_TRIP(short, GPUARR_I16);
    ROUND_TRIP(unsigned short, GPUARR_U16);
    ROUND_TRIP(int, GPUARR_I32);
    ROUND_TRIP(unsigned int, GPUARR_U32);
    ROUND_TRIP(long, sizeof(long) == 8 ? GPUARR_I64 : GPUARR_I32);
    ROUND_TRIP(unsigned long, sizeof(long) == 8 ? GPUARR_U64 : GPUARR_U32);
    ROUND_TRIP(long long, GPUARR_I64);
    ROUND_TRIP(unsigned long long, GPUARR_U64);
    ROUND_TRIP(int64_t, GPUARR_I64);
    ROUND_TRIP(uint64_t, GPUARR_U64);
    ROUND_TRIP(float, GPUARR_F32);
    ROUND_TRIP(double, GPUARR_F64);
    {
        gpuarr_f16 h[2] = {gpuarr_f16_from_float(1.5f), gpuarr_f16_from_float(0)};
        gpuarr_bf16 bh[2] = {gpuarr_bf16_from_float(-2.0f), gpuarr_bf16_from_float(0)};
        gpuarr_array a, b;
        EXPECT(gpuarr_from_host(host, h, 1, shape, &a) == GPUARR_OK);
        EXPECT(gpuarr_from_host(host, bh, 1, shape, &b) == GPUARR_OK);
        float back[2];
        EXPECT(gpuarr_to_host(a, back, 2) == GPUARR_OK && back[0] == 1.5f);
        EXPECT(gpuarr_to_host(b, back, 2) == GPUARR_OK && back[0] == -2.0f);
        gpuarr_release(a);
        gpuarr_release(b);
    }
    gpuarr_device before = gpuarr_current_device();
    GPUARR_WITH_DEVICE(host) {
        EXPECT(gpuarr_current_device().id == host.id);
        break;
    }
    EXPECT(gpuarr_current_device().id == before.id);
    EXPECT(scoped_return(host) == 0);
    EXPECT(gpuarr_current_device().id == before.id);
    {
        gpuarr_result r = GPUARR_OK;
        GPUARR_WITH_DEVICE_R((gpuarr_device){999}, &r) { EXPECT(0); }
        EXPECT(r == GPUARR_ERROR_INVALID_HANDLE);
        GPUARR_SCOPED_DEVICE_R((gpuarr_device){999}, &r);
        EXPECT(gpuarr_current_device().id == 0); /* a failed scope leaves no device to fall back on */
    }
    EXPECT(gpuarr_current_device().id == before.id);
    { /* gpuarr_transfer_estimate: _Generic on src (nothing moves: 0 s, no fit) */
        int64_t three[1] = {3};
        gpuarr_array x;
        double sec = -1;
        EXPECT(gpuarr_zeros(host, GPUARR_F32, 1, three, &x) == GPUARR_OK);
        EXPECT(gpuarr_transfer_estimate(x, host, GPUARR_DTYPE_INVALID, 0, &sec) == GPUARR_OK && sec == 0);
        EXPECT(gpuarr_transfer_estimate(x, host, GPUARR_F32, 13, &sec) == GPUARR_ERROR_INVALID_ARGUMENT);
        EXPECT(strncmp(gpuarr_last_error(), "gpuarr_transfer_estimate_array:", 31) == 0);
        EXPECT(gpuarr_transfer_estimate(host, host, GPUARR_DTYPE_INVALID, 0, &sec) == GPUARR_ERROR_INVALID_ARGUMENT);
        EXPECT(strncmp(gpuarr_last_error(), "gpuarr_transfer_estimate_device:", 32) == 0);
        gpuarr_release(x);
    }
    gpuarr_shutdown();
    puts("compile test (C11): ok");
    return 0;
}
