#!/usr/bin/env bash
# Metadata durability and space (docs/performance.md): 2,000 autocommit SQLite updates, and a
# copy of /usr/include and its removal, on tmpfs, on the host's disk and on nvfs through the
# shim (a volatile array, and a backing file at each durability level). Each round runs every
# target once, in an order that rotates from round to round, each on a fresh database, array
# and daemon. Prints one line per measurement (tab-separated) and the load average.
#
#   scripts/bench-durability.sh                 # 3 rounds, ./target/release, /var/tmp
#   ROUNDS=5 WORK=/work/tmp TARGETS="disk moneta-host" scripts/bench-durability.sh
set -euo pipefail

BIN=${BIN:-$PWD/target/release}
WORK=${WORK:-/var/tmp/moneta-durability}   # on the host's disk: the `disk` target and images
SHM=${SHM:-/dev/shm/moneta-durability}
ROUNDS=${ROUNDS:-3}
ROWS=${ROWS:-2000}
SRC=${SRC:-/usr/include}
SIZE=${SIZE:-2G}
TARGETS=${TARGETS:-"tmpfs disk moneta-volatile moneta-device moneta-host"}
SOCK=$WORK/monetad.sock

mkdir -p "$WORK" "$SHM"
# A daemon this script started is stopped however it ends.
trap '[ -S "$SOCK" ] && "$BIN/moneta" stop --socket "$SOCK" >/dev/null; rm -f "$WORK/array.img"' EXIT
sql="$WORK/sql"
mkdir -p "$sql"
{
  echo "create table t(a integer primary key, b);"
  echo "begin;"
  for ((i = 1; i <= ROWS; i++)); do echo "insert into t values($i, 0);"; done
  echo "commit;"
} >"$sql/setup.sql"
for ((i = 1; i <= ROWS; i++)); do echo "update t set b=b+1 where a=$i;"; done >"$sql/update.sql"

now() { date +%s.%N; }
secs() { echo "$2 - $1" | bc; }

# Runs a command for a target: under the shim for Moneta targets.
on() {
  local target=$1
  shift
  case $target in
    moneta-*) "$BIN/moneta" run --no-start --socket "$SOCK" -- "$@" ;;
    *) "$@" ;;
  esac
}

dir_of() {
  case $1 in
    tmpfs) echo "$SHM/fs" ;;
    disk) echo "$WORK/fs" ;;
    moneta-*) echo "/moneta" ;;
  esac
}

start() {
  case $1 in
    moneta-volatile) "$BIN/moneta" start --socket "$SOCK" --volatile --size "$SIZE" >/dev/null ;;
    moneta-device | moneta-host)
      rm -f "$WORK/array.img"
      "$BIN/moneta" start --socket "$SOCK" --device "$WORK/array.img" --size "$SIZE" \
        -- --durability "${1#moneta-}" >/dev/null
      ;;
    *) rm -rf "$(dir_of "$1")" && mkdir -p "$(dir_of "$1")" ;;
  esac
}

stop() {
  case $1 in
    moneta-*) "$BIN/moneta" stop --socket "$SOCK" >/dev/null && rm -f "$WORK/array.img" ;;
    *) rm -rf "$(dir_of "$1")" ;;
  esac
}

# Bytes used in the file system that holds $2, for the Moneta targets (the host's file systems
# are shared with other programs: there, du of the copy) (statfs: blocks - free blocks, times the size).
used() { on "$1" stat -f -c '%S %b %f' "$2" | awk '{ printf "%.0f\n", ($2 - $3) * $1 }'; }

printf 'round\ttarget\tupdates_s\tper_update_us\tcp_s\tcopy_du_bytes\tcopy_statfs_bytes\timage_bytes\trm_s\tfreed_back\tload\n'
read -ra list <<<"$TARGETS"
for ((r = 0; r < ROUNDS; r++)); do
  n=${#list[@]}
  for ((k = 0; k < n; k++)); do
    t=${list[$(((k + r) % n))]}
    start "$t"
    d=$(dir_of "$t")
    on "$t" sqlite3 "$d/t.db" <"$sql/setup.sql"
    t0=$(now)
    on "$t" sqlite3 "$d/t.db" <"$sql/update.sql"
    t1=$(now)
    sum=$(on "$t" sqlite3 "$d/t.db" "select sum(b) from t")
    [ "$sum" = "$ROWS" ] || { echo "$t: sum(b) is $sum, not $ROWS" >&2; exit 1; }
    base=$(used "$t" "$d")
    t2=$(now)
    on "$t" cp -a "$SRC" "$d/include"
    t3=$(now)
    copied=$(($(used "$t" "$d") - base))
    du=$(on "$t" du -sB1 "$d/include" | cut -f1)
    # What the backing file takes on the host's disk (it is sparse), with the copy in it.
    img=-
    [ -f "$WORK/array.img" ] && img=$(du -sB1 "$WORK/array.img" | cut -f1)
    t4=$(now)
    on "$t" rm -rf "$d/include"
    t5=$(now)
    back=$(($(used "$t" "$d") - base))
    up=$(secs "$t0" "$t1")
    printf '%s\t%s\t%.3f\t%.0f\t%.3f\t%s\t%s\t%s\t%.3f\t%s\t%s\n' "$r" "$t" "$up" \
      "$(echo "$up * 1000000 / $ROWS" | bc -l)" "$(secs "$t2" "$t3")" "$du" "$copied" "$img" \
      "$(secs "$t4" "$t5")" "$back" "$(cut -d' ' -f1 /proc/loadavg)"
    stop "$t"
  done
done
