# The command line and the Lua module: --help and --version answer, arguments
# reach the script, and a stock lua5.4 loads ck.so from the build and trains.
set -u
pass=0 fail=0
ok() { if [ "$1" = 0 ]; then pass=$((pass+1)); echo "ok   $2"; else fail=$((fail+1)); echo "FAIL $2"; fi; }

"$CKRUN" --help | grep -q "usage: ckrun"; ok $? "ckrun --help prints usage"
"$CKRUN" --version | grep -qE "^ckrun [0-9]+\.[0-9]+\.[0-9]+$"; ok $? "ckrun --version prints the version"
out=$("$CKRUN" -e 'print(1 + 1)'); [ "$out" = 2 ]; ok $? "ckrun -e runs code"

dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
printf 'print(args.steps + 1, args.name, args.flag, args[1], args.lr * 2)\n' > "$dir/args.lua"
out=$("$CKRUN" "$dir/args.lua" --steps 9 --name=abc pos --lr 0.25 --flag)
[ "$out" = "$(printf '10\tabc\ttrue\tpos\t0.5')" ]; ok $? "arguments reach the script as args ($out)"

lua5.4 -e "package.cpath = '$CK_BUILD/lua/?.so;' .. package.cpath; local ck = require 'ck'; assert(ck.version)" 2>&1
ok $? "lua5.4 -e 'require \"ck\"' loads the module from the build"

out=$(lua5.4 -e "package.cpath = '$CK_BUILD/lua/?.so;' .. package.cpath
local ck = require 'ck'
local g = ck.graph()
local x = g:input('x', {4, 3})
local w = g:param('w', {1, 3})
local p = g:compile{loss = ck.mean(ck.linear(x, w) * ck.linear(x, w)), optimizer = 'sgd', lr = 0.1}
p:set(x, 1)
local first = p:step()
local last
for i = 1, 20 do last = p:step() end
print(last < first * 0.01)" 2>&1)
[ "$out" = true ]; ok $? "a stock lua5.4 trains a graph through ck.so ($out)"

echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
