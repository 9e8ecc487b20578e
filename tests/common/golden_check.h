// The golden-state check shared by the GPT-2 and Llama golden tests (scripts/make_golden.py,
// scripts/make_llama_golden.py write the files): initial weights, logits, loss, every gradient
// and 5 AdamW steps of a model on one device, against a PyTorch run. Tolerances and why:
//   weights        |d| <= 1e-7 abs     (Philox bits identical; Box-Muller log/cos within 3 ulp)
//   logits         |d| <= 2e-5 abs     (fp32 forward in a different summation order)
//   loss           rel 1e-5
//   grad norms     rel 1e-5 per tensor (the fp32-vs-fp64 reference differs by ~1e-7 relative)
//   grad samples   |d| <= 3e-5 * max|g| of the tensor's sample + 1e-8
//   AdamW losses   rel 2e-5; global grad norm before clipping rel 1e-4 (later steps amplify
//                  rounding: the float64 run differs by ~1e-6)
//   final weights  |d| <= 2e-5, except elements the model names (skip_final): where the exact
//                  gradient is zero, Adam turns rounding noise into +-lr steps.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>

#include "core/io/safetensors.h"
#include "core/model/gpt2.h"
#include "tests/common/device_harness.h"

namespace ct::test {

template <typename T>
std::vector<T> read_vec(const SafetensorsFile& f, const std::string& name) {
  auto bytes = f.data(name);
  std::vector<T> v(bytes.size() / sizeof(T));
  std::memcpy(v.data(), bytes.data(), bytes.size());
  return v;
}

struct Golden {
  SafetensorsFile file;
  std::vector<int32_t> tokens, targets, sample_index, sample_tensor;
  std::vector<float> init_sum, init_sample, logits, loss, grad_norm, grad_sample, adamw_losses,
      adamw_grad_norms, final_sample;
};

inline Golden load_golden(const std::string& path) {
  Golden g;
  g.file = read_safetensors(path);
  g.tokens = read_vec<int32_t>(g.file, "tokens");
  g.targets = read_vec<int32_t>(g.file, "targets");
  g.sample_index = read_vec<int32_t>(g.file, "sample_index");
  g.sample_tensor = read_vec<int32_t>(g.file, "sample_tensor");
  g.init_sum = read_vec<float>(g.file, "init_sum");
  g.init_sample = read_vec<float>(g.file, "init_sample");
  g.logits = read_vec<float>(g.file, "logits");
  g.loss = read_vec<float>(g.file, "loss");
  g.grad_norm = read_vec<float>(g.file, "grad_norm");
  g.grad_sample = read_vec<float>(g.file, "grad_sample");
  g.adamw_losses = read_vec<float>(g.file, "adamw_losses");
  g.adamw_grad_norms = read_vec<float>(g.file, "adamw_grad_norms");
  g.final_sample = read_vec<float>(g.file, "final_sample");
  return g;
}

inline float download_scalar(Device& dev, const Tensor& t) {
  float v;
  dev.download(&v, t, sizeof(float));
  return v;
}

// The golden run of `model` (freshly constructed on d, initialised here with seed 42) against
// the file at `path`; `label` names the device in the printed summary. skip_final(p, i): leave
// flat element i (of parameter p) out of the final-weights comparison.
template <typename Model>
void check_golden(Device& d, Model& model, const std::string& path, const std::string& label,
                  const std::function<bool(const ParamInfo&, int64_t)>& skip_final = {}) {
  Device* dev = &d;
  Golden g = load_golden(path);
  const std::vector<ParamInfo>& table = model.params();
  ASSERT_EQ(g.init_sum.size(), table.size());
  const int B = 2, T = 64, V = model.config().vocab_size;
  ASSERT_EQ(g.tokens.size(), size_t(B * T));

  // ---- initial weights
  // ----------------------------------------------------------------------------
  model.init(42);
  std::vector<float> w = model.download_params();
  double max_w = 0;
  for (size_t s = 0; s < g.sample_index.size(); ++s)
    max_w = std::max(max_w, double(std::fabs(w[g.sample_index[s]] - g.init_sample[s])));
  EXPECT_LE(max_w, 1e-7);
  for (size_t k = 0; k < table.size(); ++k) {
    double sum = 0, abs_sum = 0;
    for (int64_t j = 0; j < table[k].numel; ++j) {
      sum += w[table[k].offset + j];
      abs_sum += std::fabs(w[table[k].offset + j]);
    }
    EXPECT_NEAR(sum, g.init_sum[k], 1e-6 * abs_sum + 1e-6) << table[k].name;
  }

  // ---- forward: logits and loss
  // ---------------------------------------------------------------------
  Tensor tokens = dev->empty({B, T}, DType::i32, MemCategory::kActivations);
  Tensor targets = dev->empty({B, T}, DType::i32, MemCategory::kActivations);
  dev->upload(tokens, g.tokens.data(), g.tokens.size() * 4);
  dev->upload(targets, g.targets.data(), g.targets.size() * 4);
  model.zero_grad();
  float loss = download_scalar(*dev, model.forward(tokens, &targets, B, T));
  std::vector<float> logits(size_t(B) * T * V);
  dev->download(logits.data(), model.logits(), logits.size() * 4);
  double max_logit = 0;
  for (size_t i = 0; i < logits.size(); ++i)
    max_logit = std::max(max_logit, double(std::fabs(logits[i] - g.logits[i])));
  EXPECT_LE(max_logit, 2e-5);
  EXPECT_NEAR(loss, g.loss[0], 1e-5 * g.loss[0]);

  // ---- backward: every gradient
  // ---------------------------------------------------------------------
  model.backward();
  std::vector<float> grads = model.download_grads();
  double worst_norm = 0, worst_sample = 0;
  std::vector<double> tensor_max(table.size(), 0.0);
  for (size_t s = 0; s < g.sample_index.size(); ++s)
    tensor_max[g.sample_tensor[s]] =
        std::max(tensor_max[g.sample_tensor[s]], double(std::fabs(g.grad_sample[s])));
  for (size_t k = 0; k < table.size(); ++k) {
    double sq = 0;
    for (int64_t j = 0; j < table[k].numel; ++j)
      sq += double(grads[table[k].offset + j]) * grads[table[k].offset + j];
    double rel = std::fabs(std::sqrt(sq) - g.grad_norm[k]) / g.grad_norm[k];
    worst_norm = std::max(worst_norm, rel);
    EXPECT_LE(rel, 1e-5) << table[k].name << ": norm " << std::sqrt(sq) << " vs " << g.grad_norm[k];
  }
  for (size_t s = 0; s < g.sample_index.size(); ++s) {
    const int k = g.sample_tensor[s];
    double d = std::fabs(grads[g.sample_index[s]] - g.grad_sample[s]);
    double tol = 3e-5 * tensor_max[k] + 1e-8;
    worst_sample = std::max(worst_sample, d / tensor_max[k]);
    EXPECT_LE(d, tol) << table[k].name << " element " << g.sample_index[s] - table[k].offset;
  }

  // ---- 5 AdamW steps, as a trainer records them
  // ----------------------------------------------------
  const int64_t N = model.flat_size(), D = model.decay_count();  // the device layout
  Tensor m = dev->empty({N}, DType::f32, MemCategory::kOptimizer);
  Tensor v = dev->empty({N}, DType::f32, MemCategory::kOptimizer);
  Tensor grad_norm = dev->empty({1}, DType::f32, MemCategory::kOptimizer);
  dev->fill(m, 0.0f);
  dev->fill(v, 0.0f);
  double worst_step_loss = 0, worst_step_norm = 0;
  for (int step = 1; step <= 5; ++step) {
    model.zero_grad();
    float step_loss = download_scalar(*dev, model.forward(tokens, &targets, B, T));
    model.backward();
    dev->norm(grad_norm, model.grads_flat());
    AdamWHyper hp;
    hp.lr = 1e-3f;
    hp.beta1 = 0.9f;
    hp.beta2 = 0.999f;
    hp.eps = 1e-8f;
    hp.step = step;
    hp.max_grad_norm = 1.0f;
    hp.weight_decay = 0.1f;
    dev->adamw(model.params_decay(), model.grads_decay(), m.slice_flat(0, {D}),
               v.slice_flat(0, {D}), grad_norm, hp);
    hp.weight_decay = 0.0f;
    dev->adamw(model.params_no_decay(), model.grads_no_decay(), m.slice_flat(D, {N - D}),
               v.slice_flat(D, {N - D}), grad_norm, hp);
    float norm = download_scalar(*dev, grad_norm);
    const float gl = g.adamw_losses[step - 1], gn = g.adamw_grad_norms[step - 1];
    worst_step_loss = std::max(worst_step_loss, double(std::fabs(step_loss - gl) / gl));
    worst_step_norm = std::max(worst_step_norm, double(std::fabs(norm - gn) / gn));
    EXPECT_NEAR(step_loss, gl, 2e-5 * gl) << "step " << step;
    EXPECT_NEAR(norm, gn, 1e-4 * gn) << "step " << step;
  }
  std::vector<float> final_w = model.download_params();
  double worst_final = 0;
  for (size_t s = 0; s < g.sample_index.size(); ++s) {
    const ParamInfo& p = table[g.sample_tensor[s]];
    if (skip_final && skip_final(p, g.sample_index[s])) continue;
    double d = std::fabs(final_w[g.sample_index[s]] - g.final_sample[s]);
    worst_final = std::max(worst_final, d);
    EXPECT_LE(d, 2e-5) << p.name << " element " << g.sample_index[s] - p.offset;
  }

  std::printf(
      "[%s] max |dw0| %.3g, max |dlogits| %.3g, loss rel %.3g, worst grad-norm rel %.3g, worst "
      "grad sample |d|/max|g| %.3g, adamw loss rel %.3g, grad-norm rel %.3g, final |dw| %.3g\n",
      label.c_str(), max_w, max_logit, std::fabs(loss - g.loss[0]) / g.loss[0], worst_norm,
      worst_sample, worst_step_loss, worst_step_norm, worst_final);
}

}  // namespace ct::test
