#include "hf_gpt2.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <set>
#include <sstream>

#include "core/autograd.h"
#include "core/error.h"
#include "core/ops.h"
#include "core/shape.h"
#include "layers/losses.h"

namespace dpt::train {

namespace fs = std::filesystem;

namespace {

constexpr const char* kConfigFile = "config.json";
constexpr const char* kWeightsFile = "model.safetensors";

// One of our parameter names in HF's naming (without the "transformer." prefix), and whether HF stores
// it transposed (a Conv1D weight).
struct HfName {
  std::string name;
  bool transposed = false;
};

std::optional<HfName> hf_name(const std::string& ours) {
  static const std::regex block(
      "blocks\\.([0-9]+)\\.(ln1|ln2|attn\\.qkv|attn\\.proj|mlp\\.fc|mlp\\.proj)\\.(weight|bias)");
  static const std::map<std::string, std::string> parts = {
      {"ln1", "ln_1"},        {"ln2", "ln_2"},           {"attn.qkv", "attn.c_attn"}, {"attn.proj", "attn.c_proj"},
      {"mlp.fc", "mlp.c_fc"}, {"mlp.proj", "mlp.c_proj"}};
  if (ours == "wte.weight" || ours == "wpe.weight" || ours == "ln_f.weight" || ours == "ln_f.bias") return HfName{ours};
  std::smatch m;
  if (!std::regex_match(ours, m, block)) return std::nullopt;
  const std::string part = m[2].str();
  const bool linear = part.rfind("ln", 0) != 0;
  return HfName{fmt::format("h.{}.{}.{}", m[1].str(), parts.at(part), m[3].str()), linear && m[3] == "weight"};
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Every tensor HF's GPT-2 has, with our name for it ("" for a bias our model lacks) and HF's shape.
struct Slot {
  std::string ours;
  HfName hf;
  Shape shape;  // in HF's layout
};

std::vector<Slot> hf_slots(nn::GPT& gpt) {
  std::vector<Slot> slots;
  const NamedTensors state = gpt.state_dict();
  std::set<std::string> have;
  for (const auto& [name, t] : state) have.insert(name);
  for (const auto& [name, t] : state) {
    const std::optional<HfName> hf = hf_name(name);
    DPT_CHECK(hf.has_value(), "GPT parameter '{}' has no GPT-2 counterpart", name);
    Shape shape = t.shape();
    if (hf->transposed) std::swap(shape[0], shape[1]);
    slots.push_back({name, *hf, shape});
    // A model without biases: HF's GPT-2 still has them, zero.
    const std::string bias = name.substr(0, name.size() - 6) + "bias";
    if (ends_with(name, ".weight") && name != "wte.weight" && name != "wpe.weight" && !have.count(bias)) {
      slots.push_back({"", *hf_name(bias), Shape{t.size(0)}});
    }
  }
  return slots;
}

// A tensor name of a GPT-2 file without the prefixes torch.compile and HF's wrapper add.
std::string canonical(std::string name) {
  for (const std::string prefix : {"_orig_mod.", "transformer."})
    if (name.rfind(prefix, 0) == 0) name = name.substr(prefix.size());
  return name;
}

// Entries of a GPT-2 file that hold no weights of ours: the causal-mask buffers of HF and nanoGPT, and
// the LM head tied to wte.
bool ignored(const std::string& canonical_name) {
  return canonical_name == "lm_head.weight" || ends_with(canonical_name, ".attn.bias") ||
         ends_with(canonical_name, ".attn.masked_bias");
}

bool all_zero(const Tensor& t) {
  const std::vector<float> v = t.to_vector<float>();
  return std::all_of(v.begin(), v.end(), [](float x) { return x == 0.0f; });
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  DPT_CHECK(in.good(), "cannot read '{}'", path);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// A config.json's disagreements with our model that shapes cannot show (heads, activation, eps).
void check_hf_config(const std::string& path, const nn::GPTConfig& ours, std::vector<std::string>& problems) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_text(path));
  } catch (const nlohmann::json::exception& e) {
    problems.push_back(fmt::format("{}: not valid JSON ({})", path, e.what()));
    return;
  }
  auto number = [&](const char* key) -> std::optional<int64_t> {
    if (!j.contains(key) || !j[key].is_number_integer()) return std::nullopt;
    return j[key].get<int64_t>();
  };
  const std::pair<const char*, int64_t> sizes[] = {
      {"n_head", ours.n_head}, {"n_layer", ours.n_layer}, {"n_embd", ours.n_embd}};
  for (const auto& [key, value] : sizes) {
    if (auto v = number(key); v && *v != value)
      problems.push_back(fmt::format("{}: {} is {}, model.gpt.{} is {}", path, key, *v, key, value));
  }
  const std::string activation = j.value("activation_function", std::string("gelu_new"));
  if (activation != "gelu_new" && activation != "gelu_pytorch_tanh") {
    problems.push_back(
        fmt::format("{}: activation_function '{}'; this GPT computes GELU's tanh approximation "
                    "(gelu_new)",
                    path, activation));
  }
  if (j.contains("layer_norm_epsilon") && j["layer_norm_epsilon"].is_number() &&
      j["layer_norm_epsilon"].get<double>() != 1e-5) {
    problems.push_back(
        fmt::format("{}: layer_norm_epsilon {}; this GPT uses 1e-5", path, j["layer_norm_epsilon"].get<double>()));
  }
}

}  // namespace

NamedTensors hf_gpt2_state(nn::GPT& gpt, int64_t vocab_size) {
  const nn::GPTConfig& c = gpt.config();
  DPT_CHECK(vocab_size >= 1 && vocab_size <= c.vocab_size, "vocabulary {} must be in [1, {}] (the model's rows)",
            vocab_size, c.vocab_size);
  std::map<std::string, Tensor> ours;
  for (const auto& [name, t] : gpt.state_dict()) ours[name] = t.to(Device::cpu()).to(DType::Float32);
  NamedTensors out;
  for (const Slot& slot : hf_slots(gpt)) {
    Tensor t;
    if (slot.ours.empty()) {
      t = Tensor::empty(slot.shape, TensorOptions{}.with_dtype(DType::Float32));
      t.zero_();
    } else {
      t = ours.at(slot.ours);
      if (slot.hf.transposed) t = t.transpose(0, 1);
      if (slot.ours == "wte.weight") t = t.slice(0, vocab_size);
    }
    out.emplace_back("transformer." + slot.hf.name, t.contiguous());
  }
  return out;
}

std::string hf_gpt2_config_json(const nn::GPTConfig& c, int64_t vocab_size) {
  nlohmann::ordered_json j;
  j["architectures"] = {"GPT2LMHeadModel"};
  j["model_type"] = "gpt2";
  j["vocab_size"] = vocab_size;
  j["n_positions"] = c.block_size;
  j["n_ctx"] = c.block_size;
  j["n_embd"] = c.n_embd;
  j["n_layer"] = c.n_layer;
  j["n_head"] = c.n_head;
  j["n_inner"] = nullptr;                 // 4 * n_embd, as our MLP
  j["activation_function"] = "gelu_new";  // GELU's tanh approximation (core/ops.h gelu)
  j["layer_norm_epsilon"] = 1e-5;
  j["resid_pdrop"] = c.dropout;
  j["embd_pdrop"] = c.dropout;
  j["attn_pdrop"] = c.dropout;
  j["initializer_range"] = 0.02;
  j["scale_attn_weights"] = true;
  j["tie_word_embeddings"] = true;
  j["use_cache"] = true;
  j["torch_dtype"] = "float32";
  // GPT-2's tokenizer: <|endoftext|> is both; other vocabularies have no such token.
  if (vocab_size == 50257) j["bos_token_id"] = j["eos_token_id"] = 50256;
  return j.dump(2) + "\n";
}

void export_hf_gpt2(nn::GPT& gpt, int64_t vocab_size, const std::string& dir, bool overwrite) {
  const fs::path config = fs::path(dir) / kConfigFile, weights = fs::path(dir) / kWeightsFile;
  if (!overwrite) {
    for (const fs::path& p : {config, weights})
      DPT_CHECK(!fs::exists(fs::symlink_status(p)), "'{}' exists; nothing was written (pass --force to replace it)",
                p.string());
  }
  const NamedTensors state = hf_gpt2_state(gpt, vocab_size);
  const std::string json = hf_gpt2_config_json(gpt.config(), vocab_size);
  fs::create_directories(dir);
  // from_pretrained refuses a safetensors file without format "pt" in its metadata.
  save_safetensors(weights.string(), state, {{"format", "pt"}});
  write_file_atomically(config.string(), json);
}

std::string init_gpt_from(nn::GPT& gpt, const std::string& path) {
  fs::path weights = path, config;
  if (fs::is_directory(path)) {
    weights = fs::path(path) / kWeightsFile;
    config = fs::path(path) / kConfigFile;
    DPT_CHECK(fs::exists(weights), "model.init_from '{}': a folder without {} (expected a Hugging Face GPT-2 folder)",
              path, kWeightsFile);
  } else if (fs::exists(weights.parent_path() / kConfigFile)) {
    config = weights.parent_path() / kConfigFile;
  }
  const SafetensorsContents file = load_safetensors(weights.string());
  std::vector<std::string> problems;
  if (!config.empty()) check_hf_config(config.string(), gpt.config(), problems);

  std::map<std::string, const Tensor*> found;  // canonical name -> tensor
  for (const auto& [name, t] : file.tensors) {
    const std::string c = canonical(name);
    if (ignored(c)) continue;
    if (found.count(c)) problems.push_back(fmt::format("'{}' appears twice (with and without a prefix)", c));
    found[c] = &t;
  }
  // Conv1D files hold c_attn as [C, 3C], nn.Linear ones as [3C, C].
  bool conv1d = true;
  if (auto it = found.find("h.0.attn.c_attn.weight"); it != found.end() && it->second->dim() == 2)
    conv1d = it->second->size(1) == 3 * it->second->size(0);

  std::map<std::string, Tensor> ours;
  for (const auto& [name, t] : gpt.state_dict()) ours[name] = t.to(Device::cpu()).to(DType::Float32).clone();
  std::set<std::string> used;
  int64_t wte_rows = -1;
  for (const Slot& slot : hf_slots(gpt)) {
    auto it = found.find(slot.hf.name);
    if (it == found.end()) {
      // A model without biases takes a file without them too.
      if (!slot.ours.empty())
        problems.push_back(
            fmt::format("missing 'transformer.{}' ({} for {})", slot.hf.name, shape_str(slot.shape), slot.ours));
      continue;
    }
    used.insert(slot.hf.name);
    Tensor t = it->second->to(DType::Float32);
    if (slot.hf.transposed && conv1d) t = t.transpose(0, 1);  // to our [out, in]
    if (slot.ours.empty()) {
      if (!all_zero(t))
        problems.push_back(fmt::format("'{}' holds non-zero biases, but model.gpt.bias is false", slot.hf.name));
      continue;
    }
    Tensor& dst = ours.at(slot.ours);
    const bool fewer_rows =
        slot.ours == "wte.weight" && t.dim() == 2 && t.size(1) == dst.size(1) && t.size(0) < dst.size(0);
    if (fewer_rows) {
      dst.slice(0, t.size(0)).copy_(t);
      wte_rows = t.size(0);
    } else if (t.shape() != dst.shape()) {
      problems.push_back(fmt::format("'{}' is {} in the file, {} needs {}", slot.hf.name, shape_str(t.shape()),
                                     slot.ours, shape_str(dst.shape())));
    } else {
      dst.copy_(t);
    }
  }
  for (const auto& [name, t] : found)
    if (!used.count(name)) problems.push_back(fmt::format("unexpected '{}' ({})", name, shape_str(t->shape())));
  if (!problems.empty()) {
    std::string listed;
    for (const auto& p : problems) listed += "\n  " + p;
    DPT_FAIL("model.init_from '{}' does not fit this GPT ({} problem{}):{}", path, problems.size(),
             problems.size() == 1 ? "" : "s", listed);
  }
  NamedTensors state(ours.begin(), ours.end());
  gpt.load_state_dict(state);
  std::string what = fmt::format("{} tensors from {} ({} layout)", used.size(), weights.string(),
                                 conv1d ? "Hugging Face Conv1D" : "nanoGPT nn.Linear");
  if (wte_rows >= 0)
    what += fmt::format("; its {} embedding rows fill the first of {}", wte_rows, gpt.config().vocab_size);
  return what;
}

double gpt_sequence_loss(nn::GPT& gpt, const std::vector<int32_t>& tokens, int64_t vocab_size) {
  DPT_CHECK(vocab_size >= 1 && vocab_size <= gpt.config().vocab_size, "vocabulary {} must be in [1, {}]", vocab_size,
            gpt.config().vocab_size);
  const auto length = std::min<int64_t>(static_cast<int64_t>(tokens.size()), gpt.config().block_size);
  DPT_CHECK(length >= 2, "need at least 2 tokens to score, got {}", tokens.size());
  for (int64_t i = 0; i < length; ++i) {
    DPT_CHECK(tokens[static_cast<size_t>(i)] >= 0 && tokens[static_cast<size_t>(i)] < vocab_size,
              "token {} at position {} is outside the vocabulary of {}", tokens[static_cast<size_t>(i)], i, vocab_size);
  }
  const std::vector<int32_t> input(tokens.begin(), tokens.begin() + length - 1);
  const std::vector<int32_t> target(tokens.begin() + 1, tokens.begin() + length);
  const TensorOptions int32 = TensorOptions{}.with_dtype(DType::Int32);
  const Device device = gpt.wte->weight.device();
  NoGradGuard no_grad;
  gpt.eval();
  Tensor logits = gpt.forward(from_vector(input, {1, length - 1}, int32).to(device));
  if (vocab_size < gpt.config().vocab_size) logits = slice(logits, 2, 0, vocab_size).contiguous();
  const double loss = nn::cross_entropy_loss(logits, from_vector(target, {1, length - 1}, int32).to(device)).item();
  gpt.train();
  return loss;
}

}  // namespace dpt::train
