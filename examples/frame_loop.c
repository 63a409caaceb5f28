/* frame_loop: the shape of a video pipeline. The buffers are allocated once, before the loop;
   every frame is written into the same device buffer, processed there (casts, copies, fills:
   gpuarr has no user kernels in C) and one region of interest is read back and checked.
   Runs on the device named by its argument, default "any" (the best GPU, else the host). */
#include <stdint.h>
#include <stdio.h>
#include "gpuarr.h"

#define CHECK(call)                                                                         \
    do {                                                                                    \
        gpuarr_result r_ = (call);                                                          \
        if (r_ != GPUARR_OK) {                                                              \
            fprintf(stderr, "%s failed: %s\n", #call, gpuarr_last_error());                 \
            return 1;                                                                       \
        }                                                                                   \
    } while (0)

enum { H = 480, W = 640, FRAMES = 10 };
enum { BAND = 16 };                /* rows 0..15 are blanked (say, a timestamp overlay) */
enum { MARK = 20 };                /* row 20 gets a marker line written from the host */
enum { ROI0 = 8, ROI1 = 40 };      /* the rows read back: across the band, the marker, the image */

static uint8_t pixel(int frame, int i) { return (uint8_t)(i * 7 + frame * 13); }

int main(int argc, char **argv) {
    CHECK(gpuarr_init(NULL));
    gpuarr_device dev;
    CHECK(gpuarr_device_find(argc > 1 ? argv[1] : "any", &dev));
    gpuarr_device_info info;
    CHECK(gpuarr_device_get_info(dev, &info));

    /* Once, before the loop. The frames are produced straight into a pinned host array of dev:
       gpuarr_copy from it is one DMA transfer. gpuarr_write(frame, 0, H * W, 0, p) uploads from
       any host pointer p; from ordinary (pageable) memory a discrete device's copy goes through
       pinned staging chunks, one more memcpy per frame. On the host device both are a memcpy. */
    int64_t shape[2] = {H, W};
    gpuarr_array camera, frame, scaled, band, roi;
    CHECK(gpuarr_empty_pinned(dev, GPUARR_U8, 2, shape, &camera));
    CHECK(gpuarr_empty(dev, GPUARR_U8, 2, shape, &frame));
    CHECK(gpuarr_empty(dev, GPUARR_F32, 2, shape, &scaled));
    CHECK(gpuarr_slice(scaled, 0, BAND, &band)); /* views: rows of `scaled`, no memory of their own */
    CHECK(gpuarr_slice(scaled, ROI0, ROI1, &roi));
    uint8_t *pixels;
    CHECK(gpuarr_host_data(camera, (void **)&pixels));
    static uint8_t marker[W];
    static float back[(ROI1 - ROI0) * W];

    int wrong = 0;
    for (int f = 0; f < FRAMES; f++) {
        for (int i = 0; i < H * W; i++) pixels[i] = pixel(f, i); /* "capture" */
        for (int x = 0; x < W; x++) marker[x] = (uint8_t)(f + x % 2 * 200);

        CHECK(gpuarr_copy(frame, camera));   /* upload into the same device buffer */
        CHECK(gpuarr_copy(scaled, frame));   /* u8 -> f32 on the device, into the existing array
                                                (gpuarr_convert would allocate a new one) */
        CHECK(gpuarr_fill(band, -1.0f));     /* blank the band: a fill of a view */
        CHECK(gpuarr_write(scaled, (int64_t)MARK * W, W, GPUARR_U8, marker)); /* u8 cast to f32 */
        CHECK(gpuarr_read(roi, 0, (ROI1 - ROI0) * W, GPUARR_F32, back));

        for (int y = ROI0; y < ROI1; y++)
            for (int x = 0; x < W; x++) {
                float want = y < BAND ? -1.0f : y == MARK ? (float)marker[x] : (float)pixel(f, y * W + x);
                if (back[(y - ROI0) * W + x] != want) wrong++;
            }
    }
    printf("%d frames of %dx%d u8 on %s, rows [%d, %d) read back each frame: %s\n", FRAMES, H, W, info.spec, ROI0, ROI1,
           wrong ? "WRONG" : "ok");

    CHECK(gpuarr_release(roi));
    CHECK(gpuarr_release(band));
    CHECK(gpuarr_release(scaled));
    CHECK(gpuarr_release(frame));
    CHECK(gpuarr_release(camera));
    gpuarr_shutdown();
    return wrong ? 1 : 0;
}
