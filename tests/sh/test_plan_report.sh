# ckrun --plan: one row per policy in text, one line of JSON with a "policies"
# list, peaks in the order the policies promise, the largest batch that fits,
# the SVG timeline (one panel per policy), clear errors, and policy_sweep's
# predicted peaks equal to the measured ones.
set -u
pass=0 fail=0
ok() { if [ "$1" = 0 ]; then pass=$((pass+1)); echo "ok   $2"; else fail=$((fail+1)); echo "FAIL $2"; fi; }

# scratch files under the working directory, where the sandbox lets scripts write
dir=$(mktemp -d "$PWD/out/.test_plan_report.XXXXXX" 2>/dev/null || { mkdir -p out && mktemp -d "$PWD/out/.test_plan_report.XXXXXX"; })
trap 'rm -rf "$dir"' EXIT
train=scripts/train_sdxl_lora.lua
small="--resolution 256"

# text: the info lines, then one row per policy
out=$("$CKRUN" --plan --policies none,diffusers,selective,budget:62% $train $small 2>&1); rc=$?
rows=$(printf '%s\n' "$out" | grep -cE '^(none|diffusers|selective|budget:62%) +[0-9.]+ +[0-9.]+ +[0-9.]+%')
[ $rc = 0 ] && [ "$rows" = 4 ]; ok $? "--plan --policies prints one row per policy ($rows rows)"
printf '%s\n' "$out" | grep -qE '^param_count +[0-9]+$'; ok $? "--plan prints the script's info lines first"
out=$("$CKRUN" --plan $train $small); rows=$(printf '%s\n' "$out" | grep -cE '^none +[0-9.]+ ')
[ "$rows" = 1 ] && printf '%s\n' "$out" | grep -qE '^checkpoint +none$'; ok $? "without --policies the report has the script's own policy only"

# JSON: one line, valid, the required keys, peaks in order
"$CKRUN" --plan --json --policies none,diffusers,selective,budget:62%,budget:1% $train $small > "$dir/plan.json"; rc=$?
[ $rc = 0 ] && [ "$(wc -l < "$dir/plan.json")" = 1 ]; ok $? "--json prints one line (exit 0 although budget:1% fits nothing)"
python3 -c 'import json,sys; json.load(sys.stdin)' < "$dir/plan.json"; ok $? "--json is valid JSON"
python3 - "$dir/plan.json" <<'EOF'; ok $? "--json: info keys, first policy's bytes, and each policy's name, peak_bytes, activation_bytes, step_flops, recompute_flops"
import json, sys
d = json.load(open(sys.argv[1]))
for k in ("param_count", "trainable_param_count", "peak_bytes", "persistent_bytes", "transient_bytes", "workspace_bytes", "ops"):
    assert isinstance(d[k], int) and d[k] >= 0, k
ps = d["policies"]
assert [p["name"] for p in ps] == ["none", "diffusers", "selective", "budget:62%", "budget:1%"], ps
for p in ps[:4]:
    for k in ("peak_bytes", "activation_bytes", "step_flops", "recompute_flops", "live_peak_bytes", "recompute_ops", "at_peak"):
        assert k in p, (p["name"], k)
    assert 0 < sum(p["at_peak"].values()) <= p["live_peak_bytes"] <= p["peak_bytes"], p["name"]
assert d["peak_bytes"] == ps[0]["peak_bytes"]
assert ps[0]["recompute_flops"] == 0 and ps[1]["recompute_flops"] > 0
EOF
python3 - "$dir/plan.json" <<'EOF'; ok $? "--json: diffusers' peak < none's, budget:62% <= 0.62 x none's, budget:1% reports an error"
import json, sys
ps = {p["name"]: p for p in json.load(open(sys.argv[1]))["policies"]}
none = ps["none"]["peak_bytes"]
assert ps["diffusers"]["peak_bytes"] < none
assert ps["budget:62%"]["peak_bytes"] <= 0.62 * none
assert "nothing fits" in ps["budget:1%"]["error"] and "peak_bytes" not in ps["budget:1%"]
EOF

# --max-batch: the batch reported fits, one more does not (planned again here)
"$CKRUN" --plan --json --max-batch 150MiB $train $small > "$dir/mb.json"
mb=$(python3 -c 'import json,sys; print(json.load(sys.stdin)["max_batch"])' < "$dir/mb.json")
peak_at() { "$CKRUN" --plan --json $train $small --batch "$1" | python3 -c 'import json,sys; print(json.load(sys.stdin)["peak_bytes"])'; }
limit=$((150 * 1048576))
p1=$(peak_at "$mb"); p2=$(peak_at $((mb + 1)))
[ "$mb" -ge 1 ] && [ "$p1" -le $limit ] && [ "$p2" -gt $limit ]; ok $? "--max-batch 150MiB: batch $mb plans $p1 bytes, batch $((mb + 1)) plans $p2 (limit $limit)"
out=$("$CKRUN" --plan --max-batch 150MiB --policies none,diffusers $train $small)
printf '%s\n' "$out" | grep -qE "^  none +batch $mb \(peak"; ok $? "--max-batch is reported in the text table too"
out=$("$CKRUN" --plan --max-batch 1MiB $train $small); rc=$?
[ $rc = 0 ] && printf '%s\n' "$out" | grep -q "even batch 1 does not fit"; ok $? "--max-batch below batch 1's peak says even batch 1 does not fit"

# --svg: parses as XML, one panel per policy, MiB axis, peak marked, no .tmp left
"$CKRUN" --allow-write "$dir" --plan --policies none,diffusers,sqrt_n --svg "$dir/t.svg" $train $small > /dev/null; rc=$?
[ $rc = 0 ] || echo "ckrun --svg exited with $rc"
python3 - "$dir/t.svg" <<'EOF'; ok $? "--svg writes an SVG that parses as XML with one panel per policy, categories, phases and the peak"
import sys, xml.etree.ElementTree as ET
ns = "{http://www.w3.org/2000/svg}"
root = ET.parse(sys.argv[1]).getroot()
assert root.tag == ns + "svg"
panels = [g for g in root.iter(ns + "g") if g.get("class") == "panel"]
assert len(panels) == 3, len(panels)
text = " ".join("".join(t.itertext()) for t in root.iter(ns + "text"))
for word in ("MiB", "activations", "recomputed", "forward", "recompute", "backward", "optimizer", "none", "diffusers", "sqrt_n"):
    assert word in text, word
for g in panels:
    assert any(l.get("class") == "peak" for l in g.iter(ns + "line"))
    assert len([p for p in g.iter(ns + "path") if p.get("class") == "cat"]) >= 3
EOF
[ $rc = 0 ] && [ ! -e "$dir/t.svg.tmp" ]; ok $? "--svg leaves no temporary file"

# on cuda the report says what the convolutions' workspaces cost, summed and the largest (the algorithms
# chosen per shape on a device; the stated rule without one), in text and in JSON
out=$("$CKRUN" --plan --device cuda $train $small 2>&1); rc=$?
[ $rc = 0 ] && printf '%s\n' "$out" | grep -qE '^conv workspace +[0-9.]+ [KMG]?i?B over the list.s convolutions, the largest [0-9.]+ [KMG]?i?B'
ok $? "--plan --device cuda prints the convolutions' workspace: $(printf '%s\n' "$out" | grep '^conv workspace')"
"$CKRUN" --plan --json --device cuda $train $small > "$dir/cuda.json"
python3 - "$dir/cuda.json" <<'EOF'; ok $? "--plan --json --device cuda: conv_workspace_bytes >= conv_workspace_max_bytes > 0"
import json, sys
p = json.load(open(sys.argv[1]))["policies"][0]
assert p["conv_workspace_bytes"] >= p["conv_workspace_max_bytes"] > 0, p
EOF

# errors: one clear line and a non-zero exit
err=$("$CKRUN" --plan --policies none,bogus $train $small 2>&1 >/dev/null); rc=$?
[ $rc != 0 ] && [ "$(printf '%s\n' "$err" | wc -l)" = 1 ] && printf '%s' "$err" | grep -q "unknown checkpoint policy 'bogus'"
ok $? "an unknown policy is one error line and a non-zero exit ($err)"
err=$("$CKRUN" --plan --policies budget:1%,budget:2% $train $small 2>&1 >/dev/null); rc=$?
[ $rc != 0 ] && [ "$(printf '%s\n' "$err" | wc -l)" = 1 ] && printf '%s' "$err" | grep -q "no policy could be planned"
ok $? "when every policy fails, one error line and a non-zero exit"

# full SDXL LoRA at 1024x1024, one policy: planned without allocating or reading
# the 10 GB of weights: the planning process's peak RSS (wait4's ru_maxrss)
# stays under 1 GiB (its time is reported, not judged: BENCHMARKS.md)
rss=$(python3 - "$dir/full.json" "$CKRUN" --plan --json $train --size full <<'PY'
import os, subprocess, sys, time
t0 = time.time()
with open(sys.argv[1], "w") as out:
    p = subprocess.Popen(sys.argv[2:], stdout=out)
    _, status, ru = os.wait4(p.pid, 0)
print(os.waitstatus_to_exitcode(status), ru.ru_maxrss * 1024, round(time.time() - t0, 2))
PY
)
set -- $rss
[ "${1:-1}" = 0 ] && python3 -c 'import json,sys; d=json.load(sys.stdin); assert d["param_count"] == 2567463684 and len(d["policies"]) == 1' < "$dir/full.json" \
  && [ "${2:-0}" -gt 0 ] && [ "$2" -lt 1073741824 ]
ok $? "full SDXL LoRA 1024x1024 plans with a peak RSS of $(( ${2:-0} / 1048576 )) MiB, nothing allocated (${3:-?} s)"

# policy_sweep: a row per policy, every predicted peak measured to the byte
out=$(OMP_NUM_THREADS=2 "$CKRUN" --allow-write "$dir" scripts/policy_sweep.lua --steps 2 --resolution 128 --budgets 95% \
  --svg "$dir/sweep.svg" 2>&1); rc=$?
rows=$(printf '%s\n' "$out" | grep -cE '^(none|diffusers|selective|sqrt_n|every_n:2|every_n:3|budget:95%) +[0-9.]+ +[0-9.]+ +ok ')
[ $rc = 0 ] && [ "$rows" = 7 ] && ! printf '%s' "$out" | grep -q MISMATCH
ok $? "policy_sweep prints a row per policy with predicted == measured ($rows of 7)"
python3 -c 'import sys, xml.etree.ElementTree as ET; r = ET.parse(sys.argv[1]).getroot(); assert len([c for c in r.iter() if c.get("class") == "point"]) == 7' "$dir/sweep.svg"
ok $? "policy_sweep writes the Pareto front as SVG with every point"

echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
