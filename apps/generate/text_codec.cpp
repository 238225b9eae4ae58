#include "text_codec.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <sstream>

#include "core/error.h"
#include "data/char_text.h"
#include "data/gpt2_bpe.h"
#include "vocab_metadata.h"

namespace dpt::train {

namespace {

class CharCodec : public TextCodec {
 public:
  CharCodec(data::CharVocab vocab, std::string source) : vocab_(std::move(vocab)), source_(std::move(source)) {}
  std::vector<int32_t> encode(const std::string& text) const override { return vocab_.encode(text); }
  std::string decode(const std::vector<int32_t>& ids) const override { return vocab_.decode(ids); }
  int64_t vocab_size() const override { return vocab_.size(); }
  // A text run's sample starts on a new line, as dpt-train's does.
  int32_t start_token() const override {
    return vocab_.chars().find('\n') != std::string::npos ? vocab_.encode('\n') : 0;
  }
  std::string describe() const override { return fmt::format("{} characters ({})", vocab_.size(), source_); }

 private:
  data::CharVocab vocab_;
  std::string source_;
};

class Gpt2Codec : public TextCodec {
 public:
  explicit Gpt2Codec(const std::string& dir) : tokenizer_(data::Gpt2Tokenizer::load(dir)) {}
  std::vector<int32_t> encode(const std::string& text) const override { return tokenizer_.encode(text); }
  std::string decode(const std::vector<int32_t>& ids) const override { return tokenizer_.decode(ids); }
  int64_t vocab_size() const override { return tokenizer_.vocab_size(); }
  // GPT-2 samples unconditionally from <|endoftext|>, the token that starts every document.
  int32_t start_token() const override { return std::max(tokenizer_.end_of_text(), 0); }
  std::string describe() const override { return "GPT-2 BPE"; }

 private:
  data::Gpt2Tokenizer tokenizer_;
};

class IdsCodec : public TextCodec {
 public:
  explicit IdsCodec(int64_t vocab_size) : vocab_size_(vocab_size) {}
  std::vector<int32_t> encode(const std::string& text) const override {
    std::vector<int32_t> ids;
    std::istringstream words(text);
    for (std::string word; words >> word;) {
      int32_t id = 0;
      auto [end, ec] = std::from_chars(word.data(), word.data() + word.size(), id);
      DPT_CHECK(ec == std::errc() && end == word.data() + word.size() && id >= 0 && id < vocab_size_,
                "prompt: '{}' is not a token id in [0, {}) (--tokenizer ids reads ids separated by spaces)", word,
                vocab_size_);
      ids.push_back(id);
    }
    return ids;
  }
  std::string decode(const std::vector<int32_t>& ids) const override { return fmt::format("{}", fmt::join(ids, " ")); }
  std::string continued(const std::string& prompt, const std::vector<int32_t>& ids) const override {
    const std::string sampled = decode(ids);
    return prompt.empty() || sampled.empty() ? prompt + sampled : prompt + " " + sampled;
  }
  int64_t vocab_size() const override { return vocab_size_; }
  int32_t start_token() const override { return 0; }
  std::string describe() const override { return "token ids"; }

 private:
  int64_t vocab_size_;
};

// The checkpoint's vocabulary, else the one the trainer builds from the run's text file.
std::unique_ptr<TextCodec> char_codec(const TrainedRun& run) {
  if (std::optional<data::CharVocab> saved = checkpoint_char_vocab(run.checkpoint))
    return std::make_unique<CharCodec>(std::move(*saved), "stored in the checkpoint");
  const std::string& path = run.config.data.path;
  DPT_CHECK(std::filesystem::exists(path),
            "checkpoint '{}' stores no character vocabulary and the run's text file '{}' (data.path) is gone; "
            "put it back, or sample ids with --tokenizer ids",
            run.checkpoint_path, path);
  spdlog::warn("checkpoint {} stores no character vocabulary: rebuilt from {}", run.checkpoint_path, path);
  data::CharVocab vocab(data::read_text_file(path));
  // A model sized by its data has exactly the file's vocabulary; a file edited since has another.
  DPT_CHECK(run.config.model.gpt.vocab_size > 0 ? vocab.size() <= run.vocab_size() : vocab.size() == run.vocab_size(),
            "the text file '{}' has {} distinct characters now but the model was trained on a vocabulary of {}: the "
            "file changed since training; sample ids with --tokenizer ids",
            path, vocab.size(), run.vocab_size());
  return std::make_unique<CharCodec>(std::move(vocab), "rebuilt from " + path);
}

}  // namespace

std::unique_ptr<TextCodec> make_text_codec(const std::string& choice, const TrainedRun& run,
                                           const std::string& gpt2_dir) {
  const std::string& kind = run.config.data.kind;
  std::string chosen = choice;
  if (choice == "auto") chosen = kind == "text" ? "char" : kind == "tokens" ? "gpt2" : "ids";
  if (chosen == "char") {
    DPT_CHECK(kind == "text", "--tokenizer char: run '{}' trained on data.kind '{}', not on a text file", run.dir,
              kind);
    return char_codec(run);
  }
  if (chosen == "gpt2") return std::make_unique<Gpt2Codec>(gpt2_dir);
  DPT_CHECK(chosen == "ids", "--tokenizer: expected auto | char | gpt2 | ids, got '{}'", choice);
  return std::make_unique<IdsCodec>(run.vocab_size());
}

}  // namespace dpt::train
