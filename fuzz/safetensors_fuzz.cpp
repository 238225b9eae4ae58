// libFuzzer target: the safetensors reader on arbitrary bytes. Any outcome but a dpt::Error or a
// well-formed result (a crash, a sanitizer report, another exception type, a hang) is a finding.
#include <cstddef>
#include <cstdint>

#include "core/error.h"
#include "core/safetensors.h"
#include "input_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  dpt::fuzz::InputFile file(data, size);
  try {
    auto contents = dpt::load_safetensors(file.path());
    // Touch every byte the reader claims to hold, so a tensor pointing outside its storage shows up.
    volatile uint8_t sink = 0;
    for (const auto& [name, tensor] : contents.tensors) {
      const auto* bytes = static_cast<const uint8_t*>(tensor.data_ptr());
      for (size_t i = 0; i < tensor.nbytes(); ++i) sink = sink ^ bytes[i];
    }
  } catch (const dpt::Error&) {
  }
  return 0;
}
