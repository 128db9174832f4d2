# Data-parallel training under Open MPI's mpirun (oversubscribed: CI has 2
# cores): tests/lua/mpi_ddp.lua on 2 and 3 ranks, each rank training its share
# of every global batch with compile{world_size = N}, its gradient sums summed
# over the ranks in buckets by the op list's ALLREDUCE entries: the same
# weights on every rank, bitwise, and one process's on the whole batch within
# fp32 summation-order tolerance (AdamW, clipping, accumulation, small
# buckets, Lion, SGD), a bitwise repeat, the plan of one rank of 8, the
# refusals. SKIPs (77) where mpirun is missing or ckrun was built without MPI.
MPI_TIMEOUT=120
. tests/sh/mpi_setup.sh
for np in 2 3; do
  $MPIRUN -np $np "$CKRUN" tests/lua/mpi_ddp.lua > "$dir/ddp$np.out" 2> "$dir/ddp$np.err"; rc=$?
  good=$(grep -c ' passed, 0 failed$' "$dir/ddp$np.out")
  [ $rc = 0 ] && [ "$good" = $np ] && ! grep -q '^FAIL' "$dir/ddp$np.out"
  ok $? "mpi_ddp.lua on $np ranks: every rank passes ($(grep ' passed, ' "$dir/ddp$np.out" | tr '\n' ' ')rc $rc)"
  grep '^FAIL' "$dir/ddp$np.out"; [ $rc = 0 ] || tail -5 "$dir/ddp$np.err"
done
echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
