#!/bin/sh
# Writes backends/gpuarr_kernels.h as C string literals, one per line, to stdout:
#   tools/embed-kernels.sh > backends/gpuarr_kernels_source.h      (make kernels)
# One literal per line keeps each under the 4095 characters ISO C promises; OpenCL takes the
# array as is, NVRTC gets it joined.
set -eu
src=${1:-backends/gpuarr_kernels.h}
echo "/* Generated from $src by tools/embed-kernels.sh (make kernels). Do not edit. */"
echo "static const char *const gpuarr__kernels_source[] = {"
sed -e 's/\\/\\\\/g' -e 's/"/\\"/g' -e 's/^/    "/' -e 's/$/\\n",/' "$src"
echo "};"
