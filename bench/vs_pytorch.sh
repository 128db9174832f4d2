#!/usr/bin/env bash
# ckrun against PyTorch on the sdxl-tiny training step (issue 8): the same
# shapes, objective (epsilon, MSE), backward and AdamW step, run alternately in
# one invocation at the same thread count; median step times and bytes held for
# backward for full training and LoRA, without and with diffusers-style
# checkpointing. See bench/vs_pytorch.py.
#
#   bash bench/vs_pytorch.sh                 the table (THREADS=2 WARMUP=2 STEPS=7)
#   bash bench/vs_pytorch.sh --kernels       the step's kernels at its shapes, 1 and 2 threads
#
# PyTorch comes from Debian (python3-torch), installed with apt-get when
# /usr/bin/python3 cannot import it; a python3 earlier on PATH is not used.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=/usr/bin/python3
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build --target ckrun ck_static -j "$(nproc)" >/dev/null

if [ "${1:-}" = "--kernels" ]; then
  # the OpenMP build of OpenBLAS, also at run time (the system default may be the pthread one)
  blas=$(dirname "$(sed -n 's/^OPENBLAS_LIB:FILEPATH=//p' build/CMakeCache.txt)")
  cc -O3 -march=native -fopenmp -Iops -I"$(sed -n 's/^CBLAS_INCLUDE:PATH=//p' build/CMakeCache.txt)" \
     bench/vs_pytorch.c build/libck.a -L"$blas" -Wl,-rpath,"$blas" -lopenblas -llua5.4 -lm \
     -o build/vs_pytorch_kernels
  for t in 1 2; do OMP_NUM_THREADS=$t OMP_WAIT_POLICY=PASSIVE build/vs_pytorch_kernels "${2:-}"; echo; done
  exit 0
fi

if ! "$PY" -c "import torch" 2>/dev/null; then
  echo "installing python3-torch (Debian) ..." >&2
  apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-torch >/dev/null
fi
# PyTorch gets one threading layer too: Debian's torch reaches BLAS through the
# libblas.so.3 alternative, often OpenBLAS's pthread build, whose own threads
# then fight torch's OpenMP threads; TORCH_BLAS=system keeps the system's choice.
blas=$(dirname "$(sed -n 's/^OPENBLAS_LIB:FILEPATH=//p' build/CMakeCache.txt)")
[ "${TORCH_BLAS:-openmp}" = system ] || export LD_LIBRARY_PATH="$blas${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
echo "machine: $(nproc) cores ($(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)), load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "PyTorch $("$PY" -c 'import torch; print(torch.__version__)') (BLAS: $("$PY" -c 'import torch, os, re; print(re.search(r"\S*libopenblas\S*|\S*libblas\S*", open("/proc/self/maps").read()).group(0))' 2>/dev/null || echo '?')), $(build/ckrun --version | head -1), $(date -u +%F)"
OMP_WAIT_POLICY=PASSIVE "$PY" bench/vs_pytorch.py --ckrun build/ckrun --threads "${THREADS:-2}" \
  --warmup "${WARMUP:-2}" --steps "${STEPS:-7}" --check "$@"
