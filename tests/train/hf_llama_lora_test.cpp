// LoRA on the Llama family against PEFT (scripts/make_hf_llama_lora_golden.py): PEFT's adapters
// on the transformers checkpoints in tests/data/hf_llama (q/v/o/up/down projections, lora_dropout
// 0.1 with crosstrain's masks) and tests/data/hf_qwen2 (q/k/v/gate, q/k/v biases frozen), trained
// on crosstrain's batches. crosstrain's losses, gradient norms and final adapters equal PEFT's;
// the adapter folder it writes names its tensors as PEFT does; the folder PEFT wrote loads and
// merges (`crosstrain merge-lora`) into a model that evaluates to PEFT's merged model.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/data/text_dataset.h"
#include "core/data/text_tokenizer.h"
#include "core/error.h"
#include "core/io/json_file.h"
#include "core/io/safetensors.h"
#include "core/registry.h"
#include "core/train/adapter_files.h"
#include "core/train/evaluate.h"
#include "core/train/model_files.h"
#include "core/train/trainer.h"
#include "tests/common/test_data_dir.h"
#include "tests/train/train_test_util.h"

namespace ct {
namespace {
namespace fs = std::filesystem;

const std::string kData = ct::test::data_dir();
const std::string kText = kData + "/text/harbour.txt";

std::vector<float> floats(const SafetensorsFile& f, const std::string& name) {
  std::vector<float> v(static_cast<size_t>(f.info(name).numel()));
  std::memcpy(v.data(), f.data(name).data(), v.size() * sizeof(float));
  return v;
}

double eval_on_text(const std::string& dir) {
  auto device = open_device("cpu");
  auto model = load_model(dir, *device);
  std::vector<int32_t> tokens = make_byte_tokenizer()->encode(load_text(kText));
  model->allocate_activations(4, 32);
  return evaluate(*model, tokens, 32, 4).loss;
}

struct Case {
  const char* folder;
  const char* targets;
  double dropout;
  int adapters;  // tensors: 2 layers x targets x (A, B)
};
const Case kLlama{"hf_llama", "q_proj,v_proj,o_proj,up_proj,down_proj", 0.1, 2 * 5 * 2};
const Case kQwen2{"hf_qwen2", "q_proj,k_proj,v_proj,gate_proj", 0.0, 2 * 4 * 2};

// The golden run's settings (scripts/make_hf_llama_lora_golden.py, make_hf_golden.py).
TrainArgs peft_args(const Case& c, const fs::path& out) {
  TrainArgs a = testing::small_model_args(out);
  a.n_layer = a.n_head = a.n_embd = 0;
  a.block_size = 32;
  a.model_name_or_path = kData + "/" + c.folder;
  a.per_device_train_batch_size = 4;
  a.max_steps = 4;
  a.seed = 42;
  a.learning_rate = 5e-3;
  a.lr_scheduler_type = "constant";
  a.warmup_steps = 0;
  a.weight_decay = 0.1;
  a.max_grad_norm = 1.0;
  a.validation_split = 0.1;
  a.logging_steps = 1;
  a.lora_r = 4;
  a.lora_alpha = 16;
  a.lora_dropout = c.dropout;
  a.lora_target_modules = c.targets;
  return a;
}

void expect_peft_run(const Case& c) {
  const std::string dir = kData + "/" + c.folder;
  const SafetensorsFile g = read_safetensors(dir + "/lora_golden.safetensors");
  const fs::path out = testing::fresh_temp_dir(std::string("peft_") + c.folder);
  train(peft_args(c, out));
  const std::vector<nlohmann::json> recs = testing::read_metrics(out);
  const std::vector<float> losses = floats(g, "losses"), norms = floats(g, "grad_norms");
  ASSERT_EQ(recs.size(), losses.size()) << c.folder;
  double worst_loss = 0, worst_adapter = 0;
  for (size_t i = 0; i < losses.size(); ++i) {
    worst_loss = std::max(worst_loss, std::fabs(recs[i]["loss"].get<double>() - losses[i]) /
                                          static_cast<double>(losses[i]));
    EXPECT_NEAR(recs[i]["loss"].get<double>(), losses[i], 1e-5 * losses[i])
        << c.folder << " step " << i + 1;
    EXPECT_NEAR(recs[i]["grad_norm"].get<double>(), norms[i], 1e-4 * norms[i])
        << c.folder << " step " << i + 1;
  }
  // The adapters after the run, under PEFT's names, as PEFT has them, and as PEFT's own
  // save_pretrained names them.
  const SafetensorsFile mine = read_safetensors((out / kAdapterWeights).string());
  const SafetensorsFile peft = read_safetensors(dir + "/peft_lora/" + kAdapterWeights);
  EXPECT_EQ(mine.names().size(), peft.names().size()) << c.folder;
  int compared = 0;
  for (const std::string& name : mine.names()) {
    EXPECT_TRUE(peft.contains(name)) << c.folder << ": PEFT has no " << name;
    ASSERT_TRUE(g.contains(name)) << name;
    const std::vector<float> want = floats(g, name), got = floats(mine, name);
    ASSERT_EQ(got.size(), want.size()) << name;
    EXPECT_EQ(mine.info(name).shape, g.info(name).shape) << name;
    double worst = 0;
    for (size_t i = 0; i < got.size(); ++i)
      worst = std::max(worst, std::fabs(static_cast<double>(got[i]) - want[i]));
    EXPECT_LT(worst, 2e-5) << name;
    worst_adapter = std::max(worst_adapter, worst);
    ++compared;
  }
  EXPECT_EQ(compared, c.adapters) << c.folder;
  std::printf(
      "  %s: LoRA against PEFT, loss relative difference <= %.3g over %zu steps, final "
      "adapters within %.3g\n",
      c.folder, worst_loss, losses.size(), worst_adapter);
  const nlohmann::json cfg = read_json_file((out / kAdapterConfig).string());
  EXPECT_EQ(cfg["fan_in_fan_out"], false);
  EXPECT_EQ(cfg["r"], 4);
  EXPECT_FALSE(fs::exists(out / "model.safetensors"));  // the adapters only
}

TEST(HfLlamaLora, LlamaMatchesPeftWithDropout) {
  expect_peft_run(kLlama);
}

TEST(HfLlamaLora, Qwen2MatchesPeftWithItsBiasesFrozen) {
  expect_peft_run(kQwen2);
}

// The adapter folder PEFT's save_pretrained wrote loads, and merged into its base gives the model
// PEFT's merge_and_unload gave (the eval loss, 1e-5).
TEST(HfLlamaLora, MergesPeftsAdapterFolder) {
  for (const Case& c : {kLlama, kQwen2}) {
    const std::string dir = kData + "/" + c.folder;
    const SafetensorsFile g = read_safetensors(dir + "/lora_golden.safetensors");
    const double want =
        read_as_f32(g.data("eval_loss_merged").data(), g.info("eval_loss_merged").dtype, 0);
    const fs::path out = testing::fresh_temp_dir(std::string("peft_merge_") + c.folder);
    merge_lora(dir, dir + "/peft_lora", out.string());
    EXPECT_NEAR(eval_on_text(out.string()), want, 1e-5 * want) << c.folder;
    // An adapter whose rank disagrees with its tensors is refused naming the tensor.
    const fs::path bad = testing::fresh_temp_dir(std::string("peft_bad_") + c.folder);
    fs::create_directories(bad);
    fs::copy_file(dir + "/peft_lora/" + kAdapterWeights, bad / kAdapterWeights);
    nlohmann::json cfg = read_json_file(dir + "/peft_lora/" + kAdapterConfig);
    cfg["r"] = 8;
    write_json_file((bad / kAdapterConfig).string(), cfg);
    try {
      merge_lora(dir, bad.string(), (bad / "out").string());
      ADD_FAILURE() << c.folder << ": merged";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("lora_A.weight' has shape"), std::string::npos)
          << e.what();
    }
    EXPECT_FALSE(fs::exists(bad / "out"));
  }
}

TEST(HfLlamaLora, RefusesUnknownTargetsByName) {
  TrainArgs a = peft_args(kLlama, testing::fresh_temp_dir("peft_refused"));
  a.lora_target_modules = "q_proj,c_attn";
  try {
    train(a);
    ADD_FAILURE() << "trained";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'c_attn' matches no Llama layer"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace ct
