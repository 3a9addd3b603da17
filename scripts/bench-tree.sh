#!/usr/bin/env bash
# A file-heavy tool workload (docs/performance.md): untar of a tree of many small files
# (/usr/include and /usr/share: about 62,000 entries, 730 MB), `git add` and `git status` of
# it, and `rm -rf` of it all, on tmpfs, on the host's disk file system and on nvfs through
# the shim (a persistent array at the daemon's default settings, of SIZE). Each round runs
# every target, in an order that rotates; prints one line per target and round (seconds).
#
#   scripts/bench-tree.sh                     # 2 rounds, ./target/release, /var/tmp
#   ROUNDS=3 WORK=/work/tmp SRC="usr/include" scripts/bench-tree.sh
set -euo pipefail

BIN=${BIN:-$PWD/target/release}
WORK=${WORK:-/var/tmp/moneta-tree}   # on the host's disk: the `disk` target, the image
SHM=${SHM:-/dev/shm/moneta-tree}
ROUNDS=${ROUNDS:-2}
SRC=${SRC:-"usr/include usr/share"}
SIZE=${SIZE:-2G}
TARGETS=${TARGETS:-"tmpfs disk moneta"}
SOCK=$WORK/monetad.sock

mkdir -p "$WORK"
trap '[ -S "$SOCK" ] && "$BIN/moneta" stop --socket "$SOCK" >/dev/null; rm -rf "$WORK/array.img" "$SHM"' EXIT
TAR=$WORK/tree.tar
# shellcheck disable=SC2086
[ -f "$TAR" ] || tar -cf "$TAR" -C / $SRC 2>/dev/null || true

on() {
  local target=$1
  shift
  case $target in
    moneta) "$BIN/moneta" run --no-start --socket "$SOCK" -- "$@" ;;
    *) "$@" ;;
  esac
}
dir_of() {
  case $1 in
    tmpfs) echo "$SHM/fs" ;;
    disk) echo "$WORK/fs" ;;
    moneta) echo "/moneta/fs" ;;
  esac
}
# Seconds a command takes; the host's disk is synced after it, so that the disk's figures
# include their writeback as nvfs's include the daemon's.
timed() {
  local t0 t1
  t0=$(date +%s.%N)
  "$@" >/dev/null
  sync
  t1=$(date +%s.%N)
  echo "$t1 - $t0" | bc
}

printf 'round\ttarget\tuntar_s\tgit_add_s\tgit_status_s\trm_s\tentries\tload\n'
read -ra list <<<"$TARGETS"
for ((r = 0; r < ROUNDS; r++)); do
  for ((k = 0; k < ${#list[@]}; k++)); do
    t=${list[$(((k + r) % ${#list[@]}))]}
    d=$(dir_of "$t")
    case $t in
      moneta)
        rm -f "$WORK/array.img"
        "$BIN/moneta" start --socket "$SOCK" --device "$WORK/array.img" --size "$SIZE" >/dev/null
        ;;
      *) rm -rf "$d" ;;
    esac
    on "$t" mkdir -p "$d"
    untar=$(timed on "$t" tar -xf "$TAR" -C "$d")
    add=$(timed on "$t" sh -c "cd '$d' && git init -q && git add -A")
    status=$(timed on "$t" sh -c "cd '$d' && git status --porcelain")
    entries=$(on "$t" sh -c "cd '$d' && find . | wc -l")
    rmt=$(timed on "$t" rm -rf "$d")
    [ "$t" = moneta ] && "$BIN/moneta" stop --socket "$SOCK" >/dev/null && rm -f "$WORK/array.img"
    printf '%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$r" "$t" "$untar" "$add" "$status" "$rmt" \
      "$entries" "$(cut -d' ' -f1 /proc/loadavg)"
  done
done
