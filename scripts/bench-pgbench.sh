#!/usr/bin/env bash
# pgbench (TPC-B like, scale 5, 2 clients) on PostgreSQL run unmodified: on nvfs through the
# shim (a volatile array, and a backing file at each durability level) and on the kernel's file
# systems (the host's disk, tmpfs), each on a fresh cluster and daemon. PostgreSQL refuses to
# run as root: run this as another user (for example `su someone -c scripts/bench-pgbench.sh`).
# Prints one line per target: its name and pgbench's tps.
#
#   scripts/bench-pgbench.sh                        # every target, 20 s each
#   SECONDS_EACH=60 TARGETS="disk moneta-host" scripts/bench-pgbench.sh
set -euo pipefail

BIN=${BIN:-$(cd "$(dirname "$0")/.." && pwd)/target/release}
WORK=${WORK:-$HOME/moneta-pgbench}          # on the host's disk: the `disk` target and images
SHM=${SHM:-/dev/shm/moneta-pgbench-$UID}
RUN=${RUN:-/tmp/moneta-pgbench-$UID}         # sockets and logs
SECONDS_EACH=${SECONDS_EACH:-20}
SCALE=${SCALE:-5}
CLIENTS=${CLIENTS:-2}
TARGETS=${TARGETS:-"tmpfs disk moneta-volatile moneta-device moneta-host"}
SOCK=$RUN/monetad.sock

[ "$(id -u)" != 0 ] || { echo "PostgreSQL does not run as root: run this as another user" >&2; exit 2; }
mkdir -p "$WORK" "$RUN"
trap '[ -S "$SOCK" ] && "$BIN/moneta" stop --socket "$SOCK" >/dev/null; rm -f "$WORK/array.img"' EXIT

for target in $TARGETS; do
  run=()
  case $target in
    moneta-volatile) "$BIN/moneta" start --socket "$SOCK" --volatile --size 2G >/dev/null ;;
    moneta-device | moneta-host)
      rm -f "$WORK/array.img"
      "$BIN/moneta" start --socket "$SOCK" --device "$WORK/array.img" --size 2G \
        -- --durability "${target#moneta-}" >/dev/null
      ;;
  esac
  case $target in
    moneta-*) data=/moneta/pg; run=("$BIN/moneta" run --no-start --socket "$SOCK" --) ;;
    disk) data=$WORK/pg; rm -rf "$data" ;;
    tmpfs) data=$SHM/pg; rm -rf "$data"; mkdir -p "$SHM" ;;
  esac
  "${run[@]}" initdb -D "$data" -A trust >"$RUN/initdb-$target.log" 2>&1
  "${run[@]}" pg_ctl -D "$data" -o "-k $RUN -c listen_addresses=''" -l "$RUN/pg-$target.log" \
    start >/dev/null
  pgbench -h "$RUN" -i -s "$SCALE" postgres >/dev/null 2>&1
  tps=$(pgbench -h "$RUN" -c "$CLIENTS" -T "$SECONDS_EACH" postgres 2>/dev/null |
    awk '/^tps/ { print $3; exit }')
  printf '%s\t%s\n' "$target" "$tps"
  "${run[@]}" pg_ctl -D "$data" stop -m fast >/dev/null
  case $target in
    moneta-*) "$BIN/moneta" stop --socket "$SOCK" >/dev/null; rm -f "$WORK/array.img" ;;
    disk) rm -rf "$data" ;;
    tmpfs) rm -rf "$SHM" ;;
  esac
done
