// Softmax and log-softmax over the last dimension; backward uses only the saved output.
#include "core/autograd.h"
#include "core/error.h"
#include "core/kernels.h"
#include "core/op_helpers.h"
#include "core/ops.h"

namespace dpt {

namespace {

Tensor softmax_impl(const char* op, const Tensor& x, bool log) {
  detail::check_floating(op, x);
  DPT_CHECK(x.dim() >= 1, "{}: expected a tensor of rank >= 1, found shape {}", op, shape_str(x.shape()));
  const int64_t n = x.size(-1), rows = n == 0 ? 0 : x.numel() / n;
  Tensor out = detail::empty_as(x, x.shape());
  kernels::softmax(detail::contiguous_data(x.detach()), out, rows, n, log);
  Tensor so = out.detach();
  record_op(log ? "LogSoftmaxBackward" : "SoftmaxBackward", {x}, {out},
            [so, rows, n, log](const std::vector<Tensor>& g) {
              Tensor gx = detail::empty_as(so, so.shape());
              kernels::softmax_backward(detail::contiguous_data(g[0]), so, gx, rows, n, log);
              return std::vector<Tensor>{gx};
            });
  return out;
}

}  // namespace

Tensor softmax(const Tensor& x) { return softmax_impl("softmax", x, false); }
Tensor log_softmax(const Tensor& x) { return softmax_impl("log_softmax", x, true); }

}  // namespace dpt
