#pragma once
// How dpt-generate turns the prompt into token ids and sampled ids back into text, chosen by the run's
// data (--tokenizer auto) or by the user:
//   char  the character vocabulary of a `data.kind: text` run: the one the checkpoint stores
//         (vocab_metadata.h), else rebuilt from the run's text file as the trainer builds it;
//   gpt2  GPT-2's BPE (data/gpt2_bpe.h), for runs on token files (`data.kind: tokens`);
//   ids   token ids written as decimal numbers separated by spaces, for any run.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "trained_run.h"

namespace dpt::train {

class TextCodec {
 public:
  virtual ~TextCodec() = default;
  // Throws naming the character or token the vocabulary lacks.
  virtual std::vector<int32_t> encode(const std::string& text) const = 0;
  virtual std::string decode(const std::vector<int32_t>& ids) const = 0;
  // The prompt followed by the text of the tokens sampled after it.
  virtual std::string continued(const std::string& prompt, const std::vector<int32_t>& ids) const {
    return prompt + decode(ids);
  }
  // Ids this codec can decode are below it; sampling is kept below it too.
  virtual int64_t vocab_size() const = 0;
  // What generation starts from when the prompt is empty.
  virtual int32_t start_token() const = 0;
  virtual std::string describe() const = 0;
};

// `choice`: auto | char | gpt2 | ids. `gpt2_dir` holds GPT-2's vocabulary files. Throws when the choice
// cannot decode this run (no vocabulary to be had, or one larger than the model's).
std::unique_ptr<TextCodec> make_text_codec(const std::string& choice, const TrainedRun& run,
                                           const std::string& gpt2_dir);

}  // namespace dpt::train
