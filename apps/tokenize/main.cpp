// dpt-tokenize: text to GPT-2 token files in the common .bin layout (data/token_file.h), the files
// llm.c's data scripts write and `data.kind: tokens` reads.
//   dpt-tokenize --input tinyshakespeare.txt --output shakespeare_train.bin
//                --val-output shakespeare_val.bin --val-fraction 0.1   (one command line)
// The whole text is encoded once; with --val-output its last val-fraction of the tokens go there (the
// tail, as the trainer's data.val_fraction holds out) and the rest to --output.
// Exit codes: 0 done; 1 error (one message on stderr, no output file written); 2 usage.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "command_line.h"
#include "core/error.h"
#include "data/char_text.h"
#include "data/gpt2_bpe.h"
#include "data/token_file.h"

namespace {

struct Options {
  std::string input;
  std::string output;
  std::string val_output;
  double val_fraction = 0.1;
  std::string tokenizer_dir = dpt::data::Gpt2Tokenizer::default_dir();
};

std::vector<uint16_t> narrow(const std::vector<int32_t>& ids, size_t begin, size_t end) {
  std::vector<uint16_t> out;
  out.reserve(end - begin);
  for (size_t i = begin; i < end; ++i) {
    // The .bin layout holds uint16 ids: GPT-2's 50,257 fit, a larger vocabulary would not.
    DPT_CHECK(ids[i] >= 0 && ids[i] <= UINT16_MAX, "token id {} does not fit the .bin layout's uint16 tokens", ids[i]);
    out.push_back(static_cast<uint16_t>(ids[i]));
  }
  return out;
}

int tokenize(const Options& o) {
  DPT_CHECK(o.output != o.input && o.val_output != o.input, "--output and --val-output must not be the input '{}'",
            o.input);
  DPT_CHECK(o.val_output != o.output, "--val-output must differ from --output ('{}')", o.output);
  const dpt::data::Gpt2Tokenizer tokenizer = dpt::data::Gpt2Tokenizer::load(o.tokenizer_dir);
  const std::string text = dpt::data::read_text_file(o.input);
  const std::vector<int32_t> ids = tokenizer.encode(text);
  const size_t val =
      o.val_output.empty() ? 0 : static_cast<size_t>(std::llround(static_cast<double>(ids.size()) * o.val_fraction));
  const size_t train = ids.size() - val;
  DPT_CHECK(train > 0, "'{}' gives {} tokens: nothing is left for --output after --val-fraction {}", o.input,
            ids.size(), o.val_fraction);
  // Every id is checked before either file is written.
  const std::vector<uint16_t> train_tokens = narrow(ids, 0, train);
  const std::vector<uint16_t> val_tokens = narrow(ids, train, ids.size());
  dpt::data::write_token_file(o.output, train_tokens);
  if (!o.val_output.empty()) dpt::data::write_token_file(o.val_output, val_tokens);
  std::printf("dpt-tokenize: %s: %zu bytes -> %zu GPT-2 tokens; %s: %zu tokens", o.input.c_str(), text.size(),
              ids.size(), o.output.c_str(), train);
  if (!o.val_output.empty()) std::printf(", %s: %zu tokens", o.val_output.c_str(), val);
  std::printf("\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"Encodes a text file with GPT-2's tokenizer into .bin token files (256 x int32 header, uint16 tokens)",
               "dpt-tokenize"};
  app.add_option("--input,-i", o.input, "text file (UTF-8)")->required();
  app.add_option("--output,-o", o.output, "token file of the training tokens")->required();
  app.add_option("--val-output", o.val_output, "token file of the held-out tail");
  app.add_option("--val-fraction", o.val_fraction, "fraction of the tokens held out for --val-output")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  app.add_option("--tokenizer-dir", o.tokenizer_dir, "folder of GPT-2's encoder.json and vocab.bpe")
      ->capture_default_str();
  dpt::cli::set_examples(app, {"dpt-tokenize --input tinyshakespeare.txt --output train.bin --val-output val.bin",
                               "dpt-tokenize -i book.txt -o book.bin --tokenizer-dir /opt/gpt2"});
  if (auto code = dpt::cli::parse(app, argc, argv)) return *code;
  try {
    return tokenize(o);
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "dpt-tokenize: error: %s\n", e.what());
    return 1;
  }
}
