#!/usr/bin/env bash
# Side-by-side benchmarks against PyTorch. Training step: PyTorch (perf/torch_gpt.py: the
# same model and FLOP formula; Debian's python3-torch, 2 threads) out of the box and with
# its environment tuned, against `lamina bench step inputs/bench-torch.toml`, same model
# (6 layers, d 384, 6 heads, seq 256, batch 4, vocab 8192: 91.8 GFLOP/step), same
# OPENBLAS_* environment, in rounds so that background load affects all three alike; then
# the bf16 pair: PyTorch's bf16 autocast (tuned environment, `--precision bf16`) against
# lamina's `train.precision = "bf16"`, with lamina's bf16 step against its own fp32 one.
# AdamW: perf/torch_adamw.py (plain and tuned) against `lamina bench adam`, 10M
# parameters. Prints each median and the ratios. TORCH_GPT=<script> times another one.
#   perf/compare_torch.sh [build-dir] [rounds]
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$here/build}
rounds=${2:-2}
torch_py=${TORCH_GPT:-$here/perf/torch_gpt.py}
args=(--layers 6 --d-model 384 --heads 6 --seq 256 --batch 4 --vocab 8192 --threads 2 --steps 10 --warmup 3)
tuned=(env MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=68719476736 OMP_WAIT_POLICY=PASSIVE OPENBLAS_THREAD_TIMEOUT=4)
field() { python3 -c "import json,sys; print(json.loads(sys.stdin.read().strip().splitlines()[-1])['$1'])"; }
for r in $(seq "$rounds"); do
  t_plain=$(/usr/bin/python3 "$torch_py" "${args[@]}" | field ms_per_step_median)
  t_tuned=$("${tuned[@]}" /usr/bin/python3 "$torch_py" "${args[@]}" | field ms_per_step_median)
  l_json=$("$build/apps/lamina/lamina" bench step "$here/inputs/bench-torch.toml" --steps 10 --warmup 2 | tail -1)
  l_ms=$(echo "$l_json" | field step_ms_median)
  l_frac=$(echo "$l_json" | field gemm_fraction)
  t_bf16=$("${tuned[@]}" /usr/bin/python3 "$torch_py" "${args[@]}" --precision bf16 | field ms_per_step_median)
  l16_json=$("$build/apps/lamina/lamina" bench step "$here/inputs/bench-torch.toml" --steps 10 --warmup 2 \
             --set train.precision=bf16 | tail -1)
  a_plain=$(OMP_NUM_THREADS=2 /usr/bin/python3 "$here/perf/torch_adamw.py" --params 10000000 | field ms_per_million_params)
  a_tuned=$("${tuned[@]}" OMP_NUM_THREADS=2 /usr/bin/python3 "$here/perf/torch_adamw.py" --params 10000000 |
            field ms_per_million_params)
  a_json=$("$build/apps/lamina/lamina" bench adam --params 10000000 | tail -1)
  python3 - "$r" "$t_plain" "$t_tuned" "$l_ms" "$l_frac" "$a_plain" "$a_tuned" \
    "$(echo "$a_json" | field ms_per_million_params)" "$(echo "$a_json" | field bandwidth_fraction)" \
    "$t_bf16" "$(echo "$l16_json" | field step_ms_median)" "$(echo "$l16_json" | field gemm_fraction)" \
    "$(echo "$l16_json" | field tflops)" <<'PY'
import sys
r, plain, tuned, lam, frac, ap, at, al, bw, t16, l16, frac16, tf16 = sys.argv[1], *map(float, sys.argv[2:])
print(f"round {r}: step: torch {plain:.0f} ms, torch tuned {tuned:.0f} ms, lamina {lam:.0f} ms | "
      f"lamina/torch {lam/plain:.3f}, lamina/tuned {lam/tuned:.3f}, lamina GEMM fraction {frac:.3f}")
print(f"round {r}: bf16 step: torch autocast {t16:.0f} ms, lamina {l16:.0f} ms ({tf16:.3f} TFLOP/s) | "
      f"lamina/torch {l16/t16:.3f}, lamina bf16/fp32 {l16/lam:.3f}, lamina bf16 GEMM fraction {frac16:.3f}")
print(f"round {r}: AdamW ms per million parameters: torch {ap:.3f}, torch tuned {at:.3f}, lamina {al:.3f} | "
      f"lamina/tuned {al/at:.3f}, lamina bandwidth fraction {bw:.2f}")
PY
done
