# scripts/policy_sweep.lua with no arguments (the README's first command for
# policy experiments: every default, --budgets' among them, read and parsed):
# a row per fixed and budget policy, each measured peak equal to the planned
# one and each loss equal to none's (the checks the script reports as
# MISMATCH), and the Pareto front written with a point per policy. Then
# --plan plans the same policies and runs nothing.
set -u
pass=0 fail=0
ok() { if [ "$1" = 0 ]; then pass=$((pass+1)); echo "ok   $2"; else fail=$((fail+1)); echo "FAIL $2"; fi; }
CKRUN=$(cd "$(dirname "$CKRUN")" && pwd)/$(basename "$CKRUN")
SRC=$PWD
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cd "$dir" || exit 1
POLICIES="none diffusers selective sqrt_n every_n:2 every_n:3 budget:90% budget:80% budget:70% budget:62% budget:55%"

out=$(OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} "$CKRUN" "$SRC/scripts/policy_sweep.lua" 2>&1); rc=$?
[ $rc = 0 ]; ok $? "policy_sweep.lua runs with every default (exit $rc: $(printf '%s\n' "$out" | tail -1))"
missing=""
for p in $POLICIES; do
  # policy, predicted, measured, ok, recompute %, ms, x ratio, loss = none's
  printf '%s\n' "$out" | grep -qE "^$p +[0-9.]+ +[0-9.]+ +ok +[0-9.]+% +[0-9]+ +x[0-9.]+ +yes$" || missing="$missing $p"
done
[ -z "$missing" ]; ok $? "a row per default policy, measured peak == planned and loss == none's (not:$missing)"
! printf '%s\n' "$out" | grep -q MISMATCH; ok $? "no MISMATCH reported"
python3 -c 'import sys, xml.etree.ElementTree as ET; r = ET.parse(sys.argv[1]).getroot(); assert len([c for c in r.iter() if c.get("class") == "point"]) == 11' out/policy_sweep.svg
ok $? "the Pareto front is written to out/policy_sweep.svg with a point per policy"

out=$("$CKRUN" --plan "$SRC/scripts/policy_sweep.lua" 2>&1); rc=$?
rows=0
for p in $POLICIES; do printf '%s\n' "$out" | grep -qE "^$p +[0-9.]+ +[0-9.]+ +[0-9.]+%" && rows=$((rows+1)); done
[ $rc = 0 ] && [ $rows = 11 ]; ok $? "--plan policy_sweep.lua plans the same 11 policies ($rows)"

# a MISMATCH row fails the checks above: the row pattern is strict
printf 'none 1.0 2.0 MISMATCH 0.0%% 3 x1.00 yes\n' | grep -qE "^none +[0-9.]+ +[0-9.]+ +ok "; [ $? != 0 ]
ok $? "a MISMATCH row does not pass for a good one"

echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
