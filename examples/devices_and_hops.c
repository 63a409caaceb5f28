/* devices_and_hops: the same calls on every device: move an image through each device found,
   changing dtype on every hop, and check the result. With POCL_DEVICES="pthread pthread" two
   OpenCL devices are found; on a machine without OpenCL only the host is. */
#include <stdio.h>
#include <stdlib.h>
#include "gpuarr.h"

int main(void) {
    if (gpuarr_init(NULL) != GPUARR_OK) return 1;
    enum { W = 640, H = 480 };
    unsigned char *pixels = malloc(W * H);
    float *back = malloc(sizeof(float) * W * H);
    if (!pixels || !back) return 1;
    for (int i = 0; i < W * H; i++) pixels[i] = (unsigned char)(i * 7);
    int64_t shape[2] = {H, W};

    gpuarr_array a;
    if (gpuarr_from_host(gpuarr_host(), pixels, 2, shape, &a) != GPUARR_OK) return 1; /* U8 */
    static const gpuarr_dtype dtypes[] = {GPUARR_F32, GPUARR_F16, GPUARR_I32, GPUARR_BF16};
    for (int i = 0; i < gpuarr_device_count(); i++) {
        gpuarr_device dev = gpuarr_device_at(i);
        gpuarr_device_info info;
        gpuarr_device_get_info(dev, &info);
        gpuarr_array next;
        gpuarr_dtype t = dtypes[i % 4];
        if (gpuarr_convert(a, dev, t, &next) != GPUARR_OK) { /* u8 values survive every hop */
            fprintf(stderr, "%s\n", gpuarr_last_error());
            return 1;
        }
        printf("hop %d: %-9s %s\n", i, info.spec, gpuarr_dtype_name(t));
        gpuarr_release(a);
        a = next;
    }
    if (gpuarr_to_host(a, back, (size_t)W * H) != GPUARR_OK) return 1;
    int wrong = 0;
    for (int i = 0; i < W * H; i++) wrong += back[i] != (float)pixels[i];
    printf("%dx%d image through %d devices: %s\n", W, H, gpuarr_device_count(), wrong ? "WRONG" : "ok");
    gpuarr_release(a);
    gpuarr_shutdown();
    free(pixels);
    free(back);
    return wrong != 0;
}
