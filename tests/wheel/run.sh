#!/usr/bin/env bash
# make test-wheel (issue 12, "pip alone"): installs the wheel that make wheel built into a bare
# Debian bookworm (debootstrap --variant=minbase, plus python3 and python3-venv) that has no JPEG,
# PNG or WebP library and no -dev package, with pip alone and offline (torch and the wheel's
# dependencies downloaded outside, installed with --no-index), then packs and loads JPEG, PNG
# and WebP files there with stoker (tests/wheel/check.py).
#
#   tests/wheel/run.sh WORK PYTHON WHEEL
#
# WORK caches the root file system as a tarball (a few minutes the first time) and the
# dependencies' wheels; each run unpacks a fresh root from it. The mounts the chroot needs (proc,
# sys, a tmpfs on /dev/shm, the wheelhouse read-only) live in a mount namespace of their own
# (unshare), so they go away with it however the run ends; they are also unmounted explicitly.
# Needs root, and the network for debootstrap (DEBIAN_MIRROR, default deb.debian.org) and PyPI
# the first time. A failed run leaves WORK/root for a look; the next run replaces it.
set -euo pipefail

[ $# -eq 3 ] || { echo "usage: $0 WORK PYTHON WHEEL (one wheel; got: ${*:3})" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "$0: debootstrap, mount and chroot need root" >&2; exit 1; }
here=$(cd "$(dirname "$0")" && pwd)
work=$(realpath -m "$1")
py=$(cd "$(dirname "$2")" && pwd)/$(basename "$2")  # not resolved: a venv's python is a link
wheel=$(realpath "$3")
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
rootfs_tar=$work/bookworm-minbase-python3.tar
root=$work/root
mkdir -p "$work"
t0=$SECONDS
step() { echo "test-wheel [$((SECONDS - t0)) s]: $*"; }

# Removes a root left by an earlier run: first whatever is still mounted under it (only an
# interrupted debootstrap leaves mounts here), then the files, never crossing into a mount.
remove_root() {
  local dir=$1 m
  [ -e "$dir" ] || return 0
  findmnt -rn -o TARGET | { grep -F "$dir/" || true; } | sort -r | while read -r m; do umount -l "$m"; done
  rm -rf --one-file-system "$dir"
}

# 1. The bare root: cached as a tarball.
if [ ! -f "$rootfs_tar" ]; then
  command -v debootstrap > /dev/null || { echo "$0: debootstrap is missing (make setup)" >&2; exit 1; }
  step "debootstrap --variant=minbase bookworm from $mirror (once; cached in $rootfs_tar)"
  tmp=$work/rootfs.debootstrap
  remove_root "$tmp"
  debootstrap --variant=minbase --include=python3,python3-venv bookworm "$tmp" "$mirror" \
    > "$work/debootstrap.log" 2>&1 || { tail -30 "$work/debootstrap.log" >&2; exit 1; }
  rm -rf "$tmp"/var/cache/apt/archives/*.deb "$tmp"/var/lib/apt/lists/*
  tar --numeric-owner -C "$tmp" -cf "$rootfs_tar.partial" .
  mv "$rootfs_tar.partial" "$rootfs_tar"
  remove_root "$tmp"
fi
step "unpacking a fresh root from $rootfs_tar"
remove_root "$root"
mkdir "$root"
tar --numeric-owner -C "$root" -xf "$rootfs_tar"

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
mkdir -p "$stage/wheelhouse" "$stage/data"
cp "$wheel" "$here/check.py" "$stage/"
"$py" "$here/make_images.py" "$stage/data"
cat > "$stage/inside.sh" <<EOF
set -euo pipefail
cd /tmp/stoker-test
python3 -m venv /opt/venv
/opt/venv/bin/pip install -q --no-index --find-links wheelhouse ./$(basename "$wheel") torch==2.13.0
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
# The mounts exist only in this namespace; the trap unmounts them too.
unshare --mount --propagation private bash -euo pipefail -c '
root=$1
cleanup() {
  for m in tmp/stoker-test/wheelhouse dev/shm sys proc; do
    if mountpoint -q "$root/$m"; then umount "$root/$m"; fi
  done
}
trap cleanup EXIT
mount --bind -o ro "$2" "$root/tmp/stoker-test/wheelhouse"
mount -t proc proc "$root/proc"
mount -t sysfs sys "$root/sys"
mkdir -p "$root/dev/shm" && mount -t tmpfs shm "$root/dev/shm"
chroot "$root" /usr/bin/env -i PATH=/usr/bin:/bin HOME=/root LANG=C.UTF-8 \
  /bin/bash /tmp/stoker-test/inside.sh
' unshare-chroot "$root" "$wheelhouse"
remove_root "$root"
step "passed ($(basename "$wheel"), $(du -k "$wheel" | cut -f1) KiB)"
