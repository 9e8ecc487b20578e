// LoraAdapters: the adapter table, its buffers and the forward and backward of the low-rank
// update. A site whose output is a column range of a wider tensor (a fused projection) keeps B's
// compute copy in a zero-padded [width, r] block, so the update is one GEMM into the whole rows
// (the zero rows add exact zeros), and its B gradient is taken from a padded scratch.
#include "core/model/lora.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/philox.h"

namespace ct {

bool lora_targets(const std::vector<std::string>& targets, const std::string& module) {
  for (const std::string& t : targets) {
    if (module == t) return true;
    if (module.size() > t.size() && module.compare(module.size() - t.size(), t.size(), t) == 0 &&
        module[module.size() - t.size() - 1] == '.')
      return true;
  }
  return false;
}

namespace {

bool separate_compute(const std::vector<LoraSite>& sites, const LoraOptions& o, DType compute) {
  if (compute != DType::f32) return true;
  for (const LoraSite& s : sites)
    if (s.width() != s.out && lora_targets(o.target_modules, s.module)) return true;
  return false;
}

// "attn.c_attn" of "h.0.attn.c_attn": the name after its layer index.
std::string within_layer(const std::string& module) {
  size_t start = 0;
  while (start < module.size()) {
    size_t end = module.find('.', start);
    if (end == std::string::npos) break;
    const std::string part = module.substr(start, end - start);
    if (!part.empty() && part.find_first_not_of("0123456789") == std::string::npos)
      return module.substr(end + 1);
    start = end + 1;
  }
  return module;
}

// Elements of the compute copy: A as stored, B padded to its site's width.
int64_t compute_count(const std::vector<LoraSite>& sites, const LoraOptions& o) {
  int64_t n = 0;
  for (const LoraSite& s : sites)
    if (lora_targets(o.target_modules, s.module)) n += int64_t{o.r} * (s.in + s.width());
  return n;
}

}  // namespace

LoraAdapters::LoraAdapters(Device& device, const LoraOptions& options, std::vector<LoraSite> sites,
                           int layers, int64_t max_rank, DType compute, bool with_grads,
                           const std::string& family)
    : device_(device), options_(options), sites_(std::move(sites)) {
  slots_.assign(sites_.size(), Slot{});
  if (!options_.enabled()) return;
  const LoraOptions& lo = options_;
  CT_REQUIRE(lo.r <= max_rank, "--lora-r " + std::to_string(lo.r) + ": must be at most " +
                                   std::to_string(max_rank) + " (the model width)");
  CT_REQUIRE(std::isfinite(lo.alpha) && lo.alpha > 0.0f,
             "--lora-alpha " + std::to_string(lo.alpha) + ": must be > 0");
  CT_REQUIRE(!lo.target_modules.empty(), "--lora-target-modules: names no module");
  CT_REQUIRE(std::isfinite(lo.dropout) && lo.dropout >= 0.0f && lo.dropout < 1.0f,
             "--lora-dropout " + std::to_string(lo.dropout) + ": must be in [0, 1)");
  // Targets are checked against the first layer's sites, whose names the message lists.
  const size_t per_layer = layers > 0 ? sites_.size() / static_cast<size_t>(layers) : 0;
  std::string names;
  for (size_t i = 0; i < per_layer; ++i)
    names += (names.empty() ? "" : ", ") + within_layer(sites_[i].module);
  for (const std::string& t : lo.target_modules) {
    bool any = false;
    for (size_t i = 0; i < per_layer; ++i) any = any || lora_targets({t}, sites_[i].module);
    CT_REQUIRE(any, "--lora-target-modules: '" + t + "' matches no " + family +
                        " layer (its layers: " + names + ", or their last names)");
  }
  const int64_t r = lo.r;
  int64_t offset = 0, coffset = 0;
  std::vector<std::pair<size_t, int>> owner;  // slot, 0 = A / 1 = B; pointers taken after
  for (size_t i = 0; i < sites_.size(); ++i) {
    const LoraSite& s = sites_[i];
    if (!lora_targets(lo.target_modules, s.module)) continue;
    slots_[i].on = true;
    padded_ = padded_ || s.width() != s.out;
    for (int ab = 0; ab < 2; ++ab) {
      ParamInfo p;
      p.name = s.module + (ab == 0 ? ".lora_A.weight" : ".lora_B.weight");
      p.shape = ab == 0 ? Shape{r, s.in} : Shape{s.out, r};
      p.offset = offset;
      p.numel = p.shape.numel();
      p.decay = true;
      offset += p.numel;
      table_.push_back(p);
      owner.emplace_back(i, ab);
    }
    slots_[i].a_compute = coffset;
    slots_[i].b_compute = coffset + r * s.in;
    coffset += r * (s.in + s.width());
  }
  for (size_t k = 0; k < table_.size(); ++k)
    (owner[k].second == 0 ? slots_[owner[k].first].a : slots_[owner[k].first].b) = &table_[k];
  count_ = offset;
  compute_count_ = coffset;
  CT_CHECK(count_ == parameter_count(sites_, options_) &&
               compute_count_ == compute_count(sites_, options_),
           "LoRA table disagrees with its counts");

  params_ = device_.empty({count_}, DType::f32, MemCategory::kWeights);
  if (separate_compute(sites_, options_, compute)) {
    compute_ = device_.empty({compute_count_}, compute, MemCategory::kWeights);
    if (padded_) device_.fill(compute_, 0.0f);  // the padding rows stay zero
  } else {
    compute_ = params_;
  }
  if (with_grads) grads_ = device_.empty({count_}, DType::f32, MemCategory::kGrads);
}

int64_t LoraAdapters::parameter_count(const std::vector<LoraSite>& sites, const LoraOptions& o) {
  if (!o.enabled()) return 0;
  int64_t n = 0;
  for (const LoraSite& s : sites)
    if (lora_targets(o.target_modules, s.module)) n += int64_t{o.r} * (s.in + s.out);
  return n;
}

int64_t LoraAdapters::weight_bytes(const std::vector<LoraSite>& sites, const LoraOptions& o,
                                   DType compute) {
  if (!o.enabled()) return 0;
  const int64_t master = parameter_count(sites, o) * 4;
  if (!separate_compute(sites, o, compute)) return master;
  return master + compute_count(sites, o) * static_cast<int64_t>(dtype_size(compute));
}

// u [BT, r] h; with gradients du [BT, r] h, the dropped-out input [BT, widest adapted input] h
// (dropout only), the padded B gradient [widest padded width, r] f32 and, with dropout, the
// masked input gradient [BT, widest padded input] f32 (fused sites only).
int64_t LoraAdapters::activation_bytes(const std::vector<LoraSite>& sites, const LoraOptions& o,
                                       int64_t BT, DType h, bool with_grads) {
  if (!o.enabled()) return 0;
  const int64_t hs = static_cast<int64_t>(dtype_size(h)), r = o.r;
  int64_t in = 0, pad = 0, pad_in = 0;
  for (const LoraSite& s : sites) {
    if (!lora_targets(o.target_modules, s.module)) continue;
    in = std::max(in, s.in);
    if (s.width() != s.out) pad = std::max(pad, s.width()), pad_in = std::max(pad_in, s.in);
  }
  int64_t n = BT * r * hs;
  if (!with_grads) return n;
  n += BT * r * hs + pad * r * 4;
  if (o.dropout > 0.0f) n += BT * in * hs + BT * pad_in * 4;
  return n;
}

void LoraAdapters::allocate(int64_t BT, DType h, bool with_grads) {
  release();
  if (!enabled()) return;
  auto act = [&](int64_t n, DType dt) { return device_.empty({n}, dt, MemCategory::kActivations); };
  const int64_t r = options_.r;
  int64_t in = 0, pad = 0, pad_in = 0;
  for (size_t i = 0; i < sites_.size(); ++i) {
    if (!slots_[i].on) continue;
    in = std::max(in, sites_[i].in);
    if (sites_[i].width() != sites_[i].out)
      pad = std::max(pad, sites_[i].width()), pad_in = std::max(pad_in, sites_[i].in);
  }
  u_ = act(BT * r, h);
  if (!with_grads) return;
  du_ = act(BT * r, h);
  if (pad > 0) dpad_ = act(pad * r, DType::f32);
  if (options_.dropout > 0.0f) x_ = act(BT * in, h);
  if (options_.dropout > 0.0f && pad_in > 0) dxs_ = act(BT * pad_in, DType::f32);
}

void LoraAdapters::release() {
  u_ = du_ = x_ = dpad_ = dxs_ = Tensor();
}

Tensor LoraAdapters::grads() const {
  if (!grads_.defined())
    fail(ErrorKind::kInvalidArgument, "the LoRA adapters were created without gradients");
  return grads_;
}

void LoraAdapters::init(uint64_t seed, uint64_t first_stream) {
  std::vector<float> host(static_cast<size_t>(count_), 0.0f);
  for (size_t k = 0; k < table_.size(); ++k) {
    const ParamInfo& p = table_[k];
    if (p.name.find(".lora_A.") == std::string::npos) continue;  // B starts at zero
    const float bound = 1.0f / std::sqrt(static_cast<float>(p.shape.d[1]));
    Philox rng(seed, first_stream + k);
    for (int64_t j = 0; j < p.numel; ++j)
      host[static_cast<size_t>(p.offset + j)] =
          bound * (2.0f * rng.uniform(static_cast<uint64_t>(j)) - 1.0f);
  }
  if (count_ > 0) device_.upload(params_, host.data(), host.size() * sizeof(float));
  refresh_compute();
}

void LoraAdapters::refresh_compute() {
  if (!enabled() || compute_.buffer == params_.buffer) return;
  if (!padded_) {
    device_.copy(compute_, params_);
    return;
  }
  // Per adapter, runs of adjacent tables merged where the compute layout keeps them adjacent.
  int64_t src = 0, dst = 0, n = 0;
  auto flush = [&] {
    if (n > 0) device_.copy(compute_.slice_flat(dst, {n}), params_.slice_flat(src, {n}));
    n = 0;
  };
  for (size_t i = 0; i < sites_.size(); ++i) {
    const Slot& s = slots_[i];
    if (!s.on) continue;
    const int64_t r = options_.r;
    const std::pair<const ParamInfo*, int64_t> parts[2] = {
        {s.a, s.a_compute}, {s.b, s.b_compute + sites_[i].out_offset * r}};
    for (const auto& [p, at] : parts) {
      if (n > 0 && src + n == p->offset && dst + n == at) {
        n += p->numel;
        continue;
      }
      flush();
      src = p->offset;
      dst = at;
      n = p->numel;
    }
  }
  flush();
}

std::map<std::string, std::vector<float>> LoraAdapters::download_map() const {
  std::vector<float> flat(static_cast<size_t>(count_));
  if (count_ > 0) device_.download(flat.data(), params_, flat.size() * sizeof(float));
  std::map<std::string, std::vector<float>> named;
  for (const ParamInfo& p : table_)
    named[p.name] = std::vector<float>(flat.begin() + p.offset, flat.begin() + p.offset + p.numel);
  return named;
}

void LoraAdapters::upload(const std::map<std::string, std::vector<float>>& named) {
  CT_REQUIRE(enabled(), "upload_lora: the model has no LoRA adapters");
  std::vector<float> flat(static_cast<size_t>(count_));
  for (const auto& [name, values] : named) {
    bool known = false;
    for (const ParamInfo& p : table_) known = known || p.name == name;
    if (!known) fail(ErrorKind::kInvalidArgument, "upload_lora: unknown adapter '" + name + "'");
  }
  for (const ParamInfo& p : table_) {
    auto it = named.find(p.name);
    if (it == named.end())
      fail(ErrorKind::kInvalidArgument, "upload_lora: missing adapter '" + p.name + "'");
    if (static_cast<int64_t>(it->second.size()) != p.numel)
      fail(ErrorKind::kInvalidArgument,
           "upload_lora: '" + p.name + "' has " + std::to_string(it->second.size()) +
               " values, expected " + std::to_string(p.numel) + " for shape " + p.shape.str());
    std::copy(it->second.begin(), it->second.end(), flat.begin() + p.offset);
  }
  device_.upload(params_, flat.data(), flat.size() * sizeof(float));
  refresh_compute();
}

uint64_t LoraAdapters::dropout_stream(int site) const {
  return kDropoutStream + static_cast<uint64_t>(dropout_draw_) * sites_.size() +
         static_cast<uint64_t>(site);
}

bool LoraAdapters::dropout_active(int site) const {
  return adapted(site) && options_.dropout > 0.0f && dropout_draw_ >= 0;
}

Tensor LoraAdapters::input(int site, const Tensor& x) const {
  if (!dropout_active(site)) return x;
  CT_REQUIRE(x_.defined(), "LoRA dropout needs the training buffers (a model with gradients)");
  Tensor xd = x_.slice_flat(0, {x.shape.d[0], x.shape.d[1]});
  device_.dropout(xd, x, options_.dropout, dropout_seed_, dropout_stream(site));
  return xd;
}

// u (BT,r) h = x' @ A^T;  out (BT,width) h += scaling * u @ B^T  (B zero-padded to the width)
void LoraAdapters::forward(int site, const Tensor& out, const Tensor& x) const {
  if (!adapted(site)) return;
  const Slot& s = slots_[static_cast<size_t>(site)];
  const int64_t BT = x.shape.d[0], r = options_.r;
  const int64_t in = sites_[static_cast<size_t>(site)].in;
  const int64_t width = sites_[static_cast<size_t>(site)].width();
  Tensor u = u_.slice_flat(0, {BT, r});
  device_.matmul(u, input(site, x), compute_.slice_flat(s.a_compute, {r, in}), false, true);
  device_.matmul(out, u, compute_.slice_flat(s.b_compute, {width, r}), false, true,
                 options_.scaling(), 1.0f);
}

// With s = scaling and u = x' @ A^T (recomputed: (BT,r) is cheap and needs no saving):
//   dB (out,r) += s * dout^T @ u     (for a padded site: the whole [width, r] into dpad_, then
//                                     its rows of this site added)
//   du (BT,r) = s * dout @ B          dA (r,in) += du^T @ x'
//   dx (BT,in) += du @ A              (with dropout: dx (=) D (du @ A), D the forward's mask)
void LoraAdapters::backward(int site, const Tensor& dx, const Tensor& dout,
                            const Tensor& x_in) const {
  if (!adapted(site)) return;
  const Slot& s = slots_[static_cast<size_t>(site)];
  const LoraSite& ls = sites_[static_cast<size_t>(site)];
  const int64_t BT = x_in.shape.d[0], r = options_.r, width = ls.width();
  const float scale = options_.scaling();
  const Tensor A = compute_.slice_flat(s.a_compute, {r, ls.in});
  const Tensor Bpad = compute_.slice_flat(s.b_compute, {width, r});
  const Tensor dA = grads().slice_flat(s.a->offset, s.a->shape);
  const Tensor dB = grads_.slice_flat(s.b->offset, s.b->shape);
  Tensor u = u_.slice_flat(0, {BT, r});
  Tensor du = du_.slice_flat(0, {BT, r});
  const Tensor x = input(site, x_in);
  device_.matmul(u, x, A, false, true);
  if (width == ls.out) {
    device_.matmul(dB, dout, u, true, false, scale, 1.0f);
  } else {
    Tensor dpad = dpad_.slice_flat(0, {width, r});
    device_.matmul(dpad, dout, u, true, false, scale, 0.0f);
    device_.accumulate(dB.reshape({ls.out * r}), dpad_.slice_flat(ls.out_offset * r, {ls.out * r}));
  }
  device_.matmul(du, dout, Bpad, false, false, scale, 0.0f);
  device_.matmul(dA, du, x, true, false, 1.0f, 1.0f);
  if (!dropout_active(site)) {
    device_.matmul(dx, du, A, false, false, 1.0f, 1.0f);
    return;
  }
  device_.matmul(dx, du, A, false, false);
  device_.dropout(dx, dx, options_.dropout, dropout_seed_, dropout_stream(site));
}

void LoraAdapters::backward_add(int site, const Tensor& dx, const Tensor& dout,
                                const Tensor& x) const {
  if (!dropout_active(site)) {
    backward(site, dx, dout, x);
    return;
  }
  CT_REQUIRE(dxs_.defined() && dx.dtype == DType::f32,
             "LoraAdapters::backward_add: needs an f32 dx and a fused site's scratch");
  Tensor tmp = dxs_.slice_flat(0, dx.shape);
  backward(site, tmp, dout, x);
  device_.accumulate(dx.reshape({dx.numel()}), tmp.reshape({tmp.numel()}));
}

// =============================================================================================
// Model's LoRA helpers

const std::vector<ParamInfo>& Model::lora_params() const {
  static const std::vector<ParamInfo> none;
  return lora() ? adapters()->table() : none;
}

std::map<std::string, std::vector<float>> Model::download_lora_map() const {
  CT_REQUIRE(lora(), "download_lora_map: the model has no LoRA adapters");
  return adapters()->download_map();
}

void Model::upload_lora(const std::map<std::string, std::vector<float>>& named) {
  CT_REQUIRE(lora(), "upload_lora: the model has no LoRA adapters");
  adapters()->upload(named);
}

void Model::set_lora_dropout_draw(uint64_t seed, int64_t draw) {
  if (lora()) adapters()->set_dropout_draw(seed, draw);
}

}  // namespace ct
