// GPT-2's LoRA sites (core/model/lora.h holds the adapters themselves) and the glue between the
// blocks' linear layers and the adapters.
#include "core/error.h"
#include "core/model/gpt2.h"

namespace ct {

namespace {

// The four linear layers of a block, in site order: name, in and out widths (in units of C).
struct GPT2Linear {
  const char* name;
  int in_c, out_c;
};
constexpr GPT2Linear kLinears[4] = {
    {"attn.c_attn", 1, 3}, {"attn.c_proj", 1, 1}, {"mlp.c_fc", 1, 4}, {"mlp.c_proj", 4, 1}};

}  // namespace

std::vector<LoraSite> GPT2::lora_sites(const GPT2Config& config) {
  std::vector<LoraSite> sites;
  const int64_t C = config.n_embd;
  for (int l = 0; l < config.n_layer; ++l)
    for (const GPT2Linear& m : kLinears)
      sites.push_back({"h." + std::to_string(l) + "." + m.name, m.in_c * C, m.out_c * C});
  return sites;
}

LoraOptions GPT2::resolved_lora(LoraOptions lora) {
  if (lora.target_modules.empty()) lora.target_modules = {"c_attn"};
  return lora;
}

int64_t GPT2::lora_parameter_count(const GPT2Config& config, const LoraOptions& lora) {
  return LoraAdapters::parameter_count(lora_sites(config), resolved_lora(lora));
}

// The frozen base (LoRA) gets dinp only (ModelBase::linear_backward_input adds the adapter's
// part); the full model also its weight and bias gradients.
void GPT2::linear_bwd(int l, int m, const Tensor& dinp, const Tensor& dw, const Tensor& db,
                      const Tensor& dout, const Tensor& inp, const Tensor& w,
                      const Tensor* dbias_src) const {
  linear_backward_input(l, m, dinp, dout, inp, w, /*transpose_w=*/true);
  if (lora()) return;
  device_.matmul(dw, inp, dout, true, false, 1.0f, 1.0f);
  device_.bias_backward(db, dbias_src ? *dbias_src : dout);
}

}  // namespace ct
