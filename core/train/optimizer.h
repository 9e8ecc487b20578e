// Optimizers over the model's two parameter groups (decayed / not decayed), fused on the device:
// AdamW, Adafactor, 8-bit AdamW, Lion and SGD (core/device.h's optimizer ops), optionally with
// their state offloaded to host memory (and then, optionally, updated in the background with
// ZeRO-Offload's one-step delayed parameter update). Their state is exposed as named tensors so
// checkpoints can save and restore it bit for bit.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/model/model.h"

namespace ct {

enum class OptimKind { kAdamW, kAdafactor, kAdamW8bit, kLion, kSgd };

// --optim names: adamw | adafactor | adamw_8bit | lion | sgd, and the Hugging Face aliases
// adamw_torch, adamw_torch_fused, adamw_apex_fused (adamw), adamw_bnb_8bit (adamw_8bit),
// lion_32bit (lion). Throws Error(kInvalidArgument) listing the accepted names.
OptimKind parse_optim(const std::string& name);
const char* optim_name(OptimKind k);  // the canonical name ("adamw_8bit")

// ZeRO stage 1 (--zero-stage 1): [begin, end) of the flat trainable buffers, the part of the
// parameters one rank's optimizer keeps state for and updates; end < 0: all of them.
struct ParamShard {
  int64_t begin = 0, end = -1;
  bool whole() const { return begin == 0 && end < 0; }
};

// ZeRO stage 1's partition rule. The flat trainable buffer of n elements, whose rows are `table`,
// is cut into `world` contiguous shards in rank order; rank r owns [bounds[r], bounds[r + 1]) of
// the world + 1 bounds returned (bounds[0] = 0, bounds[world] = n). Bound k is the allowed cut
// nearest to k * n / world (the lower of two as near; never below bound k - 1). A cut may fall
// anywhere outside a row (the LM head's padding), and inside a row only at a multiple of 256
// elements from its start (kQuantBlockSize: 8-bit AdamW's blocks stay whole, so each rank's
// update is the unsharded one's) -- for Adafactor, whose statistics are per tensor, only at its
// ends. Shards are therefore about n / world elements (Adafactor: within a tensor's size of it);
// one may be empty.
std::vector<int64_t> zero_partition(const std::vector<ParamInfo>& table, int64_t n, OptimKind kind,
                                    int world);

struct OptimizerSettings {
  OptimKind kind = OptimKind::kAdamW;
  double weight_decay = 0.0;                      // applied to the decay group only
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;  // AdamW, 8-bit AdamW; Lion's betas too
  double max_grad_norm = 0.0;                     // > 0: clip by the global norm
  // SGD (torch.optim.SGD)
  double momentum = 0.0, dampening = 0.0;
  bool nesterov = false;
  // Adafactor (transformers.optimization.Adafactor); relative_step ignores the lr passed to
  // step() and derives it from the step count, as HF does with lr=None.
  double adafactor_eps1 = 1e-30, adafactor_eps2 = 1e-3;
  double clip_threshold = 1.0, decay_rate = -0.8;
  double adafactor_beta1 = 0.0;  // 0 = None (no first moment)
  bool relative_step = false, scale_parameter = false, warmup_init = false;
  // 8-bit AdamW: tensors with fewer elements stay fp32 (bitsandbytes' min_8bit_size).
  int64_t min_8bit_size = 4096;
  // Keep the state (and an fp32 master copy of the weights) in host memory and update there.
  bool offload = false;
  // With offload: ZeRO-Offload's delayed parameter update (DPU). The first step (and the first
  // after finish()) is synchronous; from then on step() hands the gradients to a host thread
  // and returns at once, and the model's weights lag one update behind the master copy: the
  // gradients of step N are computed at the weights updated with those of step N-2.
  bool delayed_update = false;
  // ZeRO stage 1: only these parameters (and only their state). Their state tensors are named
  // as the rows' ("exp_avg.wte.weight"); a row cut by a shard bound is 1-D and named with its
  // elements' range ("exp_avg.wte.weight[0:4096]").
  ParamShard shard;
};

// What offloading cost and hid, for metrics (all zero for an optimizer on the device).
struct OffloadStats {
  int64_t updates = 0;  // host updates finished (synchronous and delayed)
  double update_s = 0;  // seconds the host spent in them
  // Of update_s: seconds a delayed update ran while the trainer was already at the next step's
  // work (on a device backend: recording the next micro-batches and waiting for the device to
  // compute them; on the CPU backend the main thread computes them itself). 0 when synchronous.
  double overlap_s = 0;
  double wait_s = 0;  // seconds step()/finish() blocked waiting for an update in flight
  // Delayed updates started before, and waited for only after, the next step() waited for the
  // device (read that step's gradients back): each was free to run while the device computed.
  // Counted by the order of events, not by clocks, so it does not depend on how fast the device
  // or the host is (where the device finishes first, overlap_s may be 0 while this is not).
  int64_t overlapped_updates = 0;
};

// A named piece of optimizer state: `tensor` is a view into the optimizer's buffers with the
// shape of the parameter it belongs to (or of its row/column statistics, or its 8-bit blocks).
struct NamedTensor {
  std::string name;  // "exp_avg.h.0.attn.c_attn.weight"
  Tensor tensor;     // on the device that holds the state (the host CPU device when offloaded)
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  // The canonical name of the algorithm, stored in checkpoints ("adamw", "adamw_8bit", ...);
  // offloading does not change it (its state is the same).
  virtual std::string name() const = 0;
  // One update of every parameter from the accumulated gradients. `grad_norm` [1] holds the
  // global gradient norm (read when clipping); `step` is 1-based; `lr` this step's rate. With
  // delayed_update the update may still be running when this returns (see finish()); the
  // gradients have been copied out by then, so the caller may zero them.
  virtual void step(Model& model, const Tensor& grad_norm, double lr, int64_t step) = 0;
  // Every state tensor, for checkpoints.
  virtual std::vector<NamedTensor> state() const = 0;
  // Bytes of optimizer state (MemCategory::kOptimizer), wherever it lives.
  virtual int64_t state_bytes() const = 0;
  // Whether the state lives in host memory rather than on the model's device.
  virtual bool offloaded() const { return false; }
  // Whether step() and apply() also round each parameter they update into the model's 16-bit
  // copy (Model::trainable_compute()), so that the caller need not refresh_compute_weights()
  // after them: AdamW on the device over every parameter of a mixed-precision model without
  // LoRA. False for the others, offloaded and ZeRO-1 sharded ones too (the gather that follows a
  // sharded step changes the other shards' master weights).
  virtual bool updates_compute_copy() const { return false; }
  // Waits for an update still running in the background (delayed_update) and gives the model
  // the weights after every update so far, so that weights and state() agree (checkpoints, the
  // end of training); the next step() is synchronous again. Returns whether the model's master
  // weights changed (the caller then calls model.refresh_compute_weights()). Rethrows an error
  // of the background update. A no-op returning false for synchronous optimizers.
  virtual bool finish(Model& model) {
    (void)model;
    return false;
  }
  virtual OffloadStats offload_stats() const { return {}; }

  // A step split for a device graph: set_schedule() writes this step's learning rate and step
  // count into the optimizer's device tensors (host work: an upload, outside any capture), then
  // apply() enqueues the update, device ops that are the same at every step (capturable), read
  // what set_schedule() wrote. step() is the two in a row. graph_refusal(): "" when the optimizer
  // can do this, otherwise why not (the other two then throw Error(kUnsupported)).
  virtual std::string graph_refusal() const {
    return name() + " passes its learning rate and step to its kernels as arguments";
  }
  virtual void set_schedule(Model& model, double lr, int64_t step);
  virtual void apply(Model& model, const Tensor& grad_norm);
};

// The optimizer `settings.kind` over `model`'s parameters (settings.shard of them), state
// zero-initialised and accounted as MemCategory::kOptimizer. Bytes per parameter: AdamW 8; 8-bit
// AdamW 2 + 8/256 (tensors of
// >= min_8bit_size elements; 8 for the rest); Adafactor 4 (R + C) per matrix [R, C] and 4 per
// element of a 1-D tensor (plus 4 per element with beta1); Lion 4; SGD 4 with momentum, else 0.
std::unique_ptr<Optimizer> make_optimizer(Model& model, const OptimizerSettings& settings);

// AdamW (PyTorch semantics): fp32 first and second moments, 8 bytes per parameter.
std::unique_ptr<Optimizer> make_adamw(Model& model, const OptimizerSettings& settings);

}  // namespace ct
