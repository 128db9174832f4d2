# An open .safetensors file holds a descriptor until it is closed (its tensors
# are read from the file on demand): a script that opens thousands without
# closing them, under a limit of 64 descriptors, still runs, since files
# dropped unclosed give theirs back when the collector finds them.
set -u
pass=0 fail=0
ok() { if [ "$1" = 0 ]; then pass=$((pass+1)); echo "ok   $2"; else fail=$((fail+1)); echo "FAIL $2"; fi; }
CK=$(cd "$(dirname "$CKRUN")" && pwd)/$(basename "$CKRUN")
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cd "$dir" || exit 1
cat > many.lua <<'LUA'
local ck = require "ck"
ck.write_safetensors("x.safetensors", {{"x", {2}, {1, 2}}})
local n = 0
for i = 1, 2000 do n = n + ck.safetensors("x.safetensors"):read("x")[2] end
print(n)
LUA
out=$(ulimit -n 64 && "$CK" many.lua 2>&1)
[ "$out" = "4000.0" ]; ok $? "2000 files opened and dropped unclosed under ulimit -n 64 ($out)"
echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
