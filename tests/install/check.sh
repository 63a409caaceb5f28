#!/bin/sh
# check.sh OUT -- uses what `make install` put under DESTDIR (make install-check installs it
# there with PREFIX=/usr) the three ways the README's Install section gives, building
# tests/install/consumer.c each way into OUT and running it:
#   1. pkg-config gpuarr, the implementation compiled into the program;
#   2. CMake, find_package(gpuarr 0.1) and gpuarr::gpuarr, and the version file refusing 0.2
#      and 1.0 (tests/install/CMakeLists.txt);
#   3. pkg-config gpuarr-lib against libgpuarr.so, whose exports, soname and links are checked,
#      then the same program linked with libgpuarr.a.
# pkg-config finds DESTDIR's .pc files first (PKG_CONFIG_PATH, as the README says for a PREFIX
# off its path) and prefixes their paths with DESTDIR (PKG_CONFIG_SYSROOT_DIR); the flags must
# point into DESTDIR. The Makefile passes, in the environment, CC, CFLAGS, LIBS,
# DESTDIR, VERSION, LIBDIR, PKGCONFIGDIR, LIBPKGCONFIGDIR, CMAKEDIR, LIB_OBJ (the object the libraries are made
# of) and the names LIB_A, LIB_REAL, LIB_SONAME, LIB_SO.
set -eu
out=$1
: "${CC:?}" "${CFLAGS:?}" "${DESTDIR:?}" "${PREFIX:?}" "${VERSION:?}" "${LIBDIR:?}" "${PKGCONFIGDIR:?}" "${LIBPKGCONFIGDIR:?}" "${CMAKEDIR:?}"
: "${LIB_OBJ:?}" "${LIB_A:?}" "${LIB_REAL:?}" "${LIB_SONAME:?}" "${LIB_SO:?}"
src=tests/install/consumer.c
fail() { echo "install check: $*" >&2; exit 1; }
mkdir -p "$out"
export PKG_CONFIG_PATH="$DESTDIR$PKGCONFIGDIR:$DESTDIR$LIBPKGCONFIGDIR" PKG_CONFIG_SYSROOT_DIR="$DESTDIR"

for pc in gpuarr gpuarr-lib; do
    v=$(pkg-config --modversion $pc) || fail "pkg-config finds no $pc in $PKG_CONFIG_PATH"
    [ "$v" = "$VERSION" ] || fail "$pc.pc says version $v, gpuarr.h $VERSION"
    case " $(pkg-config --cflags $pc) " in *" -I$DESTDIR$PREFIX/include/gpuarr "*) ;;
        *) fail "pkg-config --cflags $pc does not give -I$DESTDIR$PREFIX/include/gpuarr" ;; esac
done

echo "== install check 1: pkg-config gpuarr (header-only)"
flags=$(pkg-config --cflags --libs gpuarr)
echo "   pkg-config --cflags --libs gpuarr: $flags"
# shellcheck disable=SC2086 # flags are words
$CC $CFLAGS -DCONSUMER_WITH_IMPLEMENTATION -DCONSUMER_HOW='"pkg-config gpuarr"' $src -o "$out/consumer-pkgconfig" $flags
"$out/consumer-pkgconfig"

echo "== install check 2: CMake find_package(gpuarr 0.1), gpuarr::gpuarr"
cmake_configure() { # build dir, wanted version; CMake would take CFLAGS from the environment
    env -u CFLAGS cmake -S tests/install -B "$1" -DCMAKE_C_COMPILER="$CC" -DCMAKE_PREFIX_PATH="$DESTDIR$PREFIX" \
        -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF -DGPUARR_WANT="$2"
}
rm -rf "$out/cmake" "$out"/cmake-want-*
cmake_configure "$out/cmake" 0.1 >"$out/cmake.log" 2>&1 || { cat "$out/cmake.log"; fail "cmake configure failed"; }
found=$(sed -n 's/^gpuarr_DIR:PATH=//p' "$out/cmake/CMakeCache.txt")
[ "$found" = "$DESTDIR$CMAKEDIR" ] || fail "CMake found gpuarr in '$found', not in $DESTDIR$CMAKEDIR"
cmake --build "$out/cmake" >>"$out/cmake.log" 2>&1 || { cat "$out/cmake.log"; fail "cmake build failed"; }
"$out/cmake/consumer"
for want in 0.2 1.0; do
    if cmake_configure "$out/cmake-want-$want" $want >"$out/cmake-want-$want.log" 2>&1; then
        fail "find_package(gpuarr $want) accepted version $VERSION"
    fi
    tr -s ' \n' '  ' <"$out/cmake-want-$want.log" | grep -q "compatible with requested version \"$want\"" ||
        { cat "$out/cmake-want-$want.log"; fail "find_package(gpuarr $want) failed, but not for its version"; }
    echo "   find_package(gpuarr $want) refuses $VERSION"
done
cmake_configure "$out/cmake-want-range" "0.1...<1.0" >"$out/cmake-want-range.log" 2>&1 ||
    { cat "$out/cmake-want-range.log"; fail "find_package(gpuarr 0.1...<1.0) refused $VERSION"; }
echo "   find_package(gpuarr 0.1...<1.0) accepts $VERSION"

echo "== install check 3: pkg-config gpuarr-lib, libgpuarr"
lib_dir=$DESTDIR$LIBDIR
so=$lib_dir/$LIB_REAL
if [ "$(readlink "$lib_dir/$LIB_SONAME")" != "$LIB_REAL" ] || [ "$(readlink "$lib_dir/$LIB_SO")" != "$LIB_SONAME" ]; then
    fail "$LIB_SONAME and $LIB_SO should link to $LIB_REAL and $LIB_SONAME"
fi
soname=$(readelf -d "$so" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
[ "$soname" = "$LIB_SONAME" ] || fail "$LIB_REAL has soname '$soname', not $LIB_SONAME"
echo "   readelf -d $LIB_REAL: SONAME $soname"
others=$(nm -D --defined-only "$so" | awk '$3 !~ /^gpuarr_/')
[ -z "$others" ] || { echo "$others"; fail "$LIB_REAL exports symbols other than gpuarr_*"; }
exported=$(nm -D --defined-only "$so" | grep -c ' T gpuarr_')
compiled=$(nm "$LIB_OBJ" | grep -c ' T gpuarr_')
[ "$exported" = "$compiled" ] || fail "$LIB_REAL exports $exported gpuarr_ functions, $LIB_OBJ defines $compiled"
for f in gpuarr__from_host_named gpuarr__to_host_named gpuarr__fill_named; do
    nm -D --defined-only "$so" | grep -q " T $f\$" || fail "$LIB_REAL does not export $f (the typed macros call it)"
done
echo "   nm -D --defined-only $LIB_REAL: $exported symbols, all gpuarr_ functions, as many as gpuarr.c's object defines"

flags=$(pkg-config --cflags --libs gpuarr-lib)
echo "   pkg-config --cflags --libs gpuarr-lib: $flags"
# shellcheck disable=SC2086
$CC $CFLAGS -DCONSUMER_HOW='"gpuarr-lib, libgpuarr.so"' $src -o "$out/consumer-shared" $flags
readelf -d "$out/consumer-shared" | grep -q "(NEEDED).*\[$LIB_SONAME\]" || fail "consumer-shared does not need $LIB_SONAME"
! nm "$out/consumer-shared" | grep -q ' T gpuarr_' || fail "consumer-shared has gpuarr functions of its own"
LD_LIBRARY_PATH=$lib_dir "$out/consumer-shared"

# the same program with the static library in place of -lgpuarr, and Libs.private
flags=$(pkg-config --cflags --static --libs gpuarr-lib | sed 's/-lgpuarr\>/-l:'"$LIB_A"'/')
echo "   static: $flags"
# shellcheck disable=SC2086
$CC $CFLAGS -DCONSUMER_HOW='"gpuarr-lib, libgpuarr.a"' $src -o "$out/consumer-static" $flags
! readelf -d "$out/consumer-static" | grep -q "(NEEDED).*libgpuarr" || fail "consumer-static needs libgpuarr.so"
"$out/consumer-static"
echo "install check: the installed headers, gpuarr.pc, the CMake package, gpuarr-lib.pc and both libraries work"
