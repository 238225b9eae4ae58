// libFuzzer target: the token .bin reader on arbitrary bytes (a dpt::Error or a readable file).
#include <cstddef>
#include <cstdint>

#include "core/error.h"
#include "data/token_file.h"
#include "input_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  dpt::fuzz::InputFile file(data, size);
  try {
    dpt::data::TokenFile tokens(file.path());
    if (1024 + 2 * static_cast<size_t>(tokens.size()) != size) __builtin_trap();  // the layout's exact size
    volatile uint16_t top = tokens.max_token();  // reads every token
    (void)top;
  } catch (const dpt::Error&) {
  }
  return 0;
}
