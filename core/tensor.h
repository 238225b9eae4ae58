#pragma once
// Tensor: a shared handle to shape, strides, dtype and storage, plus autograd state.
// Copies of a Tensor alias the same data (like torch.Tensor). Views (reshape of contiguous data,
// slicing along the first dimension, transpose/permute) share storage with their base.
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/dtype.h"
#include "core/shape.h"
#include "core/storage.h"

namespace dpt {

class GradColumnSums;
class Node;
class Tensor;

// Called once per backward pass, at the moment a leaf's gradient is final (see autograd.h).
using GradReadyHook = std::function<void(const Tensor& leaf)>;

struct AutogradMeta {
  bool requires_grad = false;
  std::shared_ptr<Tensor> grad;           // accumulated gradient of a leaf (may be a view into a bucket)
  // zero_grad() without set_to_none only sets this: the next accumulation overwrites `grad` instead of
  // adding to it, and any read through Tensor::grad() zeroes it first. One copy instead of a fill and
  // an add per parameter and step (GPT-2: 148 kernel launches fewer).
  bool grad_zero_pending = false;
  // Set by mark_grad_written (autograd.h) when an op's backward wrote this leaf's first gradient straight
  // into `grad`; the leaf's AccumulateGrad then calls the hooks although autograd delivered nothing.
  bool grad_written = false;
  std::shared_ptr<Node> grad_fn;          // the op that produced this tensor (null for leaves)
  uint32_t output_nr = 0;                 // which output of grad_fn this tensor is
  std::weak_ptr<Node> grad_accumulator;   // a leaf's AccumulateGrad node, shared by all its uses
  std::vector<GradReadyHook> grad_ready_hooks;
  // The producing op's offer to take its gradient's column sums from a consumer (core/grad_column_sums.h).
  std::shared_ptr<GradColumnSums> grad_column_sums;
};

struct TensorImpl {
  std::shared_ptr<Storage> storage;
  int64_t offset = 0;  // in elements
  Shape shape;
  Shape strides;
  DType dtype = DType::Float32;
  Device device;
  std::unique_ptr<AutogradMeta> autograd;

  AutogradMeta& autograd_meta();  // creates it on first use
};

struct TensorOptions {
  DType dtype = DType::Float32;
  Device device = Device::cpu();
  bool requires_grad = false;

  TensorOptions with_dtype(DType d) const { auto o = *this; o.dtype = d; return o; }
  TensorOptions with_device(Device d) const { auto o = *this; o.device = d; return o; }
  TensorOptions with_requires_grad(bool r) const { auto o = *this; o.requires_grad = r; return o; }
};

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  // Uninitialized contiguous tensor.
  static Tensor empty(const Shape& shape, const TensorOptions& options = {});

  bool defined() const { return impl_ != nullptr; }
  TensorImpl* impl() const { return impl_.get(); }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }
  bool same(const Tensor& other) const { return impl_ == other.impl_; }

  const Shape& shape() const;
  const Shape& strides() const;
  int64_t dim() const;
  int64_t size(int64_t d) const;  // negative d counts from the end
  int64_t numel() const;
  DType dtype() const;
  Device device() const;
  TensorOptions options() const;
  bool is_contiguous() const;
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype()); }

  void* data_ptr() const;  // address of the first element (storage + offset)
  template <class T>
  T* data() const { return static_cast<T*>(data_ptr()); }

  // --- autograd ---------------------------------------------------------------------------
  bool requires_grad() const;
  Tensor& requires_grad_(bool value = true);  // leaves only
  bool is_leaf() const;                       // no grad_fn
  Tensor grad() const;                        // undefined until a backward reaches this leaf
  void set_grad(const Tensor& grad) const;    // e.g. a view into a DDP bucket; accumulation writes into it
  void zero_grad(bool set_to_none = false) const;
  std::shared_ptr<Node> grad_fn() const;
  void backward(const Tensor& grad_output = {}) const;  // grad_output defaults to 1 for a scalar
  Tensor detach() const;                                // same data, no autograd history
  void register_grad_ready_hook(GradReadyHook hook) const;  // leaves that require grad only

  // --- conversion and copies ---------------------------------------------------------------
  Tensor to(Device device) const;  // same tensor when already there
  Tensor to(DType dtype) const;
  Tensor contiguous() const;
  Tensor clone() const;
  double item() const;  // single-element tensor to double, synchronising with the device
  template <class T>
  std::vector<T> to_vector() const;  // contiguous copy on the host, converted to T

  // --- views (differentiable) --------------------------------------------------------------
  Tensor reshape(const Shape& shape) const;  // view when contiguous, else a copy; one -1 allowed
  Tensor view(const Shape& shape) const { return reshape(shape); }
  Tensor slice(int64_t start, int64_t end) const;  // rows [start, end) of the first dimension
  Tensor operator[](int64_t index) const;          // row `index` of the first dimension, rank - 1
  Tensor transpose(int64_t d0, int64_t d1) const;
  Tensor permute(const std::vector<int64_t>& dims) const;

  // --- in-place updates, outside autograd (optimizers, initializers, DDP) --------------------
  Tensor& copy_(const Tensor& src);  // any device/dtype to this tensor's, same shape
  Tensor& zero_();
  Tensor& fill_(double value);

  std::string str() const;  // shape, dtype, device and (for small tensors) the values

 private:
  std::shared_ptr<TensorImpl> impl_;
};

std::ostream& operator<<(std::ostream& os, const Tensor& t);

// Tensor views built from a base: shares storage, no autograd. Used by ops and by DDP's buckets.
Tensor make_view(const Tensor& base, const Shape& shape, const Shape& strides, int64_t offset);

}  // namespace dpt
