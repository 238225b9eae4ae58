// Device dispatch for the kernel interface: CPU tensors go to dpt::cpu, CUDA tensors to
// dpt::cuda_kernels (absent from CPU-only builds, where a CUDA tensor cannot exist).
#include "core/kernels.h"

#include <cstring>

#include "core/cpu/cpu_kernels.h"
#include "core/error.h"
#include "core/kernel_dispatch.h"
#ifdef DPT_HAVE_CUDA
#include "core/cuda/copy.h"
#include "core/cuda/cuda_kernels.h"
#endif

namespace dpt::kernels {

void unary(UnaryOp op, const Tensor& in, const Tensor& out, double scalar) {
  DPT_KERNEL_DISPATCH(out.device(), unary, op, in, out, scalar);
}
void binary(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  DPT_KERNEL_DISPATCH(out.device(), binary, op, a, b, out);
}
void where(const Tensor& cond, const Tensor& a, const Tensor& b, const Tensor& out) {
  DPT_KERNEL_DISPATCH(out.device(), where, cond, a, b, out);
}
void copy_strided(const Tensor& src, const Tensor& dst) { DPT_KERNEL_DISPATCH(dst.device(), copy_strided, src, dst); }
void fill(const Tensor& out, double value) { DPT_KERNEL_DISPATCH(out.device(), fill, out, value); }
void arange(const Tensor& out) { DPT_KERNEL_DISPATCH(out.device(), arange, out); }
void random_normal(const Tensor& out, uint64_t seed, uint64_t offset, double mean, double stddev) {
  DPT_KERNEL_DISPATCH(out.device(), random_normal, out, seed, offset, mean, stddev);
}
void random_uniform(const Tensor& out, uint64_t seed, uint64_t offset, double low, double high) {
  DPT_KERNEL_DISPATCH(out.device(), random_uniform, out, seed, offset, low, high);
}
void dropout(const Tensor& in, const Tensor& out, double p, const PhiloxArgs& rng, const Tensor& residual) {
  DPT_KERNEL_DISPATCH(out.device(), dropout, in, out, p, rng, residual);
}
void advance_counter(const Tensor& counter, uint64_t amount) {
  DPT_KERNEL_DISPATCH(counter.device(), advance_counter, counter, amount);
}
void reduce(ReduceOp op, const Tensor& in, int64_t outer, int64_t n, int64_t inner, const Tensor& out,
            const Tensor& indices) {
  DPT_KERNEL_DISPATCH(out.device(), reduce, op, in, outer, n, inner, out, indices);
}
void max_backward(const Tensor& grad, const Tensor& indices, int64_t outer, int64_t n, int64_t inner,
                  const Tensor& grad_in) {
  DPT_KERNEL_DISPATCH(grad_in.device(), max_backward, grad, indices, outer, n, inner, grad_in);
}
void gemm(const Tensor& a, const Tensor& b, const Tensor& c, const GemmArgs& args) {
  DPT_KERNEL_DISPATCH(c.device(), gemm, a, b, c, args);
}
void softmax(const Tensor& in, const Tensor& out, int64_t rows, int64_t n, bool log) {
  DPT_KERNEL_DISPATCH(out.device(), softmax, in, out, rows, n, log);
}
void softmax_backward(const Tensor& grad_out, const Tensor& out, const Tensor& grad_in, int64_t rows, int64_t n,
                      bool log) {
  DPT_KERNEL_DISPATCH(grad_in.device(), softmax_backward, grad_out, out, grad_in, rows, n, log);
}
void embedding(const Tensor& weight, const Tensor& indices, const Tensor& out) {
  DPT_KERNEL_DISPATCH(out.device(), embedding, weight, indices, out);
}
void embedding_backward(const Tensor& grad_out, const Tensor& indices, const Tensor& grad_weight) {
  DPT_KERNEL_DISPATCH(grad_weight.device(), embedding_backward, grad_out, indices, grad_weight);
}
void gather_rows(const Tensor& src, const Tensor& indices, const Tensor& out) {
  DPT_KERNEL_DISPATCH(out.device(), gather_rows, src, indices, out);
}
void cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index, const Tensor& losses,
                   const Tensor& logsumexp) {
  DPT_KERNEL_DISPATCH(losses.device(), cross_entropy, logits, targets, ignore_index, losses, logsumexp);
}
void cross_entropy_backward(const Tensor& logits, const Tensor& targets, int64_t ignore_index, const Tensor& logsumexp,
                            const Tensor& grad_scale, const Tensor& grad_logits) {
  DPT_KERNEL_DISPATCH(grad_logits.device(), cross_entropy_backward, logits, targets, ignore_index, logsumexp,
                      grad_scale, grad_logits);
}
void cross_entropy_with_grad(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                             const Tensor& grad_scale, const Tensor& losses, const Tensor& logsumexp,
                             const Tensor& grad_logits) {
  DPT_KERNEL_DISPATCH(grad_logits.device(), cross_entropy_with_grad, logits, targets, ignore_index, grad_scale, losses,
                      logsumexp, grad_logits);
}
void scale_unless_one(const Tensor& x, const Tensor& scale) {
  DPT_KERNEL_DISPATCH(x.device(), scale_unless_one, x, scale);
}

void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t nbytes) {
  if (nbytes == 0) return;
  if (dst_device.is_cpu() && src_device.is_cpu()) {
    std::memcpy(dst, src, nbytes);
    return;
  }
#ifdef DPT_HAVE_CUDA
  cuda_kernels::copy_between_devices(dst, dst_device, src, src_device, nbytes);
#else
  DPT_FAIL("copy from {} to {}: this dptrain was built without CUDA", src_device.str(), dst_device.str());
#endif
}

}  // namespace dpt::kernels
