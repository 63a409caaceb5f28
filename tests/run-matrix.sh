#!/bin/sh
# tests/run-matrix.sh [MATRIX] -- runs the suite's device matrix, tests/matrix.txt unless given
# (what its columns mean is written at its top): each line's test programs on each of its devices,
# in order, an "== what" line before each run; stops at the first failure.
#
# make run-tests (in make test) and make run-matrix call it with these set: TEST_BIN (the folder of
# the test programs), GPUARR_INFO (build/rel/tools/gpuarr-info), TEST_DEVICES, GENERIC_TESTS,
# DISCRETE_TESTS, WHITEBOX_TESTS, FAULT_OPENCL, SETUID_ENV, FAKE_ENV (empty without the fake CUDA
# driver), FAKE_CUDA_WHY_NOT (why it is not built) and PTXAS (the toolkit's ptxas, or empty). MATRIX_ONLY=REGEX: only the runs whose
# "==" line matches (grep -E); none matching is an error, so a typo does not pass silently.
set -eu
matrix=${1:-tests/matrix.txt}
for v in TEST_BIN GPUARR_INFO TEST_DEVICES GENERIC_TESTS DISCRETE_TESTS WHITEBOX_TESTS FAULT_OPENCL SETUID_ENV; do
    eval "[ -n \"\${$v:-}\" ]" || { echo "run-matrix: $v is not set (make run-matrix sets it)" >&2; exit 2; }
done
FAKE_ENV=${FAKE_ENV:-} FAKE_CUDA_WHY_NOT=${FAKE_CUDA_WHY_NOT:-no fake CUDA driver} POCL_DEVICES=${POCL_DEVICES:-} PTXAS=${PTXAS:-}
MATRIX_ONLY=${MATRIX_ONLY:-}

# The conditions of the `when` column, each decided once: " name " in held or failed.
held=" - " failed=" "

# Whether the runs of condition $1 happen here; the first time one does not, says why.
holds() {
    case $held in *" $1 "*) return 0 ;; esac
    case $failed in *" $1 "*) return 1 ;; esac
    case $1 in
    fake-cuda)
        if [ -n "$FAKE_ENV" ]; then held="$held$1 "; return 0; fi
        echo "== the runs on the fake CUDA driver skipped: $FAKE_CUDA_WHY_NOT" ;;
    *:*)
        if "$GPUARR_INFO" | grep -q "^$1 "; then held="$held$1 "; return 0; fi
        echo "== the runs on $1 skipped: $("$GPUARR_INFO" --find "$1" 2>&1 || true)" ;;
    *)
        echo "run-matrix: $matrix:$lineno: \"$1\" is not a condition (-, fake-cuda or a device spec)" >&2
        exit 2 ;;
    esac
    failed="$failed$1 "
    return 1
}

# The "says" column with $test, $device and the variables above filled in (quotes kept as text).
says() {
    escaped=$(printf '%s' "$c_says" | sed 's/[\\"`]/\\&/g')
    eval "printf '%s' \"$escaped\""
}

trim() { printf '%s' "$1" | sed 's/^[[:space:]]*//; s/[[:space:]]*$//'; }

runs=0 lineno=0
while IFS='|' read -r c_when c_device c_tests c_env c_args c_says <&3; do
    lineno=$((lineno + 1))
    case $(trim "$c_when") in '' | '#'*) continue ;; esac
    c_when=$(trim "$c_when") c_device=$(trim "$c_device") c_tests=$(trim "$c_tests")
    c_env=$(trim "$c_env") c_args=$(trim "${c_args:-}") c_says=$(trim "${c_says:-}")
    [ -n "$c_says" ] || { echo "run-matrix: $matrix:$lineno: fewer than six columns" >&2; exit 2; }
    eval "devices=\"$c_device\" tests=\"$c_tests\""
    for device in $devices; do
        for test in $tests; do
            line=$(says)
            if [ -n "$MATRIX_ONLY" ] && ! printf '%s\n' "$line" | grep -qE -- "$MATRIX_ONLY"; then continue; fi
            holds "$c_when" || continue
            runs=$((runs + 1))
            echo "== $line"
            dev=""
            [ "$device" = - ] || dev="GPUARR_TEST_DEVICE=$device"
            eval "env $c_env $dev \"\$TEST_BIN/\$test\" ${c_args:---jobs 2}" 3<&- ||
                { echo "run-matrix: failed: $line ($matrix:$lineno)"; exit 1; }
        done
    done
done 3<"$matrix"
if [ -n "$MATRIX_ONLY" ] && [ "$runs" = 0 ]; then
    echo "run-matrix: no run of $matrix matches MATRIX_ONLY='$MATRIX_ONLY'" >&2
    exit 1
fi
