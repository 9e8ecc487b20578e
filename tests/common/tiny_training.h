// Short end-to-end runs of the tiny model for the parity tests: the arguments, a fresh output
// folder and the logged losses.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/registry.h"
#include "core/train/train_args.h"

namespace ct::test {

// The built-in default text where Debian installed it, else a bundle's copy of it
// (scripts/bundle.sh: data/fortunes beside bin/, on a GPU machine without Debian's packages).
inline std::string default_text() {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_directory(kDefaultDataPath, ec)) return kDefaultDataPath;
  const fs::path bundled = fs::path(executable_dir()) / ".." / "data" / "fortunes";
  return fs::is_directory(bundled, ec) ? bundled.string() : kDefaultDataPath;
}

// The tiny preset at block size 64, batch 1 (keeps the tests fast), logging every step.
inline TrainArgs tiny_args(const std::string& backend, const std::string& dir, int64_t steps) {
  TrainArgs a;
  a.model = "tiny";
  a.data = default_text();
  a.block_size = 64;
  a.per_device_train_batch_size = 1;
  a.max_steps = steps;
  a.warmup_steps = 5;
  a.logging_steps = 1;
  a.eval_steps = 0;
  a.max_eval_batches = 1;
  a.sample_tokens = 0;
  a.progress_bar = false;
  a.seed = 1234;
  a.backend = backend;
  a.output_dir = dir;
  return a;
}

// The tiny preset cut to 2 of its 6 layers: every layer the same shapes (384 wide, 6 heads of 64,
// vocabulary 256), the same code between the layers (the residual stream, checkpointing's
// per-layer recompute), a third of the work. For the suites that train one configuration many
// times on the slow devices under test (each technique, the offload schedules, resume, fused
// attention, the device chain); TinyFiftyStepsMatchCpu trains the whole preset on each device.
inline TrainArgs shallow_tiny_args(const std::string& backend, const std::string& dir,
                                   int64_t steps) {
  TrainArgs a = tiny_args(backend, dir, steps);
  a.n_layer = 2;
  return a;
}

// An empty path under the temporary folder, unique to this process.
inline std::string fresh_dir(const std::string& name) {
  namespace fs = std::filesystem;
  fs::path d = fs::temp_directory_path() / ("ct_e2e_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  return d.string();
}

// The "loss" of every record in dir/metrics.jsonl, in order.
inline std::vector<double> logged_losses(const std::string& dir) {
  std::vector<double> v;
  std::ifstream in(std::filesystem::path(dir) / "metrics.jsonl");
  std::string line;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_object() && j.contains("loss")) v.push_back(j["loss"].get<double>());
  }
  return v;
}

}  // namespace ct::test
