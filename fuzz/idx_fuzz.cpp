// libFuzzer target: the MNIST idx reader on arbitrary bytes (a dpt::Error or a consistent array).
#include <cstddef>
#include <cstdint>

#include "core/error.h"
#include "data/idx_file.h"
#include "input_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  dpt::fuzz::InputFile file(data, size);
  try {
    auto array = dpt::data::read_idx_file(file.path());
    size_t n = 1;
    for (int64_t d : array.dims) n *= static_cast<size_t>(d);
    if (n != array.data.size()) __builtin_trap();  // the extents must describe the data exactly
  } catch (const dpt::Error&) {
  }
  return 0;
}
