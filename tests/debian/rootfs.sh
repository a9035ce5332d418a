#!/usr/bin/env bash
# A bare Debian 12 (bookworm) root file system, as `debootstrap --variant=minbase` makes it: no
# Python, no compiler, no make, no image library. Made once and cached as a tarball that
# test-wheel and test-bare unpack fresh roots from; also the helpers they share.
#
#   source tests/debian/rootfs.sh; rootfs_tar CACHE    # prints the tarball's path
#   fresh_root TARBALL DIR; remove_root DIR; in_root DIR SCRIPT [BIND_RO_DIR...]
#
# CACHE is the machine's (the Makefile's $(CACHE)/debian, STOKER_CACHE): the tarball is named by
# a hash of what debootstrap is asked for, and the roots share CACHE/apt, their apt's package
# lists and downloaded packages (bound over /var/lib/apt/lists and /var/cache/apt/archives), so
# that no package is downloaded twice, in one run or across runs.
#
# Needs root, and the network for debootstrap (DEBIAN_MIRROR, default deb.debian.org).

mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}

# Removes a root left by an earlier run: first whatever is still mounted under it (only an
# interrupted run leaves mounts here), then the files, never crossing into a mount.
remove_root() {
  local dir=$1 m
  [ -e "$dir" ] || return 0
  findmnt -rn -o TARGET | { grep -F "$dir/" || true; } | sort -r | while read -r m; do umount -l "$m"; done
  rm -rf --one-file-system "$dir"
}

rootfs_tar() {
  local work=$1 tar tmp
  tar=$work/bookworm-minbase-$(echo "debootstrap --variant=minbase bookworm $mirror" | sha256sum | cut -c1-16).tar
  mkdir -p "$work"
  if [ ! -f "$tar" ]; then
    command -v debootstrap > /dev/null || { echo "debootstrap is missing (make setup)" >&2; return 1; }
    echo "debootstrap --variant=minbase bookworm from $mirror (once; cached in $tar)" >&2
    tmp=$work/rootfs.debootstrap
    remove_root "$tmp"
    debootstrap --variant=minbase bookworm "$tmp" "$mirror" > "$work/debootstrap.log" 2>&1 ||
      { tail -30 "$work/debootstrap.log" >&2; return 1; }
    rm -rf "$tmp"/var/cache/apt/archives/*.deb "$tmp"/var/lib/apt/lists/*
    tar --numeric-owner -C "$tmp" -cf "$tar.partial" .
    mv "$tar.partial" "$tar"
    remove_root "$tmp"
  fi
  echo "$tar"
}

fresh_root() {
  remove_root "$2"
  mkdir -p "$2"
  tar --numeric-owner -C "$2" -xf "$1"
  cp /etc/resolv.conf "$2/etc/resolv.conf"  # for apt inside
}

# Runs SCRIPT (a path inside the root) with bash in a clean environment, with proc, sys, a tmpfs
# on /dev/shm and each BIND_RO_DIR (a host folder, mounted read-only at the same path inside)
# mounted in a mount namespace of its own, so that they go away with it however the run ends.
# Extra environment for the script: the variables named in IN_ROOT_ENV. IN_ROOT_APT (a host
# folder: CACHE/apt) is bound read-write over the root's apt lists and package cache.
in_root() {
  local root=$1 script=$2
  shift 2
  local apt=${IN_ROOT_APT:-}
  if [ -n "$apt" ]; then mkdir -p "$apt/lists/partial" "$apt/archives/partial"; fi
  local env=(PATH=/usr/local/bin:/usr/bin:/bin HOME=/root LANG=C.UTF-8)
  local name
  for name in ${IN_ROOT_ENV:-}; do env+=("$name=${!name}"); done
  unshare --mount --propagation private bash -euo pipefail -c '
root=$1 script=$2 apt=$3; shift 3
binds=()
while [ "$1" != -- ]; do binds+=("$1"); shift; done
shift
cleanup() {
  local m
  for m in "${binds[@]}" /dev/shm /sys /proc /var/lib/apt/lists /var/cache/apt/archives; do
    if mountpoint -q "$root$m"; then umount "$root$m"; fi
  done
}
trap cleanup EXIT
for b in "${binds[@]}"; do mkdir -p "$root$b" && mount --bind -o ro "$b" "$root$b"; done
if [ -n "$apt" ]; then
  mkdir -p "$root/var/lib/apt/lists" "$root/var/cache/apt/archives"
  mount --bind "$apt/lists" "$root/var/lib/apt/lists"
  mount --bind "$apt/archives" "$root/var/cache/apt/archives"
fi
mount -t proc proc "$root/proc"
mount -t sysfs sys "$root/sys"
mkdir -p "$root/dev/shm" && mount -t tmpfs shm "$root/dev/shm"
chroot "$root" /usr/bin/env -i "$@" /bin/bash "$script"
' in-root "$root" "$script" "$apt" "$@" -- "${env[@]}"
}
