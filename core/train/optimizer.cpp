#include "core/train/optimizer.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "core/error.h"
#include "core/optim/quant_map.h"

namespace ct {

OptimKind parse_optim(const std::string& name) {
  if (name == "adamw" || name == "adamw_torch" || name == "adamw_torch_fused" ||
      name == "adamw_apex_fused")
    return OptimKind::kAdamW;
  if (name == "adamw_8bit" || name == "adamw_bnb_8bit") return OptimKind::kAdamW8bit;
  if (name == "adafactor") return OptimKind::kAdafactor;
  if (name == "lion" || name == "lion_32bit") return OptimKind::kLion;
  if (name == "sgd") return OptimKind::kSgd;
  fail(ErrorKind::kInvalidArgument,
       "--optim " + name + ": unknown optimizer; choose adamw, adafactor, adamw_8bit, lion or sgd "
       "(Hugging Face names adamw_torch, adamw_torch_fused, adamw_apex_fused, adamw_bnb_8bit and "
       "lion_32bit are accepted too)");
}

const char* optim_name(OptimKind k) {
  switch (k) {
    case OptimKind::kAdamW: return "adamw";
    case OptimKind::kAdafactor: return "adafactor";
    case OptimKind::kAdamW8bit: return "adamw_8bit";
    case OptimKind::kLion: return "lion";
    case OptimKind::kSgd: return "sgd";
  }
  return "?";
}

namespace {

// What an optimizer updates: flat parameters and gradients on one device, the first
// `decay_count` elements weight-decayed, described by the model's parameter table.
struct ParamSet {
  Device* dev = nullptr;
  Tensor params, grads;  // [n] f32
  int64_t n = 0, decay_count = 0;
  const std::vector<ParamInfo>* table = nullptr;

  static ParamSet of(GPT2& m) {
    return {&m.device(), m.params_flat(), m.grads_flat(), m.num_parameters(), m.decay_count(),
            &m.params()};
  }
  Tensor param(const ParamInfo& p) const { return params.slice_flat(p.offset, p.shape); }
  Tensor grad(const ParamInfo& p) const { return grads.slice_flat(p.offset, p.shape); }
  Tensor param_range(int64_t off, int64_t len) const { return params.slice_flat(off, {len}); }
  Tensor grad_range(int64_t off, int64_t len) const { return grads.slice_flat(off, {len}); }
};

// The common part: state allocation (zeroed, kOptimizer, counted) and the Optimizer plumbing.
class FusedOptimizer : public Optimizer {
 public:
  FusedOptimizer(const ParamSet& ps, const OptimizerSettings& s) : ps_(ps), s_(s) {}
  std::string name() const override { return optim_name(s_.kind); }
  void step(GPT2& model, const Tensor& grad_norm, double lr, int64_t step) override {
    update(ParamSet::of(model), grad_norm, lr, step);
  }
  std::vector<NamedTensor> state() const override { return state_; }
  int64_t state_bytes() const override { return bytes_; }
  // The update on an explicit parameter set (the offloading wrapper passes host tensors).
  virtual void update(const ParamSet& ps, const Tensor& grad_norm, double lr, int64_t step) = 0;

 protected:
  Tensor alloc(const Shape& shape, DType dt = DType::f32) {
    Tensor t = ps_.dev->empty(shape, dt, MemCategory::kOptimizer);
    ps_.dev->fill(t, 0.0f);
    bytes_ += static_cast<int64_t>(t.nbytes());
    return t;
  }
  void name_state(const std::string& name, const Tensor& t) { state_.push_back({name, t}); }
  float max_norm() const { return static_cast<float>(s_.max_grad_norm); }

  ParamSet ps_;
  OptimizerSettings s_;
  std::vector<NamedTensor> state_;
  int64_t bytes_ = 0;
};

// ---- AdamW ------------------------------------------------------------------------------------
class AdamW final : public FusedOptimizer {
 public:
  AdamW(const ParamSet& ps, const OptimizerSettings& s) : FusedOptimizer(ps, s) {
    m_ = alloc({ps.n});
    v_ = alloc({ps.n});
    for (const ParamInfo& p : *ps.table) {
      name_state("exp_avg." + p.name, m_.slice_flat(p.offset, p.shape));
      name_state("exp_avg_sq." + p.name, v_.slice_flat(p.offset, p.shape));
    }
  }
  void update(const ParamSet& ps, const Tensor& grad_norm, double lr, int64_t step) override {
    AdamWHyper hp = adam_hyper(s_, lr, step);
    const int64_t nd = ps.decay_count, n = ps.n;
    ps.dev->adamw(ps.param_range(0, nd), ps.grad_range(0, nd), m_.slice_flat(0, {nd}),
                  v_.slice_flat(0, {nd}), grad_norm, hp);
    hp.weight_decay = 0.0f;
    ps.dev->adamw(ps.param_range(nd, n - nd), ps.grad_range(nd, n - nd),
                  m_.slice_flat(nd, {n - nd}), v_.slice_flat(nd, {n - nd}), grad_norm, hp);
  }
  static AdamWHyper adam_hyper(const OptimizerSettings& s, double lr, int64_t step) {
    AdamWHyper hp;
    hp.lr = static_cast<float>(lr);
    hp.beta1 = static_cast<float>(s.beta1);
    hp.beta2 = static_cast<float>(s.beta2);
    hp.eps = static_cast<float>(s.eps);
    hp.step = step;
    hp.max_grad_norm = static_cast<float>(s.max_grad_norm);
    hp.weight_decay = static_cast<float>(s.weight_decay);
    return hp;
  }

 private:
  Tensor m_, v_;
};

// ---- SGD and Lion: one fp32 buffer (or none), two dispatches -----------------------------------
class SgdLion final : public FusedOptimizer {
 public:
  SgdLion(const ParamSet& ps, const OptimizerSettings& s) : FusedOptimizer(ps, s) {
    lion_ = s.kind == OptimKind::kLion;
    if (!lion_ && s.momentum == 0.0) return;
    buf_ = alloc({ps.n});
    for (const ParamInfo& p : *ps.table)
      name_state((lion_ ? "exp_avg." : "momentum_buffer.") + p.name, buf_.slice_flat(p.offset, p.shape));
  }
  void update(const ParamSet& ps, const Tensor& grad_norm, double lr, int64_t step) override {
    const int64_t nd = ps.decay_count, n = ps.n;
    for (int group = 0; group < 2; ++group) {
      const int64_t off = group ? nd : 0, len = group ? n - nd : nd;
      const float wd = group ? 0.0f : static_cast<float>(s_.weight_decay);
      if (len == 0) continue;
      Tensor buf = buf_.defined() ? buf_.slice_flat(off, {len}) : Tensor{};
      if (lion_) {
        LionHyper h;
        h.lr = static_cast<float>(lr);
        h.beta1 = static_cast<float>(s_.beta1);
        h.beta2 = static_cast<float>(s_.beta2);
        h.weight_decay = wd;
        h.max_grad_norm = max_norm();
        ps.dev->lion(ps.param_range(off, len), ps.grad_range(off, len), buf, grad_norm, h);
      } else {
        SgdHyper h;
        h.lr = static_cast<float>(lr);
        h.momentum = static_cast<float>(s_.momentum);
        h.dampening = static_cast<float>(s_.dampening);
        h.nesterov = s_.nesterov;
        h.weight_decay = wd;
        h.step = step;
        h.max_grad_norm = max_norm();
        ps.dev->sgd(ps.param_range(off, len), ps.grad_range(off, len), buf, grad_norm, h);
      }
    }
  }

 private:
  bool lion_ = false;
  Tensor buf_;
};

// ---- 8-bit AdamW ----------------------------------------------------------------------------------
// Tensors of >= min_8bit_size elements keep m and v as u8 codes with one absmax per block of
// 256 of their own elements (bitsandbytes' per-tensor blocks); smaller ones keep fp32 moments.
// Consecutive tensors of one kind and group share one dispatch; an 8-bit run ends after a
// tensor whose size is not a multiple of 256, so no block straddles two tensors.
class AdamW8bit final : public FusedOptimizer {
 public:
  AdamW8bit(const ParamSet& ps, const OptimizerSettings& s) : FusedOptimizer(ps, s) {
    int64_t n8 = 0, nb = 0, n32 = 0;
    for (const ParamInfo& p : *ps.table) {
      const bool q8 = p.numel >= s.min_8bit_size;
      Run* last = runs_.empty() ? nullptr : &runs_.back();
      const bool extend = last && last->q8 == q8 && last->decay == p.decay &&
                          last->off + last->len == p.offset &&
                          (!q8 || last->len % kQuantBlockSize == 0);
      if (!extend) runs_.push_back({q8, p.decay, p.offset, 0, q8 ? n8 : n32, nb});
      runs_.back().len += p.numel;
      if (q8) n8 += p.numel, nb += quant_blocks(p.numel);
      else n32 += p.numel;
    }
    if (n8) {
      mq_ = alloc({n8}, DType::u8), vq_ = alloc({n8}, DType::u8);
      ma_ = alloc({nb}), va_ = alloc({nb});
      qs_ = alloc({256}), qu_ = alloc({256});
      ps.dev->upload(qs_, dynamic_map_signed().data(), 256 * sizeof(float));
      ps.dev->upload(qu_, dynamic_map_unsigned().data(), 256 * sizeof(float));
    }
    if (n32) m_ = alloc({n32}), v_ = alloc({n32});
    // Name each tensor's slices: walk the runs again in table order.
    size_t r = 0;
    int64_t in_run = 0, blocks_in_run = 0;
    for (const ParamInfo& p : *ps.table) {
      if (p.offset >= runs_[r].off + runs_[r].len) ++r, in_run = 0, blocks_in_run = 0;
      const Run& run = runs_[r];
      if (run.q8) {
        const int64_t q = run.state_off + in_run, b = run.block_off + blocks_in_run;
        const Shape bs{quant_blocks(p.numel)};
        name_state("exp_avg.q." + p.name, mq_.slice_flat(q, p.shape));
        name_state("exp_avg.absmax." + p.name, ma_.slice_flat(b, bs));
        name_state("exp_avg_sq.q." + p.name, vq_.slice_flat(q, p.shape));
        name_state("exp_avg_sq.absmax." + p.name, va_.slice_flat(b, bs));
        blocks_in_run += quant_blocks(p.numel);
      } else {
        name_state("exp_avg." + p.name, m_.slice_flat(run.state_off + in_run, p.shape));
        name_state("exp_avg_sq." + p.name, v_.slice_flat(run.state_off + in_run, p.shape));
      }
      in_run += p.numel;
    }
  }
  void update(const ParamSet& ps, const Tensor& grad_norm, double lr, int64_t step) override {
    for (const Run& r : runs_) {
      AdamWHyper hp = AdamW::adam_hyper(s_, lr, step);
      if (!r.decay) hp.weight_decay = 0.0f;
      Tensor p = ps.param_range(r.off, r.len), g = ps.grad_range(r.off, r.len);
      if (r.q8) {
        const Shape bs{quant_blocks(r.len)};
        ps.dev->adamw_8bit(p, g, mq_.slice_flat(r.state_off, {r.len}),
                           vq_.slice_flat(r.state_off, {r.len}), ma_.slice_flat(r.block_off, bs),
                           va_.slice_flat(r.block_off, bs), qs_, qu_, grad_norm, hp);
      } else {
        ps.dev->adamw(p, g, m_.slice_flat(r.state_off, {r.len}),
                      v_.slice_flat(r.state_off, {r.len}), grad_norm, hp);
      }
    }
  }

 private:
  struct Run {
    bool q8, decay;
    int64_t off, len;        // elements of the flat parameters
    int64_t state_off;       // into mq_/vq_ (q8) or m_/v_
    int64_t block_off;       // into ma_/va_ (q8)
  };
  std::vector<Run> runs_;
  Tensor mq_, vq_, ma_, va_, qs_, qu_, m_, v_;
};

// ---- Adafactor ----------------------------------------------------------------------------------
// One dispatch per tensor (its statistics are per tensor): row [R] and column [C] second-moment
// statistics for matrices, a full one for vectors, and an optional first moment.
class Adafactor final : public FusedOptimizer {
 public:
  Adafactor(const ParamSet& ps, const OptimizerSettings& s) : FusedOptimizer(ps, s) {
    int64_t total = 0;
    for (const ParamInfo& p : *ps.table) {
      total += p.shape.ndim >= 2 ? p.numel / cols(p) + cols(p) : p.numel;
    }
    stats_ = alloc({total});
    if (s.adafactor_beta1 > 0) exp_avg_ = alloc({ps.n});
    int64_t off = 0;
    for (const ParamInfo& p : *ps.table) {
      Slot slot;
      if (p.shape.ndim >= 2) {
        const int64_t C = cols(p), R = p.numel / C;
        slot.row = stats_.slice_flat(off, {R});
        slot.col = stats_.slice_flat(off + R, {C});
        name_state("exp_avg_sq_row." + p.name, slot.row);
        name_state("exp_avg_sq_col." + p.name, slot.col);
        off += R + C;
      } else {
        slot.v = stats_.slice_flat(off, p.shape);
        name_state("exp_avg_sq." + p.name, slot.v);
        off += p.numel;
      }
      if (exp_avg_.defined()) {
        slot.exp_avg = exp_avg_.slice_flat(p.offset, p.shape);
        name_state("exp_avg." + p.name, slot.exp_avg);
      }
      slots_.push_back(slot);
    }
  }
  void update(const ParamSet& ps, const Tensor& grad_norm, double lr, int64_t step) override {
    AdafactorHyper h;
    h.lr = static_cast<float>(lr);
    h.eps1 = static_cast<float>(s_.adafactor_eps1);
    h.eps2 = static_cast<float>(s_.adafactor_eps2);
    h.clip_threshold = static_cast<float>(s_.clip_threshold);
    h.decay_rate = static_cast<float>(s_.decay_rate);
    h.beta1 = static_cast<float>(s_.adafactor_beta1);
    h.relative_step = s_.relative_step;
    h.scale_parameter = s_.scale_parameter;
    h.warmup_init = s_.warmup_init;
    h.step = step;
    h.max_grad_norm = max_norm();
    for (size_t i = 0; i < slots_.size(); ++i) {
      const ParamInfo& p = (*ps.table)[i];
      const Slot& s = slots_[i];
      h.weight_decay = p.decay ? static_cast<float>(s_.weight_decay) : 0.0f;
      Tensor param = ps.param(p), grad = ps.grad(p);
      if (p.shape.ndim > 2) {  // [.., R, C] -> [R, C]
        const int64_t C = cols(p);
        param = param.reshape({p.numel / C, C});
        grad = grad.reshape({p.numel / C, C});
      }
      ps.dev->adafactor(param, grad, s.row, s.col, s.v, s.exp_avg, grad_norm, h);
    }
  }

 private:
  struct Slot {
    Tensor row, col, v, exp_avg;
  };
  // C of a factored [.., R, C] tensor: its last dimension.
  static int64_t cols(const ParamInfo& p) {
    return p.shape.ndim >= 2 ? std::max<int64_t>(p.shape.d[static_cast<size_t>(p.shape.ndim - 1)], 1) : p.numel;
  }
  Tensor stats_, exp_avg_;
  std::vector<Slot> slots_;
};

std::unique_ptr<FusedOptimizer> make_fused(const ParamSet& ps, const OptimizerSettings& s) {
  switch (s.kind) {
    case OptimKind::kAdamW: return std::make_unique<AdamW>(ps, s);
    case OptimKind::kAdamW8bit: return std::make_unique<AdamW8bit>(ps, s);
    case OptimKind::kAdafactor: return std::make_unique<Adafactor>(ps, s);
    case OptimKind::kLion:
    case OptimKind::kSgd: return std::make_unique<SgdLion>(ps, s);
  }
  fail(ErrorKind::kInternal, "make_optimizer: unknown kind");
}

// ---- offload ------------------------------------------------------------------------------------
// ZeRO-Offload style: the optimizer state and an fp32 master copy of the weights live on a host
// CPU device; each step downloads the gradients (and the norm), runs the same fused op there and
// uploads the new weights into the model's fp32 parameters. The device holds no optimizer state.
// What overlaps: nothing yet on the device side. The step is strictly ordered (download after
// backward, host update, upload before the next forward), which keeps results equal to the
// on-device optimizer; overlapping the host update with the next micro-batch needs either a
// one-step-delayed update (ZeRO-Offload's DPU, which changes the maths) or per-layer gradient
// readiness from backward, neither of which exists here yet.
class Offloaded final : public Optimizer {
 public:
  Offloaded(GPT2& model, const OptimizerSettings& s) : host_(make_cpu_device(false)) {
    const int64_t n = model.num_parameters();
    ParamSet ps;
    ps.dev = host_.get();
    ps.params = host_->empty({n}, DType::f32, MemCategory::kWeights);
    ps.grads = host_->empty({n}, DType::f32, MemCategory::kGrads);
    ps.n = n;
    ps.decay_count = model.decay_count();
    ps.table = &model.params();
    host_ps_ = ps;
    norm_ = host_->empty({1}, DType::f32, MemCategory::kWorkspace);
    host_->fill(norm_, 0.0f);
    inner_ = make_fused(ps, s);
  }
  std::string name() const override { return inner_->name(); }
  void step(GPT2& model, const Tensor& grad_norm, double lr, int64_t step) override {
    Device& dev = model.device();
    const size_t bytes = static_cast<size_t>(host_ps_.n) * sizeof(float);
    staging_.resize(static_cast<size_t>(host_ps_.n));
    if (!synced_) {  // the master copy starts from the device's weights (init or a checkpoint)
      dev.download(staging_.data(), model.params_flat(), bytes);
      host_->upload(host_ps_.params, staging_.data(), bytes);
      synced_ = true;
    }
    dev.download(staging_.data(), model.grads_flat(), bytes);
    host_->upload(host_ps_.grads, staging_.data(), bytes);
    if (grad_norm.defined()) {
      float gn = 0.0f;
      dev.download(&gn, grad_norm, sizeof gn);
      host_->upload(norm_, &gn, sizeof gn);
    }
    inner_->update(host_ps_, norm_, lr, step);
    host_->download(staging_.data(), host_ps_.params, bytes);
    dev.upload(model.params_flat(), staging_.data(), bytes);
  }
  std::vector<NamedTensor> state() const override { return inner_->state(); }
  int64_t state_bytes() const override { return inner_->state_bytes(); }
  bool offloaded() const override { return true; }

 private:
  std::unique_ptr<Device> host_;
  ParamSet host_ps_;
  Tensor norm_;
  std::unique_ptr<FusedOptimizer> inner_;
  std::vector<float> staging_;
  bool synced_ = false;
};

}  // namespace

std::unique_ptr<Optimizer> make_optimizer(GPT2& model, const OptimizerSettings& settings) {
  if (settings.kind == OptimKind::kSgd)
    CT_REQUIRE(!settings.nesterov || (settings.momentum > 0 && settings.dampening == 0),
               "--sgd-nesterov needs --sgd-momentum > 0 and --sgd-dampening 0");
  if (settings.offload) return std::make_unique<Offloaded>(model, settings);
  return make_fused(ParamSet::of(model), settings);
}

std::unique_ptr<Optimizer> make_adamw(GPT2& model, const OptimizerSettings& settings) {
  OptimizerSettings s = settings;
  s.kind = OptimKind::kAdamW;
  return make_optimizer(model, s);
}

}  // namespace ct
