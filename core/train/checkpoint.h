// Training checkpoints: <output_dir>/checkpoint-<step>/ with
//   model.safetensors      weights, fp32, Hugging Face GPT-2 names
//   optimizer.safetensors  every optimizer state tensor by name
//   config.json            the model's Hugging Face config
//   trainer_state.json     step, RNG streams, data position, schedule, settings, and the
//                          SHA-256 of each file above
//   COMPLETE               written last; a folder without it is never resumed from
// A checkpoint is assembled in a hidden temporary folder, every file and the folder fsynced, then
// renamed into place before the marker is written, so a kill at any moment loses at most the
// checkpoint being written and never damages an earlier one.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/model/model.h"
#include "core/train/optimizer.h"

namespace ct {

inline constexpr const char* kCheckpointMarker = "COMPLETE";

// Writes checkpoint-<step> into output_dir (replacing an earlier one of the same step only once
// the new one is complete), then deletes the oldest complete checkpoints beyond
// save_total_limit (0 = keep all). `trainer_state` gains "files" with the SHA-256 of each file.
// The tokenizer files of `tokenizer_dir` (when not empty) are copied in beside the weights.
// A model with LoRA saves its adapters (adapter_model.safetensors, adapter_config.json naming
// `base_model`) instead of model.safetensors. Returns the checkpoint's path.
std::string save_checkpoint(const std::string& output_dir, int64_t step, const Model& model,
                            const Optimizer& optimizer, nlohmann::json trainer_state,
                            int save_total_limit, const std::string& tokenizer_dir = "",
                            const std::string& base_model = "");

// The hidden folder a checkpoint of `step` is assembled in,
// <output_dir>/.checkpoint-<step>.tmp-<pid>, created empty apart from a WRITER record (pid, process
// start time, boot id) that tells a later run whether the process writing it is still alive.
// Removed or renamed by save_checkpoint().
std::string make_checkpoint_temp(const std::string& output_dir, int64_t step);

// What remove_stale_checkpoint_temps() did with one leftover folder.
struct StaleCheckpointTemp {
  std::string path;      // the folder as found
  uint64_t bytes = 0;    // bytes freed (0 when restored)
  std::string restored;  // non-empty: the folder was put back as this checkpoint instead
  std::string why;       // "writer PID 123 is not running", ...
};

// Cleans up after runs killed while writing a checkpoint: removes the `.checkpoint-N.tmp-PID`
// folders (and `.checkpoint-N.tmp-PID.old`, an earlier checkpoint-N moved aside) of output_dir
// whose writer is no longer alive. A `.old` that is the only complete copy of checkpoint-N (the
// writer died between the two renames) is renamed back instead. The writer counts as alive --
// the folder is left alone -- when it is this process, or when PID runs and is not a zombie and,
// where the folder holds a WRITER record, it has the recorded start time on the same boot (a
// reused PID is dead). Without a record (a .old folder, or a writer killed before writing it) a
// running PID counts as alive: a reused one keeps the folder until that process ends.
std::vector<StaleCheckpointTemp> remove_stale_checkpoint_temps(const std::string& output_dir);

// Complete checkpoints in output_dir, oldest step first.
std::vector<std::string> list_checkpoints(const std::string& output_dir);

// `spec` is a checkpoint folder or "latest" (the newest complete checkpoint in output_dir).
// Throws Error(kInvalidArgument) when there is none, or the folder is incomplete.
std::string resolve_checkpoint(const std::string& spec, const std::string& output_dir);

// Verifies every file's SHA-256 and that the checkpoint's model config equals model.config(),
// then loads weights and optimizer state. Returns the trainer state. Errors name the file and
// what is wrong (missing, corrupt, truncated, modified, a different model).
nlohmann::json load_checkpoint(const std::string& dir, Model& model, Optimizer& optimizer);

}  // namespace ct
