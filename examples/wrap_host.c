/* wrap_host: hand gpuarr your own buffer without a copy, and get told when it is done with it.
   Also shows how errors read: every failure names the call, the argument and the reason. */
#include <stdio.h>
#include <stdlib.h>
#include "gpuarr.h"

static void give_back(void *data, void *user_data) {
    printf("gpuarr released the buffer (%s)\n", (const char *)user_data);
    free(data);
}

int main(void) {
    if (gpuarr_init(NULL) != GPUARR_OK) return 1;
    int64_t shape[2] = {480, 640};
    unsigned char *image = malloc(480 * 640);
    if (!image) return 1;
    for (int i = 0; i < 480 * 640; i++) image[i] = (unsigned char)(i % 251);

    gpuarr_array pixels, as_float;
    if (gpuarr_wrap_host(image, GPUARR_U8, 2, shape, give_back, "a 640x480 image", &pixels) != GPUARR_OK) {
        fprintf(stderr, "%s\n", gpuarr_last_error());
        free(image); /* on failure the buffer is still ours */
        return 1;
    }
    gpuarr_device dev;
    gpuarr_device_find("any", &dev);
    if (gpuarr_convert(pixels, dev, GPUARR_F32, &as_float) != GPUARR_OK) {
        fprintf(stderr, "%s\n", gpuarr_last_error());
        return 1;
    }
    gpuarr_release(pixels); /* the last reference: give_back runs now */

    /* A mistake, reported instead of crashing: */
    float small[10];
    gpuarr_result r = gpuarr_to_host(as_float, small, 10);
    printf("to_host into 10 floats: %s\n  %s\n", gpuarr_result_name(r), gpuarr_last_error());

    gpuarr_release(as_float);
    gpuarr_shutdown();
    return r == GPUARR_ERROR_INVALID_ARGUMENT ? 0 : 1;
}
