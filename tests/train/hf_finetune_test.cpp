// Fine-tuning a model PyTorch wrote in transformers' layout (tests/data/hf_gpt2, made by
// scripts/make_hf_golden.py): crosstrain's eval loss of it, its training losses from it, and the
// eval loss of the model it fine-tuned all equal what PyTorch computed. And the other way round
// (scripts/make_finetuned_golden.py): PyTorch loads the folders crosstrain wrote -- a full
// fine-tune, LoRA adapters merged by merge-lora -- and its eval losses are crosstrain's.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/data/text_dataset.h"
#include "core/data/text_tokenizer.h"
#include "core/io/json_file.h"
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

const std::string kModel = ct::test::data_dir() + "/hf_gpt2";
const std::string kText = ct::test::data_dir() + "/text/harbour.txt";

// The eval loss `crosstrain eval --model-path dir --data harbour.txt` reports.
double eval_on_text(const std::string& dir, int B, int T) {
  auto device = open_device("cpu");
  auto model = load_model(dir, *device);
  std::vector<int32_t> tokens = make_byte_tokenizer()->encode(load_text(kText));
  model->allocate_activations(B, T);
  return evaluate(*model, tokens, T, B).loss;
}

TEST(HfFineTune, MatchesPyTorchFromItsCheckpoint) {
  const nlohmann::json g = read_json_file(kModel + "/golden.json");
  const int B = g["B"], T = g["T"];
  const double want_before = g["eval_loss"];
  EXPECT_NEAR(eval_on_text(kModel, B, T), want_before, 1e-5 * want_before);

  const fs::path out = testing::fresh_temp_dir("hf_finetune_torch");
  TrainArgs a = testing::small_model_args(out);
  a.n_layer = a.n_head = a.n_embd = a.block_size = 0;
  a.model_name_or_path = kModel;
  a.per_device_train_batch_size = B;
  a.max_steps = g["steps"];
  a.seed = g["seed"];
  a.learning_rate = g["learning_rate"];
  a.lr_scheduler_type = "constant";
  a.warmup_steps = 0;
  a.weight_decay = g["weight_decay"];
  a.max_grad_norm = g["max_grad_norm"];
  a.validation_split = g["validation_split"];
  a.logging_steps = 1;
  train(a);
  const std::vector<nlohmann::json> recs = testing::read_metrics(out);
  const std::vector<double> want = g["train_losses"].get<std::vector<double>>();
  ASSERT_EQ(recs.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_NEAR(recs[i]["loss"].get<double>(), want[i], 1e-5 * want[i]) << "step " << i + 1;
  const double want_after = g["eval_loss_after"];
  EXPECT_NEAR(eval_on_text(out.string(), B, T), want_after, 1e-5 * want_after);
  EXPECT_LT(want_after, want_before);  // the fine-tuning did something
}

// The settings scripts/make_finetuned_golden.py recorded, on top of the golden's model and data.
TrainArgs args_from(const nlohmann::json& j, const fs::path& out) {
  TrainArgs a = testing::small_model_args(out);
  a.n_layer = a.n_head = a.n_embd = a.block_size = 0;
  a.model_name_or_path = kModel;
  for (const auto& [k, v] : j.items()) {
    if (k == "per_device_train_batch_size")
      a.per_device_train_batch_size = v;
    else if (k == "seed")
      a.seed = v;
    else if (k == "lr_scheduler_type")
      a.lr_scheduler_type = v;
    else if (k == "warmup_steps")
      a.warmup_steps = v;
    else if (k == "weight_decay")
      a.weight_decay = v;
    else if (k == "max_grad_norm")
      a.max_grad_norm = v;
    else if (k == "validation_split")
      a.validation_split = v;
    else if (k == "max_steps")
      a.max_steps = v;
    else if (k == "learning_rate")
      a.learning_rate = v;
    else if (k == "lora_r")
      a.lora_r = v;
    else if (k == "lora_alpha")
      a.lora_alpha = v;
    else if (k == "lora_target_modules")
      a.lora_target_modules = v;
    else if (k == "lora_dropout")
      a.lora_dropout = v;
    else
      ADD_FAILURE() << "finetuned_golden.json: setting '" << k << "' not mapped here";
  }
  return a;
}

TEST(HfFineTune, PyTorchLoadsWhatCrosstrainFineTuned) {
  const nlohmann::json g = read_json_file(kModel + "/finetuned_golden.json");
  const int B = g["B"], T = g["T"];
  const fs::path root = testing::fresh_temp_dir("hf_finetuned_torch");

  train(args_from(g["full"]["args"], root / "full"));
  const double full = g["full"]["torch_eval_loss"];
  EXPECT_NEAR(eval_on_text((root / "full").string(), B, T), full, 1e-5 * full);

  train(args_from(g["lora"]["args"], root / "lora"));
  merge_lora(kModel, (root / "lora").string(), (root / "merged").string());
  const double merged = g["lora"]["torch_eval_loss_merged"];
  const double unmerged = g["lora"]["torch_eval_loss_unmerged"];
  EXPECT_NEAR(eval_on_text((root / "merged").string(), B, T), merged, 1e-5 * merged);
  EXPECT_NEAR(merged, unmerged, 1e-5 * unmerged);  // PyTorch: PEFT's formula = merged weights
  const double base = g["base_eval_loss"];
  EXPECT_LT(full, base);  // both runs changed the model
  EXPECT_LT(merged, base);
  fs::remove_all(root);
}

}  // namespace
}  // namespace ct
