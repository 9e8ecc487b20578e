// LlamaConfig: presets, validation naming the field, config.json in and out (llama, mistral,
// qwen2, refusals by key), parameter counts, and the rotary tables against fp64 (plain and with
// the llama3 frequency scaling, whose bands are checked one by one).
#include "core/model/llama_config.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <numbers>

#include "core/error.h"
#include "core/io/json_file.h"
#include "tests/common/test_data_dir.h"

namespace ct {
namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(LlamaConfig, PresetsValidateAndCountParameters) {
  for (const std::string& name : LlamaConfig::preset_names()) LlamaConfig::preset(name).validate();
  // SmolLM-135M: 134,515,008 parameters with the tied head (its model card's 135M).
  LlamaConfig s = LlamaConfig::preset("smollm-135m");
  EXPECT_EQ(s.head_dim(), 64);
  EXPECT_EQ(s.qkv_width(), 15 * 64);
  EXPECT_EQ(s.num_parameters(), 134515008);
  LlamaConfig t = LlamaConfig::preset("llama-tiny");
  EXPECT_FALSE(t.tie_word_embeddings);
  const int64_t C = 384, F = 1024, V = 256, W = (6 + 2 * 2) * 64;
  EXPECT_EQ(t.num_parameters(), 2 * V * C + 6 * (2 * C + C * W + C * C + 3 * C * F) + C);
  EXPECT_NE(error_of([] { LlamaConfig::preset("llama-huge"); }).find("llama-tiny"),
            std::string::npos);
}

TEST(LlamaConfig, ValidateNamesTheField) {
  LlamaConfig c = LlamaConfig::preset("llama-tiny");
  c.n_kv_head = 4;  // does not divide 6
  EXPECT_NE(error_of([&] { c.validate(); }).find("num_key_value_heads 4"), std::string::npos);
  c = LlamaConfig::preset("llama-tiny");
  c.n_head = 5;  // does not divide 384
  EXPECT_NE(error_of([&] { c.validate(); }).find("num_attention_heads 5"), std::string::npos);
  c = LlamaConfig::preset("llama-tiny");
  c.n_embd = 6 * 63;  // odd head size
  EXPECT_NE(error_of([&] { c.validate(); }).find("even"), std::string::npos);
  c = LlamaConfig::preset("llama-tiny");
  c.intermediate_size = 0;
  EXPECT_NE(error_of([&] { c.validate(); }).find("intermediate_size"), std::string::npos);
}

TEST(LlamaConfig, HfJsonRoundTripsForEveryModelType) {
  for (const char* type : {"llama", "mistral", "qwen2"}) {
    LlamaConfig c = LlamaConfig::preset("smollm-135m");
    c.model_type = type;
    c.attention_bias = std::string(type) == "qwen2";
    if (std::string(type) == "llama") {
      c.rope_llama3 = true;
      c.rope_theta = 500000.0f;
    }
    nlohmann::json j = c.to_hf_json();
    EXPECT_EQ(LlamaConfig::from_hf_json(j), c) << type;
    EXPECT_EQ(j["head_dim"], 64);
  }
}

TEST(LlamaConfig, FromHfJsonReadsTransformersDefaultsAndRefusesByKey) {
  // What transformers writes for a small LlamaConfig: no rope_scaling, GQA, untied head.
  nlohmann::json j = {{"model_type", "llama"},
                      {"architectures", {"LlamaForCausalLM"}},
                      {"hidden_size", 64},
                      {"intermediate_size", 176},
                      {"num_hidden_layers", 2},
                      {"num_attention_heads", 4},
                      {"num_key_value_heads", 2},
                      {"max_position_embeddings", 128},
                      {"vocab_size", 300},
                      {"rms_norm_eps", 1e-6},
                      {"rope_theta", 10000.0},
                      {"rope_scaling", nullptr},
                      {"hidden_act", "silu"},
                      {"attention_bias", false},
                      {"mlp_bias", false},
                      {"pretraining_tp", 1},
                      {"tie_word_embeddings", false},
                      {"bos_token_id", 1},
                      {"eos_token_id", 2},
                      {"torch_dtype", "float32"}};
  LlamaConfig c = LlamaConfig::from_hf_json(j);
  EXPECT_EQ(c.n_kv_head, 2);
  EXPECT_EQ(c.head_dim(), 16);
  EXPECT_FLOAT_EQ(c.rms_norm_eps, 1e-6f);
  EXPECT_EQ(c.bos_token_id, 1);
  // num_key_value_heads absent: multi-head attention.
  nlohmann::json mha = j;
  mha.erase("num_key_value_heads");
  EXPECT_EQ(LlamaConfig::from_hf_json(mha).n_kv_head, 4);
  // Qwen2: q/k/v biases always.
  nlohmann::json q = j;
  q["model_type"] = "qwen2";
  q.erase("attention_bias");
  EXPECT_TRUE(LlamaConfig::from_hf_json(q).attention_bias);

  struct Bad {
    const char* key;
    nlohmann::json value;
    const char* model_type;
  };
  const Bad bad[] = {
      {"hidden_act", "gelu", "llama"},
      {"head_dim", 32, "llama"},
      {"mlp_bias", true, "llama"},
      {"pretraining_tp", 2, "llama"},
      {"rope_scaling", {{"rope_type", "yarn"}, {"factor", 4.0}}, "llama"},
      {"sliding_window", 64, "mistral"},
      {"use_sliding_window", true, "qwen2"},
      {"num_key_value_heads", 3, "llama"},
  };
  for (const Bad& b : bad) {
    nlohmann::json k = j;
    k["model_type"] = b.model_type;
    k[b.key] = b.value;
    const std::string msg = error_of([&] { LlamaConfig::from_hf_json(k); });
    EXPECT_NE(msg.find(b.key), std::string::npos) << b.key << ": " << msg;
  }
  nlohmann::json g = j;
  g["model_type"] = "gpt2";
  EXPECT_NE(error_of([&] { LlamaConfig::from_hf_json(g); }).find("gpt2"), std::string::npos);
  // Mistral's sliding window at or past the block is the full attention: accepted.
  nlohmann::json m = j;
  m["model_type"] = "mistral";
  m["sliding_window"] = 4096;
  EXPECT_EQ(LlamaConfig::from_hf_json(m).model_type, "mistral");
}

TEST(LlamaConfig, RopeTablesMatchFp64) {
  LlamaConfig c = LlamaConfig::preset("llama-tiny");
  const int T = 256, H = c.head_dim() / 2;
  std::vector<float> cs, sn;
  c.rope_tables(T, cs, sn);
  ASSERT_EQ(cs.size(), static_cast<size_t>(T * H));
  double worst = 0;
  for (int t = 0; t < T; ++t)
    for (int i = 0; i < H; ++i) {
      const double a = t * std::pow(10000.0, -2.0 * i / c.head_dim());
      worst = std::max(
          {worst, std::abs(cs[t * H + i] - std::cos(a)), std::abs(sn[t * H + i] - std::sin(a))});
    }
  // float32 angles: |error| <= t * ulp(inv_freq) ~ 256 * 6e-8.
  EXPECT_LT(worst, 3e-5);
  EXPECT_EQ(cs[0], 1.0f);
  EXPECT_EQ(sn[0], 0.0f);
}

TEST(LlamaConfig, Llama3ScalingKeepsHighSlowsLowAndBlendsBetween) {
  // Llama 3.2's rope: theta 500000, factor 32, low 1, high 4, original context 8192.
  LlamaConfig c = LlamaConfig::preset("llama-tiny");
  c.rope_theta = 500000.0f;
  LlamaConfig s = c;
  s.rope_llama3 = true;
  s.rope_llama3_scaling = {32.0f, 1.0f, 4.0f, 8192};
  const std::vector<float> base = c.rope_inv_freq(), scaled = s.rope_inv_freq();
  int high = 0, low = 0, mid = 0;
  for (size_t i = 0; i < base.size(); ++i) {
    const double wavelen = 2 * std::numbers::pi / base[i];
    if (wavelen < 8192.0 / 4) {
      EXPECT_EQ(scaled[i], base[i]) << i;
      ++high;
    } else if (wavelen > 8192.0 / 1) {
      EXPECT_FLOAT_EQ(scaled[i], base[i] / 32.0f) << i;
      ++low;
    } else {
      const double smooth = (8192.0 / wavelen - 1.0) / (4.0 - 1.0);
      EXPECT_NEAR(scaled[i], (1 - smooth) * base[i] / 32 + smooth * base[i], 1e-6 * base[i]) << i;
      ++mid;
    }
  }
  EXPECT_GT(high, 0);
  EXPECT_GT(low, 0);
  EXPECT_GT(mid, 0);
}

// tests/data/llama/rope.json (scripts/make_llama_rope_golden.py): transformers' own inverse
// frequencies and LlamaRotaryEmbedding cos/sin, plain and llama3-scaled, read through the
// config.json that transformers wrote.
TEST(LlamaConfig, RopeTablesMatchTransformers) {
  const nlohmann::json cases = read_json_file(ct::test::data_dir() + "/llama/rope.json");
  ASSERT_EQ(cases.size(), 2u);
  for (const auto& c : cases) {
    const std::string name = c["name"];
    const LlamaConfig cfg = LlamaConfig::from_hf_json(c["config"]);
    EXPECT_EQ(cfg.rope_llama3, name == "llama3");
    const std::vector<float> inv = cfg.rope_inv_freq();
    const auto& want = c["inv_freq"];
    ASSERT_EQ(inv.size(), want.size()) << name;
    for (size_t i = 0; i < inv.size(); ++i)
      EXPECT_NEAR(inv[i], want[i].get<float>(), 2e-7 * want[i].get<float>()) << name << " " << i;
    const std::vector<int> positions = c["positions"];
    const int T = positions.back() + 1, H = cfg.head_dim() / 2;
    std::vector<float> cs, sn;
    cfg.rope_tables(T, cs, sn);
    for (size_t p = 0; p < positions.size(); ++p)
      for (int i = 0; i < H; ++i) {
        const size_t at = static_cast<size_t>(positions[p]) * H + i;
        EXPECT_NEAR(cs[at], c["cos"][p][i].get<float>(), 2e-6) << name << " t " << positions[p];
        EXPECT_NEAR(sn[at], c["sin"][p][i].get<float>(), 2e-6) << name << " t " << positions[p];
      }
  }
}

}  // namespace
}  // namespace ct
