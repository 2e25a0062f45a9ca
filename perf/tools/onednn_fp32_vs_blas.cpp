// oneDNN's fp32 matmul against OpenBLAS's sgemm on the training step's product shapes
// (bench-torch's and GPT-2 124M's at batch 4 x 1024), two threads each, best of five: whether
// fp32 products would gain from oneDNN (README, Performance). oneDNN 2.x API.
//   g++ -O2 -std=c++17 -fopenmp onednn_fp32_vs_blas.cpp -o onednn_fp32_vs_blas -ldnnl -lopenblas
//   OMP_NUM_THREADS=2 ./onednn_fp32_vs_blas
#include <oneapi/dnnl/dnnl.hpp>
#include <cblas.h>
#include <chrono>
#include <cstdio>
#include <vector>
using namespace dnnl;
double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
int main() {
  engine eng(engine::kind::cpu, 0); stream s(eng);
  struct S { long m, n, k; char ta, tb; const char* what; };
  const S shapes[] = {{1024, 1152, 384, 'N', 'N', "qkv fwd (bench-torch)"}, {1024, 1536, 384, 'N', 'N', "fc fwd"},
                      {1024, 384, 1536, 'N', 'N', "fcproj fwd"}, {1024, 384, 1536, 'N', 'T', "fc dinp"},
                      {384, 1536, 1024, 'T', 'N', "fc dW"}, {1024, 8192, 384, 'N', 'T', "head fwd"},
                      {4096, 3072, 768, 'N', 'N', "fc fwd (GPT-2)"}, {768, 3072, 4096, 'T', 'N', "fc dW (GPT-2)"},
                      {4096, 50257, 768, 'N', 'T', "head fwd (GPT-2)"}};
  openblas_set_num_threads(2);
  for (const S& p : shapes) {
    std::vector<float> A(p.m * p.k, 0.5f), B(p.k * p.n, 0.25f), C(p.m * p.n);
    const long lda = p.ta == 'N' ? p.k : p.m, ldb = p.tb == 'N' ? p.n : p.k;
    auto blas = [&] { cblas_sgemm(CblasRowMajor, p.ta == 'N' ? CblasNoTrans : CblasTrans, p.tb == 'N' ? CblasNoTrans : CblasTrans,
                                  p.m, p.n, p.k, 1.0f, A.data(), lda, B.data(), ldb, 0.0f, C.data(), p.n); };
    memory::desc a(memory::dims{p.m, p.k}, memory::data_type::f32, p.ta == 'N' ? memory::dims{p.k, 1} : memory::dims{1, p.m});
    memory::desc b(memory::dims{p.k, p.n}, memory::data_type::f32, p.tb == 'N' ? memory::dims{p.n, 1} : memory::dims{1, p.k});
    memory::desc c(memory::dims{p.m, p.n}, memory::data_type::f32, memory::dims{p.n, 1});
    matmul mm(matmul::primitive_desc(matmul::desc(a, b, c), eng));
    memory am(a, eng, A.data()), bm(b, eng, B.data()), cm(c, eng, C.data());
    auto dnn = [&] { mm.execute(s, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}}); s.wait(); };
    auto best = [&](auto f) { f(); double b = 1e30; for (int r = 0; r < 5; ++r) { double t0 = now(); f(); b = std::min(b, now() - t0); } return 2.0 * p.m * p.n * p.k / b / 1e9; };
    const double gb = best(blas), gd = best(dnn);
    std::printf("%-22s %5ld x %5ld x %5ld %c%c: OpenBLAS %6.1f, oneDNN fp32 %6.1f GFLOP/s (oneDNN/OpenBLAS %.2f)\n", p.what, p.m, p.n, p.k, p.ta, p.tb, gb, gd, gd / gb);
  }
}
