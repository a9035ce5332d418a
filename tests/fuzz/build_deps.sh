#!/usr/bin/env bash
# Builds libjpeg-turbo and libspng, at the versions of Debian bookworm's packages and from Debian's
# source archive (checksums pinned), as static libraries instrumented like the fuzz targets
# (ASan + UBSan + libFuzzer coverage), into PREFIX with pkg-config files. A fuzz build configured
# with -DCMAKE_PREFIX_PATH=PREFIX links them instead of the system's: ASan then sees the decoders'
# own writes (into buffers stoker sized), and coverage guides mutations through their code.
#
#   tests/fuzz/build_deps.sh PREFIX CMAKE NINJA
set -euo pipefail

prefix=$(realpath -m "${1:?usage: $0 PREFIX CMAKE NINJA}")
cmake=$(realpath "${2:?usage: $0 PREFIX CMAKE NINJA}")
ninja=$(realpath "${3:?usage: $0 PREFIX CMAKE NINJA}")
[ -f "$prefix/.done" ] && exit 0

debian=http://deb.debian.org/debian/pool/main
jpeg_url=$debian/libj/libjpeg-turbo/libjpeg-turbo_2.1.5.orig.tar.gz
jpeg_sha=254f3642b04e309fee775123133c6464181addc150499561020312ec61c1bf7c
spng_url=$debian/libs/libspng/libspng_0.7.3.orig.tar.gz
spng_sha=a50cadbe808ffda1a7fab17d145f52a23b163f34b3eb3696c7ecb5a52340fc1d
flags="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"
flags+=" -g -O2"

rm -rf "$prefix"
mkdir -p "$prefix/src" "$prefix/lib/pkgconfig" "$prefix/include"
cd "$prefix/src"

fetch() {  # URL SHA256 FOLDER
  curl -fsSL --retry 3 -o "$3.tar.gz" "$1"
  echo "$2  $3.tar.gz" | sha256sum -c --quiet -
  mkdir "$3" && tar xzf "$3.tar.gz" -C "$3" --strip-components=1
}

fetch "$jpeg_url" "$jpeg_sha" libjpeg-turbo
# SIMD off: the C code paths are the instrumented ones (the SIMD kernels are assembly).
"$cmake" -S libjpeg-turbo -B libjpeg-turbo/build -G Ninja -DCMAKE_MAKE_PROGRAM="$ninja" \
  -DCMAKE_POLICY_VERSION_MINIMUM=3.5 -DCMAKE_C_COMPILER=clang-14 -DCMAKE_BUILD_TYPE=None \
  -DCMAKE_C_FLAGS="$flags" -DENABLE_SHARED=OFF -DWITH_SIMD=0 -Wno-author -Wno-deprecated > /dev/null
"$cmake" --build libjpeg-turbo/build --target jpeg-static turbojpeg-static > /dev/null
cp libjpeg-turbo/build/libjpeg.a libjpeg-turbo/build/libturbojpeg.a "$prefix/lib/"
cp libjpeg-turbo/{jpeglib.h,jmorecfg.h,jerror.h,turbojpeg.h} libjpeg-turbo/build/jconfig.h \
  "$prefix/include/"

fetch "$spng_url" "$spng_sha" libspng
clang-14 $flags -c libspng/spng/spng.c -o libspng/spng.o
ar rcs "$prefix/lib/libspng.a" libspng/spng.o
cp libspng/spng/spng.h "$prefix/include/"

# The names CMakeLists.txt asks pkg-config for, pointing at the static libraries. libspng needs
# zlib (the system's) and libm: public requirements, since the library is static.
for pc in "libjpeg jpeg" "libturbojpeg turbojpeg" "spng spng"; do
  set -- $pc
  requires=$([ "$1" = spng ] && echo "Requires: zlib" || true)
  cat > "$prefix/lib/pkgconfig/$1.pc" <<EOF
prefix=$prefix
Name: $1
Description: $1, instrumented for fuzzing (tests/fuzz/build_deps.sh)
Version: 0
$requires
Libs: -L\${prefix}/lib -l$2 -lm
Cflags: -I\${prefix}/include
EOF
done
touch "$prefix/.done"
echo "instrumented libjpeg-turbo and libspng in $prefix"
