#include "core/factory.h"

#include "core/bfloat16.h"
#include "core/float16.h"
#include "core/error.h"
#include "core/kernels.h"

namespace dpt {

Tensor zeros(const Shape& shape, const TensorOptions& options) { return full(shape, 0.0, options); }
Tensor ones(const Shape& shape, const TensorOptions& options) { return full(shape, 1.0, options); }

Tensor full(const Shape& shape, double value, const TensorOptions& options) {
  Tensor t = Tensor::empty(shape, options.with_requires_grad(false));
  kernels::fill(t, value);
  if (options.requires_grad) t.requires_grad_(true);
  return t;
}

Tensor arange(int64_t end, const TensorOptions& options) {
  Tensor t = Tensor::empty({end}, options.with_requires_grad(false));
  kernels::arange(t);
  return t;
}

Tensor zeros_like(const Tensor& t) { return zeros(t.shape(), t.options()); }
Tensor ones_like(const Tensor& t) { return ones(t.shape(), t.options()); }
Tensor empty_like(const Tensor& t) { return Tensor::empty(t.shape(), t.options()); }
Tensor scalar_tensor(double value, const TensorOptions& options) { return full({}, value, options); }

Tensor from_blob(void* data, const Shape& shape, const TensorOptions& options, std::function<void(void*)> release) {
  for (int64_t d : shape) DPT_CHECK(d >= 0, "from_blob: negative extent in shape {}", shape_str(shape));
  auto impl = std::make_shared<TensorImpl>();
  const size_t nbytes = static_cast<size_t>(shape_numel(shape)) * dtype_size(options.dtype);
  impl->storage = std::make_shared<Storage>(data, nbytes, options.device, std::move(release));
  impl->shape = shape;
  impl->strides = contiguous_strides(shape);
  impl->dtype = options.dtype;
  impl->device = options.device;
  Tensor t(std::move(impl));
  if (options.requires_grad) t.requires_grad_(true);
  return t;
}

template <class T>
Tensor from_vector(const std::vector<T>& values, const Shape& shape, const TensorOptions& options) {
  DPT_CHECK(static_cast<int64_t>(values.size()) == shape_numel(shape),
            "from_vector: {} values do not fill shape {}", values.size(), shape_str(shape));
  Tensor host = Tensor::empty(shape, options.with_device(Device::cpu()).with_requires_grad(false));
  auto fill_as = [&](auto* p) {
    using Out = std::remove_pointer_t<decltype(p)>;
    for (size_t i = 0; i < values.size(); ++i) p[i] = static_cast<Out>(static_cast<double>(values[i]));
  };
  switch (options.dtype) {
    case DType::Float32: fill_as(host.data<float>()); break;
    case DType::Float64: fill_as(host.data<double>()); break;
    case DType::Int32: fill_as(host.data<int32_t>()); break;
    case DType::Int64: fill_as(host.data<int64_t>()); break;
    case DType::BFloat16: {
      bf16* p = host.data<bf16>();
      for (size_t i = 0; i < values.size(); ++i) p[i] = bf16(static_cast<float>(values[i]));
      break;
    }
    case DType::Float16: {
      f16* p = host.data<f16>();
      for (size_t i = 0; i < values.size(); ++i) p[i] = f16(static_cast<float>(values[i]));
      break;
    }
  }
  Tensor t = host.to(options.device);
  if (options.requires_grad) t.requires_grad_(true);
  return t;
}
template Tensor from_vector(const std::vector<float>&, const Shape&, const TensorOptions&);
template Tensor from_vector(const std::vector<double>&, const Shape&, const TensorOptions&);
template Tensor from_vector(const std::vector<int32_t>&, const Shape&, const TensorOptions&);
template Tensor from_vector(const std::vector<int64_t>&, const Shape&, const TensorOptions&);

uint64_t Generator::advance(uint64_t count) {
  DPT_CHECK(capture_counter_ == nullptr,
            "Generator: a draw with a fixed offset would repeat in every replay of the CUDA graph being captured");
  const uint64_t o = offset_;
  offset_ += count;
  return o;
}

PhiloxArgs Generator::draw(uint64_t count) {
  if (capture_counter_ == nullptr) return {seed_, advance(count), nullptr};
  const uint64_t relative = captured_;
  captured_ += count;
  return {seed_, relative, capture_counter_};
}

void Generator::begin_capture(const uint64_t* device_counter) {
  DPT_CHECK(device_counter != nullptr && capture_counter_ == nullptr, "Generator: begin_capture twice or without a counter");
  capture_counter_ = device_counter;
  captured_ = 0;
}

uint64_t Generator::end_capture() {
  DPT_CHECK(capture_counter_ != nullptr, "Generator: end_capture without begin_capture");
  capture_counter_ = nullptr;
  return captured_;
}

Generator& default_generator() {
  static Generator gen(0);
  return gen;
}

void manual_seed(uint64_t seed) { default_generator().set_state(seed, 0); }

void normal_(const Tensor& t, Generator& gen, double mean, double stddev) {
  DPT_CHECK(is_floating(t.dtype()) && t.is_contiguous(), "normal_: needs a contiguous floating tensor");
  kernels::random_normal(t, gen.seed(), gen.advance(static_cast<uint64_t>(t.numel())), mean, stddev);
}

void uniform_(const Tensor& t, Generator& gen, double low, double high) {
  DPT_CHECK(is_floating(t.dtype()) && t.is_contiguous(), "uniform_: needs a contiguous floating tensor");
  kernels::random_uniform(t, gen.seed(), gen.advance(static_cast<uint64_t>(t.numel())), low, high);
}

Tensor randn(const Shape& shape, Generator& gen, const TensorOptions& options, double mean, double stddev) {
  Tensor t = Tensor::empty(shape, options.with_requires_grad(false));
  normal_(t, gen, mean, stddev);
  if (options.requires_grad) t.requires_grad_(true);
  return t;
}

Tensor rand(const Shape& shape, Generator& gen, const TensorOptions& options, double low, double high) {
  Tensor t = Tensor::empty(shape, options.with_requires_grad(false));
  uniform_(t, gen, low, high);
  if (options.requires_grad) t.requires_grad_(true);
  return t;
}

Tensor randint(const Shape& shape, int64_t low, int64_t high, Generator& gen, const TensorOptions& options) {
  DPT_CHECK(high > low, "randint: empty range [{}, {})", low, high);
  // Drawn in float64 on the host from the same counters, so every device gets the same integers.
  Tensor u = Tensor::empty(shape, TensorOptions{}.with_dtype(DType::Float64));
  kernels::random_uniform(u, gen.seed(), gen.advance(static_cast<uint64_t>(u.numel())), 0.0, 1.0);
  std::vector<int64_t> values(static_cast<size_t>(u.numel()));
  const double* p = u.data<double>();
  for (size_t i = 0; i < values.size(); ++i) {
    int64_t v = low + static_cast<int64_t>(p[i] * static_cast<double>(high - low));
    values[i] = v >= high ? high - 1 : v;
  }
  return from_vector(values, shape, options.with_requires_grad(false));
}

}  // namespace dpt
