#include "optim/adam.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/factory.h"
#include "optim/step_outcome.h"
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

#ifdef DPT_HAVE_CUDA
// What the speculative kernels read and write besides the tensors (optim/cuda/fused_kernels.h).
cuda::AdamSpeculation speculation(const Tensor& step, const AdamOptions& o, const Tensor& current,
                                  const Tensor& partials) {
  cuda::AdamSpeculation spec;
  spec.step = step.data<int64_t>();
  spec.beta1 = o.beta1;
  spec.beta2 = o.beta2;
  spec.current = current.data<int>();
  spec.partials = partials.data<double>();
  return spec;
}

// The kernels' hyperparameters but the bias corrections and the gate.
cuda::AdamParams kernel_params(const AdamOptions& o, bool decoupled, double lr, double weight_decay,
                               double grad_scale) {
  cuda::AdamParams hp;
  hp.lr = static_cast<float>(lr);
  hp.beta1 = static_cast<float>(o.beta1);
  hp.beta2 = static_cast<float>(o.beta2);
  hp.eps = static_cast<float>(o.eps);
  hp.weight_decay = static_cast<float>(weight_decay);
  hp.decoupled = decoupled;
  hp.grad_scale = static_cast<float>(grad_scale);
  return hp;
}
#endif

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
  if (speculates()) current_.zero_();  // the loaded state is in the first copies
}

// The gate the kernels read, or null when the host decides (no gate, or one read on the host).
const double* Adam::device_gate() const {
  return gate().defined() && reads_gate_on_device() ? gate().data<double>() : nullptr;
}

void Adam::on_begin_step() {
  next_partial_ = 0;
  // A speculative step is counted when it is resolved.
  if (!device_step_.defined() || speculates()) return;
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

void Adam::speculate() {
  if (speculates()) return;
  DPT_CHECK(has_compute_twins(), "Adam: speculative updates go through bf16 compute twins (set_compute_twins)");
  for (size_t g = 0; g < param_groups().size(); ++g)
    DPT_CHECK(fuses_twins(g), "Adam: speculative updates need float32 CUDA masters with bf16 twins (group {})", g);
  if (!device_step_.defined()) count_steps_on_device();
  const Device device = device_step_.device();
  std::vector<int64_t> sizes;
  second_.clear();
  for (const auto& group : param_groups()) {
    second_.emplace_back();
    for (const auto& [name, p] : group.params) {
      // Every element is written before it is read: by the first update, or carried over by it.
      second_.back().push_back({Tensor::empty(p.shape(), p.options()), Tensor::empty(p.shape(), p.options()),
                                Tensor::empty(p.shape(), p.options())});
      sizes.push_back(p.numel());
    }
  }
  current_ = zeros({1}, TensorOptions{}.with_dtype(DType::Int32).with_device(device));
#ifdef DPT_HAVE_CUDA
  partials_ = Tensor::empty({std::max<int64_t>(1, cuda::chunk_count(sizes))},
                            TensorOptions{}.with_dtype(DType::Float64).with_device(device));
#endif
}

struct Adam::AllTensors {
  std::vector<float*> params, exp_avg, exp_avg_sq;
  std::vector<const void*> grads;  // the twins' gradients, null where there is none
  std::vector<void*> twins;
  std::vector<int64_t> sizes;
#ifdef DPT_HAVE_CUDA
  cuda::SecondCopies second;
#endif
};

Adam::AllTensors Adam::tensors_of(size_t first_group, size_t end_group) const {
  AllTensors all;
  for (size_t g = first_group; g < end_group; ++g) {
    for (size_t i = 0; i < param_groups()[g].params.size(); ++i) {
      const Tensor tw = twin(g, i);
      all.params.push_back(param_groups()[g].params[i].second.data<float>());
      all.exp_avg.push_back(state_[g][i][0].data<float>());
      all.exp_avg_sq.push_back(state_[g][i][1].data<float>());
      all.grads.push_back(tw.grad().defined() ? tw.grad().data_ptr() : nullptr);
      all.twins.push_back(tw.data_ptr());
      all.sizes.push_back(tw.numel());
#ifdef DPT_HAVE_CUDA
      all.second.params.push_back(second_[g][i][0].data<float>());
      all.second.exp_avg.push_back(second_[g][i][1].data<float>());
      all.second.exp_avg_sq.push_back(second_[g][i][2].data<float>());
#endif
    }
  }
  return all;
}

Tensor Adam::resolve(const Tensor& agreed) {
  DPT_CHECK(speculates(), "Adam: resolve without speculate()");
  DPT_CHECK(agreed.dtype() == DType::Float64 && agreed.numel() == 2 && agreed.is_contiguous() &&
                agreed.device() == current_.device(),
            "Adam: resolve expects step_agreement's float64 [2] on {}", current_.device().str());
  Tensor outcome = Tensor::empty({kStepOutcomeSize}, agreed.options());  // the kernel writes every entry
#ifdef DPT_HAVE_CUDA
  const AllTensors all = tensors_of(0, param_groups().size());
  cuda::adam_speculation_resolve(speculation(device_step_, options_, current_, partials_), next_partial_,
                                 agreed.data<double>(), outcome.data<double>(), device_bias_corrections_.data<float>(),
                                 all.params, all.second.params, all.twins, all.sizes);
#endif
  return outcome;
}

void Adam::settle() const {
  if (!speculates()) return;
#ifdef DPT_HAVE_CUDA
  const AllTensors all = tensors_of(0, param_groups().size());
  cuda::adam_speculation_settle(all.params, all.exp_avg, all.exp_avg_sq, all.second, all.sizes, current_.data<int>());
#endif
}

void Adam::update_group_speculatively(size_t g) {
  for (size_t i = 0; i < param_groups()[g].params.size(); ++i)
    DPT_CHECK(selected(g, i), "Adam: a speculative step updates every parameter at once (step(), not update())");
#ifdef DPT_HAVE_CUDA
  const AllTensors group = tensors_of(g, g + 1);
  const cuda::AdamParams hp = kernel_params(options_, decoupled_, lr() * param_groups()[g].lr_scale,
                                            param_groups()[g].weight_decay, grad_scale());
  cuda::adam_update_speculative(group.params, group.grads, group.exp_avg, group.exp_avg_sq, group.twins, group.second,
                                group.sizes, hp, speculation(device_step_, options_, current_, partials_),
                                next_partial_);
  next_partial_ += cuda::chunk_count(group.sizes);
#endif
}

void Adam::update_group(size_t g, int64_t step) {
  if (speculates()) {
    update_group_speculatively(g);
    return;
  }
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
  cuda::AdamParams hp = kernel_params(options_, decoupled_, lr, group.weight_decay, grad_scale());
  hp.bias_correction1 = static_cast<float>(bc1);
  hp.bias_correction2 = static_cast<float>(bc2);
  if (device_bias_corrections_.defined()) hp.bias_corrections = device_bias_corrections_.data<float>();
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
