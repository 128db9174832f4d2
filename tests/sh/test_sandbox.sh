# The sandbox, one rule per check: the functions it withholds, binary chunks
# refused by every loader, files only under the allowed directories (judged on
# real paths: no "..", symlink or dangling-symlink escape), the flags that
# widen it (--allow-read, --allow-write, --trust), and a seeded math.random.
# A denial is one line on stderr naming the script line, the path and the flag
# that would allow it, with a non-zero exit.
set -u
t=$(mktemp -d)
trap 'rm -rf "$t"' EXIT
CK=$(cd "$(dirname "$CKRUN")" && pwd)/$(basename "$CKRUN")
SRC=$PWD
mkdir -p "$t/work" "$t/outside" "$t/scripts"
echo secret > "$t/outside/secret.txt"
echo 'return "outside module"' > "$t/outside/outmod.lua"
echo 'return "beside"' > "$t/scripts/beside.lua"
echo 'beside the script' > "$t/scripts/data.txt"
ln -s "$t/outside" "$t/work/link"
ln -s "$t/outside/new.txt" "$t/work/dangling"
lua5.4 -e 'io.write(string.dump(function() print("bytecode ran") end))' > "$t/work/prog.luac"
cp "$t/work/prog.luac" "$t/work/binmod.lua"
cd "$t/work" || exit 1
O=$(cd "$t/outside" && pwd -P)
pass=0 fail=0

# deny NAME PATTERN [ckrun args...]: fails, one line on stderr matching PATTERN
deny() {
  local name=$1 pattern=$2; shift 2
  "$CK" "$@" > "$t/out" 2> "$t/err"
  local rc=$? lines
  lines=$(wc -l < "$t/err")
  if [ $rc -ne 0 ] && [ "$lines" -eq 1 ] && grep -qE -- "$pattern" "$t/err"; then
    pass=$((pass+1)); echo "ok   $name: $(cat "$t/err")"
  else
    fail=$((fail+1)); echo "FAIL $name (exit $rc, $lines lines on stderr):"; cat "$t/err"
  fi
}
# allow NAME [ckrun args...]: exits 0
allow() {
  local name=$1; shift
  if "$CK" "$@" > "$t/out" 2> "$t/err"; then pass=$((pass+1)); echo "ok   $name"
  else fail=$((fail+1)); echo "FAIL $name:"; cat "$t/err"; fi
}
ok() { if [ "$1" = 0 ]; then pass=$((pass+1)); echo "ok   $2"; else fail=$((fail+1)); echo "FAIL $2"; fi; }

# withheld functions
deny "os.execute" "\(command line\):1: os.execute is not available in the sandbox \(ckrun --trust allows it\)" \
  -e 'os.execute("touch ran")'
[ ! -e ran ]; ok $? "os.execute ran nothing"
deny "io.popen" "io.popen is not available" -e 'io.popen("ls")'
deny "dofile" "dofile is not available" -e 'dofile("x.lua")'
deny "loadfile" "loadfile is not available" -e 'loadfile("x.lua")'
deny "package.loadlib" "package.loadlib is not available" -e 'package.loadlib("libc.so.6", "system")'
deny "package.searchpath (probes files)" "package.searchpath is not available" -e 'package.searchpath("x", "/etc/?")'
deny "os.getenv" "os.getenv is not available" -e 'print(os.getenv("HOME"))'
deny "os.exit" "os.exit is not available" -e 'os.exit(0)'
deny "os.tmpname" "os.tmpname is not available" -e 'os.tmpname()'
deny "io.read (standard input)" "io.read is not available" -e 'io.read()'
deny "debug.sethook" "debug.sethook is not available" -e 'debug.sethook()'
deny "debug.getregistry" "debug.getregistry is not available" -e 'debug.getregistry()'
deny "debug.getlocal" "debug.getlocal is not available" -e 'debug.getlocal(1, 1)'
deny "debug.getupvalue" "debug.getupvalue is not available" -e 'debug.getupvalue(print, 1)'
deny "debug.getinfo with 'f' (would hand out functions behind wrappers)" "debug.getinfo with 'f'" -e 'debug.getinfo(1, "f")'
allow "debug.traceback and a descriptive debug.getinfo remain" \
  -e 'assert(debug.traceback("x"):find("stack traceback")) assert(debug.getinfo(1, "l").currentline == 1)'
deny "string.dump" "string.dump is not available" -e 'string.dump(print)'
deny "string.dump through the string metatable" "string.dump is not available" -e 'local s = "" ; s.dump(print)'
deny "__gc metamethods (a finalizer cannot be stopped)" "__gc metamethods are not available" \
  -e 'setmetatable({}, {__gc = function() while true do end end})'
allow "ck's metatables are hidden from getmetatable" \
  -e 'local ck = require "ck"; assert(getmetatable(ck.graph()) == false)'

# binary chunks, every way in
deny "load() of a binary string" "\(command line\):1: load: binary chunks are refused" -e 'load(string.char(27) .. "Lua")'
deny "load() of a binary chunk through a reader" "load: binary chunks are refused" \
  -e 'local f = io.open("prog.luac", "rb"); local s = f:read("a"); local done; load(function() if not done then done = true return s end end)'
deny "a binary script" "prog\.luac: binary chunks are refused in the sandbox" prog.luac
grep -q "bytecode ran" "$t/out"; [ $? = 1 ]; ok $? "the bytecode did not run"
deny "require of a binary module" "require 'binmod'.*binary chunks are refused" -e 'package.path = "./?.lua"; require "binmod"'

# require
allow "require \"ck\" and the shipped stdlib" -e 'require "ck"; require "ck.nn"; require "ck.unet"'
cp "$t/scripts/beside.lua" "$t/work/mymod.lua"
allow "require of a module in the working directory" -e 'package.path = "./?.lua;" .. package.path; assert(require "mymod" == "beside")'
printf 'package.path = args.script:match("^(.*)/") .. "/?.lua;" .. package.path\nassert(require "beside" == "beside")\n' > "$t/scripts/req.lua"
allow "require of a module beside the script" "$t/scripts/req.lua"
deny "require of a module outside the allowed directories" \
  "module 'outmod' not found: .*no file '$O/outmod.lua' \(outside the directories the sandbox allows; --allow-read DIR allows it\)" -e "package.path = '$O/?.lua;' .. package.path; require 'outmod'"
deny "require of a missing module" "module 'nosuch' not found" -e 'require "nosuch"'

# files
deny "io.open outside" "\(command line\):1: reading '$O/secret.txt' is denied: it is outside the directories the sandbox allows \(--allow-read $O allows it\)" \
  -e "io.open('$O/secret.txt')"
deny "io.open for writing outside" "writing '$O/w.txt' is denied.*--allow-write $O allows it" -e "io.open('$O/w.txt', 'w')"
deny "io.open for appending outside" "writing '$O/secret.txt' is denied" -e "io.open('$O/secret.txt', 'a')"
deny "'..' cannot climb out" "reading '\.\./outside/secret\.txt' is denied: .*--allow-read $O allows it" -e 'io.open("../outside/secret.txt")'
deny "a symlink cannot lead out" "reading 'link/secret\.txt' is denied: it is outside the directories the sandbox allows \(--allow-read .*/link allows it\)" -e 'io.open("link/secret.txt")'
deny "a dangling symlink cannot create a file outside" "writing 'dangling' is denied: it is outside the directories the sandbox allows" -e 'io.open("dangling", "w")'
[ ! -e "$O/new.txt" ]; ok $? "nothing was created through the dangling symlink"
deny "io.lines outside" "reading '$O/secret.txt' is denied" -e "for l in io.lines('$O/secret.txt') do end"
deny "io.lines() on standard input" "io.lines\(\) without a file name reads standard input" -e 'io.lines()'
deny "os.remove outside" "writing '$O/secret.txt' is denied" -e "os.remove('$O/secret.txt')"
[ -e "$O/secret.txt" ]; ok $? "the file is still there"
deny "os.rename out of the working directory" "writing '$O/moved' is denied" -e "io.open('here', 'w'):close(); os.rename('here', '$O/moved')"
deny "ck.listdir outside" "reading '$O' is denied.*--allow-read $O allows it" -e "require('ck').listdir('$O')"
deny "ck.mkdir outside" "writing '$O/d' is denied.*--allow-write $O/d allows it" -e "require('ck').mkdir('$O/d')"
deny "ck.safetensors outside" "reading '$O/secret.txt' is denied" -e "require('ck').safetensors('$O/secret.txt')"
deny "ck.write_safetensors outside" "writing '$O/w.safetensors' is denied" \
  -e "require('ck').write_safetensors('$O/w.safetensors', {{'x', {1}, {1}}})"
deny "program:save outside" "writing '$O/p.safetensors' is denied" -e "local ck = require 'ck'; local g = ck.graph()
local w = g:param('w', {2}); local p = g:compile{outputs = {w}}; p:save('$O/p.safetensors', {{'w', w}})"
[ -z "$(ls "$O" | grep -v 'secret.txt\|outmod.lua')" ]; ok $? "nothing was written outside"
allow "the working directory is readable and writable, new subdirectories too" -e 'local ck = require "ck"
assert(ck.mkdir("a/b/c")); local f = assert(io.open("a/b/c/f.txt", "w")); f:write("x"); f:close()
assert(io.open("a/b/c/f.txt"):read("a") == "x"); assert(#ck.listdir("a/b/c") == 1)
ck.write_safetensors("a/t.safetensors", {{"x", {1}, {2}}}); assert(ck.safetensors("a/t.safetensors"):read("x")[1] == 2)'
printf 'local f = assert(io.open(args.script:match("^(.*)/") .. "/data.txt"))\nassert(f:read("l") == "beside the script")\n' > "$t/scripts/read.lua"
allow "a script reads its own directory" "$t/scripts/read.lua"
printf 'local dir = args.script:match("^(.*)/")\nio.open(dir .. "/w.txt", "w")\n' > "$t/scripts/write.lua"
deny "but does not write there" "write\.lua:2: writing '.*scripts/w.txt' is denied" "$t/scripts/write.lua"

# flags
allow "--allow-read DIR lets scripts read under DIR" --allow-read "$t/outside" -e "assert(io.open('$O/secret.txt'):read('l') == 'secret')"
deny "--allow-read DIR does not allow writing there" "writing '$O/w.txt' is denied" --allow-read "$t/outside" -e "io.open('$O/w.txt', 'w')"
allow "--allow-write DIR lets scripts write (and read) under DIR" --allow-write "$t/outside" \
  -e "local f = assert(io.open('$O/w.txt', 'w')); f:write('y'); f:close(); assert(io.open('$O/w.txt'):read('a') == 'y')"
allow "--trust turns the sandbox off" --trust -e "assert(os.getenv('PATH')); assert(io.open('$O/secret.txt')); os.execute('true')"
allow "--trust loads binary chunks" --trust prog.luac
grep -q "bytecode ran" "$t/out"; ok $? "the trusted bytecode ran"

# math.random
a=$("$CK" -e 'print(math.random(), math.random(1, 100))')
b=$("$CK" -e 'print(math.random(), math.random(1, 100))')
[ -n "$a" ] && [ "$a" = "$b" ]; ok $? "math.random gives the same numbers every run ($a)"
c=$("$CK" -e 'math.randomseed(); print(math.random(), math.random(1, 100))')
[ "$a" = "$c" ]; ok $? "math.randomseed() without a seed takes the VM's seed"
d=$("$CK" -e 'math.randomseed(7); print(math.random(), math.random(1, 100))')
[ "$a" != "$d" ]; ok $? "math.randomseed(n) reseeds"

echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
