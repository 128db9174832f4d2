# fp16's loss scaling on 2 ranks (tests/lua/mpi_loss_scale.lua): an overflow
# on one rank skips the update on every rank, and the ranks' weights and
# scales stay equal. SKIPs (77) where mpirun is missing or ckrun was built
# without MPI.
MPI_TIMEOUT=120
. tests/sh/mpi_setup.sh
$MPIRUN -np 2 "$CKRUN" tests/lua/mpi_loss_scale.lua > "$dir/out" 2> "$dir/err"; rc=$?
good=$(grep -c ' passed, 0 failed$' "$dir/out")
[ $rc = 0 ] && [ "$good" = 2 ] && ! grep -q '^FAIL' "$dir/out"
ok $? "mpi_loss_scale.lua on 2 ranks: every rank passes ($(grep ' passed, ' "$dir/out" | tr '\n' ' ')rc $rc)"
grep -E '^(ok|FAIL)' "$dir/out"; [ $rc = 0 ] || tail -5 "$dir/err"
echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
