/* Must NOT compile: GPUARR_MALLOC without GPUARR_FREE. */
#include <stdlib.h>
#define GPUARR_MALLOC(n) malloc(n)
#define GPUARR_IMPLEMENTATION
#include "gpuarr.h"
