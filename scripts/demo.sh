#!/usr/bin/env bash
# The main job: builds lamina (installing its Debian packages if needed) and trains the
# demo deck, a small byte-level GPT on the license texts every Debian system ships.
# Extra arguments go to `lamina train`, e.g. --set train.steps=100. The demo's warm-up
# (40 steps of 360) follows a train.steps=N given here: a fifth of N, at most 40, unless
# optimizer.warmup_steps is set too.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
cd "$LAMINA_ROOT"

# The values of every --set (`--set k=v`, `--set=k=v`, `--set k=v k2=v2`).
sets=()
in_set=0
for a in "$@"; do
  case $a in
    --set) in_set=1 ;;
    --set=*) sets+=("${a#--set=}"); in_set=0 ;;
    -*) in_set=0 ;;
    *) ((in_set)) && sets+=("$a") ;;
  esac
done
steps="" warmup_set=0
for s in "${sets[@]+"${sets[@]}"}"; do
  case $s in
    train.steps=*) steps=${s#train.steps=} ;;
    optimizer.warmup_steps=*) warmup_set=1 ;;
  esac
done
extra=()
if [[ $steps =~ ^[0-9]+$ ]] && ((!warmup_set)); then
  warmup=$(((10#$steps + 2) / 5))
  ((warmup > 40)) && warmup=40
  echo "demo.sh: optimizer.warmup_steps = $warmup for train.steps = $steps" \
       "(a fifth, at most 40; --set optimizer.warmup_steps=K to choose)"
  extra=(--set "optimizer.warmup_steps=$warmup")
fi
exec "$LAMINA_BUILD_DIR/apps/lamina/lamina" train inputs/demo.toml "$@" "${extra[@]+"${extra[@]}"}"
