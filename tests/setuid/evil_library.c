/* tests/setuid: what an attacker hands a privileged program as GPUARR_OPENCL_LIBRARY. Loading
   it is enough: its constructor writes the effective uid it ran as to $GPUARR_TEST_MARKER. It
   has no OpenCL entry point, so a program that does load it finds no OpenCL devices. */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

__attribute__((constructor)) static void evil_library_loaded(void) {
    const char *path = getenv("GPUARR_TEST_MARKER");
    FILE *f = path ? fopen(path, "w") : NULL;
    if (!f) return;
    fprintf(f, "loaded with euid=%lu\n", (unsigned long)geteuid());
    fclose(f);
}
