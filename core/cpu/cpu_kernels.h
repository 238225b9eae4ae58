#pragma once
// CPU implementations of the kernel interface (see core/kernel_decls.inc).
#include "core/kernel_types.h"
#include "core/tensor.h"

namespace dpt::cpu {
using kernels::BinaryOp;
using kernels::GemmArgs;
using kernels::ReduceOp;
using kernels::UnaryOp;
#include "core/kernel_decls.inc"
}  // namespace dpt::cpu
