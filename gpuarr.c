/* The implementation, for builds that compile it once as its own unit. _GNU_SOURCE turns on
   Linux extras (transparent huge pages for large host blocks) that strict ISO mode hides; g++
   defines it already. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#define GPUARR_IMPLEMENTATION
#include "gpuarr.h"
