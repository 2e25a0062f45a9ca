#!/usr/bin/env bash
# The main job: builds lamina (installing its Debian packages if needed) and trains the
# demo deck, a small byte-level GPT on the license texts every Debian system ships.
# Extra arguments go to `lamina train`, e.g. --set train.steps=100.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
cd "$LAMINA_ROOT"
exec "$LAMINA_BUILD_DIR/apps/lamina/lamina" train inputs/demo.toml "$@"
