// GPT-2 LoRA adapters: their table, initialisation, host copies, and the forward and backward
// of the low-rank update. The rest of the model calls lora_forward / lora_backward right after
// the base layer's own forward / input gradient.
#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/model/gpt2.h"
#include "core/model/gpt2_internal.h"
#include "core/philox.h"

namespace ct {

using gpt2_detail::view;

namespace {

// The four linear layers of a block, in LoraSlot order: name, in and out widths (in units of C).
struct LoraModule {
  const char* name;
  int in_c, out_c;
};
constexpr LoraModule kLoraModules[4] = {
    {"attn.c_attn", 1, 3}, {"attn.c_proj", 1, 1}, {"mlp.c_fc", 1, 4}, {"mlp.c_proj", 4, 1}};

// PEFT's rule for a string entry of target_modules: the whole name, or its last dotted parts.
bool targets(const std::vector<std::string>& targets, const std::string& module) {
  for (const std::string& t : targets) {
    if (module == t) return true;
    if (module.size() > t.size() && module.compare(module.size() - t.size(), t.size(), t) == 0 &&
        module[module.size() - t.size() - 1] == '.')
      return true;
  }
  return false;
}

}  // namespace

void GPT2::build_lora_table() {
  const LoraOptions& lo = options_.lora;
  lora_slots_.assign(static_cast<size_t>(config_.n_layer) * 4, LoraSlot{});
  if (!lo.enabled()) return;
  CT_REQUIRE(lo.r <= config_.n_embd, "--lora-r " + std::to_string(lo.r) +
                                         ": must be at most n_embd " +
                                         std::to_string(config_.n_embd));
  CT_REQUIRE(std::isfinite(lo.alpha) && lo.alpha > 0.0f,
             "--lora-alpha " + std::to_string(lo.alpha) + ": must be > 0");
  CT_REQUIRE(!lo.target_modules.empty(), "--lora-target-modules: names no module");
  CT_REQUIRE(std::isfinite(lo.dropout) && lo.dropout >= 0.0f && lo.dropout < 1.0f,
             "--lora-dropout " + std::to_string(lo.dropout) + ": must be in [0, 1)");
  for (const std::string& t : lo.target_modules) {
    bool any = false;
    for (const LoraModule& m : kLoraModules)
      any = any || targets({t}, std::string("h.0.") + m.name);
    CT_REQUIRE(any, "--lora-target-modules: '" + t +
                        "' matches no GPT-2 layer (c_attn, c_proj, c_fc, attn.c_proj, "
                        "mlp.c_proj, ...)");
  }
  const int64_t C = config_.n_embd, r = lo.r;
  int64_t offset = 0;
  // Rows are added first, pointers taken after (the vector must not reallocate under them).
  std::vector<std::pair<size_t, int>> owner;  // slot index, 0 = A / 1 = B
  for (int l = 0; l < config_.n_layer; ++l) {
    for (int m = 0; m < 4; ++m) {
      const std::string module = "h." + std::to_string(l) + "." + kLoraModules[m].name;
      if (!targets(lo.target_modules, module)) continue;
      LoraSlot& s = lora_slots_[static_cast<size_t>(l) * 4 + static_cast<size_t>(m)];
      s.on = true;
      s.in = kLoraModules[m].in_c * C;
      s.out = kLoraModules[m].out_c * C;
      for (int ab = 0; ab < 2; ++ab) {
        ParamInfo p;
        p.name = module + (ab == 0 ? ".lora_A.weight" : ".lora_B.weight");
        p.shape = ab == 0 ? Shape{r, s.in} : Shape{s.out, r};
        p.offset = offset;
        p.numel = p.shape.numel();
        p.decay = true;
        offset += p.numel;
        lora_table_.push_back(p);
        owner.emplace_back(static_cast<size_t>(l) * 4 + static_cast<size_t>(m), ab);
      }
    }
  }
  for (size_t i = 0; i < lora_table_.size(); ++i)
    (owner[i].second == 0 ? lora_slots_[owner[i].first].a : lora_slots_[owner[i].first].b) =
        &lora_table_[i];
  lora_count_ = offset;
}

int64_t GPT2::lora_parameter_count(const GPT2Config& config, const LoraOptions& lora) {
  if (!lora.enabled()) return 0;
  int64_t n = 0;
  for (int l = 0; l < config.n_layer; ++l)
    for (const LoraModule& m : kLoraModules)
      if (targets(lora.target_modules, "h." + std::to_string(l) + "." + m.name))
        n += int64_t{lora.r} * (m.in_c + m.out_c) * config.n_embd;
  return n;
}

int64_t GPT2::lora_dropout_width(const GPT2Config& config, const LoraOptions& lora) {
  if (!lora.enabled() || lora.dropout <= 0.0f) return 0;
  int64_t width = 0;
  for (int l = 0; l < config.n_layer; ++l)
    for (const LoraModule& m : kLoraModules)
      if (targets(lora.target_modules, "h." + std::to_string(l) + "." + m.name))
        width = std::max(width, int64_t{m.in_c} * config.n_embd);
  return width;
}

uint64_t GPT2::lora_dropout_stream(int l, int m) const {
  return kLoraDropoutStream +
         (static_cast<uint64_t>(lora_dropout_draw_) * static_cast<uint64_t>(config_.n_layer) +
          static_cast<uint64_t>(l)) *
             4 +
         static_cast<uint64_t>(m);
}

bool GPT2::lora_dropout_active(int l, int m) const {
  return lora_slot(l, m).on && options_.lora.dropout > 0.0f && lora_dropout_draw_ >= 0;
}

Tensor GPT2::lora_input(int l, int m, const Tensor& x) const {
  if (!lora_dropout_active(l, m)) return x;
  CT_REQUIRE(lora_x_.defined(),
             "LoRA dropout needs the training buffers (a GPT2 created with gradients)");
  Tensor xd = view(lora_x_, {x.shape.d[0], x.shape.d[1]});
  device_.dropout(xd, x, options_.lora.dropout, lora_dropout_seed_, lora_dropout_stream(l, m));
  return xd;
}

Tensor GPT2::trainable_grads() const {
  if (!lora()) return grads_flat();
  if (!lora_grads_.defined())
    fail(ErrorKind::kInvalidArgument, "this GPT2 was created without gradients");
  return lora_grads_;
}

void GPT2::init_lora(uint64_t seed) {
  std::vector<float> host(static_cast<size_t>(lora_count_), 0.0f);
  for (size_t k = 0; k < lora_table_.size(); ++k) {
    const ParamInfo& p = lora_table_[k];
    if (p.name.find(".lora_A.") == std::string::npos) continue;  // B starts at zero
    const float bound = 1.0f / std::sqrt(static_cast<float>(p.shape.d[1]));
    Philox rng(seed, table_.size() + k);
    for (int64_t j = 0; j < p.numel; ++j)
      host[static_cast<size_t>(p.offset + j)] =
          bound * (2.0f * rng.uniform(static_cast<uint64_t>(j)) - 1.0f);
  }
  device_.upload(lora_params_, host.data(), host.size() * sizeof(float));
  refresh_compute_weights();
}

std::map<std::string, std::vector<float>> GPT2::download_lora_map() const {
  std::vector<float> flat(static_cast<size_t>(lora_count_));
  if (lora_count_ > 0) device_.download(flat.data(), lora_params_, flat.size() * sizeof(float));
  std::map<std::string, std::vector<float>> named;
  for (const ParamInfo& p : lora_table_)
    named[p.name] = std::vector<float>(flat.begin() + p.offset, flat.begin() + p.offset + p.numel);
  return named;
}

void GPT2::upload_lora(const std::map<std::string, std::vector<float>>& named) {
  CT_REQUIRE(lora(), "upload_lora: the model has no LoRA adapters");
  std::vector<float> flat(static_cast<size_t>(lora_count_));
  for (const auto& [name, values] : named) {
    bool known = false;
    for (const ParamInfo& p : lora_table_) known = known || p.name == name;
    if (!known) fail(ErrorKind::kInvalidArgument, "upload_lora: unknown adapter '" + name + "'");
  }
  for (const ParamInfo& p : lora_table_) {
    auto it = named.find(p.name);
    if (it == named.end())
      fail(ErrorKind::kInvalidArgument, "upload_lora: missing adapter '" + p.name + "'");
    if (static_cast<int64_t>(it->second.size()) != p.numel)
      fail(ErrorKind::kInvalidArgument,
           "upload_lora: '" + p.name + "' has " + std::to_string(it->second.size()) +
               " values, expected " + std::to_string(p.numel) + " for shape " + p.shape.str());
    std::copy(it->second.begin(), it->second.end(), flat.begin() + p.offset);
  }
  device_.upload(lora_params_, flat.data(), flat.size() * sizeof(float));
  refresh_compute_weights();
}

// u (BT,r) h = x' @ A^T;  out (BT,out) h += scaling * u @ B^T   (compute copies of A and B),
// with x' = dropout(x) while LoRA dropout is active, else x.
void GPT2::lora_forward(int l, int m, const Tensor& out, const Tensor& x) const {
  const LoraSlot& s = lora_slot(l, m);
  if (!s.on) return;
  const int64_t BT = x.shape.d[0], r = options_.lora.r;
  Tensor u = view(lora_u_, {BT, r});
  device_.matmul(u, lora_input(l, m, x), lora_compute_.slice_flat(s.a->offset, s.a->shape), false,
                 true);
  device_.matmul(out, u, lora_compute_.slice_flat(s.b->offset, s.b->shape), false, true,
                 options_.lora.scaling(), 1.0f);
}

// With s = scaling and u = x @ A^T (recomputed: (BT,r) is cheap and needs no saving):
//   dB (out,r) += s * dout^T @ u      du (BT,r) = s * dout @ B
//   dA (r,in)  += du^T @ x            dx (BT,in) += du @ A
// With dropout (mask D, the forward's: same stream): x' = D x replaces x above, and the input
// gradient D (du @ A) is written to dx (=) -- a mask cannot be folded into a GEMM's
// accumulation -- so the caller adds the base layer's dout @ W^T to it afterwards.
void GPT2::lora_backward(int l, int m, const Tensor& dx, const Tensor& dout,
                         const Tensor& x_in) const {
  const LoraSlot& s = lora_slot(l, m);
  if (!s.on) return;
  const int64_t BT = x_in.shape.d[0], r = options_.lora.r;
  const float scale = options_.lora.scaling();
  const Tensor A = lora_compute_.slice_flat(s.a->offset, s.a->shape);
  const Tensor Bm = lora_compute_.slice_flat(s.b->offset, s.b->shape);
  Tensor u = view(lora_u_, {BT, r});
  Tensor du = view(lora_du_, {BT, r});
  const Tensor x = lora_input(l, m, x_in);
  device_.matmul(u, x, A, false, true);
  device_.matmul(lora_grads_.slice_flat(s.b->offset, s.b->shape), dout, u, true, false, scale,
                 1.0f);
  device_.matmul(du, dout, Bm, false, false, scale, 0.0f);
  device_.matmul(lora_grads_.slice_flat(s.a->offset, s.a->shape), du, x, true, false, 1.0f, 1.0f);
  if (!lora_dropout_active(l, m)) {
    device_.matmul(dx, du, A, false, false, 1.0f, 1.0f);
    return;
  }
  device_.matmul(dx, du, A, false, false);
  device_.dropout(dx, dx, options_.lora.dropout, lora_dropout_seed_, lora_dropout_stream(l, m));
}

}  // namespace ct
