// cuBLASLt products with fused epilogues (see core/cuda/gemm_lt.h for the row-major contract).
//
// cuBLASLt is column-major. As in core/cuda/gemm.cu, the row-major C[m, n] is the column-major C^T
// [n, m], so we ask for C^T = op(B)^T op(A)^T: cuBLASLt's "A" is our B and its "B" is our A, its m is
// our n. In that frame cuBLASLt's "rows of D" are our columns, which is why
//   - the BIAS vector (length = rows of D) is our per-column bias [n],
//   - the BGRAD of DRELU (a sum over the columns of D) is our column sum over the m rows,
//   - the aux matrix (same shape as D, leading dimension = rows of D) is our row-major [m, n] with
//     rows of n elements, and the ReLU mask has rows of relu_mask_words * 32 bits.
// The handle is per device (core/cuda/handles.h), the stream is the current one, the workspace is the
// same per-(device, stream) block cuBLAS uses. Algorithms found by the heuristic are cached per shape
// and epilogue; descriptors are rebuilt per call (host-only and cheap, and they carry the pointers).
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>

#include "core/cuda/gemm_lt.h"
#include "core/cuda/handles.h"
#include "core/cuda/kernel_utils.cuh"
#include "core/kernel_profiler.h"

namespace dpt::cuda_kernels {

namespace {

// One owned cuBLASLt object of each kind, destroyed on scope exit (errors there are ignored: nothing
// useful can be done about a failed destroy).
class MatmulDesc {
 public:
  MatmulDesc(cublasComputeType_t compute, cudaDataType_t scale) {
    DPT_CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc_, compute, scale));
  }
  ~MatmulDesc() { (void)cublasLtMatmulDescDestroy(desc_); }
  MatmulDesc(const MatmulDesc&) = delete;
  MatmulDesc& operator=(const MatmulDesc&) = delete;
  template <class T>
  void set(cublasLtMatmulDescAttributes_t attr, const T& value) {
    DPT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc_, attr, &value, sizeof(value)));
  }
  cublasLtMatmulDesc_t get() const { return desc_; }

 private:
  cublasLtMatmulDesc_t desc_ = nullptr;
};

class Layout {
 public:
  Layout(cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld) {
    DPT_CUBLAS_CHECK(
        cublasLtMatrixLayoutCreate(&layout_, type, static_cast<uint64_t>(rows), static_cast<uint64_t>(cols), ld));
  }
  ~Layout() { (void)cublasLtMatrixLayoutDestroy(layout_); }
  Layout(const Layout&) = delete;
  Layout& operator=(const Layout&) = delete;
  cublasLtMatrixLayout_t get() const { return layout_; }

 private:
  cublasLtMatrixLayout_t layout_ = nullptr;
};

class Preference {
 public:
  explicit Preference(size_t workspace_bytes) {
    DPT_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref_));
    uint64_t bytes = workspace_bytes;
    DPT_CUBLAS_CHECK(
        cublasLtMatmulPreferenceSetAttribute(pref_, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &bytes, sizeof(bytes)));
    // Algorithms are cached per shape and reused for other pointers: ask only for those that need no
    // more than the 16-byte alignment every call guarantees.
    const uint32_t align = 16;
    for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES}) {
      DPT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref_, attr, &align, sizeof(align)));
    }
  }
  ~Preference() { (void)cublasLtMatmulPreferenceDestroy(pref_); }
  Preference(const Preference&) = delete;
  Preference& operator=(const Preference&) = delete;
  cublasLtMatmulPreference_t get() const { return pref_; }

 private:
  cublasLtMatmulPreference_t pref_ = nullptr;
};

// The heuristic's choice depends on the problem, the epilogue, the math mode and the pointers'
// alignment; every pointer reaching here is 16-byte aligned (gemm_lt_supported) and the preference
// asks for algorithms needing no more, so the rest is the key.
struct AlgoKey {
  int device;
  DType dtype;
  int64_t m, n, k;
  bool transpose_a, transpose_b;
  cublasLtEpilogue_t epilogue;
  bool tf32;
  // Bias and aux pointers have no alignment preference: the heuristic reads their actual alignment, so
  // whether both sit on 256 bytes (fresh pool blocks) or only on 16 (views) is part of the key.
  bool epilogue_aligned256;
  bool has_addend;  // C read at beta = 1 (its alignment is a preference, like A's, B's and D's)
  auto tie() const {
    return std::tie(device, dtype, m, n, k, transpose_a, transpose_b, epilogue, tf32, epilogue_aligned256,
                    has_addend);
  }
  bool operator<(const AlgoKey& o) const { return tie() < o.tie(); }
};

std::mutex g_algo_mutex;
std::map<AlgoKey, std::optional<cublasLtMatmulAlgo_t>> g_algos;  // nullopt: cuBLASLt has none
int64_t g_refusals = 0;                                          // guarded by g_algo_mutex
std::string g_last_refusal;

cublasLtEpilogue_t lt_epilogue(LtEpilogue e, bool has_bias) {
  switch (e) {
    case LtEpilogue::None:
      return CUBLASLT_EPILOGUE_DEFAULT;
    case LtEpilogue::Bias:
      return CUBLASLT_EPILOGUE_BIAS;
    case LtEpilogue::Gelu:
      return has_bias ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_GELU;
    case LtEpilogue::Relu:
      return has_bias ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_RELU;
    case LtEpilogue::GeluAux:
      return has_bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
    case LtEpilogue::ReluAux:
      return has_bias ? CUBLASLT_EPILOGUE_RELU_AUX_BIAS : CUBLASLT_EPILOGUE_RELU_AUX;
    case LtEpilogue::DRelu:
      return has_bias ? CUBLASLT_EPILOGUE_DRELU_BGRAD : CUBLASLT_EPILOGUE_DRELU;
  }
  DPT_FAIL("gemm_lt: unknown epilogue {}", static_cast<int>(e));
}

bool uses_aux(LtEpilogue e) { return e == LtEpilogue::GeluAux || e == LtEpilogue::ReluAux || e == LtEpilogue::DRelu; }
bool is_relu(LtEpilogue e) { return e == LtEpilogue::ReluAux || e == LtEpilogue::DRelu; }

bool row_ok(int64_t elements, DType dtype) { return (elements * static_cast<int64_t>(dtype_size(dtype))) % 16 == 0; }

}  // namespace

int64_t gemm_lt_refusals() {
  std::lock_guard<std::mutex> lock(g_algo_mutex);
  return g_refusals;
}

std::string gemm_lt_last_refusal() {
  std::lock_guard<std::mutex> lock(g_algo_mutex);
  return g_last_refusal;
}

int64_t relu_mask_words(int64_t m, int64_t n) {
  const int64_t ld_bits = (n + 127) / 128 * 128;
  return ld_bits / 32 * m;
}

bool gemm_lt_supported(const Tensor& a, const Tensor& b, const Tensor& c, const LtGemmArgs& args) {
  const DType dt = c.dtype();
  if (dt != DType::Float32 && dt != DType::BFloat16) return false;
  if (a.dtype() != dt || b.dtype() != dt || !c.device().is_cuda() || a.device() != c.device() ||
      b.device() != c.device())
    return false;
  if (!a.is_contiguous() || !b.is_contiguous() || !c.is_contiguous()) return false;
  if (args.m <= 0 || args.n <= 0 || args.k <= 0) return false;
  if (!aligned16(a.data_ptr()) || !aligned16(b.data_ptr()) || !aligned16(c.data_ptr())) return false;
  // Row lengths as stored: A's is k (m when transposed), B's is n (k when transposed), C's n.
  if (!row_ok(args.transpose_a ? args.m : args.k, dt) || !row_ok(args.transpose_b ? args.k : args.n, dt) ||
      !row_ok(args.n, dt))
    return false;
  if (args.bias.defined()) {
    if (args.bias.dtype() != dt || args.bias.device() != c.device() || !args.bias.is_contiguous() ||
        !aligned16(args.bias.data_ptr()))
      return false;
  }
  if (args.addend.defined()) {
    if (args.epilogue != LtEpilogue::None && args.epilogue != LtEpilogue::Bias) return false;
    if (args.addend.dtype() != dt || args.addend.device() != c.device() || !args.addend.is_contiguous() ||
        !aligned16(args.addend.data_ptr()) || args.addend.numel() != args.m * args.n)
      return false;
  }
  if (uses_aux(args.epilogue)) {
    if (!args.aux.defined() || args.aux.device() != c.device() || !args.aux.is_contiguous() ||
        !aligned16(args.aux.data_ptr()))
      return false;
    // The GELU aux's leading dimension (n) must be a multiple of 8 elements.
    if (!is_relu(args.epilogue) && args.n % 8 != 0) return false;
  }
  return true;
}

bool gemm_lt(const Tensor& a, const Tensor& b, const Tensor& c, const LtGemmArgs& args) {
  DPT_CHECK(gemm_lt_supported(a, b, c, args),
            "gemm_lt (CUDA): operands {} {}, {} {}, {} {} do not meet cuBLASLt's requirements (check "
            "gemm_lt_supported first)",
            shape_str(a.shape()), dtype_name(a.dtype()), shape_str(b.shape()), dtype_name(b.dtype()),
            shape_str(c.shape()), dtype_name(c.dtype()));
  const int64_t m = args.m, n = args.n, k = args.k;
  DPT_CHECK(a.numel() >= m * k && b.numel() >= k * n && c.numel() >= m * n,
            "gemm_lt (CUDA): [{}, {}] @ [{}, {}] overruns the operands", m, k, k, n);
  DPT_CHECK(args.epilogue != LtEpilogue::Bias || args.bias.defined(),
            "gemm_lt (CUDA): this epilogue needs a bias tensor");
  if (args.bias.defined()) {
    DPT_CHECK(args.bias.numel() == n, "gemm_lt (CUDA): bias of {} elements, expected {}", args.bias.numel(), n);
  }
  if (uses_aux(args.epilogue)) {
    if (is_relu(args.epilogue)) {
      DPT_CHECK(args.aux.dtype() == DType::Int32 && args.aux.numel() >= relu_mask_words(m, n),
                "gemm_lt (CUDA): ReLU mask of {} {} elements, expected {} int32 words", args.aux.numel(),
                dtype_name(args.aux.dtype()), relu_mask_words(m, n));
    } else {
      DPT_CHECK(args.aux.dtype() == c.dtype() && args.aux.numel() >= m * n,
                "gemm_lt (CUDA): GELU aux of {} {} elements, expected {} {}", args.aux.numel(),
                dtype_name(args.aux.dtype()), m * n, dtype_name(c.dtype()));
    }
  }
  const int device = device_of(c, {&a, &b, &args.bias, &args.aux, &args.addend}, "gemm_lt");
  cuda::DeviceGuard guard(device);

  const bool tf32 = c.dtype() == DType::Float32 && cuda::allow_tf32();
  const cublasComputeType_t compute = tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  const cudaDataType_t type = c.dtype() == DType::Float32 ? CUDA_R_32F : CUDA_R_16BF;
  const cublasLtEpilogue_t epilogue = lt_epilogue(args.epilogue, args.bias.defined());

  // Swapped operands (see the top): cuBLASLt's A is our B, its B our A; each layout is the stored
  // matrix in column-major terms (rows = our row length).
  MatmulDesc desc(compute, CUDA_R_32F);
  const cublasOperation_t op_lt_a = args.transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_lt_b = args.transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  desc.set(CUBLASLT_MATMUL_DESC_TRANSA, op_lt_a);
  desc.set(CUBLASLT_MATMUL_DESC_TRANSB, op_lt_b);
  desc.set(CUBLASLT_MATMUL_DESC_EPILOGUE, epilogue);
  if (args.bias.defined()) {
    const void* bias_ptr = args.bias.data_ptr();
    desc.set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias_ptr);
  }
  if (uses_aux(args.epilogue)) {
    const void* aux_ptr = args.aux.data_ptr();
    const int64_t aux_ld = is_relu(args.epilogue) ? (n + 127) / 128 * 128 : n;
    desc.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, aux_ptr);
    desc.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, aux_ld);
  }
  Layout lt_a(type, args.transpose_b ? k : n, args.transpose_b ? n : k, args.transpose_b ? k : n);
  Layout lt_b(type, args.transpose_a ? m : k, args.transpose_a ? k : m, args.transpose_a ? m : k);
  Layout lt_d(type, n, m, n);

  cudaStream_t stream = cuda::current_stream(device);
  size_t workspace_bytes = 0;
  void* workspace = cuda::gemm_workspace(stream, device, &workspace_bytes);
  cublasLtHandle_t handle = cuda::cublaslt_handle(device);

  auto aligned256 = [](const Tensor& t) {
    return !t.defined() || (reinterpret_cast<uintptr_t>(t.data_ptr()) & 255) == 0;
  };
  const bool epilogue_aligned256 = aligned256(args.bias) && aligned256(args.aux);
  const bool has_addend = args.addend.defined();
  const AlgoKey key{device,   c.dtype(), m,    n,
                    k,        args.transpose_a, args.transpose_b,
                    epilogue, tf32,      epilogue_aligned256, has_addend};
  std::optional<cublasLtMatmulAlgo_t> algo;
  bool cached = false;
  {
    std::lock_guard<std::mutex> lock(g_algo_mutex);
    auto it = g_algos.find(key);
    if (it != g_algos.end()) {
      algo = it->second;
      cached = true;
    }
  }
  if (!cached) {
    Preference pref(workspace_bytes);
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(handle, desc.get(), lt_a.get(), lt_b.get(), lt_d.get(),
                                                                 lt_d.get(), pref.get(), 1, &result, &found);
    // No algorithm (NOT_SUPPORTED, or a combination this cuBLASLt version rejects as invalid): the
    // caller falls back to the unfused path, so training goes on; the refusal is counted and described
    // for tests and benchmarks (gemm_lt_refusals).
    if (status == CUBLAS_STATUS_SUCCESS && found > 0) algo = result.algo;
    std::lock_guard<std::mutex> lock(g_algo_mutex);
    g_algos[key] = algo;
    if (!algo) {
      ++g_refusals;
      g_last_refusal = fmt::format("{} [{}, {}] x [{}, {}]{} -> [{}, {}], epilogue {}: {} ({} algorithms)",
                                   dtype_name(c.dtype()), args.transpose_a ? k : m, args.transpose_a ? m : k,
                                   args.transpose_b ? n : k, args.transpose_b ? k : n, tf32 ? " tf32" : "", m, n,
                                   static_cast<int>(epilogue), cublasGetStatusString(status), found);
    }
  }
  if (!algo) return false;

  KernelTimer timer("gemm_lt", true);
  const float alpha = 1.0f, beta = has_addend ? 1.0f : 0.0f;
  // beta = 0: C is not read; it is passed as D's own buffer and layout, as cuBLASLt requires for
  // in-place-capable calls. With an addend, C is the addend, laid out as D.
  const void* c_in = has_addend ? args.addend.data_ptr() : c.data_ptr();
  DPT_CUBLAS_CHECK(cublasLtMatmul(handle, desc.get(), &alpha, b.data_ptr(), lt_a.get(), a.data_ptr(), lt_b.get(), &beta,
                                  c_in, lt_d.get(), c.data_ptr(), lt_d.get(), &*algo, workspace, workspace_bytes,
                                  stream));
  return true;
}

}  // namespace dpt::cuda_kernels
