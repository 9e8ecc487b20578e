// Starting from Hugging Face GPT-2 folders: the layouts transformers and older torch.save-based
// tools write (prefix, tied head stored twice, attention-mask buffers, shards, 16-bit weights)
// load and evaluate like crosstrain's own file; --model-name-or-path fine-tunes from them,
// tokenizer files travel with the outputs, and options crosstrain does not implement are refused
// by name with nothing written.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/data/text_dataset.h"
#include "core/data/text_tokenizer.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/io/json_file.h"
#include "core/io/read_file.h"
#include "core/io/safetensors.h"
#include "core/registry.h"
#include "core/train/evaluate.h"
#include "core/train/model_files.h"
#include "core/train/trainer.h"
#include "tests/common/test_data_dir.h"
#include "tests/train/train_test_util.h"

namespace ct {
namespace {
namespace fs = std::filesystem;

// One tensor of a folder being written: name -> (shape, f32 values).
struct Named {
  std::vector<int64_t> shape;
  std::vector<float> values;
};
using Tensors = std::map<std::string, Named>;

// A small trained model (cached per process): its folder and its tensors by crosstrain name.
const fs::path& trained_model() {
  static const fs::path dir = [] {
    fs::path out = fs::temp_directory_path() / ("crosstrain_hf_base_" + std::to_string(getpid()));
    fs::remove_all(out);
    TrainArgs a = testing::small_model_args(out);
    a.max_steps = 20;
    a.learning_rate = 3e-3;
    train(a);
    return out;
  }();
  return dir;
}

Tensors read_tensors(const std::string& path) {
  SafetensorsFile f = read_safetensors(path);
  Tensors t;
  for (const std::string& n : f.names()) {
    const SafetensorsInfo& info = f.info(n);
    Named v{info.shape, std::vector<float>(static_cast<size_t>(info.numel()))};
    std::memcpy(v.values.data(), f.data(n).data(), v.values.size() * sizeof(float));
    t.emplace(n, std::move(v));
  }
  return t;
}

// Writes `t` to `path` in `dtype` (f32 values rounded to 16 bits when asked).
void write_tensors(const std::string& path, const Tensors& t, DType dtype = DType::f32) {
  std::vector<std::vector<std::byte>> storage;
  std::vector<SafetensorsTensor> out;
  for (const auto& [name, v] : t) {
    std::vector<std::byte> bytes(v.values.size() * dtype_size(dtype));
    for (size_t i = 0; i < v.values.size(); ++i)
      write_from_f32(bytes.data(), dtype, static_cast<int64_t>(i), v.values[i]);
    storage.push_back(std::move(bytes));
    out.push_back({name, dtype, v.shape, storage.back()});
  }
  write_safetensors(path, out, {{"format", "pt"}});
}

double eval_loss(const std::string& dir) {
  auto device = open_device("cpu");
  auto model = load_model(dir, *device);
  std::vector<int32_t> tokens =
      make_byte_tokenizer()->encode(load_text(ct::test::data_dir() + "/text/harbour.txt"));
  model->allocate_activations(4, 32);
  return evaluate(*model, tokens, 32, 4, 8).loss;
}

// The transformers layout: every name under "transformer.", the head stored as well (tied, the
// same values), and the causal-mask buffers older versions saved.
Tensors hf_layout(const Tensors& ours, int n_layer, int block) {
  Tensors t;
  for (const auto& [name, v] : ours) t.emplace("transformer." + name, v);
  t.emplace("lm_head.weight", ours.at("wte.weight"));
  for (int l = 0; l < n_layer; ++l) {
    Named mask{{1, 1, block, block}, std::vector<float>(static_cast<size_t>(block) * block, 1.0f)};
    t.emplace("transformer.h." + std::to_string(l) + ".attn.bias", mask);
    t.emplace("transformer.h." + std::to_string(l) + ".attn.masked_bias", Named{{}, {-1e4f}});
  }
  return t;
}

TEST(HfCheckpoint, TransformersLayoutsEvaluateIdentically) {
  const fs::path& base = trained_model();
  const double want = eval_loss(base.string());
  const Tensors ours = read_tensors((base / "model.safetensors").string());
  const fs::path root = testing::fresh_temp_dir("hf_layouts");
  auto folder = [&](const std::string& name) {
    fs::path d = root / name;
    fs::create_directories(d);
    fs::copy_file(base / "config.json", d / "config.json");
    return d;
  };

  // prefix + tied head stored twice + mask buffers, one file
  const Tensors hf = hf_layout(ours, 2, 32);
  fs::path single = folder("single");
  write_tensors((single / "model.safetensors").string(), hf);
  EXPECT_EQ(eval_loss(single.string()), want);

  // sharded in three files with model.safetensors.index.json
  fs::path sharded = folder("sharded");
  std::vector<Tensors> shards(3);
  nlohmann::json index = {{"metadata", {{"total_size", 0}}},
                          {"weight_map", nlohmann::json::object()}};
  int k = 0;
  for (const auto& [name, v] : hf) {
    const int s = k++ % 3;
    shards[s].emplace(name, v);
    index["weight_map"][name] = "model-0000" + std::to_string(s + 1) + "-of-00003.safetensors";
  }
  for (int s = 0; s < 3; ++s)
    write_tensors(
        (sharded / ("model-0000" + std::to_string(s + 1) + "-of-00003.safetensors")).string(),
        shards[s]);
  write_json_file((sharded / "model.safetensors.index.json").string(), index);
  EXPECT_EQ(eval_loss(sharded.string()), want);

  // bf16 and fp16 weights (as `torch_dtype` checkpoints are often published): widened exactly,
  // so the loss is that of the rounded weights -- close, not equal
  for (DType dt : {DType::bf16, DType::f16}) {
    fs::path half = folder(dtype_name(dt));
    write_tensors((half / "model.safetensors").string(), hf, dt);
    EXPECT_NEAR(eval_loss(half.string()), want, dt == DType::bf16 ? 2e-2 : 2e-3) << dtype_name(dt);
  }
}

TEST(HfCheckpoint, RefusesWhatItCannotLoadByName) {
  const fs::path& base = trained_model();
  const Tensors ours = read_tensors((base / "model.safetensors").string());
  const fs::path root = testing::fresh_temp_dir("hf_refused");
  const nlohmann::json config = read_json_file((base / "config.json").string());
  auto expect_refused = [&](const std::string& name, const nlohmann::json& cfg, const Tensors& t,
                            const std::vector<std::string>& parts) {
    fs::path d = root / name;
    fs::create_directories(d);
    write_json_file((d / "config.json").string(), cfg);
    write_tensors((d / "model.safetensors").string(), t);
    try {
      eval_loss(d.string());
      ADD_FAILURE() << name << ": loaded";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument) << e.what();
      for (const std::string& p : parts)
        EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << name << ": " << e.what();
    }
  };
  nlohmann::json c = config;
  c["activation_function"] = "relu";
  expect_refused("act", c, ours, {"activation_function", "relu"});
  c = config;
  c["n_inner"] = 64;
  expect_refused("inner", c, ours, {"n_inner"});
  c = config;
  c["scale_attn_by_inverse_layer_idx"] = true;
  expect_refused("scale", c, ours, {"scale_attn_by_inverse_layer_idx"});
  c = config;
  c["tie_word_embeddings"] = false;
  expect_refused("tie", c, ours, {"tie_word_embeddings"});
  c = config;
  c["model_type"] = "bert";  // llama, mistral and qwen2 are built (tests/train/hf_llama_test.cpp)
  expect_refused("type", c, ours, {"model_type"});

  Tensors untied = ours;
  untied.emplace("lm_head.weight", ours.at("wte.weight"));
  untied.at("lm_head.weight").values[3] += 1.0f;
  expect_refused("untied", config, untied, {"lm_head.weight", "untied"});
  Tensors extra = ours;
  extra.emplace("h.0.attn.rotary.inv_freq", Named{{4}, {1, 2, 3, 4}});
  expect_refused("extra", config, extra, {"h.0.attn.rotary.inv_freq"});
  Tensors wrong = ours;
  wrong.at("h.1.mlp.c_fc.weight").shape = {128 * 32};
  expect_refused("shape", config, wrong, {"h.1.mlp.c_fc.weight", "shape"});

  // only pytorch_model.bin: named, with what to do
  fs::path bin = root / "bin";
  fs::create_directories(bin);
  write_json_file((bin / "config.json").string(), config);
  testing::fresh_temp_dir("unused");
  std::ofstream(bin / "pytorch_model.bin") << "not read";
  try {
    eval_loss(bin.string());
    ADD_FAILURE() << "pytorch_model.bin loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("safetensors"), std::string::npos) << e.what();
  }
}

TEST(HfCheckpoint, FineTunesFromAFolderAndCarriesTheTokenizer) {
  const fs::path& base = trained_model();
  const fs::path root = testing::fresh_temp_dir("hf_finetune");
  // The base in transformers' layout, with the BPE test tokenizer beside it; its vocabulary
  // (1111) fits the model only if vocab_size grows, so make a model of that vocabulary.
  fs::path start = root / "start";
  fs::create_directories(start);
  for (const char* f : {"tokenizer.json", "vocab.json", "merges.txt"})
    fs::copy_file(ct::test::data_dir() + "/bpe/" + f, start / f);
  nlohmann::json config = read_json_file((base / "config.json").string());
  config["vocab_size"] = 1111;
  config["bos_token_id"] = 0;
  config["eos_token_id"] = 0;
  config["resid_pdrop"] = 0.1;
  write_json_file((start / "config.json").string(), config);
  Tensors t = read_tensors((base / "model.safetensors").string());
  Named& wte = t.at("wte.weight");
  wte.shape = {1111, 32};
  for (size_t i = wte.values.size(); i < 1111 * 32; ++i)
    wte.values.push_back(0.01f * static_cast<float>(i % 7) - 0.03f);
  write_tensors((start / "model.safetensors").string(), hf_layout(t, 2, 32));

  // learning rate 0: the fine-tuned weights are the starting weights, bit for bit
  TrainArgs a = testing::small_model_args(root / "out");
  a.n_layer = a.n_head = a.n_embd = a.block_size = 0;
  a.model_name_or_path = start.string();
  a.block_size = 16;  // the training length, below n_positions 32
  a.learning_rate = 0;
  a.max_steps = 2;
  a.save_steps = 2;
  a.sample_tokens = 8;
  TrainSummary s = train(a);
  EXPECT_TRUE(std::isfinite(s.final_loss));
  const Tensors after = read_tensors((root / "out" / "model.safetensors").string());
  for (const auto& [name, v] : t) EXPECT_EQ(after.at(name).values, v.values) << name;
  for (const fs::path& d : {root / "out", root / "out" / "checkpoint-2"})
    for (const char* f : {"tokenizer.json", "vocab.json", "merges.txt"})
      EXPECT_EQ(read_file_bytes((d / f).string()), read_file_bytes((start / f).string()))
          << d << " " << f;
  const nlohmann::json written = read_json_file((root / "out" / "config.json").string());
  EXPECT_EQ(written["vocab_size"], 1111);
  EXPECT_EQ(written["bos_token_id"], 0);
  EXPECT_EQ(written["eos_token_id"], 0);
  EXPECT_EQ(written["n_positions"], 32);

  // the shape flags cannot change a pretrained model; a longer sequence than n_positions is
  // refused; nothing is written either way
  for (int which = 0; which < 2; ++which) {
    TrainArgs b = a;
    b.output_dir = (root / ("refused" + std::to_string(which))).string();
    if (which == 0) b.n_layer = 4;
    if (which == 1) b.block_size = 64;
    EXPECT_THROW(train(b), Error);
    EXPECT_FALSE(fs::exists(b.output_dir));
  }
}

TEST(HfCheckpoint, ByteLevelConfigNamesNoTokenOutsideTheVocabulary) {
  const nlohmann::json c = read_json_file((trained_model() / "config.json").string());
  EXPECT_TRUE(c["bos_token_id"].is_null());
  EXPECT_TRUE(c["eos_token_id"].is_null());
  EXPECT_EQ(c["vocab_size"], 256);
}

}  // namespace
}  // namespace ct
