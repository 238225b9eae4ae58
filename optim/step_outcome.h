#pragma once
// A training step's outcome, computed where the gradients are, so that a trainer never waits for the
// device between steps: the update reads whether to run and how far to scale the gradients from device
// memory (Optimizer::set_gate), and the host reads the loss and the norm later, while the next step runs.
#include "core/tensor.h"

namespace dpt::optim {

// A step is decided in two parts. The agreement, float64 [2] = {the step's mean loss, stop request}, is
// what ranks sum: it exists once the forward pass has run, so a trainer sums it over ranks behind the
// compute of backward. The outcome then adds what only the gradients tell.
//
// Entries of the float64 [kStepOutcomeSize] tensor step_outcome() returns; {kSkip, kGradScale} is the
// update's gate, in that order.
enum StepOutcomeEntry : int64_t {
  kStepLoss = 0,   // the agreement's loss: the step's mean loss, summed over ranks (divide by the world size)
  kStepStop = 1,   // the agreement's stop: nonzero when some rank was asked to stop
  kStepSkip = 2,   // 1 when the agreed loss or the gradient norm is not finite (a non-finite loss on any rank
                   // makes the sum non-finite, so every rank skips alike)
  kGradScale = 3,  // clip_factor(norm, max_norm): the factor the update scales every gradient by
  kGradNorm = 4,   // the global gradient norm before clipping
  kStepOutcomeSize = 5,
};

// `loss_sum`: float32 [] or [1], the micro-batches' losses summed (the mean loss is loss_sum /
// micro_batches); `stop`: 1 when this process was asked to stop, else 0, read when the device computes the
// agreement: page-locked host memory on a GPU (a replayed CUDA graph reads it afresh every replay). On the
// device of `loss_sum`; enqueued without waiting.
Tensor step_agreement(const Tensor& loss_sum, int64_t micro_batches, const double* stop);

// `agreed`: step_agreement's tensor, summed over ranks or not; `grad_sum_of_squares`: float64 [1]
// (grad_clip.h); max_norm <= 0: no clipping. On the device of `grad_sum_of_squares`; enqueued without
// waiting.
Tensor step_outcome(const Tensor& agreed, const Tensor& grad_sum_of_squares, double max_norm);

}  // namespace dpt::optim
