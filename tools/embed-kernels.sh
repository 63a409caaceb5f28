#!/bin/sh
# Writes the kernel sources as C string literals, one per line, to stdout:
#   tools/embed-kernels.sh > generated/gpuarr_kernels_source.h      (make kernels)
#   gpuarr__kernels_source       kernels/gpuarr_kernels.h (the conversion rules)
#   gpuarr__kernels_cuda_source  kernels/gpuarr_kernels_cuda.h (its CUDA dialect)
# One literal per line keeps each under the 4095 characters ISO C promises; OpenCL takes the
# array as is, NVRTC gets it joined.
set -eu
dir=${1:-kernels}
embed() { # name file
    echo "static const char *const $1[] = {"
    sed -e 's/\\/\\\\/g' -e 's/"/\\"/g' -e 's/^/    "/' -e 's/$/\\n",/' "$2"
    echo "};"
}
echo "/* Generated from $dir/gpuarr_kernels.h and $dir/gpuarr_kernels_cuda.h by tools/embed-kernels.sh"
echo "   (make kernels). Do not edit. */"
echo "#ifndef GPUARR_KERNELS_SOURCE_INCLUDED"
echo "#define GPUARR_KERNELS_SOURCE_INCLUDED"
embed gpuarr__kernels_source "$dir/gpuarr_kernels.h"
embed gpuarr__kernels_cuda_source "$dir/gpuarr_kernels_cuda.h"
echo "#endif"
