#!/usr/bin/env bash
# make test-bare (issue 33): a new user's first steps as the README gives them, in a bare Debian 12
# (tests/debian/rootfs.sh: debootstrap --variant=minbase, with no Python, no compiler, no make),
# as root there, from a copy of this tree's tracked files:
#   apt-get install make
#   make demo
# make's own set-up must install the rest (Python with venv and headers, g++, pkg-config, the
# decoders' headers), build stoker, and run the demo, which exits non-zero unless the CNN it trains
# on stoker's batches learns. Debian's packages come from the network. The Python packages make
# demo installs (PY_CORE) are downloaded outside, for the same Python (3.11), and read inside as
# a mirror would serve them (PIP_FIND_LINKS, PIP_NO_INDEX).
#
#   tests/bare/run.sh WORK PYTHON "REQUIREMENTS"
#
# WORK holds the wheelhouse and the root while it runs (a failed run leaves WORK/root for a look;
# the next run replaces it); the root file system's tarball is cached beside it, in WORK/../debian,
# shared with test-wheel. Without root it says so and passes: what needs root is skipped.
set -euo pipefail

[ $# -eq 3 ] || { echo "usage: $0 WORK PYTHON REQUIREMENTS" >&2; exit 2; }
if [ "$(id -u)" != 0 ]; then
  echo "test-bare: SKIPPED (debootstrap, mount and chroot need root: make test as root runs it)"
  exit 0
fi
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
# shellcheck source=../debian/rootfs.sh
source "$here/../debian/rootfs.sh"
work=$(realpath -m "$1")
py=$(cd "$(dirname "$2")" && pwd)/$(basename "$2")
requirements=$3
t0=$SECONDS
step() { echo "test-bare [$((SECONDS - t0)) s]: $*"; }

# The machine's cache (STOKER_CACHE, the Makefile's $(CACHE)): the root file system's tarball,
# the roots' apt packages, the wheelhouses; without it, beside WORK.
cache=$(realpath -m "${STOKER_CACHE:-$(dirname "$work")}")
export IN_ROOT_APT=$cache/debian/apt
tarball=$(rootfs_tar "$cache/debian")
root=$work/root
step "a fresh bare root from $tarball"
fresh_root "$tarball" "$root"
for command in python3 g++ make pkg-config; do
  if chroot "$root" /bin/sh -c "command -v $command" > /dev/null; then
    echo "the bare root has $command" >&2
    exit 1
  fi
done

wheelhouse=$cache/wheelhouse-bare
key=$(echo "pip $requirements" | sha256sum | cut -c1-16)
if [ "$(cat "$wheelhouse/.key" 2>/dev/null)" != "$key" ]; then
  step "pip download pip $requirements into $wheelhouse"
  rm -rf "$wheelhouse" && mkdir -p "$wheelhouse"
  # shellcheck disable=SC2086  # the requirements are words
  "$py" -m pip download -q --only-binary=:all: -d "$wheelhouse" pip $requirements \
    > "$work/pip-download.log" 2>&1 || { tail -30 "$work/pip-download.log" >&2; exit 1; }
  echo "$key" > "$wheelhouse/.key"
fi

step "copying this tree's tracked files to /root/stoker"
mkdir -p "$root/root/stoker"
git -C "$repo" ls-files -z | tar -C "$repo" --null -cf - -T - | tar -C "$root/root/stoker" -xf -
cat > "$root/root/first-steps.sh" <<'INSIDE'
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq make > /dev/null
cd /root/stoker
make demo
INSIDE
step "chroot: apt-get install make; make demo"
export PIP_FIND_LINKS=$wheelhouse PIP_NO_INDEX=1
IN_ROOT_ENV="PIP_FIND_LINKS PIP_NO_INDEX" in_root "$root" /root/first-steps.sh "$wheelhouse"
remove_root "$root"
step "passed"
