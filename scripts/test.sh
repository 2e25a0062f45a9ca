#!/usr/bin/env bash
# Builds lamina (installing its Debian packages if needed) and runs the whole test suite.
# The model tests compare against PyTorch reference files (ref_*.h5): taken from
# $LAMINA_REFERENCE_DIR, else ../shared/reference; with LAMINA_REQUIRE_REFERENCE=1 a
# missing reference is a failure instead of a loudly skipped test.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
ref=${LAMINA_REFERENCE_DIR:-$root/../shared/reference}
if [[ -d $ref ]]; then
  LAMINA_CMAKE_ARGS="${LAMINA_CMAKE_ARGS:-} -DLAMINA_REFERENCE_DIR=$(cd "$ref" && pwd)"
fi
export LAMINA_CMAKE_ARGS
source "$root/scripts/setup.sh"
cd "$LAMINA_BUILD_DIR"
log=$LAMINA_BUILD_DIR/ctest.log
status=0
ctest --output-on-failure -j "$jobs" 2>&1 | tee "$log" || status=$?
if grep -qE "\*\*\*Skipped|\[  SKIPPED \]" "$log"; then
  echo "lamina: some tests were SKIPPED:"
  grep -E "\*\*\*Skipped|\[  SKIPPED \]" "$log" | head -20
  [[ ${LAMINA_REQUIRE_REFERENCE:-0} == 1 ]] && status=1
fi
exit $status
