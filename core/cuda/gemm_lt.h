#pragma once
// Matrix products through cuBLASLt with a fused epilogue (bias, GELU/ReLU with their saved "aux", the
// activation gradients, the bias gradient), for dpt::linear (core/ops_linear.cpp). Row-major, like
// kernels::gemm: C[m, n] = op(A) @ op(B), A stored [m, k] ([k, m] when transpose_a), B stored [k, n]
// ([n, k] when transpose_b), all contiguous, float32 or bfloat16 with float32 accumulation (float32 in
// IEEE unless cuda::set_allow_tf32(true), as kernels::gemm).
//
// Epilogues, in row-major terms (cuBLASLt's names in brackets):
//   None         C = AB
//   Bias         C = AB + bias[n], bias broadcast down the rows                            [BIAS]
//   Gelu, Relu   C = act(AB (+ bias)), nothing kept (inference)                      [GELU/RELU(_BIAS)]
//   GeluAux      C = gelu(AB (+ bias)), aux = AB (+ bias) as [m, n] in C's dtype     [GELU_AUX(_BIAS)]
//   ReluAux      C = relu(AB (+ bias)), aux = a bit mask of AB (+ bias) > 0          [RELU_AUX(_BIAS)]
//   DRelu        C = AB * [aux bit]; with bias: bias = column sums of C (length n)    [DRELU(_BGRAD)]
// The GELU is cuBLASLt's tanh approximation (GPT-2's, as dpt::gelu); its float32 arithmetic is not
// bit-identical to core's gelu kernels (see tests/core/linear_op_test.cpp for the tolerances).
#include <cstdint>
#include <string>

#include "core/tensor.h"

namespace dpt::cuda_kernels {

enum class LtEpilogue { None, Bias, Gelu, Relu, GeluAux, ReluAux, DRelu };

struct LtGemmArgs {
  int64_t m = 0, n = 0, k = 0;
  bool transpose_a = false, transpose_b = false;
  LtEpilogue epilogue = LtEpilogue::None;
  // Bias / bias gradient ([n]) in C's dtype; undefined = none. Required for Bias.
  Tensor bias;
  // GeluAux: [m, n] in C's dtype. ReluAux/DRelu: relu_mask_words(m, n) int32 words.
  Tensor aux;
  // With None or Bias only: [m, n] in C's dtype, added before the one rounding to C (cuBLASLt's C
  // operand at beta = 1): C = AB (+ bias) + addend. A residual connection's add inside the GEMM.
  Tensor addend;
};

// Int32 words of the ReLU bit mask of an [m, n] result: cuBLASLt wants its leading dimension (bits
// per row of ours) a multiple of 128.
int64_t relu_mask_words(int64_t m, int64_t n);

// Whether gemm_lt can take these operands at all: float32/bfloat16, one dtype and device, contiguous,
// every pointer 16-byte aligned and every row length a multiple of 16 bytes (cuBLASLt's requirement
// for the epilogues). Callers use the plain path when it says no.
bool gemm_lt_supported(const Tensor& a, const Tensor& b, const Tensor& c, const LtGemmArgs& args);

// Runs the product on the current stream of C's device. Returns false, having launched nothing, when
// cuBLASLt has no algorithm for this combination (the caller then composes the result itself);
// throws on real errors.
bool gemm_lt(const Tensor& a, const Tensor& b, const Tensor& c, const LtGemmArgs& args);

// How many distinct (shape, epilogue) combinations cuBLASLt refused so far, and a description of the
// last one: the fused op then silently takes its fallback, which tests and benchmarks should notice.
int64_t gemm_lt_refusals();
std::string gemm_lt_last_refusal();

// grad_pre = grad_out * act'(pre) elementwise, computed in float and rounded once: for GELU `saved`
// is the pre-activation (the GeluAux aux), for ReLU it is the activation's output (relu(p) > 0 exactly
// where p > 0, so no bit-mask layout needs to be known). All [numel] contiguous, one dtype.
enum class LtActivation { Gelu, Relu };
void activation_backward(const Tensor& grad_out, const Tensor& saved, const Tensor& grad_pre, LtActivation act);
// The same for bfloat16 [m, n] (n a multiple of 8, 16-byte aligned), and in the same pass the bias
// gradient bias_grad[n] = column sums of the rounded grad_pre (float32 sums, deterministic). Returns
// false, doing nothing, for anything else.
bool activation_backward_bias(const Tensor& grad_out, const Tensor& saved, const Tensor& grad_pre,
                              const Tensor& bias_grad, LtActivation act);

}  // namespace dpt::cuda_kernels
