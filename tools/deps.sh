#!/bin/sh
# tools/deps.sh SET... -- makes sure the Debian packages of each SET are installed. As root it
# installs the missing ones (apt-get update, then apt-get install --no-install-recommends, no
# questions asked); as anyone else it prints the exact apt-get line and fails, installing nothing.
# Says nothing when everything is there. The package lists are here and nowhere else.
#
#   tools/deps.sh test               what make test needs (make deps-test)
#   tools/deps.sh check              make check's (make deps-check)
#   tools/deps.sh plots              one of the benchmarks' (make bench-plots)
#   tools/deps.sh --list SET...      prints the packages of the sets, checks nothing
#
# NumPy and the DLPack header for make test's Python tests come from PyPI into a virtual
# environment under build/ (make's python-tests; no root needed): not here.
set -eu

# The packages of one set, on one line.
packages() {
    case $1 in
    # Open MPI: the MPI tests, examples/mpi_heat, gpuarr-info --mpi
    mpi) echo "libopenmpi-dev openmpi-bin" ;;
    # compilers, Criterion, PoCL and the OpenCL loader and headers, Python with venv (DLPack
    # tests), CMake and pkg-config (the install check), and MPI
    test) echo "gcc g++ clang make libcriterion-dev pocl-opencl-icd ocl-icd-libopencl1 ocl-icd-opencl-dev opencl-headers" \
               "python3 python3-venv cmake pkgconf $(packages mpi)" ;;
    check) echo "$(packages test) valgrind" ;;
    plots) echo "gnuplot-nox" ;;        # make bench-plots
    compare) echo "libboost-dev" ;;     # make bench-compare: Boost.Compute
    starpu) echo "libstarpu-dev" ;;     # make bench-offload-starpu
    *) echo "tools/deps.sh: no package set \"$1\" (the sets: test check mpi plots compare starpu)" >&2; return 1 ;;
    esac
}

list=false
if [ "${1:-}" = --list ]; then list=true; shift; fi
[ $# -gt 0 ] || { echo "usage: tools/deps.sh [--list] SET... (the sets: test check mpi plots compare starpu)" >&2; exit 2; }
wanted=""
for set in "$@"; do
    list_of_set=$(packages "$set") || exit 2
    for p in $list_of_set; do
        case " $wanted " in *" $p "*) ;; *) wanted="${wanted:+$wanted }$p" ;; esac
    done
done
if $list; then echo "$wanted"; exit 0; fi

if ! command -v dpkg-query >/dev/null 2>&1; then
    echo "gpuarr: not a Debian system; assuming these are installed: $wanted"
    exit 0
fi
missing=""
for p in $wanted; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing="$missing $p"
done
[ -n "$missing" ] || exit 0
if [ "$(id -u)" != 0 ]; then
    echo "gpuarr: missing Debian packages. Run:"
    echo "  sudo apt-get install -y$missing"
    exit 1
fi
echo "gpuarr: installing$missing"
apt-get update -q
DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $missing
