#include "core/train/adapter_files.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "core/dtype.h"
#include "core/error.h"
#include "core/io/json_file.h"
#include "core/io/safetensors.h"
#include "core/model/model_config.h"
#include "core/registry.h"
#include "core/train/model_files.h"

namespace ct {
namespace fs = std::filesystem;

namespace {

constexpr const char* kPeftPrefix = "base_model.model.";

// A stored adapter name without PEFT's prefix ("base_model.model.") and the model body's
// ("transformer." for GPT-2: the rest of model.peft_prefix()), where present.
std::string strip(std::string name, const Model& model) {
  const std::string body = model.peft_prefix().substr(std::strlen(kPeftPrefix));
  for (const std::string& p : {std::string(kPeftPrefix), body})
    if (!p.empty() && name.rfind(p, 0) == 0) name = name.substr(p.size());
  return name;
}

}  // namespace

void save_adapter(const std::string& dir, const Model& model, const std::string& base_model) {
  CT_REQUIRE(model.lora(), "save_adapter: the model has no LoRA adapters");
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) fail(ErrorKind::kIo, "cannot create output folder '" + dir + "': " + ec.message());
  const std::map<std::string, std::vector<float>> named = model.download_lora_map();
  std::vector<SafetensorsTensor> tensors;
  for (const ParamInfo& p : model.lora_params()) {
    const std::vector<float>& v = named.at(p.name);
    SafetensorsTensor t;
    t.name = model.peft_prefix() + p.name;
    t.dtype = DType::f32;
    t.shape.assign(p.shape.d.begin(), p.shape.d.begin() + p.shape.ndim);
    t.data = std::as_bytes(std::span<const float>(v));
    tensors.push_back(std::move(t));
  }
  write_safetensors((fs::path(dir) / kAdapterWeights).string(), tensors, {{"format", "pt"}});
  const LoraOptions& lo = model.adapters()->options();
  nlohmann::json c = {{"peft_type", "LORA"},
                      {"task_type", "CAUSAL_LM"},
                      {"base_model_name_or_path", base_model},
                      {"r", lo.r},
                      {"lora_alpha", lo.alpha},
                      {"lora_dropout", std::round(double{lo.dropout} * 1e6) / 1e6},
                      {"target_modules", lo.target_modules},
                      {"fan_in_fan_out", model.peft_fan_in_fan_out()},
                      {"bias", "none"},
                      {"inference_mode", true},
                      {"init_lora_weights", true},
                      {"modules_to_save", nullptr},
                      {"layers_to_transform", nullptr},
                      {"layers_pattern", nullptr},
                      {"rank_pattern", nlohmann::json::object()},
                      {"alpha_pattern", nlohmann::json::object()},
                      {"use_rslora", false},
                      {"use_dora", false},
                      {"revision", nullptr}};
  write_json_file((fs::path(dir) / kAdapterConfig).string(), c);
}

LoraOptions read_adapter_config(const std::string& dir) {
  const std::string path = (fs::path(dir) / kAdapterConfig).string();
  nlohmann::json j;
  try {
    j = read_json_file(path);
  } catch (const Error& e) {
    fail(ErrorKind::kInvalidArgument, e.what());
  }
  auto refuse = [&](const char* key, const char* why) {
    fail(ErrorKind::kInvalidArgument,
         path + ": '" + key + "': " + j[key].dump() + " is not supported (" + why + ")");
  };
  if (!j.is_object()) fail(ErrorKind::kInvalidArgument, path + ": not a JSON object");
  if (j.value("peft_type", "LORA") != "LORA") refuse("peft_type", "LoRA only");
  for (const char* key : {"use_dora", "use_rslora"})
    if (j.contains(key) && !(j[key].is_boolean() && !j[key].get<bool>()))
      refuse(key, "plain LoRA scaling alpha / r");
  if (j.contains("bias") && j["bias"] != "none") refuse("bias", "biases stay frozen");
  for (const char* key : {"modules_to_save", "layers_to_transform", "layers_pattern"})
    if (j.contains(key) && !j[key].is_null()) refuse(key, "adapters on every layer, nothing else");
  for (const char* key : {"rank_pattern", "alpha_pattern"})
    if (j.contains(key) && !(j[key].is_null() || (j[key].is_object() && j[key].empty())))
      refuse(key, "one rank and alpha for every layer");
  if (j.contains("fan_in_fan_out") && !(j["fan_in_fan_out"].is_boolean()))
    refuse("fan_in_fan_out", "a boolean");
  LoraOptions lo;
  if (!j.contains("r") || !j["r"].is_number_integer() || j["r"].get<int>() <= 0)
    fail(ErrorKind::kInvalidArgument, path + ": 'r' must be a positive integer");
  lo.r = j["r"].get<int>();
  if (j.contains("lora_alpha")) {
    if (!j["lora_alpha"].is_number())
      fail(ErrorKind::kInvalidArgument, path + ": 'lora_alpha' is not a number");
    lo.alpha = j["lora_alpha"].get<float>();
  }
  if (j.contains("lora_dropout") && !j["lora_dropout"].is_null()) {
    const nlohmann::json& d = j["lora_dropout"];
    if (!d.is_number() || !(d.get<double>() >= 0.0 && d.get<double>() < 1.0))
      fail(ErrorKind::kInvalidArgument, path + ": 'lora_dropout' must be a number in [0, 1)");
    lo.dropout = d.get<float>();
  }
  if (!j.contains("target_modules") || !j["target_modules"].is_array() ||
      j["target_modules"].empty())
    fail(ErrorKind::kInvalidArgument,
         path + ": 'target_modules' must be a non-empty list of module names");
  lo.target_modules.clear();
  for (const auto& t : j["target_modules"]) {
    if (!t.is_string())
      fail(ErrorKind::kInvalidArgument, path + ": 'target_modules' holds " + t.dump());
    lo.target_modules.push_back(t.get<std::string>());
  }
  return lo;
}

void load_adapter(const std::string& dir, Model& model) {
  CT_REQUIRE(model.lora(), "load_adapter: the model has no LoRA adapters");
  const std::string path = (fs::path(dir) / kAdapterWeights).string();
  SafetensorsFile f;
  try {
    f = read_safetensors(path);
  } catch (const Error& e) {
    fail(ErrorKind::kInvalidArgument, e.what());
  }
  std::map<std::string, std::string> stored;  // bare -> as stored
  for (const std::string& n : f.names()) stored[strip(n, model)] = n;
  std::map<std::string, std::vector<float>> named;
  for (const ParamInfo& p : model.lora_params()) {
    auto it = stored.find(p.name);
    if (it == stored.end())
      fail(ErrorKind::kInvalidArgument, path + ": adapter '" + p.name + "' is missing");
    const SafetensorsInfo& info = f.info(it->second);
    if (info.to_shape() != p.shape)
      fail(ErrorKind::kInvalidArgument, path + ": '" + it->second + "' has shape " +
                                            info.to_shape().str() + ", r and the model need " +
                                            p.shape.str());
    std::vector<float> v(static_cast<size_t>(p.numel));
    std::span<const std::byte> bytes = f.data(it->second);
    if (info.dtype == DType::f32) {
      std::memcpy(v.data(), bytes.data(), v.size() * sizeof(float));
    } else if (info.dtype == DType::f16 || info.dtype == DType::bf16) {
      for (size_t i = 0; i < v.size(); ++i) v[i] = read_as_f32(bytes.data(), info.dtype, i);
    } else {
      fail(ErrorKind::kInvalidArgument, path + ": '" + it->second + "' is " +
                                            safetensors_dtype_name(info.dtype) +
                                            ", expected F32, F16 or BF16");
    }
    named.emplace(p.name, std::move(v));
  }
  for (const auto& [bare, name] : stored)
    if (named.count(bare) == 0)
      fail(ErrorKind::kInvalidArgument,
           path + ": tensor '" + name + "' is not an adapter of this model (r " +
               std::to_string(model.adapters()->options().r) + ", target_modules as configured)");
  model.upload_lora(named);
}

void merge_lora(const std::string& base_dir, const std::string& adapter_dir,
                const std::string& output_dir) {
  const LoraOptions lo = read_adapter_config(adapter_dir);
  const ModelConfig base_config = read_model_config(base_dir);
  auto device = open_device("cpu");
  ModelOptions opts;
  opts.lora = lo;
  std::unique_ptr<Model> model = make_model(*device, base_config, /*with_grads=*/false, opts);
  load_weights_from_folder(base_dir, *model);
  load_adapter(adapter_dir, *model);
  std::map<std::string, std::vector<float>> base = model->download_param_map();
  const std::map<std::string, std::vector<float>> ad = model->download_lora_map();
  const double s = static_cast<double>(lo.alpha) / lo.r;
  const bool in_out = model->peft_fan_in_fan_out();  // GPT-2's Conv1D [in, out], else [out, in]
  for (const ParamInfo& a : model->lora_params()) {
    const std::string tail = ".lora_A.weight";
    if (a.name.size() < tail.size() ||
        a.name.compare(a.name.size() - tail.size(), tail.size(), tail) != 0)
      continue;
    const std::string module = a.name.substr(0, a.name.size() - tail.size());
    const std::vector<float>& A = ad.at(a.name);                     // [r, in]
    const std::vector<float>& B = ad.at(module + ".lora_B.weight");  // [out, r]
    std::vector<float>& W = base.at(module + ".weight");
    const int64_t r = lo.r, in = a.shape.d[1], out = static_cast<int64_t>(B.size()) / r;
    for (int64_t i = 0; i < in; ++i)
      for (int64_t o = 0; o < out; ++o) {
        double d = 0;
        for (int64_t k = 0; k < r; ++k)
          d += static_cast<double>(A[static_cast<size_t>(k * in + i)]) *
               static_cast<double>(B[static_cast<size_t>(o * r + k)]);
        float& w = W[static_cast<size_t>(in_out ? i * out + o : o * in + i)];
        w = static_cast<float>(static_cast<double>(w) + s * d);
      }
  }
  std::unique_ptr<Model> merged = make_model(*device, base_config, /*with_grads=*/false);
  merged->upload_params(base);
  save_model(output_dir, *merged, base_dir);
}

}  // namespace ct
