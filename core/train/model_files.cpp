#include "core/train/model_files.h"

#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/io/atomic_file.h"
#include "core/io/json_file.h"
#include "core/io/read_file.h"
#include "core/io/safetensors.h"

namespace ct {
namespace fs = std::filesystem;

namespace {

constexpr const char* kPrefix = "transformer.";

// The name without the "transformer." prefix GPT2LMHeadModel gives its body.
std::string bare_name(const std::string& name) {
  return name.rfind(kPrefix, 0) == 0 ? name.substr(std::strlen(kPrefix)) : name;
}

// Tensors by bare name, each from the file that holds it (one file, or the shards of an index).
class WeightFiles {
 public:
  void add(SafetensorsFile file) {
    files_.push_back(std::make_unique<SafetensorsFile>(std::move(file)));
    const SafetensorsFile& f = *files_.back();
    for (const std::string& name : f.names()) {
      auto [it, fresh] = where_.emplace(bare_name(name), Entry{&f, name});
      if (!fresh)
        fail(ErrorKind::kInvalidArgument,
             f.path() + ": tensor '" + name + "' is also in " + it->second.file->path());
    }
  }
  struct Entry {
    const SafetensorsFile* file;
    std::string name;  // as stored
  };
  const Entry* find(const std::string& bare) const {
    auto it = where_.find(bare);
    return it == where_.end() ? nullptr : &it->second;
  }
  const std::map<std::string, Entry>& all() const { return where_; }

 private:
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, Entry> where_;
};

SafetensorsFile open_safetensors(const std::string& path) {
  try {
    return read_safetensors(path);
  } catch (const Error& e) {
    fail(ErrorKind::kInvalidArgument, e.what());
  }
}

// The tensor as fp32 values: F32 copied, F16/BF16 widened (exact).
std::vector<float> read_as_f32(const WeightFiles::Entry& e) {
  const SafetensorsInfo& info = e.file->info(e.name);
  std::span<const std::byte> bytes = e.file->data(e.name);
  std::vector<float> v(static_cast<size_t>(info.numel()));
  if (info.dtype == DType::f32) {
    std::memcpy(v.data(), bytes.data(), v.size() * sizeof(float));
  } else if (info.dtype == DType::f16 || info.dtype == DType::bf16) {
    std::vector<uint16_t> h(v.size());
    std::memcpy(h.data(), bytes.data(), h.size() * sizeof(uint16_t));
    for (size_t i = 0; i < v.size(); ++i)
      v[i] = info.dtype == DType::f16 ? f16_to_f32(h[i]) : bf16_to_f32(h[i]);
  } else {
    fail(ErrorKind::kInvalidArgument, e.file->path() + ": tensor '" + e.name + "' is " +
                                          safetensors_dtype_name(info.dtype) +
                                          ", expected F32, F16 or BF16");
  }
  return v;
}

void load_from(const WeightFiles& files, const std::string& where, Model& model) {
  const std::string tied = model.tied_head_source();
  std::map<std::string, std::vector<float>> named;
  for (const ParamInfo& p : model.params()) {
    const WeightFiles::Entry* e = files.find(p.name);
    if (e == nullptr)
      fail(ErrorKind::kInvalidArgument, where + ": tensor '" + p.name + "' is missing");
    const SafetensorsInfo& info = e->file->info(e->name);
    if (info.to_shape() != p.shape)
      fail(ErrorKind::kInvalidArgument, e->file->path() + ": tensor '" + e->name + "' has shape " +
                                            info.to_shape().str() + ", the config needs " +
                                            p.shape.str());
    named.emplace(p.name, read_as_f32(*e));
  }
  for (const auto& [bare, e] : files.all()) {
    if (named.count(bare) != 0 || model.is_ignored_buffer(bare)) continue;
    if (bare == "lm_head.weight" && !tied.empty()) {
      // Tied: the head is the embedding (transformers saves it once; torch.save-style files
      // twice).
      const WeightFiles::Entry* emb = files.find(tied);
      if (e.file->info(e.name).to_shape() != emb->file->info(emb->name).to_shape() ||
          read_as_f32(e) != named.at(tied))
        fail(ErrorKind::kInvalidArgument,
             e.file->path() + ": tensor '" + e.name + "' differs from " + tied +
                 ": the config ties the LM head to the embedding (tie_word_embeddings true)");
      continue;
    }
    fail(ErrorKind::kInvalidArgument, e.file->path() + ": tensor '" + e.name +
                                          "' is not part of a " + model.model_type() + " with " +
                                          model.config_str());
  }
  model.upload_params(named);
}

}  // namespace

void save_model(const std::string& dir, const Model& model, const std::string& tokenizer_dir) {
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
  write_json_file((fs::path(dir) / "config.json").string(), model.hf_config());
  if (!tokenizer_dir.empty()) copy_tokenizer_files(tokenizer_dir, dir);
}

void copy_tokenizer_files(const std::string& from, const std::string& to) {
  std::error_code ec;
  if (fs::equivalent(from, to, ec)) return;
  for (const std::string& name : tokenizer_file_names()) {
    const fs::path src = fs::path(from) / name;
    if (fs::is_regular_file(src))
      write_file_atomic((fs::path(to) / name).string(), read_file_bytes(src.string()));
  }
}

ModelConfig read_model_config(const std::string& dir, std::string* notice) {
  if (!fs::is_directory(dir))
    fail(ErrorKind::kInvalidArgument, "model folder '" + dir + "' is not a folder");
  const std::string config_path = (fs::path(dir) / "config.json").string();
  if (!fs::exists(config_path) && fs::exists(fs::path(dir) / "adapter_config.json"))
    fail(ErrorKind::kInvalidArgument,
         dir +
             " holds LoRA adapters, not a model: merge them into their base first (crosstrain "
             "merge-lora --model-name-or-path BASE --adapter " +
             dir + " --output-dir MERGED)");
  try {
    nlohmann::json j = read_json_file(config_path);
    ModelConfig config = ModelConfig::from_hf_json(j);
    if (notice != nullptr) *notice = config.is_llama() ? "" : GPT2Config::dropout_notice(j);
    return config;
  } catch (const Error& e) {
    fail(e.kind() == ErrorKind::kIo ? ErrorKind::kInvalidArgument : e.kind(),
         config_path + ": " + e.what());
  }
}

std::unique_ptr<Model> load_model(const std::string& dir, Device& device,
                                  const ModelOptions& options) {
  const ModelConfig config = read_model_config(dir);
  std::unique_ptr<Model> model = make_model(device, config, /*with_grads=*/false, options);
  load_weights_from_folder(dir, *model);
  return model;
}

void load_weights_from_folder(const std::string& dir, Model& model) {
  const fs::path single = fs::path(dir) / "model.safetensors";
  const fs::path index = fs::path(dir) / "model.safetensors.index.json";
  if (fs::exists(single) || !fs::exists(index)) {
    if (!fs::exists(single) && fs::exists(fs::path(dir) / "pytorch_model.bin"))
      fail(ErrorKind::kInvalidArgument,
           dir +
               ": only pytorch_model.bin is there; crosstrain reads safetensors (save it with "
               "transformers' save_pretrained, safe_serialization=True)");
    load_weights(single.string(), model);
    return;
  }
  // Sharded: {"metadata": {...}, "weight_map": {tensor: shard file}}.
  const nlohmann::json j = read_json_file(index.string());
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
    fail(ErrorKind::kInvalidArgument, index.string() + ": no \"weight_map\" object");
  std::set<std::string> shards;
  for (const auto& [tensor, file] : j["weight_map"].items()) {
    if (!file.is_string())
      fail(ErrorKind::kInvalidArgument,
           index.string() + ": weight_map[\"" + tensor + "\"] is not a file name");
    const std::string f = file.get<std::string>();
    if (f.empty() || f.find('/') != std::string::npos || f[0] == '.')
      fail(ErrorKind::kInvalidArgument, index.string() + ": weight_map[\"" + tensor +
                                            "\"] names '" + f + "', not a file in the folder");
    shards.insert(f);
  }
  WeightFiles files;
  for (const std::string& f : shards) files.add(open_safetensors((fs::path(dir) / f).string()));
  for (const auto& [tensor, file] : j["weight_map"].items()) {
    const WeightFiles::Entry* e = files.find(bare_name(tensor));
    if (e == nullptr || fs::path(e->file->path()).filename() != file.get<std::string>())
      fail(ErrorKind::kInvalidArgument,
           index.string() + ": tensor '" + tensor + "' is not in " + file.get<std::string>());
  }
  load_from(files, index.string(), model);
}

void load_weights(const std::string& weights_path, Model& model) {
  WeightFiles files;
  files.add(open_safetensors(weights_path));
  load_from(files, weights_path, model);
}

}  // namespace ct
