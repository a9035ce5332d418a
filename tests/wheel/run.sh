#!/usr/bin/env bash
# make test-wheel (issue 12, "pip alone"): installs the wheel that make wheel built into a bare
# Debian bookworm (tests/debian/rootfs.sh: debootstrap --variant=minbase, plus python3 and
# python3-venv from apt) that has no JPEG, PNG or WebP library and no -dev package, with pip alone
# and offline (torch and the wheel's dependencies downloaded outside, installed with --no-index),
# then packs and loads JPEG, PNG and WebP files there with stoker (tests/wheel/check.py); then
# installs FFmpeg 5.1's libraries from apt and loads video clips and audio with the wheel's
# stoker._media against them.
#
#   tests/wheel/run.sh WORK PYTHON WHEEL
#
# WORK caches the dependencies' wheels; the root file system's tarball is cached beside it, in
# WORK/../debian (shared with test-bare), and each run unpacks a fresh root from it. The mounts
# the chroot needs live in a mount namespace of their own (tests/debian/rootfs.sh's in_root), so
# they go away with it however the run ends. Needs root (without it, says so and passes), and the
# network for debootstrap and apt (DEBIAN_MIRROR, default deb.debian.org) and PyPI the first
# time. A failed run leaves WORK/root for a look; the next run replaces it.
set -euo pipefail

[ $# -eq 3 ] || { echo "usage: $0 WORK PYTHON WHEEL (one wheel; got: ${*:3})" >&2; exit 2; }
if [ "$(id -u)" != 0 ]; then
  echo "test-wheel: SKIPPED (debootstrap, mount and chroot need root: make test as root runs it)"
  exit 0
fi
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=../debian/rootfs.sh
source "$here/../debian/rootfs.sh"
work=$(realpath -m "$1")
py=$(cd "$(dirname "$2")" && pwd)/$(basename "$2")  # not resolved: a venv's python is a link
wheel=$(realpath "$3")
root=$work/root
mkdir -p "$work"
t0=$SECONDS
step() { echo "test-wheel [$((SECONDS - t0)) s]: $*"; }

# 1. A fresh bare root, with Debian's python3 and python3-venv.
tarball=$(rootfs_tar "$(dirname "$work")/debian")
step "a fresh root from $tarball; apt-get install python3 python3-venv"
fresh_root "$tarball" "$root"
cat > "$root/tmp/python.sh" <<'EOF'
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq && apt-get install -y -qq --no-install-recommends python3 python3-venv > /dev/null
rm -rf /var/lib/apt/lists/*
EOF
in_root "$root" /tmp/python.sh

# 2. What the root lacks: any JPEG, PNG or WebP library, any -dev package.
found=$(find "$root" -xdev \( -name 'libjpeg.so*' -o -name 'libturbojpeg.so*' -o -name 'libspng*.so*' \
        -o -name 'libwebp*.so*' -o -name 'libsharpyuv.so*' -o -name 'libpng*.so*' \) -print)
if [ -n "$found" ]; then echo "the bare root has image libraries:" "$found" >&2; exit 1; fi
packages=$(chroot "$root" dpkg-query -W -f '${Package}\n' | grep -E 'jpeg|png|webp|-dev$' || true)
if [ -n "$packages" ]; then echo "the bare root has packages:" $packages >&2; exit 1; fi
step "root without libjpeg, libturbojpeg, libspng, libwebp, libpng, -dev packages: checked"

# 3. torch and the wheel's dependencies, downloaded outside for the same Python (bookworm's
# 3.11), once for each set of requirements.
version() { "$@" -c 'import sys; print("%d.%d" % sys.version_info[:2])'; }
if [ "$(version "$py")" != "$(version chroot "$root" python3)" ]; then
  echo "$0: $py is Python $(version "$py"), the bare root's is $(version chroot "$root" python3):" \
       "the dependencies' wheels are downloaded for the former" >&2
  exit 1
fi
requires=$("$py" - "$wheel" <<'EOF'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
    print(sorted(l for l in z.read(meta).decode().splitlines() if l.startswith("Requires-Dist")))
EOF
)
key=$(echo "torch==2.13.0 $requires" | sha256sum | cut -c1-16)
wheelhouse=$work/wheelhouse
if [ "$(cat "$wheelhouse/.key" 2>/dev/null)" != "$key" ]; then
  step "pip download torch==2.13.0 and the wheel's dependencies into $wheelhouse"
  mkdir -p "$wheelhouse"
  "$py" -m pip download -q --only-binary=:all: -d "$wheelhouse" torch==2.13.0 "$wheel" \
    > "$work/pip-download.log" 2>&1 || { tail -30 "$work/pip-download.log" >&2; exit 1; }
  echo "$key" > "$wheelhouse/.key"
fi
rm -f "$wheelhouse/$(basename "$wheel")"

# 4. In the root: a venv, pip install offline, the check.
stage=$root/tmp/stoker-test
mkdir -p "$stage/data"
cp "$wheel" "$here/check.py" "$stage/"
"$py" "$here/make_images.py" "$stage/data"
cat > "$stage/inside.sh" <<EOF
set -euo pipefail
cd /tmp/stoker-test
python3 -m venv /opt/venv
/opt/venv/bin/pip install -q --no-index --find-links $wheelhouse ./$(basename "$wheel") torch==2.13.0
core=\$(echo /opt/venv/lib/python3*/site-packages/stoker/_core.*.so)
echo "ldd \$core:"
ldd "\$core" | tee ldd.txt
if grep -q 'not found' ldd.txt; then echo "unresolved libraries" >&2; exit 1; fi
if grep -E 'lib(jpeg|turbojpeg|spng|webp)' ldd.txt | grep -v '/stoker\.libs/'; then
  echo "decoders resolved outside stoker.libs" >&2; exit 1
fi
/opt/venv/bin/python check.py data work
EOF
step "chroot: python3 -m venv, pip install --no-index $(basename "$wheel") torch==2.13.0, check.py"
in_root "$root" /tmp/stoker-test/inside.sh "$wheelhouse"

# 5. Video and audio: the wheel carries stoker._media but none of FFmpeg (make wheel's --exclude);
# with FFmpeg 5.1's libraries from apt, it loads against them and decodes.
libs=$("$py" -c 'import sys, zipfile; print(*zipfile.ZipFile(sys.argv[1]).namelist())' "$wheel")
if echo "$libs" | grep -qE 'stoker\.libs/lib(av|sw)'; then echo "the wheel carries FFmpeg" >&2; exit 1; fi
cat > "$stage/media.sh" <<'EOF'
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends libavformat59 libavcodec59 libswscale6 \
  libswresample4 > /dev/null
cd /tmp/stoker-test
media=$(echo /opt/venv/lib/python3*/site-packages/stoker/_media.*.so)
if ldd "$media" | grep 'not found'; then echo "stoker._media: unresolved libraries" >&2; exit 1; fi
/opt/venv/bin/python check.py data work --media
EOF
step "chroot: apt-get install libavformat59 libavcodec59 libswscale6 libswresample4, check.py --media"
in_root "$root" /tmp/stoker-test/media.sh
remove_root "$root"
step "passed ($(basename "$wheel"), $(du -k "$wheel" | cut -f1) KiB)"
