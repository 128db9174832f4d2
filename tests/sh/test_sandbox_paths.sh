# No path leads out of the sandbox, however it is spelled or changed under
# the script: log files that are symlinks pointing out, a --svg file whose
# directory must stay closed, ".." and symlinks (absolute, relative, to
# directories, dangling) in and out of the allowed directories, and a helper
# process flipping a symlink between an allowed file and an outside one while
# the script opens it thousands of times (reads, writes, safetensors, listdir,
# mkdir, require): not one outside read or write may succeed. The static
# cases run twice: with openat2 and with the component walk that stands in
# for it on kernels without one (CK_BENEATH_WALK=1). Saves also clean up the
# temp files that killed saves of the same path left behind.
set -u
t=$(mktemp -d)
flipper=
trap '[ -n "$flipper" ] && kill $flipper 2> /dev/null; rm -rf "$t"' EXIT
CK=$(cd "$(dirname "$CKRUN")" && pwd)/$(basename "$CKRUN")
SRCDIR=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$t/work/sub" "$t/work/logs" "$t/outside/dir" "$t/svgdir"
T=$(cd "$t" && pwd -P)
W=$T/work O=$T/outside
echo SECRET > "$O/secret.txt"
echo SECRET > "$O/dir/f.txt"
echo 'return "SECRET"' > "$O/dir/mod.lua"
echo inside > "$W/inside.txt"
mkdir -p "$W/indir"
echo inside > "$W/indir/f.txt"
echo 'return "inside"' > "$W/indir/mod.lua"
"$CK" --trust -e "local ck = require 'ck'; ck.write_safetensors('$W/indir/s.safetensors', {{'x', {1}, {1}}})
  ck.write_safetensors('$O/dir/s.safetensors', {{'x', {1}, {2}}})" || exit 1
cd "$W" || exit 1
pass=0 fail=0
ok() { if [ "$1" = 0 ]; then pass=$((pass+1)); echo "ok   $2"; else fail=$((fail+1)); echo "FAIL $2"; fi; }
# outside_intact: the outside tree holds exactly what it held at the start
snapshot() { (cd "$O" && find . -print0 | sort -z | xargs -0 ls -ld --time-style=+%s.%N 2> /dev/null; cat "$O/secret.txt" "$O/dir/f.txt") > "$t/snap.$1"; }
snapshot start
intact() { snapshot now; cmp -s "$t/snap.start" "$t/snap.now"; }

# ---- ".." and symlinks, in and out of the allowed directories
ln -s "$W/inside.txt" abs_in
ln -s "$O/secret.txt" abs_out
ln -s ../outside/secret.txt rel_out
ln -s ../inside.txt sub/rel_in
ln -s "$O/dir" dir_out
ln -s "$W/sub" dir_in
ln -s "$O/created.txt" dangling_out
ln -s ../../outside/dir sub/dir_up_out

# reads CODE: the script's outcome, "ok:<what it read>" or "denied"
run() { "$CK" -e "$1" 2>&1; }
# the walk judges alike (the judgment comes first); what it changes is the
# open, so the paths that stay inside must open with it too
for mode in openat2 walk; do
  [ $mode = walk ] && export CK_BENEATH_WALK=1
  for p in abs_in sub/rel_in sub/../inside.txt dir_in/../inside.txt "$W/sub/../abs_in" "$W/inside.txt"; do
    m=$(run "local f = assert(io.open('$p')); io.write(f:read('l')); f:close()")
    [ "$m" = inside ]; ok $? "$mode: '$p' stays inside and reads ($m)"
  done
  m=$(run "local ck = require 'ck'; assert(ck.mkdir('dir_in/a/b')); assert(io.open('dir_in/a/b/f', 'w')):close()
    assert(os.rename('dir_in/a/b/f', 'sub/a/g')); assert(os.remove('sub/a/g')); print(#ck.listdir('dir_in/a'))")
  [ "$m" = 1 ] && [ -d sub/a/b ] && [ ! -e sub/a/g ]; ok $? "$mode: mkdir, rename, remove and listdir through a symlink inside ($m)"
  rm -rf sub/a
  unset CK_BENEATH_WALK
done
# each denial: one script per path tries every way, each caught, one line each
# (deny_args: ckrun's flags for it)
deny_args=()
denials() { # PATH WAY...: each way is code with @ for the path
  local p=$1 code="" how; shift
  for how in "$@"; do code="$code print(select(2, pcall(function() return ${how//@/$p} end)))"; done
  "$CK" ${deny_args[@]+"${deny_args[@]}"} -e "$code" > "$t/denials" 2>&1
  local i=0
  for how in "$@"; do
    i=$((i+1))
    m=$(sed -n "${i}p" "$t/denials")
    echo "$m" | grep -q "is denied" && ! echo "$m" | grep -q SECRET
    ok $? "${how//@/$p} is denied ($m)"
  done
}
for p in abs_out rel_out dir_out/f.txt sub/dir_up_out/f.txt "sub/../../outside/secret.txt" "dir_in/../../outside/secret.txt" \
         "$O/secret.txt" "dir_out/../dir/f.txt"; do
  denials "$p" "io.open('@')" "io.open('@', 'r+')" "io.lines('@')()" "require('ck').safetensors('@')" "require('ck').listdir('@')"
done
for p in abs_out rel_out dangling_out dir_out/new.txt sub/dir_up_out/new.txt "sub/../../outside/new.txt"; do
  denials "$p" "io.open('@', 'w')" "io.open('@', 'a')" "os.remove('@')" "os.rename('inside.txt', '@')" \
    "require('ck').write_safetensors('@', {{'x', {1}, {1}}})" "require('ck').mkdir('@/d')"
done
intact; ok $? "nothing outside was written, created or removed"
[ "$(cat inside.txt)" = inside ]; ok $? "the file renamed in the denied renames is still in place"

# ---- log files: the directory is allowed, a symlink inside it is not a way out
log() { "$CK" -e "local ck = require 'ck'; local lg = ck.log_open{dir = 'logs', sigterm = false $1}
  lg:write{step = 1, loss = 0.5}; lg:close(); print('logged')" 2>&1; }
m=$(log ", tensorboard = false"); [ "$m" = logged ] && grep -q '"loss":0.5' logs/metrics.jsonl
ok $? "a plain log directory logs ($m)"
rm -f logs/*
for target in "$O/secret.txt" ../../outside/secret.txt "$O/new.jsonl"; do
  for name in metrics.jsonl custom.jsonl; do
    ln -s "$target" "logs/$name"
    m=$(log ", jsonl_name = '$name', tensorboard = false")
    echo "$m" | grep -q "refused" && intact
    ok $? "a $name symlink to $target is refused, the file outside untouched ($m)"
    CK_BENEATH_WALK=1 log ", jsonl_name = '$name', tensorboard = false" | grep -q refused && intact
    ok $? "the same with the component walk"
    rm -f "logs/$name"
  done
done
# TensorBoard names its files events.out.tfevents.<time>.<host>.<pid>.<n>: plant
# symlinks under every name this run could pick (its pid is known: exec keeps it)
host=$(cat /proc/sys/kernel/hostname 2> /dev/null || echo localhost)
m=$(bash -c 'now=$(date +%s); for s in $((now)) $((now + 1)) $((now + 2)); do for n in 1 2 3; do
  ln -s "'"$O"'/secret.txt" "logs/events.out.tfevents.$s.'"$host"'.$$.$n"; done; done
  exec "'"$CK"'" -e "local ck = require \"ck\"; local lg = ck.log_open{dir = \"logs\", jsonl = false, sigterm = false}
  lg:write{step = 1, loss = 0.5}; lg:close(); print(\"logged\")"' 2>&1)
planted=$(find logs -type l | wc -l)
real=$(find logs -type f -name 'events.out.tfevents.*' | wc -l)
[ "$planted" = 9 ] && intact && { [ "$real" = 1 ] || echo "$m" | grep -q refused; }
ok $? "planted events-file symlinks are never written through ($planted planted, $real written, $m)"
rm -rf logs && ln -s "$O/dir" logs
m=$(log ""); echo "$m" | grep -q "is denied" && intact; ok $? "a log directory that is a symlink out is denied ($m)"
rm logs && mkdir logs

# ---- --svg FILE allows that file, not its directory
S=$T/svgdir
for flag in --svg --export-graph; do
  m=$("$CK" $flag "$S/x.svg" -e "local f = assert(io.open('$S/x.svg', 'w')); f:write('svg'); f:close()
    local g = assert(io.open('$S/x.svg.tmp', 'w')); g:close(); assert(os.rename('$S/x.svg.tmp', '$S/x.svg'))
    print('wrote')" 2>&1)
  [ "$m" = wrote ] && [ -f "$S/x.svg" ] && [ ! -e "$S/x.svg.tmp" ]; ok $? "$flag: its file and its temp file are writable ($m)"
  echo keep > "$S/keep"
  deny_args=($flag "$S/x.svg")
  denials "$S" "io.open('@/other', 'w')" "io.open('@/x.svgX', 'w')" "io.open('@/x.svg.tmp.abc', 'w')" \
    "io.open('@/x.sv', 'a')" "os.remove('@/keep')" "os.rename('@/x.svg', '@/moved')" "require('ck').mkdir('@/sub')" \
    "require('ck').listdir('@')" "io.open('@/keep')" "require('ck').write_safetensors('@/o.safetensors', {{'x', {1}, {1}}})"
  deny_args=()
  [ ! -e "$S/other" ] && [ ! -e "$S/x.svgX" ] && [ "$(cat "$S/keep")" = keep ] && [ ! -e "$S/moved" ] && [ ! -e "$S/sub" ] &&
    [ -f "$S/x.svg" ] && [ ! -e "$S/o.safetensors" ]
  ok $? "$flag: none of them changed the directory"
  rm -f "$S/x.svg" && ln -s "$O/secret.txt" "$S/x.svg"
  m=$("$CK" $flag "$S/x.svg" -e "local f = assert(io.open('$S/x.svg', 'w')); f:write('svg'); f:close()" 2>&1)
  echo "$m" | grep -q "is denied" && intact; ok $? "$flag: a symlink out put where the file goes is not written through ($m)"
  rm -f "$S/x.svg"
  m=$("$CK" $flag "$S/new/deeper/x.svg" -e "local ck = require 'ck'; assert(ck.mkdir('$S/new/deeper'))
    local f = assert(io.open('$S/new/deeper/x.svg', 'w')); f:close(); print(pcall(io.open, '$S/new/y', 'w'))" 2>&1)
  [ -f "$S/new/deeper/x.svg" ] && echo "$m" | grep -q "is denied" && [ ! -e "$S/new/y" ]
  ok $? "$flag: the directories leading to the file can be made, and allow nothing else ($m)"
  rm -rf "$S/new"
  # a path that names a directory is refused before the script runs: an
  # existing one (with or without '/', inside or out) or one spelled as such
  mkdir -p "$S/adir"
  for p in "$O/dir/" "$O/dir" "$O/dir/." "$S/adir/" "$S/adir" "$S/nodir/" "$S/.."; do
    m=$("$CK" $flag "$p" -e "os.rename('$O/dir', 'stolen'); print('ran')" 2>&1); rc=$?
    [ $rc != 0 ] && [ "$(echo "$m" | wc -l)" = 1 ] && echo "$m" | grep -q "^ckrun: $flag '.*' names a directory" &&
      [ ! -e stolen ] && [ ! -e "$S/nodir" ] && intact
    ok $? "$flag '$p' is refused in one line, nothing run ($m)"
  done
  m=$("$CK" --trust $flag "$S/adir/" -e "print('ran')" 2>&1); rc=$?
  [ $rc != 0 ] && echo "$m" | grep -q "names a directory"; ok $? "$flag naming a directory is refused outside the sandbox too ($m)"
  # a directory put at the file's name after the start is not the file: not
  # opened, listed, renamed, removed or written into; nor can the script put one there
  mkdir -p mine
  m=$("$CK" $flag "$S/late.svg" -e "local ck = require 'ck'
    print(select(2, pcall(ck.mkdir, '$S/late.svg')))
    print(os.rename('mine', '$S/late.svg'))
    while select(3, io.open('$S/late.svg')) == 2 do end -- ENOENT until it appears
    print(io.open('$S/late.svg'))
    print(io.open('$S/late.svg', 'w'))
    print(select(2, pcall(ck.listdir, '$S/late.svg')))
    print(os.rename('$S/late.svg', 'stolen'))
    print(os.remove('$S/late.svg'))
    print(select(2, pcall(io.open, '$S/late.svg/f.txt')))" 2>&1 &
    sleep 0.5
    mkdir "$S/late.svg.part" && echo SECRET > "$S/late.svg.part/f.txt" && mv "$S/late.svg.part" "$S/late.svg"; wait)
  n=$(echo "$m" | grep -c "is denied\|Is a directory\|nil")
  [ "$n" = 8 ] && [ -d mine ] && [ ! -e stolen ] && [ "$(cat "$S/late.svg/f.txt")" = SECRET ] && ! echo "$m" | grep -q "^SECRET"
  ok $? "$flag: a directory at the file's name is never the file ($m)"
  rm -rf "$S/late.svg" "$S/adir" mine
done

# ---- the scripts' own output files (generate --out, train_sdxl_lora --out,
# policy_sweep --svg): a directory is refused in one line before any work
mkdir -p "$W/adir"
for c in "generate.lua --out $W/adir" "generate.lua --out $W/new/" "train_sdxl_lora.lua --out $W/adir/" \
         "train_sdxl_lora.lua --out ." "policy_sweep.lua --svg $W/adir"; do
  set -- $c
  m=$("$CK" "$SRCDIR/scripts/$1" "$2" "$3" 2>&1); rc=$?
  [ $rc != 0 ] && [ "$(echo "$m" | wc -l)" = 1 ] && echo "$m" | grep -q -- "$2 must name a file to write, not a directory" &&
    [ -z "$(ls "$W/adir")" ] && [ ! -e "$W/new" ]
  ok $? "$1 $2 $3 is refused in one line, nothing written ($m)"
done
rmdir "$W/adir"

# ---- temp files of killed saves
dead=$(bash -c 'echo $$')
while kill -0 "$dead" 2> /dev/null; do dead=$(bash -c 'echo $$'); done
for f in "out.safetensors.tmp.$dead" "out.safetensors.tmp.$$" "out.safetensors.tmp.abc" "out.safetensors.tmpx" \
         "other.safetensors.tmp.$dead" "out.safetensors.tmp.0$dead" "out.safetensors.tmp.${dead}x"; do
  echo stale > "$f"
done
m=$("$CK" -e "require('ck').write_safetensors('out.safetensors', {{'x', {2}, {1, 2}}}); print('saved')" 2>&1)
[ "$m" = saved ] && [ -f out.safetensors ]; ok $? "a save succeeds beside stale temp files ($m)"
[ ! -e "out.safetensors.tmp.$dead" ]; ok $? "the temp file of a process that is gone is removed"
[ -e "out.safetensors.tmp.$$" ]; ok $? "the temp file of a live process is kept (it may be saving)"
n=0; for f in out.safetensors.tmp.abc out.safetensors.tmpx "other.safetensors.tmp.$dead" "out.safetensors.tmp.0$dead" \
                "out.safetensors.tmp.${dead}x"; do [ "$(cat "$f")" = stale ] && n=$((n+1)); done
[ $n = 5 ]; ok $? "no other name is touched ($n of 5 kept)"
m=$(bash -c 'echo $$ > "'"$t/pid"'"; echo stale > out.safetensors.tmp.$$
  exec "'"$CK"'" -e "require(\"ck\").write_safetensors(\"out.safetensors\", {{\"x\", {1}, {3}}}); print(\"saved\")"' 2>&1)
own=$(cat "$t/pid")
[ "$m" = saved ] && [ ! -e "out.safetensors.tmp.$own" ]
ok $? "a temp file under this process's own pid is its own: removed, and the save goes on ($m)"
m=$("$CK" -e "local f = require('ck').safetensors('out.safetensors'); print(f:read('x')[1] == 3)" 2>&1)
[ "$m" = true ]; ok $? "the save wrote what it was given ($m)"
m=$("$CK" -e "require('ck').write_safetensors('sub/s.safetensors', {{'x', {1}, {1}}}); print('saved')" 2>&1)
ls sub/s.safetensors.tmp.* > /dev/null 2>&1; [ $? != 0 ] && [ "$m" = saved ]; ok $? "a finished save leaves no temp file"
# a save really killed in the middle: past a file size limit, SIGXFSZ kills it
bash -c 'ulimit -f 64; "$0" -e "local v = {}; for i = 1, 100000 do v[i] = i end
  require(\"ck\").write_safetensors(\"killed.safetensors\", {{\"x\", {#v}, v}})"; e=$?; exit $e' "$CK" > /dev/null 2>&1
rc=$?
have=$(ls killed.safetensors.tmp.* 2> /dev/null | wc -l)
m=$("$CK" -e "require('ck').write_safetensors('killed.safetensors', {{'x', {1}, {1}}}); print('saved')" 2>&1)
[ $rc -gt 128 ] && [ "$have" = 1 ] && [ "$m" = saved ] && ! ls killed.safetensors.tmp.* > /dev/null 2>&1
ok $? "a save killed by a signal (status $rc) left its temp file ($have); the next save removed it ($m)"

# ---- the race: a helper process changes a path between the judgment and the open
# the helpers say they are flipping (a file NAME.ready after 100 rounds)
# before a race starts, so a loaded machine cannot leave a race unraced
flip() { # LINK A B: LINK points at A and at B in turn, each swap one rename
  perl -e '($l, $a, $b) = @ARGV; $i = 0; while (1) { $t = "$l.flip"; unlink $t; symlink(($i++ & 1) ? $b : $a, $t); rename $t, $l;
    if ($i == 100) { open(R, ">", "$l.ready"); close(R); } }' "$@" &
  flipper=$!
  ready "$1"
}
swap() { # NAME TARGET: NAME (a file or directory) and a symlink to TARGET take turns, each a rename
  perl -e '($n, $o) = @ARGV; $i = 0; while (1) { unlink "$n.lnk"; symlink $o, "$n.lnk"; rename $n, "$n.real"; rename "$n.lnk", $n;
    rename $n, "$n.lnk"; rename "$n.real", $n; if (++$i == 100) { open(R, ">", "$n.ready"); close(R); } }' "$@" &
  flipper=$!
  ready "$1"
}
ready() { local i; for i in $(seq 1 200); do [ -e "$1.ready" ] && return; sleep 0.01; done; }
unflip() {
  kill $flipper 2> /dev/null; wait $flipper 2> /dev/null; flipper=
  if [ -e "$1.real" ]; then rm -f "$1"; mv "$1.real" "$1"; fi
  rm -f "$1.flip" "$1.lnk" "$1.ready"
}
# race MIN CODE: CODE runs in a loop and says "in", "out" or "no" (failed or denied),
# until it has run MIN times and seen both "in" and "no" (at most 4 s)
race() {
  "$CK" -e "local ck = require 'ck'
    local function try() $2 end
    local n, got = 0, {['in'] = 0, out = 0, no = 0}
    local t0 = ck.now()
    while (n < $1 or got['in'] == 0 or got.no == 0) and ck.now() - t0 < 4 do
      n = n + 1
      local ok, r = pcall(try)
      r = ok and r or 'no'
      got[r] = got[r] + 1
    end
    print(n, got['in'], got.out, got.no)" 2>&1
}
check_race() { # NAME RESULT MIN: no outside success in MIN tries or more, both sides seen, nothing outside changed
  local n i o d
  read -r n i o d <<< "$2"
  [ -n "$d" ] && [ "$o" = 0 ] && [ "$n" -ge "$3" ] && [ "$i" -gt 0 ] && [ "$d" -gt 0 ] && intact
  ok $? "$1: $n tries, $i inside, $o outside, $d failed or denied"
}
# the walk is one function for every caller: it races the opens of each kind
# (file, directory, O_PATH parent, mkdir), openat2 every function
readit="if not f then return 'no' end; local s = f:read('a'); f:close(); return s:find('SECRET') and 'out' or 'in'"
touch indir/in_marker
for mode in openat2 walk; do
  [ $mode = walk ] && export CK_BENEATH_WALK=1
  flip link inside.txt "$O/secret.txt"
  check_race "$mode: reading a symlink flipped between inside and outside" "$(race 500 "local f = io.open('link'); $readit")" 500
  check_race "$mode: writing it" "$(race 500 "local f = io.open('link', 'a'); if not f then return 'no' end
    f:write('x'); f:close(); return 'in'")" 500
  unflip link
  swap inside.txt "$O/secret.txt"
  check_race "$mode: reading a file swapped with a symlink out" "$(race 500 "local f = io.open('inside.txt'); $readit")" 500
  [ $mode = walk ] || check_race "$mode: io.lines on it" "$(race 500 "for l in io.lines('inside.txt') do return l == 'SECRET' and 'out' or 'in' end")" 500
  check_race "$mode: writing it" "$(race 500 "local f = io.open('inside.txt', 'a'); if not f then return 'no' end
    f:write('x'); f:close(); return 'in'")" 500
  unflip inside.txt
  echo inside > inside.txt
  swap indir "$O/dir"
  check_race "$mode: reading through a directory swapped with a symlink out" "$(race 500 "local f = io.open('indir/f.txt'); $readit")" 500
  check_race "$mode: writing through it" "$(race 500 "local f = io.open('indir/w.txt', 'w'); if not f then return 'no' end
    f:write('x'); f:close(); return 'in'")" 500
  check_race "$mode: listing it" "$(race 500 "local l = ck.listdir('indir'); if not l then return 'no' end
    for _, e in ipairs(l) do if e == 'in_marker' then return 'in' end end; return 'out'")" 500
  check_race "$mode: a lock file in it" "$(race 500 "local l = ck.lock('indir/l.lock'); if not l then return 'no' end
    l:release(); return 'in'")" 500
  [ $mode = walk ] || check_race "$mode: require through it" "$(race 500 "package.path = './indir/?.lua'; package.loaded.mod = nil
    return require('mod') == 'SECRET' and 'out' or 'in'")" 500
  [ $mode = walk ] || check_race "$mode: ck.safetensors through it" "$(race 500 "local f = ck.safetensors('indir/s.safetensors')
    return f:read('x')[1] == 1 and 'in' or 'out'")" 500
  [ $mode = walk ] || check_race "$mode: saving into it" "$(race 50 "ck.write_safetensors('indir/t.safetensors', {{'x', {1}, {1}}}); return 'in'")" 50
  unflip indir
  # (mkdir makes a directory missing for an instant: a flip, which never leaves it missing)
  flip linkdir indir "$O/dir"
  check_race "$mode: mkdir in a directory symlink flipped out and back" "$(race 500 "if not ck.mkdir('linkdir/made') then return 'no' end
    return 'in'")" 500
  check_race "$mode: saving into it" "$(race 50 "ck.write_safetensors('linkdir/t.safetensors', {{'x', {1}, {1}}}); return 'in'")" 50
  unflip linkdir
  unset CK_BENEATH_WALK
done
echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
