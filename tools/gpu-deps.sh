#!/bin/sh
# tools/gpu-deps.sh -- gathers, on this (Debian) machine, what tools/gpu-check.sh needs on the GPU
# machine, which cannot install packages: Criterion's headers and its shared library with every
# library it loads that is not part of the C library, the OpenCL headers and ICD loader. Writes .gpu-deps/
# (kept out of git by .git/info/exclude), which the device tool carries: carry [".gpu-deps"].
#   make test first (it installs the packages), then: tools/gpu-deps.sh
set -eu
out=.gpu-deps
rm -rf "$out"
mkdir -p "$out/include" "$out/lib"
exclude="$(git rev-parse --git-dir)/info/exclude"
mkdir -p "$(dirname "$exclude")"
grep -qx '/.gpu-deps/' "$exclude" 2>/dev/null || echo '/.gpu-deps/' >> "$exclude"
cp -r /usr/include/criterion "$out/include/"
[ -d /usr/include/CL ] && cp -r /usr/include/CL "$out/include/" # test_opencl's interop checks
crit=$(ldconfig -p | awk '/libcriterion\.so\.3 .*x86-64/ {print $NF; exit}')
[ -n "$crit" ] || { echo "gpu-deps: libcriterion.so.3 not found (run make test first)"; exit 1; }
cp -L "$crit" "$out/lib/"
ln -sf libcriterion.so.3 "$out/lib/libcriterion.so"
# its dependencies, except the C library's own (those match any newer glibc)
ldd "$crit" | awk '/=> \// {print $3}' | while read -r lib; do
    case "$(basename "$lib")" in
    libc.so.*|libm.so.*|libpthread.so.*|libdl.so.*|librt.so.*|libresolv.so.*|libutil.so.*|ld-linux*) ;;
    *) cp -L "$lib" "$out/lib/" ;;
    esac
done
loader=$(ldconfig -p | awk '/libOpenCL\.so\.1 .*x86-64/ {print $NF; exit}')
if [ -n "$loader" ]; then cp -L "$loader" "$out/lib/" && ln -sf libOpenCL.so.1 "$out/lib/libOpenCL.so"; fi
# Debian's make, for an image without one (it needs only the C library)
mkdir -p "$out/bin" && cp -L "$(command -v make)" "$out/bin/"
du -sh "$out"
