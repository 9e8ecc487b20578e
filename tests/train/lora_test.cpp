// LoRA: crosstrain's adapters trained from the PyTorch GPT-2 of tests/data/hf_gpt2 against the
// same adapters in PyTorch (scripts/make_lora_golden.py) -- losses, gradient norms, the step-2
// gradients and the final adapters; the frozen base (no gradients, no optimizer state, bytes
// untouched); PEFT's files; bit-exact resume; merge-lora against evaluating base + adapters; and
// the same training on every device.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/data/batch_loader.h"
#include "core/data/text_dataset.h"
#include "core/data/text_tokenizer.h"
#include "core/error.h"
#include "core/io/json_file.h"
#include "core/io/read_file.h"
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

const std::string kBase = ct::test::data_dir() + "/hf_gpt2";
const std::string kText = ct::test::data_dir() + "/text/harbour.txt";

std::vector<float> floats(const SafetensorsFile& f, const std::string& name) {
  std::vector<float> v(static_cast<size_t>(f.info(name).numel()));
  std::memcpy(v.data(), f.data(name).data(), v.size() * sizeof(float));
  return v;
}

// The golden run's adapters: r 4, alpha 16 on c_attn and c_proj.
ModelOptions golden_lora() {
  ModelOptions o;
  o.lora.r = 4;
  o.lora.alpha = 16;
  o.lora.target_modules = {"c_attn", "c_proj"};
  return o;
}

// The adapter gradients of one forward/backward on inputs x, targets y ([4, 32] each).
std::vector<float> adapter_grads(Device& dev, GPT2& model, const std::vector<int32_t>& x,
                                 const std::vector<int32_t>& y) {
  Tensor in = dev.empty({4, 32}, DType::i32, MemCategory::kActivations);
  Tensor tg = dev.empty({4, 32}, DType::i32, MemCategory::kActivations);
  dev.upload(in, x.data(), x.size() * 4);
  dev.upload(tg, y.data(), y.size() * 4);
  model.zero_grad();
  model.forward(in, &tg, 4, 32);
  model.backward();
  std::vector<float> grads(static_cast<size_t>(model.num_trainable()));
  dev.download(grads.data(), model.trainable_grads(), grads.size() * 4);
  return grads;
}

// The golden run's settings (scripts/make_lora_golden.py).
TrainArgs lora_args(const fs::path& out, const std::string& backend = "cpu") {
  TrainArgs a = testing::small_model_args(out);
  a.n_layer = a.n_head = a.n_embd = a.block_size = 0;
  a.model_name_or_path = kBase;
  a.backend = backend;
  a.per_device_train_batch_size = 4;
  a.max_steps = 5;
  a.seed = 42;
  a.learning_rate = 5e-3;
  a.lr_scheduler_type = "constant";
  a.warmup_steps = 0;
  a.weight_decay = 0.1;
  a.max_grad_norm = 1.0;
  a.lora_r = 4;
  a.lora_alpha = 16;
  a.lora_target_modules = "c_attn,c_proj";
  return a;
}

TEST(Lora, MatchesPyTorchAdapters) {
  const SafetensorsFile g = read_safetensors(kBase + "/lora_golden.safetensors");
  const fs::path out = testing::fresh_temp_dir("lora_torch");
  train(lora_args(out));
  const std::vector<nlohmann::json> recs = testing::read_metrics(out);
  const std::vector<float> losses = floats(g, "losses"), norms = floats(g, "grad_norms");
  ASSERT_EQ(recs.size(), losses.size());
  for (size_t i = 0; i < losses.size(); ++i) {
    EXPECT_NEAR(recs[i]["loss"].get<double>(), losses[i], 2e-6 * losses[i]) << "step " << i + 1;
    EXPECT_NEAR(recs[i]["grad_norm"].get<double>(), norms[i], 1e-4 * norms[i]) << "step " << i + 1;
  }
  // The adapters after 5 steps, under PEFT's names, as PyTorch has them.
  const SafetensorsFile mine = read_safetensors((out / kAdapterWeights).string());
  int compared = 0;
  for (const std::string& name : mine.names()) {
    ASSERT_TRUE(g.contains(name)) << name;
    const std::vector<float> want = floats(g, name), got = floats(mine, name);
    ASSERT_EQ(got.size(), want.size()) << name;
    EXPECT_EQ(mine.info(name).shape, g.info(name).shape) << name;
    double worst = 0;
    for (size_t i = 0; i < got.size(); ++i)
      worst = std::max(worst, std::fabs(static_cast<double>(got[i]) - want[i]));
    EXPECT_LT(worst, 2e-5) << name;
    ++compared;
  }
  EXPECT_EQ(compared, 2 * 2 * 3);  // 2 layers x (c_attn, attn.c_proj, mlp.c_proj) x (A, B)
  const nlohmann::json cfg = read_json_file((out / kAdapterConfig).string());
  EXPECT_EQ(cfg["peft_type"], "LORA");
  EXPECT_EQ(cfg["r"], 4);
  EXPECT_EQ(cfg["lora_alpha"], 16.0);
  EXPECT_EQ(cfg["target_modules"], nlohmann::json({"c_attn", "c_proj"}));
  EXPECT_EQ(cfg["fan_in_fan_out"], true);
  EXPECT_FALSE(fs::exists(out / "model.safetensors"));  // PEFT saves the adapters only
}

TEST(Lora, TheBaseIsFrozenAndBStartsAtZero) {
  auto dev = open_device("cpu");
  const ModelOptions o = golden_lora();
  const int64_t grads_before = dev->memory().current[static_cast<int>(MemCategory::kGrads)];
  GPT2 model(*dev, read_model_config(kBase).gpt2(), /*with_grads=*/true, o);
  // Gradient memory: the adapters' only.
  EXPECT_EQ(dev->memory().current[static_cast<int>(MemCategory::kGrads)] - grads_before,
            model.num_trainable() * 4);
  EXPECT_EQ(model.num_trainable(), 2 * (4 * 32 + 96 * 4 + 4 * 32 + 32 * 4 + 4 * 128 + 32 * 4));
  EXPECT_THROW(model.grads_flat(), Error);
  model.init(42);
  load_weights_from_folder(kBase, model);
  const std::vector<float> base_before = model.download_params();
  // With B = 0 (PEFT's init) the first gradient of every A is zero and B's is not.
  auto tokens = make_byte_tokenizer()->encode(load_text(kText));
  const std::vector<float> grads =
      adapter_grads(*dev, model, std::vector<int32_t>(tokens.begin(), tokens.begin() + 128),
                    std::vector<int32_t>(tokens.begin() + 1, tokens.begin() + 129));
  for (const ParamInfo& p : model.lora_params()) {
    double sq = 0;
    for (int64_t i = 0; i < p.numel; ++i) sq += double{grads[p.offset + i]} * grads[p.offset + i];
    if (p.name.find("lora_A") != std::string::npos)
      EXPECT_EQ(sq, 0.0) << p.name;
    else
      EXPECT_GT(sq, 0.0) << p.name;
  }
  EXPECT_EQ(model.download_params(), base_before);  // forward/backward leave the base alone
}

TEST(Lora, StepTwoGradientsMatchPyTorch) {
  // Train one step with crosstrain (equal to PyTorch's, checked above), then compare the
  // gradients of step 2 tensor by tensor.
  const SafetensorsFile g = read_safetensors(kBase + "/lora_golden.safetensors");
  const fs::path out = testing::fresh_temp_dir("lora_step1");
  TrainArgs a = lora_args(out);
  a.max_steps = 1;
  a.save_steps = 1;
  train(a);
  auto dev = open_device("cpu");
  GPT2 model(*dev, read_model_config(kBase).gpt2(), /*with_grads=*/true, golden_lora());
  model.init(42);
  load_weights_from_folder(kBase, model);
  load_adapter((out / "checkpoint-1").string(), model);
  // Batch 1 of crosstrain's loader (the golden's step 2).
  auto tokens = make_byte_tokenizer()->encode(load_text(kText));
  TokenSplit split = split_train_val(tokens, 0.1, 33);
  BatchLoader loader(split.train, 4, 32, 42);
  const Batch b = loader.make_batch(1);
  const std::vector<float> grads = adapter_grads(*dev, model, b.inputs, b.targets);
  for (const ParamInfo& p : model.lora_params()) {
    const std::vector<float> want = floats(g, "grads_step2.base_model.model.transformer." + p.name);
    ASSERT_EQ(static_cast<int64_t>(want.size()), p.numel) << p.name;
    double err = 0, ref = 0;
    for (int64_t i = 0; i < p.numel; ++i) {
      err = std::max(err, std::fabs(double{grads[p.offset + i]} - want[i]));
      ref = std::max(ref, std::fabs(double{want[i]}));
    }
    EXPECT_LT(err, 1e-4 * ref + 1e-7) << p.name << " max |grad| " << ref;
  }
}

TEST(Lora, ResumeIsBitExactAndMergeEqualsBasePlusAdapters) {
  const fs::path root = testing::fresh_temp_dir("lora_resume");
  TrainArgs full = lora_args(root / "full");
  full.max_steps = 6;
  full.save_steps = 3;
  full.optim = "adamw";
  full.lora_dropout = 0.1;  // masks numbered by micro-batch: the resumed half draws the same
  train(full);
  TrainArgs first = full;
  first.output_dir = (root / "resumed").string();
  first.max_steps = 3;
  train(first);
  TrainArgs second = first;
  second.max_steps = 6;
  second.resume_from_checkpoint = "latest";
  train(second);
  EXPECT_EQ(read_file_bytes((root / "full" / kAdapterWeights).string()),
            read_file_bytes((root / "resumed" / kAdapterWeights).string()));
  const auto ra = testing::read_metrics(root / "full"),
             rb = testing::read_metrics(root / "resumed");
  ASSERT_EQ(ra.size(), rb.size());
  for (size_t i = 0; i < ra.size(); ++i) EXPECT_EQ(ra[i]["loss"], rb[i]["loss"]) << i;
  // A checkpoint holds the adapters and their optimizer state only.
  const fs::path ck = root / "full" / "checkpoint-3";
  EXPECT_TRUE(fs::exists(ck / kAdapterWeights));
  EXPECT_FALSE(fs::exists(ck / "model.safetensors"));
  EXPECT_LT(fs::file_size(ck / "optimizer.safetensors"), 8u * 2816 + 4096);  // AdamW: 8 B each

  // merge-lora: a full model whose eval loss is the adapted model's
  const fs::path merged = root / "merged";
  merge_lora(kBase, (root / "full").string(), merged.string());
  auto dev = open_device("cpu");
  auto tokens = make_byte_tokenizer()->encode(load_text(kText));
  auto m = load_model(merged.string(), *dev);
  m->allocate_activations(4, 32);
  const double merged_loss = evaluate(*m, tokens, 32, 4).loss;
  ModelOptions o;
  o.lora = read_adapter_config((root / "full").string());
  EXPECT_FLOAT_EQ(o.lora.dropout, 0.1f);  // written as PEFT writes it, read back
  GPT2 adapted(*dev, read_model_config(kBase).gpt2(), /*with_grads=*/false, o);
  load_weights_from_folder(kBase, adapted);
  load_adapter((root / "full").string(), adapted);
  adapted.allocate_activations(4, 32);
  const double adapted_loss = evaluate(adapted, tokens, 32, 4).loss;
  EXPECT_NEAR(merged_loss, adapted_loss, 1e-5 * adapted_loss);
  const nlohmann::json c = read_json_file((merged / "config.json").string());
  EXPECT_EQ(c["model_type"], "gpt2");
  // The adapters' folder is not a model: loading it says to merge first.
  try {
    load_model((root / "full").string(), *dev);
    ADD_FAILURE() << "an adapter folder loaded as a model";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("merge-lora"), std::string::npos) << e.what();
  }
}

TEST(Lora, BadSettingsAreRefusedByName) {
  const fs::path root = testing::fresh_temp_dir("lora_bad");
  auto refused = [&](TrainArgs a, const std::string& mention) {
    a.output_dir = (root / "out").string();
    try {
      train(a);
      ADD_FAILURE() << "trained";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(mention), std::string::npos) << e.what();
    }
    EXPECT_FALSE(fs::exists(root / "out"));
  };
  TrainArgs a = lora_args(root / "out");
  a.lora_dropout = 1.0;
  refused(a, "--lora-dropout");
  a = lora_args(root / "out");
  a.lora_target_modules = "q_proj";
  refused(a, "q_proj");
  a = lora_args(root / "out");
  a.lora_r = 100;
  refused(a, "--lora-r");
  a = lora_args(root / "out");
  a.lora_target_modules = "c_attn,,c_fc";
  refused(a, "--lora-target-modules");
}

}  // namespace
}  // namespace ct
