// data.kind tokens and synthetic_tokens: next-token windows of data.seq_len from a file of uint16 token ids
// (data/token_windows.h); synthetic_tokens first generates that file from the seed. Both read the flat
// keys data.* (which predate the registry), so they register no settings.
#include <algorithm>

#include "components.h"
#include "core/error.h"
#include "data/token_file.h"
#include "data/token_windows.h"
#include "held_out.h"

namespace dpt::train {
namespace {

// Training windows from data.path, validation windows from data.val_path, or else from the file's last
// data.val_fraction; the vocabulary reaches the largest id either holds.
DataBundle make_tokens(const Config& c, const Settings&) {
  const DataConfig& d = c.data;
  const data::WindowMode mode = data::parse_window_mode(d.window);
  const auto seed = static_cast<uint64_t>(c.training.seed);
  DataBundle out;
  out.shape.tokens = true;
  out.shape.seq_len = d.seq_len;
  const bool separate_val = !d.val_path.empty();
  const double split = separate_val ? 1.0 : 1.0 - d.val_fraction;
  auto train = std::make_shared<data::TokenFileDataset>(d.path, d.seq_len, mode, seed, data::Range{0.0, split});
  int64_t max_token = train->max_token();
  std::shared_ptr<data::TokenFileDataset> val;
  if (separate_val) {
    val = std::make_shared<data::TokenFileDataset>(d.val_path, d.seq_len, mode, validation_seed(seed));
  } else if (d.val_fraction > 0) {
    val = std::make_shared<data::TokenFileDataset>(d.path, d.seq_len, mode, validation_seed(seed),
                                                   data::Range{split, 1.0});
  }
  if (val) max_token = std::max(max_token, val->max_token());
  out.shape.vocab_size = max_token + 1;
  out.train = train;
  out.val = val;
  return out;
}

DataBundle make_synthetic_tokens(const Config& c, const Settings& s) {
  const DataConfig& d = c.data;
  // Every rank may generate the file: each writes a private temp file and renames it into place. A
  // file the generator did not write is refused, never overwritten.
  try {
    data::ensure_synthetic_token_file(d.path, d.num_tokens, d.vocab_size, static_cast<uint64_t>(c.training.seed));
  } catch (const Error& e) {
    DPT_FAIL("data.path (data.kind synthetic_tokens): {}", e.what());
  }
  DataBundle out = make_tokens(c, s);
  // The generator's vocabulary, whether or not the file happens to hold its largest id.
  out.shape.vocab_size = d.vocab_size;
  return out;
}

}  // namespace
}  // namespace dpt::train

DPT_REGISTER(dpt::train::datasets, {"tokens",
                                    "a file (or glob of shards) of uint16 token ids, as llm.c writes them",
                                    {},
                                    {"tokens", dpt::train::make_tokens}})
DPT_REGISTER(dpt::train::datasets, {"synthetic_tokens",
                                    "a token file generated from the seed on first use",
                                    {},
                                    {"tokens", dpt::train::make_synthetic_tokens}})
