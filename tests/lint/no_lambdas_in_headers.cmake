# Fails when a header under src/ uses KOKKOS_LAMBDA (a mention after // on its line is
# allowed). Run as: cmake -DROOT=<source dir> -P no_lambdas_in_headers.cmake
# Why: under nvcc, KOKKOS_LAMBDA is an extended __host__ __device__ lambda whose host
# closure calls through function pointers kept per translation unit, so a kernel template
# in a header, instantiated in several .cpp files, can call a null pointer (see the
# conventions in src/lamina/kernels/common.hpp). Lambdas in .cpp files are allowed.
cmake_minimum_required(VERSION 3.16)
if(NOT ROOT)
  message(FATAL_ERROR "no_lambdas_in_headers: pass -DROOT=<lamina source directory>")
endif()

file(GLOB_RECURSE headers LIST_DIRECTORIES false
     "${ROOT}/src/*.hpp" "${ROOT}/src/*.h" "${ROOT}/src/*.hh" "${ROOT}/src/*.hxx" "${ROOT}/src/*.inl")
list(SORT headers)
if(NOT headers)
  message(FATAL_ERROR "no_lambdas_in_headers: no headers found under ${ROOT}/src")
endif()

# Whole-file string search rather than file(STRINGS): a CMake list would split source
# lines at semicolons and brackets and lose the line numbers.
set(token "KOKKOS_LAMBDA")
string(LENGTH "${token}" token_len)
set(hits "")
foreach(header IN LISTS headers)
  file(READ "${header}" content)
  file(RELATIVE_PATH rel "${ROOT}" "${header}")
  set(from 0)
  string(FIND "${content}" "${token}" pos)
  while(NOT pos EQUAL -1)
    math(EXPR at "${from} + ${pos}")
    math(EXPR from "${at} + ${token_len}")
    string(SUBSTRING "${content}" 0 ${at} before)
    # Line number: newlines before the hit, plus one.
    string(LENGTH "${before}" n_before)
    string(REPLACE "\n" "" before_flat "${before}")
    string(LENGTH "${before_flat}" n_flat)
    math(EXPR line_no "${n_before} - ${n_flat} + 1")
    # The hit's line, and whether it sits in a // comment.
    string(FIND "${before}" "\n" line_start REVERSE)
    math(EXPR line_start "${line_start} + 1")
    math(EXPR lead_len "${at} - ${line_start}")
    string(SUBSTRING "${content}" ${line_start} ${lead_len} lead)
    string(FIND "${lead}" "//" comment)
    if(comment EQUAL -1)
      string(SUBSTRING "${content}" ${line_start} -1 text)
      string(FIND "${text}" "\n" line_end)
      string(SUBSTRING "${text}" 0 ${line_end} text)
      string(STRIP "${text}" text)
      string(APPEND hits "  ${rel}:${line_no}: ${text}\n")
    endif()
    string(SUBSTRING "${content}" ${from} -1 rest)
    string(FIND "${rest}" "${token}" pos)
  endwhile()
endforeach()

if(hits)
  message(FATAL_ERROR
    "KOKKOS_LAMBDA in a header:\n${hits}"
    "nvcc keeps an extended lambda's copy/destroy/call function pointers per translation unit, "
    "so a kernel template instantiated in several .cpp files can call a null pointer on the GPU. "
    "Write the kernel as a named functor struct next to its launch "
    "(e.g. GeluForward in src/lamina/kernels/gelu.hpp) instead.")
endif()
list(LENGTH headers n_headers)
message(STATUS "no KOKKOS_LAMBDA in the ${n_headers} headers under src/")
