#!/usr/bin/env bash
# make fuzz: runs each libFuzzer harness for FUZZ_SECONDS (default 60) on its
# seed corpus (tests/fuzz/corpus/NAME, read only) plus what earlier runs found
# (BUILD/fuzz-corpus/NAME), prints executions per harness, and fails if any
# harness crashed, leaked, hit undefined behaviour, broke an invariant, or
# hung past -timeout. Crash inputs land in BUILD/fuzz-artifacts/; libFuzzer's
# output is kept in BUILD/fuzz-NAME.log. Earlier findings (tests/fuzz/crashes/
# NAME) are run first and must not crash again.
#
# usage: tests/fuzz/run.sh BUILD [SECONDS] [HARNESS...]
set -u
SRC=$(cd "$(dirname "$0")/../.." && pwd)
B=$(cd "${1:?usage: run.sh BUILD [SECONDS] [HARNESS...]}" && pwd)
SECS=${2:-${FUZZ_SECONDS:-60}}
shift $(( $# >= 2 ? 2 : $# ))
HARNESSES=${*:-safetensors script dataset checkpoint image tokenizer spm toml}

# one thread per run: kernels of fuzzed scripts are tiny, and runs stay
# reproducible. Sanitizer settings: an allocation over 512 MiB fails (as it
# does on a small machine) instead of aborting, so a script asking for a huge
# arena exercises the error path; leaks are checked at exit.
export OMP_NUM_THREADS=1
export ASAN_OPTIONS=${ASAN_OPTIONS:-allocator_may_return_null=1:max_allocation_size_mb=512:detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

declare -A MAXLEN=([safetensors]=4096 [script]=4096 [dataset]=8192 [checkpoint]=8192 [image]=16384 [tokenizer]=8192 [spm]=8192 [toml]=8192)
declare -A EXTRA=([script]="-dict=$SRC/tests/fuzz/script.dict" [checkpoint]="-dict=$SRC/tests/fuzz/checkpoint.dict" [toml]="-dict=$SRC/tests/fuzz/toml.dict")

mkdir -p "$B/fuzz-artifacts"
failed=0
# first the findings of earlier runs (tests/fuzz/crashes/NAME): none may come back
for h in $HARNESSES; do
  found=$(find "$SRC/tests/fuzz/crashes/$h" -type f 2>/dev/null | sort)
  [ -n "$found" ] || continue
  # shellcheck disable=SC2086
  if ! "$B/fuzz_$h" -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=2048 $found > "$B/fuzz-$h-findings.log" 2>&1; then
    echo "fuzz_$h: a finding in tests/fuzz/crashes/$h came back (see $B/fuzz-$h-findings.log)"
    failed=1
  fi
done
printf '%-12s %10s %8s %9s %8s  %s\n' harness execs seconds "exec/s" corpus result
for h in $HARNESSES; do
  bin=$B/fuzz_$h
  [ -x "$bin" ] || { echo "missing $bin (build the fuzz_harnesses target)"; failed=1; continue; }
  mkdir -p "$B/fuzz-corpus/$h"
  log=$B/fuzz-$h.log
  start=$(date +%s%N)
  # shellcheck disable=SC2086
  "$bin" -max_total_time="$SECS" -max_len="${MAXLEN[$h]}" -timeout=10 -rss_limit_mb=2048 \
    -malloc_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$B/fuzz-artifacts/$h-" ${EXTRA[$h]:-} \
    "$B/fuzz-corpus/$h" "$SRC/tests/fuzz/corpus/$h" > "$log" 2>&1
  rc=$?
  ms=$(( ($(date +%s%N) - start) / 1000000 ))
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  [ -n "$execs" ] || execs=$(sed -n 's/^#\([0-9]*\).*/\1/p' "$log" | tail -1)
  corpus=$(find "$B/fuzz-corpus/$h" -type f | wc -l)
  rate=$(( ${execs:-0} * 1000 / (ms > 0 ? ms : 1) ))
  if [ $rc -eq 0 ]; then result=ok
  else
    result="FAILED (exit $rc): $(grep -m1 -E '^==[0-9]+==ERROR|runtime error|invariant broken|ERROR: libFuzzer' "$log" | cut -c1-160)"
    failed=1
  fi
  printf '%-12s %10s %8s %9s %8s  %s\n' "$h" "${execs:-?}" "$((ms / 1000))" "$rate" "$corpus" "$result"
done
if [ $failed -ne 0 ]; then
  echo "fuzzing found problems: logs in $B/fuzz-*.log, inputs in $B/fuzz-artifacts/"
  exit 1
fi
