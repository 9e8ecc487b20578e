// Fine-tuning a model PyTorch wrote in transformers' layout (tests/data/hf_gpt2, made by
// scripts/make_hf_golden.py): crosstrain's eval loss of it, its training losses from it, and the
// eval loss of the model it fine-tuned all equal what PyTorch computed.
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
#include "core/train/evaluate.h"
#include "core/train/model_files.h"
#include "core/train/trainer.h"
#include "tests/train/train_test_util.h"

namespace ct {
namespace {
namespace fs = std::filesystem;

const std::string kModel = std::string(CT_TEST_DATA_DIR) + "/hf_gpt2";
const std::string kText = std::string(CT_TEST_DATA_DIR) + "/text/harbour.txt";

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

}  // namespace
}  // namespace ct
