/* Instructions per cached 4 KiB host allocate+free pair, for callgrind: built once with the trace
   hooks compiled in (tracing off) and once with -DGPUARR_NO_TRACE; the difference of the two
   totals over N pairs is what the off hooks cost, free of timing noise.
   cc -std=c11 -O2 -I. pairs.c gpuarr.c -lm -lpthread -ldl [-DGPUARR_NO_TRACE]
   valgrind --tool=callgrind --callgrind-out-file=/dev/null ./pairs N [write]   (and with N = 0)
   "write": N gpuarr_write calls of 4 KiB into a host array instead (the transfer path's hooks). */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include "gpuarr.h"

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 100000;
    gpuarr_desc d = {0};
    d.devices = "host";
    d.host_threads = 1;
    if (gpuarr_init(&d) != GPUARR_OK) return 1;
    int64_t shape = 1024;
    if (argc > 2) { /* "write": n gpuarr_write calls of 4 KiB into one host array (the transfer hooks) */
        static float src[1024];
        gpuarr_array a;
        if (gpuarr_empty(gpuarr_host(), GPUARR_F32, 1, &shape, &a) != GPUARR_OK) return 1;
        for (long i = 0; i < n; i++)
            if (gpuarr_write(a, 0, 1024, GPUARR_F32, src) != GPUARR_OK) return 1;
        gpuarr_release(a);
        gpuarr_shutdown();
        return 0;
    }
    for (long i = 0; i < n; i++) {
        gpuarr_array a;
        if (gpuarr_empty(gpuarr_host(), GPUARR_F32, 1, &shape, &a) != GPUARR_OK) return 1;
        gpuarr_release(a);
    }
    gpuarr_shutdown();
    return 0;
}
