// GPT-2 interop (apps/train/hf_gpt2.h, dpt-export-hf, model.init_from): an exported model loaded back
// computes the same logits and loss; the folder has HF's names, Conv1D layouts and config.json fields;
// nanoGPT state dicts (nn.Linear layouts, _orig_mod. prefixes, lm_head and mask buffers) load too; a
// model that does not fit is refused naming every mismatching tensor.
#include "hf_gpt2.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/autograd.h"
#include "core/factory.h"
#include "data/token_file.h"
#include "train_test_util.h"

namespace dpt::train {
namespace {

using namespace test_util;

nn::GPTConfig small(int64_t vocab = 40, bool bias = true, int64_t n_embd = 16, int64_t n_head = 2) {
  nn::GPTConfig c;
  c.vocab_size = vocab;
  c.block_size = 16;
  c.n_layer = 2;
  c.n_head = n_head;
  c.n_embd = n_embd;
  c.bias = bias;
  return c;
}

// A model whose LayerNorms and biases are not at their initial (1, 0), so a layout slip shows.
std::unique_ptr<nn::GPT> randomized(const nn::GPTConfig& c, uint64_t seed) {
  Generator gen(seed);
  auto gpt = std::make_unique<nn::GPT>(c, gen);
  Generator noise(seed + 100);
  for (auto& [name, p] : gpt->named_parameters()) {
    const std::vector<float> v = p.to_vector<float>();
    std::vector<float> r = randn(p.shape(), noise).to_vector<float>();
    for (size_t i = 0; i < v.size(); ++i) r[i] = v[i] + 0.1f * r[i];
    Tensor t = p;
    t.copy_(from_vector(r, p.shape()));
  }
  return gpt;
}

const std::vector<int32_t> kTokens = {3, 17, 5, 39, 0, 22, 8, 8, 31, 2, 14, 27, 36, 1, 9, 11};

std::vector<float> logits(nn::GPT& gpt) {
  NoGradGuard no_grad;
  const std::vector<int32_t> input(kTokens.begin(), kTokens.end() - 1);
  return gpt.forward(from_vector(input, {1, 15}, TensorOptions{}.with_dtype(DType::Int32))).to_vector<float>();
}

std::string json_of(const std::string& path) { return read_text(path); }

TEST(HfGpt2, ExportThenInitFromGivesIdenticalLogitsAndLoss) {
  ScratchDir dir("hf.roundtrip");
  auto a = randomized(small(), 1);
  export_hf_gpt2(*a, 40, dir.file("hf"), false);
  Generator other(2);
  nn::GPT b(small(), other);
  ASSERT_NE(logits(*a), logits(b));
  const std::string what = init_gpt_from(b, dir.file("hf"));
  EXPECT_NE(what.find("Hugging Face Conv1D"), std::string::npos) << what;
  EXPECT_EQ(logits(*a), logits(b));
  EXPECT_EQ(gpt_sequence_loss(*a, kTokens, 40), gpt_sequence_loss(b, kTokens, 40));
  // Nothing is overwritten without being asked.
  EXPECT_THROW(export_hf_gpt2(*a, 40, dir.file("hf"), false), Error);
}

TEST(HfGpt2, TheFolderHasHuggingFaceNamesLayoutsAndConfig) {
  ScratchDir dir("hf.layout");
  auto a = randomized(small(), 3);
  export_hf_gpt2(*a, 40, dir.file("hf"), false);
  const SafetensorsContents file = load_safetensors(dir.file("hf/model.safetensors"));
  EXPECT_EQ(file.metadata.at("format"), "pt");
  EXPECT_EQ(file.tensors.size(), 4u + 12u * 2u);  // wte, wpe, ln_f.{weight,bias} + 12 per block
  EXPECT_FALSE(file.contains("lm_head.weight"));
  const auto ours = a->state_dict();
  auto mine = [&](const std::string& name) {
    for (const auto& [n, t] : ours)
      if (n == name) return t;
    ADD_FAILURE() << "no " << name;
    return Tensor();
  };
  // Conv1D weights are [in, out]: the transposes of our Linear weights.
  const std::pair<const char*, const char*> transposed[] = {
      {"transformer.h.1.attn.c_attn.weight", "blocks.1.attn.qkv.weight"},
      {"transformer.h.1.attn.c_proj.weight", "blocks.1.attn.proj.weight"},
      {"transformer.h.0.mlp.c_fc.weight", "blocks.0.mlp.fc.weight"},
      {"transformer.h.0.mlp.c_proj.weight", "blocks.0.mlp.proj.weight"}};
  for (const auto& [hf, name] : transposed) {
    EXPECT_EQ(file.at(hf).to_vector<float>(), mine(name).transpose(0, 1).contiguous().to_vector<float>()) << hf;
  }
  EXPECT_EQ(file.at("transformer.h.0.attn.c_attn.weight").shape(), (Shape{16, 48}));
  EXPECT_EQ(file.at("transformer.h.1.ln_2.bias").to_vector<float>(), mine("blocks.1.ln2.bias").to_vector<float>());
  EXPECT_EQ(file.at("transformer.wte.weight").to_vector<float>(), mine("wte.weight").to_vector<float>());
  EXPECT_EQ(file.at("transformer.ln_f.weight").to_vector<float>(), mine("ln_f.weight").to_vector<float>());

  const nlohmann::json j = nlohmann::json::parse(json_of(dir.file("hf/config.json")));
  EXPECT_EQ(j["model_type"], "gpt2");
  EXPECT_EQ(j["architectures"][0], "GPT2LMHeadModel");
  EXPECT_EQ(j["vocab_size"], 40);
  EXPECT_EQ(j["n_positions"], 16);
  EXPECT_EQ(j["n_embd"], 16);
  EXPECT_EQ(j["n_layer"], 2);
  EXPECT_EQ(j["n_head"], 2);
  EXPECT_EQ(j["activation_function"], "gelu_new");  // our GELU is the tanh approximation
  EXPECT_EQ(j["layer_norm_epsilon"], 1e-5);
  EXPECT_EQ(j["tie_word_embeddings"], true);
  EXPECT_FALSE(j.contains("bos_token_id"));  // not GPT-2's tokenizer
}

// A padded vocabulary is trimmed on export; loading it back into the padded model fills the first rows,
// and the loss over the real vocabulary is unchanged.
TEST(HfGpt2, APaddedVocabularyIsTrimmedAndLoadsBackIntoTheFirstRows) {
  ScratchDir dir("hf.padded");
  auto a = randomized(small(48), 4);
  export_hf_gpt2(*a, 40, dir.file("hf"), false);
  EXPECT_EQ(load_safetensors(dir.file("hf/model.safetensors")).at("transformer.wte.weight").shape(), (Shape{40, 16}));
  Generator other(5);
  nn::GPT b(small(48), other);
  const std::string what = init_gpt_from(b, dir.file("hf"));
  EXPECT_NE(what.find("40 embedding rows fill the first of 48"), std::string::npos) << what;
  EXPECT_EQ(gpt_sequence_loss(*a, kTokens, 40), gpt_sequence_loss(b, kTokens, 40));
}

TEST(HfGpt2, BiasFreeModelsExportZeroBiasesThatLoadIntoEitherKind) {
  ScratchDir dir("hf.nobias");
  auto a = randomized(small(40, false), 6);
  export_hf_gpt2(*a, 40, dir.file("hf"), false);
  const SafetensorsContents file = load_safetensors(dir.file("hf/model.safetensors"));
  ASSERT_TRUE(file.contains("transformer.h.0.attn.c_attn.bias"));
  for (float v : file.at("transformer.h.0.attn.c_attn.bias").to_vector<float>()) EXPECT_EQ(v, 0.0f);
  Generator g1(7), g2(8);
  nn::GPT without(small(40, false), g1), with(small(40, true), g2);
  init_gpt_from(without, dir.file("hf"));
  init_gpt_from(with, dir.file("hf"));
  EXPECT_EQ(logits(*a), logits(without));
  EXPECT_EQ(logits(*a), logits(with));
  // Non-zero biases do not fit a model without them.
  auto biased = randomized(small(40, true), 9);
  export_hf_gpt2(*biased, 40, dir.file("biased"), false);
  try {
    init_gpt_from(without, dir.file("biased"));
    ADD_FAILURE() << "non-zero biases loaded into a model without biases";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("non-zero biases, but model.gpt.bias is false"), std::string::npos)
        << e.what();
  }
}

// nanoGPT's state dict after torch.compile: nn.Linear layouts [out, in], _orig_mod.transformer. names,
// lm_head.weight tied to wte, and the attention mask buffers.
TEST(HfGpt2, NanoGptStateDictsLoadWithLinearLayoutsAndCompiledPrefixes) {
  ScratchDir dir("hf.nanogpt");
  auto a = randomized(small(), 10);
  NamedTensors nano;
  for (auto& [name, t] : hf_gpt2_state(*a, 40)) {
    Tensor v = t;
    const bool conv1d = name.find("c_attn.weight") != std::string::npos ||
                        name.find("c_proj.weight") != std::string::npos ||
                        name.find("c_fc.weight") != std::string::npos;
    if (conv1d) v = t.transpose(0, 1).contiguous();
    nano.emplace_back("_orig_mod." + name, v);
  }
  for (int i = 0; i < 2; ++i) {
    Tensor mask = Tensor::empty({1, 1, 16, 16}, TensorOptions{}.with_dtype(DType::Float32));
    mask.zero_();
    nano.emplace_back("_orig_mod.transformer.h." + std::to_string(i) + ".attn.bias", mask);
  }
  nano.emplace_back("_orig_mod.lm_head.weight", a->wte->weight.clone());
  save_safetensors(dir.file("ckpt.safetensors"), nano);
  Generator other(11);
  nn::GPT b(small(), other);
  const std::string what = init_gpt_from(b, dir.file("ckpt.safetensors"));
  EXPECT_NE(what.find("nanoGPT nn.Linear"), std::string::npos) << what;
  EXPECT_EQ(logits(*a), logits(b));
}

TEST(HfGpt2, AModelThatDoesNotFitIsRefusedNamingEachMismatch) {
  ScratchDir dir("hf.mismatch");
  auto a = randomized(small(), 12);
  export_hf_gpt2(*a, 40, dir.file("hf"), false);
  Generator g(13);
  nn::GPT wider(small(40, true, 32, 4), g);
  try {
    init_gpt_from(wider, dir.file("hf"));
    ADD_FAILURE() << "a model of another width loaded";
  } catch (const Error& e) {
    const std::string m = e.what();
    for (const char* part :
         {"n_head is 2, model.gpt.n_head is 4", "n_embd is 16, model.gpt.n_embd is 32",
          "'wpe.weight' is [16, 16] in the file, wpe.weight needs [16, 32]",
          "'h.1.attn.c_attn.weight' is [48, 16] in the file, blocks.1.attn.qkv.weight needs [96, 32]"})
      EXPECT_NE(m.find(part), std::string::npos) << part << "\n" << m;
  }
  Generator g2(14);
  nn::GPT deeper(
      [] {
        nn::GPTConfig c = small();
        c.n_layer = 3;
        return c;
      }(),
      g2);
  try {
    init_gpt_from(deeper, dir.file("hf/model.safetensors"));
    ADD_FAILURE() << "a deeper model loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("missing 'transformer.h.2.ln_1.weight'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("n_layer is 2, model.gpt.n_layer is 3"), std::string::npos) << e.what();
  }
}

// dpt-train overrides of configs/gpt2_124m.yaml for a small float32 GPT on the CPU, trained and validated
// on the token file `tokens` (vocabulary and context from the data).
std::vector<std::string> small_cpu_gpt(const std::string& tokens, int layers, int width, int context) {
  return {"training.device=cpu",
          "training.precision=fp32",
          "model.gpt.n_layer=" + std::to_string(layers),
          "model.gpt.n_head=2",
          "model.gpt.n_embd=" + std::to_string(width),
          "model.gpt.vocab_size=0",
          "model.gpt.block_size=0",
          "data.seq_len=" + std::to_string(context),
          "data.path=" + tokens,
          "data.val_path=" + tokens,
          "training.batch_size=4",
          "eval.batches=1",
          "eval.sample_tokens=0"};
}

// The tools end to end: a dpt-train GPT exported by dpt-export-hf prints the loss the loaded model gives
// in-process, and a new run starts from the folder through model.init_from.
TEST(HfGpt2, DptExportHfAndInitFromWorkOnATrainedRun) {
  ScratchDir dir("hf.tools");
  data::write_token_file(dir.file("t.bin"), data::synthetic_tokens(3000, 64, 1));
  std::vector<std::string> gpt = small_cpu_gpt(dir.file("t.bin"), 1, 16, 16);
  gpt.push_back("schedule.warmup_steps=1");
  auto with = [&](std::vector<std::string> more) {
    std::vector<std::string> all = gpt;
    all.insert(all.end(), more.begin(), more.end());
    return all;
  };
  ASSERT_EQ(
      train(config_path("gpt2_124m.yaml"), with({"training.steps=3", "checkpoint.dir=" + dir.file("run")})).exit_code,
      0);
  RunResult e = run_shell(bin("dpt-export-hf") + " " + quote(dir.file("run")) + " " + quote(dir.file("hf")) +
                          " --eval-tokens " + quote(dir.file("t.bin")));
  ASSERT_EQ(e.exit_code, 0) << e.output;
  RunResult again = run_shell(bin("dpt-export-hf") + " " + quote(dir.file("run")) + " " + quote(dir.file("hf")));
  EXPECT_EQ(again.exit_code, 1) << again.output;
  EXPECT_NE(again.output.find("exists; nothing was written (pass --force"), std::string::npos) << again.output;
  EXPECT_EQ(run_shell(bin("dpt-export-hf") + " " + quote(dir.file("run"))).exit_code, 2);  // usage
  const auto at = e.output.find("loss ");
  ASSERT_NE(at, std::string::npos) << e.output;
  const double printed = std::stod(e.output.substr(at + 5));
  Generator g(0);
  nn::GPTConfig one_layer = small(64);
  one_layer.n_layer = 1;
  nn::GPT loaded(one_layer, g);
  init_gpt_from(loaded, dir.file("hf"));
  const data::TokenFile tokens(dir.file("t.bin"));
  const std::vector<int32_t> ids(tokens.tokens(), tokens.tokens() + tokens.size());
  EXPECT_NEAR(printed, gpt_sequence_loss(loaded, ids, 64), 1e-6 * printed);

  // With a vanishing learning rate the run's weights stay the imported ones.
  RunResult r = train(config_path("gpt2_124m.yaml"),
                      with({"training.steps=2", "optim.lr=1e-9", "schedule.min_lr=0",
                            "model.init_from=" + dir.file("hf"), "checkpoint.dir=" + dir.file("b")}));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("model.init_from: 16 tensors from"), std::string::npos) << r.output;
  const std::vector<float> imported =
      load_safetensors(dir.file("hf/model.safetensors")).at("transformer.wpe.weight").to_vector<float>();
  const SafetensorsContents trained = load_safetensors(dir.file("b/step_00000002/checkpoint.model.safetensors"));
  const std::vector<float> wpe = trained.at("wpe.weight").to_vector<float>();
  ASSERT_EQ(wpe.size(), imported.size());
  for (size_t i = 0; i < imported.size(); ++i) ASSERT_NEAR(wpe[i], imported[i], 1e-6) << i;
  RunResult cnn = train(config_path("mlp_synthetic.yaml"),
                        {"model.init_from=" + dir.file("hf"), "checkpoint.dir=" + dir.file("c")});
  EXPECT_EQ(cnn.exit_code, 1) << cnn.output;
  EXPECT_NE(cnn.output.find("model.init_from: loads GPT-2 weights, but model.kind is mlp"), std::string::npos)
      << cnn.output;
  // A run of another model kind is refused by name, and no folder is written.
  ASSERT_EQ(train(config_path("mlp_synthetic.yaml"), {"training.steps=2", "schedule.warmup_steps=0",
                                                      "training.device=cpu", "checkpoint.dir=" + dir.file("m")})
                .exit_code,
            0);
  RunResult mlp = run_shell(bin("dpt-export-hf") + " " + quote(dir.file("m")) + " " + quote(dir.file("hf_mlp")));
  EXPECT_EQ(mlp.exit_code, 1) << mlp.output;
  EXPECT_NE(mlp.output.find("trained a model.kind 'mlp': only GPT runs can be sampled or exported"), std::string::npos)
      << mlp.output;
  EXPECT_FALSE(std::filesystem::exists(dir.file("hf_mlp")));
}

// Hugging Face's own model on the export: transformers.GPT2LMHeadModel.from_pretrained loads the folder
// and gives dptrain's loss on the same tokens (scripts/check-hf-export.py, within 1e-4 relative). Runs
// where Python has torch and transformers (the GPU machines), is skipped elsewhere.
TEST(HfGpt2, TransformersLoadsTheExportAndGivesTheSameLoss) {
  if (run_shell("python3 -c 'import torch, transformers'").exit_code != 0) {
    GTEST_SKIP() << "python3 with torch and transformers is not installed";
  }
  ScratchDir dir("hf.transformers");
  data::write_token_file(dir.file("t.bin"), data::synthetic_tokens(4000, 97, 2));
  std::vector<std::string> gpt = small_cpu_gpt(dir.file("t.bin"), 2, 32, 32);
  gpt.insert(gpt.end(), {"training.steps=20", "schedule.warmup_steps=2", "checkpoint.dir=" + dir.file("run")});
  ASSERT_EQ(train(config_path("gpt2_124m.yaml"), gpt).exit_code, 0);
  const RunResult check = run_shell("python3 " + quote(std::string(DPT_SOURCE_DIR) + "/scripts/check-hf-export.py") +
                                    " " + quote(dir.file("run")) + " " + quote(dir.file("t.bin")) + " --out " +
                                    quote(dir.file("hf")) + " --tool " + quote(bin("dpt-export-hf")) + " --device cpu");
  EXPECT_EQ(check.exit_code, 0) << check.output;
  EXPECT_NE(check.output.find("-> agree"), std::string::npos) << check.output;
}

}  // namespace
}  // namespace dpt::train
