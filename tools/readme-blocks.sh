#!/bin/sh
# readme-blocks.sh README OUTDIR GPUARR_O -- compiles every ```c block of README so that the
# tour stays true (make compile-tests runs it). The rule for writing them:
#   - a block with `int main(` is a whole program: compiled with the warnings of the build,
#     linked with the implementation (GPUARR_O) and run;
#   - a block whose last non-blank line before it is `<!-- fragment: PARAMETERS -->`
#     (invisible on GitHub) is a fragment: compiled as the body of a function
#     `void f(PARAMETERS)` (e.g. `gpuarr_device dev, gpuarr_array image`) after <stdio.h> and
#     gpuarr.h, so that the names it takes from the text around it exist;
#   - any other block is a translation unit as it stands, compiled with -c;
#   - a block that includes <mpi.h> is compiled with MPI_CFLAGS; a program then links MPI_IMPL (the
#     implementation built with GPUARR_MPI) and MPI_LIBS, and runs under "$MPIRUN 2" (2 ranks;
#     MPIRUN ends with -np) where MPIRUN is set. Without MPI_CFLAGS such a block is skipped, saying so.
# CC, CFLAGS (default: C11 with the project's warnings), LIBS and the MPI_ ones come from the environment.
set -eu
readme=$1 out=$2 impl=$3
CC=${CC:-cc}
CFLAGS=${CFLAGS:--std=c11 -Wall -Wextra -Wpedantic -Wconversion -Werror}
LIBS=${LIBS:--lm -lpthread -ldl}
root=$(cd "$(dirname "$readme")" && pwd)
mkdir -p "$out"
rm -f "$out"/block-*

# Splits the README into block-N.c files, with block-N.fragment holding a fragment's parameters.
awk -v out="$out" '
    /^<!-- fragment:.*-->[[:space:]]*$/ { decl = $0; sub(/^<!-- fragment:[[:space:]]*/, "", decl); sub(/[[:space:]]*-->[[:space:]]*$/, "", decl); pending = 1; next }
    !inblock && /^```c[[:space:]]*$/ { inblock = 1; n++; file = out "/block-" n ".c"; printf "" > file;
                                       if (pending) print decl > (out "/block-" n ".fragment"); pending = 0; next }
    inblock && /^```[[:space:]]*$/ { inblock = 0; close(file); next }
    inblock { print >> file; next }
    NF { pending = 0 }
' "$readme"

count=0
for src in "$out"/block-*.c; do
    [ -e "$src" ] || { echo "readme-blocks: no \`\`\`c blocks in $readme"; exit 1; }
    base=${src%.c}
    count=$((count + 1))
    if grep -q '^#include <mpi.h>' "$src"; then
        if [ -z "${MPI_CFLAGS:-}" ]; then
            echo "readme-blocks: $(basename "$src") needs MPI: skipped (no MPI_CFLAGS: mpicc not found)"
        elif grep -q 'int main(' "$src"; then
            echo "readme-blocks: $(basename "$src") is an MPI program: compiled, linked and run${MPIRUN:+ on 2 ranks}"
            $CC $CFLAGS $MPI_CFLAGS -I"$root" "$src" "$MPI_IMPL" -o "$base" $MPI_LIBS $LIBS
            ${MPIRUN:+$MPIRUN 2} "$base" >/dev/null
        else
            echo "readme-blocks: $(basename "$src") is an MPI translation unit"
            $CC $CFLAGS $MPI_CFLAGS -I"$root" -c "$src" -o "$base.o"
        fi
    elif [ -e "$base.fragment" ]; then
        { echo '#include <stdio.h>'; echo '#include "gpuarr.h"'; params=$(cat "$base.fragment")
          echo "void readme_fragment($params);"; echo "void readme_fragment($params) {"; cat "$src"; echo "}"; } > "$base.wrapped.c"
        echo "readme-blocks: $(basename "$src") is a fragment"
        $CC $CFLAGS -I"$root" -c "$base.wrapped.c" -o "$base.o"
    elif grep -q 'int main(' "$src"; then
        echo "readme-blocks: $(basename "$src") is a program: compiled, linked and run"
        $CC $CFLAGS -I"$root" "$src" "$impl" -o "$base" $LIBS
        "$base" >/dev/null
    else
        echo "readme-blocks: $(basename "$src") is a translation unit"
        $CC $CFLAGS -I"$root" -c "$src" -o "$base.o"
    fi
done
echo "readme-blocks: all $count C blocks of $readme compile"
