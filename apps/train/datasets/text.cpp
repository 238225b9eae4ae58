// data.kind text: next-token windows of data.seq_len over the characters of a plain text file
// (data/char_text.h). It reads the flat keys data.* (which predate the registry), so it registers no
// settings.
#include "components.h"
#include "data/char_text.h"
#include "data/token_windows.h"
#include "held_out.h"

namespace dpt::train {
namespace {

// The training range is the head of the file, validation the tail; one vocabulary for both.
DataBundle make_text(const Config& c, const Settings&) {
  const DataConfig& d = c.data;
  const data::WindowMode mode = data::parse_window_mode(d.window);
  const auto seed = static_cast<uint64_t>(c.training.seed);
  const double split = 1.0 - d.val_fraction;
  auto train = std::make_shared<data::CharTextDataset>(d.path, d.seq_len, mode, seed, data::Range{0.0, split});
  DataBundle out;
  out.shape.tokens = true;
  out.shape.seq_len = d.seq_len;
  out.shape.vocab_size = train->vocab().size();
  out.vocab = train->vocab();
  if (d.val_fraction > 0) {
    out.val = std::make_shared<data::CharTextDataset>(d.path, d.seq_len, mode, validation_seed(seed),
                                                      data::Range{split, 1.0});
  }
  out.train = train;
  return out;
}

}  // namespace
}  // namespace dpt::train

DPT_REGISTER(dpt::train::datasets,
             {"text", "the characters of a plain text file", {}, {"tokens", dpt::train::make_text}})
