# Sourced by the data-parallel tests (test_mpi_ddp.sh, test_mpi_train.sh):
# the ok counter, a temp dir $dir removed on exit, and $MPIRUN (mpirun
# oversubscribed under a timeout of ${MPI_TIMEOUT:-300} s; under make
# test-asan the ranks keep ASan's checks but not its leak check, Open MPI's
# own allocations at exit); exits 77 (SKIP) where mpirun is missing or ckrun
# was built without MPI.
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
# The compared runs multiply matrices of other row counts (a batch split over
# the ranks against one process's whole batch). OpenBLAS's AVX-512 kernels
# round small products by their row count, and AdamW's first steps amplify
# that in the few elements whose gradients are near zero (worst tensor 1.7e-3
# off on a loaded AVX-512 machine, 7e-5 with the AVX2 kernels, which do not):
# on such a machine the jobs use OpenBLAS's AVX2 kernels.
if grep -qw avx512f /proc/cpuinfo 2> /dev/null; then export OPENBLAS_CORETYPE=Haswell; fi
unset CK_DIST_TIMEOUT
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
MPIRUN="timeout ${MPI_TIMEOUT:-300} mpirun --oversubscribe"
if [ -n "${ASAN_OPTIONS:-}" ]; then
  MPIRUN="timeout ${MPI_TIMEOUT:-300} env ASAN_OPTIONS=$ASAN_OPTIONS:detect_leaks=0 mpirun --oversubscribe"
fi
$MPIRUN -np 2 "$CKRUN" -e 'print(require("ck").world_size())' > "$dir/probe.out" 2> "$dir/probe.err"
if grep -q "built without MPI" "$dir/probe.err"; then
  echo "SKIP: ckrun was built without MPI"
  exit 77
fi
