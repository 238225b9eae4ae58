#pragma once
// A training step's outcome, computed where the gradients are, so that a trainer never waits for the
// device between steps: the update reads whether to run and how far to scale the gradients from device
// memory (Optimizer::set_gate), and the host reads the loss and the norm later, while the next step runs.
#include "core/tensor.h"

namespace dpt::optim {

// Entries of the float64 [kStepOutcomeSize] tensor step_outcome() returns. The first three are what ranks
// sum (kStepSummed of them), and {kSkip, kGradScale} is the update's gate, in that order.
enum StepOutcomeEntry : int64_t {
  kStepLoss = 0,   // the step's mean loss (summed over ranks: divide by the world size)
  kStepStop = 1,   // 1 when this process was asked to stop (summed: some rank was)
  kStepSkip = 2,   // 1 when the loss or the gradient norm is not finite (summed: on some rank)
  kGradScale = 3,  // clip_factor(norm, max_norm): the factor the update scales every gradient by
  kGradNorm = 4,   // the global gradient norm before clipping
  kStepOutcomeSize = 5,
};
constexpr int64_t kStepSummed = 3;

// `loss_sum`: float32 [] or [1], the micro-batches' losses summed; `grad_sum_of_squares`: float64 [1]
// (grad_clip.h); the mean loss is loss_sum / micro_batches; max_norm <= 0: no clipping.
// On the device of `grad_sum_of_squares`; enqueued without waiting.
Tensor step_outcome(const Tensor& loss_sum, int64_t micro_batches, const Tensor& grad_sum_of_squares, double max_norm,
                    bool stop);

}  // namespace dpt::optim
