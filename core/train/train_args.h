// Settings of one training run. Field names follow Hugging Face TrainingArguments.
#pragma once

#include <cstdint>
#include <string>

namespace ct {

struct TrainArgs {
  // model: a preset name ("tiny", "gpt2", "gpt2-medium"); the n_* overrides apply on top (0 = keep)
  std::string model = "tiny";
  int n_layer = 0, n_head = 0, n_embd = 0, block_size = 0, vocab_size = 0;
  // A Hugging Face GPT-2 folder to start from (config.json, model.safetensors or its sharded
  // index, tokenizer files): replaces the preset; --block-size is then the training sequence
  // length (at most n_positions; 0 = n_positions), as in transformers' run_clm.py.
  std::string model_name_or_path;

  // text file or folder, an llm.c token file or a nanoGPT .bin; empty = the built-in default data
  std::string data;
  std::string output_dir = "out";
  std::string backend = "cpu";

  int64_t max_steps = 200;  // optimizer steps, counted from the start of training (resumes too)
  int per_device_train_batch_size = 4;
  int gradient_accumulation_steps = 1;  // micro-batches per optimizer step
  double learning_rate = 1e-3;
  int64_t warmup_steps = 20;
  std::string lr_scheduler_type = "cosine";
  double weight_decay = 0.1;
  double adam_beta1 = 0.9;
  double adam_beta2 = 0.999;
  double adam_epsilon = 1e-8;
  double max_grad_norm = 1.0;  // 0 disables clipping
  // optimizer: adamw | adafactor | adamw_8bit | lion | sgd (and the Hugging Face aliases
  // adamw_torch, adamw_torch_fused, adamw_apex_fused, adamw_bnb_8bit, lion_32bit); Lion uses the
  // adam betas, as Hugging Face's lion_32bit does
  std::string optim = "adamw";
  double sgd_momentum = 0.0, sgd_dampening = 0.0;
  bool sgd_nesterov = false;
  // Adafactor (transformers.optimization.Adafactor); --learning-rate 0 or relative_step: HF's
  // lr=None (relative step size and parameter scaling, the schedule ignored)
  bool adafactor_relative_step = false, adafactor_scale_parameter = false;
  bool adafactor_warmup_init = false;
  double adafactor_clip_threshold = 1.0, adafactor_decay_rate = -0.8, adafactor_beta1 = 0.0;
  bool offload_optimizer = false;  // optimizer state in host memory, updated on the CPU
  // with offload_optimizer: ZeRO-Offload's delayed parameter update (the host update of step N
  // overlaps step N+1; weights one update behind from step 3 on)
  bool offload_delayed_update = false;
  uint64_t seed = 42;
  int64_t logging_steps = 10;
  int64_t eval_steps = 50;        // 0 = evaluate only at the end
  int64_t max_eval_batches = 16;  // cap on validation batches per evaluation during training
  double validation_split = 0.1;

  // precision and memory techniques (Hugging Face names)
  bool fp16 = false;  // fp16 mixed precision with dynamic loss scaling
  double fp16_init_scale =
      65536.0;        // the loss scaler's first scale (PyTorch GradScaler's init_scale)
  bool bf16 = false;  // bf16 mixed precision
  bool tf32 = false;  // TF32 matmuls where DeviceInfo::tf32 (CUDA sm_80+; a notice elsewhere)
  bool gradient_checkpointing = false;
  // "fused": flash attention (only the rows' log-sum-exp saved); "unfused": the probabilities
  // stored; "auto": fused, except where unfused was measured faster (a Vulkan device that is a
  // CPU, i.e. lavapipe: 3x). The --attention flag; ModelOptions::fused_attention.
  std::string attention = "auto";

  // LoRA (PEFT's names and defaults): r > 0 freezes the model and trains rank-r adapters on the
  // target modules (comma-separated; GPT-2's PEFT default "c_attn"); outputs and checkpoints
  // then hold the adapters as PEFT saves them. --lora-dropout drops elements of the adapters'
  // input in training (Device::dropout; masks numbered by micro-batch, so resume is exact).
  int lora_r = 0;
  double lora_alpha = 8.0;
  double lora_dropout = 0.0;
  std::string lora_target_modules;  // "": the family's default (c_attn; q_proj,v_proj)

  // checkpoints: <output_dir>/checkpoint-<step>/ every save_steps steps (0 = none)
  int64_t save_steps = 0;
  int save_total_limit = 0;            // keep only the newest K checkpoints (0 = all)
  std::string resume_from_checkpoint;  // a checkpoint folder, "latest", or empty

  // the sample printed at the end
  std::string sample_prompt = "The ";
  int sample_tokens = 200;

  // data parallel: seconds a rank waits in one all-reduce (or other collective) for the others
  // before the run stops, saying so (Hugging Face's ddp_timeout)
  int64_t ddp_timeout = 1800;
  // data parallel: ZeRO stage (DeepSpeed's and Hugging Face's meaning). 0: every rank holds the
  // whole optimizer state; 1: each rank holds and updates the state of one contiguous shard of
  // the parameters (gradients reduce-scattered, weights all-gathered after the update)
  int zero_stage = 0;
  // data parallel: each gradient bucket's all-reduce (or ZeRO's reduce-scatter) starts as soon as
  // the backward pass has finished it, overlapping the rest of the backward (PyTorch DDP's way);
  // false: every bucket after the backward pass (--no-ddp-overlap). The same results either way.
  bool ddp_overlap = true;
  // data parallel: the gradient buckets' size in MiB (Hugging Face's ddp_bucket_cap_mb; crosstrain
  // takes fractions too, and defaults to 16 MiB: GradientAverager::kDefaultBucketElems floats)
  double ddp_bucket_cap_mb = 16;
  // data parallel: how the gradients are reduced (Hugging Face's ddp_backend). "nccl": in place on
  // the device with its collective library (NCCL on CUDA, RCCL on HIP, the SIMT runtime's over
  // MPI on simt), refused where the device has none; "mpi": MPI through host memory; "auto": nccl
  // where the device's library loads, else mpi (core/dist/device_collectives.h)
  std::string ddp_backend = "auto";

  // On a device with graphs (CUDA, HIP, the SIMT runtime), each micro-batch's forward and
  // backward is captured once and replayed as one launch (core/train/step_graph.h) unless a
  // setting rules it out; false: one launch per op (--no-cuda-graph).
  bool cuda_graph = true;

  bool progress_bar = true;  // only drawn when stderr is a terminal
  bool profile = false;      // print the device's per-op time table at the end (--profile)
};

// The built-in default data: English text installed by Debian's `fortunes` package.
inline constexpr const char* kDefaultDataPath = "/usr/share/games/fortunes";

}  // namespace ct
