// A trained model on disk, in the form Hugging Face's GPT2LMHeadModel loads:
// <dir>/config.json and <dir>/model.safetensors (fp32, HF GPT-2 names).
#pragma once

#include <memory>
#include <string>

#include "core/device.h"
#include "core/model/gpt2.h"

namespace ct {

// Writes config.json and model.safetensors into `dir` (created if missing), each atomically.
void save_model(const std::string& dir, const GPT2& model);

// Reads <dir>/config.json and <dir>/model.safetensors onto `device` (without gradients).
// Errors name the file and what is wrong: missing file, a config that is not GPT-2, a tensor
// missing, of the wrong shape or dtype, or one the model does not have.
std::unique_ptr<GPT2> load_model(const std::string& dir, Device& device);

// Reads the weights of `model` from a safetensors file with HF GPT-2 names (a "transformer."
// prefix is accepted); every tensor must be present, F32, of the model's shape.
void load_weights(const std::string& weights_path, GPT2& model);

}  // namespace ct
