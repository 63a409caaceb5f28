/* Must NOT compile in strict ISO mode: a C library header before the implementation has fixed
   glibc's feature macros, so clock_gettime and madvise are hidden. The header says what to do
   (#error) instead of falling back to the wall clock and no huge pages. With _DEFAULT_SOURCE
   defined first (make compile-tests: -D_DEFAULT_SOURCE) it compiles and uses both. */
#include <stdio.h>
#define GPUARR_IMPLEMENTATION
#include "gpuarr.h"

int main(void) {
    if (gpuarr_init(NULL) != GPUARR_OK) return 1;
    puts(gpuarr_last_error());
    gpuarr_shutdown();
    return 0;
}
