/* trace: record what gpuarr does into a Chrome trace-event file, to open in Perfetto
   (ui.perfetto.dev) or chrome://tracing: an upload, casts, a fill, two streams, a download.
   Build: cc -std=c11 -I.. trace.c ../gpuarr.c -lm -lpthread -ldl
   Run:   ./trace [trace.json [device]]   (default $TMPDIR/gpuarr-trace.json on the best device;
          GPUARR_OPENCL_UNIFIED=off shows PoCL's transfers staged as on a discrete GPU) */
#include <stdio.h>
#include <stdlib.h>
#include "gpuarr.h"

#define CHECK(call)                                                                         \
    do {                                                                                    \
        gpuarr_result r_ = (call);                                                          \
        if (r_ != GPUARR_OK) {                                                              \
            fprintf(stderr, "%s failed: %s\n", #call, gpuarr_last_error());                 \
            return 1;                                                                       \
        }                                                                                   \
    } while (0)

enum { N = 1 << 20 }; /* 4 MiB of f32: large enough for the staged path */

int main(int argc, char **argv) {
    char fallback[512];
    const char *tmp = getenv("TMPDIR");
    snprintf(fallback, sizeof fallback, "%s/gpuarr-trace.json", tmp && *tmp ? tmp : "/tmp");
    const char *path = argc > 1 ? argv[1] : fallback;
    CHECK(gpuarr_trace_start(path)); /* or run any program with GPUARR_TRACE=path */
    CHECK(gpuarr_init(NULL));
    gpuarr_device dev;
    CHECK(gpuarr_device_find(argc > 2 ? argv[2] : "any", &dev));
    float *v = malloc(sizeof *v * N);
    if (!v) return 1;
    for (int i = 0; i < N; i++) v[i] = (float)(i % 1000);
    int64_t shape[1] = {N};
    gpuarr_array a, half, wide, back;
    CHECK(gpuarr_from_host(dev, v, 1, shape, &a));         /* upload */
    CHECK(gpuarr_convert(a, dev, GPUARR_F16, &half));      /* a cast on the device */
    float one = 1;
    CHECK(gpuarr_fill_as(a, GPUARR_F32, &one));             /* a fill */
    gpuarr_stream s1, s2;
    CHECK(gpuarr_stream_create(dev, 0, &s1));
    CHECK(gpuarr_stream_create(dev, 0, &s2));
    CHECK(gpuarr_convert_async(half, dev, GPUARR_F64, s1, &wide)); /* on s1 ... */
    CHECK(gpuarr_convert_async(wide, dev, GPUARR_F32, s2, &back)); /* ... used on s2: a wait */
    CHECK(gpuarr_to_host(back, v, N));                      /* download */
    printf("v[999] = %g (want 999)\n", (double)v[999]);
    CHECK(gpuarr_stream_destroy(s1));
    CHECK(gpuarr_stream_destroy(s2));
    gpuarr_release(a);
    gpuarr_release(half);
    gpuarr_release(wide);
    gpuarr_release(back);
    gpuarr_shutdown();
    CHECK(gpuarr_trace_stop()); /* writes the file */
    printf("trace written to %s\n", path);
    free(v);
    return 0;
}
