# ck.read_toml under the VM's limits, through ckrun: a loop of reads of a
# 900 KB TOML file stopped by SIGINT within 1 s (exit 130, the interrupt
# naming the script's line); one read stopped by a callback budget of 1M
# instructions; the same file refused under --max-memory 64M in one line
# naming it, before toml++ builds its tree; hostile files (deep dotted keys
# and headers, past 1 MiB, NUL bytes, bad UTF-8, cut short, a header toml++
# 3.3.0 would abort on) refused in one line naming the file, never a crash.
set -u
t=$(mktemp -d)
trap 'rm -rf "$t"' EXIT
CK=$(cd "$(dirname "$CKRUN")" && pwd)/$(basename "$CKRUN")
cd "$t" || exit 1
pass=0 fail=0
ok() { if [ "$1" = 0 ]; then pass=$((pass+1)); echo "ok   $2"; else fail=$((fail+1)); echo "FAIL $2"; fi; }
ms() { echo $(( $(date +%s%N) / 1000000 )); }

cat > gen.lua <<'LUA'
local function write(name, s) local f = assert(io.open(name, "wb")) f:write(s) f:close() end
write("big.toml", "x = [" .. ("1,"):rep(450000) .. "1]\n")
write("deep_keys.toml", ("a."):rep(100000) .. "b = 1\n")
write("deep_headers.toml", "[" .. ("a."):rep(100000) .. "b]\n")
write("aot.toml", (function() local t = {} for i = 1, 40 do t[i] = "[[" .. ("a."):rep(i - 1) .. "a]]" end return table.concat(t, "\n") end)())
write("huge_array.toml", "x = [" .. ("1,"):rep(600000) .. "1]\n")
write("huge_string.toml", "x = '" .. ("y"):rep(2 << 20) .. "'\n")
write("nul.toml", "[general]\nkeep_tokens = 1\nimage_dir = 'a\0b'\n")
write("utf8.toml", "[general]\ncaption_prefix = '\xc3\x28'\n")
write("cut.toml", "[[datasets]]\nresolution = [512, \n")
write("header.toml", "[[ # the key is missing\n")
write("latin.toml", "[general]\nr\xc3\xa9solution = 512\n")
LUA
"$CK" gen.lua > out 2> err
ok $? "the test files are written ($(head -c 200 err))"

# SIGINT after 0.5 s lands in whatever part runs then: reading, the scan, toml++'s parse, the tables' making
printf 'local ck = require "ck"\nwhile true do local v = ck.read_toml("big.toml") end\n' > loop.lua
"$CK" loop.lua > out 2> err &
pid=$!
sleep 0.5
sent=$(ms)
kill -INT $pid 2>/dev/null
waited=0
while kill -0 $pid 2>/dev/null && [ $waited -lt 50 ]; do sleep 0.05; waited=$((waited+1)); done
if kill -0 $pid 2>/dev/null; then kill -KILL $pid; fi
wait $pid; rc=$?
took=$(( $(ms) - sent ))
[ $rc = 130 ] && [ $took -le 1000 ] && grep -q '^ckrun: loop.lua:2: interrupted$' err && [ "$(wc -l < err)" = 1 ]
ok $? "SIGINT stops a loop of reads of a 900 KB TOML file within 1 s (${took} ms, exit $rc: $(head -c 160 err))"

printf 'local ck = require "ck"\nck.call_limited(function()\n  ck.read_toml("big.toml")\nend)\nprint("escaped")\n' > budget.lua
timeout 10 "$CK" --callback-budget 1000000 budget.lua > out 2> err; rc=$?
[ $rc = 1 ] && grep -q '^ckrun: budget.lua:3: callback ran past its instruction budget of 1000000 instructions$' err &&
  ! grep -q escaped out
ok $? "the callback budget stops one read of it (exit $rc: $(head -c 160 err))"

printf 'local ck = require "ck"\nlocal v = ck.read_toml("big.toml")\nprint("read")\n' > mem.lua
start=$(ms)
timeout 20 "$CK" --max-memory 64M mem.lua > out 2> err; rc=$?
took=$(( $(ms) - start ))
[ $rc = 1 ] && [ "$(wc -l < err)" = 1 ] && ! grep -q read out &&
  grep -Eq "^ckrun: mem.lua:2: read_toml: 'big.toml': toml\+\+'s tree of the text's 450002 values would pass the memory limit of 64 MiB \(--max-memory [0-9]+MiB allows it\)$" err
ok $? "--max-memory 64M refuses it before toml++ builds its tree (${took} ms, exit $rc: $(head -c 240 err))"
timeout 20 "$CK" --max-memory 256M mem.lua > out 2> err; rc=$?
[ $rc = 0 ] && grep -q read out
ok $? "--max-memory 256M reads it (exit $rc: $(head -c 160 err))"

hostile() { # file pattern
  printf 'local ck = require "ck"\nlocal v = ck.read_toml("%s")\nprint("read")\n' "$1" > load.lua
  timeout 20 "$CK" load.lua > out 2> err; rc=$?
  [ $rc = 1 ] && [ "$(wc -l < err)" = 1 ] && grep -Eq "^ckrun: load.lua:2: read_toml: '$1': $2" err && ! grep -q read out
  ok $? "$1 refused in one line (exit $rc: $(head -c 200 err))"
}
hostile deep_keys.toml "line 1, column 1: tables and arrays nest 100001 levels deep here, past the 32 ckrun reads$"
hostile deep_headers.toml "line 1, column 1: tables and arrays nest 200002 levels deep here, past the 32 ckrun reads \(a header's keys"
hostile aot.toml "line 16, column 1: tables and arrays nest 33 levels"
hostile huge_array.toml "1200008 bytes: more than the 1024 KiB a TOML file may hold$"
hostile huge_string.toml "2097159 bytes: more than the 1024 KiB a TOML file may hold$"
hostile nul.toml "line 3, column 15: a NUL byte \(TOML text holds none\)$"
hostile utf8.toml "line 2, column 19: not valid UTF-8 \(byte 0xC3\)$"
hostile cut.toml "line 2, column 21: Error while parsing array: encountered end-of-file$"
hostile header.toml "line 1, column 4: a table header's key must start here, not with '#'$"
hostile latin.toml "line 2, column 2: a character past ASCII outside a string or a comment"

echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
