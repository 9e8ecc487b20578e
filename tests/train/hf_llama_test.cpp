// Llama-family checkpoints as transformers writes them (save_pretrained; made by
// scripts/make_hf_llama_golden.py): tests/data/hf_llama (LlamaForCausalLM, grouped-query
// attention, untied head) and tests/data/hf_qwen2 (Qwen2ForCausalLM: q/k/v biases, tied head,
// rope_theta 1e6). crosstrain's eval loss of each, its training losses when fine-tuned from it
// (--model-name-or-path), and the eval loss of what it wrote all equal what transformers
// computed. Also: the folder crosstrain writes for a Llama is a Llama folder again,
// a checkpoint resumes bit-exactly, and configs or tensors it cannot build are refused by name.
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/data/text_dataset.h"
#include "core/data/text_tokenizer.h"
#include "core/data/token_file.h"
#include "core/error.h"
#include "core/io/json_file.h"
#include "core/registry.h"
#include "core/train/evaluate.h"
#include "core/train/model_files.h"
#include "core/train/trainer.h"
#include "tests/common/test_data_dir.h"
#include "tests/train/train_test_util.h"

namespace ct {
namespace {
namespace fs = std::filesystem;

const std::string kModel = ct::test::data_dir() + "/hf_llama";
const std::string kQwen2 = ct::test::data_dir() + "/hf_qwen2";
const std::string kText = ct::test::data_dir() + "/text/harbour.txt";

double eval_on_text(const std::string& dir, int B, int T) {
  auto device = open_device("cpu");
  auto model = load_model(dir, *device);
  std::vector<int32_t> tokens = make_byte_tokenizer()->encode(load_text(kText));
  model->allocate_activations(B, T);
  return evaluate(*model, tokens, T, B).loss;
}

TrainArgs golden_args(const nlohmann::json& g, const fs::path& out,
                      const std::string& model = kModel) {
  TrainArgs a = testing::small_model_args(out);
  a.n_layer = a.n_head = a.n_embd = 0;
  a.block_size = g["T"];  // the training length, below max_position_embeddings 64
  a.model_name_or_path = model;
  a.per_device_train_batch_size = g["B"];
  a.max_steps = g["steps"];
  a.seed = g["seed"];
  a.learning_rate = g["learning_rate"];
  a.lr_scheduler_type = "constant";
  a.warmup_steps = 0;
  a.weight_decay = g["weight_decay"];
  a.max_grad_norm = g["max_grad_norm"];
  a.validation_split = g["validation_split"];
  a.logging_steps = 1;
  return a;
}

// Eval, fine-tune and eval again from `model`, against its golden.json; returns the output.
fs::path check_against_transformers(const std::string& model, const std::string& tag) {
  const nlohmann::json g = read_json_file(model + "/golden.json");
  const int B = g["B"], T = g["T"];
  const double want_before = g["eval_loss"];
  EXPECT_NEAR(eval_on_text(model, B, T), want_before, 1e-5 * want_before) << tag;

  const fs::path out = testing::fresh_temp_dir(tag);
  train(golden_args(g, out, model));
  const std::vector<nlohmann::json> recs = testing::read_metrics(out);
  const std::vector<double> want = g["train_losses"].get<std::vector<double>>();
  EXPECT_EQ(recs.size(), want.size()) << tag;
  for (size_t i = 0; i < want.size() && i < recs.size(); ++i)
    EXPECT_NEAR(recs[i]["loss"].get<double>(), want[i], 1e-5 * want[i]) << tag << " step " << i + 1;
  const double want_after = g["eval_loss_after"];
  EXPECT_NEAR(eval_on_text(out.string(), B, T), want_after, 1e-5 * want_after) << tag;
  EXPECT_LT(want_after, want_before);
  return out;
}

TEST(HfLlama, MatchesTransformersFromItsCheckpoint) {
  const fs::path out = check_against_transformers(kModel, "hf_llama_finetune");
  // What crosstrain wrote is a Llama folder with the same architecture and transformers' names.
  const nlohmann::json c = read_json_file((out / "config.json").string());
  EXPECT_EQ(c["model_type"], "llama");
  EXPECT_EQ(c["architectures"][0], "LlamaForCausalLM");
  EXPECT_EQ(c["num_key_value_heads"], 2);
  EXPECT_EQ(c["tie_word_embeddings"], false);
}

TEST(HfLlama, Qwen2WithBiasesAndATiedHeadMatchesTransformers) {
  const fs::path out = check_against_transformers(kQwen2, "hf_qwen2_finetune");
  const nlohmann::json c = read_json_file((out / "config.json").string());
  EXPECT_EQ(c["model_type"], "qwen2");
  EXPECT_EQ(c["architectures"][0], "Qwen2ForCausalLM");
  EXPECT_EQ(c["tie_word_embeddings"], true);
}

// k steps, a checkpoint, a resume to 2k: the same run as 2k straight (losses and weight bytes).
TEST(HfLlama, ResumesBitExactly) {
  const nlohmann::json g = read_json_file(kModel + "/golden.json");
  const fs::path root = testing::fresh_temp_dir("hf_llama_resume");
  TrainArgs straight = golden_args(g, root / "straight");
  straight.max_steps = 4;
  train(straight);
  TrainArgs first = golden_args(g, root / "resumed");
  first.max_steps = 2;
  first.save_steps = 2;
  train(first);
  TrainArgs second = first;
  second.max_steps = 4;
  second.save_steps = 0;
  second.resume_from_checkpoint = "latest";
  train(second);
  testing::expect_same_run(straight.output_dir, second.output_dir);
}

// A folder whose tokenizer.json crosstrain cannot read (here the SentencePiece style of Llama 2
// and Mistral: a Metaspace pre-tokenizer) trains on token-file data all the same -- the ids are
// the data -- and its tokenizer files are copied beside the output; on text it is refused naming
// the field.
TEST(HfLlama, TrainsOnTokenFilesWhateverItsTokenizer) {
  const fs::path root = testing::fresh_temp_dir("hf_llama_ids_only");
  const fs::path dir = root / "model";
  fs::create_directories(dir);
  for (const char* f : {"config.json", "model.safetensors"})
    fs::copy_file(fs::path(kModel) / f, dir / f);
  nlohmann::json tok = read_json_file(ct::test::data_dir() + "/bpe/tokenizer.json");
  tok["pre_tokenizer"] = {{"type", "Metaspace"},
                          {"replacement", "\u2581"},
                          {"prepend_scheme", "first"},
                          {"split", false}};
  write_json_file((dir / "tokenizer.json").string(), tok);
  const std::vector<int32_t> ids = make_byte_tokenizer()->encode(load_text(kText));
  write_llmc_token_file((root / "data.tok").string(), ids);

  const nlohmann::json g = read_json_file(kModel + "/golden.json");
  TrainArgs a = golden_args(g, root / "out", dir.string());
  a.data = (root / "data.tok").string();
  a.max_steps = 2;
  a.sample_tokens = 4;
  const TrainSummary s = train(a);
  EXPECT_EQ(testing::read_metrics(root / "out").size(), 2u);
  EXPECT_TRUE(fs::exists(root / "out" / "tokenizer.json"));
  EXPECT_EQ(s.sample.front(), '[');  // the sample as ids

  a.data = kText;
  a.output_dir = (root / "out_text").string();
  try {
    train(a);
    ADD_FAILURE() << "trained on text without its tokenizer";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'pre_tokenizer'"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(root / "out_text"));
}

TEST(HfLlama, RefusesWhatItCannotBuildByName) {
  const fs::path root = testing::fresh_temp_dir("hf_llama_refused");
  auto refused = [&](const std::string& name, const std::function<void(const fs::path&)>& edit,
                     const std::string& needle) {
    const fs::path dir = root / name;
    fs::create_directories(dir);
    for (const char* f : {"config.json", "model.safetensors"})
      fs::copy_file(fs::path(kModel) / f, dir / f);
    edit(dir);
    auto device = open_device("cpu");
    try {
      load_model(dir.string(), *device);
      ADD_FAILURE() << name << ": loaded";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << name << ": " << e.what();
    }
  };
  auto set = [](const char* key, nlohmann::json v) {
    return [key, v](const fs::path& dir) {
      nlohmann::json c = read_json_file((dir / "config.json").string());
      c[key] = v;
      write_json_file((dir / "config.json").string(), c);
    };
  };
  refused("kv_heads", set("num_key_value_heads", 3), "num_key_value_heads 3");
  refused("heads", set("num_attention_heads", 5), "num_attention_heads 5");
  refused("act", set("hidden_act", "gelu"), "hidden_act");
  refused("scaling", set("rope_scaling", {{"rope_type", "dynamic"}, {"factor", 2.0}}),
          "rope_scaling");
  refused("type", set("model_type", "mixtral"), "mixtral");
  // A shape the config does not make: the tensor is named.
  refused("shape", set("intermediate_size", 160), "mlp.gate_proj.weight");
}

}  // namespace
}  // namespace ct
