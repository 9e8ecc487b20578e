// Data parallel's overlap in one process: what the backward pass reports final is final (GPT-2,
// an untied Llama, LoRA adapters; with accumulation), and the averager starts a bucket's
// collective as soon as the bucket is complete, in the order the buckets complete, with the
// same results as averaging after the backward pass.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "core/dist/communicator.h"
#include "core/dist/data_parallel.h"
#include "core/error.h"
#include "core/model/gpt2.h"
#include "core/model/llama.h"

namespace ct {
namespace {

using Range = std::pair<int64_t, int64_t>;  // offset, count

std::vector<float> download(Device& dev, const Tensor& t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  dev.download(v.data(), t, v.size() * sizeof(float));
  return v;
}

// Two forward / backward passes (accumulated gradients) on random tokens, the listener set for
// the second only, as the trainer does. Every range it reports holds, when reported, the
// gradients backward() leaves; the ranges are disjoint; they come ln_f / the head first, then
// block by block downwards. Returns them, in order.
std::vector<Range> reported_ranges(Model& model, Device& dev) {
  const int B = 2, T = 16;
  model.allocate_activations(B, T);
  model.init(5);
  std::mt19937 rng(3);
  std::vector<int32_t> tok(B * T), tgt(B * T);
  Tensor tokens = dev.empty({B, T}, DType::i32, MemCategory::kActivations);
  Tensor targets = dev.empty({B, T}, DType::i32, MemCategory::kActivations);
  const Tensor grads = model.trainable_grads();
  std::vector<Range> ranges;
  std::vector<std::vector<float>> at_report;
  for (int micro = 0; micro < 2; ++micro) {
    for (size_t i = 0; i < tok.size(); ++i)
      tok[i] = static_cast<int32_t>(rng() % 200), tgt[i] = static_cast<int32_t>(rng() % 200);
    dev.upload(tokens, tok.data(), tok.size() * sizeof(int32_t));
    dev.upload(targets, tgt.data(), tgt.size() * sizeof(int32_t));
    model.forward(tokens, &targets, B, T);
    if (micro == 1)
      model.set_gradients_ready([&](int64_t off, int64_t n) {
        ranges.emplace_back(off, n);
        at_report.push_back(download(dev, grads.slice_flat(off, {n})));
      });
    model.backward(0.5f);
  }
  model.set_gradients_ready(nullptr);
  const std::vector<float> final_grads = download(dev, grads);
  std::vector<bool> seen(final_grads.size(), false);
  for (size_t k = 0; k < ranges.size(); ++k) {
    const auto [off, n] = ranges[k];
    EXPECT_GT(n, 0);
    EXPECT_LE(off + n, grads.numel());
    for (int64_t i = 0; i < n; ++i) {
      EXPECT_FALSE(seen[static_cast<size_t>(off + i)]) << "element " << off + i << " twice";
      seen[static_cast<size_t>(off + i)] = true;
    }
    const bool same = std::equal(at_report[k].begin(), at_report[k].end(),
                                 final_grads.begin() + off, final_grads.begin() + off + n);
    EXPECT_TRUE(same) << "range " << k << " [" << off << ", +" << n
                      << ") changed after it was reported final";
  }
  return ranges;
}

// The rows (of `table`) that the ranges cover, by name, in report order of their first element.
std::vector<std::string> rows_reported(const std::vector<ParamInfo>& table,
                                       const std::vector<Range>& ranges) {
  std::vector<std::string> names;
  for (const auto& [off, n] : ranges)
    for (const ParamInfo& p : table)
      if (p.offset >= off && p.offset + p.numel <= off + n) names.push_back(p.name);
  return names;
}

size_t position(const std::vector<std::string>& names, const std::string& name) {
  return static_cast<size_t>(std::find(names.begin(), names.end(), name) - names.begin());
}

TEST(GradientsReady, Gpt2ReportsLnFThenBlockByBlock) {
  std::unique_ptr<Device> dev = make_cpu_device(false);
  GPT2Config c = GPT2Config::preset("tiny");
  c.n_layer = 3, c.n_head = 2, c.n_embd = 32, c.block_size = 32;
  GPT2 model(*dev, c, true);
  const std::vector<std::string> names =
      rows_reported(model.trainable_params(), reported_ranges(model, *dev));
  // Every row but the embeddings (wte is also the head: written first and last).
  EXPECT_EQ(names.size(), model.trainable_params().size() - 2);
  EXPECT_EQ(position(names, "wte.weight"), names.size());
  EXPECT_EQ(position(names, "wpe.weight"), names.size());
  EXPECT_LT(position(names, "ln_f.weight"), position(names, "h.2.mlp.c_proj.weight"));
  EXPECT_LT(position(names, "h.2.ln_1.bias"), position(names, "h.1.attn.c_attn.weight"));
  EXPECT_LT(position(names, "h.1.ln_1.bias"), position(names, "h.0.mlp.c_fc.weight"));
}

TEST(GradientsReady, UntiedLlamaReportsItsHeadFirst) {
  std::unique_ptr<Device> dev = make_cpu_device(false);
  LlamaConfig c = LlamaConfig::preset("llama-tiny");
  c.n_layer = 2, c.n_head = 4, c.n_kv_head = 2, c.n_embd = 64, c.intermediate_size = 128;
  c.block_size = 32;
  ASSERT_FALSE(c.tie_word_embeddings);
  Llama model(*dev, c, true);
  const std::vector<std::string> names =
      rows_reported(model.trainable_params(), reported_ranges(model, *dev));
  EXPECT_EQ(names.size(), model.trainable_params().size() - 1);  // embed_tokens at the end
  EXPECT_LT(position(names, "lm_head.weight"),
            position(names, "model.layers.1.mlp.up_proj.weight"));
  EXPECT_LT(position(names, "model.layers.1.input_layernorm.weight"),
            position(names, "model.layers.0.mlp.down_proj.weight"));
}

TEST(GradientsReady, LoraAdaptersBlockByBlock) {
  std::unique_ptr<Device> dev = make_cpu_device(false);
  GPT2Config c = GPT2Config::preset("tiny");
  c.n_layer = 2, c.n_head = 2, c.n_embd = 32, c.block_size = 32;
  ModelOptions o;
  o.lora.r = 4;
  o.lora.target_modules = {"c_attn", "c_fc"};
  GPT2 model(*dev, c, true, o);
  const std::vector<std::string> names =
      rows_reported(model.trainable_params(), reported_ranges(model, *dev));
  EXPECT_EQ(names.size(), model.trainable_params().size());  // every adapter is in a block
  EXPECT_LT(position(names, "h.1.attn.c_attn.lora_B.weight"),
            position(names, "h.0.mlp.c_fc.lora_A.weight"));
}

// Rank 0 of 2 whose peer holds 3 x this rank's values: an average is 2 x. Records where each
// collective's data starts, in the order they were started.
class PeerTimesThree final : public dist::Communicator {
 public:
  std::vector<const float*> started;
  int rank() const override { return 0; }
  int size() const override { return 2; }
  int local_rank() const override { return 0; }
  int local_size() const override { return 2; }
  std::string host() const override { return "test"; }
  std::string transport() const override { return "test"; }
  void all_reduce(float* data, size_t count, dist::ReduceOp) override {
    started.push_back(data);
    for (size_t i = 0; i < count; ++i) data[i] = (data[i] + 3.0f * data[i]) * 0.5f;
  }
  void all_reduce(double*, size_t, dist::ReduceOp) override {}
  void reduce_scatter(float* data, const std::vector<size_t>& counts, dist::ReduceOp) override {
    started.push_back(data);
    for (size_t i = 0; i < counts[0]; ++i) data[i] = (data[i] + 3.0f * data[i]) * 0.5f;
  }
  void all_gather(float*, const std::vector<size_t>&) override {}
  void broadcast(void*, size_t, int) override {}
  std::vector<std::string> all_gather(const std::string& mine) override { return {mine, mine}; }
  void barrier() override {}
  void set_timeout(double) override {}
  void abort(int) override {}
  // The buckets' offsets in start order (the lowest address is offset 0).
  std::vector<int64_t> offsets() const {
    const float* base = *std::min_element(started.begin(), started.end());
    std::vector<int64_t> out;
    for (const float* p : started) out.push_back(p - base);
    return out;
  }
};

// Buckets of 10 over 35 elements: [0,10) [10,20) [20,30) [30,35). Reported as a backward pass
// would, the last first: bucket 3 starts when [30,35) is in, bucket 2 once [20,30) is complete
// from two reports, bucket 1 once its last element is in; bucket 0 is never complete and starts
// in finish(). The results equal average()'s (every bucket after the backward pass), the overlap
// is positive and at most the total. ZeRO stage 1's reduce-scatter: only this rank's shard
// [0, 17) comes back averaged.
TEST(GradientAverager, StartsEachBucketWhenComplete) {
  std::unique_ptr<Device> dev = make_cpu_device(false);
  std::vector<float> g(35);
  for (size_t i = 0; i < g.size(); ++i) g[i] = std::sin(static_cast<float>(i)) * 0.1f;
  Tensor grads = dev->empty({35}, DType::f32, MemCategory::kGrads);
  for (bool sharded : {false, true}) {
    for (bool overlap : {false, true}) {
      SCOPED_TRACE(std::string(overlap ? "overlapped" : "after the backward pass") +
                   (sharded ? ", reduce-scatter" : ""));
      dev->upload(grads, g.data(), g.size() * sizeof(float));
      PeerTimesThree comm;
      dist::GradientAverager avg(
          comm, *dev, 10, sharded ? std::vector<int64_t>{0, 17, 35} : std::vector<int64_t>{});
      avg.begin(grads);
      if (overlap) {
        avg.ready(30, 5);
        EXPECT_EQ(comm.started.size(), 1u);
        avg.ready(24, 6);
        EXPECT_EQ(comm.started.size(), 1u);  // [20,30) not complete yet
        avg.ready(12, 12);
        EXPECT_EQ(comm.started.size(), 2u);
        avg.ready(10, 2);
        EXPECT_EQ(comm.started.size(), 3u);
        avg.ready(2, 3);  // bucket 0 stays incomplete
        EXPECT_EQ(comm.started.size(), 3u);
        EXPECT_THROW(avg.ready(11, 1), Error);  // reported twice
      }
      avg.finish();
      const std::vector<int64_t> order =
          overlap ? std::vector<int64_t>{30, 20, 10, 0} : std::vector<int64_t>{0, 10, 20, 30};
      EXPECT_EQ(comm.offsets(), order);
      const std::vector<float> out = download(*dev, grads);
      for (size_t i = 0; i < g.size(); ++i)
        EXPECT_EQ(out[i], sharded && i >= 17 ? g[i] : (g[i] + 3.0f * g[i]) * 0.5f) << i;
      EXPECT_LE(avg.overlap_seconds(), avg.seconds());
      if (overlap)
        EXPECT_GT(avg.overlap_seconds(), 0.0);
      else
        EXPECT_EQ(avg.overlap_seconds(), 0.0);
      EXPECT_EQ(avg.calls(), 1);
    }
  }
}

}  // namespace
}  // namespace ct
