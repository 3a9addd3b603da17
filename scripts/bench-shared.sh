#!/usr/bin/env bash
# File calls on a shared nvfs (docs/distributed.md, "One file system on every host"): a
# manager's host (A) and a member host (B) on this machine's loopback network, each call timed
# from Python under `moneta run` on A, on B, and on tmpfs through the kernel. Prints one line
# per target and round: per call, the median and the 99th percentile in microseconds.
#
#   scripts/bench-shared.sh                 # 2 rounds, ./target/release
#   ROUNDS=4 PORT=7800 scripts/bench-shared.sh
set -euo pipefail

BIN=${BIN:-$PWD/target/release}
ROUNDS=${ROUNDS:-2}
PORT=${PORT:-7710}
WORK=$(mktemp -d /tmp/moneta-shared.XXXXXX)
SHM=/dev/shm/moneta-shared-$$
EXPORT_PID=
cleanup() {
  "$BIN/moneta" stop --socket "$WORK/b.sock" >/dev/null 2>&1 || true
  "$BIN/moneta" stop --socket "$WORK/a.sock" >/dev/null 2>&1 || true
  [ -n "$EXPORT_PID" ] && kill "$EXPORT_PID" 2>/dev/null
  rm -rf "$WORK" "$SHM"
}
trap cleanup EXIT

python3 -c "import os; print('member:' + os.urandom(32).hex())" >"$WORK/psk"
"$BIN/moneta" start --volatile --size 256M --socket "$WORK/a.sock" -- \
  --share-listen "127.0.0.1:$PORT" --share-key "$WORK/psk" >/dev/null
"$BIN/moneta" export --socket "$WORK/a.sock" --range 0:256M --ip 127.0.0.1 --port $((PORT + 1)) \
  --pidfile "$WORK/export.pid" -- --tls=require "--tls-psk=$WORK/psk" >/dev/null 2>&1
EXPORT_PID=$(cat "$WORK/export.pid")
"$BIN/moneta" start --volatile --size 16M --socket "$WORK/b.sock" -- --local-at 256M \
  --member "0:256M=nbds://member@127.0.0.1:$((PORT + 1))/?tls-psk-file=$WORK/psk" \
  --share-from "127.0.0.1:$PORT" --share-key "$WORK/psk" >/dev/null
for _ in $(seq 100); do
  "$BIN/moneta" status --socket "$WORK/b.sock" | grep -q "shared file system: member of .*: up" && break
  sleep 0.1
done

cat >"$WORK/calls.py" <<'PY'
import os, sys, time
root, name = sys.argv[1], sys.argv[2]
def timed(f, n=2000):
    t = []
    for i in range(n):
        a = time.perf_counter_ns(); f(i); t.append(time.perf_counter_ns() - a)
    t.sort()
    return t[len(t) // 2] / 1000, t[int(len(t) * 0.99)] / 1000
d = os.path.join(root, 'calls')
os.makedirs(d, exist_ok=True)
path = os.path.join(d, 'f')
fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)
os.pwrite(fd, b'x' * 65536, 0)
r = {}
r['stat'] = timed(lambda i: os.stat(path))
r['fstat'] = timed(lambda i: os.fstat(fd))
r['read-4k'] = timed(lambda i: os.pread(fd, 4096, (i % 16) * 4096))
r['write-4k'] = timed(lambda i: os.pwrite(fd, b'y' * 4096, (i % 16) * 4096))
def open_close(i):
    os.close(os.open(path, os.O_RDONLY))
r['open-close'] = timed(open_close)
def small(i):
    g = os.open(os.path.join(d, 'n%d' % i), os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o644)
    os.write(g, b'z' * 4096)
    os.close(g)
r['create-4k-close'] = timed(small, 1000)
r['unlink'] = timed(lambda i: os.unlink(os.path.join(d, 'n%d' % i)), 1000)
os.close(fd)
for i in os.listdir(d):
    os.unlink(os.path.join(d, i))
print(name, ' '.join('%s %.1f/%.1f' % (k, v[0], v[1]) for k, v in r.items()), flush=True)
PY

mkdir -p "$SHM"
for round in $(seq "$ROUNDS"); do
  MONETA_SOCKET=$WORK/a.sock "$BIN/moneta" run -- python3 "$WORK/calls.py" /moneta "round $round manager"
  MONETA_SOCKET=$WORK/b.sock "$BIN/moneta" run -- python3 "$WORK/calls.py" /moneta "round $round member"
  python3 "$WORK/calls.py" "$SHM" "round $round tmpfs"
done
