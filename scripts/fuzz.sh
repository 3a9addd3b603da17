#!/usr/bin/env bash
# Coverage-guided fuzzing of every decoder of untrusted bytes, with libFuzzer (libfuzzer-sys)
# on the stable toolchain. Usage: scripts/fuzz.sh [seconds per target] [target...]
# Each crash is saved under fuzz/artifacts/TARGET/; copy it to fuzz/regressions/TARGET/ to keep
# it as a regression input, which this script replays first.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
secs=${1:-60}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(command control permission engine)
export RUSTFLAGS="--cfg fuzzing -Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares -Cdebug-assertions -Coverflow-checks"
# An explicit --target keeps the instrumentation off build scripts.
triple=$(rustc -vV | sed -n "s/^host: //p")
cargo build --release --bins --quiet --target "$triple"
bin=${CARGO_TARGET_DIR:-target}/$triple/release
for t in "${targets[@]}"; do
  mkdir -p "corpus/$t" "artifacts/$t" "regressions/$t"
  if compgen -G "regressions/$t/*" >/dev/null; then
    "$bin/$t" regressions/"$t"/*
  fi
  echo "fuzzing $t for ${secs}s"
  "$bin/$t" -max_total_time="$secs" -print_final_stats=1 \
    -artifact_prefix="artifacts/$t/" "corpus/$t" 2>&1 | grep -E "stat::number_of_executed_units|stat::peak_rss|ERROR|panicked|SUMMARY" || true
  if compgen -G "artifacts/$t/*" >/dev/null; then
    echo "fuzz target $t found a failing input: see fuzz/artifacts/$t/" >&2
    exit 1
  fi
done
