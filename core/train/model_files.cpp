#include "core/train/model_files.h"

#include <cstring>
#include <filesystem>
#include <map>
#include <vector>

#include "core/error.h"
#include "core/io/json_file.h"
#include "core/io/safetensors.h"

namespace ct {
namespace fs = std::filesystem;

void save_model(const std::string& dir, const GPT2& model) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) fail(ErrorKind::kIo, "cannot create output folder '" + dir + "': " + ec.message());
  std::vector<float> flat = model.download_params();
  std::vector<SafetensorsTensor> tensors;
  for (const ParamInfo& p : model.params()) {
    SafetensorsTensor t;
    t.name = p.name;
    t.dtype = DType::f32;
    t.shape.assign(p.shape.d.begin(), p.shape.d.begin() + p.shape.ndim);
    t.data =
        std::as_bytes(std::span<const float>(flat.data() + p.offset, static_cast<size_t>(p.numel)));
    tensors.push_back(std::move(t));
  }
  write_safetensors((fs::path(dir) / "model.safetensors").string(), tensors, {{"format", "pt"}});
  write_json_file((fs::path(dir) / "config.json").string(), model.config().to_hf_json());
}

std::unique_ptr<GPT2> load_model(const std::string& dir, Device& device) {
  std::string config_path = (fs::path(dir) / "config.json").string();
  std::string weights_path = (fs::path(dir) / "model.safetensors").string();
  if (!fs::is_directory(dir))
    fail(ErrorKind::kInvalidArgument, "--model-path '" + dir + "' is not a folder");
  GPT2Config config;
  try {
    config = GPT2Config::from_hf_json(read_json_file(config_path));
  } catch (const Error& e) {
    fail(e.kind() == ErrorKind::kIo ? ErrorKind::kInvalidArgument : e.kind(),
         config_path + ": " + e.what());
  }
  auto model = std::make_unique<GPT2>(device, config, /*with_grads=*/false);
  load_weights(weights_path, *model);
  return model;
}

void load_weights(const std::string& weights_path, GPT2& model) {
  const GPT2Config& config = model.config();
  SafetensorsFile file;
  try {
    file = read_safetensors(weights_path);
  } catch (const Error& e) {
    fail(ErrorKind::kInvalidArgument, e.what());
  }
  std::map<std::string, std::vector<float>> named;
  for (const ParamInfo& p : model.params()) {
    // HF checkpoints saved from GPT2LMHeadModel prefix names with "transformer.".
    std::string key = file.contains(p.name) ? p.name : "transformer." + p.name;
    if (!file.contains(key))
      fail(ErrorKind::kInvalidArgument, weights_path + ": tensor '" + p.name + "' is missing");
    const SafetensorsInfo& info = file.info(key);
    if (info.dtype != DType::f32)
      fail(ErrorKind::kInvalidArgument, weights_path + ": tensor '" + key + "' is " +
                                            safetensors_dtype_name(info.dtype) + ", expected F32");
    if (info.to_shape() != p.shape)
      fail(ErrorKind::kInvalidArgument, weights_path + ": tensor '" + key + "' has shape " +
                                            info.to_shape().str() + ", the config needs " +
                                            p.shape.str());
    std::vector<float> v(static_cast<size_t>(p.numel));
    std::memcpy(v.data(), file.data(key).data(), v.size() * sizeof(float));
    named.emplace(p.name, std::move(v));
  }
  for (const std::string& name : file.names()) {
    std::string bare = name.rfind("transformer.", 0) == 0 ? name.substr(12) : name;
    if (named.count(bare) == 0 && bare != "lm_head.weight" &&
        bare.find(".attn.bias") == std::string::npos &&
        bare.find(".attn.masked_bias") == std::string::npos)
      fail(ErrorKind::kInvalidArgument,
           weights_path + ": tensor '" + name + "' is not part of a GPT-2 with " + config.str());
  }
  model.upload_params(named);
}

}  // namespace ct
