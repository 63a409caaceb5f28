/* tests/setuid: a program that uses gpuarr, installed setuid root by test_setuid.c and run as
   another user. It says who it runs as, so the test knows the setuid bit took effect, then starts
   and stops gpuarr with whatever environment it was given. */
#include <stdio.h>
#include <unistd.h>

#include "gpuarr.h"

int main(void) {
    printf("uid=%lu euid=%lu\n", (unsigned long)getuid(), (unsigned long)geteuid());
    gpuarr_result r = gpuarr_init(NULL);
    if (r != GPUARR_OK) {
        printf("gpuarr_init: %s\n", gpuarr_last_error());
        return 1;
    }
    gpuarr_shutdown();
    printf("done\n");
    return 0;
}
