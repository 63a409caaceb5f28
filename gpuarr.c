#define GPUARR_IMPLEMENTATION
#include "gpuarr.h"
