#include <cstdio>
#include <memory>

#include "core/train/progress.h"
#include "core/train/trainer.h"
#include "tools/crosstrain/cli_util.h"
#include "tools/crosstrain/commands.h"

namespace ct::cli {

Run add_train(CLI::App& app) {
  auto a = std::make_shared<TrainArgs>();
  flag(&app, "--model", a->model,
       "model preset: tiny, gpt2, gpt2-medium (GPT-2); llama-tiny, smollm-135m (Llama family)");
  flag(&app, "--model-name-or-path", a->model_name_or_path,
       "start from a local Hugging Face GPT-2 or Llama/Mistral/Qwen2 folder (config.json, "
       "model.safetensors or a sharded index, tokenizer files); replaces --model");
  flag(&app, "--n-layer", a->n_layer, "override the preset's layer count (0 = keep)");
  flag(&app, "--n-head", a->n_head, "override the preset's head count (0 = keep)");
  flag(&app, "--n-embd", a->n_embd, "override the preset's width (0 = keep)");
  flag(&app, "--block-size", a->block_size,
       "override the preset's context length (0 = keep); with --model-name-or-path the training "
       "sequence length (0 = the model's n_positions)");
  flag(&app, "--vocab-size", a->vocab_size, "override the preset's vocabulary (0 = keep)");
  flag(&app, "--data", a->data,
       std::string("text file or folder, llm.c token file or nanoGPT .bin (default: ") +
           kDefaultDataPath + ")");
  flag(&app, "--output-dir", a->output_dir,
       "where metrics.jsonl, model.safetensors, config.json go");
  flag(&app, "--backend", a->backend,
       "auto, cpu, cuda, hip, vulkan, vulkan:N, ... (see `crosstrain devices`)");
  flag(&app, "--max-steps", a->max_steps, "optimizer steps to train");
  flag(&app, "--per-device-train-batch-size", a->per_device_train_batch_size, "sequences per step");
  flag(&app, "--gradient-accumulation-steps", a->gradient_accumulation_steps,
       "micro-batches per optimizer step");
  flag(&app, "--learning-rate", a->learning_rate, "peak learning rate");
  flag(&app, "--warmup-steps", a->warmup_steps, "linear warmup steps");
  flag(&app, "--lr-scheduler-type", a->lr_scheduler_type, "cosine, linear or constant");
  flag(&app, "--weight-decay", a->weight_decay,
       "AdamW decoupled weight decay (matrices and embeddings)");
  flag(&app, "--adam-beta1", a->adam_beta1, "AdamW beta1");
  flag(&app, "--adam-beta2", a->adam_beta2, "AdamW beta2");
  flag(&app, "--adam-epsilon", a->adam_epsilon, "AdamW epsilon");
  flag(&app, "--max-grad-norm", a->max_grad_norm, "clip the global gradient norm (0 = off)");
  flag(&app, "--optim", a->optim,
       "adamw, adafactor, adamw_8bit, lion or sgd (also adamw_torch, adamw_torch_fused, "
       "adamw_apex_fused, adamw_bnb_8bit, lion_32bit)");
  flag(&app, "--sgd-momentum", a->sgd_momentum, "SGD momentum (0 = none)");
  flag(&app, "--sgd-dampening", a->sgd_dampening, "SGD dampening");
  app.add_flag(names("--sgd-nesterov"), a->sgd_nesterov, "SGD with Nesterov momentum");
  app.add_flag(names("--adafactor-relative-step"), a->adafactor_relative_step,
               "Adafactor: step size from the step count and parameter scale (HF lr=None)");
  app.add_flag(names("--adafactor-scale-parameter"), a->adafactor_scale_parameter,
               "Adafactor: scale the step by the parameter RMS");
  app.add_flag(names("--adafactor-warmup-init"), a->adafactor_warmup_init,
               "Adafactor: relative step 1e-6 * step (with --adafactor-relative-step)");
  flag(&app, "--adafactor-clip-threshold", a->adafactor_clip_threshold,
       "Adafactor update clipping");
  flag(&app, "--adafactor-decay-rate", a->adafactor_decay_rate,
       "Adafactor: beta2_t = 1 - t^decay_rate");
  flag(&app, "--adafactor-beta1", a->adafactor_beta1, "Adafactor first moment (0 = none)");
  app.add_flag(names("--offload-optimizer"), a->offload_optimizer,
               "keep optimizer state in host memory and update on the CPU");
  app.add_flag(names("--offload-delayed-update"), a->offload_delayed_update,
               "with --offload-optimizer: update on the CPU while the device computes the next "
               "step (ZeRO-Offload's delayed parameter update: weights one update behind)");
  flag(&app, "--lora-r", a->lora_r,
       "LoRA rank: freeze the model and train rank-r adapters (0 = train every parameter)");
  flag(&app, "--lora-alpha", a->lora_alpha, "LoRA scaling numerator: updates scaled by alpha / r");
  flag(&app, "--lora-dropout", a->lora_dropout,
       "LoRA dropout on the adapters' input, in [0, 1) (PEFT's lora_dropout)");
  flag(&app, "--lora-target-modules", a->lora_target_modules,
       "comma-separated modules to adapt (PEFT's target_modules). GPT-2: c_attn, c_proj, c_fc, "
       "attn.c_proj, mlp.c_proj (default c_attn); Llama family: q_proj, k_proj, v_proj, o_proj, "
       "gate_proj, up_proj, down_proj (default q_proj,v_proj)");
  flag(&app, "--seed", a->seed, "seed of initialisation and data order");
  flag(&app, "--logging-steps", a->logging_steps, "log a metrics record every N steps");
  flag(&app, "--eval-steps", a->eval_steps, "evaluate every N steps (0 = only at the end)");
  flag(&app, "--max-eval-batches", a->max_eval_batches,
       "validation batches per evaluation during training (0 = all)");
  flag(&app, "--validation-split", a->validation_split,
       "fraction of the data held out for validation");
  flag(&app, "--save-steps", a->save_steps, "write checkpoint-<step>/ every N steps (0 = none)");
  flag(&app, "--save-total-limit", a->save_total_limit,
       "keep only the newest K checkpoints (0 = all)");
  flag(&app, "--resume-from-checkpoint", a->resume_from_checkpoint,
       "continue from a checkpoint folder, or 'latest' in --output-dir");
  flag(&app, "--sample-prompt", a->sample_prompt, "prompt of the sample generated at the end");
  flag(&app, "--sample-tokens", a->sample_tokens, "tokens to generate at the end (0 = none)");
  app.add_flag("--fp16", a->fp16, "fp16 mixed precision with dynamic loss scaling");
  flag(&app, "--fp16-init-scale", a->fp16_init_scale,
       "first loss scale of --fp16 (GradScaler's init_scale)");
  app.add_flag("--bf16", a->bf16, "bf16 mixed precision");
  app.add_flag("--tf32", a->tf32, "TF32 matmuls where the device has them (CUDA)");
  app.add_flag(names("--gradient-checkpointing"), a->gradient_checkpointing,
               "keep only block inputs and recompute each block in the backward pass");
  app.add_option("--attention", a->attention,
                 "fused (flash: probabilities recomputed in the backward, not stored), unfused, "
                 "or auto (fused except on lavapipe, where unfused is 3x faster)")
      ->check(CLI::IsMember({"auto", "fused", "unfused"}));
  flag(&app, "--ddp-timeout", a->ddp_timeout,
       "data parallel (mpirun): seconds a rank waits for the others in one all-reduce before "
       "the run stops (a rank hangs or died)");
  flag(&app, "--zero-stage", a->zero_stage,
       "data parallel (mpirun): 1 shards the optimizer state across the ranks (ZeRO stage 1: "
       "each rank updates one contiguous shard of the parameters, then the weights are "
       "gathered); 0 (default): every rank holds all of it");
  flag(&app, "--ddp-bucket-cap-mb", a->ddp_bucket_cap_mb,
       "data parallel (mpirun): MiB of gradients per all-reduce bucket");
  app.add_option("--ddp-backend", a->ddp_backend,
                 "data parallel (mpirun): nccl reduces the gradients in place on the device "
                 "(NCCL on cuda, RCCL on hip, over MPI on simt), mpi through host memory; auto "
                 "(default): nccl where the device's library loads")
      ->check(CLI::IsMember({"auto", "mpi", "nccl"}));
  app.add_flag(
      "--no-ddp-overlap", [a](int64_t) { a->ddp_overlap = false; },
      "data parallel (mpirun): average the gradients after the backward pass, not bucket by "
      "bucket while it runs (the same results; for comparing their times)");
  app.add_flag(
      "--no-cuda-graph", [a](int64_t) { a->cuda_graph = false; },
      "launch every op of the step on its own instead of replaying each micro-batch's forward "
      "and backward, and AdamW's update, as CUDA/HIP graphs (on by default where the device "
      "and settings allow)");
  app.add_flag(
      "--profile", a->profile,
      "print a per-op device time table (GPU timestamps on Vulkan, wall time on the CPU) at the "
      "end");
  app.add_flag(
      "--no-progress,--no_progress", [a](int64_t) { a->progress_bar = false; },
      "plain log lines even on a terminal");
  return [a] {
    TrainSummary s = train(*a);
    if (s.rank != 0) return 0;  // data parallel: rank 0 reports the run
    std::printf("\n== summary ==\n");
    std::printf("device           %s\n", s.device.c_str());
    if (s.world_size > 1) std::printf("ranks            %d (data parallel)\n", s.world_size);
    std::printf("parameters       %s\n",
                format_count(static_cast<double>(s.num_parameters)).c_str());
    std::printf("steps            %lld (%s tokens) in %s\n", static_cast<long long>(s.steps),
                format_count(static_cast<double>(s.tokens)).c_str(),
                format_duration(s.seconds).c_str());
    std::printf("train loss       %.4f -> %.4f\n", s.first_loss, s.final_loss);
    std::printf("validation loss  %.4f\n", s.eval_loss);
    std::printf("throughput       %s tokens/s\n", format_count(s.tokens_per_s).c_str());
    std::printf("peak memory      %s (device accounting)\n", format_bytes(s.peak_memory).c_str());
    std::printf("optimizer state  %s%s\n", format_bytes(s.optimizer_bytes).c_str(),
                s.zero_stage == 1 ? " on rank 0 (ZeRO stage 1: its shard)" : "");
    std::printf(a->lora_r > 0
                    ? "saved            %s/adapter_model.safetensors, adapter_config.json, "
                      "metrics.jsonl\n"
                    : "saved            %s/model.safetensors, config.json, metrics.jsonl\n",
                a->output_dir.c_str());
    if (!s.sample.empty()) std::printf("\n== sample ==\n%s\n", s.sample.c_str());
    return 0;
  };
}

}  // namespace ct::cli
