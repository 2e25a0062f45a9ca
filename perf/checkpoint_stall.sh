#!/usr/bin/env bash
# What checkpoints cost a training run, written synchronously and in the background
# (checkpoint.async), on GPT-2 124M (synthetic tokens; batch and sequence small enough for
# a CPU): in rounds, so that background load affects each mode alike, the same steps
#   none   no checkpoint
#   sync   a checkpoint every EVERY steps, written before training goes on
#   async  the same, copied to host memory and written by a thread while training goes on
# Prints each run's wall time and the stall per checkpoint: (wall - none's wall) / checkpoints.
#   perf/checkpoint_stall.sh BUILD_DIR [rounds] [steps] [every] [seq_len]
# Checkpoints go to a temporary directory under the current one (LAMINA_STALL_DIR to choose
# the file system), removed at the end.
set -euo pipefail
if [[ $# -lt 1 ]]; then
  echo "usage: $0 BUILD_DIR [rounds] [steps] [every] [seq_len]" >&2
  exit 2
fi
lamina=$1/apps/lamina/lamina rounds=${2:-2} steps=${3:-9} every=${4:-2} seq=${5:-256}
[[ -x $lamina ]] || { echo "$0: no lamina binary at $lamina" >&2; exit 2; }
work=$(mktemp -d -p "${LAMINA_STALL_DIR:-.}" checkpoint_stall.XXXXXX)
trap 'rm -rf "$work"' EXIT
cat > "$work/deck.toml" <<DECK
[model]
layers = 12
d_model = 768
heads = 12
seq_len = $seq
vocab_size = 50257
[data]
format = "synthetic"
batch_size = 1
[train]
steps = $steps
[optimizer]
lr = 6e-4
[checkpoint]
keep = 2
save_final = false
[output]
peak_tflops = 1.0
log_every = 1
DECK
checkpoints=$((steps / every))
run() {  # mode round -> "wall seconds"
  local sets=(--set "output.dir=$work/$1_$2")
  case $1 in
    none) sets+=(--set checkpoint.every=0) ;;
    sync) sets+=(--set checkpoint.every="$every" --set checkpoint.async=false) ;;
    async) sets+=(--set checkpoint.every="$every" --set checkpoint.async=true) ;;
  esac
  "$lamina" train "$work/deck.toml" "${sets[@]}" > "$work/$1_$2.log" 2>&1
  sed -n 's/^done: steps [0-9]*-[0-9]* in \([0-9.]*\) s.*/\1/p' "$work/$1_$2.log"
}
for r in $(seq "$rounds"); do
  declare -A wall=()
  for mode in none sync async; do wall[$mode]=$(run "$mode" "$r"); done
  for mode in sync async; do
    stall=$(python3 -c 'import sys; n, w, w0 = map(float, sys.argv[1:]); print(f"{(w - w0) / n:.2f}")' \
            "$checkpoints" "${wall[$mode]}" "${wall[none]}")
    extra=$(python3 - "$work/${mode}_$r.log" <<'PY'
import re, sys
t = open(sys.argv[1]).read()
def each(pattern):
    return " ".join(re.findall(pattern, t)) or "-"
print("sync writes: " + each(r"\.h5 written in ([0-9.]+) s") + "; copies: " + each(r"copied to host memory in ([0-9.]+) s") +
      "; background writes: " + each(r"written in the background in ([0-9.]+) s") +
      "; training waited: " + each(r"training waited ([0-9.]+) s"))
PY
)
    printf 'round %s: %-5s wall %7.2f s (none %7.2f s), stall %s s per checkpoint [%s]\n' "$r" "$mode" \
      "${wall[$mode]}" "${wall[none]}" "$stall" "$extra"
  done
done
