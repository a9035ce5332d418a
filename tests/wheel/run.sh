#!/usr/bin/env bash
# make test-wheels and make test ("pip alone", on every interpreter): installs
# each wheel that make wheels built into a bare Debian bookworm (tests/debian/rootfs.sh:
# debootstrap --variant=minbase, plus python3 and python3-venv from apt) that has no JPEG, PNG or
# WebP library and no -dev package, with pip alone and offline (torch and the wheel's
# dependencies downloaded outside for each interpreter, installed with --no-index), in a fresh
# venv of every interpreter the wheel is for, and runs tests/wheel/check.py there: it packs a
# folder of JPEG, PNG and WebP files, loads them with torch, writes and reads an array pack, and
# checks that the decoders were the wheel's own. Then installs FFmpeg 5.1's libraries from apt
# and loads video clips and audio with the cp311 wheel's stoker._media against them.
#
#   tests/wheel/run.sh WORK PYTHON WHEEL...
#
# The interpreters: a cpXY wheel is for Python X.Y, a cpXY-abi3 wheel for X.Y and every later
# one given. Debian's own python3 (3.11) serves the cp311 wheel; the others are the build
# machine's (pyenv's), named by STOKER_PYTHONS="3.10=/path/to/python3.10 3.12=... 3.13=...",
# each mounted read-only into the root at its own path (they run on the libraries Debian's
# python3 brings: libssl3, libffi8...; none of them an image library). PYTHON (the project's
# venv, 3.11) downloads the cp311 wheel's dependencies.
#
# torch: STOKER_WHEEL_TORCH=all (make test-wheels, once per release: several GB of PyPI's CUDA
# builds for each interpreter) installs torch==2.13.0 in every venv; otherwise (make test) only
# Debian's 3.11 gets it, and the other interpreters run check.py --no-torch: what runs there
# without torch (packing, every image decoded by stoker.verify, an array pack, the command line).
#
# WORK caches the dependencies' wheels; the root file system's tarball is cached beside it, in
# WORK/../debian (shared with test-bare), and each run unpacks a fresh root from it. The mounts
# the chroot needs live in a mount namespace of their own (tests/debian/rootfs.sh's in_root), so
# they go away with it however the run ends. Needs root (without it, says so and passes), and the
# network for debootstrap and apt (DEBIAN_MIRROR, default deb.debian.org) and PyPI the first
# time. A failed run leaves WORK/root for a look; the next run replaces it.
set -euo pipefail

[ $# -ge 3 ] || { echo "usage: $0 WORK PYTHON WHEEL..." >&2; exit 2; }
if [ "$(id -u)" != 0 ]; then
  echo "test-wheels: SKIPPED (debootstrap, mount and chroot need root: make test as root runs it)"
  exit 0
fi
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=../debian/rootfs.sh
source "$here/../debian/rootfs.sh"
work=$(realpath -m "$1")
py=$(cd "$(dirname "$2")" && pwd)/$(basename "$2")  # not resolved: a venv's python is a link
shift 2
wheels=()
for w in "$@"; do wheels+=("$(realpath "$w")"); done
torch_spec=torch==2.13.0
torch_everywhere=$([ "${STOKER_WHEEL_TORCH:-}" = all ] && echo 1 || true)
root=$work/root
mkdir -p "$work"
t0=$SECONDS
step() { echo "test-wheels [$((SECONDS - t0)) s]: $*"; }
version() { "$@" -c 'import sys; print("%d.%d" % sys.version_info[:2])'; }

# The interpreters: "X.Y=PATH" from STOKER_PYTHONS; Debian's python3 for 3.11.
declare -A python_of=()
for entry in ${STOKER_PYTHONS:-}; do
  [ "${entry%%=*}" = 3.11 ] || python_of[${entry%%=*}]=${entry#*=}
done
# (wheel, interpreter version) pairs, from each wheel's tags.
runs=()
for wheel in "${wheels[@]}"; do
  tag=$(basename "$wheel" | cut -d- -f3,4)  # cp310-cp310, cp312-abi3
  minor=${tag#cp3}
  minor=${minor%%-*}
  if [[ $tag == *-abi3 ]]; then
    found=
    for v in $(printf '%s\n' "${!python_of[@]}" 3.11 | sort -uV); do
      if [ "${v#3.}" -ge "$minor" ]; then runs+=("$wheel|$v"); found=1; fi
    done
    [ -n "$found" ] || { echo "$0: no interpreter for $(basename "$wheel") in STOKER_PYTHONS" >&2; exit 1; }
  else
    v=3.$minor
    if [ "$v" != 3.11 ] && [ -z "${python_of[$v]:-}" ]; then
      echo "$0: no Python $v for $(basename "$wheel") in STOKER_PYTHONS" >&2
      exit 1
    fi
    runs+=("$wheel|$v")
  fi
done

# 1. A fresh bare root, with Debian's python3 and python3-venv.
# The machine's cache (STOKER_CACHE, the Makefile's $(CACHE)): the root file system's tarball,
# the roots' apt packages, the wheelhouses; without it, beside WORK.
cache=$(realpath -m "${STOKER_CACHE:-$(dirname "$work")}")
export IN_ROOT_APT=$cache/debian/apt
tarball=$(rootfs_tar "$cache/debian")
step "a fresh root from $tarball; apt-get install python3 python3-venv"
fresh_root "$tarball" "$root"
cat > "$root/tmp/python.sh" <<'END'
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq && apt-get install -y -qq --no-install-recommends python3 python3-venv > /dev/null
rm -rf /var/lib/apt/lists/*
END
in_root "$root" /tmp/python.sh
if [ "$(version "$py")" != "$(version chroot "$root" python3)" ]; then
  echo "$0: $py is Python $(version "$py"), the bare root's is $(version chroot "$root" python3):" \
       "the dependencies' wheels are downloaded for the former" >&2
  exit 1
fi

# 2. What the root lacks: any JPEG, PNG or WebP library, any -dev package.
found=$(find "$root" -xdev \( -name 'libjpeg.so*' -o -name 'libturbojpeg.so*' -o -name 'libspng*.so*' \
        -o -name 'libwebp*.so*' -o -name 'libsharpyuv.so*' -o -name 'libpng*.so*' \) -print)
if [ -n "$found" ]; then echo "the bare root has image libraries:" "$found" >&2; exit 1; fi
packages=$(chroot "$root" dpkg-query -W -f '${Package}\n' | grep -E 'jpeg|png|webp|-dev$' || true)
if [ -n "$packages" ]; then echo "the bare root has packages:" $packages >&2; exit 1; fi
step "root without libjpeg, libturbojpeg, libspng, libwebp, libpng, -dev packages: checked"

# 3. Each run's dependencies (and torch where it runs), downloaded outside by the same Python
# version, once for each set of requirements; the steps each run takes inside, written down.
stage=$root/tmp/stoker-test
mkdir -p "$stage/data"
cp "$here/check.py" "$stage/"
"$py" "$here/make_images.py" "$stage/data"
binds=()
script=$stage/inside.sh
echo 'set -euo pipefail; cd /tmp/stoker-test' > "$script"
for run in "${runs[@]}"; do
  wheel=${run%|*} v=${run#*|}
  outside=${python_of[$v]:-$py}
  inside=${python_of[$v]:-python3}
  with_torch=$({ [ "$v" = 3.11 ] || [ -n "$torch_everywhere" ]; } && echo 1 || true)
  extra=$([ -n "$with_torch" ] && echo "$torch_spec" || true)
  requires=$("$py" -c '
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
    print(sorted(l for l in z.read(meta).decode().splitlines() if l.startswith("Requires-Dist")))
' "$wheel")
  key=$(echo "$v $extra $requires" | sha256sum | cut -c1-16)
  wheelhouse=$cache/wheelhouse/$key
  if [ ! -f "$wheelhouse/.done" ]; then
    step "Python $v: pip download ${extra:-(no torch)} and the wheel's dependencies into $wheelhouse"
    rm -rf "$wheelhouse" && mkdir -p "$wheelhouse"
    "$outside" -m pip download -q --only-binary=:all: -d "$wheelhouse" $extra "$wheel" \
      > "$work/pip-download.log" 2>&1 || { tail -30 "$work/pip-download.log" >&2; exit 1; }
    rm -f "$wheelhouse/$(basename "$wheel")"
    touch "$wheelhouse/.done"
  fi
  cp "$wheel" "$stage/"
  binds+=("$wheelhouse")
  if [ -n "${python_of[$v]:-}" ]; then binds+=("$(dirname "$(dirname "$(realpath "$outside")")")"); fi
  venv=/opt/venv-$v-$(basename "$wheel" | cut -d- -f3)
  cat >> "$script" <<END
echo "== [\$SECONDS s] $(basename "$wheel") on Python $v ($inside)${with_torch:+, with $torch_spec}"
$inside -m venv $venv
$venv/bin/pip install -q --no-index --find-links $wheelhouse ./$(basename "$wheel") $extra
core=\$(echo $venv/lib/python3*/site-packages/stoker/_core.*.so)
ldd "\$core" > ldd.txt
if grep -q 'not found' ldd.txt; then cat ldd.txt; echo "unresolved libraries" >&2; exit 1; fi
if grep -E 'lib(jpeg|turbojpeg|spng|webp)' ldd.txt | grep -v '/stoker\.libs/'; then
  echo "decoders resolved outside stoker.libs" >&2; exit 1
fi
rm -rf work-$v && $venv/bin/python check.py data work-$v ${with_torch:---no-torch}
END
done
echo 'echo "== [$SECONDS s] done"' >> "$script"

# 4. In the root: a venv per run, pip install offline, the check.
step "chroot: for each wheel and interpreter, a venv, pip install --no-index, check.py"
# shellcheck disable=SC2046  # one folder a word
in_root "$root" /tmp/stoker-test/inside.sh $(printf '%s\n' "${binds[@]}" | sort -u)

# 5. Video and audio: the wheels carry stoker._media but none of FFmpeg (make wheels' --exclude);
# with FFmpeg 5.1's libraries from apt, the cp311 wheel's loads against them and decodes.
for wheel in "${wheels[@]}"; do
  libs=$("$py" -c 'import sys, zipfile; print(*zipfile.ZipFile(sys.argv[1]).namelist())' "$wheel")
  if echo "$libs" | grep -qE 'stoker\.libs/lib(av|sw)'; then
    echo "$(basename "$wheel") carries FFmpeg" >&2
    exit 1
  fi
done
media_venv=$(cd "$root" && ls -d opt/venv-3.11-* 2>/dev/null | head -1)
if [ -n "$media_venv" ]; then
  cat > "$stage/media.sh" <<END
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends libavformat59 libavcodec59 libswscale6 \\
  libswresample4 > /dev/null
cd /tmp/stoker-test
media=\$(echo /$media_venv/lib/python3*/site-packages/stoker/_media.*.so)
if ldd "\$media" | grep 'not found'; then echo "stoker._media: unresolved libraries" >&2; exit 1; fi
/$media_venv/bin/python check.py data work-media --media
END
  step "chroot: apt-get install libavformat59 libavcodec59 libswscale6 libswresample4, check.py --media"
  in_root "$root" /tmp/stoker-test/media.sh
fi
remove_root "$root"
for wheel in "${wheels[@]}"; do step "passed: $(basename "$wheel") ($(du -k "$wheel" | cut -f1) KiB)"; done
