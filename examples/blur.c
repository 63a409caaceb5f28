/* blur.c -- a 3x3 box blur as one portable kernel, on any device: a u8 image goes to the device
   as f32 (gpuarr_convert), the kernel blurs it over a 2-D launch (edges clamped), and the result
   comes back as u8; then the same blur in plain C, the same float operations in the same order,
   must give the same bytes. No OpenCL or CUDA code, no library to link.

     ./blur [DEVICE]     DEVICE: a spec (host, opencl:0, cuda:0, ...); default "any"

   Exit status 0 when the device's image equals plain C's, 1 when not or on an error, 3 when the
   device runs no portable kernels (GPUARR_ERROR_UNSUPPORTED, saying why). */
#include <stdio.h>
#include <stdlib.h>
#include <tgmath.h> /* a file with kernels: float math as on the devices */
#include "gpuarr.h"

/* dst = the mean of src's 3x3 neighbourhood, a pixel past the edge read as the edge's. */
GPUARR_KERNEL(blur3, (GPUARR_IN(float, src), GPUARR_OUT(float, dst), GPUARR_SCALAR(int64_t, w), GPUARR_SCALAR(int64_t, h)), {
    int64_t x = gpuarr_index(0), y = gpuarr_index(1);
    float sum = 0.0f;
    for (int64_t dy = -1; dy <= 1; dy++) {
        int64_t yy = y + dy < 0 ? 0 : y + dy > h - 1 ? h - 1 : y + dy;
        for (int64_t dx = -1; dx <= 1; dx++) {
            int64_t xx = x + dx < 0 ? 0 : x + dx > w - 1 ? w - 1 : x + dx;
            sum += src[yy * w + xx];
        }
    }
    dst[y * w + x] = sum / 9.0f;
})

#define W 640
#define H 480

/* The kernel's arithmetic in plain C, then f32 -> u8 as gpuarr_convert does it (toward zero,
   saturated; the means stay within 0..255). */
static void blur_c(const uint8_t *in, uint8_t *out) {
    for (int64_t y = 0; y < H; y++)
        for (int64_t x = 0; x < W; x++) {
            float sum = 0.0f;
            for (int64_t dy = -1; dy <= 1; dy++) {
                int64_t yy = y + dy < 0 ? 0 : y + dy > H - 1 ? H - 1 : y + dy;
                for (int64_t dx = -1; dx <= 1; dx++) {
                    int64_t xx = x + dx < 0 ? 0 : x + dx > W - 1 ? W - 1 : x + dx;
                    sum += (float)in[yy * W + xx];
                }
            }
            float v = sum / 9.0f;
            out[y * W + x] = (uint8_t)(v < 0.0f ? 0.0f : v > 255.0f ? 255.0f : v);
        }
}

/* A synthetic image: a diagonal gradient plus noise from a fixed seed. */
static void make_image(uint8_t *img) {
    uint32_t seed = 12345u;
    for (int i = 0; i < W * H; i++) {
        seed = seed * 1664525u + 1013904223u;
        int v = (i % W) * 160 / W + (i / W) * 64 / H + (int)(seed >> 27);
        img[i] = (uint8_t)(v > 255 ? 255 : v);
    }
}

#define CHECK(call)                                                                          \
    do {                                                                                     \
        if ((call) != GPUARR_OK) {                                                           \
            fprintf(stderr, "blur: %s: %s\n", #call, gpuarr_last_error());                   \
            return 1;                                                                        \
        }                                                                                    \
    } while (0)

int main(int argc, char **argv) {
    static uint8_t img[H * W], mine[H * W], ref[H * W];
    make_image(img);
    blur_c(img, ref);
    CHECK(gpuarr_init(NULL));
    gpuarr_device dev;
    gpuarr_device_info info;
    CHECK(gpuarr_device_find(argc > 1 ? argv[1] : "any", &dev));
    CHECK(gpuarr_device_get_info(dev, &info));
    int64_t shape[2] = {H, W};
    gpuarr_array u8, f, g, back;
    CHECK(gpuarr_from_host(gpuarr_host(), img, 2, shape, &u8));
    CHECK(gpuarr_convert(u8, dev, GPUARR_F32, &f));      /* to the device, as f32 */
    CHECK(gpuarr_empty(dev, GPUARR_F32, 2, shape, &g));
    gpuarr_launch l = {.ndim = 2, .global = {W, H}};     /* x along a row, y down the rows */
    gpuarr_result r = blur3(&l, f, g, W, H);
    if (r == GPUARR_ERROR_UNSUPPORTED) {
        printf("blur: %s runs no portable kernels here: %s\n", info.spec, gpuarr_last_error());
        return 3;
    }
    CHECK(r);
    CHECK(gpuarr_convert(g, gpuarr_host(), GPUARR_U8, &back)); /* waits for the kernel: gpuarr orders it */
    CHECK(gpuarr_to_host(back, mine, (size_t)(H * W)));
    int differ = 0;
    for (int i = 0; i < H * W; i++) differ += mine[i] != ref[i];
    printf("blur: %dx%d u8 image, 3x3 box blur on %s: %s plain C (%d of %d pixels differ)\n", W, H, info.spec,
           differ ? "DIFFERENT from" : "identical to", differ, H * W);
    gpuarr_release(u8);
    gpuarr_release(f);
    gpuarr_release(g);
    gpuarr_release(back);
    gpuarr_shutdown();
    return differ != 0;
}
