# Long loops inside bindings poll for interrupts and limits: p:set over a
# values table of a billion entries (a row shared many times over, so the
# table is small) stops within 1 s of SIGINT, at the top level, one entry of a
# batch, three levels deep, four levels of 200 each, inside pcall, inside a
# checkpoint policy function;
# and a policy function that calls it runs out of its instruction budget.
# Each loop would run for seconds without the polls: a case fails if it ends
# before the interrupt.
set -u
t=$(mktemp -d)
trap 'rm -rf "$t"' EXIT
CK=$(cd "$(dirname "$CKRUN")" && pwd)/$(basename "$CKRUN")
cd "$t" || exit 1
pass=0 fail=0
ok() { if [ "$1" = 0 ]; then pass=$((pass+1)); echo "ok   $2"; else fail=$((fail+1)); echo "FAIL $2"; fi; }
ms() { echo $(( $(date +%s%N) / 1000000 )); }

cat > prelude.lua <<'EOF'
local ck = require "ck"
local g = ck.graph()
x = g:input("x", {4, 2})
local w = g:param("w", {2, 2})
loss = ck.mse_loss(ck.linear(x, w), g:input("t", {4, 2}))
G = g
p = g:compile{loss = loss, optimizer = "sgd"}
-- 10^4 numbers in a row, the row 10^5 times: 10^9 values from 10^5 slots
local row = {}
for i = 1, 10000 do row[i] = i end
huge = {}
for i = 1, 100000 do huge[i] = row end
-- three levels: 100 x 10^4 rows, 1000 times
local mid = {}
for i = 1, 100 do mid[i] = row end
deep = {}
for i = 1, 1000 do deep[i] = mid end
-- four levels of 200 entries each: 1.6 * 10^9 values, no level long
local r4 = {}
for i = 1, 200 do r4[i] = i end
for _ = 1, 3 do
  local up = {}
  for i = 1, 200 do up[i] = r4 end
  r4 = up
end
short = r4
function go() io.write("go\n") io.stdout:flush() end
EOF

# NAME LINE BODY: runs prelude + BODY (BODY's first line is script line LINE),
# sends SIGINT once it printed "go", and expects one "interrupted" line naming
# that line within 1 s, not "done"
interrupt() {
  local name=$1 line=$2 body=$3
  { cat prelude.lua; echo "$body"; echo 'print("done")'; } > case.lua
  "$CK" case.lua > out 2> err &
  local pid=$! waited=0
  while ! grep -q go out 2> /dev/null && [ $waited -lt 300 ]; do sleep 0.1; waited=$((waited+1)); done
  sleep 0.3
  local start; start=$(ms)
  kill -INT $pid 2> /dev/null
  # a run still going after 10 s is killed (polled: a killer subshell sent a
  # signal before it reset its traps would run this shell's EXIT trap)
  local polls=0
  while kill -0 $pid 2> /dev/null && [ $polls -lt 1000 ]; do sleep 0.01; polls=$((polls+1)); done
  kill -KILL $pid 2> /dev/null
  wait $pid; local rc=$?
  local took=$(( $(ms) - start ))
  local want="case\\.lua:$line: .*interrupted"
  [ $waited -lt 300 ] && [ $took -lt 1000 ] && [ $rc -ne 0 ] && [ $rc -le 130 ] && ! grep -q done out \
    && [ "$(wc -l < err)" -eq 1 ] && grep -qE "$want" err
  ok $? "$name: stopped $took ms after SIGINT (exit $rc): $(head -c 200 err)"
}

L=$(( $(wc -l < prelude.lua) + 1 ))
interrupt "p:set, two levels" $((L + 1)) "go()
p:set(x, huge)"
interrupt "p:set, one entry of the batch" $((L + 1)) "go()
p:set(x, huge, 2)"
interrupt "p:set, three levels" $((L + 1)) "go()
p:set(x, deep)"
interrupt "p:set, four levels of 200" $((L + 1)) "go()
p:set(x, short)"
interrupt "p:set inside pcall" $((L + 1)) "go()
local ok, e = pcall(p.set, p, x, huge)
print('swallowed', ok, e)"
interrupt "p:set inside a checkpoint policy function" $((L + 2)) "go()
G:compile{loss = loss, checkpoint = function(t)
  p:set(x, huge)
  return 'save'
end}"

# the instruction budget of a callback counts the loop's work
{ cat prelude.lua; cat <<'EOF'
local start = os.clock()
local ok, e = pcall(G.compile, G, {loss = loss, checkpoint = function(t)
  p:set(x, huge)
  return "save"
end})
print("swallowed", ok, e)
EOF
} > budget.lua
start=$(ms)
timeout 20 "$CK" --callback-budget 1000000 budget.lua > out 2> err; rc=$?
took=$(( $(ms) - start ))
[ $rc -ne 0 ] && [ $rc -lt 124 ] && ! grep -q swallowed out && [ "$(wc -l < err)" -eq 1 ] \
  && grep -qE "budget\\.lua:$((L + 2)): .*instruction budget" err
ok $? "p:set in a policy function runs out of a budget of 10^6 instructions in $took ms (exit $rc): $(head -c 200 err)"

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
