#include "optim/adam.h"

#include <cmath>

#include "core/error.h"
#include "core/factory.h"
#ifdef DPT_HAVE_CUDA
#include "optim/cuda/fused_kernels.h"
#endif

namespace dpt::optim {

namespace {

template <class T>
void adam_cpu(T* p, const T* grad, T* m, T* v, int64_t n, double lr, double b1, double b2, double eps, double wd,
              bool decoupled, double bc1, double bc2) {
  for (int64_t i = 0; i < n; ++i) {
    double w = static_cast<double>(p[i]);
    double g = static_cast<double>(grad[i]);
    if (decoupled) {
      w *= 1.0 - lr * wd;
    } else {
      g += wd * w;
    }
    double mi = b1 * static_cast<double>(m[i]) + (1.0 - b1) * g;
    double vi = b2 * static_cast<double>(v[i]) + (1.0 - b2) * g * g;
    m[i] = static_cast<T>(mi);
    v[i] = static_cast<T>(vi);
    p[i] = static_cast<T>(w - lr * (mi / bc1) / (std::sqrt(vi / bc2) + eps));
  }
}

}  // namespace

Adam::Adam(const NamedTensors& params, const AdamOptions& options)
    : Adam(std::vector<ParamGroup>{ParamGroup{params, options.weight_decay, 1.0}}, options, false) {}

Adam::Adam(std::vector<ParamGroup> groups, const AdamOptions& options, bool decoupled_weight_decay)
    : Optimizer(std::move(groups), options.lr, {"exp_avg", "exp_avg_sq"}),
      options_(options),
      decoupled_(decoupled_weight_decay) {
  DPT_CHECK(options.beta1 >= 0 && options.beta1 < 1 && options.beta2 >= 0 && options.beta2 < 1,
            "Adam: betas must be in [0, 1), got ({}, {})", options.beta1, options.beta2);
}

AdamW::AdamW(const NamedTensors& params, const AdamOptions& options)
    : Adam(std::vector<ParamGroup>{ParamGroup{params, options.weight_decay, 1.0}}, options, true) {}

AdamW::AdamW(std::vector<ParamGroup> groups, const AdamOptions& options) : Adam(std::move(groups), options, true) {}

void Adam::count_steps_on_device() {
  // A ZeRO shard may leave a group without pieces on this rank: take the device of any parameter.
  Device device = Device::cpu();
  for (const auto& group : param_groups())
    if (!group.params.empty()) device = group.params.front().second.device();
  DPT_CHECK(device.is_cuda(), "Adam: count_steps_on_device needs parameters on a CUDA device (it has none)");
  for (const auto& group : param_groups())
    for (const auto& [name, p] : group.params)
      DPT_CHECK(p.device() == device && device.is_cuda(),
                "Adam: count_steps_on_device needs every parameter on one CUDA device; '{}' is on {}", name,
                p.device().str());
  const TensorOptions on_device = TensorOptions{}.with_device(device);
  device_step_ = from_vector<int64_t>({Optimizer::step_count()}, {1}, on_device.with_dtype(DType::Int64));
  device_bias_corrections_ = zeros({2}, on_device.with_dtype(DType::Float32));
}

bool Adam::reads_gate_on_device() const {
  // A ZeRO shard may hold no pieces at all on this rank: its gate is then read on the host.
  bool any = false;
  for (size_t g = 0; g < param_groups().size(); ++g) {
    if (!applies_grad_scale(g)) return false;
    any = any || !param_groups()[g].params.empty();
  }
  return any;
}

int64_t Adam::step_count() const {
  if (!device_step_.defined()) return Optimizer::step_count();
  return static_cast<int64_t>(device_step_.item());
}

void Adam::on_set_gate() {
  if (!gate().defined() || !reads_gate_on_device()) return;
  if (!device_step_.defined()) count_steps_on_device();
  DPT_CHECK(gate().device() == device_step_.device(), "Adam: the gate is on {}, the parameters on {}",
            gate().device().str(), device_step_.device().str());
}

void Adam::on_load_step() {
  if (device_step_.defined()) device_step_.copy_(from_vector<int64_t>({Optimizer::step_count()}, {1}));
}

// The gate the kernels read, or null when the host decides (no gate, or one read on the host).
const double* Adam::device_gate() const {
  return gate().defined() && reads_gate_on_device() ? gate().data<double>() : nullptr;
}

void Adam::on_begin_step() {
  if (!device_step_.defined()) return;
#ifdef DPT_HAVE_CUDA
  cuda::adam_advance_step(device_step_.data<int64_t>(), device_bias_corrections_.data<float>(), options_.beta1,
                          options_.beta2, device_gate());
#endif
}

bool Adam::fuses_twins(size_t g) const {
  const ParamGroup& group = param_groups()[g];
  for (size_t i = 0; i < group.params.size(); ++i) {
    const Tensor& p = group.params[i].second;
    if (!p.device().is_cuda() || p.dtype() != DType::Float32 || twin(g, i).dtype() != DType::BFloat16) return false;
  }
  return true;
}

bool Adam::applies_grad_scale(size_t g) const {
  for (const auto& [name, p] : param_groups()[g].params)
    if (!p.device().is_cuda()) return false;
  return true;
}

void Adam::update_group(size_t g, int64_t step) {
  const ParamGroup& group = param_groups()[g];
  const double lr = this->lr() * group.lr_scale;
  const double bc1 = 1.0 - std::pow(options_.beta1, static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(options_.beta2, static_cast<double>(step));
  const bool fused_twins = has_compute_twins() && fuses_twins(g);
  std::vector<float*> dp, dm, dv;
  std::vector<const float*> dg;
  std::vector<const void*> dg_bf16;
  std::vector<void*> dtwin;
  std::vector<int64_t> dn;
  for (size_t i = 0; i < group.params.size(); ++i) {
    if (!selected(g, i)) continue;
    const auto& [name, p] = group.params[i];
    Tensor tw = fused_twins ? twin(g, i) : Tensor();
    Tensor grad = fused_twins ? tw.grad() : p.grad();
    if (!grad.defined()) continue;
    const Tensor& m = state_[g][i][0];
    const Tensor& v = state_[g][i][1];
    if (p.device().is_cuda()) {
      DPT_CHECK(p.dtype() == DType::Float32, "Adam: CUDA parameter '{}' is {}; keep float32 masters (MixedPrecision)",
                name, dtype_name(p.dtype()));
      dp.push_back(p.data<float>());
      if (fused_twins) {
        dg_bf16.push_back(grad.data_ptr());
        dtwin.push_back(tw.data_ptr());
      } else {
        dg.push_back(grad.data<float>());
      }
      dm.push_back(m.data<float>());
      dv.push_back(v.data<float>());
      dn.push_back(p.numel());
    } else if (p.dtype() == DType::Float32) {
      adam_cpu(p.data<float>(), grad.data<float>(), m.data<float>(), v.data<float>(), p.numel(), lr, options_.beta1,
               options_.beta2, options_.eps, group.weight_decay, decoupled_, bc1, bc2);
    } else if (p.dtype() == DType::Float64) {
      adam_cpu(p.data<double>(), grad.data<double>(), m.data<double>(), v.data<double>(), p.numel(), lr, options_.beta1,
               options_.beta2, options_.eps, group.weight_decay, decoupled_, bc1, bc2);
    } else {
      DPT_FAIL("Adam: parameter '{}' is {}; update float32 masters instead (MixedPrecision)", name,
               dtype_name(p.dtype()));
    }
  }
  if (dp.empty()) return;
#ifdef DPT_HAVE_CUDA
  cuda::AdamParams hp;
  hp.lr = static_cast<float>(lr);
  hp.beta1 = static_cast<float>(options_.beta1);
  hp.beta2 = static_cast<float>(options_.beta2);
  hp.eps = static_cast<float>(options_.eps);
  hp.weight_decay = static_cast<float>(group.weight_decay);
  hp.bias_correction1 = static_cast<float>(bc1);
  hp.bias_correction2 = static_cast<float>(bc2);
  if (device_bias_corrections_.defined()) hp.bias_corrections = device_bias_corrections_.data<float>();
  hp.decoupled = decoupled_;
  hp.grad_scale = static_cast<float>(grad_scale());
  hp.gate = device_gate();
  if (fused_twins) {
    cuda::adam_update_bf16_twins(dp, dg_bf16, dm, dv, dtwin, dn, hp);
  } else {
    cuda::adam_update(dp, dg, dm, dv, dn, hp);
  }
#else
  DPT_FAIL("Adam: CUDA parameters in a build without CUDA");
#endif
}

}  // namespace dpt::optim
