#!/usr/bin/env bash
# A Llama training step side by side with PyTorch (perf/torch_llama.py: the same model and
# FLOP formula; Debian's python3-torch, 2 threads, compare_torch.sh's tuned environment)
# against `lamina bench step inputs/bench-llama.toml`, in fp32 and in bf16 (PyTorch's
# autocast against lamina's train.precision = "bf16"), in rounds so that background load
# affects both alike. Prints each median and the ratios.
#   perf/compare_llama.sh [build-dir] [rounds]
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$here/build}
rounds=${2:-2}
args=(--layers 6 --d-model 384 --heads 6 --kv-heads 2 --ffn 1024 --seq 256 --batch 4 --vocab 8192 --threads 2
      --steps 10 --warmup 3)
tuned=(env MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=68719476736 OMP_WAIT_POLICY=PASSIVE OPENBLAS_THREAD_TIMEOUT=4)
field() { python3 -c "import json,sys; print(json.loads(sys.stdin.read().strip().splitlines()[-1])['$1'])"; }
lamina() { "$build/apps/lamina/lamina" bench step "$here/inputs/bench-llama.toml" --steps 10 --warmup 2 "$@" | tail -1; }
for r in $(seq "$rounds"); do
  t32=$("${tuned[@]}" /usr/bin/python3 "$here/perf/torch_llama.py" "${args[@]}" | field ms_per_step_median)
  l32=$(lamina | field step_ms_median)
  t16=$("${tuned[@]}" /usr/bin/python3 "$here/perf/torch_llama.py" "${args[@]}" --precision bf16 |
        field ms_per_step_median)
  l16=$(lamina --set train.precision=bf16 | field step_ms_median)
  python3 - "$r" "$t32" "$l32" "$t16" "$l16" <<'PY'
import sys
r, t32, l32, t16, l16 = sys.argv[1], *map(float, sys.argv[2:])
print(f"round {r}: Llama fp32 step: torch {t32:.0f} ms, lamina {l32:.0f} ms | lamina/torch {l32/t32:.3f}")
print(f"round {r}: Llama bf16 step: torch autocast {t16:.0f} ms, lamina {l16:.0f} ms | lamina/torch {l16/t16:.3f}, "
      f"lamina bf16/fp32 {l16/l32:.3f}")
PY
done
