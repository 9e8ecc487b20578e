// GPT-2 forward and backward, one banner section per layer, in the style of llm.c's
// train_gpt2.c. Every op is a Device call on Tensors; the host never touches device data except
// in the explicit host helpers at the end (init, checkpoints, generate).
#include "core/model/gpt2.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"
#include "core/philox.h"

namespace ct {

// =============================================================================================
// The parameter table

std::vector<ParamInfo> gpt2_param_table(const GPT2Config& cfg) {
  const int64_t C = cfg.n_embd, V = cfg.vocab_size, maxT = cfg.block_size;
  std::vector<ParamInfo> table;
  int64_t offset = 0;
  auto add = [&](const std::string& name, Shape shape, bool decay) {
    ParamInfo p;
    p.name = name;
    p.shape = shape;
    p.offset = offset;
    p.numel = shape.numel();
    p.decay = decay;
    offset += p.numel;
    table.push_back(std::move(p));
  };
  auto h = [](int l, const char* rest) { return "h." + std::to_string(l) + "." + rest; };

  // Weight-decayed group: embeddings and matmul weights.
  add("wte.weight", {V, C}, true);
  add("wpe.weight", {maxT, C}, true);
  for (int l = 0; l < cfg.n_layer; ++l) {
    add(h(l, "attn.c_attn.weight"), {C, 3 * C}, true);
    add(h(l, "attn.c_proj.weight"), {C, C}, true);
    add(h(l, "mlp.c_fc.weight"), {C, 4 * C}, true);
    add(h(l, "mlp.c_proj.weight"), {4 * C, C}, true);
  }
  // No decay: biases and LayerNorm parameters.
  for (int l = 0; l < cfg.n_layer; ++l) {
    add(h(l, "ln_1.weight"), {C}, false);
    add(h(l, "ln_1.bias"), {C}, false);
    add(h(l, "attn.c_attn.bias"), {3 * C}, false);
    add(h(l, "attn.c_proj.bias"), {C}, false);
    add(h(l, "ln_2.weight"), {C}, false);
    add(h(l, "ln_2.bias"), {C}, false);
    add(h(l, "mlp.c_fc.bias"), {4 * C}, false);
    add(h(l, "mlp.c_proj.bias"), {C}, false);
  }
  add("ln_f.weight", {C}, false);
  add("ln_f.bias", {C}, false);
  return table;
}

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// A contiguous view of the first shape.numel() elements of t.
Tensor view(const Tensor& t, const Shape& shape) {
  return t.slice_flat(0, shape);
}

// Fully connected layer in Conv1D layout, and its backward:
//   out (=) inp @ w + b                 inp (N,C), w (C,OC), b (OC), out (N,OC)
void linear_forward(Device& dev, const Tensor& out, const Tensor& inp, const Tensor& w,
                    const Tensor& b) {
  dev.matmul(out, inp, w, false, false, 1.0f, 0.0f, &b);
}
//   dinp (=) dout @ w^T;  dw (+=) inp^T @ dout;  db (+=) column sums of dout
void linear_backward(Device& dev, const Tensor& dinp, const Tensor& dw, const Tensor& db,
                     const Tensor& dout, const Tensor& inp, const Tensor& w) {
  dev.matmul(dinp, dout, w, false, true);
  dev.matmul(dw, inp, dout, true, false, 1.0f, 1.0f);
  dev.bias_backward(db, dout);
}

}  // namespace

// =============================================================================================
// Construction and parameter access

GPT2::GPT2(Device& device, const GPT2Config& config, bool with_grads)
    : device_(device), config_(config) {
  config_.validate();
  table_ = gpt2_param_table(config_);
  for (size_t i = 0; i < table_.size(); ++i) {
    index_[table_[i].name] = i;
    num_params_ += table_[i].numel;
    if (table_[i].decay) decay_count_ += table_[i].numel;
  }
  CT_CHECK(num_params_ == config_.num_parameters(), "parameter table disagrees with config");
  params_ = device_.empty({num_params_}, DType::f32, MemCategory::kWeights);
  if (with_grads) grads_ = device_.empty({num_params_}, DType::f32, MemCategory::kGrads);
}

const ParamInfo& GPT2::param_info(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end())
    fail(ErrorKind::kInvalidArgument, "GPT-2 has no parameter named '" + name + "'");
  return table_[it->second];
}

Tensor GPT2::table_view(const Tensor& flat, const std::string& name) const {
  const ParamInfo& p = param_info(name);
  return flat.slice_flat(p.offset, p.shape);
}

Tensor GPT2::grads_flat() const {
  if (!grads_.defined())
    fail(ErrorKind::kInvalidArgument, "this GPT2 was created without gradients");
  return grads_;
}
Tensor GPT2::param(const std::string& name) const {
  return table_view(params_, name);
}
Tensor GPT2::grad(const std::string& name) const {
  return table_view(grads_flat(), name);
}
Tensor GPT2::params_decay() const {
  return params_.slice_flat(0, {decay_count_});
}
Tensor GPT2::params_no_decay() const {
  return params_.slice_flat(decay_count_, {num_params_ - decay_count_});
}
Tensor GPT2::grads_decay() const {
  return grads_flat().slice_flat(0, {decay_count_});
}
Tensor GPT2::grads_no_decay() const {
  return grads_flat().slice_flat(decay_count_, {num_params_ - decay_count_});
}

GPT2::LayerParams GPT2::layer_params(const Tensor& flat, int l) const {
  const std::string h = "h." + std::to_string(l) + ".";
  auto v = [&](const char* rest) { return table_view(flat, h + rest); };
  return {v("ln_1.weight"),      v("ln_1.bias"),          v("attn.c_attn.weight"),
          v("attn.c_attn.bias"), v("attn.c_proj.weight"), v("attn.c_proj.bias"),
          v("ln_2.weight"),      v("ln_2.bias"),          v("mlp.c_fc.weight"),
          v("mlp.c_fc.bias"),    v("mlp.c_proj.weight"),  v("mlp.c_proj.bias")};
}

void GPT2::zero_grad() {
  device_.fill(grads_flat(), 0.0f);
}

// =============================================================================================
// Initialisation

void GPT2::init(uint64_t seed) {
  std::vector<float> host(static_cast<size_t>(num_params_));
  const float proj_scale = 1.0f / std::sqrt(2.0f * static_cast<float>(config_.n_layer));
  for (size_t k = 0; k < table_.size(); ++k) {
    const ParamInfo& p = table_[k];
    float* dst = host.data() + p.offset;
    if (p.decay) {  // matrices and embeddings: N(0, 0.02), residual projections scaled down
      float stddev = 0.02f;
      if (ends_with(p.name, "attn.c_proj.weight") || ends_with(p.name, "mlp.c_proj.weight"))
        stddev *= proj_scale;
      Philox rng(seed, k);
      for (int64_t j = 0; j < p.numel; ++j) dst[j] = stddev * rng.normal(static_cast<uint64_t>(j));
    } else {  // LayerNorm weights 1; biases (LayerNorm and linear) 0
      bool is_ln_weight = p.name.find(".ln_") != std::string::npos || p.name.rfind("ln_f", 0) == 0;
      float value = is_ln_weight && ends_with(p.name, ".weight") ? 1.0f : 0.0f;
      std::fill(dst, dst + p.numel, value);
    }
  }
  upload_params(host);
  if (grads_.defined()) zero_grad();
}

// =============================================================================================
// Activations

void GPT2::allocate_activations(int max_batch, int max_seq) {
  CT_REQUIRE(max_batch >= 1, "max batch must be positive, got " + std::to_string(max_batch));
  CT_REQUIRE(max_seq >= 1 && max_seq <= config_.block_size,
             "sequence length " + std::to_string(max_seq) + " outside [1, block_size " +
                 std::to_string(config_.block_size) + "]");
  const int64_t BT = int64_t{max_batch} * max_seq, C = config_.n_embd, V = config_.vocab_size;
  const int64_t NH = config_.n_head;
  // Drop the old buffers first so the peak holds one set, not two.
  layers_.clear();
  encoded_ = lnf_ = lnf_mean_ = lnf_rstd_ = logits_ = losses_ = loss_ = Tensor();
  dresidual_ = dbt_c_ = dbt_4c_a_ = dbt_4c_b_ = Tensor();
  tokens_ = targets_ = Tensor();
  have_targets_ = false;

  auto act = [&](int64_t n) { return device_.empty({n}, DType::f32, MemCategory::kActivations); };
  encoded_ = act(BT * C);
  layers_.resize(static_cast<size_t>(config_.n_layer));
  for (LayerActs& a : layers_) {
    a.ln1 = act(BT * C);
    a.ln1_mean = act(BT);
    a.ln1_rstd = act(BT);
    a.qkv = act(BT * 3 * C);
    a.att = act(int64_t{max_batch} * NH * max_seq * max_seq);
    a.atty = act(BT * C);
    a.attproj = act(BT * C);
    a.residual2 = act(BT * C);
    a.ln2 = act(BT * C);
    a.ln2_mean = act(BT);
    a.ln2_rstd = act(BT);
    a.fch = act(BT * 4 * C);
    a.fch_gelu = act(BT * 4 * C);
    a.fcproj = act(BT * C);
    a.residual3 = act(BT * C);
  }
  lnf_ = act(BT * C);
  lnf_mean_ = act(BT);
  lnf_rstd_ = act(BT);
  logits_ = act(BT * V);
  losses_ = act(BT);
  loss_ = act(1);
  if (grads_.defined()) {
    dresidual_ = act(BT * C);
    dbt_c_ = act(BT * C);
    dbt_4c_a_ = act(BT * 4 * C);
    dbt_4c_b_ = act(BT * 4 * C);
  }
  max_b_ = max_batch;
  max_t_ = max_seq;
}

void GPT2::check_batch(const Tensor& t, int B, int T, const char* what) const {
  CT_REQUIRE(
      t.defined() && t.dtype == DType::i32 && t.is_contiguous() && t.numel() == int64_t{B} * T,
      std::string(what) + " must be a contiguous i32 tensor of " + std::to_string(B) + "x" +
          std::to_string(T) + " elements, got " +
          (t.defined() ? t.describe() : std::string("none")));
}

Tensor GPT2::logits() const {
  CT_REQUIRE(cur_b_ > 0, "logits() before forward()");
  return view(logits_, {cur_b_, cur_t_, config_.vocab_size});
}

Tensor GPT2::losses() const {
  CT_REQUIRE(cur_b_ > 0 && have_targets_, "losses() needs a forward() with targets");
  return view(losses_, {cur_b_, cur_t_});
}

// =============================================================================================
// Forward

Tensor GPT2::forward(const Tensor& tokens, const Tensor* targets, int B, int T) {
  CT_REQUIRE(B >= 1, "batch size must be positive, got " + std::to_string(B));
  CT_REQUIRE(T >= 1 && T <= config_.block_size, "sequence length " + std::to_string(T) +
                                                    " outside [1, block_size " +
                                                    std::to_string(config_.block_size) + "]");
  check_batch(tokens, B, T, "tokens");
  if (targets) check_batch(*targets, B, T, "targets");
  if (B > max_b_ || T > max_t_) allocate_activations(std::max(B, max_b_), std::max(T, max_t_));

  const int64_t C = config_.n_embd, V = config_.vocab_size, NH = config_.n_head;
  const int64_t BT = int64_t{B} * T;
  const float eps = config_.layer_norm_epsilon;
  cur_b_ = B;
  cur_t_ = T;
  tokens_ = tokens.reshape({B, T});
  have_targets_ = targets != nullptr;
  targets_ = targets ? targets->reshape({BT}) : Tensor();

  // ---- encoder --------------------------------------------------------------------------------
  // x (B,T,C) = wte[tokens] + wpe[0:T]
  Tensor x = view(encoded_, {B, T, C});
  device_.embedding_forward(x, tokens_, param("wte.weight"), param("wpe.weight"));

  for (int l = 0; l < config_.n_layer; ++l) {
    const LayerParams p = layer_params(params_, l);
    const LayerActs& a = layers_[static_cast<size_t>(l)];
    Tensor residual = view(x, {BT, C});  // (B,T,C) input of this block

    // ---- layernorm 1 ---------------------------------------------------------------------------
    // ln1 (B,T,C) = LayerNorm(residual)
    Tensor ln1 = view(a.ln1, {BT, C});
    device_.layernorm_forward(ln1, view(a.ln1_mean, {BT}), view(a.ln1_rstd, {BT}), residual, p.ln1w,
                              p.ln1b, eps);

    // ---- attention -----------------------------------------------------------------------------
    // qkv (B,T,3C) = ln1 @ c_attn.w + c_attn.b
    Tensor qkv = view(a.qkv, {BT, 3 * C});
    linear_forward(device_, qkv, ln1, p.qkvw, p.qkvb);
    // atty (B,T,C) = causal softmax(q k^T / sqrt(hs)) v per head; att (B,NH,T,T) saved
    Tensor atty = view(a.atty, {B, T, C});
    device_.attention_forward(atty, view(a.att, {B, NH, T, T}), qkv.reshape({B, T, 3 * C}),
                              config_.n_head);
    // attproj (B,T,C) = atty @ attn.c_proj.w + attn.c_proj.b
    Tensor attproj = view(a.attproj, {BT, C});
    linear_forward(device_, attproj, atty.reshape({BT, C}), p.attprojw, p.attprojb);
    // residual2 (B,T,C) = residual + attproj
    Tensor residual2 = view(a.residual2, {BT, C});
    device_.add(residual2.reshape({BT * C}), residual.reshape({BT * C}), attproj.reshape({BT * C}));

    // ---- layernorm 2 ---------------------------------------------------------------------------
    Tensor ln2 = view(a.ln2, {BT, C});
    device_.layernorm_forward(ln2, view(a.ln2_mean, {BT}), view(a.ln2_rstd, {BT}), residual2,
                              p.ln2w, p.ln2b, eps);

    // ---- MLP -----------------------------------------------------------------------------------
    // fch (B,T,4C) = ln2 @ c_fc.w + c_fc.b;  fch_gelu = gelu(fch)
    Tensor fch = view(a.fch, {BT, 4 * C});
    linear_forward(device_, fch, ln2, p.fcw, p.fcb);
    Tensor fch_gelu = view(a.fch_gelu, {BT, 4 * C});
    device_.gelu_forward(fch_gelu.reshape({BT * 4 * C}), fch.reshape({BT * 4 * C}));
    // fcproj (B,T,C) = fch_gelu @ mlp.c_proj.w + mlp.c_proj.b
    Tensor fcproj = view(a.fcproj, {BT, C});
    linear_forward(device_, fcproj, fch_gelu, p.fcprojw, p.fcprojb);
    // residual3 (B,T,C) = residual2 + fcproj
    Tensor residual3 = view(a.residual3, {B, T, C});
    device_.add(residual3.reshape({BT * C}), residual2.reshape({BT * C}), fcproj.reshape({BT * C}));
    x = residual3;
  }

  // ---- final layernorm and tied LM head -------------------------------------------------------
  // lnf (B,T,C) = LayerNorm(x);  logits (B,T,V) = lnf @ wte^T
  Tensor lnf = view(lnf_, {BT, C});
  device_.layernorm_forward(lnf, view(lnf_mean_, {BT}), view(lnf_rstd_, {BT}), x.reshape({BT, C}),
                            param("ln_f.weight"), param("ln_f.bias"), eps);
  Tensor logits = view(logits_, {BT, V});
  device_.matmul(logits, lnf, param("wte.weight"), false, true);

  if (!targets) return Tensor();

  // ---- loss -----------------------------------------------------------------------------------
  // losses (B,T) = -log softmax(logits)[targets];  loss [1] = mean(losses)
  Tensor losses = view(losses_, {BT});
  device_.crossentropy_forward(losses, logits, targets_);
  device_.sum(loss_, losses, 1.0f / static_cast<float>(BT));
  return loss_;
}

// =============================================================================================
// Backward

void GPT2::backward(float dloss_scale) {
  CT_REQUIRE(grads_.defined(), "backward() on a GPT2 created without gradients");
  CT_REQUIRE(cur_b_ > 0 && have_targets_, "backward() needs a preceding forward() with targets");
  const int B = cur_b_, T = cur_t_;
  const int64_t C = config_.n_embd, V = config_.vocab_size, NH = config_.n_head;
  const int64_t BT = int64_t{B} * T;
  const Tensor& g = grads_;
  Tensor wte = param("wte.weight");

  Tensor dresidual = view(dresidual_, {BT, C});  // d loss / d (residual stream), (B,T,C)
  Tensor dbt_c = view(dbt_c_, {BT, C});          // scratch (B,T,C)

  // ---- loss and LM head -----------------------------------------------------------------------
  // dlogits (B,T,V) = dloss * (softmax(logits) - onehot(targets)), in place over the logits
  Tensor logits = view(logits_, {BT, V});
  device_.crossentropy_backward(logits, logits, targets_, dloss_scale / static_cast<float>(BT));
  const Tensor& dlogits = logits;
  // dlnf (B,T,C) = dlogits @ wte;  dwte += dlogits^T @ lnf
  Tensor lnf = view(lnf_, {BT, C});
  Tensor dlnf = dbt_c;
  device_.matmul(dlnf, dlogits, wte, false, false);
  device_.matmul(table_view(g, "wte.weight"), dlogits, lnf, true, false, 1.0f, 1.0f);

  // ---- final layernorm ------------------------------------------------------------------------
  // dresidual (B,T,C) = d LayerNorm_f / d x  (the residual stream gradient starts here)
  const LayerActs& last = layers_.back();
  device_.fill(dresidual, 0.0f);
  device_.layernorm_backward(dresidual, table_view(g, "ln_f.weight"), table_view(g, "ln_f.bias"),
                             dlnf, view(last.residual3, {BT, C}), param("ln_f.weight"),
                             view(lnf_mean_, {BT}), view(lnf_rstd_, {BT}));

  for (int l = config_.n_layer - 1; l >= 0; --l) {
    const LayerParams p = layer_params(params_, l);
    const LayerParams dp = layer_params(g, l);
    const LayerActs& a = layers_[static_cast<size_t>(l)];
    Tensor residual = l == 0 ? view(encoded_, {BT, C})
                             : view(layers_[static_cast<size_t>(l) - 1].residual3, {BT, C});
    Tensor dbt_4c_a = view(dbt_4c_a_, {BT, 4 * C});
    Tensor dbt_4c_b = view(dbt_4c_b_, {BT, 4 * C});

    // ---- MLP -----------------------------------------------------------------------------------
    // residual3 = residual2 + fcproj: d fcproj = dresidual, and dresidual flows on to residual2.
    // dfch_gelu (B,T,4C) = dresidual @ mlp.c_proj.w^T
    Tensor dfch_gelu = dbt_4c_a;
    linear_backward(device_, dfch_gelu, dp.fcprojw, dp.fcprojb, dresidual,
                    view(a.fch_gelu, {BT, 4 * C}), p.fcprojw);
    // dfch (B,T,4C) = gelu'(fch) * dfch_gelu
    Tensor dfch = dbt_4c_b;
    device_.gelu_backward(dfch.reshape({BT * 4 * C}), view(a.fch, {BT * 4 * C}),
                          dfch_gelu.reshape({BT * 4 * C}));
    // dln2 (B,T,C) = dfch @ c_fc.w^T
    Tensor dln2 = dbt_c;
    linear_backward(device_, dln2, dp.fcw, dp.fcb, dfch, view(a.ln2, {BT, C}), p.fcw);

    // ---- layernorm 2 ---------------------------------------------------------------------------
    // dresidual (B,T,C) += d LayerNorm_2 / d residual2
    device_.layernorm_backward(dresidual, dp.ln2w, dp.ln2b, dln2, view(a.residual2, {BT, C}),
                               p.ln2w, view(a.ln2_mean, {BT}), view(a.ln2_rstd, {BT}));

    // ---- attention -----------------------------------------------------------------------------
    // residual2 = residual + attproj: d attproj = dresidual, which flows on to residual.
    // datty (B,T,C) = dresidual @ attn.c_proj.w^T
    Tensor datty = dbt_c;
    linear_backward(device_, datty, dp.attprojw, dp.attprojb, dresidual, view(a.atty, {BT, C}),
                    p.attprojw);
    // dqkv (B,T,3C) from datty and the saved qkv, att
    Tensor dqkv = view(dbt_4c_a_, {BT, 3 * C});
    device_.attention_backward(dqkv.reshape({B, T, 3 * C}), datty.reshape({B, T, C}),
                               view(a.qkv, {B, T, 3 * C}), view(a.att, {B, NH, T, T}),
                               config_.n_head);
    // dln1 (B,T,C) = dqkv @ c_attn.w^T
    Tensor dln1 = dbt_c;
    linear_backward(device_, dln1, dp.qkvw, dp.qkvb, dqkv, view(a.ln1, {BT, C}), p.qkvw);

    // ---- layernorm 1 ---------------------------------------------------------------------------
    // dresidual (B,T,C) += d LayerNorm_1 / d residual
    device_.layernorm_backward(dresidual, dp.ln1w, dp.ln1b, dln1, residual, p.ln1w,
                               view(a.ln1_mean, {BT}), view(a.ln1_rstd, {BT}));
  }

  // ---- encoder --------------------------------------------------------------------------------
  // dwte += scatter of dresidual by token;  dwpe += sum of dresidual over the batch
  device_.embedding_backward(table_view(g, "wte.weight"), table_view(g, "wpe.weight"),
                             dresidual.reshape({B, T, C}), tokens_);
  have_targets_ = false;  // the logits now hold dlogits: a second backward needs a new forward
}

// =============================================================================================
// Host helpers: checkpoints and sampling

std::vector<float> GPT2::download_params() const {
  std::vector<float> host(static_cast<size_t>(num_params_));
  device_.download(host.data(), params_, host.size() * sizeof(float));
  return host;
}

std::vector<float> GPT2::download_grads() const {
  std::vector<float> host(static_cast<size_t>(num_params_));
  device_.download(host.data(), grads_flat(), host.size() * sizeof(float));
  return host;
}

std::map<std::string, std::vector<float>> GPT2::download_param_map() const {
  std::vector<float> flat = download_params();
  std::map<std::string, std::vector<float>> named;
  for (const ParamInfo& p : table_)
    named[p.name] = std::vector<float>(flat.begin() + p.offset, flat.begin() + p.offset + p.numel);
  return named;
}

void GPT2::upload_params(const std::vector<float>& flat) {
  CT_REQUIRE(static_cast<int64_t>(flat.size()) == num_params_,
             "upload_params: got " + std::to_string(flat.size()) + " values, the model has " +
                 std::to_string(num_params_));
  device_.upload(params_, flat.data(), flat.size() * sizeof(float));
}

void GPT2::upload_params(const std::map<std::string, std::vector<float>>& named) {
  for (const auto& [name, values] : named) {
    if (!index_.count(name))
      fail(ErrorKind::kInvalidArgument, "upload_params: unknown parameter '" + name + "'");
  }
  std::vector<float> flat(static_cast<size_t>(num_params_));
  for (const ParamInfo& p : table_) {
    auto it = named.find(p.name);
    if (it == named.end())
      fail(ErrorKind::kInvalidArgument, "upload_params: missing parameter '" + p.name + "'");
    if (static_cast<int64_t>(it->second.size()) != p.numel)
      fail(ErrorKind::kInvalidArgument,
           "upload_params: '" + p.name + "' has " + std::to_string(it->second.size()) +
               " values, expected " + std::to_string(p.numel) + " for shape " + p.shape.str());
    std::copy(it->second.begin(), it->second.end(), flat.begin() + p.offset);
  }
  upload_params(flat);
}

namespace {

// One token from a row of logits: greedy at temperature <= 0, else softmax(logits / temperature)
// restricted to the top_k largest (all if top_k <= 0), sampled by inverse CDF at u in (0,1).
int32_t sample_token(const std::vector<float>& logits, const SampleOptions& opt, float u) {
  const int V = static_cast<int>(logits.size());
  if (opt.temperature <= 0.0f)
    return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  float threshold = -INFINITY;
  if (opt.top_k > 0 && opt.top_k < V) {
    std::vector<float> sorted = logits;
    std::nth_element(sorted.begin(), sorted.begin() + (opt.top_k - 1), sorted.end(),
                     std::greater<float>());
    threshold = sorted[static_cast<size_t>(opt.top_k - 1)];
  }
  const float max_logit = *std::max_element(logits.begin(), logits.end());
  std::vector<double> p(static_cast<size_t>(V), 0.0);
  double total = 0.0;
  for (int i = 0; i < V; ++i) {
    if (logits[i] < threshold) continue;
    p[i] = std::exp((static_cast<double>(logits[i]) - max_logit) / opt.temperature);
    total += p[i];
  }
  double target = static_cast<double>(u) * total, cdf = 0.0;
  int32_t last = 0;
  for (int i = 0; i < V; ++i) {
    if (p[i] == 0.0) continue;
    cdf += p[i];
    last = i;
    if (target < cdf) return i;
  }
  return last;  // rounding at the very top of the CDF
}

}  // namespace

std::vector<int32_t> GPT2::generate(const std::vector<int32_t>& prompt, int n,
                                    const SampleOptions& options) {
  CT_REQUIRE(!prompt.empty(), "generate: the prompt must hold at least one token");
  CT_REQUIRE(n >= 0, "generate: negative token count");
  for (int32_t t : prompt)
    CT_REQUIRE(t >= 0 && t < config_.vocab_size, "generate: prompt token " + std::to_string(t) +
                                                     " outside the vocabulary [0, " +
                                                     std::to_string(config_.vocab_size) + ")");
  const int V = config_.vocab_size;
  const int window = static_cast<int>(
      std::min<int64_t>(config_.block_size, static_cast<int64_t>(prompt.size()) + n));
  if (max_b_ < 1 || max_t_ < window)
    allocate_activations(std::max(1, max_b_), std::max(window, max_t_));
  Tensor tokens = device_.empty({window}, DType::i32, MemCategory::kActivations);

  std::vector<int32_t> context = prompt, out;
  std::vector<float> row(static_cast<size_t>(V));
  Philox rng(options.seed, 0);
  for (int i = 0; i < n; ++i) {
    const int T = static_cast<int>(std::min<size_t>(context.size(), config_.block_size));
    Tensor tok = tokens.slice_flat(0, {1, T});
    device_.upload(tok, context.data() + (context.size() - T), sizeof(int32_t) * T);
    forward(tok, nullptr, 1, T);
    device_.download(row.data(), logits_.slice_flat(int64_t{T - 1} * V, {V}), sizeof(float) * V);
    int32_t next = sample_token(row, options, rng.uniform(static_cast<uint64_t>(i)));
    context.push_back(next);
    out.push_back(next);
  }
  return out;
}

}  // namespace ct
