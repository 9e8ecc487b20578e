// Model::forward_cached (sampling's key/value cache) against forward() over the whole window, on
// every device under test: GPT-2 and Llama (grouped kv heads, the rotation at each position), fp32
// and bf16. The prompt goes in one call, then one token a call; each position's logits are those
// of the plain forward's row at that position. Going back to an earlier position, or to 0, gives
// the same logits again. On the CPU: generate() with and without the cache gives the same tokens,
// with the window sliding past block_size, and forward_cached's arguments are checked.
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/model/gpt2.h"
#include "core/model/llama.h"
#include "tests/common/device_harness.h"
#include "tests/common/half_compare.h"
#include "tests/common/small_models.h"

namespace ct::test {
namespace {

constexpr int kVocab = 300;  // padded to 384 on the device
constexpr int kBlock = 24;

std::vector<int32_t> sequence(int n) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) v[i] = (i * 37 + 11 + (i * i) % 7) % kVocab;
  return v;
}

// lora: adapters on every linear layer of the family (the cached rows go through them too),
// drawn nonzero so that they change the logits.
std::unique_ptr<Model> make_model(Device& d, bool llama, Precision p, bool checkpointing = false,
                                  bool lora = false) {
  ModelOptions o;
  o.policy = PrecisionPolicy::make(p);
  o.gradient_checkpointing = checkpointing;
  if (lora) {
    o.lora.r = 4;
    o.lora.alpha = 8.0f;
    o.lora.target_modules = llama
                                ? std::vector<std::string>{"q_proj", "v_proj", "o_proj", "up_proj"}
                                : std::vector<std::string>{"c_attn", "c_proj", "c_fc"};
  }
  std::unique_ptr<Model> m;
  if (llama)
    m = std::make_unique<Llama>(d, two_layer_llama(kBlock, kVocab), false, o);
  else
    m = std::make_unique<GPT2>(d, two_layer_gpt2(kBlock, kVocab), false, o);
  m->init(17);
  if (lora) {
    std::map<std::string, std::vector<float>> adapters = m->download_lora_map();
    uint64_t seed = 40;
    for (auto& [name, v] : adapters) v = randn(v.size(), ++seed, 0.05f);
    m->upload_lora(adapters);
  }
  return m;
}

// The logits [V] of every position of `seq` from one forward() over it.
std::vector<Vec> plain_logits(Device& d, Model& m, const std::vector<int32_t>& seq) {
  const int T = static_cast<int>(seq.size());
  m.forward(upload_i32(d, {1, T}, seq), nullptr, 1, T);
  std::vector<Vec> rows;
  for (int t = 0; t < T; ++t) rows.push_back(download_h(d, m.logits_at(0, t)));
  return rows;
}

Vec cached_logits(Device& d, Model& m, const std::vector<int32_t>& seq, int pos, int T) {
  std::vector<int32_t> part(seq.begin() + pos, seq.begin() + pos + T);
  return download_h(d, m.forward_cached(upload_i32(d, {1, T}, part), pos, T));
}

using KvCacheDevices = DeviceTest;

TEST_P(KvCacheDevices, EveryPositionGivesThePlainForwardsLogits) {
  const int prompt = 5, total = kBlock;
  const std::vector<int32_t> seq = sequence(total);
  for (bool llama : {false, true}) {
    for (Precision p : {Precision::kFp32, Precision::kBf16}) {
      const DType h = PrecisionPolicy::make(p).compute;
      if (!dev().supports(OpKind::kMatmul, h) || !dev().supports(OpKind::kAttention, h)) continue;
      const std::string nm =
          std::string(llama ? " llama " : " gpt2 ") + dtype_name(h) + " on " + id();
      // The cached qkv rows come from products of other shapes than the whole window's (one row
      // at a time): a library may sum them in another order, and in bf16 round such a sum to
      // the other side. Measured (CT_PRINT_NMSE=1): cpu f32 1.1e-13 (OpenBLAS), bf16 0; simt,
      // simt64 and lavapipe 0 (their kernels sum a row the same way at any M).
      const double t = h == DType::f32 ? 1e-10 : 1e-4;
      std::unique_ptr<Model> m = make_model(dev(), llama, p);
      const std::vector<Vec> want = plain_logits(dev(), *m, seq);
      m->reserve_kv_cache(total);
      EXPECT_TRUE(
          close_nmse(cached_logits(dev(), *m, seq, 0, prompt), want[prompt - 1], t, "prompt" + nm));
      for (int pos = prompt; pos < total; ++pos)
        EXPECT_TRUE(close_nmse(cached_logits(dev(), *m, seq, pos, 1), want[pos], t,
                               "position " + std::to_string(pos) + nm));
      // logits() shows the last position's row
      EXPECT_EQ(download_h(dev(), m->logits()).size(), static_cast<size_t>(kVocab)) << nm;
      // Back to position 9 (rows from 9 on are overwritten), then two at a time.
      for (int pos = 9; pos + 2 <= total; pos += 2)
        EXPECT_TRUE(close_nmse(cached_logits(dev(), *m, seq, pos, 2), want[pos + 1], t,
                               "again from 9, position " + std::to_string(pos + 1) + nm));
      // A new sequence at 0: its own prefix, not the old rows.
      std::vector<int32_t> other = sequence(total);
      for (int32_t& x : other) x = (x * 3 + 1) % kVocab;
      const std::vector<Vec> want_other = plain_logits(dev(), *m, other);
      EXPECT_TRUE(close_nmse(cached_logits(dev(), *m, other, 0, 3), want_other[2], t,
                             "second sequence" + nm));
      EXPECT_TRUE(close_nmse(cached_logits(dev(), *m, other, 3, 1), want_other[3], t,
                             "second sequence, position 3" + nm));
      m->release_kv_cache();
    }
  }
}

CT_INSTANTIATE_DEVICE_SUITE(KvCacheDevices);

// generate() with and without the cache: the same tokens, greedy and sampled, with the context
// passing block_size (the window slides, and from there each token runs the whole window); with
// gradient checkpointing (one shared set of activations) and with LoRA adapters.
TEST(KvCache, GenerateGivesTheTokensOfTheWholeWindowForwards) {
  Device& d = open_cached("cpu:0");
  for (bool llama : {false, true}) {
    std::vector<Vec> base;  // the plain model's logits of a sequence: the adapters change them
    for (int variant = 0; variant < 3; ++variant) {  // plain, checkpointing, LoRA adapters
      const bool checkpointing = variant == 1, lora = variant == 2;
      std::unique_ptr<Model> m = make_model(d, llama, Precision::kFp32, checkpointing, lora);
      if (variant == 0) base = plain_logits(d, *m, sequence(8));
      if (lora) {
        EXPECT_NE(plain_logits(d, *m, sequence(8)), base) << "adapters without effect";
      }
      for (float temperature : {0.0f, 1.0f}) {
        SampleOptions so;
        so.temperature = temperature;
        so.top_k = 40;
        so.seed = 5;
        so.kv_cache = false;
        const std::vector<int32_t> plain = m->generate({3, 1, 4, 1, 5}, kBlock + 6, so);
        so.kv_cache = true;
        EXPECT_EQ(m->generate({3, 1, 4, 1, 5}, kBlock + 6, so), plain)
            << (llama ? "llama" : "gpt2") << " temperature " << temperature
            << (checkpointing ? " checkpointing" : "") << (lora ? " lora" : "");
      }
    }
  }
}

TEST(KvCache, ArgumentsAreChecked) {
  Device& d = open_cached("cpu:0");
  std::unique_ptr<Model> m = make_model(d, false, Precision::kFp32);
  const std::vector<int32_t> seq = sequence(8);
  auto error_of = [](const std::function<void()>& f) -> std::string {
    try {
      f();
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(error_of([&] { cached_logits(d, *m, seq, 0, 2); }).find("reserve_kv_cache"),
            std::string::npos);
  EXPECT_NE(error_of([&] { m->reserve_kv_cache(kBlock + 1); }).find("context length"),
            std::string::npos);
  m->reserve_kv_cache(6);
  EXPECT_NE(error_of([&] { cached_logits(d, *m, seq, 1, 1); }).find("follows only 0"),
            std::string::npos);
  cached_logits(d, *m, seq, 0, 4);
  EXPECT_NE(error_of([&] { cached_logits(d, *m, seq, 4, 3); }).find("past the cache's 6"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              m->forward_cached(upload_i32(d, {1, 2}, {1, 2}), 4, 1);
            }).find("expected tokens [1,1]"),
            std::string::npos);
  // Nothing to backward from.
  EXPECT_THROW(m->backward(), Error);
}

}  // namespace
}  // namespace ct::test
