#pragma once
// The differentiable operations. Each works on CPU and CUDA tensors of the floating dtypes (integer
// tensors where they are indices), records its backward when an input requires grad, and names the op
// and both operands' shapes/dtypes/devices when its inputs do not fit.
#include <vector>

#include "core/factory.h"
#include "core/tensor.h"

namespace dpt {

// --- elementwise, with NumPy broadcasting -----------------------------------------------------
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor add(const Tensor& a, double b);
Tensor mul(const Tensor& a, double b);
Tensor neg(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor pow(const Tensor& x, double exponent);
Tensor relu(const Tensor& x);
Tensor gelu(const Tensor& x);  // tanh approximation, as GPT-2
// Inverted dropout: each element zeroed with probability p, survivors scaled by 1 / (1 - p). The mask
// is drawn from `gen` inside the kernel and drawn again by the backward from the same counters (one
// kernel each way, nothing stored); the same generator state gives the same mask on CPU and GPU, and
// inside a captured CUDA graph a fresh one every replay (Generator::begin_capture).
Tensor dropout(const Tensor& x, double p, Generator& gen);
// residual + dropout(x, p, gen), one kernel each way (x and the residual of one shape, dtype and device):
// a transformer's dropout before its skip connection. The sum is rounded once, in the dtype's
// accumulation type, on CPU and GPU alike.
Tensor dropout_add(const Tensor& x, const Tensor& residual, double p, Generator& gen);
Tensor tanh(const Tensor& x);
Tensor sigmoid(const Tensor& x);
Tensor sign(const Tensor& x);  // -1, 0 or 1 (NaN stays NaN); zero gradient everywhere, as PyTorch
Tensor abs(const Tensor& x);   // gradient sign(x) * g, so 0 at x = 0
// cond != 0 ? a : b elementwise, the three broadcast together. cond may hold any dtype (a mask of
// 0/1, or values tested for nonzero); a and b share dtype and device. The gradient goes to a where
// cond holds and to b elsewhere; cond gets none.
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
// a + weight * (b - a), as torch.lerp, composed from add/sub/mul so its gradients (to a, b and a
// tensor weight) are theirs. With a scalar weight >= 0.5 it is computed as b - (1 - weight) (b - a), so
// weight 1 gives b exactly.
Tensor lerp(const Tensor& a, const Tensor& b, double weight);
Tensor lerp(const Tensor& a, const Tensor& b, const Tensor& weight);

inline Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
inline Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
inline Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
inline Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
inline Tensor operator+(const Tensor& a, double b) { return add(a, b); }
inline Tensor operator-(const Tensor& a, double b) { return add(a, -b); }
inline Tensor operator*(const Tensor& a, double b) { return mul(a, b); }
inline Tensor operator*(double a, const Tensor& b) { return mul(b, a); }
inline Tensor operator/(const Tensor& a, double b) { return mul(a, 1.0 / b); }
inline Tensor operator-(const Tensor& x) { return neg(x); }

// --- reductions ------------------------------------------------------------------------------
Tensor sum(const Tensor& x);  // all elements -> shape []
Tensor sum(const Tensor& x, int64_t dim, bool keepdim = false);
Tensor mean(const Tensor& x);
Tensor mean(const Tensor& x, int64_t dim, bool keepdim = false);
Tensor max(const Tensor& x, int64_t dim, bool keepdim = false);     // values; gradient to the argmax
Tensor argmax(const Tensor& x, int64_t dim, bool keepdim = false);  // int64, first maximum wins

// --- matrix products -------------------------------------------------------------------------
// a [.., m, k] @ b [.., k, n] (after optional transposes of the last two dims). Batch dims must match,
// or one side is 2-D and is shared across the batch. Accumulates in float32 for bfloat16 inputs.
Tensor matmul(const Tensor& a, const Tensor& b, bool transpose_a = false, bool transpose_b = false);

// --- linear layers ---------------------------------------------------------------------------
// act(x W^T + b): x [..., in] (or [in]), weight [out, in], bias [out] or undefined -> [..., out]. On the
// CPU (and wherever the fused path cannot run) it is exactly matmul, add, then gelu/relu, so results are
// bit-identical to composing those ops. On CUDA in float32/bfloat16 one cuBLASLt GEMM applies bias and
// activation in its epilogue and backward fuses the bias gradient (core/ops_linear.cpp).
enum class Activation { None, Gelu, Relu };        // Gelu: tanh approximation, as gelu()
Tensor activate(const Tensor& x, Activation act);  // x itself, gelu(x) or relu(x)
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = {}, Activation act = Activation::None);
// residual + (x W^T + b), residual [..., out]: a residual connection's output projection. On CUDA the
// add happens inside the GEMM (cuBLASLt's C operand at beta = 1), rounded once with the product;
// elsewhere it is add(residual, linear(x, weight, bias)). The residual's gradient is the output's.
Tensor linear_residual(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& residual);
// The fused CUDA path is on unless DPT_LINEAR_FUSED=0 (core/flags.h); set_linear_fused overrides
// that for the process (A/B benchmarks and tests).
void set_linear_fused(bool enabled);
bool linear_fused();
// Whether a fused linear with ReLU lets the linear it feeds absorb its backward (the consumer's dh GEMM
// computes the ReLU's backward and bias gradient in its DRELU_BGRAD epilogue, core/ops_linear.cpp). On
// unless DPT_LINEAR_ABSORB=0 (core/flags.h); set_linear_absorb overrides that for the process (tests,
// A/B runs).
void set_linear_absorb(bool enabled);
bool linear_absorb();

// --- softmax family (last dimension; statistics in float32 for bfloat16) --------------------------
Tensor softmax(const Tensor& x);
Tensor log_softmax(const Tensor& x);

// --- shape ----------------------------------------------------------------------------------
Tensor reshape(const Tensor& x, const Shape& shape);
Tensor transpose(const Tensor& x, int64_t d0, int64_t d1);
Tensor permute(const Tensor& x, const std::vector<int64_t>& dims);
Tensor concat(const std::vector<Tensor>& xs, int64_t dim);
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim);
Tensor slice(const Tensor& x, int64_t dim, int64_t start, int64_t end);  // [start, end) along dim

// --- lookups and losses ------------------------------------------------------------------------
// weight [num, dim], indices int32/int64 of any shape -> [...indices, dim]; backward scatter-adds.
Tensor embedding(const Tensor& weight, const Tensor& indices);
// logits [N, C], targets int32/int64 [N]; mean over targets != ignore_index of -log softmax[target].
// Fused: one pass computes the loss and keeps only per-row statistics for backward.
Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index = -100);
// The same for logits handed over (a temporary such as `cross_entropy(model(x), y)`, or std::move'd):
// when a backward will follow and nothing else holds them, the forward overwrites them with their
// gradient in the same pass (see core/ops_loss.cpp); otherwise exactly the overload above.
Tensor cross_entropy(Tensor&& logits, const Tensor& targets, int64_t ignore_index = -100);
Tensor mse_loss(const Tensor& prediction, const Tensor& target);  // mean of squared differences

}  // namespace dpt
