#include "optim/sgd.h"

#include "core/error.h"
#ifdef DPT_HAVE_CUDA
#include "optim/cuda/fused_kernels.h"
#endif

namespace dpt::optim {

namespace {

std::vector<std::string> sgd_state(const SgdOptions& o) {
  return o.momentum != 0 ? std::vector<std::string>{"momentum_buffer"} : std::vector<std::string>{};
}

template <class T>
void sgd_cpu(T* p, const T* grad, T* buf, int64_t n, double lr, double momentum, double wd, bool nesterov) {
  for (int64_t i = 0; i < n; ++i) {
    double g = static_cast<double>(grad[i]) + wd * static_cast<double>(p[i]);
    if (buf) {
      double b = momentum * static_cast<double>(buf[i]) + g;
      buf[i] = static_cast<T>(b);
      g = nesterov ? g + momentum * b : b;
    }
    p[i] = static_cast<T>(static_cast<double>(p[i]) - lr * g);
  }
}

}  // namespace

SGD::SGD(const NamedTensors& params, const SgdOptions& options)
    : SGD(std::vector<ParamGroup>{ParamGroup{params, options.weight_decay, 1.0}}, options) {}

SGD::SGD(std::vector<ParamGroup> groups, const SgdOptions& options)
    : Optimizer(std::move(groups), options.lr, sgd_state(options)), options_(options) {
  DPT_CHECK(!options.nesterov || options.momentum > 0, "SGD: Nesterov needs momentum > 0");
}

void SGD::update_group(size_t g, int64_t) {
  const ParamGroup& group = param_groups()[g];
  const double lr = this->lr() * group.lr_scale;
  const bool has_buf = options_.momentum != 0;
  std::vector<float*> dp, db;
  std::vector<const float*> dg;
  std::vector<int64_t> dn;
  for (size_t i = 0; i < group.params.size(); ++i) {
    if (!selected(g, i)) continue;
    const auto& [name, p] = group.params[i];
    Tensor grad = p.grad();
    if (!grad.defined()) continue;
    Tensor buf = has_buf ? state_[g][i][0] : Tensor();
    if (p.device().is_cuda()) {
      DPT_CHECK(p.dtype() == DType::Float32, "SGD: CUDA parameter '{}' is {}; keep float32 masters (MixedPrecision)",
                name, dtype_name(p.dtype()));
      dp.push_back(p.data<float>());
      dg.push_back(grad.data<float>());
      if (has_buf) db.push_back(buf.data<float>());
      dn.push_back(p.numel());
    } else if (p.dtype() == DType::Float32) {
      sgd_cpu(p.data<float>(), grad.data<float>(), has_buf ? buf.data<float>() : nullptr, p.numel(), lr,
              options_.momentum, group.weight_decay, options_.nesterov);
    } else if (p.dtype() == DType::Float64) {
      sgd_cpu(p.data<double>(), grad.data<double>(), has_buf ? buf.data<double>() : nullptr, p.numel(), lr,
              options_.momentum, group.weight_decay, options_.nesterov);
    } else {
      DPT_FAIL("SGD: parameter '{}' is {}; update float32 masters instead (MixedPrecision)", name,
               dtype_name(p.dtype()));
    }
  }
  if (dp.empty()) return;
#ifdef DPT_HAVE_CUDA
  cuda::SgdParams hp;
  hp.lr = static_cast<float>(lr);
  hp.momentum = static_cast<float>(options_.momentum);
  hp.weight_decay = static_cast<float>(group.weight_decay);
  hp.nesterov = options_.nesterov;
  cuda::sgd_update(dp, dg, db, dn, hp);
#else
  DPT_FAIL("SGD: CUDA parameters in a build without CUDA");
#endif
}

}  // namespace dpt::optim
