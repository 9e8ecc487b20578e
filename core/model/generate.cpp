// Sampling from any model (Model::generate): greedy, temperature and top-k over the last
// position's logits, one incremental forward per token (Model::forward_cached).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>

#include "core/error.h"
#include "core/model/model.h"
#include "core/philox.h"

namespace ct {

namespace {

// One token from a row of logits: greedy at temperature <= 0, else softmax(logits / temperature)
// restricted to the top_k largest (all if top_k <= 0), sampled by inverse CDF at u in (0,1).
int32_t sample_token(const std::vector<float>& logits, const SampleOptions& opt, float u) {
  const int V = static_cast<int>(logits.size());
  if (opt.temperature <= 0.0f)
    return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  float threshold = -INFINITY;
  if (opt.top_k > 0 && opt.top_k < V) {
    std::vector<float> sorted = logits;
    std::nth_element(sorted.begin(), sorted.begin() + (opt.top_k - 1), sorted.end(),
                     std::greater<float>());
    threshold = sorted[static_cast<size_t>(opt.top_k - 1)];
  }
  const float max_logit = *std::max_element(logits.begin(), logits.end());
  std::vector<double> p(static_cast<size_t>(V), 0.0);
  double total = 0.0;
  for (int i = 0; i < V; ++i) {
    if (logits[i] < threshold) continue;
    p[i] = std::exp((static_cast<double>(logits[i]) - max_logit) / opt.temperature);
    total += p[i];
  }
  double target = static_cast<double>(u) * total, cdf = 0.0;
  int32_t last = 0;
  for (int i = 0; i < V; ++i) {
    if (p[i] == 0.0) continue;
    cdf += p[i];
    last = i;
    if (target < cdf) return i;
  }
  return last;  // rounding at the very top of the CDF
}

}  // namespace

std::vector<int32_t> Model::generate(const std::vector<int32_t>& prompt, int n,
                                     const SampleOptions& options, GenerateStats* stats) {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point start = Clock::now();
  Clock::time_point first = start;
  CT_REQUIRE(!prompt.empty(), "generate: the prompt must hold at least one token");
  CT_REQUIRE(n >= 0, "generate: negative token count");
  for (int32_t t : prompt)
    CT_REQUIRE(t >= 0 && t < vocab_size(), "generate: prompt token " + std::to_string(t) +
                                               " outside the vocabulary [0, " +
                                               std::to_string(vocab_size()) + ")");
  Device& dev = device();
  const int V = vocab_size();
  const int block = static_cast<int>(block_size());
  const int window =
      static_cast<int>(std::min<int64_t>(block, static_cast<int64_t>(prompt.size()) + n));
  if (max_batch() < 1 || max_seq() < window)
    allocate_activations(std::max(1, max_batch()), std::max(window, max_seq()));
  if (options.kv_cache && n > 0) reserve_kv_cache(window);
  Tensor tokens = dev.empty({window}, DType::i32, MemCategory::kActivations);
  Tensor row32;  // 16-bit logits are widened on the device before the one row is read back
  std::vector<int32_t> context = prompt, out;
  std::vector<float> row(static_cast<size_t>(V));
  Philox rng(options.seed, 0);
  for (int i = 0; i < n; ++i) {
    const int T = static_cast<int>(std::min<size_t>(context.size(), block));
    Tensor last;
    if (options.kv_cache && i > 0 && static_cast<int>(context.size()) <= block) {
      // One new token at position T - 1, the cache holding positions [0, T - 1).
      Tensor tok = tokens.slice_flat(0, {1, 1});
      dev.upload(tok, &context.back(), sizeof(int32_t));
      last = forward_cached(tok, T - 1, 1);
    } else {
      // The prompt, or a window that slid past block_size (its positions all moved): the last T
      // tokens from position 0.
      Tensor tok = tokens.slice_flat(0, {1, T});
      dev.upload(tok, context.data() + (context.size() - T), sizeof(int32_t) * T);
      if (options.kv_cache) {
        last = forward_cached(tok, 0, T);
      } else {
        forward(tok, nullptr, 1, T);
        last = logits_at(0, T - 1);
      }
    }
    if (last.dtype != DType::f32) {
      if (!row32.defined()) row32 = dev.empty({V}, DType::f32, MemCategory::kActivations);
      dev.copy(row32, last);
      last = row32;
    }
    dev.download(row.data(), last, sizeof(float) * V);
    int32_t next = sample_token(row, options, rng.uniform(static_cast<uint64_t>(i)));
    context.push_back(next);
    out.push_back(next);
    if (i == 0) first = Clock::now();
  }
  if (options.kv_cache) release_kv_cache();
  if (stats) {
    const auto seconds = [](Clock::duration d) { return std::chrono::duration<double>(d).count(); };
    stats->prompt_tokens = static_cast<int>(prompt.size());
    stats->new_tokens = n;
    stats->prefill_s = seconds(first - start);
    stats->decode_s = n > 0 ? seconds(Clock::now() - first) : 0.0;
  }
  return out;
}

}  // namespace ct
