// Optimizers over the model's two parameter groups (decayed / not decayed), fused on the device.
// Their state is exposed as named tensors so checkpoints can save and restore it bit for bit.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/model/gpt2.h"

namespace ct {

struct OptimizerSettings {
  double weight_decay = 0.0;  // applied to the decay group only
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  double max_grad_norm = 0.0;  // > 0: clip by the global norm
};

// A named piece of optimizer state: `tensor` is a view into the optimizer's buffers with the
// shape of the parameter it belongs to.
struct NamedTensor {
  std::string name;  // "exp_avg.h.0.attn.c_attn.weight"
  Tensor tensor;
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  virtual std::string name() const = 0;
  // One update of every parameter from the accumulated gradients. `grad_norm` [1] holds the
  // global gradient norm (read when clipping); `step` is 1-based; `lr` this step's rate.
  virtual void step(GPT2& model, const Tensor& grad_norm, double lr, int64_t step) = 0;
  // Every state tensor, for checkpoints.
  virtual std::vector<NamedTensor> state() const = 0;
};

// AdamW (PyTorch semantics): fp32 first and second moments, 8 bytes per parameter
// (MemCategory::kOptimizer), zero-initialised.
std::unique_ptr<Optimizer> make_adamw(GPT2& model, const OptimizerSettings& settings);

}  // namespace ct
