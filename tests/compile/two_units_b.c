/* Compile test: the unit with the implementation. */
#define GPUARR_IMPLEMENTATION
#include "gpuarr.h"
#include <stdio.h>

int two_units_round_trip(void);

int main(void) {
    if (gpuarr_init(NULL) != GPUARR_OK) return 1;
    int r = two_units_round_trip();
    gpuarr_shutdown();
    puts(r ? "compile test (two units): FAILED" : "compile test (two units): ok");
    return r;
}
