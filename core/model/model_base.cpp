// ModelBase: the parameter store, initialisation, the trainable set, the host helpers, the LoRA
// glue and the buffers at the network's ends, once for every family.
#include "core/model/model_base.h"

#include <algorithm>

#include "core/error.h"
#include "core/philox.h"

namespace ct {

// =============================================================================================
// Construction and parameter access

ModelBase::ModelBase(Device& device, const ModelOptions& options, const char* family,
                     int sites_per_layer)
    : device_(device), options_(options), family_(family), sites_per_layer_(sites_per_layer) {}

void ModelBase::build_param_store(std::vector<ParamInfo> table, int64_t expected_count,
                                  std::vector<LoraSite> sites, int layers, int64_t width,
                                  bool with_grads, const std::string& head) {
  table_ = std::move(table);
  for (size_t i = 0; i < table_.size(); ++i) {
    index_[table_[i].name] = i;
    num_params_ += table_[i].numel;
    if (table_[i].decay) decay_count_ += table_[i].numel;
  }
  CT_CHECK(num_params_ == expected_count, "parameter table disagrees with config");
  // The head's zero rows: inserted after its V rows in the device buffers.
  head_ = index_.at(head);
  const ParamInfo& h = table_[head_];
  CT_CHECK(h.shape.ndim == 2 && h.shape[1] == width && h.decay, "the LM head must be [V, width]");
  vocab_ = h.shape[0];
  padded_vocab_ = padded_vocab_size(vocab_);
  pad_ = head_padding(vocab_, width);
  pad_at_ = h.offset + h.numel;
  flat_size_ = num_params_ + pad_;
  dev_decay_count_ = decay_count_ + pad_;
  dev_table_ = table_;
  for (ParamInfo& p : dev_table_)
    if (p.offset >= pad_at_) p.offset += pad_;
  if (!base16()) params_ = device_.empty({flat_size_}, DType::f32, MemCategory::kWeights);
  compute_ = options_.policy.mixed()
                 ? device_.empty({flat_size_}, options_.policy.compute, MemCategory::kWeights)
                 : params_;
  if (base16())
    small_ = device_.empty({flat_size_ - dev_decay_count_}, DType::f32, MemCategory::kWeights);
  if (options_.lora.enabled())  // the base frozen: gradients (and optimizer state) for adapters
    lora_ = std::make_unique<LoraAdapters>(device_, options_.lora, std::move(sites), layers, width,
                                           options_.policy.compute, with_grads, family_);
  else if (with_grads)
    grads_ = device_.empty({flat_size_}, DType::f32, MemCategory::kGrads);
  // The zero rows are zero from here on: upload_params() writes zeros there, gradients there
  // are 0 (the loss's dlogits of the padding columns), and no optimizer updates them.
  if (params_.defined()) device_.fill(params_, 0.0f);
  if (compute_.defined() && compute_.buffer != params_.buffer) device_.fill(compute_, 0.0f);
  if (grads_.defined()) device_.fill(grads_, 0.0f);
}

void ModelBase::check_policy(std::span<const std::pair<OpKind, const char*>> needed) const {
  const PrecisionPolicy& pp = options_.policy;
  const DType want = model_util::check_policy(device_, pp, family_, needed);
  if (base16() && !device_.supports(OpKind::kEmbedding, want))
    fail(ErrorKind::kUnsupported, "--" + pp.name() + " with LoRA: device " + device_.info().id() +
                                      " has no embedding op with " + dtype_name(want) +
                                      " tables (the frozen base is held in 16 bits)");
}

int64_t ModelBase::param_store_bytes(const std::vector<ParamInfo>& table,
                                     const ModelOptions& options, int64_t padding) {
  int64_t n = padding, no_decay = 0;
  for (const ParamInfo& p : table) {
    n += p.numel;
    if (!p.decay) no_decay += p.numel;
  }
  if (!options.policy.mixed()) return n * 4;
  const int64_t h = static_cast<int64_t>(dtype_size(options.policy.compute));
  if (!options.lora.enabled()) return n * (4 + h);
  return n * h + no_decay * 4;  // base16(): the base in 16 bits, the no-decay region widened
}

void ModelBase::refresh_compute_weights() {
  if (lora())
    lora_->refresh_compute();  // the frozen base does not change
  else if (options_.policy.mixed())
    device_.copy(compute_, params_);
}

const ParamInfo& ModelBase::param_info(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end())
    fail(ErrorKind::kInvalidArgument,
         std::string(family_) + " has no parameter named '" + name + "'");
  return dev_table_[it->second];
}

Tensor ModelBase::table_view(const Tensor& flat, const std::string& name) const {
  const ParamInfo& p = param_info(name);
  return flat.slice_flat(p.offset, p.shape);
}

Tensor ModelBase::head_view(const Tensor& flat) const {
  const ParamInfo& p = dev_table_[head_];
  return flat.slice_flat(p.offset, {padded_vocab_, p.shape[1]});
}

std::vector<float> ModelBase::to_device_layout(const std::vector<float>& host) const {
  if (pad_ == 0) return host;
  std::vector<float> dev(static_cast<size_t>(flat_size_), 0.0f);
  std::copy(host.begin(), host.begin() + pad_at_, dev.begin());
  std::copy(host.begin() + pad_at_, host.end(), dev.begin() + pad_at_ + pad_);
  return dev;
}

std::vector<float> ModelBase::to_host_layout(std::vector<float> dev) const {
  if (pad_ != 0) dev.erase(dev.begin() + pad_at_, dev.begin() + pad_at_ + pad_);
  return dev;
}

Tensor ModelBase::vector_view(int64_t offset, const Shape& shape) const {
  return base16() ? small_.slice_flat(offset - dev_decay_count_, shape)
                  : params_.slice_flat(offset, shape);
}

Tensor ModelBase::grads_flat() const {
  if (!grads_.defined())
    fail(ErrorKind::kInvalidArgument,
         "this " + std::string(family_) + " model was created without gradients");
  return grads_;
}
Tensor ModelBase::param(const std::string& name) const {
  if (!base16()) return table_view(params_, name);
  const ParamInfo& p = param_info(name);
  if (p.decay) return compute_.slice_flat(p.offset, p.shape);
  return small_.slice_flat(p.offset - dev_decay_count_, p.shape);
}
Tensor ModelBase::grad(const std::string& name) const {
  return table_view(grads_flat(), name);
}
Tensor ModelBase::params_decay() const {
  return params_.slice_flat(0, {dev_decay_count_});
}
Tensor ModelBase::params_no_decay() const {
  return params_.slice_flat(dev_decay_count_, {flat_size_ - dev_decay_count_});
}
Tensor ModelBase::grads_decay() const {
  return grads_flat().slice_flat(0, {dev_decay_count_});
}
Tensor ModelBase::grads_no_decay() const {
  return grads_flat().slice_flat(dev_decay_count_, {flat_size_ - dev_decay_count_});
}

void ModelBase::zero_grad() {
  device_.fill(trainable_grads(), 0.0f);  // the padding rows' too: they stay 0
}

void ModelBase::set_gradients_ready(GradientsReady ready) {
  gradients_ready_ = std::move(ready);
  if (!gradients_ready_ || !stage_ranges_.empty()) return;
  const std::vector<ParamInfo>& rows = trainable_params();
  for (size_t k = 0; k < rows.size(); ++k) {
    // The head's zero padding rows follow it in the device buffers and are as final as it is.
    const int64_t count = rows[k].numel + (!lora() && k == head_ ? pad_ : 0);
    auto& ranges = stage_ranges_[gradient_stage(rows[k].name)];
    if (!ranges.empty() && ranges.back().first + ranges.back().second == rows[k].offset)
      ranges.back().second += count;
    else
      ranges.emplace_back(rows[k].offset, count);
  }
}

int ModelBase::block_in_name(const std::string& name, const std::string& prefix) {
  if (name.compare(0, prefix.size(), prefix) != 0) return -1;
  size_t i = prefix.size(), end = i;
  while (end < name.size() && name[end] >= '0' && name[end] <= '9') ++end;
  return end > i && end - i < 9 ? std::stoi(name.substr(i, end - i)) : -1;
}

void ModelBase::gradients_final(int stage) const {
  if (!gradients_ready_) return;
  auto it = stage_ranges_.find(stage);
  if (it == stage_ranges_.end()) return;
  for (const auto& [offset, count] : it->second) gradients_ready_(offset, count);
}

// =============================================================================================
// Initialisation

void ModelBase::init(uint64_t seed) {
  std::vector<float> host(static_cast<size_t>(num_params_));
  for (size_t k = 0; k < table_.size(); ++k) {
    const ParamInfo& p = table_[k];
    float* dst = host.data() + p.offset;
    if (p.decay) {
      const float stddev = init_stddev(p);
      Philox rng(seed, k);
      for (int64_t j = 0; j < p.numel; ++j) dst[j] = stddev * rng.normal(static_cast<uint64_t>(j));
    } else {
      std::fill(dst, dst + p.numel, init_fill(p));
    }
  }
  upload_params(host);
  if (lora()) lora_->init(seed, table_.size());
  if (trains()) zero_grad();
}

// =============================================================================================
// Activations at the network's ends, the loss

void ModelBase::release_activations() {
  residuals_.clear();
  logits_ = logits_compact_ = losses_ = loss_ = Tensor();
  dresidual_ = dresidual_h_ = Tensor();
  if (lora()) lora_->release();
  batch_.reset();
}

void ModelBase::allocate_residuals(int layers, int64_t BT, int64_t C) {
  residuals_.resize(static_cast<size_t>(layers) + 1);
  for (Tensor& r : residuals_) r = device_.empty({BT * C}, DType::f32, MemCategory::kActivations);
}

void ModelBase::allocate_head(int64_t BT) {
  logits_ =
      device_.empty({BT * padded_vocab_}, options_.policy.activations, MemCategory::kActivations);
  losses_ = device_.empty({BT}, DType::f32, MemCategory::kActivations);
  loss_ = device_.empty({1}, DType::f32, MemCategory::kActivations);
}

void ModelBase::allocate_dresidual(int64_t BT, int64_t C) {
  dresidual_ = device_.empty({BT * C}, DType::f32, MemCategory::kActivations);
  if (options_.policy.mixed())
    dresidual_h_ = device_.empty({BT * C}, options_.policy.activations, MemCategory::kActivations);
}

Tensor ModelBase::logits() const {
  if (padded_vocab_ == vocab_) return batch_.logits(logits_, vocab_);
  const Tensor all = batch_.logits(logits_, padded_vocab_);  // [B,T,Vp]
  const int64_t B = all.shape[0], T = all.shape[1], V = vocab_;
  if (!logits_compact_.defined() || logits_compact_.numel() < B * T * V)
    logits_compact_ = device_.empty({B * T * V}, all.dtype, MemCategory::kWorkspace);
  for (int64_t r = 0; r < B * T; ++r)
    device_.copy(logits_compact_.slice_flat(r * V, {V}), all.slice_flat(r * padded_vocab_, {V}));
  return logits_compact_.slice_flat(0, {B, T, V});
}

Tensor ModelBase::logits_at(int b, int t) const {
  const Tensor all = batch_.logits(logits_, padded_vocab_);  // [B,T,Vp]
  CT_REQUIRE(b >= 0 && b < all.shape[0] && t >= 0 && t < all.shape[1],
             "logits_at(" + std::to_string(b) + ", " + std::to_string(t) +
                 "): outside the last forward's " + all.shape.str());
  return all.slice_flat((int64_t{b} * all.shape[1] + t) * padded_vocab_, {vocab_});
}

Tensor ModelBase::losses() const {
  return batch_.losses(losses_);
}

// =============================================================================================
// Forward: the network's skeleton, the family's parts (embed, block_forward, lm_head)

Tensor ModelBase::forward(const Tensor& tokens, const Tensor* targets, int B, int T) {
  const NetShape s = net_shape();
  model_util::ForwardBatch::check(tokens, targets, B, T, s.block_size, s.block_size_name);
  if (B > max_b_ || T > max_t_) allocate_activations(std::max(B, max_b_), std::max(T, max_t_));
  batch_.begin(tokens, targets, B, T);
  const int64_t BT = int64_t{B} * T;

  // ---- embedding -------------------------------------------------------------------------------
  // residuals[0] (B,T,C) f32 = the embedding of the tokens at positions [0, T) (master weights)
  embed(residuals_[0].slice_flat(0, {B, T, s.C}), batch_.tokens(), 0);

  for (int l = 0; l < s.layers; ++l) block_forward(l, B, T, /*recompute=*/false, /*kv_pos=*/-1);

  // ---- LM head ---------------------------------------------------------------------------------
  // logits (B,T,Vp) h = lnf @ head^T, lnf (B,T,C) h the final norm done by the last block with
  // its residual add; the head is the compute copy with its zero rows to the padded vocabulary
  // Vp, so the padding columns of the logits are 0
  Tensor logits = logits_.slice_flat(0, {BT, padded_vocab_});
  device_.matmul(logits, lnf_.slice_flat(0, {BT, s.C}), lm_head(), false, true);
  if (!targets) return Tensor();

  // ---- loss ------------------------------------------------------------------------------------
  // losses (B,T) f32 = -log softmax(logits[:, :V])[targets];  loss [1] f32 = mean(losses)
  return loss_forward(logits, BT);
}

Tensor ModelBase::block_attention(int l, const Tensor& qkv, const Tensor& atty, const Tensor& lse,
                                  const Tensor& att, int kv_pos) {
  const NetShape s = net_shape();
  const int64_t B = qkv.shape[0], T = qkv.shape[1];
  const int NH = static_cast<int>(s.n_head), NKV = static_cast<int>(s.n_kv_head);
  if (kv_pos >= 0) return kv_attention(l, kv_pos, static_cast<int>(T));
  Tensor out = atty.slice_flat(0, {B, T, s.C});
  if (options_.fused_attention)
    device_.flash_attention_forward(out, lse.slice_flat(0, {B, NH, T}), qkv, NH, NKV);
  else
    device_.attention_forward(out, att.slice_flat(0, {B, NH, T, T}), qkv, NH, NKV);
  return out;
}

Tensor ModelBase::loss_forward(const Tensor& logits, int64_t BT) {
  Tensor losses = losses_.slice_flat(0, {BT});
  dlogits_ready_ = fused_dloss_scale_.has_value();
  if (dlogits_ready_)
    device_.crossentropy_forward_backward(losses, logits, batch_.targets(), vocab_,
                                          *fused_dloss_scale_ / static_cast<float>(BT));
  else
    device_.crossentropy_forward(losses, logits, batch_.targets(), vocab_);
  device_.sum(loss_, losses, 1.0f / static_cast<float>(BT));
  return loss_;
}

Tensor ModelBase::loss_backward(float dloss_scale) {
  CT_REQUIRE(trains(), "backward() on a " + std::string(family_) + " created without gradients");
  batch_.require_targets("backward()");
  const int64_t BT = batch_.BT();
  Tensor logits = logits_.slice_flat(0, {BT, padded_vocab_});
  if (!std::exchange(dlogits_ready_, false))
    device_.crossentropy_backward(logits, logits, batch_.targets(), vocab_,
                                  dloss_scale / static_cast<float>(BT));
  return logits;
}

Tensor ModelBase::forward_backward(const Tensor& tokens, const Tensor& targets, int B, int T,
                                   float dloss_scale) {
  CT_REQUIRE(trains(),
             "forward_backward() on a " + std::string(family_) + " created without gradients");
  dlogits_ready_ = false;
  fused_dloss_scale_ = dloss_scale;
  Tensor loss;
  try {
    loss = forward(tokens, &targets, B, T);
  } catch (...) {
    fused_dloss_scale_.reset();
    throw;
  }
  fused_dloss_scale_.reset();
  backward(dloss_scale);
  return loss;
}

// =============================================================================================
// LoRA glue

void ModelBase::lora_forward(int l, int first, int n, const Tensor& out, const Tensor& x) const {
  if (!lora_) return;
  for (int m = first; m < first + n; ++m) lora_->forward(l * sites_per_layer_ + m, out, x);
}

void ModelBase::linear_backward_input(int l, int m, const Tensor& dinp, const Tensor& dout,
                                      const Tensor& inp, const Tensor& w, bool transpose_w) const {
  const int site = l * sites_per_layer_ + m;
  if (lora() && lora_->dropout_active(site)) {
    lora_->backward(site, dinp, dout, inp);
    device_.matmul(dinp, dout, w, false, transpose_w, 1.0f, 1.0f);
    return;
  }
  device_.matmul(dinp, dout, w, false, transpose_w);
  if (lora()) lora_->backward(site, dinp, dout, inp);
}

// =============================================================================================
// Host helpers: checkpoints

std::vector<float> ModelBase::download_params() const {
  if (base16())  // the 16-bit base
    return to_host_layout(model_util::download_widened(device_, compute_));
  std::vector<float> dev(static_cast<size_t>(flat_size_));
  device_.download(dev.data(), params_, dev.size() * sizeof(float));
  return to_host_layout(std::move(dev));
}

std::vector<float> ModelBase::download_grads() const {
  std::vector<float> dev(static_cast<size_t>(flat_size_));
  device_.download(dev.data(), grads_flat(), dev.size() * sizeof(float));
  return to_host_layout(std::move(dev));
}

std::map<std::string, std::vector<float>> ModelBase::download_param_map() const {
  return model_util::split(table_, download_params());
}

void ModelBase::upload_params(const std::vector<float>& flat) {
  CT_REQUIRE(static_cast<int64_t>(flat.size()) == num_params_,
             "upload_params: got " + std::to_string(flat.size()) + " values, the model has " +
                 std::to_string(num_params_));
  const std::vector<float> dev = to_device_layout(flat);  // the padding rows zero
  if (base16()) {  // rounded to nearest even on the host: no f32 copy on the device
    model_util::upload_rounded(device_, compute_, dev);
    device_.copy(small_, compute_.slice_flat(dev_decay_count_, {flat_size_ - dev_decay_count_}));
    return;
  }
  device_.upload(params_, dev.data(), dev.size() * sizeof(float));
  if (options_.policy.mixed()) device_.copy(compute_, params_);
}

void ModelBase::upload_params(const std::map<std::string, std::vector<float>>& named) {
  upload_params(model_util::flatten(table_, num_params_, named));
}

}  // namespace ct
