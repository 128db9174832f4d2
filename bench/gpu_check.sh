#!/usr/bin/env bash
# The CUDA backend on a GPU machine (an H200 in mind), in one run of under
# 8 minutes:
#   1. build with the CUDA backend (and time the CUDA compile);
#   2. run the GPU tests: test_cuda_table, test_cuda_ops (every op forward and
#      backward against the CPU kernels, device-size shapes included) and the
#      emulator test; a skipped GPU test is a failure here;
#   3. time the UNet's heaviest ops at sdxl-tiny 64x64 and full SDXL 1024x1024
#      shapes (build/bench_cuda_ops), and the same ops in PyTorch when python3
#      has torch with CUDA (bench/cuda_ops_torch.py), as one table.
#
#   bash bench/gpu_check.sh            # writes out/gpu_check/*
#
# Not measured here, because it needs the executor on the CUDA backend
# (vm/exec.c, vm/program.c, vm/lua_ck.c; see the seam proposed with ops/cuda):
#   - a training step of sdxl-tiny 64x64 and of full SDXL LoRA 1024x1024 under
#     the policies none, diffusers and budget at 62% of none's peak, against
#     PyTorch with torch.utils.checkpoint;
#   - the predicted against the measured device peak (the arena as one
#     cudaMalloc; cudaMemGetInfo before and after);
#   - the 20-step sdxl-tiny loss curve against the CPU's, and recompute
#     policies giving bitwise the same GPU gradients as none.
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
[ -x /usr/local/cuda/bin/nvcc ] || command -v nvcc >/dev/null || die "no nvcc (CUDA toolkit) found"

# ---- build
jobs=$(nproc)
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release > "$out/configure.txt" 2>&1 || die "cmake configure (see $out/configure.txt)"
grep -q "CUDA backend: on" "$out/configure.txt" || die "CMake did not enable the CUDA backend: $(grep 'CUDA backend' "$out/configure.txt")"
t0=$(date +%s.%N)
cmake --build build -j "$jobs" --target ck_cuda > "$out/build_cuda.txt" 2>&1 || die "building ck_cuda (see $out/build_cuda.txt)"
t1=$(date +%s.%N)
cmake --build build -j "$jobs" > "$out/build.txt" 2>&1 || die "build (see $out/build.txt)"
cmake --build build -j "$jobs" --target bench_cuda_ops >> "$out/build.txt" 2>&1 || die "building bench_cuda_ops"
awk -v a="$t0" -v b="$t1" -v j="$jobs" 'BEGIN { printf "CUDA backend compile (ck_cuda, %s jobs): %.1f s\n", j, b - a }'

# ---- GPU tests: a skip means no device was usable, which is a failure here
(cd build && timeout 300 ./test_cuda_table) > "$out/test_cuda_table.txt" 2>&1 || die "test_cuda_table (see $out/test_cuda_table.txt)"
set +e
(cd build && OMP_NUM_THREADS=$jobs timeout 300 ./test_cuda_ops) > "$out/test_cuda_ops.txt" 2>&1
rc=$?
set -e
grep -E "^(FAIL|SKIP)" "$out/test_cuda_ops.txt" || true
[ $rc -ne 77 ] || die "test_cuda_ops skipped: $(tail -1 "$out/test_cuda_ops.txt")"
[ $rc -eq 0 ] || die "test_cuda_ops exit $rc (see $out/test_cuda_ops.txt)"
echo "test_cuda_ops: $(tail -1 "$out/test_cuda_ops.txt")"
(cd build && timeout 120 ./test_cuda_ops_emu) > "$out/test_cuda_ops_emu.txt" 2>&1 || die "test_cuda_ops_emu (see $out/test_cuda_ops_emu.txt)"
echo "test_cuda_ops_emu: $(tail -1 "$out/test_cuda_ops_emu.txt")"

# ---- per-op timings, ckrun and PyTorch
timeout 240 build/bench_cuda_ops --reps 20 > "$out/cuda_ops.jsonl" || die "bench_cuda_ops (see $out/cuda_ops.jsonl)"
if python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    timeout 240 python3 bench/cuda_ops_torch.py "$out/cuda_ops.jsonl" --reps 20 | tee "$out/cuda_ops.md" ||
        die "bench/cuda_ops_torch.py"
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

echo
echo "Not measured (needs the executor on the CUDA backend): training step time per policy"
echo "(none, diffusers, budget 62%) against PyTorch + torch.utils.checkpoint, predicted vs measured"
echo "device peak, the 20-step loss curve against the CPU, recompute bitwise on the GPU."
echo "gpu_check: done in $(( $(date +%s) - start )) s; results in $out/"
