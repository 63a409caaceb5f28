#!/bin/sh
# Quiet re-run of issue 14's figures; one thing at a time.
cd /work/main || exit 1
B=build/rel/tools/gpuarr-bench
O=/tmp/quiet
export POCL_DEVICES="pthread pthread"
{ date -u; uptime; } > $O/meta.txt
$B --host-only --reps 9 --host-isa baseline,avx2 > $O/host.md 2>&1
GPUARR_THREADS=1 $B --host-only --reps 9 --host-isa baseline,avx2 > $O/host-1t.md 2>&1
$B --opencl-only --reps 5 --device opencl:0 > $O/opencl.md 2>&1
$B --pool-only > $O/pool.md 2>&1
make --no-print-directory bench-compare > $O/compare.md 2>&1
make --no-print-directory bench-plots > $O/plots.log 2>&1
{ date -u; uptime; } >> $O/meta.txt
