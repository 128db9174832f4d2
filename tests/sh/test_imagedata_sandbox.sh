# ck.imagedata under the sandbox: a folder outside the allowed roots is denied
# with one line naming the script's line, and so is hashing a file there;
# allowed with --allow-read, the scan and its cache key work, and a bad
# caption file fails with one line naming the file and the script's line;
# hashing counts against the callback budget by the bytes it reads.
set -u
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
pass=0 fail=0
mkdir -p "$dir/script" "$dir/data/2_dog" "$dir/work"
printf 'P' > "$dir/data/2_dog/a.png"
printf 'a dog' > "$dir/data/2_dog/a.txt"
cat > "$dir/script/scan.lua" <<'LUA'
local ck = require "ck"
local imagedata = require "ck.imagedata"
local set = imagedata.scan(DATA_DIR, {info = function() return {width = 1024, height = 1024} end})
local plan = imagedata.assign(set, imagedata.buckets{resolution = 1024})
print(set.count, plan.items[1].caption, #imagedata.cache_key(plan.items[1], {model_id = "vae"}))
LUA
sed -i "s|DATA_DIR|\"$dir/data\"|" "$dir/script/scan.lua"
cat > "$dir/script/hash.lua" <<LUA
local ck = require "ck"
print(ck.file_sha256("$dir/data/2_dog/a.png"))
LUA
check() { # name, want exit 0 or 1, stdout/stderr pattern, ckrun args...
  local name=$1 want=$2 pattern=$3; shift 3
  (cd "$dir/work" && "$CKRUN" "$@" > "$dir/out" 2> "$dir/err")
  local rc=$?
  local lines
  lines=$(wc -l < "$dir/err")
  local ok=0
  if [ "$want" -eq 0 ]; then
    [ "$rc" -eq 0 ] && grep -qE -- "$pattern" "$dir/out" && ok=1
  else
    [ "$rc" -ne 0 ] && [ "$lines" -eq 1 ] && grep -qE -- "$pattern" "$dir/err" && ok=1
  fi
  if [ "$ok" -eq 1 ]; then
    pass=$((pass+1)); echo "ok   $name: $(cat "$dir/out" "$dir/err" | head -1)"
  else
    fail=$((fail+1)); echo "FAIL $name (exit $rc):"; cat "$dir/out" "$dir/err"
  fi
}
check "a scan outside the sandbox is denied at the script's line" 1 "scan\.lua:3: .*denied" "$dir/script/scan.lua"
check "hashing a file outside the sandbox is denied at the script's line" 1 "hash\.lua:2: .*denied" "$dir/script/hash.lua"
check "with --allow-read the scan, plan and key work" 0 "^2	a dog	64$" --allow-read "$dir/data" "$dir/script/scan.lua"
check "with --allow-read the hash works" 0 "^[0-9a-f]{64}$" --allow-read "$dir/data" "$dir/script/hash.lua"
printf '\377\376bad' > "$dir/data/2_dog/a.txt"
check "a caption that is not UTF-8 names the file and the script's line" 1 "scan\.lua:3: imagedata\.scan: caption file '.*2_dog/a\.txt' is not valid UTF-8" --allow-read "$dir/data" "$dir/script/scan.lua"
# hashing is charged to the callback budget by the bytes it reads: a loop of
# hashes of 1 MiB is stopped long before a 30 s limit (uncharged, each call
# would count as one instruction and the loop would run for minutes)
head -c 1048576 /dev/zero > "$dir/work/big.bin"
printf 'local ck = require "ck"\nlocal s = string.rep("x", 1 << 20)\nck.call_limited(function()\n  for i = 1, 1e6 do ck.sha256(s) end\nend)\nprint("escaped")\n' > "$dir/work/str.lua"
printf 'local ck = require "ck"\nck.call_limited(function()\n  for i = 1, 1e6 do ck.file_sha256("big.bin") end\nend)\nprint("escaped")\n' > "$dir/work/file.lua"
for script in str file; do
  (cd "$dir/work" && timeout 30 "$CKRUN" --callback-budget 1000000 "$script.lua" > "$dir/out" 2> "$dir/err"); rc=$?
  if [ "$rc" -eq 1 ] && grep -q "instruction budget of 1000000" "$dir/err" && ! grep -q escaped "$dir/out"; then
    pass=$((pass+1)); echo "ok   the callback budget stops a loop of $script hashes: $(cat "$dir/err")"
  else
    fail=$((fail+1)); echo "FAIL the callback budget stops a loop of $script hashes (exit $rc):"; cat "$dir/err"
  fi
done
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
