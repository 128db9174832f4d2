#!/usr/bin/env bash
# The CUDA backend on a GPU machine (an H200 in mind), in one run of under
# 8 minutes:
#   1. build with the CUDA backend (and time the CUDA compile);
#   2. run the GPU tests: test_cuda_table, test_cuda_ops (every op forward and
#      backward against the CPU kernels, device-size shapes included), the
#      emulator test, and tests/device/test_device.lua (20 steps of sdxl-tiny
#      against the CPU's losses, recompute policies bitwise equal to none,
#      predicted peaks equal to the device arena's measured ones, bf16
#      storage), data parallel through NCCL as one rank (mpirun -np 1,
#      tests/lua/mpi_nccl.lua with CK_COMM_FORCE=1), test_cuda_graph and
#      tests/device/test_graph.lua (CUDA graph replay bitwise equal to op by
#      op); a skipped GPU test is a failure here;
#   3. time the UNet's heaviest ops at sdxl-tiny 64x64 and full SDXL 1024x1024
#      shapes (build/bench_cuda_ops), and the same ops in PyTorch when python3
#      has torch with CUDA (bench/cuda_ops_torch.py), as one table;
#   4. the whole run's device memory: full SDXL LoRA at 1024 logging every
#      step, validating and saving, cudaMemGetInfo before the program, at each
#      logged step and at the end against the plan (out/gpu_check/whole_run.md);
#   5. mixed precision against PyTorch (bench/results/gpu_check.json): full
#      SDXL at 1024x1024, ckrun --mixed-precision bf16 against PyTorch's bf16
#      autocast with SDPA and torch.utils.checkpoint: LoRA rank 16 at batch 1
#      and 4 under none and diffusers, full fine-tuning with 8-bit AdamW and
#      fused updates, and torch.compile's step when time is left after
#      step 6 (speed.md);
#   6. time a training step, LoRA rank 4 on to_q/to_k/to_v/to_out.0 of a frozen
#      base, AdamW, fp32, batch 1: sdxl-tiny at 64x64 latents and full SDXL at
#      1024x1024 pixels (128x128 latents; 512x512 when none's plan does not fit
#      the free device memory, said in the table), under the policies none,
#      diffusers and budget at 62% of none's peak (90% for sdxl-tiny, whose
#      smallest plan is 84% of none's) (bench/gpu_step.lua); the same
#      steps in PyTorch, none and torch.utils.checkpoint around diffusers'
#      blocks (bench/gpu_step_torch.py; budget has no PyTorch counterpart); and
#      ckrun's predicted device peak against the arena's measured high-water
#      mark and against cudaMemGetInfo before and after; as one table
#      (out/gpu_check/steps.md). A policy that fails or runs out of time, or a
#      measured arena peak that differs from the plan, fails the script once
#      the table is written.
#   7. offload, when time is left (else run alone: bash bench/gpu_offload.sh):
#      what --checkpoint auto:CARD --offload auto chooses for full SDXL LoRA
#      1024 on cards of 8, 12, 16 and 24 GiB, for flux-tiny, for the full SDXL
#      UNet trained whole (24 and 16 GiB) and, as time allows, FLUX.1-dev's
#      LoRA over an fp8 base (24, 16, 12 GiB), planned and run: planned
#      device bytes against those the run holds, predicted step time against
#      the measured one (out/gpu_check/offload.md).
#
#   bash bench/gpu_check.sh            # writes out/gpu_check/*
#   bash bench/gpu_check.sh --tests    # the build and the GPU tests only (about 2 minutes)
#   GPU_CHECK_SECONDS=470              # the time budget step 4 keeps to (from the start)
#
# On a machine without Lua 5.4 or OpenBLAS and no package registry, it builds
# against the Debian packages in .gpu_deps/ (made by bench/gpu_deps.sh where
# apt works), unpacked into a private prefix. cuDNN comes from the CUDA
# toolkit's folder or the system's, else from python3's nvidia-cudnn wheel.
# When $OUT names a folder (the device tool's), the results are also left
# there: gpu_check.tar.gz (all of out/gpu_check), steps.md and cuda_ops.md.
# From the development machine, with the device tool:
#
#   bash bench/gpu_deps.sh
#   run: command "bash bench/gpu_check.sh", carry [".gpu_deps"], timeout_s 580
#
# Not measured here: bf16 storage's step times on the GPU (test_device checks
# that it runs and follows the CPU), batches above 1, data loading, and the
# variance of the step times across runs (one run of a few steps per policy).
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
out=out/gpu_check
mkdir -p "$out"

die() {
    echo "gpu_check: FAILED: $*" >&2
    exit 1
}

# ---- a GPU, or stop here
command -v nvidia-smi >/dev/null || die "nvidia-smi not found: this script needs an NVIDIA GPU and its driver"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$out/gpu.txt" 2>&1 ||
    die "nvidia-smi sees no GPU: $(cat "$out/gpu.txt")"
[ -s "$out/gpu.txt" ] || die "nvidia-smi lists no GPU"
echo "GPU: $(head -1 "$out/gpu.txt")"
export CK_GPU_NAME="$(head -1 "$out/gpu.txt" | cut -d, -f1)"
[ -x /usr/local/cuda/bin/nvcc ] || command -v nvcc >/dev/null || die "no nvcc (CUDA toolkit) found"

# the results, also where the device tool collects them (at most 8 files)
leave_results() {
    [ -n "${OUT:-}" ] && [ -d "$OUT" ] || return 0
    # the logs and tables, each under 2 MiB, so that the archive comes back (the tool takes 16 MiB a file)
    (cd out && find gpu_check -type f -size -2M \( -name '*.txt' -o -name '*.md' -o -name '*.json' -o -name '*.jsonl' \) |
        tar czf "$OUT/gpu_check.tar.gz" -T -) 2>/dev/null || true
    for f in steps.md speed.md cuda_ops.md whole_run.md offload.md; do [ ! -f "$out/$f" ] || cp "$out/$f" "$OUT/"; done
}
trap leave_results EXIT

# ---- what the build needs: Lua 5.4, OpenBLAS and jansson from the system, else from
# the packages carried in .gpu_deps/ (bench/gpu_deps.sh), unpacked privately
cmake_args=()
arch=$(gcc -dumpmachine 2>/dev/null || echo x86_64-linux-gnu)
arch=${arch/-pc-/-}
if [ ! -f /usr/include/lua5.4/lua.h ] || [ ! -e "/usr/lib/$arch/openblas-openmp/libopenblas.so" ] ||
    [ ! -f /usr/include/jansson.h ] || [ ! -f /usr/include/sentencepiece_processor.h ] || [ ! -f /usr/include/toml++/toml.h ] ||
    [ ! -f /usr/include/unicode/uchar.h ] || [ ! -f /usr/include/zlib.h ] || [ ! -f /usr/include/png.h ] ||
    [ ! -f /usr/include/jpeglib.h ] || [ ! -f /usr/include/webp/decode.h ]; then
    compgen -G ".gpu_deps/*.deb" >/dev/null ||
        die "Lua 5.4, OpenBLAS (OpenMP), jansson, libsentencepiece or toml++ is missing here and .gpu_deps/ holds no packages: run bash bench/gpu_deps.sh where apt works and carry .gpu_deps"
    deps=/tmp/ck_gpu_deps
    rm -rf "$deps"
    mkdir -p "$deps"
    for f in .gpu_deps/*.deb; do
        if command -v dpkg-deb >/dev/null; then
            dpkg-deb -x "$f" "$deps"
        else # a .deb is an ar archive around data.tar.*
            member=$(ar t "$f" | grep '^data\.tar')
            ar p "$f" "$member" > "$deps/$member" && tar -x -C "$deps" -f "$deps/$member" && rm "$deps/$member"
        fi || die "unpacking $f"
    done
    cmake_args+=("-DCK_DEPS_ROOT=$deps")
    export LD_LIBRARY_PATH="$deps/usr/lib/$arch:$deps/usr/lib/$arch/openblas-openmp${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    echo "build dependencies: from .gpu_deps ($(ls .gpu_deps/*.deb | wc -l) packages, unpacked in $deps)"
fi
if ! compgen -G "/usr/local/cuda/include/cudnn.h" >/dev/null && ! compgen -G "/usr/include/cudnn.h" >/dev/null &&
    ! compgen -G "/usr/include/$arch/cudnn.h" >/dev/null; then
    wheel=$(python3 -c 'import nvidia.cudnn as m; print(list(m.__path__)[0])' 2>/dev/null || true)
    lib=$(compgen -G "$wheel/lib/libcudnn.so*" | sort | head -1 || true)
    [ -n "$wheel" ] && [ -f "$wheel/include/cudnn.h" ] && [ -n "$lib" ] ||
        die "no cuDNN: neither /usr/local/cuda, /usr/include nor python3's nvidia-cudnn wheel holds cudnn.h"
    cmake_args+=("-DCUDNN_INCLUDE_DIR=$wheel/include" "-DCUDNN_LIBRARY=$lib")
    export LD_LIBRARY_PATH="$wheel/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    echo "cuDNN: from python3's wheel ($lib)"
fi

# ---- build
jobs=$(nproc)
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release "${cmake_args[@]}" > "$out/configure.txt" 2>&1 ||
    die "cmake configure (see $out/configure.txt): $(grep -m1 -A2 'CMake Error' "$out/configure.txt" | tr '\n' ' ')"
grep -q "CUDA backend: on" "$out/configure.txt" || die "CMake did not enable the CUDA backend: $(grep 'CUDA backend' "$out/configure.txt")"
t0=$(date +%s.%N)
cmake --build build -j "$jobs" --target ck_cuda > "$out/build_cuda.txt" 2>&1 || die "building ck_cuda (see $out/build_cuda.txt)"
t1=$(date +%s.%N)
cmake --build build -j "$jobs" > "$out/build.txt" 2>&1 || die "build (see $out/build.txt)"
cmake --build build -j "$jobs" --target bench_cuda_ops >> "$out/build.txt" 2>&1 || die "building bench_cuda_ops"
# the library path the build runs with, for bench/gpu_offload.sh run alone later
echo "${LD_LIBRARY_PATH:-}" > "$out/ld_library_path.txt"
awk -v a="$t0" -v b="$t1" -v j="$jobs" 'BEGIN { printf "CUDA backend compile (ck_cuda, %s jobs): %.1f s\n", j, b - a }'
# --build-only: stop here (a further command on the machine then runs build/ckrun
# with LD_LIBRARY_PATH as printed)
if [ "${1:-}" = --build-only ]; then
    echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
    exit 0
fi

# A failing test or part is noted and the script goes on, so that one run on
# a GPU brings back every figure it can; it exits non-zero at the end when
# anything failed. Only a machine or a build it cannot use stops it at once.
failures=""
fail() {
    failures="$failures
  $*"
    echo "gpu_check: FAIL: $*" >&2
}

# ---- GPU tests: a skip means no device was usable, which is a failure here
(cd build && timeout 60 ./test_cuda_table) > "$out/test_cuda_table.txt" 2>&1 || fail "test_cuda_table (see $out/test_cuda_table.txt)"
# gpu_test NAME SECONDS COMMAND...: runs a test (from the repository root) into
# $out/NAME.txt; a skip (exit 77), a timeout or a failure is a failure
gpu_test() {
    local name=$1 secs=$2 rc
    shift 2
    set +e
    OMP_NUM_THREADS=$jobs timeout -k 10 "$secs" "$@" > "$out/$name.txt" 2>&1
    rc=$?
    set -e
    grep -E "^(FAIL|SKIP)" "$out/$name.txt" || true
    if [ $rc -eq 77 ]; then
        fail "$name skipped: $(tail -1 "$out/$name.txt")"
    elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
        fail "$name stopped after its $secs s (see $out/$name.txt)"
    elif [ $rc -ne 0 ]; then
        fail "$name exit $rc (see $out/$name.txt)"
    fi
    echo "$name: $(grep -E 'passed, [0-9]+ failed' "$out/$name.txt" | tail -1)"
}
gpu_test test_cuda_ops 150 build/test_cuda_ops
gpu_test test_cuda_ops_emu 60 build/test_cuda_ops_emu
# the executor on the GPU: sdxl-tiny's loss curve against the CPU's, recompute
# bitwise, exact device peaks, host I/O, logging, the guard, bf16 storage
gpu_test test_device 180 build/ckrun --trust tests/device/test_device.lua
# data parallel through NCCL, as one rank: CK_COMM_FORCE=1 gives a world of one
# the buckets' sums, each an ncclAllReduce on the communication stream
# (tests/lua/mpi_nccl.lua: 3 steps of a small conv net, against the same
# program without data parallel); under mpirun -np 1 where there is one
nccl_run=(build/ckrun tests/lua/mpi_nccl.lua)
if command -v mpirun >/dev/null; then
    nccl_run=(mpirun -np 1 "${nccl_run[@]}")
else
    echo "nccl_one_rank: no mpirun here, run as a lone process"
fi
gpu_test nccl_one_rank 60 env CK_COMM_FORCE=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "${nccl_run[@]}"
grep '^nccl: ' "$out/nccl_one_rank.txt" || true
# graph replay: single ops captured against eager launches, and training
# programs replayed as graphs bitwise equal to op by op
gpu_test test_cuda_graph 60 build/test_cuda_graph
gpu_test test_graph 120 build/ckrun --trust tests/device/test_graph.lua
# --tests: the build and the GPU tests above only (about 2 minutes), for a
# check after a fix when the device time left is short
if [ "${1:-}" = --tests ]; then
    echo "gpu_check: the GPU tests done in $(( $(date +%s) - start )) s"
    [ -z "$failures" ] || die "$(echo "$failures" | grep -c .) failures:$failures"
    exit 0
fi

# ---- the time budget: each part below runs within what is left of it
deadline=$(( start + ${GPU_CHECK_SECONDS:-470} ))
# seconds a part may run: at most $1, and leaving $2 seconds before the deadline
limit() {
    local l=$(( deadline - $(date +%s) - $2 ))
    [ "$l" -le "$1" ] || l=$1
    [ "$l" -ge 0 ] || l=0
    echo "$l"
}
# run_part NAME SECONDS COMMAND...: stdout to $out/NAME.jsonl, stderr to $out/NAME.txt
run_part() {
    local name=$1 secs=$2 rc=0
    shift 2
    : > "$out/$name.jsonl"
    if [ "$secs" -lt 20 ]; then
        fail "$name: not run: ${secs} s left of the ${GPU_CHECK_SECONDS:-470} s budget"
        return 0
    fi
    local t0
    t0=$(date +%s)
    timeout -k 10 "$secs" "$@" > "$out/$name.jsonl" 2> "$out/$name.txt" || rc=$?
    if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
        fail "$name: stopped after its $secs s (see $out/$name.txt)"
    elif [ $rc -ne 0 ]; then
        fail "$name: exit $rc: $(tail -1 "$out/$name.txt") (see $out/$name.txt)"
    fi
    echo "$name: $(grep -c '"policy"' "$out/$name.jsonl" || true) results in $(( $(date +%s) - t0 )) s"
}
torch_cuda=0
if python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    torch_cuda=1
fi

# ---- mixed precision against PyTorch: full SDXL at 1024x1024 in bf16, ckrun's
# --mixed-precision bf16 against PyTorch's bf16 autocast with SDPA and
# torch.utils.checkpoint; LoRA rank 16 at batch 1 and 4 under none and
# diffusers, and full fine-tuning with 8-bit AdamW and fused updates (PyTorch:
# bitsandbytes' AdamW8bit, else fused AdamW); torch.compile's step time for the
# batch-1 LoRA row (after the fp32 steps below) when it compiles within 3
# minutes and time is left. The
# pairs go to bench/results/gpu_check.json (ckrun_ms, torch_ms, peaks, date,
# device) and out/gpu_check/speed.md.
speed_rows() {
    local common="build/ckrun --trust bench/gpu_step.lua --case full --latent 128 --fallback none --mixed-precision bf16 --warmup 1 --steps 3"
    run_part speed_lora_b1 "$(limit 75 240)" $common --rank 16 --batch 1 --policies none,diffusers
    run_part speed_lora_b4 "$(limit 90 200)" $common --rank 16 --batch 4 --policies none,diffusers
    run_part speed_full "$(limit 90 160)" $common --lora false --optimizer adamw8bit --fused-backward true \
        --batch 1 --policies diffusers
    cat "$out"/speed_lora_b1.jsonl "$out"/speed_lora_b4.jsonl "$out"/speed_full.jsonl > "$out/speed_ckrun.jsonl"
    grep -q '"peak_match": false' "$out/speed_ckrun.jsonl" &&
        fail "ckrun bf16: a measured arena high-water mark differs from the planned peak (see $out/speed_ckrun.jsonl)"
    local files=("$out/speed_ckrun.jsonl")
    if [ $torch_cuda -eq 1 ]; then
        run_part speed_torch "$(limit 150 120)" python3 bench/gpu_step_torch.py "$out/speed_ckrun.jsonl"
        files+=("$out/speed_torch.jsonl")
    fi
    speed_table "${files[@]}"
}
# the mixed-precision table from the files given (bench/results/gpu_check.json, speed.md)
speed_table() {
    mkdir -p bench/results
    python3 bench/gpu_step_torch.py --results bench/results/gpu_check.json "$@" | tee "$out/speed.md" ||
        fail "bench/results/gpu_check.json (bench/gpu_step_torch.py --results)"
    { echo; python3 bench/gpu_step_torch.py --table "$@"; } >> "$out/speed.md" || true
}
speed_rows

# ---- the whole run's device memory: full SDXL LoRA at 1024, logging every
# step (grad norms and block statistics), validating, saving a state; the
# device memory in use (cudaMemGetInfo) before the program, at every logged
# step and at the end, against the plan's device_bytes (out/gpu_check/whole_run.md)
whole_run() {
    local w=$out/whole_run args="scripts/train_sdxl_lora.lua --size full --steps 3 --log-every 1 --val-every 2 --save-every 2"
    rm -rf "$w"
    mkdir -p "$w"
    build/ckrun --device cuda --plan --json $args > "$w/plan.json" 2> "$w/plan.txt" || { fail "whole run: --plan (see $w/plan.txt)"; return; }
    OMP_NUM_THREADS=$jobs timeout -k 10 "$1" build/ckrun --device cuda --allow-write "$w" $args --state-dir "$w/state" \
        --log-dir "$w/log" --out "$w/lora.safetensors" > "$w/run.txt" 2>&1 || { fail "whole run: exit $? (see $w/run.txt)"; return; }
    python3 - "$w" "$out/gpu.txt" <<'EOF2' | tee "$out/whole_run.md" || fail "whole run: the device memory differs from the plan (see $out/whole_run.md)"
import json, re, sys
w = sys.argv[1]
plan = json.load(open(w + "/plan.json"))
total = plan["policies"][0]["device_bytes"]
# the backend's fixed bytes are taken when it opens, before the start is read
want = total - plan["device_fixed_bytes"]
recs = [json.loads(l) for l in open(w + "/log/metrics.jsonl")]
mem = [(r["step"], r["memory"]) for r in recs if "memory" in r]
run = open(w + "/run.txt").read()
m = re.search(r"memory: peak RSS ([0-9.]+) MiB; the device's plan ([0-9.]+) MiB, in use ([0-9.]+) MiB more than "
              r"before the program \(([0-9.]+) MiB at the start\)", run)
mib = 2 ** 20
print("| full SDXL LoRA 1024, fp32, batch 1 | MiB |")
print("|---|---:|")
print(f"| plan: device_bytes (arena in pages + fixed) | {total / mib:.1f} |")
print(f"| plan: the arena in pages (what the program adds to the start) | {want / mib:.1f} |")
print(f"| plan: arena (training, validation and logging lists) | {plan.get('arena_bytes', 0) / mib:.1f} |")
if m:
    print(f"| device in use at the start (CUDA context and libraries) | {float(m.group(4)):.1f} |")
start = float(m.group(4)) * mib if m else None
# The plan holds the arena; the libraries' own memory (kernels loaded at first
# use, cuDNN's and cuBLASLt's, graphs instantiated) is outside it (--plan's
# cuda_context row), left to the fit's headroom (--fit-headroom, 10% of the
# free memory at the start). Fails when the arena's pages are not all in use,
# or when what is outside them passes that headroom.
card = re.search(r",\s*([0-9]+) MiB", open(sys.argv[2]).read())
used = [(f"step {step}", mm["device_used"] - start) for step, mm in mem if "device_used" in mm and start is not None]
if m: used.append(("end (after the last save)", float(m.group(3)) * mib))
for what, d in used:
    print(f"| {what}: in use above the start (outside the arena) | {d / mib:.1f} ({(d - want) / mib:+.1f}) |")
if m:
    print(f"| process peak RSS | {float(m.group(1)):.1f} |")
lt = re.search(r"loaded .* in ([0-9.]+) s", run)
if lt: print(f"| time to load the weights | {lt.group(1)} s |")
print()
ok = bool(used)
if used:
    low = min(d for _, d in used) - want; high = max(d for _, d in used) - want
    room = 0.1 * (int(card.group(1)) * mib - start) if card else 0
    print(f"outside the arena: {low / mib:.1f} to {high / mib:.1f} MiB (the libraries' own memory, not planned)")
    if low < -mib:
        ok = False; print("FAILS: less in use than the arena's planned pages")
    if high > room:
        ok = False; print(f"FAILS: more than the fit's 10% headroom ({room / mib:.0f} MiB) outside the arena")
else:
    print("FAILS: no device memory figures in the run's log")
sys.exit(0 if ok else 1)
EOF2
}
whole_run "$(limit 150 80)"

# ---- per-op timings, ckrun and PyTorch
timeout -k 10 120 build/bench_cuda_ops --reps 20 > "$out/cuda_ops.jsonl" 2> "$out/cuda_ops.txt" ||
    fail "bench_cuda_ops (see $out/cuda_ops.txt and the error fields of $out/cuda_ops.jsonl)"
if [ $torch_cuda -eq 1 ]; then
    timeout -k 10 120 python3 bench/cuda_ops_torch.py "$out/cuda_ops.jsonl" --reps 20 | tee "$out/cuda_ops.md" ||
        fail "bench/cuda_ops_torch.py"
else
    echo "(python3 has no torch with CUDA: ckrun's timings only)"
    python3 - "$out/cuda_ops.jsonl" <<'EOF' | tee "$out/cuda_ops.md"
import json, sys
print("| scale | op | shapes | ckrun ms | ckrun TFLOP/s |")
print("|---|---|---|---:|---:|")
for line in open(sys.argv[1]):
    r = json.loads(line)
    tf = r["flops"] / (r["ms"] * 1e9) if r["ms"] > 0 else float("nan")
    print(f"| {r['scale']} | {r['op']} | {r['label']} | {r['ms']:.3f} | {tf:.1f} |")
EOF
fi

# ---- training steps, ckrun and PyTorch, within the time left
# sdxl-tiny's smallest plan on CUDA is 84% of none's peak (diffusers': the
# recompute it can save is small beside the weights), so its budget row is 90%
run_part step_tiny "$(limit 60 100)" build/ckrun --trust bench/gpu_step.lua --case tiny --warmup 3 --steps 10 \
    --policies none,diffusers,budget:90%
run_part step_full "$(limit 240 60)" build/ckrun --trust bench/gpu_step.lua --case full --warmup 1 --steps 3
cat "$out/step_tiny.jsonl" "$out/step_full.jsonl" > "$out/steps_ckrun.jsonl"
if grep -q '"peak_match": false' "$out/steps_ckrun.jsonl"; then
    fail "ckrun: a measured arena high-water mark differs from the planned peak (see $out/steps_ckrun.jsonl)"
fi
tables=("$out/steps_ckrun.jsonl")
if [ $torch_cuda -eq 1 ] && [ ! -s "$out/steps_ckrun.jsonl" ]; then
    echo "steps_torch: not run (ckrun measured no step to compare with)"
    rm -f "$out/steps_torch.jsonl" "$out/steps_torch.txt"
elif [ $torch_cuda -eq 1 ]; then
    run_part steps_torch "$(limit 150 5)" python3 bench/gpu_step_torch.py "$out/steps_ckrun.jsonl"
    tables+=("$out/steps_torch.jsonl")
else
    echo "(python3 has no torch with CUDA: ckrun's training steps only)"
    rm -f "$out/steps_torch.jsonl" "$out/steps_torch.txt"
fi
echo
{
    echo "Training step, fp32, batch 1, on $(head -1 "$out/gpu.txt"); $(build/ckrun --version | head -1)"
    echo
    python3 bench/gpu_step_torch.py --table "${tables[@]}"
} | tee "$out/steps.md" || fail "the training-step table (bench/gpu_step_torch.py --table)"

# ---- torch.compile's step for the bf16 batch-1 LoRA row, after the fp32
# steps (it can take minutes to compile), added to the mixed-precision table
if [ $torch_cuda -eq 1 ] && [ -s "$out/speed_lora_b1.jsonl" ] && [ "$(limit 180 100)" -ge 60 ]; then
    run_part speed_torch_compile "$(limit 180 100)" python3 bench/gpu_step_torch.py --compile --policy none \
        "$out/speed_lora_b1.jsonl"
    speed_table "$out/speed_ckrun.jsonl" "$out/speed_torch.jsonl" "$out/speed_torch_compile.jsonl"
else
    echo "torch.compile: not run (no torch with CUDA, no bf16 row, or too little of the time budget left)"
fi

# ---- offload planned and run (bench/gpu_offload.sh), in what is left
left=$(limit 600 0)
if [ "$left" -ge 90 ]; then
    GPU_OFFLOAD_SECONDS=$(( left - 60 )) timeout -k 10 "$left" bash bench/gpu_offload.sh cuda 4 ||
        fail "offload: bench/gpu_offload.sh (see $out/offload.md and $out/offload.jsonl)"
else
    echo "offload: not run (${left} s left; run bash bench/gpu_offload.sh alone)"
fi

echo
echo "gpu_check: done in $(( $(date +%s) - start )) s; results in $out/"
[ -z "$failures" ] || die "$(echo "$failures" | grep -c .) failures:$failures"
