#!/bin/sh
# tools/gpu-check.sh -- the whole GPU run, in one call of the device tool:
#
#   tools/gpu-deps.sh                                  (here, once: Criterion for the GPU machine)
#   device run: command "tools/gpu-check.sh", carry [".gpu-deps"]
#
# On the GPU machine it builds everything with gcc and nvcc, checks the CUDA kernels (ptxas,
# NVRTC), runs the whole suite on cuda:0 and test_cuda, then the OpenCL suite on NVIDIA's OpenCL
# when the machine has it, the examples (custom_kernel.cu included), compute-sanitizer memcheck
# and racecheck on the CUDA tests and the .cu example, and the CUDA benchmarks. Everything lands
# in $OUT (three files: gpu-check.log, bench-cuda.md, info.json); the last lines of the log say
# which steps passed. With NVIDIA's OpenCL driver present (libnvidia-opencl.so.1) but not registered,
# it registers it for the ICD loader, so the OpenCL suite and bench-offload (the planner's regret on a
# real GPU, bench-offload.txt) run on the GPU too.
# Parts: tools/gpu-check.sh [build] [test] [sanitize] [bench] [offload] (default: all).
set -u
OUT=${OUT:-build/gpu-check}
mkdir -p "$OUT"
LOG="$OUT/gpu-check.log"
: > "$LOG"
steps=${*:-build test sanitize bench offload}
deps=$(pwd)/.gpu-deps
export LD_LIBRARY_PATH="$deps/lib:/usr/local/nvidia/lib64:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export PATH="$PATH:/usr/local/cuda/bin:$deps/bin" # $deps/bin: Debian's make, where the image has none
# NVIDIA's OpenCL driver, registered for the ICD loader when the image lists no vendor
if [ ! -s /etc/OpenCL/vendors/nvidia.icd ] && [ -z "${OCL_ICD_VENDORS:-}" ]; then
    nvcl=$(for d in /usr/local/nvidia/lib64 /usr/lib/x86_64-linux-gnu /usr/lib64; do
        [ -e "$d/libnvidia-opencl.so.1" ] && echo "$d/libnvidia-opencl.so.1" && break; done)
    if [ -n "$nvcl" ]; then
        mkdir -p /tmp/gpuarr-icd && echo "$nvcl" > /tmp/gpuarr-icd/nvidia.icd
        export OCL_ICD_VENDORS=/tmp/gpuarr-icd
    fi
fi
export GPUARR_TEST_REQUIRE=1
MAKEVARS="TEST_CFLAGS=-I. -Itests -isystem $deps/include" # -isystem: as /usr/include, whose headers warn in no macro
summary=""
note() { echo "$*" | tee -a "$LOG"; }
step() { # name command...: runs, logs, records the outcome
    name=$1; shift
    note "== $name: $*"
    if "$@" >>"$LOG" 2>&1; then summary="$summary\n  ok      $name"; else summary="$summary\n  FAILED  $name"; fi
}
want() { case " $steps " in *" $1 "*) return 0;; esac; return 1; }
# the suite make test runs on each device: the Makefile's GENERIC_TESTS (no white-box tests, no
# test_failures: those need the fake driver's switches)
GENERIC_TESTS=$(printf 'p:\n\t@echo $(GENERIC_TESTS)\n' | make -s --no-print-directory -f Makefile -f - p)
suite_on() { # device: the generic suite; goes on past a failing test, so one run finds them all
    rc=0
    for t in $GENERIC_TESTS; do
        echo "-- $t on $1"
        GPUARR_TEST_DEVICE=$1 timeout 300 "build/rel/tests/$t" --jobs 8 || { echo "-- FAILED: $t on $1"; rc=1; }
    done
    return $rc
}
# caching off: the suite but test_pool, whose tests are about the cache (it runs its own
# caching:0 case), and its 16-thread stress test
without_caching() {
    (export GPUARR_ALLOC_CONF=caching:0
     GENERIC_TESTS=$(echo " $GENERIC_TESTS " | sed 's/ test_pool / /'); rc=0
     suite_on cuda:0 || rc=1
     echo "-- test_pool's stress test on cuda:0"
     GPUARR_TEST_DEVICE=cuda:0 timeout 300 build/rel/tests/test_pool --filter 'pool/sixteen*' || rc=1
     exit $rc)
}
sanitize() { # tool tests: those tests on cuda:0, then the .cu example
    for t in $2; do
        echo "-- compute-sanitizer --tool $1: $t"
        GPUARR_TEST_DEVICE=cuda:0 GPUARR_ALLOC_CONF=caching:0 timeout 150 compute-sanitizer --tool "$1" --target-processes all --error-exitcode 1 \
            "build/rel/tests/$t" --jobs 1 || return 1
    done
    timeout 150 compute-sanitizer --tool "$1" --error-exitcode 1 build/rel/examples/custom_kernel
}

{
    echo "date: $(date -u +%Y-%m-%dT%H:%MZ)"; uname -a
    nvidia-smi --query-gpu=name,driver_version,memory.total,pci.bus_id --format=csv 2>&1
    nvcc --version 2>&1 | tail -2; gcc --version | head -1
    ls /etc/OpenCL/vendors 2>&1; echo "OCL_ICD_VENDORS=${OCL_ICD_VENDORS:-}"
    command -v make gcc g++ nvcc compute-sanitizer 2>&1
    grep -m1 'model name' /proc/cpuinfo; nproc
} >>"$LOG" 2>&1

if want build; then
    step "build (gcc, nvcc)" make -j16 all "$MAKEVARS" TEST_LIB_rel="-L$deps/lib -lcriterion" \
        $(ls tests/test_*.c | sed 's|tests/\(.*\)\.c|build/rel/tests/\1|')
    step "CUDA kernels: committed PTX current, ptxas, NVRTC" make kernels-check
fi
build/rel/tools/gpuarr-info --json > "$OUT/info.json" 2>>"$LOG"
build/rel/tools/gpuarr-info >>"$LOG" 2>&1
if want test; then
    step "test_cuda" env GPUARR_TEST_DEVICE=cuda:0 build/rel/tests/test_cuda --jobs 4
    step "the suite on cuda:0" suite_on cuda:0
    step "the suite on cuda:0, no caching (every allocation a cuMemAlloc)" without_caching
    if build/rel/tools/gpuarr-info --find opencl:0 >/dev/null 2>&1; then
        step "the suite on opencl:0 (the GPU through OpenCL)" suite_on opencl:0
    else
        note "== OpenCL on the GPU: skipped: $(build/rel/tools/gpuarr-info --find opencl:0)"
    fi
    for e in build/rel/examples/*; do step "example $(basename "$e")" "$e"; done
fi
if want sanitize; then
    step "compute-sanitizer memcheck" sanitize memcheck "test_cuda test_roundtrip test_streams"
    step "compute-sanitizer racecheck" sanitize racecheck "test_roundtrip"
fi
if want bench; then
    note "== bench: build/rel/tools/gpuarr-bench --cuda-only --reps 11"
    if timeout 240 build/rel/tools/gpuarr-bench --cuda-only --reps 11 > "$OUT/bench-cuda.md" 2>>"$LOG"; then
        summary="$summary\n  ok      bench (bench-cuda.md)"
    else
        summary="$summary\n  FAILED  bench"
    fi
fi
if want offload; then
    if build/rel/tools/gpuarr-info --find opencl:0 >/dev/null 2>&1 && gcc -std=c11 -O2 -I. -I"$deps/include" tools/bench/bench-offload.c build/rel/gpuarr.o \
        -o build/rel/tools/bench-offload -L"$deps/lib" -lOpenCL -lm -lpthread -ldl >>"$LOG" 2>&1; then
        note "== offload: bench-offload --reps 3 on the host and opencl:0 (the GPU through OpenCL)"
        if timeout 200 build/rel/tools/bench-offload --reps 3 > "$OUT/bench-offload.txt" 2>>"$LOG"; then
            summary="$summary\n  ok      offload (bench-offload.txt)"
        else
            summary="$summary\n  FAILED  offload"
        fi
    else
        note "== offload: skipped: no OpenCL GPU, or bench-offload did not build"
    fi
fi
note "== summary"
printf "%b\n" "$summary" | tee -a "$LOG"
case "$summary" in *FAILED*) exit 1;; esac
exit 0
