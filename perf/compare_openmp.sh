#!/usr/bin/env bash
# The training step of a Kokkos Serial build and a Kokkos OpenMP build side by side, in
# rounds so that background load affects both alike: `lamina bench step
# inputs/bench-torch.toml` (6 layers, d 384, seq 256, batch 4, vocab 8192: 91.8 GFLOP),
# each build in the environment it gets by default, and the OpenMP build once more on one
# thread. Prints the median step and gemm_fraction (the step's GEMM FLOPs at the float GEMM
# rate measured in the same process, over the step time) of each.
#   perf/compare_openmp.sh SERIAL_BUILD_DIR OPENMP_BUILD_DIR [rounds]
set -euo pipefail
if [[ $# -lt 2 ]]; then
  echo "usage: $0 SERIAL_BUILD_DIR OPENMP_BUILD_DIR [rounds]" >&2
  exit 2
fi
here=$(cd "$(dirname "$0")/.." && pwd)
serial=$1/apps/lamina/lamina openmp=$2/apps/lamina/lamina rounds=${3:-2}
for b in "$serial" "$openmp"; do
  [[ -x $b ]] || { echo "$0: no lamina binary at $b" >&2; exit 2; }
done
"$openmp" --version | grep -q OpenMP || { echo "$0: $openmp is not an OpenMP build" >&2; exit 2; }
step() { "$@" bench step "$here/inputs/bench-torch.toml" --steps 10 --warmup 2 | tail -1; }
field() { python3 -c "import json,sys; print(json.loads(sys.argv[1])['$1'])" "$2"; }
for r in $(seq "$rounds"); do
  for run in serial openmp openmp1; do
    case $run in
      serial) j=$(step "$serial") ;;
      openmp) j=$(step "$openmp") ;;
      openmp1) j=$(OMP_NUM_THREADS=1 step "$openmp") ;;
    esac
    printf 'round %s: %-8s %7.1f ms/step, gemm_fraction %.3f\n' "$r" "$run" \
      "$(field step_ms_median "$j")" "$(field gemm_fraction "$j")"
  done
done
