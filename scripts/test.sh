#!/usr/bin/env bash
# Installs what the tests need and runs all of them: formatting, lints, fuzzing (bounded), unit
# and integration tests (real monetad processes, real client processes).
#
# Environment: MONETA_FUZZ_SECONDS (per fuzz target, default 30).
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v c++ >/dev/null || need_apt+=(g++)        # libFuzzer is built from C++ sources
command -v make >/dev/null || need_apt+=(make)
# Real programs the LD_PRELOAD shim is tested with (coreutils, python3 and a C compiler are
# on the machine already).
command -v sqlite3 >/dev/null || need_apt+=(sqlite3)
command -v fio >/dev/null || need_apt+=(fio)
command -v rsync >/dev/null || need_apt+=(rsync)
command -v git >/dev/null || need_apt+=(git)
command -v mdb_load >/dev/null || need_apt+=(lmdb-utils)   # LMDB maps its files
# A statically linked program the shim cannot reach (ldd fails on a static one); it replaces
# the distribution's dynamically linked busybox.
{ command -v busybox >/dev/null && ! ldd "$(command -v busybox)" >/dev/null 2>&1; } ||
  need_apt+=(busybox-static)
# The applications benchmark (crates/moneta/src/apps.rs, tests/apps.rs): Berkeley DB's headers
# for examples/apps/bdb_bench.c, and mkfs.xfs for the XFS loop-device target.
[ -f /usr/include/db.h ] || need_apt+=(libdb-dev)
command -v mkfs.xfs >/dev/null || [ -x /usr/sbin/mkfs.xfs ] || [ -x /sbin/mkfs.xfs ] || need_apt+=(xfsprogs)
# moneta mount (crates/moneta/tests/mount.rs): FUSE's fusermount3 (mounts without root) and
# setpriv for the tests' other users.
command -v fusermount3 >/dev/null || need_apt+=(fuse3)
command -v setpriv >/dev/null || need_apt+=(util-linux)
# moneta export serves through nbdkit; its tests use libnbd's and QEMU's NBD clients
command -v nbdkit >/dev/null || need_apt+=(nbdkit)
command -v nbdcopy >/dev/null || need_apt+=(libnbd-bin)
command -v qemu-img >/dev/null || need_apt+=(qemu-utils)
if [ ${#need_apt[@]} -gt 0 ]; then
  sudo_cmd=""
  [ "$(id -u)" = 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  $sudo_cmd apt-get install -y -qq "${need_apt[@]}"
fi

echo "== fmt"
cargo fmt --all -- --check
echo "== clippy"
cargo clippy --workspace --all-targets --quiet -- -D warnings
echo "== fuzz"
scripts/fuzz.sh "${MONETA_FUZZ_SECONDS:-30}"
echo "== tests"
cargo test --workspace
