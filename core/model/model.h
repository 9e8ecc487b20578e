// The model interface: what the trainer, evaluation, generation, checkpoints and the optimizers
// use, implemented by GPT2 (core/model/gpt2.h) and Llama (core/model/llama.h), so each of those
// exists once for every model family.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/tensor.h"

namespace ct {

// One row of a model's parameter table.
struct ParamInfo {
  std::string name;  // Hugging Face's name: "wte.weight", "model.layers.3.mlp.up_proj.weight"
  Shape shape;
  int64_t offset = 0;  // in elements, into the flat parameter / gradient buffers
  int64_t numel = 0;
  bool decay = false;  // matmul weights and embeddings: yes; biases and norms: no
};

class LoraAdapters;  // core/model/lora.h

// The LM head's rows on a device: the vocabulary rounded up to a multiple of kVocabAlign, so its
// matmuls run at an aligned width (core/model/model_base.h); files keep the real vocabulary.
inline constexpr int64_t kVocabAlign = 128;
inline int64_t padded_vocab_size(int64_t V) {
  return (V + kVocabAlign - 1) / kVocabAlign * kVocabAlign;
}

struct SampleOptions {
  float temperature = 1.0f;  // <= 0: greedy (argmax)
  int top_k = 0;             // > 0: sample among the k most likely tokens only
  uint64_t seed = 0;         // Philox seed; draw i of a call uses element i of stream 0
  // Keys and values cached between tokens (Model::forward_cached); false: every token runs
  // forward over the whole window again (the same tokens up to rounding in the last bits).
  bool kv_cache = true;
};

// Where generate() spent its time (wall clock; each token ends with its logits read back, so the
// device has finished it): prefill_s up to the first new token (time to first token), decode_s
// the others.
struct GenerateStats {
  int prompt_tokens = 0, new_tokens = 0;
  double prefill_s = 0.0, decode_s = 0.0;
};

class Model {
 public:
  virtual ~Model() = default;

  virtual Device& device() const = 0;
  // config.json's model_type: "gpt2", "llama", "mistral", "qwen2".
  virtual std::string model_type() const = 0;
  virtual int block_size() const = 0;  // the longest sequence
  virtual int vocab_size() const = 0;
  virtual nlohmann::json hf_config() const = 0;  // Hugging Face config.json
  virtual std::string config_str() const = 0;    // one line for logs
  // "" when config.json `saved` describes this model's architecture (special token ids aside),
  // else why not, naming both.
  virtual std::string config_mismatch(const nlohmann::json& saved) const = 0;
  // The parameter an untied "lm_head.weight" in a checkpoint must equal (the tied head's
  // embedding), or "" when the head is a parameter of its own or there is none to check.
  virtual std::string tied_head_source() const = 0;
  // Checkpoint tensors that are buffers, not parameters, and are ignored on load
  // (GPT-2's attn.bias / attn.masked_bias, Llama's rotary_emb.inv_freq).
  virtual bool is_ignored_buffer(const std::string& name) const = 0;

  // Initial weights from the Philox streams (each family's scheme); zeroes the gradients.
  virtual void init(uint64_t seed) = 0;
  virtual void allocate_activations(int max_batch, int max_seq) = 0;
  virtual int max_batch() const = 0;
  virtual int max_seq() const = 0;
  // tokens, targets [B,T] i32; the mean loss [1] f32 when targets are given. backward adds
  // dloss_scale * d(mean loss) into the trainable gradients.
  virtual Tensor forward(const Tensor& tokens, const Tensor* targets, int B, int T) = 0;
  virtual void backward(float dloss_scale = 1.0f) = 0;
  // Data parallel's overlap (dist::GradientAverager): while `ready` is set, backward() calls
  // ready(offset, count) as soon as the ops it has enqueued leave elements [offset, offset +
  // count) of trainable_grads() final for this pass, each element at most once per pass (the
  // later layers first). Elements it never reports are final when backward() returns. An empty
  // function (the default) reports nothing.
  using GradientsReady = std::function<void(int64_t offset, int64_t count)>;
  virtual void set_gradients_ready(GradientsReady ready) { (void)ready; }

  // A training pass: forward(tokens, &targets, B, T) then backward(dloss_scale), the same
  // results and state after it (within the precision table's tolerances), with the loss and its
  // gradient over the logits computed in one pass (Device::crossentropy_forward_backward)
  // instead of two ops. Returns the mean loss [1] f32.
  virtual Tensor forward_backward(const Tensor& tokens, const Tensor& targets, int B, int T,
                                  float dloss_scale = 1.0f) = 0;
  virtual void zero_grad() = 0;
  virtual Tensor logits() const = 0;                 // [B,T,V] of the last forward
  virtual Tensor logits_at(int b, int t) const = 0;  // [V] of position (b, t), a view
  virtual Tensor losses() const = 0;                 // [B,T] f32

  // Every parameter, in the flat order of download_params() (host vectors, files).
  virtual const std::vector<ParamInfo>& params() const = 0;
  virtual int64_t num_parameters() const = 0;
  // compute copy (=) master after the optimizer changed the master weights (no-op in fp32;
  // not needed after an optimizer whose updates_compute_copy() is true).
  virtual void refresh_compute_weights() = 0;
  virtual std::vector<float> download_params() const = 0;
  virtual std::map<std::string, std::vector<float>> download_param_map() const = 0;
  virtual void upload_params(const std::map<std::string, std::vector<float>>& named) = 0;

  // What the optimizer updates: every parameter, or with LoRA the adapters only. The table's
  // offsets are into trainable_flat() / trainable_grads(), which may hold elements no row covers
  // (the padding rows of the LM head): an optimizer updates the rows, and leaves those alone.
  // num_trainable() counts the rows' elements.
  virtual const std::vector<ParamInfo>& trainable_params() const = 0;
  virtual Tensor trainable_flat() const = 0;
  virtual Tensor trainable_grads() const = 0;
  // The 16-bit copy of trainable_flat() that the products read, element for element at the same
  // offsets, where the model keeps one; undefined otherwise (fp32; LoRA, whose adapters' copy is
  // laid out otherwise). An optimizer that rounds each parameter it updates into it (AdamW,
  // through adamw_groups' param16) leaves refresh_compute_weights() nothing to do.
  virtual Tensor trainable_compute() const { return Tensor{}; }
  virtual int64_t num_trainable() const = 0;
  // Low-rank adapters (core/model/lora.h): null when every parameter trains. With them the
  // base is frozen and trainable_*() are the adapters'.
  virtual LoraAdapters* adapters() const { return nullptr; }
  bool lora() const { return adapters() != nullptr; }
  // The adapter table, its host copies (upload checks every name and size) and the dropout
  // masks' draw for the passes that follow (LoraAdapters::set_dropout_draw; no-op without LoRA).
  const std::vector<ParamInfo>& lora_params() const;
  std::map<std::string, std::vector<float>> download_lora_map() const;
  void upload_lora(const std::map<std::string, std::vector<float>>& named);
  void set_lora_dropout_draw(uint64_t seed, int64_t draw);
  // How PEFT names this family's adapters: the prefix before a table name in
  // adapter_model.safetensors, and adapter_config.json's fan_in_fan_out (weights stored [in,
  // out]).
  virtual std::string peft_prefix() const = 0;
  virtual bool peft_fan_in_fan_out() const = 0;

  // Samples n tokens after `prompt` (non-empty) and returns them (prompt excluded), reading only
  // the last position's logits back. With options.kv_cache the prompt runs once through
  // forward_cached() and each new token alone after it, until the context passes block_size;
  // from there on (and without the cache) each token runs forward on the last block_size tokens.
  std::vector<int32_t> generate(const std::vector<int32_t>& prompt, int n,
                                const SampleOptions& options = {}, GenerateStats* stats = nullptr);

  // Sampling's incremental forward, with a cache of keys and values. tokens [1,T] are positions
  // [pos, pos + T) of one sequence whose positions [0, pos) earlier calls gave (pos 0 starts a
  // sequence). The cache keeps each layer's q, k, v rows of the positions it has seen, so a new
  // token's embedding, norms, products, attention and MLP run on its own row only, its
  // attention reading the cached keys and values [0, pos + T) (flash_attention_forward of the
  // last T rows). The LM head runs on the last position only. reserve_kv_cache(n) first, with pos +
  // T <= n <= block_size. Returns the logits [V] of position pos + T - 1, a view valid until the
  // next forward, which is also what logits() shows ([1,1,V]); there is nothing to backward from.
  virtual void reserve_kv_cache(int positions) = 0;
  virtual Tensor forward_cached(const Tensor& tokens, int pos, int T) = 0;
  virtual void release_kv_cache() = 0;
};

}  // namespace ct
