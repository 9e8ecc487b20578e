// What every model family (core/model/gpt2.h, core/model/llama.h) holds and does the same way:
// the options, the flat parameter store (master, compute copy, gradients, and LoRA's 16-bit-only
// base), its table and views, upload / download, initialisation from the Philox streams, the
// trainable set for the optimizer with or without LoRA adapters, the LoRA glue of a linear layer,
// and the buffers at the ends of the network (residual stream, logits, losses). A family keeps its
// config, its parameter table, its layers and its forward / backward.
//
// The parameter store: ONE contiguous f32 buffer in table order, weight-decayed rows first
// ([0, decay_count)), then the no-decay rows (norms, biases); gradients in another of the same
// layout. Under a mixed policy (core/amp/precision.h) that buffer is the master the optimizer
// updates and a second one in policy.compute holds the copy matmuls read, refreshed by
// refresh_compute_weights(); gradients are always f32. With LoRA under a mixed policy the frozen
// base is held in 16 bits only (base16()): no f32 master, the compute copy is the model, and the
// no-decay region is widened once into an f32 buffer for the ops that take vectors in f32.
//
// The padded vocabulary: on the device the LM head weight (the tied embedding, or an untied
// head) has padded_vocab() = round_up(V, kVocabAlign) rows, the rows past V zero, so the head's
// matmuls run at an aligned width (GPT-2: 50304 instead of 50257 rows, as llm.c) and produce
// [BT, padded_vocab()] logits, whose padding columns the loss excludes (Device::crossentropy_*
// with valid = V) and whose gradient there is 0, so the zero rows get zero gradients. The zero
// rows sit right after the head's V rows in the flat buffers (the device layout: dev_table(), its
// offsets shifted past the gap); no optimizer touches them (the optimizer walks the table's
// contiguous runs). Everything on the host keeps the real vocabulary: params() and its offsets,
// num_parameters(), download_*/upload_params, and so files, checkpoints and optimizer state by
// name. The embedding lookup reads the first V rows only; logits() shows the first V columns.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/amp/precision.h"
#include "core/device.h"
#include "core/model/lora.h"
#include "core/model/model.h"
#include "core/model/model_util.h"
#include "core/tensor.h"

namespace ct {

// How a model is built, for every family.
struct ModelOptions {
  // Hugging Face --gradient_checkpointing: keep each block's input only, recompute the rest in
  // backward (one extra block forward per layer but the last; bitwise the same gradients).
  bool gradient_checkpointing = false;
  // Fused (flash) attention: only the per-row log-sum-exp is saved, not the (B,NH,T,T)
  // probabilities, and the backward recomputes them (Device::flash_attention_*). false: the
  // unfused ops, which store the probabilities.
  bool fused_attention = true;
  // Which tensors are f32 and which 16-bit (core/amp/precision.h); fp32 by default.
  PrecisionPolicy policy;
  // Low-rank adapters (core/model/lora.h); r = 0 (the default) trains the whole model. An empty
  // target_modules takes the family's default.
  LoraOptions lora;
};

class ModelBase : public Model {
 public:
  ModelBase(const ModelBase&) = delete;
  ModelBase& operator=(const ModelBase&) = delete;

  const ModelOptions& options() const { return options_; }
  Device& device() const override { return device_; }
  int max_batch() const override { return max_b_; }
  int max_seq() const override { return max_t_; }

  // Element j of table tensor k = init_stddev(row k) * Philox(seed, k).normal(j) for the
  // weight-decayed rows, init_fill(row) for the others. With LoRA, adapter k of lora_params()
  // (in table order) draws from Philox stream params().size() + k: every lora_A uniform in
  // +-1/sqrt(in) (PEFT's kaiming_uniform(a=sqrt(5)) bound), every lora_B zero, so the adapted
  // model starts as the base. Also zeroes the gradients.
  void init(uint64_t seed) override;

  // Views valid after forward: logits [B,T,V] (of dtype policy.activations) and per-position
  // losses [B,T] (f32) of the last call. With a padded vocabulary logits() copies the first V
  // columns of each row into a buffer of its own (kWorkspace, row by row: for tests and tools);
  // logits_at() is a view of one position's V logits, no copy.
  Tensor logits() const override;
  Tensor logits_at(int b, int t) const override;
  Tensor losses() const override;
  // The forward of every family: the embedding, the blocks, the LM head on the final norm's
  // rows, the loss with targets (the family's embed, block_forward and lm_head, below).
  Tensor forward(const Tensor& tokens, const Tensor* targets, int B, int T) override;
  // The same for tokens [1,T] at positions [pos, pos+T) with the key/value cache
  // (kv_cache.cpp): the blocks on the T new rows, the head on the last one.
  Tensor forward_cached(const Tensor& tokens, int pos, int T) override;
  // The family's forward with the loss's gradient written over the logits in the same pass
  // (loss_forward), then its backward, which starts from them (loss_backward).
  Tensor forward_backward(const Tensor& tokens, const Tensor& targets, int B, int T,
                          float dloss_scale = 1.0f) override;
  // trainable grads (=) 0.
  void zero_grad() override;
  // The cache of forward_cached(): every layer's qkv rows [positions, W] of policy.activations,
  // with the attention's output and log-sum-exp over them (kActivations); kept until released
  // or a larger reserve.
  void reserve_kv_cache(int positions) override;
  void release_kv_cache() override { kv_ = KvCache(); }
  // backward() reports the rows of each of its sections (gradient_stage()) once they are done.
  void set_gradients_ready(GradientsReady ready) override;

  // Parameters and gradients. params(): offsets into the host vectors (download_params());
  // dev_table(): the same rows at their offsets in the device buffers (params_flat(),
  // grads_flat(), compute_params_flat()), which hold the padding rows of the head after it.
  const std::vector<ParamInfo>& params() const override { return table_; }
  const std::vector<ParamInfo>& dev_table() const { return dev_table_; }
  const ParamInfo& param_info(const std::string& name) const;  // dev_table()'s; kInvalidArgument
  // The real and the padded vocabulary (rows of the LM head on the device).
  int64_t vocab() const { return vocab_; }
  int64_t padded_vocab() const { return padded_vocab_; }
  // Elements of the device flat buffers: num_parameters() plus the head's padding rows.
  int64_t flat_size() const { return flat_size_; }
  // [flat_size] f32 master; undefined when base16() (the base exists in 16 bits only).
  Tensor params_flat() const { return params_; }
  // LoRA under a 16-bit policy: the frozen base is held in policy.compute only.
  bool base16() const { return options_.lora.enabled() && options_.policy.mixed(); }
  // The copy matmuls read, [flat_size] of policy.compute (params_flat() itself for fp32).
  Tensor compute_params_flat() const { return compute_; }
  // compute copy (=) master, rounded to nearest even (with LoRA: the adapters' compute copy; the
  // frozen base does not change). Call after every change of the master weights made outside
  // this class (the optimizer step); init() and upload_params() call it. A no-op for fp32.
  void refresh_compute_weights() override;
  Tensor grads_flat() const;  // [flat_size]; kInvalidArgument without gradients
  // View with the table shape of what the ops read as the parameter: the f32 master, or when
  // base16() the 16-bit copy (matrices, embeddings) / the widened f32 vectors (no-decay region).
  Tensor param(const std::string& name) const;
  Tensor grad(const std::string& name) const;
  int64_t num_parameters() const override { return num_params_; }
  // Elements of the weight-decayed region [0, decay_count) of the device flat buffers (the head's
  // padding rows included).
  int64_t decay_count() const { return dev_decay_count_; }
  // The two optimizer groups of the full model: [0, decay_count) and [decay_count, flat_size)
  // of the device flat buffers.
  Tensor params_decay() const;
  Tensor params_no_decay() const;
  Tensor grads_decay() const;
  Tensor grads_no_decay() const;

  // What the optimizer updates: every parameter, or with LoRA the adapters only.
  LoraAdapters* adapters() const override { return lora_.get(); }
  const std::vector<ParamInfo>& trainable_params() const override {
    return lora() ? lora_->table() : dev_table_;
  }
  Tensor trainable_flat() const override { return lora() ? lora_->params() : params_; }
  Tensor trainable_grads() const override { return lora() ? lora_->grads() : grads_flat(); }
  Tensor trainable_compute() const override {
    return options_.policy.mixed() && !lora() ? compute_ : Tensor{};
  }
  int64_t num_trainable() const override { return lora() ? lora_->count() : num_params_; }

  // Host copies for checkpoints and tests (these wait for the device), [num_parameters] in the
  // order of params(): the head's padding rows are not part of them.
  std::vector<float> download_params() const override;
  std::vector<float> download_grads() const;
  std::map<std::string, std::vector<float>> download_param_map() const override;
  void upload_params(const std::vector<float>& flat);
  // Every table name must be present with the right element count; unknown names are errors.
  void upload_params(const std::map<std::string, std::vector<float>>& named) override;

  // Bytes of kWeights the parameter store of `table` takes under `options` (f32 master, 16-bit
  // copy, or the 16-bit base plus its widened no-decay region), adapters not included;
  // `padding` elements of the head's zero rows (in the decay region) included.
  static int64_t param_store_bytes(const std::vector<ParamInfo>& table, const ModelOptions& options,
                                   int64_t padding = 0);
  // Elements of the zero rows that pad a head of V rows of `width` to padded_vocab_size(V).
  static int64_t head_padding(int64_t V, int64_t width) {
    return (padded_vocab_size(V) - V) * width;
  }

 protected:
  // `family` names the model in errors ("GPT-2", "Llama"); a family has `sites_per_layer` LoRA
  // sites per block, site l * sites_per_layer + m being linear layer m of block l.
  ModelBase(Device& device, const ModelOptions& options, const char* family, int sites_per_layer);

  // Construction, after the family has validated its config and resolved options_.lora: the
  // table (checked against the config's count), the parameter buffers and, with LoRA, the
  // adapters on `sites` (the base frozen: gradients for the adapters only). `head` names the
  // table row of the LM head ([V, width], weight-decayed), which gets padded_vocab_size(V) rows
  // on the device.
  void build_param_store(std::vector<ParamInfo> table, int64_t expected_count,
                         std::vector<LoraSite> sites, int layers, int64_t width, bool with_grads,
                         const std::string& head);
  // Error(kUnsupported) naming the op when the device lacks one of `needed` in the policy's
  // dtype, or (base16()) the embedding op with 16-bit tables.
  void check_policy(std::span<const std::pair<OpKind, const char*>> needed) const;
  // The initial value scheme of init(): the standard deviation of a weight-decayed row, the
  // constant of a no-decay row.
  virtual float init_stddev(const ParamInfo& p) const = 0;
  virtual float init_fill(const ParamInfo& p) const = 0;

  Tensor table_view(const Tensor& flat, const std::string& name) const;
  // The LM head [padded_vocab, width] of a device flat buffer: its V rows and the zero rows.
  Tensor head_view(const Tensor& flat) const;
  // The f32 vector at `offset` (a no-decay row or adjacent rows): master, or the widened copy.
  Tensor vector_view(int64_t offset, const Shape& shape) const;
  // The family's: after which section of backward() the gradient of the trainable row `name` (a
  // parameter or a LoRA adapter) is final: block l's (l), the LM head's and final norm's
  // (the number of blocks: they come first), or kFinalAtEnd (the embeddings, which the first
  // and the last section both write).
  static constexpr int kFinalAtEnd = -1;
  virtual int gradient_stage(const std::string& name) const = 0;
  // `name`'s block number when it starts with `prefix` and a number ("h.", "h.3.ln_1.weight":
  // 3), else -1.
  static int block_in_name(const std::string& name, const std::string& prefix);
  // backward(), when section `stage` is done: the rows whose gradient_stage() it is, to the
  // listener of set_gradients_ready() (no-op without one).
  void gradients_final(int stage) const;

  // Whether backward has anything to compute: the full gradients or trainable adapters.
  bool trains() const { return grads_.defined() || (lora() && lora_->trains()); }

  // The network's sizes from the family's config: the blocks forward() runs, what the key/value
  // cache holds per position, and the limit of T, named as the family's config file names it.
  struct NetShape {
    int layers = 0;
    int64_t width = 0;  // the qkv row: q, then k and v of every kv head
    int64_t C = 0, n_head = 0, n_kv_head = 0;
    int block_size = 0;
    const char* block_size_name = "block_size";
  };
  virtual NetShape net_shape() const = 0;

  // The family's parts of forward() and forward_cached(), which model_base.cpp runs in order:
  // embed writes residuals_[0] (1 or B, T, C) f32 for tokens at positions [pos, pos + T);
  // block_forward runs block l (kv_pos >= 0: forward_cached's rows; the families' headers say
  // what it fills); the last block leaves lnf_ for lm_head(), the head [Vp, C] of the compute
  // copy with its zero rows.
  virtual void embed(const Tensor& x, const Tensor& tokens, int pos) = 0;
  virtual void block_forward(int l, int B, int T, bool recompute, int kv_pos) = 0;
  virtual Tensor lm_head() const = 0;
  // A block's attention, atty (B,T,C) of qkv (B,T,W) with the family's heads: fused (flash; the
  // rows' log-sum-exp saved in lse (B,NH,T) f32), unfused (the probabilities saved in att
  // (B,NH,T,T)), or with kv_pos >= 0 the T new rows against layer l's key/value cache (whose
  // output it returns instead of atty).
  Tensor block_attention(int l, const Tensor& qkv, const Tensor& atty, const Tensor& lse,
                         const Tensor& att, int kv_pos);
  // forward_cached's steps shared by the families: kv_begin checks the call (Error
  // kInvalidArgument naming the limit) and makes activations of T rows; kv_rows is layer l's
  // cache rows [T, W] of positions [pos, pos + T), where the family writes that layer's qkv
  // (rotated, for Llama); kv_attention then returns the attention output (1,T,C) of those positions
  // over the cached rows [0, pos + T) (Device::flash_attention_forward of the last T rows);
  // kv_logits runs the LM head
  // `head` on the last of the T rows of lnf (T,C) and returns their logits [V].
  void kv_begin(const Tensor& tokens, int pos, int T);
  Tensor kv_rows(int l, int pos, int T) const;
  Tensor kv_attention(int l, int pos, int T);
  Tensor kv_logits(const Tensor& tokens, const Tensor& lnf, const Tensor& head, int T);

  // The network's two ends, for allocate_activations: drops the old buffers (so the peak holds
  // one set), then allocates the residual stream (layers + 1 of (B,T,C) f32), logits (BT,Vp) h,
  // losses (BT) f32, loss [1]; with `trains` the backward's dresidual (BT,C) f32 and, under a
  // 16-bit policy, its h copy.
  void release_activations();
  void allocate_residuals(int layers, int64_t BT, int64_t C);
  void allocate_head(int64_t BT);
  void allocate_dresidual(int64_t BT, int64_t C);

  // The loss of forward: losses (BT) f32 = -log softmax(logits[:, :V])[targets]; loss [1] f32 =
  // their mean. logits (BT,Vp). Returns loss_. Inside forward_backward it also writes the
  // logits' gradient over them (loss_backward's, in the same pass).
  Tensor loss_forward(const Tensor& logits, int64_t BT);
  // The start of backward: checks that there is something to train and a forward with targets,
  // then dlogits (BT,Vp) h = dloss_scale * (softmax(logits[:, :V]) - onehot(targets)) / BT (0 in
  // the padding columns), in place over the logits, which it returns (already there when
  // forward_backward's forward wrote them).
  Tensor loss_backward(float dloss_scale);
  // Host vectors between the layout of params() and that of the device buffers (the head's
  // padding rows inserted as zeros, or dropped).
  std::vector<float> to_device_layout(const std::vector<float>& host) const;
  std::vector<float> to_host_layout(std::vector<float> dev) const;

  // LoRA glue of linear layers: out (+=) the adapters' updates of sites [first, first + n) of
  // block l (no-op without LoRA).
  void lora_forward(int l, int first, int n, const Tensor& out, const Tensor& x) const;
  // Whether site m of layer l carries a LoRA adapter (a fused epilogue then cannot take its
  // product: the adapter's update is added between the product and the activation).
  bool lora_adapted(int l, int m) const {
    return lora_ && lora_->adapted(l * sites_per_layer_ + m);
  }
  // dinp (=) dout @ w (transpose_w: w^T) plus the adapter's part of site m of block l; an adapter
  // with dropout active writes dinp (=) first and the base's part is added after it. The base's
  // weight gradients are the caller's (none when lora()).
  void linear_backward_input(int l, int m, const Tensor& dinp, const Tensor& dout,
                             const Tensor& inp, const Tensor& w, bool transpose_w) const;

  Device& device_;
  ModelOptions options_;
  const char* family_;
  int sites_per_layer_;
  std::vector<ParamInfo> table_;         // host layout (params())
  std::vector<ParamInfo> dev_table_;     // device layout: offsets past the head shifted by pad_
  std::map<std::string, size_t> index_;  // name -> row of table_
  int64_t num_params_ = 0;
  int64_t decay_count_ = 0;  // host layout
  int64_t vocab_ = 0, padded_vocab_ = 0;
  size_t head_ = 0;              // row of the LM head in table_
  int64_t pad_ = 0;              // elements of the head's zero rows
  int64_t pad_at_ = 0;           // host offset where they are inserted: the end of the head
  int64_t flat_size_ = 0;        // num_params_ + pad_
  int64_t dev_decay_count_ = 0;  // decay_count_ + pad_
  Tensor params_, grads_;
  Tensor small_;    // base16(): f32 [num_params - decay_count], the no-decay region widened
  Tensor compute_;  // policy.compute copy of params_ (params_ itself for fp32)
  std::unique_ptr<LoraAdapters> lora_;  // null without LoRA

  // Activations, sized for max_b_ x max_t_; views of the current (B,T) are taken per call.
  int max_b_ = 0, max_t_ = 0;
  // The residual stream, f32 (B,T,C): [0] the embedding output, [l + 1] block l's output.
  std::vector<Tensor> residuals_;
  Tensor lnf_;                     // (B,T,C) h: the final norm's output, the LM head's input
  Tensor logits_;                  // (B,T,Vp) h
  mutable Tensor logits_compact_;  // logits() with a padded vocabulary: (B,T,V) h
  Tensor losses_;                  // (B,T)
  Tensor loss_;                    // [1]
  // Backward scratch: the gradient flowing along the residual stream (B,T,C) f32, and its copy
  // as a matmul input (B,T,C) h (16-bit policies only).
  Tensor dresidual_, dresidual_h_;

  // set_gradients_ready(): the listener, and per backward section the ranges of
  // trainable_grads() (offset, count) it finishes, adjacent rows merged.
  GradientsReady gradients_ready_;
  std::map<int, std::vector<std::pair<int64_t, int64_t>>> stage_ranges_;

  // forward_cached's cache (reserve_kv_cache): `filled` positions of `capacity` hold rows.
  struct KvCache {
    int capacity = 0, filled = 0;
    std::vector<Tensor> qkv;  // per layer [capacity * W]
    Tensor out, lse;          // the new rows' attention: [capacity * C] h, [n_head * capacity] f32
  };
  KvCache kv_;

  // The last forward's batch, kept for backward.
  model_util::ForwardBatch batch_;
  // forward_backward: the dloss_scale its forward's loss_forward fuses with, and whether the
  // logits hold their gradient (written by loss_forward, not yet consumed by loss_backward).
  std::optional<float> fused_dloss_scale_;
  bool dlogits_ready_ = false;
};

}  // namespace ct
