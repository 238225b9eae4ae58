#include "data/tensor_dataset.h"

#include "core/error.h"
#include "core/factory.h"
#include "core/kernels.h"

namespace dpt::data {

namespace {
Tensor host_contiguous(const Tensor& t) { return t.detach().to(Device::cpu()).contiguous(); }
}  // namespace

TensorDataset::TensorDataset(const Tensor& inputs, const Tensor& targets, std::string name) : name_(std::move(name)) {
  DPT_CHECK(inputs.defined() && targets.defined(), "{}: inputs and targets must both be given", name_);
  DPT_CHECK(inputs.dim() >= 1 && targets.dim() >= 1,
            "{}: inputs and targets need a first (example) dimension, got shapes {} and {}", name_,
            shape_str(inputs.shape()), shape_str(targets.shape()));
  DPT_CHECK(inputs.size(0) == targets.size(0), "{}: {} inputs but {} targets (shapes {} and {})", name_, inputs.size(0),
            targets.size(0), shape_str(inputs.shape()), shape_str(targets.shape()));
  inputs_ = host_contiguous(inputs);
  targets_ = host_contiguous(targets);
}

Batch TensorDataset::gather(const std::vector<int64_t>& indices, int64_t) const {
  return {gather_rows(inputs_, indices), gather_rows(targets_, indices)};
}

std::string TensorDataset::describe() const {
  return fmt::format("{} (inputs {}, targets {})", name_, shape_str(inputs_.shape()), shape_str(targets_.shape()));
}

Tensor gather_rows(const Tensor& source, const std::vector<int64_t>& indices) {
  DPT_CHECK(source.device().is_cpu() && source.is_contiguous(), "gather_rows: needs a contiguous host tensor");
  Shape shape = source.shape();
  shape[0] = static_cast<int64_t>(indices.size());
  Tensor out = Tensor::empty(shape, TensorOptions{}.with_dtype(source.dtype()));
  kernels::gather_rows(source, from_vector(indices, {shape[0]}, TensorOptions{}.with_dtype(DType::Int64)), out);
  return out;
}

}  // namespace dpt::data
