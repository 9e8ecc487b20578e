#include "core/train/checkpoint.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>

#include "core/error.h"
#include "core/io/atomic_file.h"
#include "core/io/json_file.h"
#include "core/io/read_file.h"
#include "core/io/safetensors.h"
#include "core/io/sha256.h"
#include "core/train/adapter_files.h"
#include "core/train/model_files.h"

namespace ct {
namespace fs = std::filesystem;

namespace {

const char* kPrefix = "checkpoint-";
// The files whose SHA-256 trainer_state.json records: the weights (the adapters with LoRA),
// the optimizer state and the config.
std::vector<std::string> hashed_files(const Model& model) {
  if (model.lora())
    return {kAdapterWeights, kAdapterConfig, "optimizer.safetensors", "config.json"};
  return {"model.safetensors", "optimizer.safetensors", "config.json"};
}

void fsync_path(const fs::path& p) {
  int fd = ::open(p.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

// The step of a folder named checkpoint-<digits>, or -1.
int64_t checkpoint_step(const fs::path& p) {
  std::string n = p.filename().string();
  if (n.rfind(kPrefix, 0) != 0) return -1;
  std::string digits = n.substr(std::strlen(kPrefix));
  if (digits.empty() || !std::all_of(digits.begin(), digits.end(), ::isdigit)) return -1;
  return std::stoll(digits);
}

void write_optimizer_state(const std::string& path, const Optimizer& opt, Device&) {
  std::vector<NamedTensor> state = opt.state();
  std::vector<std::vector<std::byte>> host(state.size());
  std::vector<SafetensorsTensor> out;
  for (size_t i = 0; i < state.size(); ++i) {
    const Tensor& t = state[i].tensor;
    host[i].resize(t.nbytes());
    t.buffer->device().download(host[i].data(), t, t.nbytes());  // host memory when offloaded
    SafetensorsTensor st;
    st.name = state[i].name;
    st.dtype = t.dtype;
    st.shape.assign(t.shape.d.begin(), t.shape.d.begin() + t.shape.ndim);
    st.data = host[i];
    out.push_back(std::move(st));
  }
  write_safetensors(path, out, {{"optimizer", opt.name()}});
}

void read_optimizer_state(const std::string& path, Optimizer& opt, Device& dev) {
  SafetensorsFile f = read_safetensors(path);
  auto it = f.metadata().find("optimizer");
  if (it == f.metadata().end() || it->second != opt.name())
    fail(ErrorKind::kInvalidArgument, path + ": holds state of optimizer '" +
                                          (it == f.metadata().end() ? "?" : it->second) +
                                          "', this run uses '" + opt.name() + "'");
  for (const NamedTensor& s : opt.state()) {
    if (!f.contains(s.name))
      fail(ErrorKind::kInvalidArgument, path + ": optimizer state '" + s.name + "' is missing");
    const SafetensorsInfo& info = f.info(s.name);
    if (info.dtype != s.tensor.dtype || info.to_shape() != s.tensor.shape)
      fail(ErrorKind::kInvalidArgument,
           path + ": optimizer state '" + s.name + "' is " + safetensors_dtype_name(info.dtype) +
               info.to_shape().str() + ", expected " + safetensors_dtype_name(s.tensor.dtype) +
               s.tensor.shape.str());
    s.tensor.buffer->device().upload(s.tensor, f.data(s.name).data(), s.tensor.nbytes());
  }
  dev.synchronize();  // the mapping goes away with `f`
  for (const NamedTensor& s : opt.state()) s.tensor.buffer->device().synchronize();
}

// ---- leftovers of killed writers ----------------------------------------------------------

const char* kWriterRecord = "WRITER";

// Fields 3 (state) and 22 (start time in clock ticks after boot) of /proc/<pid>/stat; false when
// there is no such process.
bool proc_stat(long pid, char* state, uint64_t* start) {
  std::string stat;
  try {
    stat = read_file_bytes("/proc/" + std::to_string(pid) + "/stat");
  } catch (const Error&) {
    return false;
  }
  size_t close = stat.rfind(')');  // the command name may hold spaces and parentheses
  if (close == std::string::npos) return false;
  std::istringstream in(stat.substr(close + 1));
  std::string field;
  in >> *state;
  for (int i = 4; i < 22 && in >> field; ++i) {
  }
  return static_cast<bool>(in >> *start);
}

std::string boot_id() {
  try {
    std::string id = read_file_bytes("/proc/sys/kernel/random/boot_id");
    while (!id.empty() && std::isspace(static_cast<unsigned char>(id.back()))) id.pop_back();
    return id;
  } catch (const Error&) {
    return "";
  }
}

// Empty when the writer `pid` of `dir` may still be alive, else why it is not.
std::string writer_gone(const fs::path& dir, long pid) {
  const std::string who = "writer PID " + std::to_string(pid);
  if (pid == static_cast<long>(::getpid())) return "";
  if (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) return who + " is not running";
  char state = '?';
  uint64_t start = 0;
  bool running = proc_stat(pid, &state, &start);
  if (running && (state == 'Z' || state == 'X')) return who + " has exited";
  std::ifstream rec(dir / kWriterRecord);
  long rec_pid = 0;
  uint64_t rec_start = 0;
  std::string rec_boot;
  if (rec >> rec_pid >> rec_start >> rec_boot && rec_pid == pid) {
    if (rec_boot != boot_id()) return who + " ran before the last reboot";
    if (!running) return who + " is not running";
    if (start != rec_start) return who + " is now another process (started later)";
  }
  return "";
}

uint64_t tree_bytes(const fs::path& dir) {
  uint64_t n = 0;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::end(it);
       it.increment(ec))
    if (it->is_regular_file(ec)) n += it->file_size(ec);
  return n;
}

}  // namespace

std::string make_checkpoint_temp(const std::string& output_dir, int64_t step) {
  const long pid = static_cast<long>(::getpid());
  std::string name = ".";
  name += kPrefix;
  name += std::to_string(step) + ".tmp-" + std::to_string(pid);
  fs::path tmp = fs::path(output_dir) / name;
  std::error_code ec;
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp, ec);
  if (ec) fail(ErrorKind::kIo, "cannot create " + tmp.string() + ": " + ec.message());
  char state = '?';
  uint64_t start = 0;
  proc_stat(pid, &state, &start);
  std::string record = std::to_string(pid) + " " + std::to_string(start) + " " + boot_id() + "\n";
  write_file_atomic((tmp / kWriterRecord).string(), record);
  return tmp.string();
}

std::vector<StaleCheckpointTemp> remove_stale_checkpoint_temps(const std::string& output_dir) {
  static const std::regex kTemp(R"(\.checkpoint-([0-9]+)\.tmp-([0-9]+)(\.old)?)");
  std::vector<StaleCheckpointTemp> done;
  std::error_code ec;
  std::vector<fs::path> found;
  for (const auto& e : fs::directory_iterator(output_dir, ec))
    if (e.is_directory()) found.push_back(e.path());
  std::sort(found.begin(), found.end());
  for (const fs::path& dir : found) {
    std::smatch m;
    std::string name = dir.filename().string();
    if (!std::regex_match(name, m, kTemp)) continue;
    std::string why = writer_gone(dir, std::stol(m[2].str()));
    if (why.empty()) continue;
    StaleCheckpointTemp t;
    t.path = dir.string();
    t.why = why;
    fs::path final_dir = fs::path(output_dir) / (kPrefix + m[1].str());
    if (m[3].matched && !fs::exists(final_dir / kCheckpointMarker) &&
        fs::exists(dir / kCheckpointMarker)) {
      // The writer died after moving the complete checkpoint-N aside and before the new one
      // was marked complete: the old one is the only complete copy.
      fs::remove_all(final_dir, ec);
      fs::rename(dir, final_dir, ec);
      if (ec) fail(ErrorKind::kIo, "cannot restore " + t.path + ": " + ec.message());
      fsync_path(output_dir);
      t.restored = final_dir.string();
    } else {
      t.bytes = tree_bytes(dir);
      fs::remove_all(dir, ec);
      if (ec) fail(ErrorKind::kIo, "cannot remove " + t.path + ": " + ec.message());
    }
    done.push_back(std::move(t));
  }
  return done;
}

std::vector<std::string> list_checkpoints(const std::string& output_dir) {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(output_dir, ec)) {
    int64_t step = checkpoint_step(e.path());
    if (step >= 0 && e.is_directory() && fs::exists(e.path() / kCheckpointMarker))
      found.emplace_back(step, e.path().string());
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> out;
  for (auto& f : found) out.push_back(f.second);
  return out;
}

std::string save_checkpoint(const std::string& output_dir, int64_t step, const Model& model,
                            const Optimizer& optimizer, nlohmann::json trainer_state,
                            int save_total_limit, const std::string& tokenizer_dir,
                            const std::string& base_model) {
  const std::string name = kPrefix + std::to_string(step);
  fs::path final_dir = fs::path(output_dir) / name;
  fs::path tmp = make_checkpoint_temp(output_dir, step);
  std::error_code ec;
  try {
    if (model.lora()) {
      save_adapter(tmp.string(), model, base_model);
      write_json_file((tmp / "config.json").string(), model.hf_config());
      if (!tokenizer_dir.empty()) copy_tokenizer_files(tokenizer_dir, tmp.string());
    } else {
      save_model(tmp.string(), model, tokenizer_dir);  // model.safetensors, config.json, tokenizer
    }
    write_optimizer_state((tmp / "optimizer.safetensors").string(), optimizer, model.device());
    nlohmann::json files;
    for (const auto& f : hashed_files(model)) files[f] = sha256_file((tmp / f).string());
    trainer_state["files"] = files;
    write_json_file((tmp / "trainer_state.json").string(), trainer_state);
    fs::remove(tmp / kWriterRecord);  // not part of the checkpoint
    fsync_path(tmp);
    // A checkpoint of the same step from an earlier run is replaced only now that this one is
    // whole: move it aside, move the new one in, then delete the old.
    fs::path old = tmp;
    old += ".old";
    if (fs::exists(final_dir)) fs::rename(final_dir, old);
    fs::rename(tmp, final_dir);
    fsync_path(output_dir);
    write_file_atomic((final_dir / kCheckpointMarker).string(),
                      sha256_file((final_dir / "trainer_state.json").string()) + "\n");
    fs::remove_all(old, ec);
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
  if (save_total_limit > 0) {
    std::vector<std::string> all = list_checkpoints(output_dir);
    for (size_t i = 0; i + save_total_limit < all.size(); ++i)
      if (fs::path(all[i]) != final_dir) fs::remove_all(all[i], ec);
  }
  return final_dir.string();
}

std::string resolve_checkpoint(const std::string& spec, const std::string& output_dir) {
  if (spec == "latest") {
    std::vector<std::string> all = list_checkpoints(output_dir);
    if (all.empty())
      fail(ErrorKind::kInvalidArgument,
           "--resume-from-checkpoint latest: no complete checkpoint in '" + output_dir + "'");
    return all.back();
  }
  if (!fs::is_directory(spec))
    fail(ErrorKind::kInvalidArgument, "--resume-from-checkpoint '" + spec + "' is not a folder");
  if (!fs::exists(fs::path(spec) / kCheckpointMarker))
    fail(ErrorKind::kInvalidArgument, "--resume-from-checkpoint '" + spec + "' is incomplete (no " +
                                          kCheckpointMarker +
                                          " marker): it was being written when the run stopped");
  return spec;
}

nlohmann::json load_checkpoint(const std::string& dir, Model& model, Optimizer& optimizer) {
  fs::path d(dir);
  std::string state_path = (d / "trainer_state.json").string();
  if (!fs::exists(d / kCheckpointMarker))
    fail(ErrorKind::kInvalidArgument, dir + " is incomplete (no " + kCheckpointMarker + " marker)");
  std::string marker = read_file_bytes((d / kCheckpointMarker).string());
  nlohmann::json state;
  try {
    state = read_json_file(state_path);
  } catch (const Error& e) {
    fail(ErrorKind::kInvalidArgument, e.what());
  }
  if (marker.substr(0, 64) != sha256_file(state_path))
    fail(ErrorKind::kInvalidArgument, state_path + ": SHA-256 does not match the " +
                                          std::string(kCheckpointMarker) +
                                          " marker (file modified or corrupt)");
  if (!state.contains("files") || !state["files"].is_object())
    fail(ErrorKind::kInvalidArgument, state_path + ": field 'files' is missing");
  for (const auto& f : hashed_files(model)) {
    std::string p = (d / f).string();
    if (!fs::exists(p)) fail(ErrorKind::kInvalidArgument, p + ": missing from the checkpoint");
    if (!state["files"].contains(f) || !state["files"][f].is_string())
      fail(ErrorKind::kInvalidArgument, state_path + ": no SHA-256 recorded for " + f);
    if (sha256_file(p) != state["files"][f].get<std::string>())
      fail(ErrorKind::kInvalidArgument,
           p + ": SHA-256 mismatch (the file is corrupt, truncated or was modified)");
  }
  const std::string mismatch = model.config_mismatch(read_json_file((d / "config.json").string()));
  if (!mismatch.empty())
    fail(ErrorKind::kInvalidArgument,
         (d / "config.json").string() + ": the checkpoint is " + mismatch);
  if (model.lora()) {
    const LoraOptions saved_lora = read_adapter_config(dir);
    const LoraOptions& lo = model.adapters()->options();
    if (saved_lora.r != lo.r || saved_lora.alpha != lo.alpha ||
        saved_lora.target_modules != lo.target_modules)
      fail(ErrorKind::kInvalidArgument,
           (d / kAdapterConfig).string() + ": the checkpoint's LoRA (r " +
               std::to_string(saved_lora.r) + ") differs from this run's (r " +
               std::to_string(lo.r) + "), or its alpha or target modules do");
    load_adapter(dir, model);
  } else {
    load_weights((d / "model.safetensors").string(), model);
  }
  read_optimizer_state((d / "optimizer.safetensors").string(), optimizer, model.device());
  for (const char* key : {"step", "data_position"})
    if (!state.contains(key) || !state[key].is_number_integer())
      fail(ErrorKind::kInvalidArgument,
           state_path + ": field '" + std::string(key) + "' is missing or not an integer");
  return state;
}

}  // namespace ct
