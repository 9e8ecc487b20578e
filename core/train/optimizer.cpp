#include "core/train/optimizer.h"

namespace ct {
namespace {

class AdamW final : public Optimizer {
 public:
  AdamW(GPT2& model, const OptimizerSettings& s) : s_(s) {
    Device& dev = model.device();
    const int64_t n = model.num_parameters();
    m_ = dev.empty({n}, DType::f32, MemCategory::kOptimizer);
    v_ = dev.empty({n}, DType::f32, MemCategory::kOptimizer);
    dev.fill(m_, 0.0f);
    dev.fill(v_, 0.0f);
    for (const ParamInfo& p : model.params()) {
      state_.push_back({"exp_avg." + p.name, m_.slice_flat(p.offset, p.shape)});
      state_.push_back({"exp_avg_sq." + p.name, v_.slice_flat(p.offset, p.shape)});
    }
  }

  std::string name() const override { return "adamw"; }

  void step(GPT2& model, const Tensor& grad_norm, double lr, int64_t step) override {
    Device& dev = model.device();
    const int64_t n = model.num_parameters(), nd = model.decay_count();
    AdamWHyper hp;
    hp.lr = static_cast<float>(lr);
    hp.beta1 = static_cast<float>(s_.beta1);
    hp.beta2 = static_cast<float>(s_.beta2);
    hp.eps = static_cast<float>(s_.eps);
    hp.step = step;
    hp.max_grad_norm = static_cast<float>(s_.max_grad_norm);
    hp.weight_decay = static_cast<float>(s_.weight_decay);
    dev.adamw(model.params_decay(), model.grads_decay(), m_.slice_flat(0, {nd}),
              v_.slice_flat(0, {nd}), grad_norm, hp);
    hp.weight_decay = 0.0f;
    dev.adamw(model.params_no_decay(), model.grads_no_decay(), m_.slice_flat(nd, {n - nd}),
              v_.slice_flat(nd, {n - nd}), grad_norm, hp);
  }

  std::vector<NamedTensor> state() const override { return state_; }

 private:
  OptimizerSettings s_;
  Tensor m_, v_;
  std::vector<NamedTensor> state_;
};

}  // namespace

std::unique_ptr<Optimizer> make_adamw(GPT2& model, const OptimizerSettings& settings) {
  return std::make_unique<AdamW>(model, settings);
}

}  // namespace ct
