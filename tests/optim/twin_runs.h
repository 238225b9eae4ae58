#pragma once
// What the optimizer tests of compute twins share: an AdamW over float32 masters (with their bf16 twins
// when asked), and a bitwise comparison of two tensors.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/factory.h"
#include "optim/adam.h"

namespace dpt::optim::test {

struct TwinRun {
  NamedTensors params;  // float32 masters
  NamedTensors twins;   // their bf16 compute copies, when the update reads bf16 gradients
  std::unique_ptr<AdamW> opt;
};

// Masters of the given names and shapes drawn from `seed` on `device`, AdamW at lr 1e-2 with weight decay
// 0.1 for tensors of rank >= 2, and with `twins` their bf16 copies as its compute twins.
inline TwinRun make_twin_run(Device device, bool twins, uint64_t seed,
                             const std::vector<std::pair<std::string, Shape>>& shapes) {
  Generator gen(seed);
  TwinRun r;
  for (const auto& [name, shape] : shapes) {
    Tensor p = randn(shape, gen).to(device);
    p.requires_grad_(true);
    r.params.emplace_back(name, p);
    if (!twins) continue;
    Tensor t = p.detach().to(DType::BFloat16);
    t.requires_grad_(true);
    r.twins.emplace_back(name, t);
  }
  AdamOptions o;
  o.lr = 1e-2;
  r.opt = std::make_unique<AdamW>(weight_decay_groups(r.params, 0.1), o);
  if (twins) r.opt->set_compute_twins(r.twins);
  return r;
}

// a and b hold the same values, element for element (read as float64, which every dtype here fits exactly).
inline void expect_same_bits(const Tensor& a, const Tensor& b, const std::string& what) {
  const std::vector<double> va = a.to(Device::cpu()).to(DType::Float64).to_vector<double>();
  const std::vector<double> vb = b.to(Device::cpu()).to(DType::Float64).to_vector<double>();
  ASSERT_EQ(va.size(), vb.size()) << what;
  for (size_t i = 0; i < va.size(); ++i) ASSERT_EQ(va[i], vb[i]) << what << " element " << i;
}

}  // namespace dpt::optim::test
