#include "lamina/kernels/host_dnnl.hpp"

#include "lamina/core/error.hpp"
#include "lamina/core/format.hpp"

#if defined(LAMINA_HAVE_ONEDNN)
#include <oneapi/dnnl/dnnl.hpp>

#include <array>
#include <cstring>
#include <map>
#include <mutex>
#include <stdexcept>
#include <unordered_map>
#if defined(_OPENMP)
#include <omp.h>
#endif
#endif

namespace lamina {

#if defined(LAMINA_HAVE_ONEDNN)

namespace {

using Dims = dnnl::memory::dims;
using dt = dnnl::memory::data_type;

const char* isa_name(dnnl_cpu_isa_t isa) {
  switch (isa) {
    case dnnl_cpu_isa_sse41: return "sse41";
    case dnnl_cpu_isa_avx: return "avx";
    case dnnl_cpu_isa_avx2: return "avx2";
    case dnnl_cpu_isa_avx2_vnni: return "avx2_vnni";
    case dnnl_cpu_isa_avx512_core: return "avx512_core";
    case dnnl_cpu_isa_avx512_core_vnni: return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core_bf16: return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_amx: return "avx512_core_amx";
    default: return "other";
  }
}

// The ISA values are x86's: on other CPUs (oneDNN's aarch64 bf16 goes through the Arm
// Compute Library, not these kernels) bf16 runs keep fp32 products.
bool has_bf16([[maybe_unused]] dnnl_cpu_isa_t isa) {
#if defined(__x86_64__)
  return (isa & dnnl_cpu_isa_avx512_core_bf16) == dnnl_cpu_isa_avx512_core_bf16;
#else
  return false;
#endif
}

// The engine, its stream and the primitives made so far, one per product shape.
class Engine {
 public:
  static Engine& get() {
    static Engine e;
    return e;
  }

  // C in fp32 (c16 null) or, with its bias if any, rounded to bf16 into c16.
  void run(const RowMajorGemm& g, const std::uint16_t* a, const std::uint16_t* b, const HeadBatch& h,
           std::uint16_t* c16 = nullptr, const float* bias = nullptr) {
    const Key key{g.ta,          g.tb,          g.m,         g.n,        g.k,          g.lda,
                  g.ldb,         g.ldc,         bits(g.alpha), bits(g.beta), h.sequences, h.heads,
                  h.a.sequence,  h.a.head,      h.b.sequence, h.b.head,   h.c.sequence, h.c.head,
                  c16 != nullptr, bias != nullptr};
    const std::pair<dnnl::matmul, Descs>* p = nullptr;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = primitives_.find(key);
      if (it == primitives_.end()) it = primitives_.emplace(key, make(g, h, c16 != nullptr, bias != nullptr)).first;
      p = &it->second;  // map nodes stay where they are
    }
    const Descs& md = p->second;
    dnnl::memory A(md.src, engine_, const_cast<std::uint16_t*>(a));
    dnnl::memory B(md.weights, engine_, const_cast<std::uint16_t*>(b));
    dnnl::memory C(md.dst, engine_, c16 != nullptr ? static_cast<void*>(c16) : static_cast<void*>(g.c));
    std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_SRC, A}, {DNNL_ARG_WEIGHTS, B}, {DNNL_ARG_DST, C}};
    if (bias != nullptr) args.emplace(DNNL_ARG_BIAS, dnnl::memory(md.bias, engine_, const_cast<float*>(bias)));
    p->first.execute(stream_, args);
    stream_.wait();
  }

 private:
  using Key = std::array<std::int64_t, 20>;
  struct Descs {
    dnnl::memory::desc src, weights, dst, bias;
  };

  Engine() : engine_(dnnl::engine::kind::cpu, 0), stream_(engine_) {}

  static std::int64_t bits(float x) {
    std::uint32_t u = 0;
    std::memcpy(&u, &x, sizeof u);
    return u;
  }

  // Row-major op(X) of rows x cols with row stride ld (a transposed operand is its stored
  // matrix read down the columns), behind the batch's (sequence, head) dimensions if any.
  static dnnl::memory::desc operand(char t, std::int64_t rows, std::int64_t cols, std::int64_t ld, dt type,
                                    const HeadBatch& h, const HeadBatch::Strides& s) {
    const std::int64_t row = t == 'T' ? 1 : ld, col = t == 'T' ? ld : 1;
    if (h.sequences == 1 && h.heads == 1) return dnnl::memory::desc(Dims{rows, cols}, type, Dims{row, col});
    return dnnl::memory::desc(Dims{h.sequences, h.heads, rows, cols}, type, Dims{s.sequence, s.head, row, col});
  }

  std::pair<dnnl::matmul, Descs> make(const RowMajorGemm& g, const HeadBatch& h, bool bf16_dst, bool bias) {
    Descs d{operand(g.ta, g.m, g.k, g.lda, dt::bf16, h, h.a), operand(g.tb, g.k, g.n, g.ldb, dt::bf16, h, h.b),
            operand('N', g.m, g.n, g.ldc, bf16_dst ? dt::bf16 : dt::f32, h, h.c), dnnl::memory::desc()};
    // One bias per output column, added to the fp32 sums before they are written.
    if (bias) d.bias = dnnl::memory::desc(Dims{1, g.n}, dt::f32, Dims{g.n, 1});
    // alpha scales the product, then beta C is added. oneDNN 3 has no output scales: there
    // an eltwise post-op scales, which oneDNN 2's bf16 kernels do not fuse (ten times slower
    // there); lamina's own products pass alpha 1.
    dnnl::primitive_attr attr;
    dnnl::post_ops ops;
#if DNNL_VERSION_MAJOR >= 3
    if (g.alpha != 1.0f) ops.append_eltwise(dnnl::algorithm::eltwise_linear, g.alpha, 0.0f);
#else
    if (g.alpha != 1.0f) attr.set_output_scales(0, {g.alpha});
#endif
    if (g.beta != 0.0f) ops.append_sum(g.beta);
    attr.set_post_ops(ops);
    try {
#if DNNL_VERSION_MAJOR >= 3
      const dnnl::matmul::primitive_desc pd =
          bias ? dnnl::matmul::primitive_desc(engine_, d.src, d.weights, d.bias, d.dst, attr)
               : dnnl::matmul::primitive_desc(engine_, d.src, d.weights, d.dst, attr);
#else
      const dnnl::matmul::primitive_desc pd(
          bias ? dnnl::matmul::desc(d.src, d.weights, d.bias, d.dst) : dnnl::matmul::desc(d.src, d.weights, d.dst), attr,
          engine_);
#endif
      return {dnnl::matmul(pd), d};
    } catch (const dnnl::error& e) {
      throw RunError(strprintf("oneDNN: no bf16 matmul for %lld x %lld x %lld (%c%c), %lld x %lld of them: %s",
                               static_cast<long long>(g.m), static_cast<long long>(g.n), static_cast<long long>(g.k),
                               g.ta, g.tb, static_cast<long long>(h.sequences), static_cast<long long>(h.heads),
                               e.what()));
    }
  }

  dnnl::engine engine_;
  dnnl::stream stream_;
  std::mutex mutex_;
  std::map<Key, std::pair<dnnl::matmul, Descs>> primitives_;
};

}  // namespace

bool host_bf16_products() {
  static const bool yes = has_bf16(dnnl_get_effective_cpu_isa());
  return yes;
}

std::string host_product_engine() {
  const dnnl_version_t* v = dnnl_version();
  const dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
  const std::string onednn = strprintf("oneDNN %d.%d.%d", v->major, v->minor, v->patch);
#if defined(_OPENMP)
  const std::string threads = strprintf(", %d OpenMP thread(s)", omp_get_max_threads());
#else
  const std::string threads;
#endif
  if (host_bf16_products()) return onednn + " bf16 products (" + isa_name(isa) + threads + ")";
  return onednn + ": no bf16 instructions on this CPU (" + isa_name(isa) + "), bf16 runs keep fp32 products";
}

void set_host_product_threads([[maybe_unused]] int threads) {
#if defined(_OPENMP)
  if (dnnl_version()->cpu_runtime == DNNL_RUNTIME_OMP) omp_set_num_threads(threads);
#endif
}

void host_gemm_bf16(const RowMajorGemm& g, const std::uint16_t* a, const std::uint16_t* b, const HeadBatch& batch) {
  if (g.m == 0 || g.n == 0 || batch.sequences == 0 || batch.heads == 0) return;
  Engine::get().run(g, a, b, batch);
}

void host_gemm_bf16_rounded(const RowMajorGemm& g, const std::uint16_t* a, const std::uint16_t* b, std::uint16_t* c,
                            const float* bias, const HeadBatch& batch) {
  if (g.m == 0 || g.n == 0 || batch.sequences == 0 || batch.heads == 0) return;
  if (g.beta != 0.0f) throw std::logic_error("lamina::host_gemm_bf16_rounded: beta must be 0");
  if (bias != nullptr && (batch.sequences != 1 || batch.heads != 1)) {
    throw std::logic_error("lamina::host_gemm_bf16_rounded: a batch of products takes no bias");
  }
  Engine::get().run(g, a, b, batch, c, bias);
}

#else

bool host_bf16_products() { return false; }

std::string host_product_engine() { return "no oneDNN: bf16 runs keep fp32 products"; }

void set_host_product_threads(int) {}

void host_gemm_bf16(const RowMajorGemm&, const std::uint16_t*, const std::uint16_t*, const HeadBatch&) {
  throw RunError("host bf16 product: lamina was built without oneDNN");
}

void host_gemm_bf16_rounded(const RowMajorGemm&, const std::uint16_t*, const std::uint16_t*, std::uint16_t*,
                            const float*, const HeadBatch&) {
  throw RunError("host bf16 product: lamina was built without oneDNN");
}

#endif

}  // namespace lamina
