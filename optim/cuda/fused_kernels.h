#pragma once
// Fused multi-tensor CUDA updates (implemented in fused_kernels.cu, built only with CUDA). Host-side
// declarations only, so CPU code can call them behind DPT_HAVE_CUDA.
//
// Multi-tensor apply: the host packs pointers and sizes of up to kMaxTensors tensors, with the count
// of chunks before each, into one kernel argument struct; one launch of one block per chunk then
// updates all of them (a group with more tensors takes a few launches, never one per tensor). Tensors
// are contiguous (views at any offset are fine: unaligned ones take a scalar path) on the current
// device; float32 unless said otherwise; work goes on the current stream.
#include <cstdint>
#include <vector>

namespace dpt::optim::cuda {

struct AdamParams {
  float lr = 1e-3f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0.f;
  float bias_correction1 = 1.f, bias_correction2 = 1.f;  // 1 - beta^t
  bool decoupled = false;                                // AdamW: p *= 1 - lr * wd; Adam: g += wd * p
  float grad_scale = 1.f;  // every gradient is read as grad_scale * g (clipping: optim/optimizer.h)
  // Device memory holding {1 - beta1^t, 1 - beta2^t}: when set, the kernels read the corrections there
  // instead of the two fields above, so an update captured in a CUDA graph uses each replay's step.
  const float* bias_corrections = nullptr;
  // Device memory holding {skip, gradient scale} (a trainer's step gate, optim/optimizer.h set_gate): when
  // set, a nonzero skip leaves every tensor untouched and the scale replaces grad_scale.
  const double* gate = nullptr;
};
// On the device: step += 1, then bias_corrections = {1 - beta1^step, 1 - beta2^step} (in double, rounded
// to float, as the host computes them). One thread; the step's first launch. With a gate ({skip, scale},
// see AdamParams) whose skip is nonzero, nothing changes: a skipped step is not counted.
void adam_advance_step(int64_t* step, float* bias_corrections, double beta1, double beta2,
                       const double* gate = nullptr);
void adam_update(const std::vector<float*>& params, const std::vector<const float*>& grads,
                 const std::vector<float*>& exp_avg, const std::vector<float*>& exp_avg_sq,
                 const std::vector<int64_t>& sizes, const AdamParams& hp);

// Mixed precision without float32 gradient copies: the float32 masters `params` read their gradients
// from the bf16 model parameters' gradients and write their updated values, rounded to nearest even,
// into those bf16 parameters (`twins`) in the same pass (optim/optimizer.h, set_compute_twins).
void adam_update_bf16_twins(const std::vector<float*>& params, const std::vector<const void*>& grads_bf16,
                            const std::vector<float*>& exp_avg, const std::vector<float*>& exp_avg_sq,
                            const std::vector<void*>& twins_bf16, const std::vector<int64_t>& sizes,
                            const AdamParams& hp);

// Speculative updates: AdamW through bf16 twins run before the step is decided, so that nothing has to read
// the gradients first (optim/adam.h, Adam::speculate). Every master and moment has a second copy; the update
// reads the copies that hold the state (`current`) and writes the others, writes the twins, and sums the
// squares of the gradients it reads. adam_speculation_resolve then decides the step from those sums and
// keeps it (the written copies then hold the state and the step is counted) or skips it (the twins are
// rounded again from the state).
struct AdamSpeculation {
  int64_t* step = nullptr;  // device: the steps counted so far; this update is step *step + 1
  double beta1 = 0.9, beta2 = 0.999;
  int* current = nullptr;      // device: 0 when the first copies hold the state, 1 when the second do
  double* partials = nullptr;  // device: one float64 per chunk of every tensor, the chunk's sum of squares
};
struct SecondCopies {
  std::vector<float*> params, exp_avg, exp_avg_sq;
};
// A null gradient: the tensor has none this step; its state is carried into the written copies. The
// tensors' partial sums go to spec.partials[first_block, first_block + chunk_count(sizes)).
void adam_update_speculative(const std::vector<float*>& params, const std::vector<const void*>& grads_bf16,
                             const std::vector<float*>& exp_avg, const std::vector<float*>& exp_avg_sq,
                             const std::vector<void*>& twins_bf16, const SecondCopies& second,
                             const std::vector<int64_t>& sizes, const AdamParams& hp, const AdamSpeculation& spec,
                             int64_t first_block);
// The outcome (float64 outcome[5], as step_outcome writes it, no clipping) from the agreement and the first
// `partials` partial sums; a kept step is counted (step, bias_corrections as adam_advance_step writes them)
// and current = 1 - current; a skipped one rounds the twins again from the masters that hold the state.
void adam_speculation_resolve(const AdamSpeculation& spec, int64_t partials, const double* agreed, double* outcome,
                              float* bias_corrections, const std::vector<float*>& params,
                              const std::vector<float*>& second_params, const std::vector<void*>& twins_bf16,
                              const std::vector<int64_t>& sizes);
// The state into the first copies (a copy when the second hold it), then current = 0.
void adam_speculation_settle(const std::vector<float*>& params, const std::vector<float*>& exp_avg,
                             const std::vector<float*>& exp_avg_sq, const SecondCopies& second,
                             const std::vector<int64_t>& sizes, int* current);
// The number of chunks (partial sums) of tensors of these sizes.
int64_t chunk_count(const std::vector<int64_t>& sizes);

struct SgdParams {
  float lr = 1e-2f, momentum = 0.f, weight_decay = 0.f;
  bool nesterov = false;
};
// `momentum_buffers` is empty when momentum == 0.
void sgd_update(const std::vector<float*>& params, const std::vector<const float*>& grads,
                const std::vector<float*>& momentum_buffers, const std::vector<int64_t>& sizes, const SgdParams& hp);

// sum over all tensors of sum(x^2), reduced deterministically (fixed block order); waits for the result.
// bf16 tensors are read as float32 (exactly), so they sum as their float32 copies would.
double sum_of_squares(const std::vector<const float*>& tensors, const std::vector<int64_t>& sizes);
double sum_of_squares_bf16(const std::vector<const void*>& tensors, const std::vector<int64_t>& sizes);
// The same sum over float32 and bf16 tensors together, written to device memory `out` (float64) behind the
// work already on the stream; nothing waits for it.
void sum_of_squares_into(const std::vector<const float*>& tensors, const std::vector<int64_t>& sizes,
                         const std::vector<const void*>& tensors_bf16, const std::vector<int64_t>& sizes_bf16,
                         double* out);
// A training step's agreement, what ranks sum (float64 out[2] = {loss, stop}; optim/step_outcome.h):
// loss = *loss_sum / micro_batches, stop = *stop, read when the kernel runs (`stop` may be page-locked host
// memory). One thread.
void step_agreement(const float* loss_sum, int64_t micro_batches, const double* stop, double* out);
// A training step's outcome from its agreement and squared gradient norm, in device memory (float64
// out[5] = {loss, stop, bad, gradient scale, gradient norm}): loss and stop as agreed, norm =
// sqrt(*sum_of_squares), bad = 1 when the loss or the norm is not finite, scale = clip_factor(norm, max_norm).
// One thread.
void step_outcome(const double* agreed, const double* sum_of_squares, double max_norm, double* out);
// x *= factor for every tensor.
void scale(const std::vector<float*>& tensors, const std::vector<int64_t>& sizes, float factor);

}  // namespace dpt::optim::cuda
