/* streams_and_scopes: asynchronous conversions on a stream, timed with events, inside a device
   scope. Runs on the best device; on the host the same calls complete as they are enqueued. */
#include <stdio.h>
#include "gpuarr.h"

#define CHECK(call)                                                                         \
    do {                                                                                    \
        if ((call) != GPUARR_OK) {                                                          \
            fprintf(stderr, "%s: %s\n", #call, gpuarr_last_error());                        \
            return 1;                                                                       \
        }                                                                                   \
    } while (0)

int main(void) {
    CHECK(gpuarr_init(NULL));
    gpuarr_device dev;
    CHECK(gpuarr_device_find("any", &dev));

    enum { N = 1 << 20 };
    static float data[N];
    for (int i = 0; i < N; i++) data[i] = (float)i * 0.25f;
    int64_t shape[1] = {N};

    gpuarr_stream s;
    gpuarr_event start, stop;
    CHECK(gpuarr_stream_create(dev, 0, &s));
    CHECK(gpuarr_event_create(dev, GPUARR_EVENT_TIMING, &start));
    CHECK(gpuarr_event_create(dev, GPUARR_EVENT_TIMING, &stop));

    gpuarr_array a, half, back;
    GPUARR_WITH_STREAM(s) { /* the stream's device and the stream are current in here */
        if (gpuarr_from_host(gpuarr_current_device(), data, 1, shape, &a) != GPUARR_OK) break;
        gpuarr_event_record(start, s);
        /* {0} = the current stream: these return at once and run in order on s */
        gpuarr_convert_async(a, dev, GPUARR_F16, (gpuarr_stream){0}, &half);
        gpuarr_convert_async(half, gpuarr_host(), GPUARR_F32, (gpuarr_stream){0}, &back);
        gpuarr_event_record(stop, s);
        gpuarr_release(a);    /* safe: queued work keeps what it reads alive */
        gpuarr_release(half);
    }
    CHECK(gpuarr_stream_sync(s));
    double ms;
    CHECK(gpuarr_event_elapsed_ms(start, stop, &ms));

    float *out;
    CHECK(gpuarr_host_data(back, (void **)&out));
    int wrong = 0;
    for (int i = 0; i < N; i++) wrong += out[i] != gpuarr_f16_to_float(gpuarr_f16_from_float(data[i]));
    printf("f32 -> f16 -> f32 of %d elements on a stream: %.3f ms, %s\n", N, ms, wrong ? "WRONG" : "ok");

    gpuarr_release(back);
    gpuarr_event_destroy(start);
    gpuarr_event_destroy(stop);
    gpuarr_stream_destroy(s);
    gpuarr_shutdown();
    return wrong != 0;
}
