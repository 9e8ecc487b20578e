// A model on disk in the layout Hugging Face's GPT2LMHeadModel reads and writes: <dir>/config.json
// and the weights as <dir>/model.safetensors or as shards listed by
// <dir>/model.safetensors.index.json, with the tokenizer files beside them when there are any.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/model/gpt2.h"

namespace ct {

// The tokenizer files Hugging Face keeps beside a model, copied along by save_model.
inline const std::vector<std::string>& tokenizer_file_names() {
  static const std::vector<std::string> names = {"tokenizer.json", "vocab.json", "merges.txt",
                                                 "tokenizer_config.json",
                                                 "special_tokens_map.json"};
  return names;
}

// Copies every tokenizer file of `from` into `to` (atomically each); none is an error only
// when `from` has none.
void copy_tokenizer_files(const std::string& from, const std::string& to);

// Writes config.json and model.safetensors (fp32, HF GPT-2 names) into `dir` (created if
// missing), each atomically; then copies every tokenizer file of `tokenizer_dir` (when not empty)
// into `dir`, also atomically.
void save_model(const std::string& dir, const GPT2& model, const std::string& tokenizer_dir = "");

// The GPT-2 config of the model folder `dir` (GPT2Config::from_hf_json); errors name the file.
// `notice`, when given, receives GPT2Config::dropout_notice of the file.
GPT2Config read_model_config(const std::string& dir, std::string* notice = nullptr);

// Reads <dir>/config.json and the weights (load_weights_from_folder) onto `device`, without
// gradients. Errors name the file and what is wrong: missing file, a config that is not GPT-2,
// a tensor missing, of the wrong shape or dtype, or one the model does not have.
std::unique_ptr<GPT2> load_model(const std::string& dir, Device& device);

// Reads the weights of `model` from the folder `dir`: model.safetensors, else the shards named
// by model.safetensors.index.json (each tensor in the shard the index names). A folder with only
// pytorch_model.bin is refused (safetensors only). See load_weights for the rules per tensor.
void load_weights_from_folder(const std::string& dir, GPT2& model);

// Reads the weights of `model` from one safetensors file with HF GPT-2 names. Per tensor: a
// "transformer." prefix is accepted; F32, F16 and BF16 are read (16-bit values widened exactly);
// every parameter must be present with the model's shape; "lm_head.weight" is accepted only
// when it equals wte (a tied head; an untied one is refused); the attention-mask buffers older
// transformers saved (".attn.bias", ".attn.masked_bias") are ignored; any other tensor is
// refused by name.
void load_weights(const std::string& weights_path, GPT2& model);

}  // namespace ct
