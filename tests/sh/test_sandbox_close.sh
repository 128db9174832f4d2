# What runs at the edges of a run stays under the limits:
# - every userdata the sandbox hands a script has a locked metatable, so no
#   script can give one a finalizer (Lua runs a finalizer's body with hooks off);
# - Lua code that runs at close under --trust (the coroutines a finalizer
#   resumes, the bindings it calls) is stopped by the callback budget, so
#   ckrun exits; a <close> that loops inside a callback is stopped too;
# - SIGTERM stops a run whose logger asked for it, and kills one whose
#   loggers all closed or said sigterm = false;
# - the logger reads its option tables and records raw: no metamethod runs.
# Each variant must end within its time limit.
set -u
t=$(mktemp -d)
trap 'rm -rf "$t"' EXIT
CK=$(cd "$(dirname "$CKRUN")" && pwd)/$(basename "$CKRUN")
cd "$t" || exit 1
pass=0 fail=0
ok() { if [ "$1" = 0 ]; then pass=$((pass+1)); echo "ok   $2"; else fail=$((fail+1)); echo "FAIL $2"; fi; }
echo data > f.txt
"$CK" -e 'require("ck").write_safetensors("w.safetensors", {{"a", {2}, {1, 2}}})' || echo "cannot write w.safetensors"

# ---- locked metatables: getmetatable gives false for each kind of userdata
locked() { # NAME EXPR (with ck, g, x, p in scope)
  local out
  out=$("$CK" -e "local ck = require 'ck'
local g = ck.graph(); local x = g:input('x', {2, 2}); local w = g:param('w', {2, 2})
local p = g:compile{outputs = {ck.matmul(x, w)}}
local v = $2
print(type(v), getmetatable(v))" 2>&1)
  [ "$out" = "$(printf '%s\tfalse' "${3:-userdata}")" ]; ok $? "the metatable of $1 is locked ($out)"
}
locked "io.stdout" "io.stdout"
locked "io.stderr" "io.stderr"
locked "a file io.open opened" "io.open('f.txt')"
locked "a graph" "g"
locked "a tensor" "x"
locked "a program" "p"
locked "a logger" "ck.log_open{dir = '.', jsonl = false, tensorboard = false}"
locked "a safetensors file" "ck.safetensors('w.safetensors')"
locked "a JSON object (a table)" "ck.json_object{{'a', 1}}" table

# ---- Lua code at close (--trust lets a script set finalizers)
close_try() { # NAME SECONDS ARGS... : exits within SECONDS, the finalizer started
  local name=$1 limit=$2; shift 2
  rm -f started
  local start=$SECONDS
  timeout $((limit + 5)) "$CK" "$@" > out.txt 2>&1; local rc=$?
  local took=$((SECONDS - start))
  [ $rc != 124 ] && [ $took -le "$limit" ] && [ -e started ]
  ok $? "$name: exits in $took s (exit $rc) $(head -c 120 out.txt)"
}
MARK='io.open("started", "w"):close()'
close_try "a finalizer resuming a looping coroutine at exit" 10 --trust --callback-budget 10000000 -e \
  "setmetatable({}, {__gc = function() $MARK; coroutine.wrap(function() while true do end end)() end})"
close_try "the same with --callback-budget 1000000" 5 --trust --callback-budget 1000000 -e \
  "setmetatable({}, {__gc = function() $MARK; coroutine.wrap(function() while true do end end)() end})"
close_try "30 such finalizers" 10 --trust --callback-budget 1000000 -e \
  "for i = 1, 30 do setmetatable({}, {__gc = function() $MARK; coroutine.wrap(function() while true do end end)() end}) end"
close_try "a finalizer looping over lg:write (a binding that charges the budget)" 10 --trust --callback-budget 200000 -e \
  "local lg = require('ck').log_open{dir = '.', jsonl = false, tensorboard = false}
local rec = {}; for i = 1, 1024 do rec['k' .. i] = i end
setmetatable({}, {__gc = function() $MARK; while true do lg:write(rec) end end})"
close_try "a finalizer resuming a coroutine that loops in pcall" 10 --trust --callback-budget 1000000 -e \
  "setmetatable({}, {__gc = function() $MARK; coroutine.wrap(function() while true do pcall(function() while true do end end) end end)() end})"

# ---- a <close> that loops inside a callback: the budget stops it
tbc_try() { # NAME CODE
  local start=$SECONDS out
  out=$(timeout 10 "$CK" --callback-budget 1000000 -e "local ck = require 'ck'
$2" 2>&1); local rc=$?
  [ $rc != 124 ] && [ $rc != 0 ] && echo "$out" | grep -q "(command line):[0-9]*: callback ran past its instruction budget"
  ok $? "$1: stopped in $((SECONDS - start)) s (exit $rc): $(echo "$out" | head -c 160)"
}
LOOPCLOSE='setmetatable({}, {__close = function() while true do end end})'
tbc_try "a <close> that loops as its scope ends" "ck.call_limited(function() local x <close> = $LOOPCLOSE end)"
tbc_try "while an error unwinds" "ck.call_limited(function() local x <close> = $LOOPCLOSE; error('boom') end)"
tbc_try "pcall around it" "ck.call_limited(function() pcall(function() local x <close> = $LOOPCLOSE; error('boom') end) end)"
tbc_try "in coroutine.close" "ck.call_limited(function()
  local co = coroutine.create(function() local x <close> = $LOOPCLOSE; coroutine.yield() end)
  coroutine.resume(co); coroutine.close(co) end)"

# ---- SIGTERM
term_try() { # NAME WANT(stop|kill) CODE
  rm -f ready
  "$CK" -e "$3
io.open('ready', 'w'):close()
while true do end" > /dev/null 2> err.txt &
  local pid=$!
  for _ in $(seq 200); do [ -e ready ] && break; sleep 0.02; done
  kill -TERM $pid
  for _ in $(seq 100); do kill -0 $pid 2>/dev/null || break; sleep 0.02; done
  kill -0 $pid 2>/dev/null && kill -KILL $pid
  wait $pid; local rc=$?
  if [ "$2" = stop ]; then [ $rc = 130 ] && grep -q "interrupted" err.txt
  else [ $rc = 143 ]; fi
  ok $? "SIGTERM, $1: exit $rc ($(head -c 80 err.txt))"
}
LOG='require("ck").log_open{dir = ".", tensorboard = false'
term_try "a logger open" stop "lg = $LOG}"
term_try "the loop inside pcall" stop "lg = $LOG}; pcall(function() io.open('ready', 'w'):close(); while true do end end)"
term_try "two loggers, one closed" stop "a = $LOG, jsonl_name = 'a.jsonl'}; b = $LOG, jsonl_name = 'b.jsonl'}; a:close()"
term_try "the only logger closed: SIGTERM's default" kill "lg = $LOG}; lg:close()"
term_try "a logger with sigterm = false" kill "lg = $LOG, sigterm = false}"
term_try "a logger collected" kill "do local lg = $LOG} end; collectgarbage(); collectgarbage()"

# ---- the logger reads its tables raw
BOOM='__index = function() error("a metamethod ran") end'
out=$("$CK" -e "local ck = require 'ck'
local o = setmetatable({dir = 'raw', tensorboard = false}, {$BOOM, __pairs = function() error('a metamethod ran') end})
ck.mkdir('raw'); local lg = ck.log_open(o); lg:write{step = 1, a = 1}; lg:close()
local f = io.open('raw/metrics.jsonl'); print(f and f:read('l'))" 2>&1)
echo "$out" | grep -q '^{"step":1,"time":[0-9.]*,"a":1}$'; ok $? "log_open's options: read raw ($out)"
out=$("$CK" -e "local ck = require 'ck'
local lg = ck.log_open{dir = '.', jsonl_name = 'rec.jsonl', tensorboard = false}
local inner = setmetatable({x = 2}, {$BOOM})
lg:write(setmetatable({step = 3, v = 1, inner = inner, list = setmetatable({1, 2}, {$BOOM})}, {$BOOM, __pairs = function() error('a metamethod ran') end}))
lg:close(); print(io.open('rec.jsonl'):read('l'))" 2>&1)
echo "$out" | grep -q '^{"step":3,"time":[0-9.]*,"inner":{"x":2},"list":\[1,2\],"v":1}$'; ok $? "a record and its nested tables: read raw ($out)"
out=$("$CK" -e "local ck = require 'ck'
local lg = ck.log_open{dir = '.', jsonl_name = 'idx.jsonl', tensorboard = false}
lg:write(setmetatable({v = 1}, {__index = function(t, k) if k == 'step' then return 9 end end}))
lg:close(); print(io.open('idx.jsonl'):read('l'))" 2>&1)
echo "$out" | grep -q '^{"time":[0-9.]*,"v":1}$'; ok $? "a step only __index gives is not the record's ($out)"
out=$("$CK" -e "local ck = require 'ck'
local lg = ck.log_open{dir = '.', jsonl_name = 'grow.jsonl', tensorboard = false}
local n = 0
local rec = setmetatable({step = 1, a = 1}, {__index = function(t, k) for i = 1, 300 do rawset(t, 'k' .. n .. '_' .. i, i) end; n = n + 1 end})
lg:write(rec); lg:close(); print(n, #io.open('grow.jsonl'):read('l') > 0)" 2>&1)
[ "$out" = "$(printf '0\ttrue')" ]; ok $? "an __index that would add 300 fields while the record is read never runs ($out)"
echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
