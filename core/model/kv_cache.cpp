// The key/value cache of sampling (Model::forward_cached), the same for every family:
// forward_cached runs the family's ordinary blocks on the new rows only, each with its qkv
// product written into the cache (kv_rows) and its attention read from it (kv_attention).
#include <algorithm>
#include <string>

#include "core/error.h"
#include "core/model/model_base.h"

namespace ct {

void ModelBase::reserve_kv_cache(int positions) {
  const NetShape s = net_shape();
  CT_REQUIRE(positions >= 1 && positions <= s.block_size,
             "key/value cache of " + std::to_string(positions) + " positions outside [1, " +
                 std::to_string(s.block_size) + "] (the model's context length)");
  if (kv_.capacity >= positions) return;
  kv_ = KvCache();  // the old buffers go first: the peak holds one cache
  const DType h = options_.policy.activations;
  for (int l = 0; l < s.layers; ++l)
    kv_.qkv.push_back(device_.empty({positions * s.width}, h, MemCategory::kActivations));
  kv_.out = device_.empty({positions * s.C}, h, MemCategory::kActivations);
  kv_.lse = device_.empty({s.n_head * positions}, DType::f32, MemCategory::kActivations);
  kv_.capacity = positions;
}

void ModelBase::kv_begin(const Tensor& tokens, int pos, int T) {
  CT_REQUIRE(kv_.capacity > 0, "forward_cached: no key/value cache (reserve_kv_cache first)");
  CT_REQUIRE(T >= 1 && pos >= 0, "forward_cached: positions [" + std::to_string(pos) + ", " +
                                     std::to_string(pos + T) + ") are not a range");
  CT_REQUIRE(pos <= kv_.filled, "forward_cached: position " + std::to_string(pos) +
                                    " follows only " + std::to_string(kv_.filled) +
                                    " cached positions (a sequence starts at position 0)");
  CT_REQUIRE(pos + T <= kv_.capacity, "forward_cached: positions up to " + std::to_string(pos + T) +
                                          " past the cache's " + std::to_string(kv_.capacity) +
                                          " (reserve_kv_cache)");
  CT_REQUIRE(tokens.dtype == DType::i32 && tokens.numel() == T,
             "forward_cached: expected tokens [1," + std::to_string(T) + "] i32, got " +
                 tokens.describe());
  if (max_b_ < 1 || T > max_t_) allocate_activations(std::max(1, max_b_), std::max(T, max_t_));
  // Rows [pos, filled) are about to be overwritten; nothing after them is valid any more.
  kv_.filled = pos;
}

Tensor ModelBase::kv_rows(int l, int pos, int T) const {
  const int64_t W = net_shape().width;
  return kv_.qkv[static_cast<size_t>(l)].slice_flat(pos * W, {T, W});
}

Tensor ModelBase::forward_cached(const Tensor& tokens, int pos, int T) {
  kv_begin(tokens, pos, T);
  const int64_t C = net_shape().C;
  // residuals[0] (1,T,C) f32 = the embedding of the T tokens at positions [pos, pos+T)
  embed(residuals_[0].slice_flat(0, {1, T, C}), tokens.reshape({1, T}), pos);
  for (int l = 0; l < net_shape().layers; ++l) block_forward(l, 1, T, /*recompute=*/false, pos);
  // logits [Vp] h = lnf[T-1] @ head^T
  return kv_logits(tokens, lnf_.slice_flat(0, {T, C}), lm_head(), T);
}

Tensor ModelBase::kv_attention(int l, int pos, int T) {
  const NetShape s = net_shape();
  const int64_t n = int64_t{pos} + T;
  Tensor all = kv_.qkv[static_cast<size_t>(l)].slice_flat(0, {1, n, s.width});
  // the last T rows only: the new positions' queries against every cached key
  Tensor out = kv_.out.slice_flat(0, {1, T, s.C});
  device_.flash_attention_forward(out, kv_.lse.slice_flat(0, {1, s.n_head, T}), all,
                                  static_cast<int>(s.n_head), static_cast<int>(s.n_kv_head));
  if (l == s.layers - 1) kv_.filled = static_cast<int>(n);
  return out;
}

Tensor ModelBase::kv_logits(const Tensor& tokens, const Tensor& lnf, const Tensor& head, int T) {
  const int64_t C = net_shape().C;
  Tensor logits = logits_.slice_flat(0, {1, padded_vocab_});
  device_.matmul(logits, lnf.slice_flat((T - 1) * C, {1, C}), head, false, true);
  // logits() and logits_at(0, 0) show this row; no targets, so no backward.
  batch_.begin(tokens.slice_flat(T - 1, {1, 1}), nullptr, 1, 1);
  return logits_.slice_flat(0, {vocab_});
}

}  // namespace ct
