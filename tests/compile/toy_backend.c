/* Compile-and-run test: a backend added as the top of gpuarr.h says -- its header
   (tests/compile/toy/backends/gpuarr_toy.h), its line in GPUARR_BACKEND_LIST, its interop
   function's declaration and its row in the interop dispatch list, and its #include -- is found,
   converts, answers its interop function, and in a build without it (-DGPUARR_NO_TOY) that
   function says so. The Makefile makes the copy of gpuarr.h with those lines added
   (build/compile/toy/gpuarr.h). */
#define GPUARR_IMPLEMENTATION
#include "gpuarr.h"
#include <stdio.h>
#include <string.h>

#define EXPECT(cond)                                                                           \
    do {                                                                                       \
        if (!(cond)) {                                                                         \
            fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #cond, gpuarr_last_error()); \
            return 1;                                                                          \
        }                                                                                      \
    } while (0)

int main(void) {
    EXPECT(gpuarr_init(NULL) == GPUARR_OK);
    gpuarr_device toy;
    int answer = 0;
#ifdef GPUARR_NO_TOY
    EXPECT(gpuarr_device_find("toy:0", &toy) == GPUARR_ERROR_NO_DEVICE);
    EXPECT(gpuarr_toy_answer(gpuarr_host(), &answer) == GPUARR_ERROR_UNSUPPORTED);
    EXPECT(strcmp(gpuarr_last_error(), "gpuarr_toy_answer: this build has no toy backend (GPUARR_NO_TOY)") == 0);
    puts("compile test (a backend added, then left out with GPUARR_NO_TOY): ok");
#else
    EXPECT(gpuarr_device_find("toy:0", &toy) == GPUARR_OK);
    EXPECT(gpuarr_toy_answer(toy, &answer) == GPUARR_OK && answer == 42);
    EXPECT(gpuarr_toy_answer(gpuarr_host(), &answer) == GPUARR_ERROR_INVALID_ARGUMENT);
    EXPECT(strstr(gpuarr_last_error(), "gpuarr_toy_answer: d is host, not a toy device"));
    double in[5] = {1.5, -2.5, 3, 4e9, -1}, out[5];
    int64_t shape[1] = {5};
    gpuarr_array h, t;
    EXPECT(gpuarr_from_host(gpuarr_host(), in, 1, shape, &h) == GPUARR_OK);
    EXPECT(gpuarr_convert(h, toy, GPUARR_F32, &t) == GPUARR_OK);
    EXPECT(gpuarr_to_host(t, out, 5) == GPUARR_OK);
    for (int i = 0; i < 5; i++) EXPECT(out[i] == (double)(float)in[i]);
    gpuarr_release(t);
    gpuarr_release(h);
    puts("compile test (a backend added: its header, a list line, an interop declaration and row, an #include): ok");
#endif
    gpuarr_shutdown();
    return 0;
}
