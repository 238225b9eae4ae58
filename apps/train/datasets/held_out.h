#pragma once
// What the built-in datasets hold out for evaluation, shared by their components in this folder.
#include <cstdint>
#include <memory>
#include <string>

#include "data/tensor_dataset.h"
#include "data_factory.h"

namespace dpt::train {

// Examples held out for evaluation from `n` generated ones: round(n * fraction), at least one when
// the fraction is positive.
int64_t held_out(int64_t n, double fraction);

// Generates n training + v validation examples in one seeded draw and splits them: example i is a pure
// function of (seed, i), so training data do not depend on the validation size.
void split_generated(const std::shared_ptr<data::TensorDataset>& all, int64_t n, int64_t v, const std::string& name,
                     DataBundle& out);

// Validation windows use the training window mode (nanoGPT evaluates on random windows of the held-out
// tail) from a seed of their own, so they are not the training draws shifted into the tail.
uint64_t validation_seed(uint64_t seed);

}  // namespace dpt::train
