# Bad scripts fail with exactly one line on stderr that names the script file
# and line, and a non-zero exit.
set -u
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
pass=0 fail=0
check() { # name, expected exit (nonzero), stderr pattern, script args...
  local name=$1 pattern=$2; shift 2
  "$CKRUN" "$@" > "$dir/out" 2> "$dir/err"
  local rc=$?
  local lines
  lines=$(wc -l < "$dir/err")
  if [ "$rc" -ne 0 ] && [ "$lines" -eq 1 ] && grep -qE -- "$pattern" "$dir/err"; then
    pass=$((pass+1)); echo "ok   $name: $(cat "$dir/err")"
  else
    fail=$((fail+1)); echo "FAIL $name (exit $rc, $lines lines on stderr):"; cat "$dir/err"
  fi
}

cat > "$dir/shape.lua" <<'LUA'
local ck = require "ck"
local g = ck.graph()
local x = g:input("x", {1, 320, 8, 8})
g:push_scope("down_blocks.1.resnets.0.conv1")
local w = g:param("weight", {640, 640, 3, 3})
local y = ck.conv2d(x, w, nil, {padding = 1})
LUA
check "shape mismatch names file, line, op and scope" \
  "shape\.lua:6: conv2d in down_blocks\.1\.resnets\.0\.conv1: input has 320 channels, weight expects 640" "$dir/shape.lua"

cat > "$dir/linear.lua" <<'LUA'
local ck = require "ck"
local g = ck.graph()
local x = g:input("x", {2, 7})

local y = ck.linear(x, g:param("w", {3, 8}))
LUA
check "linear mismatch" "linear\.lua:5: linear: input has 7 features, weight expects 8" "$dir/linear.lua"

check "missing script" "cannot open script '.*nope\.lua'" "$dir/nope.lua"

printf 'local x = 1\nlocal y = = 2\n' > "$dir/syntax.lua"
check "syntax error" "syntax\.lua:2: .*near '='" "$dir/syntax.lua"

printf 'local t = nil\n\nprint(t.field)\n' > "$dir/runtime.lua"
check "runtime error" "runtime\.lua:3: attempt to index" "$dir/runtime.lua"

printf 'error("dataset missing")\n' > "$dir/raise.lua"
check "error() from the script" "raise\.lua:1: dataset missing" "$dir/raise.lua"

cat > "$dir/badread.lua" <<'LUA'
local ck = require "ck"
local g = ck.graph()
local x = g:input("x", {2})
local y = ck.silu(x)
local p = g:compile{outputs = {}}
p:set(x, {1, 2, 3})
LUA
check "wrong number of values" "badread\.lua:6: 'x' \[2\] has 2 elements, got 3 values" "$dir/badread.lua"

check "unknown option" "unknown option '--bogus'" --bogus

echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
