# Fails when code under src/ builds a Kokkos::MDRangePolicy of its own instead of
# lamina::RowMajor (src/lamina/kernels/common.hpp). Run as: cmake -DROOT=<source dir> -P row_major_loops.cmake
# Why: lamina's data is row-major, and Kokkos' default iteration on CUDA walks the first
# index fastest, so neighbouring threads would read addresses a row apart; RowMajor walks
# the last index fastest on every back-end.
cmake_minimum_required(VERSION 3.16)
if(NOT ROOT)
  message(FATAL_ERROR "row_major_loops: pass -DROOT=<lamina source directory>")
endif()
file(GLOB_RECURSE sources LIST_DIRECTORIES false "${ROOT}/src/*.hpp" "${ROOT}/src/*.cpp")
list(SORT sources)
set(hits "")
foreach(source IN LISTS sources)
  file(RELATIVE_PATH rel "${ROOT}" "${source}")
  if(rel STREQUAL "src/lamina/kernels/common.hpp")
    continue()
  endif()
  file(STRINGS "${source}" lines REGEX "MDRangePolicy")
  foreach(line IN LISTS lines)
    string(STRIP "${line}" line)
    string(APPEND hits "  ${rel}: ${line}\n")
  endforeach()
endforeach()
if(hits)
  message(FATAL_ERROR "a multi-dimensional loop that is not lamina::RowMajor:\n${hits}"
          "use RowMajor<Exec, N> (src/lamina/kernels/common.hpp): the last index fastest on every back-end.")
endif()
message(STATUS "every multi-dimensional loop under src/ is a RowMajor one")
