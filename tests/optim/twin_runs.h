#pragma once
// What the optimizer tests of compute twins share: float32 masters (with their bf16 twins when asked), an
// AdamW over them, and a bitwise comparison of two tensors.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/factory.h"
#include "optim/adam.h"

namespace dpt::optim::test {

struct Masters {
  NamedTensors params;  // float32 masters
  NamedTensors twins;   // their bf16 compute copies, when the update reads bf16 gradients
};

// Masters of the given names and shapes drawn from `seed` on `device`, with `twins` their bf16 copies.
inline Masters make_masters(Device device, bool twins, uint64_t seed,
                            const std::vector<std::pair<std::string, Shape>>& shapes) {
  Generator gen(seed);
  Masters m;
  for (const auto& [name, shape] : shapes) {
    Tensor p = randn(shape, gen).to(device);
    p.requires_grad_(true);
    m.params.emplace_back(name, p);
    if (!twins) continue;
    Tensor t = p.detach().to(DType::BFloat16);
    t.requires_grad_(true);
    m.twins.emplace_back(name, t);
  }
  return m;
}

struct TwinRun : Masters {
  std::unique_ptr<AdamW> opt;
};

// make_masters' masters under AdamW at lr 1e-2 with weight decay 0.1 for tensors of rank >= 2, with the
// twins (if any) as its compute twins.
inline TwinRun make_twin_run(Device device, bool twins, uint64_t seed,
                             const std::vector<std::pair<std::string, Shape>>& shapes) {
  TwinRun r;
  static_cast<Masters&>(r) = make_masters(device, twins, seed, shapes);
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
