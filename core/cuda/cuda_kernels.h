#pragma once
// CUDA implementations of the kernel interface (see core/kernel_decls.inc). Every kernel runs on the
// current stream of the output tensor's device and returns without synchronising the host.
#include "core/kernel_types.h"
#include "core/tensor.h"

namespace dpt::cuda_kernels {
using kernels::BinaryOp;
using kernels::GemmArgs;
using kernels::ReduceOp;
using kernels::UnaryOp;
#include "core/kernel_decls.inc"

// state (int64 [2] on the device) = {rng.seed, rng.offset + *rng.base}: a draw's start as device scalars,
// for a library kernel that reads them when it runs (cuDNN's attention dropout).
void philox_state(const PhiloxArgs& rng, const Tensor& state);
}  // namespace dpt::cuda_kernels
