#!/usr/bin/env bash
# bf16 training steps side by side with PyTorch's bf16 autocast (perf/torch_gpt.py
# --precision bf16, tuned environment as in compare_torch.sh), on the bench-torch model
# (6 layers, d 384, batch 4 x 256) and GPT-2 124M (batch 4 x 1024), in rounds so that
# background load affects all alike. With a second lamina build (e.g. one of an earlier
# commit) it is timed in the same rounds. For each lamina step it prints the median, the
# ratio to PyTorch and its non-product time: the step less the time its products would take
# at the bf16 GEMM rate `lamina bench step` measures beside it (step x (1 - gemm_fraction)).
#   perf/compare_bf16.sh [build-dir] [baseline-build-dir|-] [rounds]
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$here/build}
base=${2:--}
rounds=${3:-2}
tuned=(env MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=68719476736 OMP_WAIT_POLICY=PASSIVE OPENBLAS_THREAD_TIMEOUT=4)
field() { python3 -c "import json,sys; print(json.loads(sys.stdin.read().strip().splitlines()[-1])['$1'])"; }
lamina_step() {  # build deck steps warmup [--set ...]: "ms non_product_ms"
  local b=$1 deck=$2 steps=$3 warmup=$4
  shift 4
  "$b/apps/lamina/lamina" bench step "$deck" --steps "$steps" --warmup "$warmup" --set train.precision=bf16 "$@" |
    tail -1 | python3 -c "import json,sys; d=json.loads(sys.stdin.read()); \
print(d['step_ms_median'], d['step_ms_median'] * (1 - d['gemm_fraction']))"
}
models=(bench-torch gpt2-124m)
for r in $(seq "$rounds"); do
  for m in "${models[@]}"; do
    if [ "$m" = bench-torch ]; then
      targs=(--layers 6 --d-model 384 --heads 6 --seq 256 --batch 4 --vocab 8192 --steps 10 --warmup 3)
      largs=("$here/inputs/bench-torch.toml" 10 2)
    else
      targs=(--layers 12 --d-model 768 --heads 12 --seq 1024 --batch 4 --vocab 50257 --steps 3 --warmup 1)
      largs=("$here/inputs/gpt2-124m.toml" 3 1 --set data.batch_size=4 --set data.micro_batch_size=4)
    fi
    t=$("${tuned[@]}" /usr/bin/python3 "$here/perf/torch_gpt.py" "${targs[@]}" --threads 2 --precision bf16 |
        field ms_per_step_median)
    read -r l lnp < <(lamina_step "$build" "${largs[@]}")
    line="round $r, $m: torch bf16 autocast $(printf %.0f "$t") ms | lamina $(printf %.0f "$l") ms"
    line+=" ($(python3 -c "print(f'{$l/$t:.3f}')")x torch, non-product $(printf %.0f "$lnp") ms)"
    if [ "$base" != - ]; then
      read -r b bnp < <(lamina_step "$base" "${largs[@]}")
      line+=" | baseline $(printf %.0f "$b") ms ($(python3 -c "print(f'{$b/$t:.3f}')")x torch,"
      line+=" non-product $(printf %.0f "$bnp") ms; lamina/baseline non-product $(python3 -c "print(f'{$lnp/$bnp:.3f}')"))"
    fi
    echo "$line"
  done
done
