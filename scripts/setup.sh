#!/usr/bin/env bash
# Installs lamina's Debian packages when missing, then configures and builds lamina in
# build/ (or $LAMINA_BUILD_DIR). Sourced by demo.sh and test.sh; safe to re-run.
set -euo pipefail
LAMINA_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
LAMINA_BUILD_DIR=${LAMINA_BUILD_DIR:-$LAMINA_ROOT/build}

packages=(g++ cmake make pkg-config
          libtrilinos-kokkos-dev libtrilinos-kokkos-kernels-dev libopenblas-dev
          libopenmpi-dev openmpi-bin libhdf5-openmpi-dev
          libtomlplusplus-dev libcli11-dev libgtest-dev libdnnl-dev nlohmann-json3-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "lamina: installing Debian packages: ${missing[*]}"
  sudo=""
  [[ $(id -u) -ne 0 ]] && sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get install -y --no-install-recommends "${missing[@]}" ||
    { $sudo apt-get update && $sudo apt-get install -y --no-install-recommends "${missing[@]}"; }
fi

# OpenMPI refuses to start as root unless told that this is intended (containers, CI).
if [[ $(id -u) -eq 0 ]]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
export OMPI_MCA_rmaps_base_oversubscribe=1

jobs=$(nproc 2>/dev/null || echo 2)
mkdir -p "$LAMINA_BUILD_DIR"
cmake -S "$LAMINA_ROOT" -B "$LAMINA_BUILD_DIR" -DCMAKE_BUILD_TYPE=Release ${LAMINA_CMAKE_ARGS:-} \
  > "$LAMINA_BUILD_DIR/configure.log" 2>&1 || { cat "$LAMINA_BUILD_DIR/configure.log"; exit 1; }
cmake --build "$LAMINA_BUILD_DIR" -j "$jobs"
