#pragma once
// When an optimizer update fed by DDP's gradient exchange runs: one answer for the optimizer in backward
// (overlapped_optimizer.h), ZeRO-1 (zero_optimizer.h) and gathered gradients (gathered_linear_zero.h).

namespace dpt::dist {

enum class UpdateTiming {
  // Inside loss.backward(), at its end: bucket by bucket in index order, as the compute stream (CUDA) or
  // the host (Gloo) waits for each bucket's exchange, so bucket k's update overlaps the exchanges of the
  // buckets after it.
  AtBackwardEnd,
  // Inside loss.backward(), the moment a bucket's exchange is launched (gathered gradients: a layer's
  // gradients are formed), on a side stream (the update stream) that waits for that exchange, so the update
  // overlaps the rest of backward; the compute stream joins the update stream at the end of backward.
  // Safe for an optimizer step: a bucket launches only when its last gradient is final, and by then
  // backward has queued every kernel that reads those parameters. CUDA only; on the CPU, AtBackwardEnd.
  WhenReduced,
  // After backward, in the caller's step() (after clipping, or skipped): what a trainer with gradient-norm
  // clipping needs, as that needs every gradient before any update.
  OnStep,
};

}  // namespace dpt::dist
