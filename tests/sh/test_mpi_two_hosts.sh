# Two "hosts" on one machine: two network namespaces joined by a veth pair
# (10.77.0.1/24 and 10.77.0.2/24), one rank in each, MPI over TCP between them
# (--mca btl tcp,self: no shared memory between the ranks). mpirun runs in the
# first namespace and starts the daemon of the second through an rsh agent
# that runs `ip netns exec`. tests/lua/mpi_collectives.lua passes on both
# ranks, each alone on its machine (local size 1), its bytes cross the veth,
# and a Lua error on rank 1 still ends the job naming rank 1. Needs root and
# iproute2; SKIPs (77) with the reason where it cannot make namespaces.
set -u
pass=0 fail=0
ok() { if [ "$1" = 0 ]; then pass=$((pass+1)); echo "ok   $2"; else fail=$((fail+1)); echo "FAIL $2"; fi; }
CKRUN=$(cd "$(dirname "${CKRUN:-build/ckrun}")" && pwd)/$(basename "${CKRUN:-build/ckrun}")
skip() { echo "SKIP: $1"; exit 77; }

command -v mpirun > /dev/null || skip "mpirun is missing (apt-get install openmpi-bin libopenmpi-dev)"
command -v ip > /dev/null || skip "ip is missing (apt-get install iproute2)"
[ "$(id -u)" = 0 ] || skip "network namespaces need root"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
unset CK_DIST_TIMEOUT

# names of this run's own, so that runs in parallel do not meet
ns0=ck0-$$ ns1=ck1-$$ v0=ckv0-$$ v1=ckv1-$$
dir=$(mktemp -d)
cleanup() { ip netns del "$ns0" 2> /dev/null; ip netns del "$ns1" 2> /dev/null; rm -rf "$dir"; }
trap cleanup EXIT
ip netns add "$ns0" 2> "$dir/ns.err" || skip "cannot create a network namespace: $(head -1 "$dir/ns.err")"
ip netns add "$ns1" 2> "$dir/ns.err" || skip "cannot create a network namespace: $(head -1 "$dir/ns.err")"
{
  ip link add "$v0" type veth peer name "$v1" &&
  ip link set "$v0" netns "$ns0" && ip link set "$v1" netns "$ns1" &&
  ip -n "$ns0" addr add 10.77.0.1/24 dev "$v0" && ip -n "$ns1" addr add 10.77.0.2/24 dev "$v1" &&
  ip -n "$ns0" link set lo up && ip -n "$ns1" link set lo up &&
  ip -n "$ns0" link set "$v0" up && ip -n "$ns1" link set "$v1" up
} 2> "$dir/ns.err" || skip "cannot join the namespaces with a veth pair: $(head -1 "$dir/ns.err")"

probe=$(timeout 30 mpirun --oversubscribe -np 2 "$CKRUN" -e 'print(require("ck").world_size())' 2>&1)
case "$probe" in *"built without MPI"*) skip "ckrun was built without MPI";; esac

# the rsh agent: `agent HOST COMMAND...` runs COMMAND in HOST's namespace,
# and notes the call
cat > "$dir/agent" <<EOF
#!/bin/sh
host=\$1; shift
case "\$host" in
  10.77.0.1) ns=$ns0 ;;
  10.77.0.2) ns=$ns1 ;;
  *) echo "agent: unknown host \$host" >&2; exit 1 ;;
esac
echo "\$host \$ns" >> "$dir/agent.log"
exec ip netns exec "\$ns" sh -c "\$*"
EOF
chmod +x "$dir/agent"

# under make test-asan, no leak check in the ranks: Open MPI's own
# allocations at exit (tests/sh/test_mpi.sh says more)
[ -n "${ASAN_OPTIONS:-}" ] && export ASAN_OPTIONS="$ASAN_OPTIONS:detect_leaks=0"

rx_bytes() { ip -n "$ns1" -s link show "$v1" | awk '/RX:/ { getline; print $1; exit }'; }
two_hosts() {
  timeout 60 ip netns exec "$ns0" mpirun --mca plm_rsh_agent "$dir/agent" --mca btl tcp,self \
    --mca btl_tcp_if_include 10.77.0.0/24 --mca oob_tcp_if_include 10.77.0.0/24 \
    --host 10.77.0.1:1,10.77.0.2:1 -np 2 -x OMP_NUM_THREADS=1 --wdir "$PWD" "$CKRUN" "$@"
}

rx0=$(rx_bytes)
two_hosts tests/lua/mpi_collectives.lua --world 2 --local 1 > "$dir/all.out" 2> "$dir/all.err"
rc=$?
rx=$(( $(rx_bytes) - rx0 ))
good=$(grep -c ' passed, 0 failed$' "$dir/all.out")
[ $rc = 0 ] && [ "$good" = 2 ] && ! grep -q '^FAIL' "$dir/all.out"
ok $? "mpi_collectives.lua on two hosts: both ranks pass, each alone on its host ($(grep ' passed, ' "$dir/all.out" | tr '\n' ' ')rc $rc)"
grep '^FAIL' "$dir/all.out"; [ $rc = 0 ] || tail -20 "$dir/all.err"
grep -qx "10.77.0.2 $ns1" "$dir/agent.log" && ! grep -q "10.77.0.1" "$dir/agent.log"
ok $? "the second host's daemon started through the agent in $ns1 ($(tr '\n' ' ' < "$dir/agent.log"))"
# the 1 MiB allreduce alone brings the second host a MiB (rank 0's half for
# it to sum, then the other half summed)
[ "$rx" -gt 1000000 ]
ok $? "the ranks' bytes crossed the veth ($rx bytes received by the second host)"

two_hosts tests/lua/mpi_collectives.lua --case error > "$dir/error.out" 2> "$dir/error.err"
rc=$?
grep -q '^ckrun: rank 1: tests/lua/mpi_collectives.lua:[0-9]*: rank 1 fails on purpose$' "$dir/error.err" &&
  [ $rc != 0 ] && [ $rc != 124 ]
ok $? "a Lua error on the second host's rank ends the job naming rank 1 (rc $rc)"

echo "$pass passed, $fail failed"
[ $fail = 0 ]
