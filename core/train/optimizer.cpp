#include "core/train/optimizer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/optim/quant_map.h"
#include "core/registry.h"

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
       "--optim " + name +
           ": unknown optimizer; choose adamw, adafactor, adamw_8bit, lion or sgd "
           "(Hugging Face names adamw_torch, adamw_torch_fused, adamw_apex_fused, adamw_bnb_8bit "
           "and "
           "lion_32bit are accepted too)");
}

const char* optim_name(OptimKind k) {
  switch (k) {
    case OptimKind::kAdamW:
      return "adamw";
    case OptimKind::kAdafactor:
      return "adafactor";
    case OptimKind::kAdamW8bit:
      return "adamw_8bit";
    case OptimKind::kLion:
      return "lion";
    case OptimKind::kSgd:
      return "sgd";
  }
  return "?";
}

void Optimizer::set_schedule(Model& model, double lr, int64_t step) {
  (void)model, (void)lr, (void)step;
  fail(ErrorKind::kUnsupported, "set_schedule: " + graph_refusal());
}

void Optimizer::apply(Model& model, const Tensor& grad_norm) {
  (void)model, (void)grad_norm;
  fail(ErrorKind::kUnsupported, "apply: " + graph_refusal());
}

namespace {

// The rows one optimizer updates: the model's trainable table (every parameter, or with LoRA the
// adapters), or with ZeRO stage 1 its rows clipped to the shard [begin, begin + n) of the flat
// buffers, their offsets then relative to begin. A row cut by a shard bound is 1-D and named
// "<name>[from:to]" (its elements in the whole tensor); `whole` keeps each row's tensor size.
struct Rows {
  int64_t begin = 0, n = 0;
  std::vector<ParamInfo> table;
  std::vector<int64_t> whole;
  bool sharded = false;  // a ZeRO stage 1 shard (ParamShard::whole() false)
};

std::shared_ptr<const Rows> rows_of(const Model& m, const ParamShard& shard) {
  auto rows = std::make_shared<Rows>();
  const int64_t flat = m.trainable_flat().numel();
  rows->begin = shard.begin;
  rows->n = (shard.end < 0 ? flat : shard.end) - shard.begin;
  rows->sharded = !shard.whole();
  CT_CHECK(rows->begin >= 0 && rows->n >= 0 && rows->begin + rows->n <= flat,
           "optimizer shard [" + std::to_string(shard.begin) + ", " + std::to_string(shard.end) +
               ") of " + std::to_string(flat) + " parameters");
  const int64_t end = rows->begin + rows->n;
  for (const ParamInfo& p : m.trainable_params()) {
    const int64_t from = std::max(p.offset, rows->begin), to = std::min(p.offset + p.numel, end);
    if (from >= to) continue;
    ParamInfo part = p;
    part.offset = from - rows->begin;
    part.numel = to - from;
    if (part.numel != p.numel) {
      part.shape = Shape{part.numel};
      // Appended piece by piece: GCC 12 warns (-Wrestrict, falsely) on "[" + std::string here.
      part.name += '[';
      part.name += std::to_string(from - p.offset);
      part.name += ':';
      part.name += std::to_string(to - p.offset);
      part.name += ']';
    }
    rows->table.push_back(std::move(part));
    rows->whole.push_back(p.numel);
  }
  return rows;
}

// What an optimizer updates: flat parameters and gradients on one device, described by a table of
// rows (Rows). The rows need not cover the flat buffers: the elements between them (the LM head's
// padding rows, Model) are never updated, and stay as they are (zero).
struct ParamSet {
  Device* dev = nullptr;
  Tensor params, grads;  // [n] f32
  int64_t n = 0;
  std::shared_ptr<const Rows> rows;
  // [n] f16/bf16: the model's compute copy of params (Model::trainable_compute()), which an
  // optimizer that can (AdamW) writes as it updates; undefined where there is none, and for a
  // ZeRO shard or a host copy (the caller refreshes the compute copy after those).
  Tensor compute;

  // A run of adjacent table rows of one group (weight-decayed or not): one dispatch.
  struct Range {
    int64_t off, len;
    bool decay;
  };
  static ParamSet of(Model& m, const std::shared_ptr<const Rows>& rows) {
    const Tensor compute = m.trainable_compute();
    return {&m.device(),
            m.trainable_flat().slice_flat(rows->begin, {rows->n}),
            m.trainable_grads().slice_flat(rows->begin, {rows->n}),
            rows->n,
            rows,
            compute.defined() && !rows->sharded ? compute.slice_flat(rows->begin, {rows->n})
                                                : Tensor{}};
  }
  const std::vector<ParamInfo>& table() const { return rows->table; }
  // The table's rows merged into runs of adjacent rows of one group, in table order (for a model
  // without padding: [0, decay_count) and [decay_count, n), two dispatches as before).
  std::vector<Range> ranges() const {
    std::vector<Range> out;
    for (const ParamInfo& p : table()) {
      if (!out.empty() && out.back().decay == p.decay &&
          out.back().off + out.back().len == p.offset)
        out.back().len += p.numel;
      else
        out.push_back({p.offset, p.numel, p.decay});
    }
    return out;
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
  void step(Model& model, const Tensor& grad_norm, double lr, int64_t step) override {
    update(ParamSet::of(model, ps_.rows), grad_norm, lr, step);
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
// Every range of the table in one adamw_groups dispatch (ranges() merges a model's rows into 2 or
// 3 runs; more than AdamWGroups::kMaxRanges take one dispatch per kMaxRanges), its learning rate
// and step read from a device tensor uploaded before the dispatch: the update can be captured
// into a device graph and replayed at every step (set_schedule, then apply). Where the model has
// a 16-bit compute copy (ParamSet::compute), the same dispatch rounds the updated weights into
// it, as llm.c's AdamW kernel does: no second pass over the weights to refresh it.
class AdamW final : public FusedOptimizer {
 public:
  AdamW(const ParamSet& ps, const OptimizerSettings& s) : FusedOptimizer(ps, s) {
    m_ = alloc({ps.n});
    v_ = alloc({ps.n});
    for (const ParamInfo& p : ps.table()) {
      name_state("exp_avg." + p.name, m_.slice_flat(p.offset, p.shape));
      name_state("exp_avg_sq." + p.name, v_.slice_flat(p.offset, p.shape));
    }
    // Not state (nothing a checkpoint keeps): the step's scalars, rewritten at every step.
    schedule_ = ps.dev->empty({kAdamWScheduleLen}, DType::f32, MemCategory::kWorkspace);
  }
  void update(const ParamSet& ps, const Tensor& grad_norm, double lr, int64_t step) override {
    write_schedule(*ps.dev, lr, step);
    apply_to(ps, grad_norm);
  }
  std::string graph_refusal() const override { return ""; }
  bool updates_compute_copy() const override { return ps_.compute.defined(); }
  void set_schedule(Model& model, double lr, int64_t step) override {
    write_schedule(model.device(), lr, step);
  }
  void apply(Model& model, const Tensor& grad_norm) override {
    apply_to(ParamSet::of(model, ps_.rows), grad_norm);
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
  void write_schedule(Device& dev, double lr, int64_t step) {
    const AdamWSchedule sched = adamw_schedule(adam_hyper(s_, lr, step));
    dev.upload(schedule_, &sched, sizeof sched);
  }
  void apply_to(const ParamSet& ps, const Tensor& grad_norm) {
    const AdamWHyper hp = adam_hyper(s_, 0.0, 1);  // lr and step: the schedule's
    AdamWGroups groups;
    const std::vector<ParamSet::Range> ranges = ps.ranges();
    for (size_t i = 0; i < ranges.size(); ++i) {
      groups.ranges[groups.count++] = {ranges[i].off, ranges[i].len, ranges[i].decay};
      if (groups.count == AdamWGroups::kMaxRanges || i + 1 == ranges.size()) {
        ps.dev->adamw_groups(ps.params, ps.grads, m_, v_, grad_norm, schedule_, groups, hp,
                             ps.compute);
        groups.count = 0;
      }
    }
  }

  Tensor m_, v_, schedule_;
};

// ---- SGD and Lion: one fp32 buffer (or none), two dispatches -----------------------------------
class SgdLion final : public FusedOptimizer {
 public:
  SgdLion(const ParamSet& ps, const OptimizerSettings& s) : FusedOptimizer(ps, s) {
    lion_ = s.kind == OptimKind::kLion;
    if (!lion_ && s.momentum == 0.0) return;
    buf_ = alloc({ps.n});
    for (const ParamInfo& p : ps.table())
      name_state((lion_ ? "exp_avg." : "momentum_buffer.") + p.name,
                 buf_.slice_flat(p.offset, p.shape));
  }
  void update(const ParamSet& ps, const Tensor& grad_norm, double lr, int64_t step) override {
    for (const ParamSet::Range& r : ps.ranges()) {
      const int64_t off = r.off, len = r.len;
      const float wd = r.decay ? static_cast<float>(s_.weight_decay) : 0.0f;
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

// ---- 8-bit AdamW
// ---------------------------------------------------------------------------------- Tensors of >=
// min_8bit_size elements keep m and v as u8 codes with one absmax per block of 256 of their own
// elements (bitsandbytes' per-tensor blocks); smaller ones keep fp32 moments. Consecutive tensors
// of one kind and group share one dispatch; an 8-bit run ends after a tensor whose size is not a
// multiple of 256, so no block straddles two tensors.
class AdamW8bit final : public FusedOptimizer {
 public:
  AdamW8bit(const ParamSet& ps, const OptimizerSettings& s) : FusedOptimizer(ps, s) {
    int64_t n8 = 0, nb = 0, n32 = 0;
    for (size_t i = 0; i < ps.table().size(); ++i) {
      const ParamInfo& p = ps.table()[i];
      // By the whole tensor's size: a ZeRO shard's part of a tensor is stored as the tensor is.
      const bool q8 = ps.rows->whole[i] >= s.min_8bit_size;
      Run* last = runs_.empty() ? nullptr : &runs_.back();
      const bool extend = last && last->q8 == q8 && last->decay == p.decay &&
                          last->off + last->len == p.offset &&
                          (!q8 || last->len % kQuantBlockSize == 0);
      if (!extend) runs_.push_back({q8, p.decay, p.offset, 0, q8 ? n8 : n32, nb});
      runs_.back().len += p.numel;
      if (q8)
        n8 += p.numel, nb += quant_blocks(p.numel);
      else
        n32 += p.numel;
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
    for (const ParamInfo& p : ps.table()) {
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
    int64_t off, len;   // elements of the flat parameters
    int64_t state_off;  // into mq_/vq_ (q8) or m_/v_
    int64_t block_off;  // into ma_/va_ (q8)
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
    for (size_t i = 0; i < ps.table().size(); ++i) {
      const ParamInfo& p = ps.table()[i];
      CT_CHECK(ps.rows->whole[i] == p.numel,
               "Adafactor over part of " + p.name + ": its shard bounds split a tensor");
      total += p.shape.ndim >= 2 ? p.numel / cols(p) + cols(p) : p.numel;
    }
    stats_ = alloc({total});
    if (s.adafactor_beta1 > 0) exp_avg_ = alloc({ps.n});
    int64_t off = 0;
    for (const ParamInfo& p : ps.table()) {
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
      const ParamInfo& p = ps.table()[i];
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
    return p.shape.ndim >= 2
               ? std::max<int64_t>(p.shape.d[static_cast<size_t>(p.shape.ndim - 1)], 1)
               : p.numel;
  }
  Tensor stats_, exp_avg_;
  std::vector<Slot> slots_;
};

std::unique_ptr<FusedOptimizer> make_fused(const ParamSet& ps, const OptimizerSettings& s) {
  switch (s.kind) {
    case OptimKind::kAdamW:
      return std::make_unique<AdamW>(ps, s);
    case OptimKind::kAdamW8bit:
      return std::make_unique<AdamW8bit>(ps, s);
    case OptimKind::kAdafactor:
      return std::make_unique<Adafactor>(ps, s);
    case OptimKind::kLion:
    case OptimKind::kSgd:
      return std::make_unique<SgdLion>(ps, s);
  }
  fail(ErrorKind::kInternal, "make_optimizer: unknown kind");
}

// ---- offload ------------------------------------------------------------------------------------
// One background thread that runs one task at a time: the host update in flight. A persistent
// thread rather than one per step, so its OpenMP team is made once.
class UpdateWorker {
 public:
  using Clock = std::chrono::steady_clock;
  UpdateWorker() : thread_([this] { loop(); }) {}
  // Lets a task that is running finish (it writes buffers its owner is about to free), then joins.
  ~UpdateWorker() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  UpdateWorker(const UpdateWorker&) = delete;
  UpdateWorker& operator=(const UpdateWorker&) = delete;

  // Starts `task`; the previous one must have been waited for.
  void launch(std::function<void()> task) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      task_ = std::move(task);
      done_ = false;
      error_ = nullptr;
    }
    cv_.notify_all();
  }
  // Blocks until the task launched last has finished; rethrows what it threw. Returns the
  // interval it ran in.
  std::pair<Clock::time_point, Clock::time_point> wait() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return done_; });
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
    return {began_, ended_};
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [this] { return stop_ || task_; });
      if (!task_) return;  // stop_ with nothing to run
      std::function<void()> task = std::move(task_);
      task_ = nullptr;
      lock.unlock();
      const Clock::time_point began = Clock::now();
      std::exception_ptr error;
      try {
        task();
      } catch (...) {
        error = std::current_exception();
      }
      const Clock::time_point ended = Clock::now();
      lock.lock();
      began_ = began, ended_ = ended, error_ = error, done_ = true;
      cv_.notify_all();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::function<void()> task_;
  bool done_ = true, stop_ = false;
  std::exception_ptr error_;
  Clock::time_point began_, ended_;
  std::thread thread_;  // last: started once every member above exists
};

// ZeRO-Offload style: the optimizer state and an fp32 master copy of the weights live on a host
// CPU device; each step copies the gradients (and the norm) to the host, runs the same fused op
// there, and uploads the new weights into the model's fp32 parameters. The device holds no
// optimizer state. Two schedules:
//
// Synchronous (default): download gradients, update, upload weights, in that order, before
// step() returns; the next forward sees this step's update, so results equal the on-device
// optimizer's bit for bit wherever the host runs the same kernel (the CPU backend).
//
// Delayed (delayed_update; ZeRO-Offload's one-step delayed parameter update, Ren et al. 2021).
// Overlap with unchanged maths is impossible: every update needs the whole gradient
// (global-norm clipping; the gradients are complete only after the step's last backward). So
// after a synchronous first step, step() of step N
//   1. downloads g_N (this is where the host waits for the device's backward of step N),
//   2. waits for the update of step N-1 (it ran while the device computed step N),
//   3. copies g_N into the host gradients and snapshots the master weights, which now hold every
//      update up to step N-1,
//   4. starts the update with g_N on the worker thread, and
//   5. uploads the snapshot into the model's weights,
// then returns. Step N+1's micro-batches therefore run at the weights updated with g_{N-1}
// while the host applies g_N: weights used by step k are H_{k-2} for k >= 3 (H_j = the master
// after j updates), H_{k-1} for k <= 2. Nothing the device reads is written concurrently: the
// worker touches only host tensors, and the upload is an ordinary stream-ordered upload from a
// snapshot the worker does not write. A skipped step (fp16 overflow: no step() call) leaves the
// pipeline as it is: the update in flight lands in the next step(), so the skip changes neither
// weights nor state, as with the synchronous optimizer.
class Offloaded final : public Optimizer {
 public:
  Offloaded(Model& model, const OptimizerSettings& s)
      : host_(open_device("cpu")), rows_(rows_of(model, s.shard)) {
    const int64_t n = rows_->n;  // the device layout of the shard, padding included
    ParamSet ps;
    ps.dev = host_.get();
    ps.params = host_->empty({n}, DType::f32, MemCategory::kWeights);
    ps.grads = host_->empty({n}, DType::f32, MemCategory::kGrads);
    ps.n = n;
    ps.rows = rows_;
    host_ps_ = ps;
    norm_ = host_->empty({1}, DType::f32, MemCategory::kWorkspace);
    host_->fill(norm_, 0.0f);
    inner_ = make_fused(ps, s);
    if (s.delayed_update) worker_ = std::make_unique<UpdateWorker>();
  }
  // worker_ is declared last, so it is joined (an update in flight finished) before the host
  // tensors it writes go: also when the trainer unwinds from an exception.
  std::string name() const override { return inner_->name(); }

  void step(Model& model, const Tensor& grad_norm, double lr, int64_t step) override {
    Device& dev = model.device();
    const size_t bytes = static_cast<size_t>(host_ps_.n) * sizeof(float);
    staging_.resize(static_cast<size_t>(host_ps_.n));
    if (!synced_) {  // the master copy starts from the device's weights (init or a checkpoint)
      dev.download(staging_.data(), device_params(model), bytes);
      host_->upload(host_ps_.params, staging_.data(), bytes);
      synced_ = true;
    }
    if (!worker_ || !warm_) {  // synchronous: the whole step here
      dev.download(staging_.data(), device_grads(model), bytes);
      host_->upload(host_ps_.grads, staging_.data(), bytes);
      copy_norm(dev, grad_norm);
      const auto t0 = Clock::now();
      inner_->update(host_ps_, norm_, lr, step);
      stats_.update_s += seconds(Clock::now() - t0);
      ++stats_.updates;
      host_->download(staging_.data(), host_ps_.params, bytes);
      dev.upload(device_params(model), staging_.data(), bytes);
      warm_ = worker_ != nullptr;  // from the next step on, delayed
      return;
    }
    // Delayed. 1: the gradients leave the device before the join, so the wait for the device
    // (on a device backend) and the host update in flight overlap.
    grad_staging_.resize(static_cast<size_t>(host_ps_.n));
    dev.download(grad_staging_.data(), device_grads(model), bytes);
    device_waited_ = true;  // the device has finished the step; an update in flight overlapped
    float gn = 0.0f;
    if (grad_norm.defined()) dev.download(&gn, grad_norm, sizeof gn);
    join();                                                      // 2
    host_->upload(host_ps_.grads, grad_staging_.data(), bytes);  // 3
    if (grad_norm.defined()) host_->upload(norm_, &gn, sizeof gn);
    host_->download(staging_.data(), host_ps_.params, bytes);
    worker_->launch([this, lr, step] { inner_->update(host_ps_, norm_, lr, step); });  // 4
    in_flight_ = true;
    device_waited_ = false;
    dev.upload(device_params(model), staging_.data(), bytes);  // 5
    resumed_at_ = Clock::now();  // the trainer goes on with the next step from here
  }

  bool finish(Model& model) override {
    if (!in_flight_) {
      warm_ = false;
      return false;
    }
    join();
    const size_t bytes = static_cast<size_t>(host_ps_.n) * sizeof(float);
    host_->download(staging_.data(), host_ps_.params, bytes);
    model.device().upload(device_params(model), staging_.data(), bytes);
    warm_ = false;  // the pipeline starts again with a synchronous step
    return true;
  }

  std::vector<NamedTensor> state() const override { return inner_->state(); }
  int64_t state_bytes() const override { return inner_->state_bytes(); }
  bool offloaded() const override { return true; }
  std::string graph_refusal() const override {
    return "the offloaded optimizer updates in host memory, between the device's downloads and "
           "uploads";
  }
  OffloadStats offload_stats() const override { return stats_; }

 private:
  using Clock = UpdateWorker::Clock;
  static double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

  // The model's parameters and gradients this optimizer updates (a ZeRO shard of them).
  Tensor device_params(Model& model) const {
    return model.trainable_flat().slice_flat(rows_->begin, {rows_->n});
  }
  Tensor device_grads(Model& model) const {
    return model.trainable_grads().slice_flat(rows_->begin, {rows_->n});
  }

  void copy_norm(Device& dev, const Tensor& grad_norm) {
    if (!grad_norm.defined()) return;
    float gn = 0.0f;
    dev.download(&gn, grad_norm, sizeof gn);
    host_->upload(norm_, &gn, sizeof gn);
  }
  // Waits for the update in flight (if any) and books its times: the part of it that ran after
  // step() had returned and before this wait began counts as overlapped.
  void join() {
    if (!in_flight_) return;
    const auto t_wait = Clock::now();
    in_flight_ = false;
    if (device_waited_) ++stats_.overlapped_updates;  // launched before, joined after the wait
    const auto [began, ended] = worker_->wait();
    stats_.wait_s += seconds(Clock::now() - t_wait);
    stats_.update_s += seconds(ended - began);
    const auto from = std::max(began, resumed_at_), to = std::min(ended, t_wait);
    if (to > from) stats_.overlap_s += seconds(to - from);
    ++stats_.updates;
  }

  std::unique_ptr<Device> host_;
  std::shared_ptr<const Rows> rows_;
  ParamSet host_ps_;
  Tensor norm_;
  std::unique_ptr<FusedOptimizer> inner_;
  std::vector<float> staging_;       // weights on their way to the device (and the first sync)
  std::vector<float> grad_staging_;  // delayed: g_N while the update of g_{N-1} still runs
  bool synced_ = false;              // the master copy holds the model's weights
  bool warm_ = false;                // delayed: the synchronous first step is done
  bool in_flight_ = false;           // delayed: an update runs on worker_
  bool device_waited_ = false;       // delayed: step() waited for the device since the launch
  Clock::time_point resumed_at_;
  OffloadStats stats_;
  std::unique_ptr<UpdateWorker> worker_;  // last (see above)
};

}  // namespace

std::vector<int64_t> zero_partition(const std::vector<ParamInfo>& table, int64_t n, OptimKind kind,
                                    int world) {
  CT_CHECK(world >= 1 && n >= 0, "zero_partition of " + std::to_string(n) + " elements over " +
                                     std::to_string(world) + " ranks");
  // The allowed cut nearest to `target`: inside a row, the grid points of its granule from its
  // start (its end counts too); elsewhere, target itself.
  auto nearest_cut = [&](int64_t target) {
    for (const ParamInfo& p : table) {
      if (target <= p.offset || target >= p.offset + p.numel) continue;
      const int64_t granule = kind == OptimKind::kAdafactor ? p.numel : kQuantBlockSize;
      const int64_t lo = p.offset + (target - p.offset) / granule * granule;
      const int64_t hi = std::min(lo + granule, p.offset + p.numel);
      return target - lo <= hi - target ? lo : hi;
    }
    return target;
  };
  std::vector<int64_t> bounds(static_cast<size_t>(world) + 1, 0);
  for (int k = 1; k < world; ++k) {
    // k * n / world, rounded to nearest, without overflow for any n a buffer can have
    const int64_t target = static_cast<int64_t>(
        std::llround(static_cast<long double>(n) * k / static_cast<long double>(world)));
    bounds[static_cast<size_t>(k)] = std::max(nearest_cut(target), bounds[k - 1]);
  }
  bounds.back() = n;
  return bounds;
}

std::unique_ptr<Optimizer> make_optimizer(Model& model, const OptimizerSettings& settings) {
  if (settings.kind == OptimKind::kSgd)
    CT_REQUIRE(!settings.nesterov || (settings.momentum > 0 && settings.dampening == 0),
               "--sgd-nesterov needs --sgd-momentum > 0 and --sgd-dampening 0");
  if (settings.offload) return std::make_unique<Offloaded>(model, settings);
  return make_fused(ParamSet::of(model, rows_of(model, settings.shard)), settings);
}

std::unique_ptr<Optimizer> make_adamw(Model& model, const OptimizerSettings& settings) {
  OptimizerSettings s = settings;
  s.kind = OptimKind::kAdamW;
  return make_optimizer(model, s);
}

}  // namespace ct
