# ck.t5_tokenizer under the VM's limits, through ckrun: a large spiece.model
# (100,000 pieces: libsentencepiece alone takes a few tenths of a second to
# load it, in one call nothing can poll) and a large tokenizer.json, loaded in a loop, and
# a loop of 1 MiB words for the library's search, each stopped by SIGINT
# within 1 s (exit 130, the interrupt naming the script's line); the same
# files refused under --max-memory 64M in one line naming the file, before
# the memory is taken; hostile models refused in one line naming the file.
set -u
t=$(mktemp -d)
trap 'rm -rf "$t"' EXIT
CK=$(cd "$(dirname "$CKRUN")" && pwd)/$(basename "$CKRUN")
cd "$t" || exit 1
pass=0 fail=0
ok() { if [ "$1" = 0 ]; then pass=$((pass+1)); echo "ok   $2"; else fail=$((fail+1)); echo "FAIL $2"; fi; }
ms() { echo $(( $(date +%s%N) / 1000000 )); }

# the files, written by ckrun itself: protobuf by hand
cat > gen.lua <<'EOF'
local function varint(v)
  local t = {}
  while v >= 0x80 do t[#t + 1] = string.char(v % 128 + 128); v = v // 128 end
  t[#t + 1] = string.char(v)
  return table.concat(t)
end
local function field(f, s) return varint(f * 8 + 2) .. varint(#s) .. s end
local function piece(s, score, ty)
  return field(1, field(1, s) .. varint(2 * 8 + 5) .. string.pack("<f", score) .. (ty and varint(3 * 8) .. varint(ty) or ""))
end
local function write(name, s) local f = assert(io.open(name, "wb")) f:write(s) f:close() end
local head = piece("<pad>", 0, 3) .. piece("</s>", 0, 3) .. piece("<unk>", 0, 2)
local n = 100000
local parts, vocab = {head}, {'["<pad>",0]', '["</s>",0]', '["<unk>",0]'}
for i = 1, n do
  local s = string.format("\xE2\x96\x81p%d", i)
  parts[#parts + 1] = piece(s, -i / n * 20)
  vocab[#vocab + 1] = string.format('["%s",%.6f]', s, -i / n * 20)
end
write("big.model", table.concat(parts))
write("big.json", '{"model":{"type":"Unigram","unk_id":2,"vocab":[' .. table.concat(vocab, ",") .. ']}}')
write("small.model", head .. piece("\xE2\x96\x81", -2) .. piece("a", -3) .. piece("b", -3))
-- a file of 70 MiB: one unknown field holding it all
write("huge.model", head .. field(99, ("x"):rep(70 << 20)))
-- hostile models
local small = head .. piece("\xE2\x96\x81", -2)
write("truncated.model", small:sub(1, #small - 3))
write("varint.model", small .. "\x0a" .. ("\xff"):rep(10) .. "\x01")
write("groups.model", small .. ("\x3b"):rep(100000))
write("nul.model", small .. piece("a\0b", -1))
write("charsmap.model", small .. field(3, field(2, string.pack("<I4", 1024) .. ("\xff"):rep(1024) .. "x\0")))
write("count.model", ("\x0a\x03\x0a\x01a"):rep(1048577))
write("declared.model", small .. "\x1a" .. varint(1 << 62))
EOF
"$CK" gen.lua > out 2> err
ok $? "the test files are written ($(head -c 200 err))"

# SIGINT after 0.5 s: each shape loops, so the signal lands in whatever part
# runs then (reading, checking, building, the library's load or search)
shapes=(
  'a loop of loads of a 100000-piece spiece.model|local ck = require "ck" while true do local t = ck.t5_tokenizer("big.model") t = nil collectgarbage() end'
  'a loop of loads of a 100000-entry tokenizer.json|local ck = require "ck" while true do local t = ck.t5_tokenizer("big.json") t = nil collectgarbage() end'
  'a loop of 1 MiB words through the library|local ck = require "ck" local t = ck.t5_tokenizer("small.model") local w = ("ab"):rep(1 << 19) while true do t:encode(w) end'
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
  while kill -0 $pid 2>/dev/null && [ $waited -lt 50 ]; do sleep 0.05; waited=$((waited+1)); done
  if kill -0 $pid 2>/dev/null; then kill -KILL $pid; fi
  wait $pid; rc=$?
  took=$(( $(ms) - sent ))
  [ $rc = 130 ] && [ $took -le 1000 ] && grep -q '^ckrun: shape.lua:1: interrupted$' err && [ "$(wc -l < err)" = 1 ]
  ok $? "SIGINT stops $name within 1 s (${took} ms, exit $rc: $(head -c 160 err))"
done

# --max-memory: refused in one line naming the file and what would pass it
refuse() { # name file pattern [limit]
  printf 'local ck = require "ck"\nlocal t = ck.t5_tokenizer("%s")\nprint("loaded")\n' "$2" > load.lua
  start=$(ms)
  timeout 60 "$CK" --max-memory "${4:-64M}" load.lua > out 2> err; rc=$?
  took=$(( $(ms) - start ))
  [ $rc = 1 ] && [ "$(wc -l < err)" = 1 ] && grep -Eq "^ckrun: load.lua:2: t5_tokenizer: '$2': $3" err && ! grep -q loaded out
  ok $? "$1 (${took} ms, exit $rc: $(head -c 240 err))"
}
refuse "a 70 MiB file is refused under --max-memory 64M before it is read" huge.model \
  "the file's [0-9]+ bytes would pass the memory limit of 64 MiB"
refuse "the 100000-piece model is refused under --max-memory 32M before the library loads it" big.model \
  "libsentencepiece's model of 100104 pieces would pass the memory limit of 32 MiB \(--max-memory [0-9]+MiB allows it\)" 32M
refuse "the 100000-entry tokenizer.json is refused under --max-memory 32M" big.json \
  ".* would pass the memory limit of 32 MiB \(--max-memory [0-9]+MiB allows it\)" 32M

# without a limit, a model past 64 MiB is refused by size
printf 'local ck = require "ck"\nlocal t = ck.t5_tokenizer("huge.model")\n' > load.lua
timeout 60 "$CK" load.lua > out 2> err; rc=$?
[ $rc = 1 ] && grep -Eq "^ckrun: load.lua:2: t5_tokenizer: 'huge.model' is [0-9]+ bytes, more than a sentencepiece model may hold \(67108864\)$" err
ok $? "a 70 MiB model is refused by size (exit $rc: $(head -c 200 err))"

# hostile models: one line naming the file and what is wrong
hostile() { # file pattern
  printf 'local ck = require "ck"\nlocal t = ck.t5_tokenizer("%s")\nprint("loaded")\n' "$1" > load.lua
  timeout 20 "$CK" load.lua > out 2> err; rc=$?
  [ $rc = 1 ] && [ "$(wc -l < err)" = 1 ] && grep -Eq "^ckrun: load.lua:2: t5_tokenizer: '$1': $2" err && ! grep -q loaded out
  ok $? "$1 refused (exit $rc: $(head -c 200 err))"
}
hostile truncated.model "ModelProto.pieces \(field 1\) at byte [0-9]+ declares [0-9]+ bytes where [0-9]+ remain"
hostile varint.model "a varint at byte [0-9]+ runs past 64 bits"
hostile groups.model "ModelProto field 7 at byte [0-9]+ is a group"
hostile nul.model "piece 4 holds a NUL byte"
hostile charsmap.model "the character map's trie unit [0-9]+ points to unit"
hostile count.model "the model holds more than 1048576 pieces"
hostile declared.model "ModelProto.normalizer_spec \(field 3\) at byte [0-9]+ declares 4611686018427387904 bytes"

echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
