# The plans of the SDXL LoRA training step (tiny, mid and full; fixed
# policies, budgets and auto; a logging program; cpu and cuda) are the same
# to the byte as the ones in tests/data/plans: every list, entry and offset
# (p:plan().layout_digest), the peaks and the recompute FLOPs. The files were
# made by the quadratic placement that vm/plan/place.c replaced (b52b7fe);
# a change of placement or search that moves any byte fails here.
set -u
pass=0 fail=0
ok() { if [ "$1" = 0 ]; then pass=$((pass+1)); echo "ok   $2"; else fail=$((fail+1)); echo "FAIL $2"; fi; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
for dev in cpu cuda; do
  "$CKRUN" --plan --device $dev tests/scripts/plan_layouts.lua > "$dir/$dev.txt" 2>&1
  cmp "$dir/$dev.txt" tests/data/plans/layouts_$dev.txt; r=$?
  [ $r = 0 ] || diff tests/data/plans/layouts_$dev.txt "$dir/$dev.txt" | head -20
  ok $r "$dev: $(wc -l < tests/data/plans/layouts_$dev.txt) plans equal the recorded ones to the byte"
done
echo "$pass passed, $fail failed"
[ $fail = 0 ]
