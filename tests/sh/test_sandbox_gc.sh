# No script in the sandbox gets a finalizer of its own (Lua runs finalizers
# with hooks off, where neither the instruction budget, Ctrl-C nor
# ck_interrupt can stop them, at exit or inside a callback): the metatables of
# the files io hands out are locked like ck's own userdata, debug cannot reach
# them, and setmetatable refuses __gc. Each variant must end within 5 s (a
# finalizer that loops would hang the exit), and the finalizer must not run.
set -u
t=$(mktemp -d)
trap 'rm -rf "$t"' EXIT
CK=$(cd "$(dirname "$CKRUN")" && pwd)/$(basename "$CKRUN")
cd "$t" || exit 1
pass=0 fail=0
ok() { if [ "$1" = 0 ]; then pass=$((pass+1)); echo "ok   $2"; else fail=$((fail+1)); echo "FAIL $2"; fi; }
echo data > f.txt
LOOP='function() io.open("ran", "w"):close(); while true do end end'
try() { # NAME CODE: finishes within 5 s and no finalizer ran
  rm -f ran
  local start=$SECONDS out
  out=$(timeout 5 "$CK" -e "$2" 2>&1); local rc=$?
  [ $rc != 124 ] && [ ! -e ran ]; ok $? "$1: ends in $((SECONDS - start)) s (exit $rc) without a finalizer: $(echo "$out" | head -c 200)"
}
try "__gc on io.stdout's metatable" "getmetatable(io.stdout).__gc = $LOOP"
try "__gc on io.stderr's metatable" "getmetatable(io.stderr).__gc = $LOOP"
try "__gc on an opened file's metatable" "local f = io.open('f.txt'); getmetatable(f).__gc = $LOOP"
try "rawset on the file metatable" "rawset(getmetatable(io.stdout), '__gc', $LOOP)"
try "__close on the file metatable" "getmetatable(io.stdout).__close = $LOOP; do local x <close> = io.stdout end"
try "setmetatable on a file" "setmetatable(io.stdout, {__gc = $LOOP})"
try "debug.getmetatable" "debug.getmetatable(io.stdout).__gc = $LOOP"
try "debug.setmetatable" "debug.setmetatable(io.stdout, {__gc = $LOOP})"
try "debug.getregistry" "debug.getregistry()['FILE*'].__gc = $LOOP"
try "setmetatable with __gc" "setmetatable({}, {__gc = $LOOP})"
try "setmetatable with __gc = false, set later" "local mt = {__gc = false}; setmetatable({}, mt); mt.__gc = $LOOP"
try "a __gc added after setmetatable" "local mt = {}; local t = setmetatable({}, mt); mt.__gc = $LOOP; t = nil; collectgarbage()"
try "__gc through a ck userdata" "local ck = require 'ck'; getmetatable(ck.graph()).__gc = $LOOP"
try "the string metatable" "getmetatable('').__gc = $LOOP; collectgarbage()"
try "a file in a coroutine, collected" "coroutine.wrap(function() local f = io.open('f.txt'); getmetatable(f).__gc = $LOOP end)(); collectgarbage()"
try "inside a callback" "local ck = require 'ck'; ck.call_limited(function() getmetatable(io.stdout).__gc = $LOOP; collectgarbage() end)"
m=$("$CK" -e 'print(getmetatable(io.stdout), getmetatable(io.open("f.txt")))' 2>&1)
[ "$m" = "$(printf 'false\tfalse')" ]; ok $? "getmetatable of a file gives false ($m)"
m=$("$CK" -e 'local f = io.open("f.txt"); print(f:read("l")); f:close(); io.write("w\n")' 2>&1)
[ "$m" = "$(printf 'data\nw')" ]; ok $? "files still work ($m)"
echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
