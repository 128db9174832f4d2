# The budget search on full SDXL LoRA at 1024x1024 (planned only, on the CPU
# and with the CUDA backend's rules): at each fixed policy's peak it fits and
# recomputes no more than that policy; a budget written as the figure ckrun
# prints for a policy (the --plan table's GiB, the MiB of budget's error)
# fits that policy; auto at a fixed policy's whole-run figure does not refuse.
set -u
pass=0 fail=0
ok() { if [ "$1" = 0 ]; then pass=$((pass+1)); echo "ok   $2"; else fail=$((fail+1)); echo "FAIL $2"; fi; }

dir=$(mktemp -d "$PWD/out/.test_budget_full.XXXXXX" 2>/dev/null || { mkdir -p out && mktemp -d "$PWD/out/.test_budget_full.XXXXXX"; })
trap 'rm -rf "$dir"' EXIT
S="scripts/train_sdxl_lora.lua --size full --resolution 1024"

# budget:PEAK_BYTES for each fixed policy: fits, recomputes no more
for dev in cpu cuda; do
  case $dev in cpu) fixed=diffusers,sqrt_n,selective,every_n:3 ;; cuda) fixed=diffusers,every_n:2,every_n:5 ;; esac
  "$CKRUN" --plan --json --device $dev --policies $fixed $S > "$dir/$dev.json"
  budgets=$(python3 -c 'import json, sys; print(",".join("budget:%d" % p["peak_bytes"] for p in json.load(open(sys.argv[1]))["policies"]))' "$dir/$dev.json")
  "$CKRUN" --plan --json --device $dev --policies "$budgets" $S > "$dir/$dev.budget.json"; rc=$?
  [ $rc = 0 ] && python3 - "$dir/$dev.json" "$dir/$dev.budget.json" <<'PY'
import json, sys
fixed, budget = (json.load(open(f))["policies"] for f in sys.argv[1:3])
assert len(fixed) == len(budget) >= 3
for f, b in zip(fixed, budget):
    assert "error" not in f and "error" not in b, (f["name"], b.get("error"))
    assert b["peak_bytes"] <= f["peak_bytes"] and b["recompute_flops"] <= f["recompute_flops"], (f["name"], b, f)
    print("  %s: %s at %d bytes recomputes %.4g FLOPs, %s %.4g" % (sys.argv[1].split("/")[-1][:-5], b["name"],
          b["peak_bytes"], b["recompute_flops"], f["name"], f["recompute_flops"]))
PY
  ok $? "$dev: budget at the peak of each of $fixed fits and recomputes no more than it"
done

# the figures ckrun prints: each row's peak rounded up; written back as budgets
"$CKRUN" --plan --policies diffusers,sqrt_n $S > "$dir/table.txt"
python3 - "$dir/cpu.json" "$dir/table.txt" <<'PY'; ok $? "the table's peaks (GiB) are never below the planned bytes"
import json, sys
rows = {l.split()[0]: float(l.split()[1]) for l in open(sys.argv[2]) if l[:1].isalpha() and "%" in l}
for p in json.load(open(sys.argv[1]))["policies"][:2]:
    assert rows[p["name"]] * 2 ** 30 >= p["peak_bytes"] > (rows[p["name"]] - 0.01) * 2 ** 30, (p["name"], rows)
PY
table=$(awk '$1 == "diffusers" {print $2}' "$dir/table.txt")
"$CKRUN" --plan --json --policies "budget:${table}GiB,budget:55%" $S > "$dir/printed.json"; rc=$?
# budget:55%'s error: the smallest peak in MiB, rounded up, and in bytes
read -r mib least < <(python3 -c 'import json, re, sys; print(*re.search(r"smallest peak ckrun can plan is ([0-9.]+) MiB \(([0-9]+) bytes\)", json.load(open(sys.argv[1]))["policies"][1]["error"]).groups())' "$dir/printed.json")
python3 -c 'import sys; assert float(sys.argv[1]) * 2 ** 20 >= int(sys.argv[2])' "$mib" "$least"
ok $? "budget's error gives the smallest peak rounded up: $mib MiB for $least bytes"
"$CKRUN" --plan --json --policies "budget:${mib}MiB" $S > "$dir/printed2.json"
python3 - "$dir/cpu.json" "$dir/printed.json" "$dir/printed2.json" <<'PY'; ok $? "budget:${table}GiB (diffusers' row of the table) and budget:${mib}MiB (budget:55%'s error) fit, recomputing no more than diffusers"
import json, sys
diffusers = json.load(open(sys.argv[1]))["policies"][0]
for b in (json.load(open(sys.argv[2]))["policies"][0], json.load(open(sys.argv[3]))["policies"][0]):
    assert "error" not in b and b["recompute_flops"] <= diffusers["recompute_flops"], (b, diffusers)
PY

# auto at diffusers' whole-run figure, no headroom: not refused, no more recompute
for dev in cpu cuda; do
  read -r bytes flops < <(python3 -c 'import json, sys; p = json.load(open(sys.argv[1]))["policies"][0]; print(p["device_bytes"], p["recompute_flops"])' "$dir/$dev.json")
  "$CKRUN" --plan --json --device $dev $S --checkpoint auto:$bytes --fit-headroom 0 > "$dir/$dev.auto.json"; rc=$?
  [ $rc = 0 ] && python3 - "$dir/$dev.auto.json" $bytes $flops <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))["policies"][0]
assert p["device_bytes"] <= int(sys.argv[2]) and p["recompute_flops"] <= float(sys.argv[3]), p
PY
  ok $? "$dev: auto at diffusers' whole-run figure ($bytes bytes) fits, recomputing no more than diffusers"
done

echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
