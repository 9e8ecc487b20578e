// The training loop: data -> model -> loss -> backward -> clip -> AdamW, with schedules,
// evaluation, metrics.jsonl, a progress bar, and the final model written in Hugging Face form.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "core/train/optimizer.h"
#include "core/train/train_args.h"

namespace ct {

struct TrainSummary {
  int64_t steps = 0;
  int64_t tokens = 0;
  double seconds = 0;
  double first_loss = 0;    // mean training loss of the first logging window
  double final_loss = 0;    // mean training loss of the last logging window
  double eval_loss = 0;     // validation loss at the end
  double tokens_per_s = 0;  // over the whole run, excluding evaluation
  int64_t peak_memory = 0;  // device accounting, all categories
  int64_t num_parameters = 0;
  std::string device;
  std::string sample;  // generated at the end (may be empty)
  int rank = 0;        // data parallel: this process's rank (only rank 0 writes and prints)
  int world_size = 1;
  int zero_stage = 0;           // --zero-stage
  int64_t optimizer_bytes = 0;  // this rank's optimizer state (ZeRO stage 1: its shard's)
};

// Checks every setting and input (flags, model shape, backend, data) before anything is written;
// throws Error(kInvalidArgument) naming the flag or file. Then trains, writing into
// args.output_dir: metrics.jsonl (one JSON record per logged step), model.safetensors and
// config.json. Human-readable progress goes to stderr, the summary to stdout.
// Started by an MPI launcher as several processes (dist::world()), each trains on its own device
// and rows of every batch, with the gradients averaged: the run of one process with the global
// batch (per-device x accumulation x world size). Only rank 0 prints progress and writes files.
TrainSummary train(const TrainArgs& args);

// The optimizer the flags describe (--optim, its hyper-parameters, --offload-optimizer,
// --offload-delayed-update), as train() builds it.
OptimizerSettings optimizer_settings(const TrainArgs& a);

}  // namespace ct
