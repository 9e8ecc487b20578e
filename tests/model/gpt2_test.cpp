// GPT2Config and GPT2 structure: presets, validation messages, the parameter table, the
// initialisation, gradient accumulation and sampling.
#include "core/model/gpt2.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <set>

#include "backends/cpu/cpu_backend.h"
#include "core/error.h"
#include "core/model/config.h"
#include "core/philox.h"

namespace ct {
namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument) << e.what();
    return e.what();
  }
  return "(no error)";
}

GPT2Config small_config() {
  GPT2Config c;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 32;
  c.block_size = 16;
  c.vocab_size = 50;
  return c;
}

// ---- config -------------------------------------------------------------------------------------

TEST(GPT2Config, Presets) {
  GPT2Config tiny = GPT2Config::preset("tiny");
  EXPECT_EQ(tiny.n_layer, 6);
  EXPECT_EQ(tiny.n_head, 6);
  EXPECT_EQ(tiny.n_embd, 384);
  EXPECT_EQ(tiny.block_size, 256);
  EXPECT_EQ(tiny.vocab_size, 256);
  EXPECT_EQ(tiny.num_parameters(), 10'844'160);
  EXPECT_EQ(GPT2Config::preset("gpt2").num_parameters(), 124'439'808);
  EXPECT_EQ(GPT2Config::preset("gpt2-medium").num_parameters(), 354'823'168);
  for (const std::string& name : GPT2Config::preset_names())
    EXPECT_NO_THROW(GPT2Config::preset(name).validate()) << name;
}

TEST(GPT2Config, UnknownPresetListsPresets) {
  std::string msg = error_of([] { GPT2Config::preset("gpt5"); });
  EXPECT_NE(msg.find("gpt5"), std::string::npos) << msg;
  EXPECT_NE(msg.find("tiny, gpt2, gpt2-medium"), std::string::npos) << msg;
}

TEST(GPT2Config, ValidationNamesTheFlag) {
  GPT2Config c = GPT2Config::preset("tiny");
  c.n_head = 5;
  EXPECT_EQ(error_of([&] { c.validate(); }), "--n-head 5 does not divide --n-embd 384");
  c = GPT2Config::preset("tiny");
  c.n_layer = 0;
  EXPECT_EQ(error_of([&] { c.validate(); }), "--n-layer must be positive, got 0");
  c = GPT2Config::preset("tiny");
  c.vocab_size = -3;
  EXPECT_EQ(error_of([&] { c.validate(); }), "--vocab-size must be positive, got -3");
}

TEST(GPT2Config, HuggingFaceJsonRoundTrip) {
  GPT2Config c = GPT2Config::preset("gpt2-medium");
  nlohmann::json j = c.to_hf_json();
  EXPECT_EQ(j["model_type"], "gpt2");
  EXPECT_EQ(j["architectures"], nlohmann::json::array({"GPT2LMHeadModel"}));
  EXPECT_EQ(j["n_positions"], 1024);
  EXPECT_EQ(j["n_ctx"], 1024);
  EXPECT_EQ(j["activation_function"], "gelu_new");
  EXPECT_EQ(j["tie_word_embeddings"], true);
  EXPECT_EQ(GPT2Config::from_hf_json(j), c);

  j["model_type"] = "bert";
  EXPECT_NE(error_of([&] { GPT2Config::from_hf_json(j); }).find("bert"), std::string::npos);
  j["model_type"] = "gpt2";
  j.erase("n_head");
  EXPECT_NE(error_of([&] { GPT2Config::from_hf_json(j); }).find("n_head"), std::string::npos);
}

// ---- parameter table
// ------------------------------------------------------------------------------

TEST(GPT2, ParamTableNamesShapesAndOrder) {
  GPT2Config c = GPT2Config::preset("gpt2");
  std::vector<ParamInfo> t = gpt2_param_table(c);
  ASSERT_EQ(t.size(), 2u + 12u * 12u + 2u);
  EXPECT_EQ(t[0].name, "wte.weight");
  EXPECT_EQ(t[0].shape, Shape({50257, 768}));
  EXPECT_EQ(t[1].name, "wpe.weight");
  EXPECT_EQ(t[1].shape, Shape({1024, 768}));
  EXPECT_EQ(t[2].name, "h.0.attn.c_attn.weight");
  EXPECT_EQ(t[2].shape, Shape({768, 3 * 768}));
  EXPECT_EQ(t[3].name, "h.0.attn.c_proj.weight");
  EXPECT_EQ(t[4].name, "h.0.mlp.c_fc.weight");
  EXPECT_EQ(t[4].shape, Shape({768, 4 * 768}));
  EXPECT_EQ(t[5].name, "h.0.mlp.c_proj.weight");
  EXPECT_EQ(t[5].shape, Shape({4 * 768, 768}));
  EXPECT_EQ(t.back().name, "ln_f.bias");

  int64_t offset = 0, decay_count = 0;
  bool in_decay_group = true;
  std::set<std::string> names;
  for (const ParamInfo& p : t) {
    EXPECT_EQ(p.offset, offset) << p.name;
    EXPECT_EQ(p.numel, p.shape.numel()) << p.name;
    offset += p.numel;
    EXPECT_TRUE(names.insert(p.name).second) << "duplicate " << p.name;
    bool matrix = p.shape.ndim == 2;
    EXPECT_EQ(p.decay, matrix) << p.name;  // decay exactly the matrices and embeddings
    if (!p.decay) in_decay_group = false;
    EXPECT_TRUE(p.decay == in_decay_group) << p.name << " breaks decayed-first order";
    if (p.decay) decay_count += p.numel;
  }
  EXPECT_EQ(offset, 124'439'808);
  for (int l = 0; l < 12; ++l)
    for (const char* s : {"ln_1.weight", "ln_1.bias", "attn.c_attn.bias", "attn.c_proj.bias",
                          "ln_2.weight", "ln_2.bias", "mlp.c_fc.bias", "mlp.c_proj.bias"})
      EXPECT_TRUE(names.count("h." + std::to_string(l) + "." + s)) << l << " " << s;

  auto dev = make_cpu_device(false);
  GPT2 model(*dev, small_config());
  EXPECT_EQ(model.num_parameters(), small_config().num_parameters());
  int64_t small_decay = 0;
  for (const ParamInfo& p : model.params()) small_decay += p.decay ? p.numel : 0;
  // The device buffers hold wte padded to 128 rows (50 -> 128): decay region and sizes include
  // the zero rows, the host table and num_parameters() do not.
  const int64_t pad = (128 - 50) * 32;
  EXPECT_EQ(model.padded_vocab(), 128);
  EXPECT_EQ(model.flat_size(), model.num_parameters() + pad);
  EXPECT_EQ(model.decay_count(), small_decay + pad);
  EXPECT_EQ(model.param("h.1.mlp.c_fc.weight").shape, Shape({32, 128}));
  EXPECT_EQ(model.grad("h.1.mlp.c_fc.bias").shape, Shape({128}));
  EXPECT_NE(error_of([&] { model.param("h.9.ln_1.weight"); }).find("h.9.ln_1.weight"),
            std::string::npos);
  EXPECT_EQ(dev->memory().current[static_cast<int>(MemCategory::kWeights)], model.flat_size() * 4);
  EXPECT_EQ(dev->memory().current[static_cast<int>(MemCategory::kGrads)], model.flat_size() * 4);
}

// ---- initialisation
// ----------------------------------------------------------------------------------

TEST(GPT2, InitIsReproducibleAndHasGpt2Statistics) {
  auto dev = make_cpu_device(false);
  GPT2Config c = small_config();
  c.n_embd = 64;
  c.vocab_size = 500;
  GPT2 a(*dev, c), b(*dev, c);
  a.init(7);
  b.init(7);
  EXPECT_EQ(a.download_params(), b.download_params());
  b.init(8);
  EXPECT_NE(a.download_params(), b.download_params());

  auto named = a.download_param_map();
  auto stddev = [](const std::vector<float>& v) {
    double s = 0, s2 = 0;
    for (float x : v) s += x, s2 += double(x) * x;
    double m = s / v.size();
    return std::sqrt(s2 / v.size() - m * m);
  };
  EXPECT_NEAR(stddev(named["wte.weight"]), 0.02, 0.001);
  EXPECT_NEAR(stddev(named["h.0.mlp.c_fc.weight"]), 0.02, 0.001);
  EXPECT_NEAR(stddev(named["h.1.mlp.c_proj.weight"]), 0.02 / std::sqrt(4.0), 0.0006);
  for (float x : named["h.1.ln_2.weight"]) ASSERT_EQ(x, 1.0f);
  for (float x : named["ln_f.bias"]) ASSERT_EQ(x, 0.0f);
  for (float x : named["h.0.attn.c_attn.bias"]) ASSERT_EQ(x, 0.0f);

  // Init is defined by the table: tensor k uses Philox stream k.
  const ParamInfo& wpe = a.param_info("wpe.weight");
  Philox rng(7, 1);
  for (int j : {0, 1, 2, 3, 1001}) EXPECT_EQ(named["wpe.weight"][j], 0.02f * rng.normal(j)) << j;
  (void)wpe;

  // Host round trip by name.
  named["ln_f.weight"][3] = 5.0f;
  b.upload_params(named);
  EXPECT_EQ(b.download_param_map()["ln_f.weight"][3], 5.0f);
  named.erase("ln_f.weight");
  EXPECT_NE(error_of([&] { b.upload_params(named); }).find("missing parameter 'ln_f.weight'"),
            std::string::npos);
  named["bogus"] = {1.0f};
  EXPECT_NE(error_of([&] { b.upload_params(named); }).find("unknown parameter 'bogus'"),
            std::string::npos);
}

// ---- forward / backward
// -------------------------------------------------------------------------------

Tensor upload_tokens(Device& dev, const std::vector<int32_t>& v, int B, int T) {
  Tensor t = dev.empty({B, T}, DType::i32, MemCategory::kActivations);
  dev.upload(t, v.data(), v.size() * sizeof(int32_t));
  return t;
}

std::vector<int32_t> pattern_tokens(int n, int vocab, int salt) {
  std::vector<int32_t> v(n);
  for (int i = 0; i < n; ++i) v[i] = (i * 7 + salt * 13 + (i * i) % 11) % vocab;
  return v;
}

TEST(GPT2, GradientAccumulationOverHalfBatchesMatchesFullBatch) {
  auto dev = make_cpu_device(false);
  const GPT2Config c = small_config();
  const int B = 4, T = 12;
  GPT2 model(*dev, c);
  model.init(1);
  Tensor tokens = upload_tokens(*dev, pattern_tokens(B * T, c.vocab_size, 1), B, T);
  Tensor targets = upload_tokens(*dev, pattern_tokens(B * T, c.vocab_size, 2), B, T);

  model.zero_grad();
  Tensor loss = model.forward(tokens, &targets, B, T);
  float full_loss;
  dev->download(&full_loss, loss, sizeof(float));
  model.backward();
  std::vector<float> full = model.download_grads();

  model.zero_grad();
  float half_losses = 0.0f;
  for (int h = 0; h < 2; ++h) {
    Tensor tok = tokens.slice_flat(int64_t{h} * (B / 2) * T, {B / 2, T});
    Tensor tgt = targets.slice_flat(int64_t{h} * (B / 2) * T, {B / 2, T});
    Tensor l = model.forward(tok, &tgt, B / 2, T);
    float v;
    dev->download(&v, l, sizeof(float));
    half_losses += 0.5f * v;
    model.backward(0.5f);
  }
  std::vector<float> accumulated = model.download_grads();
  EXPECT_NEAR(half_losses, full_loss, 1e-5f * full_loss);

  double max_abs = 0, max_diff = 0;
  for (size_t i = 0; i < full.size(); ++i) {
    max_abs = std::max(max_abs, double(std::fabs(full[i])));
    max_diff = std::max(max_diff, double(std::fabs(full[i] - accumulated[i])));
  }
  EXPECT_GT(max_abs, 0.0);
  EXPECT_LE(max_diff, 1e-5 * max_abs) << "max |full - accumulated| = " << max_diff;
}

TEST(GPT2, ForwardChecksItsArguments) {
  auto dev = make_cpu_device(false);
  GPT2Config c = small_config();
  GPT2 model(*dev, c);
  model.init(3);
  Tensor tokens = upload_tokens(*dev, pattern_tokens(2 * 8, c.vocab_size, 0), 2, 8);
  EXPECT_FALSE(model.forward(tokens, nullptr, 2, 8).defined());
  EXPECT_EQ(model.logits().shape, Shape({2, 8, c.vocab_size}));
  EXPECT_NE(error_of([&] { model.backward(); }).find("targets"), std::string::npos);
  EXPECT_NE(error_of([&] { model.forward(tokens, nullptr, 2, 17); }).find("block_size"),
            std::string::npos);
  EXPECT_NE(error_of([&] { model.forward(tokens, nullptr, 3, 8); }).find("tokens"),
            std::string::npos);
}

TEST(GPT2, GenerateIsReproducible) {
  auto dev = make_cpu_device(false);
  GPT2Config c = small_config();
  GPT2 model(*dev, c, /*with_grads=*/false);
  model.init(5);
  SampleOptions opt;
  opt.temperature = 1.0f;
  opt.top_k = 10;
  opt.seed = 99;
  // Longer than block_size: the window slides.
  std::vector<int32_t> a = model.generate({1, 2, 3}, 20, opt);
  std::vector<int32_t> b = model.generate({1, 2, 3}, 20, opt);
  ASSERT_EQ(a.size(), 20u);
  EXPECT_EQ(a, b);
  for (int32_t t : a) EXPECT_TRUE(t >= 0 && t < c.vocab_size) << t;
  opt.seed = 100;
  EXPECT_NE(model.generate({1, 2, 3}, 20, opt), a);

  // Greedy equals the argmax of a plain forward.
  opt.temperature = 0.0f;
  std::vector<int32_t> g = model.generate({4, 5}, 1, opt);
  Tensor tok = upload_tokens(*dev, {4, 5}, 1, 2);
  model.forward(tok, nullptr, 1, 2);
  std::vector<float> logits(2 * c.vocab_size);
  dev->download(logits.data(), model.logits(), logits.size() * sizeof(float));
  auto best = std::max_element(logits.begin() + c.vocab_size, logits.end()) -
              (logits.begin() + c.vocab_size);
  EXPECT_EQ(g[0], best);
}

}  // namespace
}  // namespace ct
