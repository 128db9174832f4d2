# The catalogue of bad inputs (tests/bad/NN_*.lua): wrong shapes, unknown ops
# and options, missing, truncated and malformed files, wrong dtypes, NaN in
# data, denied paths, and hostile scripts (endless loops in callbacks and at
# the top, memory bombs, bytecode, os.execute, finalizers). Each case must end
# with a non-zero exit (no crash), exactly one line on stderr matching its
# "-- expect:" pattern (which names the script file and line where there is
# one), and every file in the working directory, the output file among them,
# byte-identical afterwards.
#
# A case's header lines: "-- expect: REGEX" (required), "-- flags: ..."
# (ckrun options), "-- run: PATH" (run that script of the source tree instead
# of the case file), "-- args: ..." (script arguments), "-- interrupt after: S"
# (send SIGINT after S seconds). Cases run in a scratch working directory that
# tests/bad/fixtures.lua fills first.
set -u
SRC=$PWD
CK=$(cd "$(dirname "$CKRUN")" && pwd)/$(basename "$CKRUN")
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
W=$T/work
mkdir "$W"
cd "$W" || exit 1
"$CK" "$SRC/tests/bad/fixtures.lua" > /dev/null || { echo "FAIL the fixtures"; exit 1; }
lua5.4 -e 'io.write(string.dump(function() print("bytecode ran") end))' > binmod.lua
ln -s /etc link

snapshot() { find . -type f -print0 | sort -z | xargs -0 md5sum; find . -type l -printf '%p -> %l\n' | sort; }

pass=0 fail=0 crashes=0 n=0
for case in "$SRC"/tests/bad/[0-9]*.lua; do
  name=$(basename "$case" .lua)
  n=$((n+1))
  field() { sed -n "s/^-- $1: //p" "$case" | head -1; }
  expect=$(field expect)
  flags=$(field flags)
  args=$(field args)
  run=$(field run)
  after=$(field "interrupt after")
  script=$case
  [ -n "$run" ] && script=$SRC/$run
  cp keep.safetensors out.safetensors
  snapshot > "$T/before"
  if [ -n "$after" ]; then
    # shellcheck disable=SC2086
    "$CK" $flags "$script" $args > "$T/out" 2> "$T/err" &
    pid=$!
    # "after" counts from when ckrun catches SIGINT (SigCgt in /proc, set just
    # before the script runs), not from the start: a slow start-up under load
    # would otherwise take the signal's default action and leave no message
    for _ in $(seq 3000); do
      mask=$(sed -n 's/^SigCgt:[[:space:]]*//p' "/proc/$pid/status" 2> /dev/null)
      [ -z "$mask" ] && break
      [ $(( 0x$mask & 2 )) != 0 ] && break
      sleep 0.01
    done
    sleep "$after"
    kill -INT $pid 2> /dev/null
    wait $pid
    rc=$?
  else
    # shellcheck disable=SC2086
    "$CK" $flags "$script" $args > "$T/out" 2> "$T/err"
    rc=$?
  fi
  snapshot > "$T/after"
  lines=$(wc -l < "$T/err")
  why=""
  if [ -z "$expect" ]; then why="no '-- expect:' line"
  elif [ $rc -eq 0 ]; then why="exit 0"
  elif [ $rc -gt 128 ] && ! { [ -n "$after" ] && [ $rc -eq 130 ]; }; then why="crashed (exit $rc)"; crashes=$((crashes+1))
  elif [ "$lines" -ne 1 ]; then why="$lines lines on stderr"
  elif ! grep -qE -- "$expect" "$T/err"; then why="stderr does not match /$expect/"
  elif ! cmp -s "$T/before" "$T/after"; then why="files in the working directory changed: $(diff "$T/before" "$T/after" | tr '\n' ' ')"
  fi
  if [ -z "$why" ]; then
    pass=$((pass+1)); echo "ok   $name: $(cat "$T/err")"
  else
    fail=$((fail+1)); echo "FAIL $name: $why"; cat "$T/err"
  fi
  rm -f out.safetensors
done
echo "bad inputs tried: $n, crashes: $crashes"
echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
