# One pair of targets, KokkosCompat::kokkos and KokkosCompat::kokkoskernels, that works
# with a standalone Kokkos 4.x/5.x (spack) and with Debian's Trilinos Kokkos 3.4, whose
# imported Kokkos::kokkos target points at a non-existent include directory.
find_package(Kokkos REQUIRED)
find_package(KokkosKernels REQUIRED)
add_library(kokkos_compat_kokkos INTERFACE)
add_library(kokkos_compat_kokkoskernels INTERFACE)
if(TARGET Kokkos::kokkoskernels AND NOT TARGET trilinos_kokkoscore)
  target_link_libraries(kokkos_compat_kokkos INTERFACE Kokkos::kokkos)
  target_link_libraries(kokkos_compat_kokkoskernels INTERFACE Kokkos::kokkoskernels)
  set(LAMINA_KOKKOS_FLAVOR "standalone ${Kokkos_VERSION}")
else()
  target_include_directories(kokkos_compat_kokkos SYSTEM INTERFACE ${Kokkos_INCLUDE_DIRS} ${Kokkos_TPL_INCLUDE_DIRS})
  target_link_libraries(kokkos_compat_kokkos INTERFACE ${Kokkos_LIBRARIES} ${Kokkos_TPL_LIBRARIES})
  if("OPENMP" IN_LIST Kokkos_DEVICES)
    find_package(OpenMP REQUIRED)
    target_link_libraries(kokkos_compat_kokkos INTERFACE OpenMP::OpenMP_CXX)
  endif()
  target_include_directories(kokkos_compat_kokkoskernels SYSTEM INTERFACE ${KokkosKernels_INCLUDE_DIRS})
  target_link_libraries(kokkos_compat_kokkoskernels INTERFACE ${KokkosKernels_LIBRARIES} ${KokkosKernels_TPL_LIBRARIES})
  set(LAMINA_KOKKOS_FLAVOR "TriBITS ${Kokkos_VERSION}")
endif()
target_link_libraries(kokkos_compat_kokkoskernels INTERFACE kokkos_compat_kokkos)
add_library(KokkosCompat::kokkos ALIAS kokkos_compat_kokkos)
add_library(KokkosCompat::kokkoskernels ALIAS kokkos_compat_kokkoskernels)

# Host GEMMs must reach a multithreaded BLAS. Debian's libblas.so is an alternative that
# points at OpenBLAS when libopenblas-dev is installed; link OpenBLAS explicitly when it
# is there so that its thread controls (openblas_set_num_threads) are available.
find_library(LAMINA_OPENBLAS_LIBRARY NAMES openblas)
if(LAMINA_OPENBLAS_LIBRARY)
  target_link_libraries(kokkos_compat_kokkoskernels INTERFACE ${LAMINA_OPENBLAS_LIBRARY})
  target_compile_definitions(kokkos_compat_kokkoskernels INTERFACE LAMINA_HAVE_OPENBLAS=1)
endif()
message(STATUS "lamina: Kokkos ${LAMINA_KOKKOS_FLAVOR}, devices: ${Kokkos_DEVICES}, OpenBLAS: ${LAMINA_OPENBLAS_LIBRARY}")
