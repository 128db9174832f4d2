# One run at a time in a state directory: a run that saves states (or
# resumes) holds the directory's lock for its whole life, and a second run on
# the same directory, however spelled, is refused before anything runs with one
# line naming the directory and the holder's pid; the first run then finishes
# with good states. The kernel drops the lock when its holder ends, even by
# SIGKILL, so the next run goes on. A symlink in the lock's place is refused.
set -u
dir=out/.test_state_lock.$$
mkdir -p "$dir"
pids=""
trap 'for p in $pids; do kill -9 $p 2> /dev/null; done; rm -rf "$dir"' EXIT
pass=0 fail=0
ok() { if [ "$1" = 0 ]; then pass=$((pass+1)); echo "ok   $2"; else fail=$((fail+1)); echo "FAIL $2"; fi; }
S0="scripts/train_sdxl_lora.lua --resolution 64 --samples 4 --keep-states 2 --log-every 10"
S="$S0 --steps 24 --save-every 6"
st="$dir/state"

# waits (up to 60 s, however slow the machine) until the lock file names pid $1
wait_lock() {
  for _ in $(seq 3000); do
    [ "$(cat "$2/lock" 2> /dev/null)" = "$1" ] && return 0
    kill -0 "$1" 2> /dev/null || return 1
    sleep 0.02
  done
  return 1
}
states() { ls "$1" 2> /dev/null | grep -E '^state-[0-9]+\.safetensors$' | tr '\n' ' '; }

"$CKRUN" $S --state-dir "$st" --log-dir "$dir/log_a" --out "$dir/a.safetensors" > "$dir/a.out" 2>&1 &
a=$!
pids="$a"
wait_lock $a "$st" ; ok $? "the first run takes the lock of $st (pid $a)"
kill -STOP $a  # it holds the lock, stopped, while the others try
before=$(ls "$st" | tr '\n' ' ')
refused() { # what, output, rc
  [ "$3" != 0 ] && [ "$(printf '%s\n' "$2" | wc -l)" = 1 ] &&
    printf '%s\n' "$2" | grep -qE "^ckrun: scripts/train_sdxl_lora\.lua:[0-9]+: state directory '[^']*' is in use by another run \(pid $a\)"
  ok $? "$1 is refused: $2"
}
out=$("$CKRUN" $S --state-dir "$st" --log-dir "$dir/log_b" --out "$dir/b.safetensors" 2>&1); refused "a second run saving into the same directory" "$out" $?
out=$("$CKRUN" $S --state-dir "./$st/" --log-dir "$dir/log_b" --out "$dir/b.safetensors" 2>&1); refused "the same directory spelled ./DIR/" "$out" $?
out=$("$CKRUN" $S --state-dir "$st//" --log-dir "$dir/log_b" --out "$dir/b.safetensors" 2>&1); refused "the same directory spelled DIR//" "$out" $?
ln -s "$(basename "$st")" "$dir/alias"
out=$("$CKRUN" $S --state-dir "$dir/alias" --log-dir "$dir/log_b" --out "$dir/b.safetensors" 2>&1); refused "the same directory through a symlink" "$out" $?
out=$("$CKRUN" $S0 --steps 24 --save-every 0 --resume "$st" --log-dir "$dir/log_b" --out "$dir/b.safetensors" 2>&1); refused "a run resuming from it (saving nothing)" "$out" $?
out=$("$CKRUN" $S --state-dir "$dir/other" --resume "$st" --log-dir "$dir/log_b" --out "$dir/b.safetensors" 2>&1); refused "a run resuming from it into another directory" "$out" $?
[ "$(ls "$st" | tr '\n' ' ')" = "$before" ] && [ ! -e "$dir/b.safetensors" ] && [ ! -e "$dir/log_b" ]
ok $? "the refused runs wrote nothing: $before"
printf 'local l, pid = require("ck").lock(args[1]); print(l, pid)\n' > "$dir/lock.lua"
out=$("$CKRUN" "$dir/lock.lua" "$st/lock" 2>&1)
[ "$out" = "false	$a" ] ; ok $? "ck.lock on the held file gives false and the holder's pid: $out"
kill -CONT $a
wait $a ; rc=$?
pids=""
[ "$rc" = 0 ] && [ -s "$dir/a.safetensors" ] ; ok $? "the first run finishes (exit $rc): $(tail -n 1 "$dir/a.out")"
[ "$(states "$st")" = "state-000000012.safetensors state-000000018.safetensors " ] && ! ls "$st" | grep -q tmp
ok $? "it kept its last 2 states and no temp file: $(ls "$st" | tr '\n' ' ')"
cat > "$dir/verify.lua" <<'LUA'
local ck, state = require "ck", require "ck.state"
for _, path in ipairs(state.list(args[1])) do
  local f <close> = ck.safetensors(path)
  local n = path:match("state%-(%d+)%.safetensors$")
  assert(f:metadata()["ck.step"] == tostring(tonumber(n)), path .. ": ck.step " .. tostring(f:metadata()["ck.step"]))
  assert(#f:keys() > 0, path .. ": no tensors")
end
print(state.latest(args[1]))
LUA
out=$("$CKRUN" "$dir/verify.lua" "$st" 2>&1)
[ "$out" = "$st/state-000000018.safetensors" ] ; ok $? "its states open and their steps are their names: $out"

# a holder killed with SIGKILL leaves its lock to the next run
"$CKRUN" $S0 --save-every 6 --steps 100 --resume "$st" --state-dir "$st" --log-dir "$dir/log_c" --out "$dir/c.safetensors" > /dev/null 2>&1 &
c=$!
pids="$c"
wait_lock $c "$st" ; ok $? "a resumed run takes the lock (pid $c)"
kill -9 $c; wait $c 2> /dev/null
pids=""
out=$("$CKRUN" $S0 --save-every 6 --steps 100 --resume "$st" --state-dir "$st" --log-dir "$dir/log_c" --out "$dir/c.safetensors" 2>&1)
rc=$?
[ "$rc" = 0 ] && [ -s "$dir/c.safetensors" ] && [ "$(cat "$st/lock")" != "$c" ]
ok $? "after a SIGKILL of the holder the next run takes the lock and finishes (exit $rc)"

# a symlink in the lock's place is not followed
mkdir -p "$dir/linked"
echo "precious" > "$dir/victim"
ln -s ../victim "$dir/linked/lock"
out=$("$CKRUN" $S --state-dir "$dir/linked" --log-dir "$dir/log_d" --out "$dir/d.safetensors" 2>&1)
rc=$?
[ "$rc" != 0 ] && [ "$(cat "$dir/victim")" = precious ] && [ "$(printf '%s\n' "$out" | wc -l)" = 1 ] &&
  printf '%s\n' "$out" | grep -q "^ckrun: scripts/train_sdxl_lora.lua:[0-9]*: cannot open the lock file '$dir/linked/lock'"
ok $? "a symlink as the lock file is refused and its target left alone: $out"
# one VM locking a file twice (another spelling, a module loaded anew) holds
# it once; released, it can be taken again
cat > "$dir/twice.lua" <<'LUA'
local ck = require "ck"
local p = args[1]
local a = assert(ck.lock(p))
local b = assert(ck.lock("./" .. p))
package.loaded["ck.state"] = nil
require("ck.state").lock(p:match("^(.*)/[^/]*$"))
a:release()
local c = assert(ck.lock(p))
print(rawequal(a, b), rawequal(a, c))
LUA
mkdir -p "$dir/twice"
out=$("$CKRUN" "$dir/twice.lua" "$dir/twice/lock" 2>&1)
[ "$out" = "true	false" ] ; ok $? "a second ck.lock of a file this VM holds gives the same lock; after release a new one: $out"
printf 'weights, not a pid\n' > "$dir/data.txt"
out=$("$CKRUN" "$dir/lock.lua" "$dir/data.txt" 2>&1)
[ "$(cat "$dir/data.txt")" = "weights, not a pid" ] && printf '%s\n' "$out" | grep -q "^ck.lock"
ok $? "ck.lock on a file with other contents locks it and leaves its bytes alone: $out"
out=$("$CKRUN" "$dir/lock.lua" /tmp/ckrun_lock_outside 2>&1)
[ $? != 0 ] && [ ! -e /tmp/ckrun_lock_outside ] && printf '%s\n' "$out" | grep -q "writing '/tmp/ckrun_lock_outside' is denied"
ok $? "ck.lock outside the sandbox's directories is denied: $out"
out=$("$CKRUN" $S0 --steps 24 --save-every 0 --resume "$dir/missing" --log-dir "$dir/log_e" --out "$dir/e.safetensors" 2>&1)
[ $? != 0 ] && [ ! -e "$dir/missing" ] && printf '%s\n' "$out" | grep -q "no saved state in '$dir/missing'"
ok $? "resuming from a missing directory makes no directory or lock: $(printf '%s\n' "$out" | tail -n 1)"
echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
