# Ctrl-C and the callback budget stop the string and table functions' C loops
# (patterns, builders, copies, table.sort) and the copies of `..`: each
# shape below runs for minutes or hours in Lua's own C code (a backtracking
# pattern, a loop of big copies that the count hook sees as a few
# instructions each). Started, sent SIGINT after 0.5 s, each must exit within
# 1 s more, with status 130 and the interrupt message naming the line (a
# loop of `..` stops after at most two of its copies: 64 MiB each, which this
# machine's page faults have taken up to 0.5 s to fill); run
# inside ck.call_limited under --callback-budget, each must end within 5 s
# with the budget error.
set -u
t=$(mktemp -d)
trap 'rm -rf "$t"' EXIT
CK=$(cd "$(dirname "$CKRUN")" && pwd)/$(basename "$CKRUN")
cd "$t" || exit 1
pass=0 fail=0
ok() { if [ "$1" = 0 ]; then pass=$((pass+1)); echo "ok   $2"; else fail=$((fail+1)); echo "FAIL $2"; fi; }
ms() { echo $(( $(date +%s%N) / 1000000 )); }

shapes=(
  'find .-.-.-.-.-b|print(("a"):rep(1e5):find(".-.-.-.-.-b"))'
  'find with captures and init|print(("a"):rep(1e5):find("(a-)(a-)(a-)b", 2))'
  'match|print(("a"):rep(1e5):match(".-.-.-.-b$"))'
  'match anchored, a set and a class|print(("ab"):rep(5e4):match("^[ab]-[%a]-%w-.-c"))'
  'gmatch|for x in ("a"):rep(1e4):gmatch("a*a*a*a*b") do end'
  'gmatch with init|for x in ("a"):rep(1e4):gmatch("(a-)a-a-a-b", 5) do end'
  'gsub|print(("a"):rep(1e5):gsub("a-a-a-a-b", ""))'
  'a loop of gsub with a callback|while true do local s = ("a"):rep(1e6):gsub(".", function(c) return c end) end'
  'gsub with a table, no match|print(("a"):rep(1e5):gsub("a-a-a-a-b", {}))'
  '%b over unbalanced text|print(("("):rep(1e6):find("%b()"))'
  'back references|print(("a"):rep(1e5):find("(a*)%1%1b"))'
  'frontier and sets|print(("a"):rep(1e5):find("%f[%a][%a]-[%a]-[%a]-b"))'
  'a loop of string.rep|while true do local s = ("ab"):rep(2^26) end'
  'a loop of string.rep with a separator|while true do local s = ("a"):rep(2^25, "bc") end'
  'a loop of table.concat|local t = {} for i = 1, 1e6 do t[i] = "abcdefgh" end while true do local s = table.concat(t, ",") end'
  'table.concat through __index|local t = setmetatable({}, {__index = function(_, i) return "ab" end, __len = function() return 2^40 end}) print(#table.concat(t))'
  'a loop of string.format|local big = ("x"):rep(2^25) while true do local s = string.format("%s%s", big, big) end'
  'a loop of plain finds|local s = ("a"):rep(2^27) while true do s:find("b", 1, true) end'
  'a loop of string.upper|local s = ("x"):rep(2^25) while true do local u = s:upper() end'
  'a loop of string.sub|local s = ("x"):rep(2^25) while true do local u = s:sub(2) end'
  'a loop of string.byte ranges|local s = ("x"):rep(2^20) while true do local a = {s:byte(1, 9e5)} end'
  'a loop of string.pack|while true do local s = string.pack("c16777216", "") end'
  'a loop of table.insert and table.remove at the front|local t = {} for i = 1, 3e6 do t[i] = i end while true do table.insert(t, 1, 0) table.remove(t, 1) end'
  'a loop of table.move|local t = {} for i = 1, 3e6 do t[i] = i end while true do table.move(t, 1, #t, 1, {}) end'
  'table.sort of a big table|local t = {} for i = 1, 3e6 do t[i] = (i * 7919) % 3000017 end table.sort(t)'
  'a loop of table.sort|local t = {} for i = 1, 6e4 do t[i] = (i * 7919) % 60013 end while true do table.sort(table.move(t, 1, #t, 1, {})) end'
  'a loop of ..|local a = ("x"):rep(2^25) while true do local s = a .. a end'
  'a loop of .. of three strings|local a = ("x"):rep(2^25) while true do local s = a .. a .. a end'
  'a loop of .. in a coroutine, under pcall|local a = ("x"):rep(2^25) coroutine.wrap(function() while true do pcall(function() local s = a .. a end) end end)()'
  'a pattern inside pcall|while true do pcall(string.find, ("a"):rep(1e5), ".-.-.-.-b") end'
  'a pattern in a coroutine|coroutine.wrap(function() print(("a"):rep(1e5):find(".-.-.-.-b")) end)()'
)

for entry in "${shapes[@]}"; do
  name=${entry%%|*} code=${entry#*|}
  printf '%s\n' "$code" > shape.lua
  "$CK" shape.lua > out 2> err &
  pid=$!
  sleep 0.5
  sent=$(ms)
  kill -INT $pid 2>/dev/null
  waited=0
  while kill -0 $pid 2>/dev/null && [ $waited -lt 50 ]; do sleep 0.1; waited=$((waited+1)); done
  if kill -0 $pid 2>/dev/null; then kill -KILL $pid; fi
  wait $pid; rc=$?
  took=$(( $(ms) - sent ))
  [ $rc = 130 ] && [ $took -le 1000 ] && grep -q '^ckrun: shape.lua:1: interrupted$' err
  ok $? "SIGINT stops $name within 1 s (${took} ms, exit $rc: $(head -c 120 err))"
done

# the callback budget: the same shapes inside ck.call_limited; pcall inside
# the callback does not keep the error
budget=(
  'find|print(("a"):rep(1e5):find(".-.-.-.-.-b"))'
  'match|print(("a"):rep(1e5):match("(.-)(.-)(.-)b"))'
  'gmatch|for x in ("a"):rep(1e4):gmatch("a*a*a*a*b") do end'
  'gsub|print(("a"):rep(1e5):gsub("a-a-a-a-b", "x"))'
  '%b|print(("("):rep(1e6):find("%b()"))'
  'a loop of string.rep|while true do local s = ("ab"):rep(2^24) end'
  'a loop of table.concat|local t = {} for i = 1, 1e5 do t[i] = "abcdefgh" end while true do local s = table.concat(t) end'
  'table.sort|local t = {} for i = 1, 3e6 do t[i] = (i * 7919) % 3000017 end table.sort(t)'
  'a pattern in pcall|for i = 1, 1e9 do pcall(string.match, ("a"):rep(1e5), ".-.-.-b") end'
)
for entry in "${budget[@]}"; do
  name=${entry%%|*} code=${entry#*|}
  printf 'local ck = require "ck"\nck.call_limited(function()\n  %s\nend)\nprint("escaped")\n' "$code" > budget.lua
  start=$(ms)
  timeout 5 "$CK" --callback-budget 1000000 budget.lua > out 2> err; rc=$?
  took=$(( $(ms) - start ))
  [ $rc = 1 ] && grep -q '^ckrun: budget.lua:3: callback ran past its instruction budget of 1000000 instructions$' err &&
    ! grep -q escaped out
  ok $? "the callback budget stops $name (${took} ms, exit $rc: $(head -c 120 err))"
done

# what is charged is the work done: ordinary calls on big strings and tables
# inside a callback stay far within a budget of 10M
fine=(
  'appends to a big table|local t = {} for i = 1, 1e6 do t[i] = i end for i = 1, 5000 do table.insert(t, i) end for i = 1, 5000 do table.remove(t) end'
  'short pieces of a big string|local s = ("x"):rep(2^26) for i = 1, 5000 do local a, b = s:sub(i, i + 10), s:byte(-i) end'
  'finds near the start of a big string|local s = ("x"):rep(2^26) .. "y" for i = 1, 2000 do assert(s:find("x", i, true) == i and s:find("^x+", #s - 5)) end'
  'small concats, reps and formats|for i = 1, 2000 do local s = table.concat({"a", i, "b"}, ",") .. ("ab"):rep(10) .. string.format("%d %s", i, "x") end'
)
for entry in "${fine[@]}"; do
  name=${entry%%|*} code=${entry#*|}
  printf 'local ck = require "ck"\nck.call_limited(function()\n  %s\nend)\nprint("finished")\n' "$code" > fine.lua
  timeout 20 "$CK" --callback-budget 10000000 fine.lua > out 2> err; rc=$?
  [ $rc = 0 ] && grep -q finished out
  ok $? "within a budget of 10M: $name (exit $rc: $(head -c 120 err))"
done

echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
