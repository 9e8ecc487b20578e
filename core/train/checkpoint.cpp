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
const char* kOptimizerFile = "optimizer.safetensors";

// The files whose SHA-256 trainer_state.json's "files" records: the weights (the adapters with
// LoRA), the optimizer state (unless sharded: "zero" records the shards) and the config.
std::vector<std::string> hashed_files(const Model& model, bool sharded) {
  std::vector<std::string> files = model.lora()
                                       ? std::vector<std::string>{kAdapterWeights, kAdapterConfig}
                                       : std::vector<std::string>{"model.safetensors"};
  if (!sharded) files.push_back(kOptimizerFile);
  files.push_back("config.json");
  return files;
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

void write_optimizer_state(const std::string& path, const Optimizer& opt,
                           std::map<std::string, std::string> metadata = {}) {
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
  metadata["optimizer"] = opt.name();
  write_safetensors(path, out, metadata);
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

namespace {

// The rest of a checkpoint whose optimizer state is in `tmp` already (or is written here, when
// `optimizer` is not null): the model, config and tokenizer, trainer_state.json with the files'
// SHA-256, then the folder moved into place, COMPLETE, and the rotation.
std::string complete_checkpoint(const fs::path& tmp, const std::string& output_dir, int64_t step,
                                const Model& model, const Optimizer* optimizer,
                                nlohmann::json trainer_state, int save_total_limit,
                                const std::string& tokenizer_dir, const std::string& base_model) {
  fs::path final_dir = fs::path(output_dir) / (kPrefix + std::to_string(step));
  std::error_code ec;
  try {
    if (model.lora()) {
      save_adapter(tmp.string(), model, base_model);
      write_json_file((tmp / "config.json").string(), model.hf_config());
      if (!tokenizer_dir.empty()) copy_tokenizer_files(tokenizer_dir, tmp.string());
    } else {
      save_model(tmp.string(), model, tokenizer_dir);  // model.safetensors, config.json, tokenizer
    }
    if (optimizer) write_optimizer_state((tmp / kOptimizerFile).string(), *optimizer);
    nlohmann::json files;
    for (const auto& f : hashed_files(model, optimizer == nullptr))
      files[f] = sha256_file((tmp / f).string());
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

}  // namespace

std::string save_checkpoint(const std::string& output_dir, int64_t step, const Model& model,
                            const Optimizer& optimizer, nlohmann::json trainer_state,
                            int save_total_limit, const std::string& tokenizer_dir,
                            const std::string& base_model) {
  const fs::path tmp = make_checkpoint_temp(output_dir, step);
  return complete_checkpoint(tmp, output_dir, step, model, &optimizer, std::move(trainer_state),
                             save_total_limit, tokenizer_dir, base_model);
}

std::string optimizer_shard_file(int rank, int world_size) {
  return "optimizer-rank" + std::to_string(rank) + "-of-" + std::to_string(world_size) +
         ".safetensors";
}

std::string save_sharded_checkpoint(dist::Communicator& comm, const OptimizerShard& shard,
                                    const std::string& output_dir, int64_t step, const Model& model,
                                    const Optimizer& optimizer, nlohmann::json trainer_state,
                                    int save_total_limit, const std::string& tokenizer_dir,
                                    const std::string& base_model) {
  CT_CHECK(shard.stage == 1 && shard.rank == comm.rank() && shard.world_size == comm.size(),
           "save_sharded_checkpoint: shard of rank " + std::to_string(shard.rank) + " of " +
               std::to_string(shard.world_size) + " on rank " + std::to_string(comm.rank()) +
               " of " + std::to_string(comm.size()));
  const bool main_rank = comm.rank() == 0;
  // Rank 0's temporary folder (its WRITER record names rank 0's process) for every rank.
  const fs::path tmp =
      comm.all_gather(main_rank ? make_checkpoint_temp(output_dir, step) : std::string())[0];
  const std::string file = optimizer_shard_file(shard.rank, shard.world_size);
  const fs::path path = tmp / file;
  // write_safetensors replaces atomically: the file and its folder are fsynced on return.
  write_optimizer_state(path.string(), optimizer,
                        {{"zero_stage", "1"},
                         {"rank", std::to_string(shard.rank)},
                         {"world_size", std::to_string(shard.world_size)},
                         {"begin", std::to_string(shard.begin)},
                         {"end", std::to_string(shard.end)}});
  const nlohmann::json mine = {
      {"file", file},     {"rank", shard.rank},           {"begin", shard.begin},
      {"end", shard.end}, {"bytes", fs::file_size(path)}, {"sha256", sha256_file(path.string())}};
  // Returns on rank 0 once every rank's shard is durable.
  const std::vector<std::string> all = comm.all_gather(mine.dump());
  std::string final_dir;
  if (main_rank) {
    nlohmann::json shards = nlohmann::json::array();
    for (const std::string& s : all) shards.push_back(nlohmann::json::parse(s));
    trainer_state["zero"] = {
        {"stage", 1}, {"world_size", shard.world_size}, {"shards", std::move(shards)}};
    final_dir = complete_checkpoint(tmp, output_dir, step, model, nullptr, std::move(trainer_state),
                                    save_total_limit, tokenizer_dir, base_model);
  }
  return comm.all_gather(final_dir)[0];  // every rank returns once it is complete
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

namespace {

// The ZeRO layout of checkpoint `dir` (trainer_state `state`, at `state_path`) against this run's
// `shard`: the same stage, and for stage 1 the same world size and every rank's file present at
// its recorded size. Returns the file of this rank's optimizer state, its SHA-256 checked.
std::string check_optimizer_layout(const fs::path& d, const nlohmann::json& state,
                                   const std::string& state_path, const OptimizerShard& shard) {
  const nlohmann::json zero = state.value("zero", nlohmann::json::object());
  const int saved_stage = zero.value("stage", 0);
  auto layout = [](int stage) {
    return "--zero-stage " + std::to_string(stage) +
           (stage == 0 ? std::string(" (the whole optimizer state in ") + kOptimizerFile + ")"
                       : std::string(" (the optimizer state in one shard per rank)"));
  };
  if (saved_stage != shard.stage)
    fail(ErrorKind::kInvalidArgument,
         d.string() + " was saved with " + layout(saved_stage) + "; this run has " +
             layout(shard.stage) + ". Resume with --zero-stage " + std::to_string(saved_stage) +
             ": converting optimizer state between ZeRO stages is not supported");
  if (saved_stage == 0) return (d / kOptimizerFile).string();
  const int saved_world = zero.value("world_size", 0);
  if (saved_world != shard.world_size)
    fail(ErrorKind::kInvalidArgument,
         d.string() + " holds ZeRO stage 1 optimizer state sharded over " +
             std::to_string(saved_world) + " rank(s); this run has world size " +
             std::to_string(shard.world_size) + ". Resume with " + std::to_string(saved_world) +
             " rank(s): resharding the optimizer state to another world size is not supported");
  const nlohmann::json shards = zero.value("shards", nlohmann::json::array());
  if (!shards.is_array() || shards.size() != static_cast<size_t>(saved_world))
    fail(ErrorKind::kInvalidArgument, state_path + ": 'zero' lists " +
                                          std::to_string(shards.size()) + " shard(s) for " +
                                          std::to_string(saved_world) + " rank(s)");
  for (int r = 0; r < saved_world; ++r) {
    const nlohmann::json& e = shards[static_cast<size_t>(r)];
    const std::string name = optimizer_shard_file(r, saved_world);
    const fs::path p = d / name;
    if (e.value("file", std::string()) != name || e.value("rank", -1) != r)
      fail(ErrorKind::kInvalidArgument, state_path + ": shard " + std::to_string(r) + " is not " +
                                            name + " of rank " + std::to_string(r));
    std::error_code ec;
    const uintmax_t bytes = fs::file_size(p, ec);
    if (ec)
      fail(ErrorKind::kInvalidArgument,
           p.string() + " (rank " + std::to_string(r) + "'s optimizer shard) is missing");
    if (bytes != e.value("bytes", uintmax_t{0}))
      fail(ErrorKind::kInvalidArgument, p.string() + ": " + std::to_string(bytes) +
                                            " bytes, the checkpoint recorded " + e["bytes"].dump() +
                                            " (truncated or modified)");
  }
  const nlohmann::json& mine = shards[static_cast<size_t>(shard.rank)];
  const std::string path = (d / mine["file"].get<std::string>()).string();
  if (mine.value("begin", int64_t{-1}) != shard.begin ||
      mine.value("end", int64_t{-1}) != shard.end)
    fail(ErrorKind::kInvalidArgument,
         path + ": holds parameters [" + mine["begin"].dump() + ", " + mine["end"].dump() +
             ") of rank " + std::to_string(shard.rank) + ", this run's shard is [" +
             std::to_string(shard.begin) + ", " + std::to_string(shard.end) +
             ") (another optimizer, model or partition rule)");
  if (sha256_file(path) != mine.value("sha256", std::string()))
    fail(ErrorKind::kInvalidArgument,
         path + ": SHA-256 mismatch (the file is corrupt, truncated or was modified)");
  return path;
}

}  // namespace

nlohmann::json load_checkpoint(const std::string& dir, Model& model, Optimizer& optimizer,
                               const OptimizerShard& shard) {
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
  const std::string optimizer_path = check_optimizer_layout(d, state, state_path, shard);
  for (const auto& f : hashed_files(model, shard.stage == 1)) {
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
  read_optimizer_state(optimizer_path, optimizer, model.device());
  for (const char* key : {"step", "data_position"})
    if (!state.contains(key) || !state[key].is_number_integer())
      fail(ErrorKind::kInvalidArgument,
           state_path + ": field '" + std::string(key) + "' is missing or not an integer");
  return state;
}

}  // namespace ct
