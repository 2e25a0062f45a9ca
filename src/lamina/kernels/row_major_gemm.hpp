#pragma once
// The arguments of one dense product as BLAS libraries take them, for the host BLAS
// (host_blas.hpp) and the device's (device_blas.hpp), which lamina calls directly.
#include <cstdint>

namespace lamina {

// C = alpha * op(A) @ op(B) + beta * C on row-major matrices with row strides lda, ldb, ldc.
// `ta`, `tb` are 'N' or 'T'; op(A) is m x k, op(B) is k x n.
struct RowMajorGemm {
  char ta = 'N', tb = 'N';
  std::int64_t m = 0, n = 0, k = 0;
  float alpha = 1.0f;
  const float* a = nullptr;
  std::int64_t lda = 1;
  const float* b = nullptr;
  std::int64_t ldb = 1;
  float beta = 0.0f;
  float* c = nullptr;
  std::int64_t ldc = 1;
};

// The same product for every (sequence s, head h) of a batch, as attention runs them:
// operand X of (s, h) starts s * X.sequence + h * X.head elements past X's first.
struct HeadBatch {
  struct Strides {
    std::int64_t sequence = 0, head = 0;
  };
  std::int64_t sequences = 1, heads = 1;
  Strides a, b, c;
};

}  // namespace lamina
