// LoRA adapters on disk, as PEFT's save_pretrained writes them for GPT2LMHeadModel and
// LlamaForCausalLM (and Mistral / Qwen2):
//   adapter_config.json        peft_type LORA, r, lora_alpha, target_modules, fan_in_fan_out
//                              (true for GPT-2's Conv1D), ...
//   adapter_model.safetensors  Model::peft_prefix() + "<module>.lora_A.weight" [r, in] and
//                              "...lora_B.weight" [out, r], F32: "base_model.model.transformer.
//                              h.<l>.attn.c_attn.lora_A.weight", "base_model.model.model.
//                              layers.<l>.self_attn.q_proj.lora_A.weight"
// and the merge of adapters into a full model (`crosstrain merge-lora`).
#pragma once

#include <string>

#include "core/model/lora.h"
#include "core/model/model.h"

namespace ct {

inline constexpr const char* kAdapterConfig = "adapter_config.json";
inline constexpr const char* kAdapterWeights = "adapter_model.safetensors";

// Writes adapter_config.json and adapter_model.safetensors into `dir` (created if missing), each
// atomically. `base_model` is recorded as base_model_name_or_path. The model must have LoRA.
void save_adapter(const std::string& dir, const Model& model, const std::string& base_model);

// The LoRA settings of <dir>/adapter_config.json. Refuses, naming the key, what crosstrain does
// not compute: a peft_type other than LORA, use_dora, use_rslora, bias other than "none",
// modules_to_save, rank_pattern / alpha_pattern, layers_to_transform, target_modules that is
// not a list of names; lora_dropout is accepted (it only acts in training).
LoraOptions read_adapter_config(const std::string& dir);

// Loads <dir>/adapter_model.safetensors into the model's adapters: every adapter present, F32
// (F16/BF16 widened), of its shape; names with PEFT's "base_model.model." and "transformer."
// prefixes (and GPT-2's "transformer.") or without them; any other tensor is refused by name.
void load_adapter(const std::string& dir, Model& model);

// The base model of `base_dir` with the adapters of `adapter_dir` merged in (W += alpha / r *
// B A in nn.Linear's [out, in] layout, A^T B^T in GPT-2's [in, out], in double precision,
// rounded once; a fused projection's rows are the q / k / v or gate / up tensor), written to
// `output_dir` as a full model (config.json, model.safetensors, the base's tokenizer files).
void merge_lora(const std::string& base_dir, const std::string& adapter_dir,
                const std::string& output_dir);

}  // namespace ct
