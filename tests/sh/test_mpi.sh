# Several ckrun processes on one machine under Open MPI's mpirun
# (oversubscribed: CI has 2 cores): tests/lua/mpi_collectives.lua on 1, 2 and
# 3 ranks checks every collective's values, the agreement errors and
# same_on_all_ranks; tests/c/test_dist.c the C interface (non-blocking
# allreduces, a stopped wait); then the faults, each ending the whole job
# within seconds with the line that says why: a Lua error on rank 1 (the line
# names rank 1), rank 1 hanging while rank 0 waits (CK_DIST_TIMEOUT, then
# ck.dist_timeout; the line names rank 1; on 3 ranks rank 2 alone; a rank
# busy inside an allreduce it started; a training job's rank stopped with
# SIGSTOP, named with the step), rank 1 leaving early (named too), rank 1 killed, and a stock lua5.4
# that loaded ck.so exiting on an error. SKIPs (77) where mpirun is missing or
# ckrun was built without MPI.
MPI_TIMEOUT=60
. tests/sh/mpi_setup.sh
BUILD=${CK_BUILD:-build}
[ "$(sort -u "$dir/probe.out")" = 2 ]
ok $? "mpirun -np 2 ckrun: two ranks of a world of 2 ($(tr '\n' ' ' < "$dir/probe.out"))"

# runs the collectives on N ranks and checks every rank passed every check
collectives() {
  local np=$1; shift
  $MPIRUN -np "$np" "$CKRUN" tests/lua/mpi_collectives.lua --world "$np" "$@" > "$dir/all$np.out" 2> "$dir/all$np.err"
  local rc=$?
  local good; good=$(grep -c ' passed, 0 failed$' "$dir/all$np.out")
  [ $rc = 0 ] && [ "$good" = "$np" ] && ! grep -q '^FAIL' "$dir/all$np.out"
  ok $? "mpi_collectives.lua on $np ranks: every rank passes ($(grep ' passed, ' "$dir/all$np.out" | tr '\n' ' ')rc $rc)"
  grep '^FAIL' "$dir/all$np.out"; [ $rc = 0 ] || tail -5 "$dir/all$np.err"
}
"$CKRUN" tests/lua/mpi_collectives.lua --world 1 --local 1 > "$dir/all1.out" 2>&1
ok $? "mpi_collectives.lua as one process: the collectives are identities ($(tail -1 "$dir/all1.out"))"
collectives 2 --local 2
collectives 3

# the C interface on 2 ranks; rank 0 ends the job with status 3 after its stopped wait
$MPIRUN -np 2 "$BUILD/test_dist" > "$dir/c.out" 2> "$dir/c.err"
rc=$?
[ $rc = 3 ] && grep -q '^rank 0: [0-9]* passed, 0 failed$' "$dir/c.out" && grep -q '^rank 1: [0-9]* passed, 0 failed$' "$dir/c.out"
ok $? "test_dist on 2 ranks: every check passes, a stopped wait ends the job (rc $rc: $(grep ' passed, ' "$dir/c.out" | tr '\n' ' '))"
grep '^FAIL' "$dir/c.out"

# a fault: runs mpi_collectives.lua --case CASE (with the rest as mpirun's
# environment and arguments), records the time, exit status and stderr
fault() {
  local case=$1; shift
  local t0; t0=$(date +%s%N)
  env "$@" $MPIRUN -np "${NP:-2}" "$CKRUN" ${TRUST:-} tests/lua/mpi_collectives.lua --case "$case" ${ARGS:-} > "$dir/$case.out" 2> "$dir/$case.err"
  rc=$?
  ms=$(( ($(date +%s%N) - t0) / 1000000 ))
  secs=$(printf '%d.%03d' $((ms / 1000)) $((ms % 1000)))
}
# the fault took at least $1 and less than $2 seconds
in_time() { [ $ms -ge $(($1 * 1000)) ] && [ $ms -lt $(($2 * 1000)) ]; }

fault error
grep -q '^ckrun: rank 1: tests/lua/mpi_collectives.lua:[0-9]*: rank 1 fails on purpose$' "$dir/error.err" &&
  [ $rc != 0 ] && [ $rc != 124 ] && in_time 0 15 && ! grep -q "no reply" "$dir/error.err"
ok $? "a Lua error on rank 1 ends the job in ${secs}s (rc $rc) with the line naming rank 1: $(grep -m1 '^ckrun:' "$dir/error.err")"

# rank 0 holds a logger: mpirun's SIGTERM stops its wait, and it ends
# through the script's own error path
mkdir "$dir/log"
TRUST="--allow-write $dir/log" ARGS="--log $dir/log" fault error
grep -q '^ckrun: rank 1: .*rank 1 fails on purpose$' "$dir/error.err" &&
  grep -q '^ckrun: rank 0: .*interrupted$' "$dir/error.err" && grep -q '"loss":0.5' "$dir/log/metrics.jsonl" &&
  [ $rc != 0 ] && [ $rc != 124 ] && in_time 0 15
ok $? "rank 0 with a logger: SIGTERM from mpirun stops its wait in ${secs}s: $(grep -m1 '^ckrun: rank 0' "$dir/error.err")"

# the line names the rank that hangs (it never arrived at the collective the others wait in), not the one that waited
fault hang CK_DIST_TIMEOUT=3
grep -qx 'ckrun: rank 0: no reply from rank 1 (not arrived) in collective [0-9]* for 3 s (step 7)' "$dir/hang.err" &&
  [ $rc != 0 ] && [ $rc != 124 ] && in_time 3 20
ok $? "rank 1 hangs, CK_DIST_TIMEOUT=3: the job ends in ${secs}s (rc $rc): $(grep -m1 '^ckrun:' "$dir/hang.err")"

ARGS="--timeout 2" fault hang
grep -qx 'ckrun: rank 0: no reply from rank 1 (not arrived) in collective [0-9]* for 2 s (step 7)' "$dir/hang.err" &&
  [ $rc != 0 ] && [ $rc != 124 ] && in_time 2 20
ok $? "rank 1 hangs, ck.dist_timeout(2): the job ends in ${secs}s (rc $rc): $(grep -m1 '^ckrun:' "$dir/hang.err")"

# 3 ranks: rank 2 hangs; whichever of ranks 0 and 1 times out first names rank 2 alone
NP=3 fault hang CK_DIST_TIMEOUT=3
lines=$(grep '^ckrun: rank [0-9]*: no reply' "$dir/hang.err")
[ -n "$lines" ] && ! echo "$lines" | grep -vqx 'ckrun: rank [01]: no reply from rank 2 (not arrived) in collective [0-9]* for 3 s (step 7)' &&
  [ $rc != 0 ] && [ $rc != 124 ] && in_time 3 20
ok $? "3 ranks, rank 2 hangs: the line names rank 2 alone, in ${secs}s (rc $rc): $(echo "$lines" | head -1)"

# a rank that entered the collective but works elsewhere (or is stopped) without progressing it is named as such
t0=$(date +%s%N)
TEST_DIST_BUSY=1 CK_DIST_TIMEOUT=2 $MPIRUN -np 2 -x TEST_DIST_BUSY -x CK_DIST_TIMEOUT "$BUILD/test_dist" > "$dir/busy.out" 2> "$dir/busy.err"
rc=$?; ms=$(( ($(date +%s%N) - t0) / 1000000 ))
grep -qx 'ckrun: rank 0: no reply from rank 1 (arrived, not waiting: busy or stopped) in collective 1 for 2 s (step 5)' \
  "$dir/busy.err" && [ $rc != 0 ] && [ $rc != 124 ] && in_time 2 20
ok $? "rank 1 busy inside an allreduce it started: named as arrived and busy, in ${ms} ms (rc $rc): $(grep -m1 '^ckrun:' "$dir/busy.err")"

# a training job whose rank 1 is stopped (SIGSTOP) mid-run: rank 0 names it and the step it waited in
A="--allow-write $dir"
CK_DIST_TIMEOUT=3 $MPIRUN -np 2 "$CKRUN" $A scripts/train_sdxl_lora.lua --resolution 64 --samples 8 --batch 1 \
  --steps 100000 --log-every 1000 --val-every 0 --out "$dir/stop.safetensors" --log-dir "$dir/lstop" \
  > "$dir/stop.out" 2> "$dir/stop.err" &
job=$! pid=""
for _ in $(seq 1 300); do
  for p in $(pgrep -f -- "ckrun $A scripts/train_sdxl_lora.lua"); do
    tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | grep -qx 'OMPI_COMM_WORLD_RANK=1' && pid=$p
  done
  [ -n "$pid" ] && [ -s "$dir/lstop/metrics.jsonl" ] && break
  sleep 0.1
done
sleep 0.5
t0=$(date +%s%N)
[ -n "$pid" ] && kill -STOP "$pid"
wait $job; rc=$?; ms=$(( ($(date +%s%N) - t0) / 1000000 ))
[ -n "$pid" ] && kill -9 "$pid" 2>/dev/null
grep -qE '^ckrun: rank 0: no reply from rank 1 \((not arrived|arrived, not waiting: busy or stopped)\) in collective [0-9]+ for 3 s \(step [1-9][0-9]*\)$' \
  "$dir/stop.err" && [ $rc != 0 ] && [ $rc != 124 ] && in_time 3 20 && [ ! -e "$dir/stop.safetensors" ]
ok $? "a training job's rank 1 stopped: rank 0 names it and the step in ${ms} ms (rc $rc): $(grep -m1 '^ckrun:' "$dir/stop.err")"

fault leave CK_DIST_TIMEOUT=3
grep -qx 'ckrun: rank 0: no reply from rank 1 (not arrived) in collective [0-9]* for 3 s (step 3)' "$dir/leave.err" &&
  [ $rc != 0 ] && [ $rc != 124 ] && in_time 3 20
ok $? "rank 1 returns while rank 0 waits: the job ends in ${secs}s (rc $rc): $(grep -m1 '^ckrun:' "$dir/leave.err")"

TRUST=--trust fault die
grep -q 'process rank 1 .* exited on signal 9' "$dir/die.err" && [ $rc != 0 ] && [ $rc != 124 ] && in_time 0 15
ok $? "rank 1 killed: mpirun ends the job in ${secs}s (rc $rc) naming rank 1: $(grep -m1 'exited on signal' "$dir/die.err")"

# a bad CK_DIST_TIMEOUT is one line, before anything runs
CK_DIST_TIMEOUT=soon "$CKRUN" -e 'print("ran")' > "$dir/bad.out" 2> "$dir/bad.err"
rc=$?
[ $rc = 1 ] && [ ! -s "$dir/bad.out" ] && [ "$(cat "$dir/bad.err")" = "ckrun: CK_DIST_TIMEOUT wants seconds (a number > 0), got 'soon'" ]
ok $? "CK_DIST_TIMEOUT=soon is refused in one line (rc $rc: $(cat "$dir/bad.err"))"

# a stock lua5.4 that loads ck.so: MPI starts on first use, and an error exit ends the job
if command -v lua5.4 > /dev/null && [ -f "$BUILD/lua/ck.so" ]; then
  pre="package.cpath='$BUILD/lua/?.so;'..package.cpath package.path='stdlib/?.lua;'..package.path local ck=require'ck'"
  $MPIRUN -np 2 lua5.4 -e "$pre print(ck.rank(), ck.allreduce({ck.rank() + 1})[1])" > "$dir/lua.out" 2> "$dir/lua.err"
  rc=$?
  [ $rc = 0 ] && [ "$(sort "$dir/lua.out" | tr '\t\n' ' ')" = "0 3.0 1 3.0 " ]
  ok $? "lua5.4 with ck.so on 2 ranks: the ranks and their sum (rc $rc: $(tr '\t\n' ' ' < "$dir/lua.out"))"
  t0=$(date +%s)
  $MPIRUN -np 2 lua5.4 -e "$pre if ck.rank() == 1 then error('rank 1 fails') end ck.allreduce({1})" > "$dir/lua.out" 2> "$dir/lua.err"
  rc=$?
  secs=$(( $(date +%s) - t0 ))
  grep -qx 'ckrun: rank 1: exiting with status 1 while the job runs: ending the job' "$dir/lua.err" &&
    [ $rc != 0 ] && [ $rc != 124 ] && [ $secs -lt 15 ]
  ok $? "lua5.4 with ck.so: an error on rank 1 ends the job in ${secs}s (rc $rc)"
fi

echo "$pass passed, $fail failed"
[ $fail = 0 ]
