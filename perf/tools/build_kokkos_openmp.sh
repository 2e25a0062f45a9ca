#!/usr/bin/env bash
# Builds Kokkos 4 with the OpenMP backend and Kokkos Kernels' BLAS component (OpenBLAS as
# the BLAS TPL, no explicit instantiations: lamina instantiates what it uses) into PREFIX:
# what spack builds for a CPU cluster, for checking lamina's OpenMP path on a workstation.
# Takes about ten minutes on two cores. Sources are git checkouts of the release tags:
#   git clone --branch 4.6.01 https://github.com/kokkos/kokkos
#   git clone --branch 4.6.01 https://github.com/kokkos/kokkos-kernels
#   perf/tools/build_kokkos_openmp.sh kokkos kokkos-kernels /opt/kokkos-4.6-openmp
# then configure lamina with -DCMAKE_PREFIX_PATH=/opt/kokkos-4.6-openmp (README, Performance).
set -euo pipefail
if [[ $# -ne 3 ]]; then
  echo "usage: $0 KOKKOS_SOURCE KOKKOS_KERNELS_SOURCE PREFIX" >&2
  exit 2
fi
kokkos=$(realpath "$1") kernels=$(realpath "$2") prefix=$(realpath -m "$3")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
jobs=$(nproc)
cmake -S "$kokkos" -B "$work/kokkos" -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX="$prefix" \
  -DKokkos_ENABLE_OPENMP=ON -DKokkos_ENABLE_SERIAL=ON -DKokkos_ARCH_NATIVE=ON -DBUILD_SHARED_LIBS=ON
cmake --build "$work/kokkos" -j "$jobs"
cmake --install "$work/kokkos"
cmake -S "$kernels" -B "$work/kernels" -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX="$prefix" \
  -DCMAKE_PREFIX_PATH="$prefix" -DKokkosKernels_ENABLE_COMPONENTS=BLAS -DKokkosKernels_ENABLE_TPL_BLAS=ON \
  -DKokkosKernels_ADD_DEFAULT_ETI=OFF -DKokkosKernels_ENABLE_TESTS=OFF -DKokkosKernels_ENABLE_EXAMPLES=OFF \
  -DBUILD_SHARED_LIBS=ON
cmake --build "$work/kernels" -j "$jobs"
cmake --install "$work/kernels"
echo "Kokkos $(basename "$kokkos") with OpenMP and Kokkos Kernels (BLAS) installed in $prefix"
