// Hostile inputs that the per-folder suites do not already cover (safetensors_test, token_file_test,
// idx_file_test, char_text_test, config_test, module_test, checkpoint_test hold the ordinary damage):
// inputs built to crash a parser (deep nesting, alias bombs, numbers past every range, NUL bytes),
// headers whose sizes overflow, and a checkpoint from another model. Each must end in a dpt::Error
// naming the problem, never a crash, a hang or a partial change.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "config.h"
#include "core/error.h"
#include "core/factory.h"
#include "core/safetensors.h"
#include "data/char_text.h"
#include "data/idx_file.h"
#include "data/token_file.h"
#include "layers/mlp.h"
#include "optim/adam.h"
#include "optim/checkpoint.h"
#include "processes.h"

namespace {

using dpt::Error;
using dpt::reliability::ScratchDir;

// Runs `f`, which must throw dpt::Error whose message contains every part of `parts`.
template <class F>
void expect_error(F&& f, const std::vector<std::string>& parts, const std::string& what) {
  try {
    f();
    ADD_FAILURE() << what << ": no error";
  } catch (const Error& e) {
    for (const auto& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << what << ": " << e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << what << ": threw a non-dpt exception: " << e.what();
  }
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// A safetensors file from a raw header (padded to 8) and data.
std::string safetensors_bytes(std::string header, const std::string& data) {
  while (header.size() % 8) header += ' ';
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[static_cast<size_t>(i)] = static_cast<char>(header.size() >> (8 * i));
  return bytes + header + data;
}

// ---------------------------------------------------------------------------------------------------
// safetensors

TEST(HostileSafetensors, ParserBombsAndImpossibleNumbersAreErrors) {
  ScratchDir dir;
  const std::string f = dir.file("x.safetensors");
  auto expect = [&](const std::string& header, const std::string& data, const std::string& part) {
    write_bytes(f, safetensors_bytes(header, data));
    expect_error([&] { dpt::load_safetensors(f); }, {f, part}, header.substr(0, 80));
  };
  // Deep nesting must not recurse the stack away.
  expect(std::string(200000, '['), "", "");
  expect("{\"a\":" + std::string(200000, '{'), "", "");
  expect(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,99999999999999999999999]}})", std::string(4, '\0'), "");
  expect(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[8,4]}})", std::string(8, '\0'), "");
  expect(R"({"a":{"dtype":"F32","shape":[2305843009213693952],"data_offsets":[0,4]}})", std::string(4, '\0'), "");
  expect(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
         std::string(4, '\0'), "");
  expect(std::string("{\"a\0\":1}", 8), "", "");
  expect(R"({"a\u12":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", std::string(4, '\0'), "");
  expect(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]})", std::string(4, '\0'), "");
  expect(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4)", std::string(4, '\0'), "");
  expect(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[-4,0]}})", std::string(4, '\0'), "");
  // A zero header length, a header length field of all ones.
  write_bytes(f, std::string(8, '\0'));
  expect_error([&] { dpt::load_safetensors(f); }, {f}, "header length 0");
  write_bytes(f, std::string(8, '\xff') + "{}      ");
  expect_error([&] { dpt::load_safetensors(f); }, {f}, "header length 2^64-1");
  // Not a file at all.
  expect_error([&] { dpt::load_safetensors(dir.path().string()); }, {dir.path().string()}, "a directory");
}

// ---------------------------------------------------------------------------------------------------
// token, idx and text files

TEST(HostileDataFiles, TokenHeaderCountsThatDoNotFitAreErrors) {
  ScratchDir dir;
  const std::string f = dir.file("t.bin");
  for (int32_t count : {-1, std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max()}) {
    std::vector<int32_t> header(256, 0);
    header[0] = dpt::data::kTokenFileMagic;
    header[1] = dpt::data::kTokenFileVersion;
    header[2] = count;
    std::string bytes(reinterpret_cast<const char*>(header.data()), header.size() * 4);
    bytes += std::string(64, '\0');
    write_bytes(f, bytes);
    expect_error([&] { dpt::data::TokenFile t(f); }, {f}, "token count " + std::to_string(count));
  }
  write_bytes(f, "");
  expect_error([&] { dpt::data::TokenFile t(f); }, {f}, "empty token file");
  expect_error([&] { dpt::data::TokenFile t(dir.path().string()); }, {dir.path().string()}, "directory as token file");
}

TEST(HostileDataFiles, IdxExtentsWhoseProductOverflowsAreErrors) {
  ScratchDir dir;
  const std::string f = dir.file("x.idx");
  // Rank 4, every extent 0xffffffff: the product overflows 64 bits.
  std::string bytes = {0, 0, 0x08, 4};
  for (int i = 0; i < 4; ++i) bytes += std::string(4, '\xff');
  bytes += std::string(16, '\0');
  write_bytes(f, bytes);
  expect_error([&] { dpt::data::read_idx_file(f); }, {f}, "idx extents overflow");
  // Rank 3, extents 2^16 each: 2^48 bytes declared, 16 present.
  bytes = {0, 0, 0x08, 3};
  for (int i = 0; i < 3; ++i) bytes += std::string("\x00\x01\x00\x00", 4);
  bytes += std::string(16, '\0');
  write_bytes(f, bytes);
  expect_error([&] { dpt::data::read_idx_file(f); }, {f}, "idx declared size past the end");
  expect_error([&] { dpt::data::read_idx_file(dir.path().string()); }, {dir.path().string()}, "directory as idx");
}

TEST(HostileDataFiles, ADirectoryAsATextFileIsAnError) {
  ScratchDir dir;
  expect_error([&] { dpt::data::read_text_file(dir.path().string()); }, {dir.path().string()}, "directory as text");
}

// ---------------------------------------------------------------------------------------------------
// trainer configs

const dpt::train::LoadOptions kNoDevice{.check_files = true, .check_device = false};

void expect_config_error(const std::string& yaml, const std::vector<std::string>& parts,
                         const std::vector<std::string>& overrides = {}) {
  expect_error([&] { dpt::train::load_config_text(yaml, "hostile.yaml", overrides, kNoDevice); }, parts,
               yaml.substr(0, 80));
}

TEST(HostileConfigs, ParserBombsAreErrors) {
  expect_config_error(std::string(100000, '['), {"hostile.yaml"});
  expect_config_error(std::string(100000, '{'), {"hostile.yaml"});
  std::string deep = "training:\n";
  for (int i = 0; i < 20000; ++i) deep += std::string(static_cast<size_t>(i % 50 + 2), ' ') + "- \n";
  expect_config_error(deep, {"hostile.yaml"});
  // Billion laughs: nine levels of aliases, each nine times the one before.
  std::string bomb = "a: &a [x, x, x, x, x, x, x, x, x]\n";
  for (char c = 'b'; c <= 'i'; ++c) {
    std::string prev(1, static_cast<char>(c - 1));
    bomb += std::string(1, c) + ": &" + c + " [*" + prev + ", *" + prev + ", *" + prev + ", *" + prev + ", *" + prev +
            ", *" + prev + ", *" + prev + ", *" + prev + ", *" + prev + "]\n";
  }
  bomb += "model:\n  mlp:\n    hidden: *i\n";
  expect_config_error(bomb, {"hostile.yaml"});
  expect_config_error(std::string("training:\n  steps: 1\0\0\0\n", 24), {"hostile.yaml"});
  expect_config_error("training:\n  steps: \xff\xfe\n", {"training.steps"});
  expect_config_error("training: {steps: 3}\n---\ntraining: {steps: 4}\n", {"hostile.yaml", "2 YAML documents"});
  expect_config_error("training:\n\tsteps: 3\n", {"hostile.yaml"});
  // A document that starts with ',' made yaml-cpp's LoadAll return empty documents without end (found by
  // fuzz/config_fuzz.cpp: the loader grew past 2 GB).
  expect_config_error(",\n", {"hostile.yaml:1:1", "malformed YAML", "','"});
  expect_config_error("training: {steps: 3}\n---\n, x\n", {"hostile.yaml:3:1", "malformed YAML"});
}

TEST(HostileConfigs, NumbersPastEveryRangeAndZeroOrNegativeSizesAreErrors) {
  expect_config_error("training:\n  batch_size: 99999999999999999999999\n", {"training.batch_size"});
  expect_config_error("training:\n  steps: -5\n", {"training.steps"});
  expect_config_error("training:\n  grad_accum: 0\n", {"training.grad_accum"});
  expect_config_error("optim:\n  lr: .nan\n", {"optim.lr"});
  expect_config_error("optim:\n  lr: .inf\n", {"optim.lr"});
  expect_config_error("optim:\n  lr: 1e400\n", {"optim.lr"});
  expect_config_error("model:\n  mlp:\n    hidden: [0]\n", {"model.mlp.hidden"});
  expect_config_error("model:\n  mlp:\n    hidden: [-3, 4]\n", {"model.mlp.hidden"});
  expect_config_error("data:\n  num_samples: 0\n", {"data.num_samples"});
  expect_config_error("distributed:\n  bucket_cap_mb: -1\n", {"distributed.bucket_cap_mb"});
  expect_config_error("distributed:\n  timeout_s: 0\n", {"distributed.timeout_s"});
  expect_config_error("checkpoint:\n  keep: -1\n", {"checkpoint.keep"});
  expect_config_error("checkpoint:\n  every: -1\n", {"checkpoint.every"});
  expect_config_error("model:\n  kind: gpt\n  gpt: {n_layer: 0}\ndata:\n  kind: synthetic_tokens\n",
                      {"model.gpt.n_layer"});
  expect_config_error("model:\n  kind: gpt\ndata:\n  kind: synthetic_tokens\n  seq_len: -1\n", {"data.seq_len"});
}

TEST(HostileConfigs, MalformedOverridesAreErrors) {
  for (std::string o : std::vector<std::string>{"=", "=3", ".=1", "a..b=1", "training..steps=1", "training.steps",
                        "model.mlp.hidden.99999999999999999999=1", "model.mlp.hidden.-1=1", "+training.steps=2",
                        "training.steps=[[[["}) {
    expect_error([&] { dpt::train::load_config_text("training: {steps: 3}\n", "hostile.yaml", {o}, kNoDevice); }, {},
                 "override '" + o + "'");
  }
}

// ---------------------------------------------------------------------------------------------------
// checkpoints

TEST(HostileCheckpoints, AnotherModelsCheckpointIsRefusedAndChangesNothing) {
  ScratchDir dir;
  dpt::Generator g1(1), g2(2);
  auto small = std::make_shared<dpt::nn::MLP>(std::vector<int64_t>{4, 8, 2}, "relu", g1);
  auto wide = std::make_shared<dpt::nn::MLP>(std::vector<int64_t>{4, 16, 2}, "relu", g2);
  auto deeper = std::make_shared<dpt::nn::MLP>(std::vector<int64_t>{4, 8, 8, 2}, "relu", g2);
  dpt::optim::AdamW opt(wide->named_parameters(), {});
  const std::string prefix = dir.file("wide");
  dpt::optim::save_checkpoint(prefix, wide->state_dict(), &opt, {3, 0, 0, {}});

  auto before = small->state_dict();
  std::vector<std::vector<double>> values;
  for (const auto& [name, t] : before) values.push_back(t.to_vector<double>());

  auto ckpt = dpt::optim::load_checkpoint(prefix);
  expect_error([&] { small->load_state_dict(ckpt.model); }, {"shape"}, "wider model's checkpoint");
  // The other way round: the checkpoint lacks a layer the model has, or has one the model lacks.
  expect_error([&] { deeper->load_state_dict(ckpt.model); }, {}, "shallower model's checkpoint");
  dpt::optim::AdamW small_opt(small->named_parameters(), {});
  expect_error([&] { small_opt.load_state_dict(ckpt.optimizer); }, {}, "another model's optimizer state");

  auto after = small->state_dict();
  for (size_t i = 0; i < after.size(); ++i) EXPECT_EQ(after[i].second.to_vector<double>(), values[i]) << after[i].first;

  // A checkpoint's model file replaced by an unrelated safetensors file.
  dpt::save_safetensors(prefix + ".model.safetensors", {{"foo", dpt::zeros({3})}});
  expect_error([&] { dpt::optim::load_checkpoint(prefix); }, {}, "foreign model file");
}

}  // namespace
