#!/usr/bin/env bash
# What to run on a GPU node after installing lamina's dependencies (e.g. `spack install
# lamina +cuda`, or a Kokkos + Kokkos Kernels CUDA install): builds lamina against the
# Kokkos found in CMAKE_PREFIX_PATH, runs the unit and MPI suites, `lamina verify` on
# every reference file with each way attention runs, the step (also with the attention path
# that is not the default; PyTorch's beside it where python3 has torch) and the bf16 step's
# time per kernel, 50 steps on text resumed from step 25 in fp32 and bf16 (the losses must
# repeat), the memory estimate against what was allocated (and on a GPU what the device
# reports) under each memory policy, AdamW and Deep Optimizer States benchmarks, and prints
# one summary. Works the same on a CPU-only Kokkos, which is how CI-less changes to this
# script are checked.
#
#   CMAKE_PREFIX_PATH=/opt/kokkos-cuda scripts/gpu-check.sh [build dir] [extra cmake args]
#
# GPU_CHECK_SECONDS=N gives the whole check N seconds of wall time (a GPU lent for minutes):
# steps run in the order that matters most, correctness first (lamina, verify, the two steps'
# speed, the suites), each stopped when the time is up, and the steps left are reported as
# skipped. The test suites then compile (on all but four cores) while lamina's own steps run:
# on a 16-core GPU node their build takes about four minutes, which a lease of fifteen cannot
# spend idle; the step timings taken beside it say so in the summary.
#
# The C++ compiler is Kokkos' nvcc_wrapper when the Kokkos found is a CUDA one (set CXX to
# choose another). Output of every step is kept in <build dir>/gpu-check/*.log. Exit
# status: 0 when every step passed, 1 otherwise.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=$(realpath -m "${1:-$root/build-gpu-check}")
shift || true
logs=$build/gpu-check
mkdir -p "$logs"
jobs=$(nproc)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1

if [[ -z ${CXX:-} ]]; then
  IFS=: read -r -a prefixes <<< "${CMAKE_PREFIX_PATH:-}"
  for p in "${prefixes[@]}"; do
    p=${p%%;*}
    # Every Kokkos install ships nvcc_wrapper; only a CUDA one needs it.
    if [[ -x $p/bin/nvcc_wrapper ]] && grep -qs '^#define KOKKOS_ENABLE_CUDA$' "$p/include/KokkosCore_config.h"; then
      export CXX=$p/bin/nvcc_wrapper
      break
    fi
  done
fi

summary=()
failed=0
deadline=0
[[ ${GPU_CHECK_SECONDS:-0} -gt 0 ]] && deadline=$((SECONDS + GPU_CHECK_SECONDS))
# step NAME LOGFILE COMMAND...: runs it (shell functions too: they are exported), records
# PASS/FAIL and the time; with a deadline, stopped at it, or skipped once it has passed.
step() {
  local name=$1 log=$logs/$2
  shift 2
  local t0=$SECONDS limit=()
  if ((deadline)); then
    if ((deadline - SECONDS < 5)); then
      summary+=("$(printf '%-36s SKIP        (out of time)' "$name")")
      failed=1
      return
    fi
    limit=(timeout $((deadline - SECONDS)))
  fi
  if "${limit[@]}" bash -c '"$@"' step "$@" > "$log" 2>&1; then
    summary+=("$(printf '%-36s PASS %5ds' "$name" $((SECONDS - t0)))")
  else
    summary+=("$(printf '%-36s FAIL %5ds  (%s)' "$name" $((SECONDS - t0)) "$log")")
    failed=1
  fi
}

# The last line of a log when it is a JSON object, for the summary.
json_of() { tail -n 1 "$logs/$1" 2> /dev/null | grep '^{' || echo "{}"; }
field() {
  python3 -c "import json,sys; v=json.loads(sys.argv[1]).get(sys.argv[2], 'n/a'); print(f'{v:.4g}' if isinstance(v, float) else v)" \
    "$1" "$2" 2> /dev/null
}

step configure configure.log cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release \
  -DLAMINA_REFERENCE_DIR="$root/tests/reference" "$@"
# lamina first, so that verify and the step's speed come before the test suites' longer build.
step "build lamina" build_lamina.log cmake --build "$build" -j "$jobs" --target lamina
lamina=$build/apps/lamina/lamina
if [[ ! -x $lamina ]]; then
  printf '%s\n' "${summary[@]}"
  echo "gpu-check: the build failed; see $logs/build_lamina.log"
  exit 1
fi
# With a deadline, the suites compile beside the device steps; "build tests" waits for them.
export build
background_build=0
if ((deadline)); then
  background_build=1
  (cmake --build "$build" -j "$((jobs > 8 ? jobs - 4 : jobs))" > "$logs/build.log" 2>&1
    echo $? > "$logs/build.status") &
fi
for ref in "$root"/tests/reference/ref_*.h5; do
  name=$(basename "$ref" .h5)
  for attention in auto staged fused; do
    step "verify $name (attention $attention)" "verify_${name}_$attention.log" "$lamina" verify --reference "$ref" \
      --attention "$attention"
  done
done
# On a GPU, GPT-2 124M at 16 x 1024 tokens per step (the size PyTorch is compared on);
# on a CPU, the 6 x 384 model of inputs/bench-torch.toml.
# Text runs: the same shapes on this project's own documentation as bytes.
if "$lamina" --version | grep -q Cuda; then
  model="GPT-2 124M, 16 x 1024 tokens"
  bench=("$root/inputs/gpt2-124m.toml" --set data.format=synthetic --set data.batch_size=16
    --set data.micro_batch_size=16)
  torch_args=(--layers 12 --d-model 768 --heads 12 --seq 1024 --batch 16 --vocab 50257 --device cuda)
  text=("$root/inputs/gpt2-124m.toml" --set data.batch_size=16 --set data.micro_batch_size=16
    --set optimizer.warmup_steps=10)
  memory=("$root/inputs/gpt2-124m.toml" --set data.batch_size=4 --set data.micro_batch_size=4)
  other=fused  # the default on a GPU is staged
else
  model="6 x 384, 4 x 256 tokens"
  bench=("$root/inputs/bench-torch.toml")
  torch_args=(--threads "$jobs")
  text=("$root/inputs/bench-torch.toml" --set optimizer.warmup_steps=10)
  memory=("$root/inputs/bench-torch.toml")
  other=staged
fi
step "bench step fp32" bench_step.log "$lamina" bench step "${bench[@]}" --steps 10 --warmup 3
step "bench step bf16" bench_step_bf16.log "$lamina" bench step "${bench[@]}" --set train.precision=bf16 \
  --steps 10 --warmup 3
# Where the bf16 step's time goes, kernel by kernel (perf/tools/kernel_timer.cpp, a Kokkos
# Tools plugin; every launch waited for, so the times add up to the kernels', not the step's).
kernel_times() {
  c++ -O2 -shared -fPIC "$root/perf/tools/kernel_timer.cpp" -o "$build/libkernel_timer.so" &&
    CUDA_LAUNCH_BLOCKING=1 KOKKOS_TOOLS_LIBS="$build/libkernel_timer.so" \
      KOKKOS_PROFILE_LIBRARY="$build/libkernel_timer.so" "$@"
}
export root
export -f kernel_times
step "kernel times, bf16 step" kernels_bf16.log kernel_times "$lamina" bench step "${bench[@]}" \
  --set train.precision=bf16 --steps 3 --warmup 1
in_build() { (cd "$build" && "$@"); }
export -f in_build
if ((background_build)); then
  # The background build's log and status, once it has finished.
  built() {
    while [[ ! -f $logs/build.status ]]; do sleep 2; done
    return "$(cat "$logs/build.status")"
  }
  export logs
  export -f built
  step "build tests" build_wait.log built
else
  step "build tests" build.log cmake --build "$build" -j "$jobs"
fi
step "unit tests" unit.log in_build ctest -LE mpi -j "$jobs" --output-on-failure
step "MPI tests" mpi.log in_build ctest -L mpi --output-on-failure
step "bench step fp32, attention $other" bench_step_other.log "$lamina" bench step "${bench[@]}" \
  --set model.attention=$other --steps 10 --warmup 3
step "bench step bf16, attention $other" bench_step_bf16_other.log "$lamina" bench step "${bench[@]}" \
  --set train.precision=bf16 --set model.attention=$other --steps 10 --warmup 3
# PyTorch on the same model beside lamina, when this node's python3 has it (else skipped).
python=${PYTHON:-python3}
has_torch=0
"$python" -c "import torch" 2> /dev/null && has_torch=1
if ((has_torch)); then
  step "PyTorch step fp32" torch_step.log "$python" "$root/perf/torch_gpt.py" "${torch_args[@]}"
  step "PyTorch step bf16" torch_step_bf16.log "$python" "$root/perf/torch_gpt.py" "${torch_args[@]}" \
    --precision bf16
fi
# 50 steps on text with a checkpoint at step 25, then the run again from that checkpoint:
# every step's loss and gradient norm as the log prints them must repeat. Step 30's
# instructions as the executor ran them go to <run dir>/trace_step30_rank0.json.
text_files=$(printf '"%s",' "$root"/README.md "$root"/docs/*.md)
same_losses() {
  diff <(grep -E '^step +(2[6-9]|[34][0-9]|50)/' "$1" | cut -d'|' -f1,2,4) \
    <(grep -E '^step +(2[6-9]|[34][0-9]|50)/' "$2" | cut -d'|' -f1,2,4) &&
    [[ $(grep -cE '^step +(2[6-9]|[34][0-9]|50)/' "$2") == 25 ]]
}
export -f same_losses
for p in fp32 bf16; do
  run=("${text[@]}" --set data.format=text --set "data.path=[${text_files%,}]" --set train.steps=50
    --set train.precision=$p --set checkpoint.every=25 --set output.log_every=1 --set output.trace_step=30)
  step "train 50 steps on text, $p" "train_$p.log" "$lamina" train "${run[@]}" --set output.dir="$build/gpu-check/run-$p"
  step "resumed from step 25, $p: same losses" "resume_$p.log" "$lamina" train "${run[@]}" \
    --set output.dir="$build/gpu-check/resume-$p" \
    --set checkpoint.resume="$build/gpu-check/run-$p/checkpoints/step_00000025.h5"
  step "  (compared)" "compare_$p.log" same_losses "$logs/train_$p.log" "$logs/resume_$p.log"
done
for policy in 'memory.activations="keep"' 'memory.activations="recompute"' 'memory.activations="offload"' \
  'memory.optimizer="host"' 'memory.optimizer="dynamic"' 'train.precision="bf16"'; do
  step "bench memory, $policy" "memory_${policy//[^a-z0-9]/_}.log" "$lamina" bench memory "${memory[@]}" \
    --set data.format=synthetic --set "$policy" --steps 2
done
step "bench adam" bench_adam.log "$lamina" bench adam
step "bench dos" bench_dos.log "$lamina" bench dos "${bench[@]}" --steps 5

echo
echo "lamina gpu-check: $("$lamina" --version)"
echo "build: $build (logs in $logs)"
printf '%s\n' "${summary[@]}"
((background_build)) && echo "(the steps before the unit tests ran while the test suites compiled)"
fp32=$(json_of bench_step.log)
bf16=$(json_of bench_step_bf16.log)
other32=$(json_of bench_step_other.log)
other16=$(json_of bench_step_bf16_other.log)
echo "$model: fp32 $(field "$fp32" step_ms_median) ms/step, $(field "$fp32" tokens_per_s) tokens/s;" \
  "bf16 $(field "$bf16" step_ms_median) ms/step, $(field "$bf16" tokens_per_s) tokens/s;" \
  "attention $other: fp32 $(field "$other32" step_ms_median), bf16 $(field "$other16" step_ms_median) ms/step"
if ((has_torch)); then
  torch32=$(json_of torch_step.log)
  torch16=$(json_of torch_step_bf16.log)
  echo "PyTorch $(field "$torch16" torch): fp32 $(field "$torch32" ms_per_step_median) ms/step," \
    "$(field "$torch32" tokens_per_s) tokens/s; bf16 autocast (fused AdamW: $(field "$torch16" fused_adamw))" \
    "$(field "$torch16" ms_per_step_median) ms/step, $(field "$torch16" tokens_per_s) tokens/s"
else
  echo "PyTorch: $python cannot import torch; no side-by-side step"
fi
if [[ -f $logs/kernels_bf16.log ]]; then
  echo "the bf16 step's longest kernels (seconds over 4 steps, launches):"
  grep -A 8 '^kernel ' "$logs/kernels_bf16.log" | tail -n +2 | head -n 8
fi
echo "bench adam: $(json_of bench_adam.log)"
echo "bench dos: $(json_of bench_dos.log)"
for f in "$logs"/memory_*.log; do
  [[ -f $f ]] || continue  # none ran
  m=$(tail -n 1 "$f" | grep '^{' || echo "{}")
  echo "$(basename "$f" .log): estimate against lamina's buffers $(field "$m" max_relative_error)," \
    "against what the device reports $(field "$m" device_relative_error)"
done
exit $failed
