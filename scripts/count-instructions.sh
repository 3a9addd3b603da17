#!/usr/bin/env bash
# Instructions on the application's core per libmoneta read, counted by callgrind (exact and
# repeatable, unlike timings). The client runs `moneta bench --path moneta` under
# valgrind; the daemon it starts runs natively (valgrind does not follow children). The count
# is the inclusive cost of `File::read_at_with` divided by its calls, minus the copy from the
# DMA slice into the caller's buffer (the memcpy called from inside it). The wait for the
# device is a spin loop whose length depends on timing; the last line leaves it out too (all
# of `Channel::wait`: the loop and the status read), which makes that figure repeatable.
#
# Usage: scripts/count-instructions.sh [SIZE] [OPS]     (default 4K, 20000)
set -euo pipefail
cd "$(dirname "$0")/.."
size=${1:-4K}
ops=${2:-20000}
command -v valgrind >/dev/null || { echo "valgrind is needed (apt-get install valgrind)" >&2; exit 2; }
cargo build --release -q -p moneta -p monetad
out=$(mktemp /tmp/moneta-callgrind.XXXXXX)
trap 'rm -f "$out"' EXIT
valgrind --tool=callgrind --callgrind-out-file="$out" \
  ./target/release/moneta bench --path moneta --size "$size" --ops "$ops" --runs 1 --warmup 0 \
  --region 8M --completion spin >/dev/null 2>&1
callgrind_annotate --tree=calling --inclusive=yes "$out" 2>/dev/null | python3 -c '
import re, sys
total = calls = copy = wait = 0
cur = None
for line in sys.stdin:
    m = re.match(r"\s*([\d,]+) \([^)]*\)\s+(\*|>)\s+(.*)", line)
    if not m:
        continue
    n = int(m.group(1).replace(",", ""))
    star, what = m.group(2), m.group(3)
    if star == "*":
        cur = what
        if re.search(r"File>?::read_at_with \[", what):
            total = n
    else:
        c = re.search(r"\(([\d,]+)x\)", what)
        k = int(c.group(1).replace(",", "")) if c else 0
        if re.search(r"File>?::read_at_with", what) and "bench::files::file_thread" in (cur or ""):
            calls = k
        if "memcpy" in what and cur and (re.search(r"File>?::one", cur) or "transfer" in cur) and k == calls:
            copy = max(copy, n)
        if "Channel::wait" in what and cur and (re.search(r"File>?::one", cur) or "transfer" in cur) and k >= calls:
            wait = max(wait, n)
if not calls:
    sys.exit("no read_at_with calls found in the profile")
print(f"reads: {calls}")
print(f"instructions per read, all:              {total / calls:.0f}")
print(f"instructions per read, copy:             {copy / calls:.0f}")
print(f"instructions per read, without the copy: {(total - copy) / calls:.0f}")
print(f"  of which waiting for the device:       {wait / calls:.0f}")
print(f"instructions per read, without copy and wait: {(total - copy - wait) / calls:.0f}")
'
