# bench/gpu_step.lua, the training-step half of bench/gpu_check.sh, on the CPU
# (--device cpu): the GPU run finds the script working. One JSON line for the
# case and one per policy, each peak measured to the byte, recompute policies
# with none's losses bit for bit, the markdown table of those lines
# (bench/gpu_step_torch.py --table, which needs no torch), the same on the
# CPU emulator of the CUDA backend, and a bad option named with its script line.
set -u
pass=0 fail=0
ok() { if [ "$1" = 0 ]; then pass=$((pass+1)); echo "ok   $2"; else fail=$((fail+1)); echo "FAIL $2"; fi; }

dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
OMP_NUM_THREADS=2 "$CKRUN" --trust bench/gpu_step.lua --device cpu --case tiny --latent 8 --warmup 1 --steps 2 \
  --policies none,diffusers,budget:97% > "$dir/steps.jsonl" 2> "$dir/err.txt"
ok $? "gpu_step.lua --device cpu runs three policies ($(tail -1 "$dir/err.txt"))"
python3 - "$dir/steps.jsonl" <<'PY'; ok $? "a case line, then per policy: measured peak == plan, timed steps, none's losses bit for bit"
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
assert lines[0]["event"] == "case" and lines[0]["device"] == "cpu", lines[0]
rows = {r["policy"]: r for r in lines[1:]}
assert sorted(rows) == ["budget:97%", "diffusers", "none"], sorted(rows)
for name, r in rows.items():
    assert "error" not in r, (name, r.get("error"))
    assert r["peak_match"] is True and r["measured_peak"] == r["plan_peak"], name
    assert len(r["step_ms_all"]) == 2 and all(t > 0 for t in r["step_ms_all"]), name
    assert len(r["losses"]) == 4, name  # the measuring step, 1 warm-up, 2 timed
    if name != "none":
        assert r["recompute_flops"] > 0 and r["plan_peak"] < rows["none"]["plan_peak"], name
        assert r["losses"] == rows["none"]["losses"] and r["same_losses_as_none"] is True, name
PY
python3 bench/gpu_step_torch.py --table "$dir/steps.jsonl" > "$dir/table.md"
rows=$(grep -cE '^\| .*(none|diffusers|budget:97%)' "$dir/table.md")
[ "$rows" = 3 ]; ok $? "gpu_step_torch.py --table prints a row per policy without torch ($rows rows)"

"$CKRUN" --trust bench/gpu_step.lua --device cpu --case huge > /dev/null 2> "$dir/bad.txt"; rc=$?
[ $rc != 0 ] && grep -qE 'gpu_step\.lua:[0-9]+: --case must be tiny or full, got .huge.' "$dir/bad.txt"
ok $? "a bad option is one error naming the script line ($(head -1 "$dir/bad.txt"))"

# on "cuda" through the CPU emulator of the CUDA backend (where it was built):
# device memory figures, the backend's fixed bytes, and the fallback to a
# smaller latent when none's plan does not fit the free memory with --headroom
# (not under AddressSanitizer: the emulator runs every GPU thread in turn, and
# instrumented that takes minutes; lua_test_device_emu is left out there too)
emu="${CK_BUILD:-build}/libck_cuda_emu.so"
if ldd "$CKRUN" 2>/dev/null | grep -q libasan; then
  echo "(an AddressSanitizer build: the emulated-GPU run is left out)"
elif [ -f "$emu" ]; then
  CK_CUDA_MODULE="$emu" "$CKRUN" --trust bench/gpu_step.lua --case tiny --latent 8 --fallback 4 --headroom "100 GiB" \
    --warmup 0 --steps 1 --policies none,diffusers > "$dir/emu.jsonl" 2> "$dir/emu.txt"
  ok $? "gpu_step.lua on the emulated GPU ($(tail -1 "$dir/emu.txt"))"
  grep -q "warm-up step (none)" "$dir/emu.txt"
  ok $? "on cuda one untimed step loads the kernel modules before any memory is measured"
  python3 - "$dir/emu.jsonl" <<'PY'; ok $? "emulated GPU: the fallback to 4x4 latents said why, fixed bytes and device memory reported, peaks exact, the lists replayed as CUDA graphs, none's losses"
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
rows = {r["policy"]: r for r in lines[1:]}
assert sorted(rows) == ["diffusers", "none"], sorted(rows)
for name, r in rows.items():
    assert r["device"] == "cuda" and r["latent"] == 4 and r["requested_latent"] == 8, name
    assert "does not fit" in r["fallback"] and "headroom" in r["fallback"], r["fallback"]
    page = 2 << 20
    assert r["fixed"] > 0 and r["predicted_total"] == -(-r["arena"] // page) * page + r["fixed"], name
    assert r["cuda_total"] > 0 and r["cuda_free_before"] > 0, name
    assert r["peak_match"] is True, name
    # the steps' lists captured as CUDA graphs and replayed, none op by op
    assert r["graph_captures"] > 0 and r["graph_launches"] >= r["graph_captures"], name
    assert r["graph_op_by_op"] == 0, name
assert rows["diffusers"]["same_losses_as_none"] is True
PY
else
  echo "(no libck_cuda_emu.so in ${CK_BUILD:-build}: the emulated-GPU run is left out)"
fi

# the full case's options with their defaults parse (a typo in --policies is
# the first thing it refuses, before any model is built)
"$CKRUN" --trust bench/gpu_step.lua --device cpu --case full --policies none,bogus > /dev/null 2> "$dir/full.txt"; rc=$?
[ $rc != 0 ] && grep -q "unknown checkpoint policy 'bogus'" "$dir/full.txt"
ok $? "--case full reads its default options, then refuses an unknown policy ($(head -1 "$dir/full.txt"))"

echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
