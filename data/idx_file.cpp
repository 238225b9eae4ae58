#include "data/idx_file.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "core/error.h"
#include "core/factory.h"

namespace dpt::data {

namespace {
constexpr uint8_t kIdxUnsignedByte = 0x08;
constexpr int64_t kMaxIdxRank = 4;

uint32_t read_be32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}
}  // namespace

IdxArray read_idx_file(const std::string& path) {
  DPT_CHECK(std::filesystem::is_regular_file(path), "idx file '{}': does not exist or is not a regular file", path);
  std::ifstream in(path, std::ios::binary);
  DPT_CHECK(in.good(), "idx file '{}': cannot open", path);
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  DPT_CHECK(bytes.size() >= 4, "idx file '{}': {} bytes, shorter than the 4-byte magic", path, bytes.size());
  DPT_CHECK(bytes[0] == 0 && bytes[1] == 0, "idx file '{}': bad magic {:02x}{:02x}{:02x}{:02x} (expected 0000TTRR)",
            path, bytes[0], bytes[1], bytes[2], bytes[3]);
  DPT_CHECK(bytes[2] == kIdxUnsignedByte,
            "idx file '{}': element type 0x{:02x} is not supported (expected 0x08, "
            "unsigned byte)",
            path, bytes[2]);
  const int64_t rank = bytes[3];
  DPT_CHECK(rank >= 1 && rank <= kMaxIdxRank, "idx file '{}': rank {} (expected 1 to {})", path, rank, kMaxIdxRank);
  const auto header = static_cast<size_t>(4 + 4 * rank);
  DPT_CHECK(bytes.size() >= header, "idx file '{}': truncated header: {} bytes, rank {} needs {}", path, bytes.size(),
            rank, header);
  IdxArray array;
  int64_t count = 1;
  for (int64_t d = 0; d < rank; ++d) {
    const int64_t extent = read_be32(bytes.data() + 4 + 4 * d);
    DPT_CHECK(extent > 0, "idx file '{}': dimension {} has extent 0", path, d);
    DPT_CHECK(count <= (int64_t{1} << 40) / extent, "idx file '{}': dimensions too large", path);
    count *= extent;
    array.dims.push_back(extent);
  }
  const auto expected = header + static_cast<size_t>(count);
  DPT_CHECK(bytes.size() == expected, "idx file '{}': {} bytes but dimensions {} need {} ({})", path, bytes.size(),
            shape_str(array.dims), expected, bytes.size() < expected ? "truncated" : "trailing bytes");
  array.data.assign(bytes.begin() + static_cast<std::ptrdiff_t>(header), bytes.end());
  return array;
}

void write_idx_file(const std::string& path, const IdxArray& array) {
  DPT_CHECK(!array.dims.empty() && static_cast<int64_t>(array.dims.size()) <= kMaxIdxRank,
            "write_idx_file '{}': rank {} (expected 1 to {})", path, array.dims.size(), kMaxIdxRank);
  DPT_CHECK(shape_numel(array.dims) == static_cast<int64_t>(array.data.size()),
            "write_idx_file '{}': dimensions {} need {} bytes, got {}", path, shape_str(array.dims),
            shape_numel(array.dims), array.data.size());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  DPT_CHECK(out.good(), "write_idx_file: cannot create '{}'", path);
  const uint8_t magic[4] = {0, 0, kIdxUnsignedByte, static_cast<uint8_t>(array.dims.size())};
  out.write(reinterpret_cast<const char*>(magic), 4);
  for (int64_t extent : array.dims) {
    const auto e = static_cast<uint32_t>(extent);
    const uint8_t be[4] = {static_cast<uint8_t>(e >> 24), static_cast<uint8_t>(e >> 16), static_cast<uint8_t>(e >> 8),
                           static_cast<uint8_t>(e)};
    out.write(reinterpret_cast<const char*>(be), 4);
  }
  out.write(reinterpret_cast<const char*>(array.data.data()), static_cast<std::streamsize>(array.data.size()));
  DPT_CHECK(out.good(), "write_idx_file: writing '{}' failed", path);
}

std::shared_ptr<TensorDataset> make_mnist_dataset(const std::string& images_path, const std::string& labels_path,
                                                  bool flatten, int64_t num_classes) {
  IdxArray images = read_idx_file(images_path);
  IdxArray labels = read_idx_file(labels_path);
  DPT_CHECK(images.dims.size() == 3, "idx images '{}': expected 3 dimensions [N, H, W], got {}", images_path,
            shape_str(images.dims));
  DPT_CHECK(labels.dims.size() == 1, "idx labels '{}': expected 1 dimension [N], got {}", labels_path,
            shape_str(labels.dims));
  const int64_t n = images.dims[0], h = images.dims[1], w = images.dims[2];
  DPT_CHECK(labels.dims[0] == n, "idx files disagree: '{}' holds {} images but '{}' holds {} labels", images_path, n,
            labels_path, labels.dims[0]);
  std::vector<float> x(images.data.size());
  std::transform(images.data.begin(), images.data.end(), x.begin(),
                 [](uint8_t v) { return static_cast<float>(v) * (1.0f / 255.0f); });
  std::vector<int32_t> y(labels.data.size());
  for (size_t i = 0; i < y.size(); ++i) {
    DPT_CHECK(labels.data[i] < num_classes, "idx labels '{}': label {} at index {} is not below num_classes {}",
              labels_path, labels.data[i], i, num_classes);
    y[i] = labels.data[i];
  }
  Shape input_shape = flatten ? Shape{n, h * w} : Shape{n, 1, h, w};
  return std::make_shared<TensorDataset>(from_vector(x, input_shape),
                                         from_vector(y, {n}, TensorOptions{}.with_dtype(DType::Int32)),
                                         fmt::format("idx images '{}'", images_path));
}

}  // namespace dpt::data
