# One memory budget per VM (--max-memory): the Lua heap and everything a
# script makes the runtime take (graph nodes, op lists and plans, arenas,
# stages, tensors read from files into Lua). Each attack below runs under
# --max-memory 64M and must end in one line naming the script's file and line,
# what would pass the limit and the --max-memory value that allows it, with a
# non-zero exit and a peak RSS (the whole process, from wait4) far below what
# the attack asks for. Closing or dropping graphs and programs gives their
# bytes back, so loops that do either run to the end under the same limit.
set -u
t=$(mktemp -d)
trap 'rm -rf "$t"' EXIT
CK=$(cd "$(dirname "$CKRUN")" && pwd)/$(basename "$CKRUN")
cd "$t" || exit 1
pass=0 fail=0
ok() { if [ "$1" = 0 ]; then pass=$((pass+1)); echo "ok   $2"; else fail=$((fail+1)); echo "FAIL $2"; fi; }
# sanitizer builds map shadow memory and keep freed blocks in quarantine
BOUND=$((200 << 20))
# a 95 MiB header read whole would pass HOLE; ASan's shadow and quarantine
# lift the base of every process
HOLE=$((48 << 20))
case "$CK" in *asan*) BOUND=$((400 << 20)) HOLE=$((80 << 20)) ;; esac

# run ARGS...: runs ckrun; stdout and stderr in out, err; its exit status in
# rc and its peak RSS in bytes in rss
run() {
  python3 - "$@" > rss 2> /dev/null <<'PY'
import os, subprocess, sys
with open("out", "wb") as o, open("err", "wb") as e:
    p = subprocess.Popen(sys.argv[1:], stdout=o, stderr=e)
    _, status, ru = os.wait4(p.pid, 0)
print(os.waitstatus_to_exitcode(status), ru.ru_maxrss * 1024)
PY
  read -r rc rss < rss
}

# refused NAME SCRIPT LINE WHAT [ARGS...]: SCRIPT fails at LINE (a regex) with
# one line saying WHAT would pass the limit of 64 MiB, or, where the Lua code
# between two allocations reached the limit first, that the limit is reached
# with the runtime's bytes the larger part; within the RSS bound
refused() {
  local name=$1 script=$2 line=$3 what=$4 start=$SECONDS
  shift 4
  run timeout 60 "$CK" --max-memory 64M "$script" "$@"
  local lines msg
  lines=$(wc -l < err)
  msg=$(head -c 400 err)
  [ "$rc" = 1 ] && [ "$lines" = 1 ] &&
    { grep -Eq "^ckrun: $script:$line: .*$what.* would pass the memory limit of 64 MiB \(--max-memory [0-9]+[MG]iB allows it\)$" err ||
      grep -Eq "^ckrun: $script:$line: out of memory \(the memory limit of 64 MiB is reached: .* of Lua heap, [0-9.]+ MiB of graphs, programs and buffers; --max-memory allows more\)$" err; } &&
    [ "$rss" -lt "$BOUND" ]
  ok $? "$name: refused at $script:$line, exit $rc, peak RSS $((rss >> 20)) MiB, $((SECONDS - start)) s ($msg)"
}

# finishes NAME SCRIPT [ARGS...]: runs to the end under the limit
finishes() {
  local name=$1 script=$2 start=$SECONDS
  shift 2
  run timeout 60 "$CK" --max-memory 64M "$script" "$@"
  [ "$rc" = 0 ] && grep -q "^done$" out && [ "$rss" -lt "$BOUND" ]
  ok $? "$name: runs to the end, exit $rc, peak RSS $((rss >> 20)) MiB, $((SECONDS - start)) s ($(head -c 300 err))"
}

# 1. graph nodes: a long chain, a chain whose handles are all kept, many
#    graphs kept, long scope strings
cat > chain.lua <<'EOF'
local ck = require "ck"
local g = ck.graph()
local x = g:input("x", {4})
for i = 1, 1e8 do x = ck.silu(x) end
EOF
refused "a chain of 10^8 nodes" chain.lua 4 "the graph, grown to [0-9]+ nodes"
cat > kept.lua <<'EOF'
local ck = require "ck"
local g = ck.graph()
local x, keep = g:input("x", {4}), {}
for i = 1, 1e8 do x = x + x; keep[i] = x end
EOF
refused "two-input nodes, every handle kept" kept.lua 4 "the graph, grown to"
cat > graphs.lua <<'EOF'
local ck = require "ck"
local keep = {}
for i = 1, 1e6 do
  local g = ck.graph()
  local x = g:input("x", {4})
  for k = 1, 100 do x = ck.silu(x) end
  keep[i] = g
end
EOF
refused "10^6 graphs of 100 nodes, all kept" graphs.lua 6 "the graph, grown to"
cat > scopes.lua <<'EOF'
local ck = require "ck"
local g = ck.graph()
local x = g:input("x", {4})
g:push_scope(string.rep("s", 120))
for i = 1, 1e8 do x = ck.silu(x) end
EOF
refused "a chain in a long scope" scopes.lua 5 "the graph, grown to"

# 2. one huge tensor: an arena, a trained parameter with optimizer state,
#    a huge activation, in bf16, and the smallest arena past the limit
cat > huge_input.lua <<'EOF'
local ck = require "ck"
local g = ck.graph()
local y = ck.silu(g:input("x", {1 << 28}))
local p = g:compile{outputs = {y}}
EOF
refused "an input of 2^28 floats" huge_input.lua 4 "compile: the program's arena of 2.0 GiB"
cat > huge_param.lua <<'EOF'
local ck = require "ck"
local g = ck.graph()
local x, t = g:input("x", {2, 16384}), g:input("t", {2, 16384})
local loss = ck.mse_loss(ck.linear(x, g:param("w", {16384, 16384})), t)
local p = g:compile{loss = loss, optimizer = "adamw"}
EOF
refused "a trained 16384x16384 weight with AdamW" huge_param.lua 5 "compile: the program's arena of [0-9.]+ GiB"
cat > huge_bf16.lua <<'EOF'
local ck = require "ck"
local g = ck.graph()
local y = ck.silu(ck.silu(g:input("x", {1 << 30})))
local p = g:compile{outputs = {y}, storage = "bf16"}
EOF
refused "activations of 2^30 values in bf16" huge_bf16.lua 4 "compile: the program's arena of [0-9.]+ GiB"
cat > just_over.lua <<'EOF'
local ck = require "ck"
local g = ck.graph()
local p = g:compile{outputs = {ck.silu(g:input("x", {1 << 24}))}}
print("done")
EOF
refused "an arena of 128 MiB" just_over.lua 3 "compile: the program's arena of 128 MiB"
allow=$(sed -n 's/.*(--max-memory \([0-9]*[MG]iB\) allows it)$/\1/p' err)
run timeout 60 "$CK" --max-memory "$allow" just_over.lua
[ "$rc" = 0 ] && grep -q "^done$" out; ok $? "the value the message names (--max-memory $allow) allows it (exit $rc)"

# 3. many programs: kept (refused), closed with <close> and dropped (both run
#    to the end: each program's bytes come back)
cat > programs.lua <<'EOF'
local ck = require "ck"
local keep = {}
for i = 1, 300 do
  local g = ck.graph()
  local x = g:input("x", {1 << 18})
  if args.mode == "keep" then keep[#keep + 1] = g:compile{outputs = {ck.silu(x)}}
  elseif args.mode == "close" then local p <close> = g:compile{outputs = {ck.silu(x)}}
  else local p = g:compile{outputs = {ck.silu(x)}} end
end
print("done")
EOF
refused "300 programs of 2 MiB, all kept" programs.lua 6 "compile: the program's arena of 2 MiB" --mode keep
finishes "300 programs of 2 MiB, each closed" programs.lua --mode close
finishes "300 programs of 2 MiB, each dropped" programs.lua --mode drop
cat > trained.lua <<'EOF'
local ck = require "ck"
local keep = {}
for i = 1, 1e5 do
  local g = ck.graph()
  local x, t = g:input("x", {8, 64}), g:input("t", {8, 64})
  local h = x
  for k = 1, 20 do h = ck.silu(ck.linear(h, g:param("l" .. k, {64, 64}))) end
  keep[i] = g:compile{loss = ck.mse_loss(h, t), optimizer = "adamw"}
end
EOF
refused "10^5 small trained programs, all kept" trained.lua "[78]" "compile: the program"

# 4. files: a sparse 4 GiB file whose header claims big tensors, read into Lua
python3 - <<'PY'
import json, struct
def write(path, tensors, size):
    h = json.dumps(tensors).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        f.truncate(8 + len(h) + size)
G = 1 << 30
write("f32.safetensors", {"big": {"dtype": "F32", "shape": [G], "data_offsets": [0, 4 * G]}}, 4 * G)
write("f16.safetensors", {"big": {"dtype": "F16", "shape": [4, 512 << 20], "data_offsets": [0, 4 * G]}}, 4 * G)
write("small.safetensors", {"a": {"dtype": "F32", "shape": [64], "data_offsets": [0, 256]},
                             "big": {"dtype": "BF16", "shape": [8 << 20], "data_offsets": [256, 256 + (16 << 20)]}},
      256 + (16 << 20))
# a real header of 40 MB (an object, then spaces): 80 MB to parse
with open("spaces.safetensors", "wb") as f:
    n = 40_000_000
    f.write(struct.pack("<Q", n) + b"{}" + b" " * (n - 2))
# a small tensor and an 8 MiB one (a hole): reading the first makes the
# file's read buffer, sized for the second
write("buffer.safetensors", {"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
                              "b": {"dtype": "F32", "shape": [2 << 20], "data_offsets": [16, 16 + (8 << 20)]}},
      16 + (8 << 20))
# a header length of 95 MiB whose bytes are a hole in the file
with open("hole.safetensors", "wb") as f:
    f.write(struct.pack("<Q", 99999999))
    f.truncate(4 * G)
PY
cat > read.lua <<'EOF'
local ck = require "ck"
local f = ck.safetensors(args[1])
local v = f:read(args.key or "big")
print("done", #v)
EOF
cp read.lua read_f32.lua; cp read.lua read_f16.lua; cp read.lua read_small.lua
refused "f:read of 2^30 floats from a sparse 4 GiB file" read_f32.lua 3 "f:read of 'big' \(1073741824 values\)" f32.safetensors
refused "f:read of 2^31 fp16 values from a sparse file" read_f16.lua 3 "f:read of 'big' \(2147483648 values\)" f16.safetensors
refused "f:read of 8M bf16 values (16 MiB on disk) into a list" read_small.lua 3 "f:read of 'big' \(8388608 values\)" small.safetensors
run timeout 60 "$CK" --max-memory 64M read.lua small.safetensors --key a
[ "$rc" = 0 ] && grep -q "^done	64$" out; ok $? "a small tensor of the same file still reads (exit $rc, $(head -c 200 out))"
cat > hole.lua <<'EOF'
local ck = require "ck"
local f = ck.safetensors("hole.safetensors")
EOF
run timeout 60 "$CK" --max-memory 64M hole.lua
[ "$rc" = 1 ] && [ "$(wc -l < err)" = 1 ] && grep -q "^ckrun: hole.lua:2: " err && [ "$rss" -lt "$HOLE" ]
ok $? "a header length of 95 MiB over a hole: refused at hole.lua:2, peak RSS $((rss >> 20)) MiB ($(head -c 300 err))"
run timeout 60 "$CK" hole.lua
[ "$rc" = 1 ] && grep -q "^ckrun: hole.lua:2: hole.safetensors: header is not a JSON object" err && [ "$rss" -lt "$HOLE" ]
ok $? "the same without a tight limit: the first megabyte shows it is not JSON, peak RSS $((rss >> 20)) MiB ($(head -c 300 err))"

cat > spaces.lua <<'EOF'
local ck = require "ck"
local f = ck.safetensors("spaces.safetensors")
EOF
refused "a header of 40 MB" spaces.lua 2 "spaces.safetensors: its header of 40000000 bytes \(76.3 MiB to parse\)"
cat > buffers.lua <<'EOF'
local ck = require "ck"
local open = {}
for i = 1, 500 do
  open[i] = ck.safetensors("buffer.safetensors")
  assert(#open[i]:read("a") == 4)
end
EOF
refused "500 files kept open, each with its read buffer of 8 MiB" buffers.lua 5 "buffer.safetensors: its read buffer \(8 MiB\)"
cat > reopened.lua <<'EOF'
local ck = require "ck"
for i = 1, 500 do
  local f <close> = ck.safetensors("buffer.safetensors")
  assert(#f:read("a") == 4)
end
print("done")
EOF
finishes "500 files opened, read and closed in turn" reopened.lua

# 5. the Lua heap counts in: heap and graphs together, and the heap alone
cat > mixed.lua <<'EOF'
local ck = require "ck"
local g = ck.graph()
local p = g:compile{outputs = {ck.silu(g:input("x", {1 << 22}))}}
local t = {}
for i = 1, 1e8 do t[i] = {i} end
EOF
run timeout 60 "$CK" --max-memory 64M mixed.lua
[ "$rc" = 1 ] && [ "$(wc -l < err)" = 1 ] &&
  grep -Eq "^ckrun: mixed.lua:5: out of memory \(the memory limit of 64 MiB is reached: .* of Lua heap, 32.0 MiB of graphs, programs and buffers; --max-memory allows more\)$" err &&
  [ "$rss" -lt "$BOUND" ]
ok $? "a program of 32 MiB and a growing Lua table: refused at mixed.lua:5, peak RSS $((rss >> 20)) MiB ($(head -c 300 err))"
run timeout 60 "$CK" --max-memory 64M --max-heap 1G -e 'local t = {} for i = 1, 1e8 do t[i] = {i} end'
[ "$rc" = 1 ] && grep -q "the memory limit of 64 MiB is reached" err && [ "$rss" -lt "$BOUND" ]
ok $? "the Lua heap alone under a larger --max-heap: the memory limit holds, peak RSS $((rss >> 20)) MiB ($(head -c 300 err))"

# 5b. JSON text whose values take tens of times its bytes (jansson's, not the
#     Lua heap's): 12 MiB of "[]," decode to some 500 MiB of empty arrays;
#     a text whose values fit decodes whole under the same limit; and the
#     other way, a small table referenced a million times encodes to as many
#     arrays
cat > json_bomb.lua <<'EOF'
local ck = require "ck"
local s = string.rep("[],", 4 * 1024 * 1024) .. "[]"
local v = ck.json_decode("[" .. s .. "]")
EOF
refused "12 MiB of JSON empty arrays" json_bomb.lua 3 "json_decode: the values of 12.0 MiB of JSON text"
cat > json_fits.lua <<'EOF'
local ck = require "ck"
local v = ck.json_decode("[" .. string.rep("[1,2],", 20000) .. "[]]")
assert(#v == 20001 and v[1][2] == 2)
print("done")
EOF
finishes "a JSON text whose values fit" json_fits.lua
cat > json_refs.lua <<'EOF'
local ck = require "ck"
local x, t = {}, {}
for i = 1, 1000000 do t[i] = x end
local s = ck.json_encode(t)
EOF
refused "json_encode of one table referenced a million times" json_refs.lua 4 "json_encode: the values of the JSON text"

# 6. the defaults: the machine's memory in the sandbox, none with --trust or
#    --max-memory none; the flag's own errors
total=$(python3 -c "print(int(open('/proc/meminfo').read().split('MemTotal:')[1].split()[0]) * 1024)")
cat > machine.lua <<'EOF'
local ck = require "ck"
local g = ck.graph()
local p = g:compile{outputs = {ck.silu(g:input("x", {1 << 39}))}}
EOF
run timeout 60 "$CK" machine.lua
python3 - "$total" <<'PY' > want
import sys
n = int(sys.argv[1])
print("%.1f GiB" % (n / 2**30) if n >= 2**30 else "%.1f MiB" % (n / 2**20))
PY
grep -Eq "^ckrun: machine.lua:3: compile: the program's arena of [0-9.]+ TiB would pass the memory limit of $(cat want) " err
ok $? "the sandbox's default limit is the machine's memory, $(cat want) ($(head -c 300 err))"
# (a sanitizer's allocator aborts on a request it cannot meet unless told not to)
export ASAN_OPTIONS=${ASAN_OPTIONS:-}${ASAN_OPTIONS:+:}allocator_may_return_null=1
run timeout 60 "$CK" --trust machine.lua
[ "$rc" = 1 ] && ! grep -q "memory limit" err && grep -q "cannot allocate the arena" err
ok $? "--trust: no memory limit, the backend refuses instead ($(head -c 300 err))"
run timeout 60 "$CK" --max-memory none machine.lua
[ "$rc" = 1 ] && ! grep -q "memory limit" err && grep -q "cannot allocate the arena" err
ok $? "--max-memory none: no memory limit ($(head -c 300 err))"
run "$CK" --max-memory lots -e 'print(1)'
[ "$rc" = 2 ] && grep -q "^ckrun: --max-memory wants a size such as 8GiB or 'none', got 'lots'$" err
ok $? "a malformed --max-memory is refused ($(head -c 200 err))"
"$CK" --help | grep -q -- "--max-memory SIZE"; ok $? "--help lists --max-memory"

echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
