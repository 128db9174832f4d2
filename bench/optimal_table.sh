#!/bin/sh
# The budget search's recompute against the exact solver's (--checkpoint
# optimal, CBC) at 90/80/70/62/55% of none's peak, on sdxl-tiny 256 px and
# sdxl-mid 1024 px (plan only), with the joint search's predicted step time
# on an H100's figures beside the optimum's: the table of BENCHMARKS.md's
# "Recompute against the optimum (issue 31)". The solver's decision lines go
# to stderr.
#   bench/optimal_table.sh [build dir] [seconds per budget]
set -e
BUILD=${1:-build}
SECONDS_PER=${2:-60}
cd "$(dirname "$0")/.."
echo "solver: CBC $(dpkg-query -W -f '${Version}' coinor-libcbc3 2>/dev/null || echo '?'), $(date -u +%Y-%m-%d), $(nproc) cores"
export OMP_NUM_THREADS=1
for size in tiny mid; do
  "$BUILD/ckrun" bench/optimal_table.lua --size "$size" --optimal-seconds "$SECONDS_PER" --gpu H100 --marks
  echo
done
