# The plans of the SDXL LoRA training step (tiny, mid and full; fixed
# policies, budgets and auto; a logging program; cpu and cuda) are the same
# to the byte as the ones in tests/data/plans/layouts_*.txt: every list,
# entry and offset (p:plan().layout_digest), the peaks and the recompute
# FLOPs. before_*.txt are the plans ckrun made before placement by live
# overlap and the tracked search (b52b7fe): every fixed policy's plan is the
# same to the byte as then, and every budget and auto plan recomputes no
# more FLOPs than then.
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
  # against the plans before: fixed policies the same, searches no more FLOPs
  # (a refusal's figure with offload, named after the one without since, is not compared)
  out=$(paste -d'\n' tests/data/plans/before_$dev.txt "$dir/$dev.txt" | awk '
    NR % 2 == 1 { old = $0; next }
    {
      sub(/; with offload \(--offload auto\), .*/, "")
      name = $0; sub(/: (ops|compile).*/, "", name)
      if (name !~ /budget|auto/) { if ($0 != old) { print "changed: " name; bad++ }; next }
      if ($0 ~ /nothing fits/ || old ~ /nothing fits/) { if ($0 != old) { print "changed: " name; bad++ }; next }
      match(old, /recompute_flops [0-9]+/); o = substr(old, RSTART + 16, RLENGTH - 16) + 0
      match($0, /recompute_flops [0-9]+/); n = substr($0, RSTART + 16, RLENGTH - 16) + 0
      if (n > o) { print "more recompute than before: " name " " o " -> " n; bad++ }
      searches++
    }
    END { print searches " searches"; exit bad > 0 }'); r=$?
  printf '%s\n' "$out" | sed 's/^/     /'
  ok $r "$dev: fixed policies as before to the byte, searches recompute no more than before"
done
echo "$pass passed, $fail failed"
[ $fail = 0 ]
