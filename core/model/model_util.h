// Pieces every model family shares (core/model/gpt2*.cpp, llama*.cpp): the parameter table
// builder, the checks of a batch and of a precision policy, named <-> flat parameter copies.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/amp/precision.h"
#include "core/device.h"
#include "core/model/model.h"

namespace ct::model_util {

// Appends rows in flat-buffer order: each one's offset is the sum of the numels before it.
class TableBuilder {
 public:
  void add(const std::string& name, const Shape& shape, bool decay) {
    ParamInfo p;
    p.name = name;
    p.shape = shape;
    p.offset = offset_;
    p.numel = shape.numel();
    p.decay = decay;
    offset_ += p.numel;
    table_.push_back(std::move(p));
  }
  std::vector<ParamInfo> take() { return std::move(table_); }

 private:
  std::vector<ParamInfo> table_;
  int64_t offset_ = 0;
};

// tokens / targets: a contiguous i32 tensor of B x T elements, else Error naming `what`.
void check_token_batch(const Tensor& t, int B, int T, const char* what);

// The batch of the last forward(), which backward(), logits() and losses() read; one for every
// family. Model::forward checks its arguments with check(), grows its activations, then begin().
class ForwardBatch {
 public:
  // B >= 1, 1 <= T <= block_size (`limit` names it: "block_size", "max_position_embeddings"),
  // tokens and targets (if any) B x T i32; else Error(kInvalidArgument).
  static void check(const Tensor& tokens, const Tensor* targets, int B, int T, int block_size,
                    const char* limit);
  void begin(const Tensor& tokens, const Tensor* targets, int B, int T);
  void reset() { *this = ForwardBatch(); }  // nothing kept (the activations were reallocated)
  int B() const { return b_; }
  int T() const { return t_; }
  int64_t BT() const { return int64_t{b_} * t_; }
  const Tensor& tokens() const { return tokens_; }    // [B,T]
  const Tensor& targets() const { return targets_; }  // [B*T]
  // Error unless a forward with targets precedes (and no backward has consumed its logits).
  void require_targets(const char* what) const;
  // backward() wrote dlogits over the logits: a second backward needs a new forward.
  void consume_targets() { have_targets_ = false; }
  // The views of the last forward: logits [B,T,V] of `buffer`, losses [B,T] of `buffer`.
  Tensor logits(const Tensor& buffer, int64_t V) const;
  Tensor losses(const Tensor& buffer) const;

 private:
  int b_ = 0, t_ = 0;
  Tensor tokens_, targets_;
  bool have_targets_ = false;
};

// The policy's 16-bit dtype (f32 for fp32) after checking that compute and activations use it,
// and that `device` has every op of `needed` in it (Error(kUnsupported) naming the op).
DType check_policy(const Device& device, const PrecisionPolicy& policy, const char* model,
                   std::span<const std::pair<OpKind, const char*>> needed);

// The flat buffer in table order from one vector per name: every table name present with its
// element count, no unknown names (Error(kInvalidArgument) naming the tensor).
std::vector<float> flatten(const std::vector<ParamInfo>& table, int64_t total,
                           const std::map<std::string, std::vector<float>>& named);
// The reverse: one vector per table row.
std::map<std::string, std::vector<float>> split(const std::vector<ParamInfo>& table,
                                                const std::vector<float>& flat);

// A base held in 16 bits only (LoRA under a mixed policy): `flat` rounded to nearest even on the
// host into dst16 (f16 or bf16), and dst16 widened (exactly) on the host.
void upload_rounded(Device& device, const Tensor& dst16, const std::vector<float>& flat);
std::vector<float> download_widened(Device& device, const Tensor& src16);

}  // namespace ct::model_util
