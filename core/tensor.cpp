#include "core/tensor.h"

#include <numeric>
#include <ostream>
#include <sstream>

#include "core/autograd.h"
#include "core/bfloat16.h"
#include "core/float16.h"
#include "core/error.h"
#include "core/kernels.h"
#include "core/ops.h"

namespace dpt {

AutogradMeta& TensorImpl::autograd_meta() {
  if (!autograd) autograd = std::make_unique<AutogradMeta>();
  return *autograd;
}

Tensor Tensor::empty(const Shape& shape, const TensorOptions& options) {
  for (int64_t d : shape) DPT_CHECK(d >= 0, "empty: negative extent in shape {}", shape_str(shape));
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::make_shared<Storage>(static_cast<size_t>(shape_numel(shape)) * dtype_size(options.dtype),
                                            options.device);
  impl->shape = shape;
  impl->strides = contiguous_strides(shape);
  impl->dtype = options.dtype;
  impl->device = options.device;
  Tensor t(std::move(impl));
  if (options.requires_grad) t.requires_grad_(true);
  return t;
}

Tensor make_view(const Tensor& base, const Shape& shape, const Shape& strides, int64_t offset) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = base.impl()->storage;
  impl->offset = offset;
  impl->shape = shape;
  impl->strides = strides;
  impl->dtype = base.dtype();
  impl->device = base.device();
  return Tensor(std::move(impl));
}

namespace {
const TensorImpl& checked(const std::shared_ptr<TensorImpl>& impl) {
  DPT_CHECK(impl != nullptr, "use of an undefined tensor");
  return *impl;
}
}  // namespace

const Shape& Tensor::shape() const { return checked(impl_).shape; }
const Shape& Tensor::strides() const { return checked(impl_).strides; }
int64_t Tensor::dim() const { return static_cast<int64_t>(shape().size()); }
int64_t Tensor::size(int64_t d) const { return shape()[wrap_dim(d, dim(), "size")]; }
int64_t Tensor::numel() const { return shape_numel(shape()); }
DType Tensor::dtype() const { return checked(impl_).dtype; }
Device Tensor::device() const { return checked(impl_).device; }
TensorOptions Tensor::options() const { return {dtype(), device(), false}; }

bool Tensor::is_contiguous() const {
  const Shape& sh = shape();
  const Shape& st = strides();
  int64_t expected = 1;
  for (size_t i = sh.size(); i-- > 0;) {
    if (sh[i] != 1 && st[i] != expected) return false;
    expected *= sh[i];
  }
  return true;
}

void* Tensor::data_ptr() const {
  const TensorImpl& impl = checked(impl_);
  return static_cast<char*>(impl.storage->data()) + impl.offset * static_cast<int64_t>(dtype_size(impl.dtype));
}

// --- autograd -------------------------------------------------------------------------------

bool Tensor::requires_grad() const {
  const TensorImpl& impl = checked(impl_);
  return impl.autograd && impl.autograd->requires_grad;
}

Tensor& Tensor::requires_grad_(bool value) {
  DPT_CHECK(is_leaf(), "requires_grad_: only leaf tensors can change requires_grad");
  DPT_CHECK(!value || is_floating(dtype()), "requires_grad_: {} tensors cannot require grad", dtype_name(dtype()));
  impl_->autograd_meta().requires_grad = value;
  return *this;
}

bool Tensor::is_leaf() const { return grad_fn() == nullptr; }

std::shared_ptr<Node> Tensor::grad_fn() const {
  const TensorImpl& impl = checked(impl_);
  return impl.autograd ? impl.autograd->grad_fn : nullptr;
}

Tensor Tensor::grad() const {
  checked(impl_);
  TensorImpl& impl = *impl_;
  if (!impl.autograd || !impl.autograd->grad) return Tensor();
  if (impl.autograd->grad_zero_pending) {  // a deferred zero_grad(): whoever reads sees the zeros
    impl.autograd->grad->zero_();
    impl.autograd->grad_zero_pending = false;
  }
  return *impl.autograd->grad;
}

void Tensor::set_grad(const Tensor& grad) const {
  if (grad.defined()) {
    DPT_CHECK(grad.shape() == shape() && grad.dtype() == dtype() && grad.device() == device(),
              "set_grad: gradient {} {} {} does not match tensor {} {} {}", shape_str(grad.shape()),
              dtype_name(grad.dtype()), grad.device().str(), shape_str(shape()), dtype_name(dtype()), device().str());
    DPT_CHECK(grad.is_contiguous(), "set_grad: the gradient must be contiguous");
  }
  AutogradMeta& meta = impl_->autograd_meta();
  meta.grad = grad.defined() ? std::make_shared<Tensor>(grad) : nullptr;
  meta.grad_zero_pending = false;
  meta.grad_written = false;
}

void Tensor::zero_grad(bool set_to_none) const {
  if (!impl_->autograd || !impl_->autograd->grad) return;
  impl_->autograd->grad_written = false;
  if (set_to_none) {
    impl_->autograd->grad.reset();
    impl_->autograd->grad_zero_pending = false;
  } else {
    impl_->autograd->grad_zero_pending = true;  // see AutogradMeta: zeroed by the next write or read
  }
}

void Tensor::backward(const Tensor& grad_output) const { run_backward(*this, grad_output); }

Tensor Tensor::detach() const {
  const TensorImpl& impl = checked(impl_);
  return make_view(*this, impl.shape, impl.strides, impl.offset);
}

void Tensor::register_grad_ready_hook(GradReadyHook hook) const {
  DPT_CHECK(is_leaf() && requires_grad(), "register_grad_ready_hook: only leaves that require grad have hooks");
  impl_->autograd_meta().grad_ready_hooks.push_back(std::move(hook));
}

// --- conversion -------------------------------------------------------------------------------

Tensor Tensor::contiguous() const {
  if (is_contiguous()) return *this;
  Tensor out = empty(shape(), options());
  kernels::copy_strided(*this, out);
  Tensor self = *this;
  record_op("ContiguousBackward", {self}, {out}, [](const std::vector<Tensor>& g) { return std::vector<Tensor>{g[0]}; });
  return out;
}

Tensor Tensor::clone() const {
  Tensor out = empty(shape(), options());
  kernels::copy_strided(*this, out);
  record_op("CloneBackward", {*this}, {out}, [](const std::vector<Tensor>& g) { return std::vector<Tensor>{g[0]}; });
  return out;
}

Tensor Tensor::to(Device target) const {
  if (device() == target) return *this;
  Tensor src = contiguous();
  Tensor out = empty(shape(), options().with_device(target));
  kernels::copy_bytes(out.data_ptr(), target, src.data_ptr(), device(), nbytes());
  Device from = device();
  record_op("ToDeviceBackward", {*this}, {out},
            [from](const std::vector<Tensor>& g) { return std::vector<Tensor>{g[0].to(from)}; });
  return out;
}

Tensor Tensor::to(DType target) const {
  if (dtype() == target) return *this;
  Tensor out = empty(shape(), options().with_dtype(target));
  kernels::copy_strided(*this, out);
  DType from = dtype();
  if (is_floating(target)) {
    record_op("ToDTypeBackward", {*this}, {out},
              [from](const std::vector<Tensor>& g) { return std::vector<Tensor>{g[0].to(from)}; });
  }
  return out;
}

double Tensor::item() const {
  DPT_CHECK(numel() == 1, "item: tensor of shape {} has {} elements, expected 1", shape_str(shape()), numel());
  return to_vector<double>()[0];
}

template <class T>
std::vector<T> Tensor::to_vector() const {
  Tensor host = detach().to(Device::cpu()).contiguous();
  std::vector<T> out(static_cast<size_t>(numel()));
  auto convert = [&](auto* p) {
    for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<T>(static_cast<double>(p[i]));
  };
  switch (dtype()) {
    case DType::Float32: convert(host.data<float>()); break;
    case DType::BFloat16: {
      const bf16* p = host.data<bf16>();
      for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<T>(static_cast<float>(p[i]));
      break;
    }
    case DType::Float16: {
      const f16* p = host.data<f16>();
      for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<T>(static_cast<float>(p[i]));
      break;
    }
    case DType::Float64: convert(host.data<double>()); break;
    case DType::Int32: convert(host.data<int32_t>()); break;
    case DType::Int64: convert(host.data<int64_t>()); break;
  }
  return out;
}
template std::vector<float> Tensor::to_vector<float>() const;
template std::vector<double> Tensor::to_vector<double>() const;
template std::vector<int32_t> Tensor::to_vector<int32_t>() const;
template std::vector<int64_t> Tensor::to_vector<int64_t>() const;

// --- views --------------------------------------------------------------------------------------

Tensor Tensor::reshape(const Shape& requested) const { return dpt::reshape(*this, requested); }
Tensor Tensor::transpose(int64_t d0, int64_t d1) const { return dpt::transpose(*this, d0, d1); }
Tensor Tensor::permute(const std::vector<int64_t>& dims) const { return dpt::permute(*this, dims); }
Tensor Tensor::slice(int64_t start, int64_t end) const { return dpt::slice(*this, 0, start, end); }

Tensor Tensor::operator[](int64_t index) const {
  DPT_CHECK(dim() >= 1, "operator[]: cannot index a 0-d tensor");
  int64_t n = size(0);
  DPT_CHECK(index >= -n && index < n, "operator[]: index {} out of range for first dimension {}", index, n);
  if (index < 0) index += n;
  Shape rest(shape().begin() + 1, shape().end());
  return dpt::slice(*this, 0, index, index + 1).reshape(rest);
}

// --- in place ------------------------------------------------------------------------------------

Tensor& Tensor::copy_(const Tensor& src) {
  DPT_CHECK(src.shape() == shape(), "copy_: source shape {} does not match destination {}", shape_str(src.shape()),
            shape_str(shape()));
  NoGradGuard no_grad;
  Tensor s = src.detach();
  if (s.device() != device()) s = s.contiguous().to(device());
  DPT_CHECK(is_contiguous(), "copy_: the destination must be contiguous (shape {})", shape_str(shape()));
  kernels::copy_strided(s, *this);
  return *this;
}

Tensor& Tensor::zero_() { return fill_(0.0); }

Tensor& Tensor::fill_(double value) {
  DPT_CHECK(is_contiguous(), "fill_: the tensor must be contiguous");
  kernels::fill(*this, value);
  return *this;
}

std::string Tensor::str() const {
  if (!defined()) return "Tensor(undefined)";
  std::ostringstream os;
  os << "Tensor(shape=" << shape_str(shape()) << ", dtype=" << dtype_name(dtype()) << ", device=" << device().str();
  if (numel() <= 64) {
    os << ", values=[";
    auto v = to_vector<double>();
    for (size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
    os << "]";
  }
  if (requires_grad()) os << ", requires_grad";
  os << ")";
  return os.str();
}

std::ostream& operator<<(std::ostream& os, const Tensor& t) { return os << t.str(); }

}  // namespace dpt
