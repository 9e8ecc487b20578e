// Training checkpoints: <output_dir>/checkpoint-<step>/ with
//   model.safetensors      weights, fp32, Hugging Face GPT-2 names
//   optimizer.safetensors  every optimizer state tensor by name
//   config.json            the model's Hugging Face config
//   trainer_state.json     step, RNG streams, data position, schedule, settings, and the
//                          SHA-256 of each file above
//   COMPLETE               written last; a folder without it is never resumed from
// With ZeRO stage 1 (--zero-stage 1) optimizer.safetensors is replaced by one file per rank,
// optimizer-rank<r>-of-<world>.safetensors, each rank's shard of the state, written by that rank
// into the same temporary folder and fsynced before rank 0 goes on (all_gather: a barrier);
// trainer_state.json's "zero" then lists the shards (file, rank, bounds, bytes, SHA-256), and
// COMPLETE, which holds trainer_state.json's SHA-256, is written only after all of that.
// A checkpoint is assembled in a hidden temporary folder, every file and the folder fsynced, then
// renamed into place before the marker is written, so a kill at any moment loses at most the
// checkpoint being written and never damages an earlier one.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/dist/communicator.h"
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

// ZeRO stage 1: which part of a checkpoint's optimizer state is this rank's. stage 0: all of it,
// in optimizer.safetensors.
struct OptimizerShard {
  int stage = 0;
  int rank = 0, world_size = 1;
  int64_t begin = 0, end = 0;  // the rank's shard of the flat parameters
};

// "optimizer-rank1-of-2.safetensors"
std::string optimizer_shard_file(int rank, int world_size);

// save_checkpoint for ZeRO stage 1, a collective of every rank of `comm`: rank 0 makes the
// temporary folder, every rank writes its shard of the optimizer state into it (fsynced), and
// once every rank has (a barrier) rank 0 writes the model, trainer_state.json with trainer_state
// and "zero" {stage, world_size, shards}, moves the folder into place and writes COMPLETE. Every
// rank returns the checkpoint's path once it is complete. An error on one rank leaves the others
// waiting in a collective: the caller ends the run (dist::abort_world), and the earlier
// checkpoints stay as they were.
std::string save_sharded_checkpoint(dist::Communicator& comm, const OptimizerShard& shard,
                                    const std::string& output_dir, int64_t step, const Model& model,
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
// what is wrong (missing, corrupt, truncated, modified, a different model). `shard`: this run's
// ZeRO stage and this rank's shard; a checkpoint of another stage, or of stage 1 from another
// world size (resharding is not supported), is refused naming both, as is one whose shard file
// for this rank, or any other rank's, is missing.
nlohmann::json load_checkpoint(const std::string& dir, Model& model, Optimizer& optimizer,
                               const OptimizerShard& shard = {});

}  // namespace ct
