// Low-rank adapters (LoRA, Hu et al. 2021) as PEFT defines them, for any model family: a model
// lists the linear layers it offers (LoraSite), LoraAdapters holds the adapters of the targeted
// ones -- their table, f32 master, compute copy, gradients and scratch -- and adds
//   y += (alpha / r) * dropout(x) @ A^T @ B^T,   A [r, in], B [out, r]
// to a layer's output right after the layer's own forward, and the update's gradients right
// after the layer's input gradient. GPT2 and Llama both use it; the optimizer, checkpoints and
// adapter files see the table through Model.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/model/model.h"
#include "core/tensor.h"

namespace ct {

struct LoraOptions {
  int r = 0;           // rank; 0: no adapters (every parameter trains)
  float alpha = 8.0f;  // the update is scaled by alpha / r (PEFT's lora_alpha)
  // PEFT's target_modules: a layer is adapted when one entry equals its module name
  // ("h.0.attn.c_attn", "model.layers.0.self_attn.q_proj") or the name's last dotted parts
  // ("c_attn", "attn.c_attn", "q_proj"). Empty: the family's default (PEFT's: c_attn for GPT-2,
  // q_proj and v_proj for the Llama family).
  std::vector<std::string> target_modules;
  // PEFT's lora_dropout: the adapter's input is x with elements zeroed at this rate (and the
  // rest scaled by 1 / (1 - dropout)), in training passes only (set_dropout_draw).
  float dropout = 0.0f;
  bool enabled() const { return r > 0; }
  float scaling() const { return alpha / static_cast<float>(r); }
};

// PEFT's rule for one string entry of target_modules against a module name.
bool lora_targets(const std::vector<std::string>& targets, const std::string& module);

// A linear layer a model offers for adaptation.
struct LoraSite {
  std::string module;       // "h.3.attn.c_attn", "model.layers.3.self_attn.q_proj"
  int64_t in = 0, out = 0;  // the layer's input and output widths
  // Where the layer's output lies in the tensor the model computes: columns [out_offset,
  // out_offset + out) of rows out_total wide (Llama's fused q|k|v and gate|up projections);
  // out_total 0 means out (a layer with an output of its own).
  int64_t out_total = 0, out_offset = 0;
  int64_t width() const { return out_total > 0 ? out_total : out; }
};

class LoraAdapters {
 public:
  // The adapters `options` asks for among `sites` (every adaptable layer of the model, in the
  // model's order; a site's index is how the model names it in forward / backward). Validates
  // the options (rank at most `max_rank`, each target matching some site of layer 0, whose
  // names `family` messages list); allocates nothing when !options.enabled().
  LoraAdapters(Device& device, const LoraOptions& options, std::vector<LoraSite> sites, int layers,
               int64_t max_rank, DType compute, bool with_grads, const std::string& family);
  LoraAdapters(const LoraAdapters&) = delete;
  LoraAdapters& operator=(const LoraAdapters&) = delete;

  bool enabled() const { return options_.enabled(); }
  const LoraOptions& options() const { return options_; }
  // "<module>.lora_A.weight" [r, in] and "<module>.lora_B.weight" [out, r], per adapted site in
  // site order; all weight-decayed (as Hugging Face's Trainer decays them).
  const std::vector<ParamInfo>& table() const { return table_; }
  int64_t count() const { return count_; }
  Tensor params() const { return params_; }  // [count] f32 master
  Tensor grads() const;                      // [count] f32; kInvalidArgument without gradients
  bool trains() const { return grads_.defined(); }
  // Adapter parameters and the bytes of kWeights the adapters take (master, compute copy).
  static int64_t parameter_count(const std::vector<LoraSite>& sites, const LoraOptions& options);
  static int64_t weight_bytes(const std::vector<LoraSite>& sites, const LoraOptions& options,
                              DType compute);
  // Bytes of kActivations allocate() takes for BT rows (h: the activations' dtype).
  static int64_t activation_bytes(const std::vector<LoraSite>& sites, const LoraOptions& options,
                                  int64_t BT, DType h, bool with_grads);
  void allocate(int64_t BT, DType h, bool with_grads);
  void release();

  // Adapter k of the table draws from Philox stream first_stream + k: every lora_A uniform in
  // +-1/sqrt(in) (PEFT's kaiming_uniform(a=sqrt(5)) bound), every lora_B zero, so the adapted
  // model starts as the base. Refreshes the compute copy.
  void init(uint64_t seed, uint64_t first_stream);
  // compute copy (=) master (rounded to the compute dtype, B placed in its site's padded rows).
  void refresh_compute();
  std::map<std::string, std::vector<float>> download_map() const;
  // Every adapter must be present with its element count; unknown names are errors.
  void upload(const std::map<std::string, std::vector<float>>& named);

  // Dropout masks for the passes that follow, a pure function of (seed, draw, site): Philox
  // stream kDropoutStream + draw * sites + site, so backward (and the recomputation of gradient
  // checkpointing) sees the forward's mask and a resumed run the same masks; draw < 0 (the
  // default, as for evaluation) turns dropout off.
  void set_dropout_draw(uint64_t seed, int64_t draw) {
    dropout_seed_ = seed;
    dropout_draw_ = draw;
  }
  static constexpr uint64_t kDropoutStream = uint64_t{1} << 48;

  bool adapted(int site) const { return slots_[static_cast<size_t>(site)].on; }
  // Whether backward(site, ...) overwrites dx rather than adding to it.
  bool dropout_active(int site) const;
  // out (+=) scaling * x' @ A^T @ B^T, out [BT, width] (the site's columns only), x [BT, in];
  // a no-op when the site is not adapted.
  void forward(int site, const Tensor& out, const Tensor& x) const;
  // dA (+=), dB (+=), and dx of the update from dout [BT, width] and the layer input x: dx
  // (+=), or with dropout active dx (=) (a mask cannot be folded into a GEMM's accumulation),
  // and the caller adds the base layer's part after.
  void backward(int site, const Tensor& dx, const Tensor& dout, const Tensor& x) const;
  // The same with dx (+=) in every case, for sites that share their input gradient (a fused
  // projection): dx f32; with dropout active the masked part goes through an f32 scratch.
  void backward_add(int site, const Tensor& dx, const Tensor& dout, const Tensor& x) const;

 private:
  struct Slot {
    bool on = false;
    const ParamInfo* a = nullptr;  // rows of table_
    const ParamInfo* b = nullptr;
    int64_t a_compute = 0, b_compute = 0;  // offsets into compute_ (B padded to the width)
  };
  Tensor input(int site, const Tensor& x) const;
  uint64_t dropout_stream(int site) const;

  Device& device_;
  LoraOptions options_;
  std::vector<LoraSite> sites_;
  std::vector<Slot> slots_;
  std::vector<ParamInfo> table_;
  int64_t count_ = 0, compute_count_ = 0;
  bool padded_ = false;  // some adapted site writes a column range of a wider output
  Tensor params_, compute_, grads_;
  // Scratch: x' A^T, its gradient, x', a padded B's gradient, a fused site's masked dx (f32).
  Tensor u_, du_, x_, dpad_, dxs_;
  uint64_t dropout_seed_ = 0;
  int64_t dropout_draw_ = -1;
};

}  // namespace ct
