/* Compile test: a program built against `make install`'s copy alone (make install-check puts it
   in a scratch DESTDIR and gives only that include directory). */
#define GPUARR_IMPLEMENTATION
#include <gpuarr/gpuarr.h>

#include <stdio.h>

int main(void) {
    if (gpuarr_init(NULL) != GPUARR_OK) return 1;
    printf("compile test (installed headers): %d devices\n", gpuarr_device_count());
    gpuarr_shutdown();
    return 0;
}
