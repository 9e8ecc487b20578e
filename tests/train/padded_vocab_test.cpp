// The padded vocabulary (core/model/model_base.h) on the CPU: a vocabulary that is not a multiple
// of 128 trains with the LM head padded to the next multiple (GPT-2's tied wte, a Llama's untied
// lm_head), the loss and logits() see the real vocabulary only, the zero rows get zero gradients
// and stay exactly zero under every optimizer; the files keep the real vocabulary (model weights,
// the checkpoint's weights and optimizer state), and a run resumed from such a checkpoint is
// bit-exact with the straight run (also with the optimizer offloaded to the host).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "core/io/safetensors.h"
#include "core/model/gpt2.h"
#include "core/model/llama.h"
#include "core/train/optimizer.h"
#include "core/train/trainer.h"
#include "tests/train/train_test_util.h"

namespace ct {
namespace {
namespace fs = std::filesystem;

std::vector<float> down(Device& d, const Tensor& t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  d.download(v.data(), t, v.size() * sizeof(float));
  return v;
}

Tensor upload_tokens(Device& d, int n, int V, int seed) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) v[i] = (i * 37 + seed * 11 + 5) % V;
  v[0] = V - 1;  // the last real class
  Tensor t = d.empty({n}, DType::i32, MemCategory::kActivations);
  d.upload(t, v.data(), v.size() * sizeof(int32_t));
  return t;
}

// Every element of the head's padding rows (after the rows of `head` in the device buffer
// `flat`) is +0.
bool padding_is_zero(Device& d, const ModelBase& m, const Tensor& flat, const std::string& head) {
  const ParamInfo& p = m.param_info(head);
  std::vector<float> v =
      down(d, flat.slice_flat(p.offset + p.numel, {(m.padded_vocab() - m.vocab()) * p.shape[1]}));
  for (float x : v)
    if (x != 0.0f || std::signbit(x)) return false;
  return true;
}

// The loss from the downloaded logits, fp64: mean over rows of log-sum-exp minus the target's.
double host_loss(const std::vector<float>& logits, const std::vector<int32_t>& targets, int V) {
  double total = 0.0;
  for (size_t r = 0; r < targets.size(); ++r) {
    const float* x = logits.data() + r * V;
    double m = x[0], s = 0.0;
    for (int i = 0; i < V; ++i) m = std::max(m, double(x[i]));
    for (int i = 0; i < V; ++i) s += std::exp(double(x[i]) - m);
    total += std::log(s) + m - x[targets[r]];
  }
  return total / static_cast<double>(targets.size());
}

void check_model(ModelBase& m, Device& d, int V, int C, const std::string& head) {
  EXPECT_EQ(m.vocab(), V);
  EXPECT_EQ(m.padded_vocab(), padded_vocab_size(V));
  EXPECT_EQ(m.padded_vocab() % 128, 0);
  EXPECT_EQ(m.flat_size(), m.num_parameters() + (m.padded_vocab() - V) * C);
  for (const ParamInfo& p : m.params())  // the host table: real vocabulary
    EXPECT_NE(p.shape[0], m.padded_vocab()) << p.name;
  EXPECT_EQ(static_cast<int64_t>(m.download_params().size()), m.num_parameters());
  m.init(5);
  EXPECT_TRUE(padding_is_zero(d, m, m.params_flat(), head));
  const int B = 2, T = 8;
  Tensor tokens = upload_tokens(d, B * T, V, 1), targets = upload_tokens(d, B * T, V, 2);
  std::vector<int32_t> tg(B * T);
  d.download(tg.data(), targets, tg.size() * sizeof(int32_t));
  m.zero_grad();
  float loss = 0.0f;
  d.download(&loss, m.forward(tokens, &targets, B, T), sizeof loss);
  Tensor logits = m.logits();
  EXPECT_EQ(logits.shape, Shape({B, T, V}));
  std::vector<float> host = down(d, logits);
  EXPECT_NEAR(loss, host_loss(host, tg, V), 1e-5 * std::fabs(loss));
  std::vector<float> one = down(d, m.logits_at(1, 3));
  EXPECT_EQ(one, std::vector<float>(host.begin() + (T + 3) * V, host.begin() + (T + 4) * V));
  m.backward();
  EXPECT_TRUE(padding_is_zero(d, m, m.grads_flat(), head));
  EXPECT_EQ(static_cast<int64_t>(m.download_grads().size()), m.num_parameters());
  // Every optimizer leaves the padding rows at exactly zero (weight decay included).
  const std::vector<float> before = m.download_params();
  for (OptimKind k : {OptimKind::kAdamW, OptimKind::kAdamW8bit, OptimKind::kAdafactor,
                      OptimKind::kLion, OptimKind::kSgd}) {
    SCOPED_TRACE(optim_name(k));
    OptimizerSettings s;
    s.kind = k;
    s.weight_decay = 0.1;
    s.momentum = 0.9;
    s.min_8bit_size = 256;
    std::unique_ptr<Optimizer> opt = make_optimizer(m, s);
    for (int step = 1; step <= 2; ++step) {
      m.zero_grad();
      m.forward(tokens, &targets, B, T);
      m.backward();
      opt->step(m, Tensor(), 1e-2, step);
      m.refresh_compute_weights();
    }
    EXPECT_TRUE(padding_is_zero(d, m, m.params_flat(), head));
    EXPECT_TRUE(padding_is_zero(d, m, m.grads_flat(), head));
  }
  EXPECT_NE(m.download_params(), before);  // the real rows did train
}

TEST(PaddedVocab, Gpt2TiedHeadIsPaddedOnTheDeviceOnly) {
  std::unique_ptr<Device> d = make_cpu_device(false);
  GPT2Config c;
  c.n_layer = 1;
  c.n_head = 2;
  c.n_embd = 32;
  c.block_size = 16;
  c.vocab_size = 200;
  GPT2 m(*d, c, true);
  EXPECT_EQ(m.param_info("wte.weight").shape, Shape({200, 32}));
  EXPECT_EQ(m.param_info("wpe.weight").offset, 256 * 32);  // after the zero rows
  check_model(m, *d, 200, 32, "wte.weight");
}

TEST(PaddedVocab, LlamaUntiedHeadIsPaddedOnTheDeviceOnly) {
  std::unique_ptr<Device> d = make_cpu_device(false);
  LlamaConfig c = LlamaConfig::preset("llama-tiny");
  c.n_layer = 1;
  c.n_head = 2;
  c.n_kv_head = 1;
  c.n_embd = 32;
  c.intermediate_size = 64;
  c.block_size = 16;
  c.vocab_size = 100;
  c.tie_word_embeddings = false;
  Llama m(*d, c, true);
  EXPECT_EQ(m.param_info("lm_head.weight").shape, Shape({100, 32}));
  check_model(m, *d, 100, 32, "lm_head.weight");
}

// Through the trainer: files with the real vocabulary, and a resume from a checkpoint (weights
// and optimizer state of V rows) bit-exact with the straight run.
class PaddedVocabRuns : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { root_ = testing::fresh_temp_dir("padvocab"); }
  void TearDown() override { fs::remove_all(root_); }
  TrainArgs args(const std::string& out) const {
    TrainArgs a = testing::small_model_args(root_ / out);
    a.vocab_size = 300;  // bytes as tokens, 300 classes: padded to 384 on the device
    const std::string spec = GetParam();  // "adamw+offload": --optim adamw --offload-optimizer
    a.optim = spec.substr(0, spec.find('+'));
    a.offload_optimizer = spec.find("+offload") != std::string::npos;
    a.max_steps = 4;
    a.per_device_train_batch_size = 2;
    a.learning_rate = 3e-3;
    a.weight_decay = 0.1;
    a.max_eval_batches = 1;
    return a;
  }
  fs::path root_;
};

TEST_P(PaddedVocabRuns, FilesKeepTheRealVocabularyAndResumeIsBitExact) {
  TrainArgs straight = args("straight");
  straight.save_steps = 2;
  train(straight);
  const fs::path ck = fs::path(straight.output_dir) / "checkpoint-2";
  for (const fs::path& f :
       {fs::path(straight.output_dir) / "model.safetensors", ck / "model.safetensors"}) {
    SafetensorsFile st = read_safetensors(f.string());
    EXPECT_EQ(st.info("wte.weight").to_shape(), Shape({300, 32})) << f;
  }
  SafetensorsFile opt = read_safetensors((ck / "optimizer.safetensors").string());
  int with_vocab_rows = 0;
  for (const std::string& n : opt.names()) {
    if (n.find("wte.weight") == std::string::npos) continue;
    const Shape s = opt.info(n).to_shape();
    EXPECT_NE(s[0], 384) << n << " " << s.str();
    with_vocab_rows += s[0] == 300;
  }
  EXPECT_GT(with_vocab_rows, 0);
  TrainArgs resumed = args("resumed");
  fs::create_directories(resumed.output_dir);
  fs::copy(ck, fs::path(resumed.output_dir) / "checkpoint-2", fs::copy_options::recursive);
  fs::copy(fs::path(straight.output_dir) / "metrics.jsonl",
           fs::path(resumed.output_dir) / "metrics.jsonl");
  resumed.resume_from_checkpoint = (fs::path(resumed.output_dir) / "checkpoint-2").string();
  train(resumed);
  testing::expect_same_run(straight.output_dir, resumed.output_dir);
}

INSTANTIATE_TEST_SUITE_P(Optimizers, PaddedVocabRuns,
                         ::testing::Values("adamw", "adamw_8bit", "adafactor", "adamw+offload"),
                         [](const ::testing::TestParamInfo<std::string>& i) {
                           std::string n = i.param;
                           for (char& ch : n)
                             if (ch == '+') ch = '_';
                           return n;
                         });

}  // namespace
}  // namespace ct
