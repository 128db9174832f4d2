# Data parallel on device "cuda" through NCCL, on the CUDA emulator
# (libck_cuda_emu.so, whose NCCL runs over MPI: tests/cuda_emu/nccl_emu.cpp),
# under Open MPI's mpirun oversubscribed on CI's 2 cores:
#   - tests/lua/mpi_ddp.lua --device cuda on 2 ranks: the CPU's data-parallel
#     checks on the device (the same weights on every rank, bitwise; one
#     process's on the whole batch within fp32 summation-order tolerance;
#     AdamW, clipping, accumulation, small buckets, Lion, SGD, ZeRO-1, the
#     guard; a bitwise repeat);
#   - tests/lua/mpi_nccl.lua on 2 ranks: the NCCL calls each rank made
#     (CK_NCCL_EMU_LOG) are its buckets' sums and ZeRO-1's broadcasts, no more
#     and no fewer; a second run gives the same bits;
#   - the same on one rank with CK_COMM_FORCE=1, under mpirun and alone (what
#     bench/gpu_check.sh runs on a GPU);
#   - a rank whose collectives never complete (CK_NCCL_EMU_HANG) ends the job
#     after the timeout with one line naming it and the step.
# SKIPs (77) where mpirun is missing, ckrun was built without MPI, or the
# emulated backend without NCCL.
MPI_TIMEOUT=120
. tests/sh/mpi_setup.sh
emu=${CK_BUILD:-build}/libck_cuda_emu.so
if [ ! -f "$emu" ]; then
  echo "SKIP: $emu is missing (a build without the CUDA emulator)"
  exit 77
fi
export CK_CUDA_MODULE=$(realpath "$emu")
log=$dir/nccl.log
export CK_NCCL_EMU_LOG=$log

# run NAME NP VAR=VALUE SCRIPT ARGS...: ckrun on NP ranks with VAR set, into
# $dir/NAME.out and .err, the NCCL calls into a fresh $log; rc in $rc
run() {
  local name=$1 np=$2 var=$3
  shift 3
  rm -f "$log"
  $MPIRUN -np "$np" env "$var" "$CKRUN" "$@" > "$dir/$name.out" 2> "$dir/$name.err"; rc=$?
}

run probe 2 CK_COMM_FORCE=0 tests/lua/mpi_nccl.lua
if grep -q "needs NCCL" "$dir/probe.err"; then
  echo "SKIP: the emulated CUDA backend was built without NCCL"
  exit 77
fi

run ddp 2 CK_COMM_FORCE=0 tests/lua/mpi_ddp.lua --device cuda
good=$(grep -c ' passed, 0 failed$' "$dir/ddp.out")
[ $rc = 0 ] && [ "$good" = 2 ] && ! grep -q '^FAIL' "$dir/ddp.out"
ok $? "mpi_ddp.lua --device cuda on 2 ranks: every rank passes ($(grep ' passed, ' "$dir/ddp.out" | tr '\n' ' ')rc $rc)"
grep '^FAIL' "$dir/ddp.out"; [ $rc = 0 ] || tail -5 "$dir/ddp.err"
[ -s "$log" ] && [ "$(grep -c '^rank 0 allreduce' "$log")" = "$(grep -c '^rank 1 allreduce' "$log")" ]
ok $? "and its sums went through NCCL, as many on each rank ($(grep -c allreduce "$log" 2>/dev/null) calls)"

# nccl NAME NP ENV: mpi_nccl.lua; every rank passes, and each made exactly the NCCL calls its line states
nccl() {
  local name=$1 np=$2 r
  run "$name" "$np" "$3" tests/lua/mpi_nccl.lua
  good=$(grep -c ' passed, 0 failed$' "$dir/$name.out")
  [ $rc = 0 ] && [ "$good" = "$np" ] && ! grep -q '^FAIL' "$dir/$name.out"
  ok $? "mpi_nccl.lua on $np rank(s) ($3): every rank passes (rc $rc)"
  grep '^FAIL' "$dir/$name.out"; [ $rc = 0 ] || tail -5 "$dir/$name.err"
  line=$(grep -m1 '^nccl: ' "$dir/$name.out")
  want_ar=$(echo "$line" | sed -n 's/.*allreduce \([0-9]*\) .*/\1/p')
  want_bc=$(echo "$line" | sed -n 's/.*broadcast \([0-9]*\);.*/\1/p')
  for r in $(seq 0 $((np - 1))); do
    ar=$(grep -c "^rank $r allreduce " "$log" 2>/dev/null)
    bc=$(grep -c "^rank $r broadcast " "$log" 2>/dev/null)
    [ -n "$want_ar" ] && [ "$want_ar" -gt 0 ] && [ "$ar" = "$want_ar" ] && [ "$bc" = "$want_bc" ]
    ok $? "rank $r: every sum and broadcast went through NCCL (allreduce $ar of $want_ar, broadcast $bc of $want_bc)"
  done
}
nccl two 2 CK_COMM_FORCE=0
first=$(grep -m1 '^nccl: ' "$dir/two.out" | sed 's/.*weights //')
nccl two_again 2 CK_COMM_FORCE=0
again=$(grep -m1 '^nccl: ' "$dir/two_again.out" | sed 's/.*weights //')
[ -n "$first" ] && [ "$first" = "$again" ]
ok $? "a second run gives the same bits ($first)"
nccl one 1 CK_COMM_FORCE=1
# and a lone process, outside an MPI job (bench/gpu_check.sh where mpirun is missing)
rm -f "$log"
CK_COMM_FORCE=1 "$CKRUN" tests/lua/mpi_nccl.lua > "$dir/lone.out" 2> "$dir/lone.err"; rc=$?
[ $rc = 0 ] && grep -q ' passed, 0 failed$' "$dir/lone.out" && [ "$(grep -c '^rank 0 allreduce ' "$log")" = \
  "$(sed -n 's/^nccl: .*allreduce \([0-9]*\) .*/\1/p' "$dir/lone.out")" ]
ok $? "one rank without mpirun, CK_COMM_FORCE=1: passes, its sums through NCCL (rc $rc)"
[ $rc = 0 ] || tail -3 "$dir/lone.err"
# the timeout: rank 1's sums never complete (CK_NCCL_EMU_HANG=1): polling them
# before its first wait on the device, it ends the job after CK_DIST_TIMEOUT
# seconds, naming itself and the step, its communicator aborted first
rm -f "$log"
t0=$(date +%s)
$MPIRUN -np 2 env CK_NCCL_EMU_HANG=1 CK_DIST_TIMEOUT=1 "$CKRUN" tests/lua/mpi_nccl.lua > "$dir/hang.out" \
  2> "$dir/hang.err"; rc=$?
secs=$(( $(date +%s) - t0 ))
[ $rc != 0 ] && [ $rc != 124 ] && [ $secs -lt 60 ] &&
  grep -q '^ckrun: rank 1: no reply from the other ranks in an NCCL collective for 1 s (step 1)$' "$dir/hang.err" &&
  grep -q '^rank 1 abort ' "$log" && ! grep -q ' passed, ' "$dir/hang.out"
ok $? "a rank whose sums never complete ends the job after the timeout, naming it and the step (rc $rc, $secs s)"
grep 'ckrun: rank' "$dir/hang.err"
echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
