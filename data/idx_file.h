#pragma once
// MNIST-style idx files: a 4-byte magic {0, 0, type, rank}, `rank` big-endian uint32 extents, then the
// elements row-major. Only unsigned bytes (type 0x08) are read, which is what MNIST, Fashion-MNIST
// and EMNIST use.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/tensor_dataset.h"

namespace dpt::data {

struct IdxArray {
  std::vector<int64_t> dims;
  std::vector<uint8_t> data;
};

// Throws naming the file for: missing, shorter than its header, nonzero leading magic bytes, a type
// other than unsigned byte, rank 0 or > 4, a zero extent, or a size other than header + product(dims).
IdxArray read_idx_file(const std::string& path);
void write_idx_file(const std::string& path, const IdxArray& array);

// Images [N, H, W] and labels [N] -> inputs float32 [N, 1, H, W] scaled to [0, 1] (or [N, H·W] when
// `flatten`), targets int32 [N]. Checks the counts agree and every label is below num_classes.
std::shared_ptr<TensorDataset> make_mnist_dataset(const std::string& images_path, const std::string& labels_path,
                                                  bool flatten = false, int64_t num_classes = 10);

}  // namespace dpt::data
