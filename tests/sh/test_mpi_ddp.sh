# Data-parallel training under Open MPI's mpirun (oversubscribed: CI has 2
# cores): tests/lua/mpi_ddp.lua on 2 and 3 ranks, each rank training its share
# of every global batch with compile{world_size = N}, its gradient sums summed
# over the ranks in buckets by the op list's ALLREDUCE entries: the same
# weights on every rank, bitwise, and one process's on the whole batch within
# fp32 summation-order tolerance (AdamW, clipping, accumulation, small
# buckets, Lion, SGD), a bitwise repeat, the plan of one rank of 8, the
# refusals. SKIPs (77) where mpirun is missing or ckrun was built without MPI.
set -u
pass=0 fail=0
ok() { if [ "$1" = 0 ]; then pass=$((pass+1)); echo "ok   $2"; else fail=$((fail+1)); echo "FAIL $2"; fi; }
CKRUN=${CKRUN:-build/ckrun}
if ! command -v mpirun > /dev/null; then
  echo "SKIP: mpirun is missing (apt-get install openmpi-bin libopenmpi-dev)"
  exit 77
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 # CI may run as root
export OMP_NUM_THREADS=1
unset CK_DIST_TIMEOUT
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
MPIRUN="timeout 120 mpirun --oversubscribe"
# under make test-asan the ranks keep ASan's checks, not its leak check (Open MPI's own allocations at exit)
if [ -n "${ASAN_OPTIONS:-}" ]; then
  MPIRUN="timeout 120 env ASAN_OPTIONS=$ASAN_OPTIONS:detect_leaks=0 mpirun --oversubscribe"
fi
$MPIRUN -np 2 "$CKRUN" -e 'print(require("ck").world_size())' > "$dir/probe.out" 2> "$dir/probe.err"
if grep -q "built without MPI" "$dir/probe.err"; then
  echo "SKIP: ckrun was built without MPI"
  exit 77
fi
for np in 2 3; do
  $MPIRUN -np $np "$CKRUN" tests/lua/mpi_ddp.lua > "$dir/ddp$np.out" 2> "$dir/ddp$np.err"; rc=$?
  good=$(grep -c ' passed, 0 failed$' "$dir/ddp$np.out")
  [ $rc = 0 ] && [ "$good" = $np ] && ! grep -q '^FAIL' "$dir/ddp$np.out"
  ok $? "mpi_ddp.lua on $np ranks: every rank passes ($(grep ' passed, ' "$dir/ddp$np.out" | tr '\n' ' ')rc $rc)"
  grep '^FAIL' "$dir/ddp$np.out"; [ $rc = 0 ] || tail -5 "$dir/ddp$np.err"
done
echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
