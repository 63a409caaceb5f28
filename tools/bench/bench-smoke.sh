#!/bin/sh
# bench-smoke.sh GPUARR_BENCH OUTDIR [FAKE_LIBCUDA] -- make test's check of gpuarr-bench's
# --host-isa and --csv (a few seconds): a 4-16 KiB sweep with both host cast kernel sets must give
# the CSV's header, the machine lines, 14 fields per row with positive numbers, every host cast
# for each kernel set (avx2 only where /proc/cpuinfo has it; else a "skipped" line), the OpenCL
# rows where gpuarr-info lists opencl:0, and a line saying why there are no CUDA rows where there
# is no CUDA device; on the fake CUDA driver (tests/fake_cuda), when given, the CUDA rows; the
# Markdown run must label its rows with both kernel sets; an unknown --host-isa is refused; and
# --calibrate (below) calibrates every device, prints the models and saves them.
set -eu
bench=$1 out=$2 fake_cuda=${3:-}
mkdir -p "$out"
out=$(cd "$out" && pwd) # GPUARR_CACHE_DIR must be absolute
csv=$out/bench-smoke.csv
fail() { echo "bench-smoke: $*"; exit 1; }
"$bench" --reps 1 --host-isa baseline,avx2 --csv "$csv" --sweep-max 16K 2>"$out/bench-smoke.err" || { cat "$out/bench-smoke.err"; fail "gpuarr-bench --csv failed"; }
avx2=0; grep -qw avx2 /proc/cpuinfo 2>/dev/null && avx2=1
opencl=0; "$(dirname "$bench")/gpuarr-info" 2>/dev/null | grep -q "^opencl:0 " && opencl=1
for line in "cpu" "cpu flags" "machine tag" "gpuarr host cast kernels" "sweep"; do
    grep -q "^# $line: " "$csv" || fail "$csv has no '# $line:' line"
done
awk -F, -v avx2="$avx2" -v opencl="$opencl" '
    /^#/ { if ($0 ~ /host cast kernels "avx2": skipped/) skipped = 1; next }
    !header { if ($0 != "section,path,baseline,isa,device,bytes,gpuarr_seconds,baseline_seconds,gpuarr_GBps,baseline_GBps,ratio,reps,gpuarr_calls,baseline_calls") { print "bad header: " $0; bad = 1 } header = 1; next }
    NF != 14 { print "not 14 fields: " $0; bad = 1; next }
    { for (i = 6; i <= 14; i++) if (!($i + 0 > 0)) { print "field " i " not positive: " $0; bad = 1 } }
    $1 ~ /^host-/ { if ($6 != 4096 && $6 != 16384) { print "size outside the sweep: " $0; bad = 1 } n[$1 "," ($4 == "baseline" ? "baseline" : $4 ~ /^avx2/ ? "avx2" : "other")]++ }
    $1 ~ /^opencl-/ { n[$1]++ }
    END {
        if (n["host-cast,baseline"] != 10 || n["host-convert,baseline"] != 10) { print "expected 10 host-cast and 10 host-convert rows with the baseline kernels"; bad = 1 }
        if (avx2 && (n["host-cast,avx2"] != 10 || n["host-convert,avx2"] != 10)) { print "expected 10 host-cast and 10 host-convert rows with the avx2 kernels"; bad = 1 }
        if (!avx2 && !skipped) { print "no AVX2 here, but no line saying the avx2 set was skipped"; bad = 1 }
        if (opencl && (n["opencl-transfer"] != 8 || n["opencl-cast"] != 12)) { print "expected 8 opencl-transfer and 12 opencl-cast rows"; bad = 1 }
        exit bad
    }' "$csv" || fail "$csv is not what --csv should write"
cuda=0; "$(dirname "$bench")/gpuarr-info" 2>/dev/null | grep -q "^cuda:0 " && cuda=1
if [ "$cuda" = 0 ]; then grep -q "^# cuda: no CUDA device" "$csv" || fail "no CUDA device here, but no line in $csv saying so"; fi
if [ -n "$fake_cuda" ]; then
    GPUARR_CUDA_LIBRARY=$fake_cuda GPUARR_CACHE_DIR=$out/bench-smoke-cache "$bench" --reps 1 --csv "$out/bench-smoke-cuda.csv" \
        --sweep-max 4K --device cuda:0 2>"$out/bench-smoke.err" || { cat "$out/bench-smoke.err"; fail "gpuarr-bench --csv on the fake CUDA driver failed"; }
    awk -F, '$5 == "cuda:0" && $6 == 4096 && NF == 14 && $9 > 0 && $10 > 0 { n[$1]++ }
             END { exit !(n["cuda-transfer"] == 4 && n["cuda-cast"] == 6) }' "$out/bench-smoke-cuda.csv" ||
        fail "expected 4 cuda-transfer and 6 cuda-cast rows in $out/bench-smoke-cuda.csv (the fake CUDA driver)"
fi
"$bench" --host-only --mib 1 --reps 1 --host-isa both >"$out/bench-smoke.md" 2>&1 || { cat "$out/bench-smoke.md"; fail "gpuarr-bench --host-isa both failed"; }
grep -q "^| cast f32->f16, kernel | baseline |" "$out/bench-smoke.md" || fail "no row labelled with the baseline kernels in $out/bench-smoke.md"
if [ "$avx2" = 1 ]; then
    grep -q "^| cast f32->f16, kernel | avx2" "$out/bench-smoke.md" || fail "no row labelled with the avx2 kernels in $out/bench-smoke.md"
fi
if "$bench" --host-isa sse9 --csv - >/dev/null 2>&1; then fail "--host-isa sse9 was accepted"; fi
# --calibrate: every device calibrated (a row each in the Calibration table, as gpuarr-info lists them), its
# models printed as measured and saved in the cache's models folder, and the machine lines first
rm -rf "$out/calibrate-cache"
GPUARR_CACHE_DIR=$out/calibrate-cache "$bench" --calibrate >"$out/bench-calibrate.md" 2>&1 || { cat "$out/bench-calibrate.md"; fail "gpuarr-bench --calibrate failed"; }
grep -q "^- cpu: " "$out/bench-calibrate.md" || fail "no machine lines in $out/bench-calibrate.md"
for spec in $("$(dirname "$bench")/gpuarr-info" 2>/dev/null | awk '/^(host|cuda:[0-9]+|opencl:[0-9]+) /{print $1}'); do
    grep -q "^| $spec | [0-9.]* |$" "$out/bench-calibrate.md" || fail "--calibrate: no calibration row for $spec in $out/bench-calibrate.md"
done
grep -q "^host -> host pageable cast: latency .* (measured)$" "$out/bench-calibrate.md" || fail "--calibrate: no host model in $out/bench-calibrate.md"
ls "$out/calibrate-cache/models/"*.model >/dev/null 2>&1 || fail "--calibrate: no model file in $out/calibrate-cache/models"
echo "bench-smoke: --host-isa and --csv: $(grep -vc '^#' "$csv") CSV lines, both kernel sets labelled; --calibrate: $(grep -c '(measured)$' "$out/bench-calibrate.md") models"
