#include "core/train/trainer.h"

#include <sys/resource.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/amp/loss_scaler.h"
#include "core/amp/precision.h"
#include "core/data/batch_loader.h"
#include "core/data/text_dataset.h"
#include "core/data/text_tokenizer.h"
#include "core/data/token_file.h"
#include "core/dist/communicator.h"
#include "core/dist/data_parallel.h"
#include "core/dist/zero.h"
#include "core/error.h"
#include "core/model/gpt2.h"
#include "core/model/model_config.h"
#include "core/registry.h"
#include "core/train/adapter_files.h"
#include "core/train/checkpoint.h"
#include "core/train/evaluate.h"
#include "core/train/model_files.h"
#include "core/train/optimizer.h"
#include "core/train/progress.h"
#include "core/train/schedule.h"
#include "core/train/step_graph.h"

namespace ct {
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

void require_flag(bool ok, const std::string& flag, const std::string& value, const char* rule) {
  if (!ok) fail(ErrorKind::kInvalidArgument, flag + " " + value + ": " + rule);
}

// Every numeric setting in range; names the flag that is not.
void validate_args(const TrainArgs& a) {
  require_flag(a.max_steps > 0, "--max-steps", std::to_string(a.max_steps), "must be > 0");
  require_flag(a.per_device_train_batch_size > 0, "--per-device-train-batch-size",
               std::to_string(a.per_device_train_batch_size), "must be > 0");
  require_flag(std::isfinite(a.learning_rate) && a.learning_rate >= 0, "--learning-rate",
               std::to_string(a.learning_rate), "must be a finite number >= 0");
  require_flag(a.warmup_steps >= 0, "--warmup-steps", std::to_string(a.warmup_steps),
               "must be >= 0");
  require_flag(std::isfinite(a.weight_decay) && a.weight_decay >= 0, "--weight-decay",
               std::to_string(a.weight_decay), "must be >= 0");
  require_flag(a.adam_beta1 >= 0 && a.adam_beta1 < 1, "--adam-beta1", std::to_string(a.adam_beta1),
               "must be in [0, 1)");
  require_flag(a.adam_beta2 >= 0 && a.adam_beta2 < 1, "--adam-beta2", std::to_string(a.adam_beta2),
               "must be in [0, 1)");
  require_flag(a.adam_epsilon > 0, "--adam-epsilon", std::to_string(a.adam_epsilon), "must be > 0");
  require_flag(std::isfinite(a.max_grad_norm) && a.max_grad_norm >= 0, "--max-grad-norm",
               std::to_string(a.max_grad_norm), "must be >= 0 (0 disables clipping)");
  require_flag(a.attention == "auto" || a.attention == "fused" || a.attention == "unfused",
               "--attention", a.attention, "must be auto, fused or unfused");
  require_flag(a.lora_r >= 0, "--lora-r", std::to_string(a.lora_r), "must be >= 0 (0: no LoRA)");
  require_flag(std::isfinite(a.lora_alpha) && a.lora_alpha > 0, "--lora-alpha",
               std::to_string(a.lora_alpha), "must be > 0");
  require_flag(std::isfinite(a.lora_dropout) && a.lora_dropout >= 0 && a.lora_dropout < 1,
               "--lora-dropout", std::to_string(a.lora_dropout), "must be in [0, 1)");
  require_flag(a.logging_steps > 0, "--logging-steps", std::to_string(a.logging_steps),
               "must be > 0");
  require_flag(a.eval_steps >= 0, "--eval-steps", std::to_string(a.eval_steps),
               "must be >= 0 (0 evaluates only at the end)");
  require_flag(a.validation_split > 0 && a.validation_split < 1, "--validation-split",
               std::to_string(a.validation_split), "must be in (0, 1)");
  require_flag(a.max_eval_batches >= 0, "--max-eval-batches", std::to_string(a.max_eval_batches),
               "must be >= 0 (0 evaluates every window)");
  require_flag(a.gradient_accumulation_steps > 0, "--gradient-accumulation-steps",
               std::to_string(a.gradient_accumulation_steps), "must be > 0");
  require_flag(a.save_steps >= 0, "--save-steps", std::to_string(a.save_steps),
               "must be >= 0 (0 = no checkpoints)");
  require_flag(a.save_total_limit >= 0, "--save-total-limit", std::to_string(a.save_total_limit),
               "must be >= 0 (0 = keep all)");
  parse_optim(a.optim);  // names --optim's accepted values when unknown
  require_flag(a.sgd_momentum >= 0 && a.sgd_dampening >= 0, "--sgd-momentum/--sgd-dampening",
               std::to_string(a.sgd_momentum) + "/" + std::to_string(a.sgd_dampening),
               "must be >= 0");
  require_flag(a.adafactor_clip_threshold > 0, "--adafactor-clip-threshold",
               std::to_string(a.adafactor_clip_threshold), "must be > 0");
  require_flag(a.adafactor_beta1 >= 0 && a.adafactor_beta1 < 1, "--adafactor-beta1",
               std::to_string(a.adafactor_beta1), "must be in [0, 1) (0 = no first moment)");
  require_flag(std::isfinite(static_cast<float>(a.fp16_init_scale)) && a.fp16_init_scale > 0,
               "--fp16-init-scale", std::to_string(a.fp16_init_scale),
               "must be a positive finite float");
  if (a.fp16 && a.bf16)
    fail(ErrorKind::kInvalidArgument,
         "--fp16 and --bf16 are mutually exclusive: choose one precision");
  if (a.offload_delayed_update && !a.offload_optimizer)
    fail(ErrorKind::kInvalidArgument,
         "--offload-delayed-update needs --offload-optimizer: the delayed update runs on the "
         "offloaded (host) copy of the optimizer");
  require_flag(a.sample_tokens >= 0, "--sample-tokens", std::to_string(a.sample_tokens),
               "must be >= 0");
  require_flag(a.ddp_timeout > 0, "--ddp-timeout", std::to_string(a.ddp_timeout), "must be > 0");
  require_flag(a.ddp_bucket_cap_mb * (1 << 20) >= sizeof(float) && a.ddp_bucket_cap_mb <= 2048,
               "--ddp-bucket-cap-mb", std::to_string(a.ddp_bucket_cap_mb),
               "must hold at least one float and at most 2048 MiB");
  require_flag(a.zero_stage == 0 || a.zero_stage == 1, "--zero-stage", std::to_string(a.zero_stage),
               "must be 0 or 1 (stages 2 and 3, gradients and weights sharded too, are not "
               "implemented)");
}

// The model a run trains, the sequence length it trains at, and the tokenizer of its text.
struct ModelSource {
  ModelConfig config;
  int seq_len = 0;
  std::unique_ptr<TextTokenizer> tokenizer;
  std::string pretrained;  // the --model-name-or-path folder, or empty (random init)
  std::string notice;      // printed before training (dropout not applied, ...)
};

ModelConfig resolve_config(const TrainArgs& a) {
  ModelConfig mc = ModelConfig::preset(a.model);
  auto override_dim = [](int v, int& field, const char* flag) {
    if (v < 0)
      fail(ErrorKind::kInvalidArgument,
           std::string(flag) + " " + std::to_string(v) + ": must be > 0");
    if (v > 0) field = v;
  };
  auto apply = [&](auto& c) {  // the fields both families name alike
    override_dim(a.n_layer, c.n_layer, "--n-layer");
    override_dim(a.n_head, c.n_head, "--n-head");
    override_dim(a.n_embd, c.n_embd, "--n-embd");
    override_dim(a.block_size, c.block_size, "--block-size");
    override_dim(a.vocab_size, c.vocab_size, "--vocab-size");
    c.validate();
    if (c.bos_token_id >= c.vocab_size) c.bos_token_id = -1;
    if (c.eos_token_id >= c.vocab_size) c.eos_token_id = -1;
  };
  std::visit(apply, mc.config);
  if (mc.vocab_size() < 256)
    fail(ErrorKind::kInvalidArgument, "--vocab-size " + std::to_string(mc.vocab_size()) +
                                          ": the byte-level tokenizer needs at least 256");
  return mc;
}

ModelSource resolve_model(const TrainArgs& a) {
  ModelSource m;
  if (a.model_name_or_path.empty()) {
    m.config = resolve_config(a);
    m.seq_len = m.config.block_size();
    m.tokenizer = make_byte_tokenizer();
    return m;
  }
  const std::string& dir = a.model_name_or_path;
  if (!fs::is_directory(dir))
    fail(ErrorKind::kInvalidArgument,
         "--model-name-or-path '" + dir +
             "' is not a folder (crosstrain reads a local Hugging Face folder; it downloads "
             "nothing)");
  for (auto [v, flag] : {std::pair{a.n_layer, "--n-layer"},
                         {a.n_head, "--n-head"},
                         {a.n_embd, "--n-embd"},
                         {a.vocab_size, "--vocab-size"}})
    require_flag(v == 0, flag, std::to_string(v),
                 "cannot change the shape of a --model-name-or-path model");
  m.pretrained = dir;
  m.config = read_model_config(dir, &m.notice);
  m.seq_len = a.block_size > 0 ? a.block_size : m.config.block_size();
  require_flag(
      m.seq_len <= m.config.block_size(), "--block-size", std::to_string(a.block_size),
      ("must be at most the model's longest sequence, " + std::to_string(m.config.block_size()))
          .c_str());
  try {
    m.tokenizer = tokenizer_for_model(dir);
  } catch (const Error& e) {
    // Token-file data needs no tokenizer: train on the ids, keep the files for the outputs.
    const std::string data = a.data.empty() ? kDefaultDataPath : a.data;
    if (e.kind() != ErrorKind::kInvalidArgument || !fs::is_regular_file(data) ||
        detect_data_format(data) == DataFormat::kText)
      throw;
    m.tokenizer = make_ids_only_tokenizer(dir, m.config.vocab_size(), e.what());
    m.notice += std::string(m.notice.empty() ? "" : "; ") + "training on the token ids of " + data +
                ": " + e.what() + " (the sample is printed as ids, from token 0)";
  }
  if (m.tokenizer->vocab_size() > m.config.vocab_size())
    fail(ErrorKind::kInvalidArgument, dir + ": the tokenizer has " +
                                          std::to_string(m.tokenizer->vocab_size()) +
                                          " tokens, more than config.json's vocab_size " +
                                          std::to_string(m.config.vocab_size()));
  return m;
}

// --lora-target-modules "c_attn,c_proj" as PEFT's list.
std::vector<std::string> split_modules(const std::string& csv) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= csv.size()) {
    size_t end = csv.find(',', start);
    if (end == std::string::npos) end = csv.size();
    std::string t = csv.substr(start, end - start);
    t.erase(0, t.find_first_not_of(" \t"));
    t.erase(t.find_last_not_of(" \t") + 1);
    require_flag(!t.empty(), "--lora-target-modules", "'" + csv + "'",
                 "must be module names separated by commas");
    out.push_back(t);
    start = end + 1;
  }
  return out;
}

// The training tokens of `path`: a token file as it is (ids checked against the vocabulary),
// text through the tokenizer.
std::vector<int32_t> load_tokens(const std::string& path, const TextTokenizer& tok,
                                 int vocab_size) {
  if (detect_data_format(path) != DataFormat::kText) return read_token_file(path, vocab_size);
  return tok.encode_parallel(load_text(path, 1), 2);
}

int64_t process_rss_bytes() {
  std::ifstream f("/proc/self/statm");
  int64_t pages = 0, resident = 0;
  f >> pages >> resident;
  return resident * 4096;
}

nlohmann::json memory_json(const MemoryStats& m) {
  nlohmann::json j;
  for (int c = 0; c < kNumMemCategories; ++c)
    j[mem_category_name(static_cast<MemCategory>(c))] = m.current[c];
  j["total"] = m.total_current;
  j["peak"] = m.total_peak;
  j["process_rss"] = process_rss_bytes();
  return j;
}

nlohmann::json args_json(const TrainArgs& a) {
  return {{"model", a.model},
          {"model_name_or_path", a.model_name_or_path},
          {"data", a.data},
          {"backend", a.backend},
          {"max_steps", a.max_steps},
          {"per_device_train_batch_size", a.per_device_train_batch_size},
          {"gradient_accumulation_steps", a.gradient_accumulation_steps},
          {"learning_rate", a.learning_rate},
          {"warmup_steps", a.warmup_steps},
          {"lr_scheduler_type", a.lr_scheduler_type},
          {"weight_decay", a.weight_decay},
          {"adam_beta1", a.adam_beta1},
          {"adam_beta2", a.adam_beta2},
          {"adam_epsilon", a.adam_epsilon},
          {"max_grad_norm", a.max_grad_norm},
          {"optim", a.optim},
          {"offload_optimizer", a.offload_optimizer},
          {"offload_delayed_update", a.offload_delayed_update},
          {"zero_stage", a.zero_stage},
          {"seed", a.seed},
          {"logging_steps", a.logging_steps},
          {"eval_steps", a.eval_steps},
          {"save_steps", a.save_steps},
          {"validation_split", a.validation_split},
          {"fp16", a.fp16},
          {"bf16", a.bf16},
          {"tf32", a.tf32},
          {"gradient_checkpointing", a.gradient_checkpointing},
          {"attention", a.attention},
          {"lora_r", a.lora_r},
          {"lora_alpha", a.lora_alpha},
          {"lora_dropout", a.lora_dropout},
          {"lora_target_modules", a.lora_target_modules}};
}

// The settings every rank of a data-parallel run must share, as (--flag, value): args_json's
// and the rest that change what is computed or when the ranks exchange data. Not compared:
// --backend (ranks may open different devices), --output-dir, the sample and the display.
std::vector<std::pair<std::string, std::string>> shared_settings(const TrainArgs& a) {
  nlohmann::json j = args_json(a);
  j.erase("backend");
  for (auto [key, v] : {std::pair{"n_layer", a.n_layer},
                        {"n_head", a.n_head},
                        {"n_embd", a.n_embd},
                        {"block_size", a.block_size},
                        {"vocab_size", a.vocab_size}})
    j[key] = v;
  j["max_eval_batches"] = a.max_eval_batches;
  j["ddp_overlap"] = a.ddp_overlap;  // the buckets' collectives in another order
  j["ddp_bucket_cap_mb"] = a.ddp_bucket_cap_mb;
  j["ddp_backend"] = a.ddp_backend;
  j["save_total_limit"] = a.save_total_limit;
  j["resume_from_checkpoint"] = a.resume_from_checkpoint;
  j["fp16_init_scale"] = a.fp16_init_scale;
  j["sgd_dampening"] = a.sgd_dampening;
  j["sgd_momentum"] = a.sgd_momentum;
  j["sgd_nesterov"] = a.sgd_nesterov;
  j["adafactor"] = {a.adafactor_relative_step, a.adafactor_scale_parameter,
                    a.adafactor_warmup_init,   a.adafactor_clip_threshold,
                    a.adafactor_decay_rate,    a.adafactor_beta1};
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& [key, value] : j.items()) {
    std::string flag = "--" + key;
    for (char& c : flag) c = c == '_' ? '-' : c;
    if (key == "adafactor") flag = "--adafactor-*";
    out.emplace_back(flag, value.is_string() ? value.get<std::string>() : value.dump());
  }
  return out;
}

// Keeps the records of steps <= `step` (a resumed run continues the file from there).
void truncate_metrics(const std::string& path, int64_t step) {
  std::ifstream in(path);
  std::string kept, line;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_discarded() && j.contains("step") && j["step"].get<int64_t>() <= step)
      kept += line + "\n";
  }
  in.close();
  std::ofstream(path, std::ios::trunc) << kept;
}

// --data, or the built-in default when it is installed.
std::string training_data_path(const TrainArgs& args) {
  std::string data_path = args.data.empty() ? kDefaultDataPath : args.data;
  if (args.data.empty() && !fs::exists(data_path))
    fail(ErrorKind::kInvalidArgument, "the built-in default data " + data_path +
                                          " is missing: install Debian's 'fortunes' package (the "
                                          "setup script does) or pass --data");
  return data_path;
}

// --output-dir (created) / metrics.jsonl: new, or for a resumed run its records up to
// `start_step` continued.
std::ofstream open_metrics(const std::string& output_dir, int64_t start_step) {
  std::error_code ec;
  fs::create_directories(output_dir, ec);
  if (ec) fail(ErrorKind::kIo, "cannot create --output-dir '" + output_dir + "': " + ec.message());
  std::string metrics_path = (fs::path(output_dir) / "metrics.jsonl").string();
  if (start_step > 0) truncate_metrics(metrics_path, start_step);
  std::ofstream metrics(metrics_path, start_step > 0 ? std::ios::app : std::ios::trunc);
  if (!metrics) fail(ErrorKind::kIo, "cannot write " + metrics_path);
  return metrics;
}

// Removes (or, for a checkpoint moved aside by a killed writer, puts back) what runs killed while
// writing a checkpoint left in `output_dir`, saying so.
void clean_stale_checkpoint_temps(const std::string& output_dir) {
  if (!fs::is_directory(output_dir)) return;
  for (const StaleCheckpointTemp& t : remove_stale_checkpoint_temps(output_dir)) {
    if (t.restored.empty())
      std::printf("removed %s, left by a killed checkpoint writer (%s): %s freed\n", t.path.c_str(),
                  t.why.c_str(), format_bytes(static_cast<int64_t>(t.bytes)).c_str());
    else
      std::printf("restored %s from %s, left by a killed checkpoint writer (%s)\n",
                  t.restored.c_str(), t.path.c_str(), t.why.c_str());
  }
}

// The model options of the flags: checkpointing, attention (--attention auto by the device),
// LoRA, precision.
ModelOptions model_options(const TrainArgs& args, const DeviceInfo& device) {
  ModelOptions mopts;
  mopts.gradient_checkpointing = args.gradient_checkpointing;
  mopts.fused_attention =
      args.attention == "fused" ||
      (args.attention == "auto" && device.preferred_attention == AttentionPath::kFused);
  if (args.lora_r > 0) {
    mopts.lora.r = args.lora_r;
    mopts.lora.alpha = static_cast<float>(args.lora_alpha);
    mopts.lora.dropout = static_cast<float>(args.lora_dropout);
    if (!args.lora_target_modules.empty())  // else the family's default
      mopts.lora.target_modules = split_modules(args.lora_target_modules);
  }
  mopts.policy = PrecisionPolicy::make(args.fp16   ? Precision::kFp16
                                       : args.bf16 ? Precision::kBf16
                                                   : Precision::kFp32);
  return mopts;
}

// The lines that open a run: the model, LoRA, the data, the batch and techniques, the steps.
void print_run_header(const TrainArgs& args, const ModelSource& source, const Model& model,
                      const ModelOptions& mopts, const std::string& device,
                      const std::string& data_path, const TokenSplit& split, int64_t start_step,
                      const std::string& resume_dir, const dist::Communicator& comm,
                      const std::string& reducer) {
  const ModelConfig& config = source.config;
  const int B = args.per_device_train_batch_size, T = source.seq_len;
  const int accum = args.gradient_accumulation_steps;
  std::printf("crosstrain: training %s %s (%s, %s parameters) on %s\n",
              config.is_llama() ? "a Llama-family model" : "GPT-2",
              source.pretrained.empty() ? args.model.c_str() : source.pretrained.c_str(),
              config.str().c_str(),
              format_count(static_cast<double>(model.num_parameters())).c_str(), device.c_str());
  if (!source.notice.empty()) std::printf("notice: %s\n", source.notice.c_str());
  if (model.lora()) {
    std::string targets;
    for (const std::string& t : model.adapters()->options().target_modules)
      targets += (targets.empty() ? "" : ",") + t;
    std::printf("LoRA r=%d alpha=%g on %s: %s trainable parameters (%.2f%% of %s), base frozen\n",
                mopts.lora.r, static_cast<double>(mopts.lora.alpha), targets.c_str(),
                format_count(static_cast<double>(model.num_trainable())).c_str(),
                100.0 * static_cast<double>(model.num_trainable()) /
                    static_cast<double>(model.num_parameters()),
                format_count(static_cast<double>(model.num_parameters())).c_str());
  }
  std::printf("data: %s (%s, tokenizer %s), %s train / %s validation tokens; batch %d x %d",
              data_path.c_str(), data_format_name(detect_data_format(data_path)),
              source.tokenizer->describe().c_str(),
              format_count(static_cast<double>(split.train.size())).c_str(),
              format_count(static_cast<double>(split.val.size())).c_str(), B, T);
  if (accum > 1) std::printf(" x %d accumulation steps", accum);
  if (comm.size() > 1)
    std::printf(" x %d ranks (global batch %d sequences, gradients averaged over %s)", comm.size(),
                B * accum * comm.size(), reducer.c_str());
  if (mopts.policy.mixed()) std::printf("; %s mixed precision", mopts.policy.name().c_str());
  if (args.gradient_checkpointing) std::printf("; gradient checkpointing");
  if (!mopts.fused_attention)
    std::printf("; unfused attention%s",
                args.attention == "auto" ? " (faster on this device)" : "");
  std::printf("; steps %lld to %lld\n", static_cast<long long>(start_step + 1),
              static_cast<long long>(args.max_steps));
  if (!resume_dir.empty()) std::printf("resumed from %s\n", resume_dir.c_str());
  std::fflush(stdout);
}

// One metrics.jsonl record (without the evaluation); `offload_logged` (the optimizer's offload
// figures at the last record) moves on to the current ones.
nlohmann::json log_record(int64_t done, double mean_loss, double lr, float host_norm, double tps,
                          Device& dev, double optimizer_bytes_per_param, const Optimizer& optimizer,
                          OffloadStats& offload_logged, const LossScaler& scaler) {
  nlohmann::json rec;
  rec["step"] = done;
  rec["loss"] = mean_loss;
  rec["lr"] = lr;
  rec["grad_norm"] = host_norm;
  rec["tokens_per_s"] = tps;
  rec["memory"] = memory_json(dev.memory());
  rec["optimizer_bytes_per_param"] = optimizer_bytes_per_param;
  if (optimizer.offloaded()) {
    rec["memory"]["optimizer_host"] = optimizer.state_bytes();
    // Seconds of this logging window: host update time, and the part of it that ran while
    // the next step was computed (0 unless --offload-delayed-update).
    const OffloadStats os_now = optimizer.offload_stats();
    rec["offload_update_s"] = os_now.update_s - offload_logged.update_s;
    rec["offload_overlap_s"] = os_now.overlap_s - offload_logged.overlap_s;
    rec["offload_wait_s"] = os_now.wait_s - offload_logged.wait_s;
    rec["offload_overlapped_updates"] =
        os_now.overlapped_updates - offload_logged.overlapped_updates;
    offload_logged = os_now;
  }
  // The device's running totals (Device::counters): host waits, GEMMs its library refused.
  for (const auto& [name, count] : dev.counters()) rec[name] = count;
  if (scaler.enabled()) {
    rec["loss_scale"] = scaler.scale();
    rec["skipped_steps"] = scaler.skipped_steps();
  }
  return rec;
}

// A checkpoint's trainer_state: where the run is (step, data position, the open logging window),
// how it draws, its schedule, optimizer, loss scaler, precision, model and flags.
nlohmann::json checkpoint_state(const TrainArgs& args, int64_t done, int64_t data_position,
                                float partial, int64_t window_steps, LrSchedule schedule, double lr,
                                const Optimizer& optimizer, const LossScaler& scaler,
                                const PrecisionPolicy& policy, const ModelConfig& config) {
  return {{"step", done},
          {"data_position", data_position},
          {"logging_window_loss_sum", partial},
          {"logging_window_steps", window_steps},
          {"rng",
           {{"init_seed", args.seed},
            {"data_seed", args.seed},
            {"data_stream", BatchLoader::kBatchLoaderStream}}},
          {"schedule",
           {{"type", lr_schedule_name(schedule)},
            {"lr", lr},
            {"warmup_steps", args.warmup_steps},
            {"total_steps", args.max_steps}}},
          {"optimizer", optimizer.name()},
          {"loss_scaler", scaler.state()},
          {"precision", policy.name()},
          {"model_config", config.to_hf_json()},
          {"args", args_json(args)}};
}

// The trained model into --output-dir: with LoRA the adapters as PEFT's save_pretrained writes
// them (the base stays where it came from) and the tokenizer as the Trainer saves it; else the
// whole model.
void save_trained_model(const TrainArgs& args, const ModelSource& source, Model& model) {
  const TextTokenizer& tokenizer = *source.tokenizer;
  if (model.lora()) {
    save_adapter(args.output_dir, model,
                 source.pretrained.empty() ? args.model : source.pretrained);
    if (!tokenizer.folder().empty()) copy_tokenizer_files(tokenizer.folder(), args.output_dir);
  } else {
    save_model(args.output_dir, model, tokenizer.folder());
  }
}

// --sample-tokens after --sample-prompt (or a newline), temperature 0.8, top-k 40; a tokenizer
// of token ids only starts from token 0 and prints ids.
std::string sample_text(const TrainArgs& args, const TextTokenizer& tokenizer, Model& model) {
  SampleOptions so;
  so.temperature = 0.8f;
  so.top_k = 40;
  so.seed = args.seed;
  if (!tokenizer.encodes_text())
    return tokenizer.decode(model.generate({0}, args.sample_tokens, so));
  std::vector<int32_t> prompt =
      tokenizer.encode(args.sample_prompt.empty() ? "\n" : args.sample_prompt);
  return args.sample_prompt + tokenizer.decode(model.generate(prompt, args.sample_tokens, so));
}

// A training run between its steps. train() below is the sequence of the named steps that fill
// and use it: prepare_run, open_model, restore_run, then per step optimizer_step, log_window and
// save_step_checkpoint, and finish_run.
//
// Data parallel (`comm` spans several processes): every rank runs these steps on its own device
// and its rows of each batch; the gradients are averaged bucket by bucket as the backward pass
// finishes them (or after it), so every rank makes the same update; rank 0 alone prints,
// evaluates and writes files.
struct Run {
  Run(const TrainArgs& a, dist::Communicator& c)
      : args(a), comm(c), world(c.size()), main_rank(c.rank() == 0) {}
  const TrainArgs& args;
  dist::Communicator& comm;
  const int world;
  const bool main_rank;
  // prepare_run: the checked arguments, the model source and the data.
  LrSchedule schedule{};
  ModelSource source;
  int B = 0, T = 0, accum = 1;
  std::string data_path, resume_dir;
  TokenSplit split;
  // open_model: the device, the model with its optimizer and loss scaler, the step's tensors.
  std::unique_ptr<Device> device;
  // How the gradients are reduced (--ddp-backend): the device's collective library, or none (MPI
  // through host memory). Before the averager and the exchange, which use it, so it outlives them.
  dist::DdpBackend ddp;
  ModelOptions mopts;
  std::unique_ptr<Model> model;
  std::unique_ptr<LossScaler> scaler;
  std::unique_ptr<Optimizer> optimizer;
  double optimizer_bytes_per_param = 0;
  Tensor inputs, targets, loss_sum, grad_norm;
  std::unique_ptr<dist::GradientAverager> averager;
  // Each micro-batch's forward and backward as a device graph, where the device and settings
  // allow it (core/train/step_graph.h), and the update after them (the gradient norm, the
  // optimizer's device part and the 16-bit weights' refresh) as another, where the optimizer
  // reads its learning rate and step from the device (Optimizer::graph_refusal).
  std::unique_ptr<StepGraph> graph, update_graph;
  // --zero-stage 1: the reduce-scatter and all-gather of this rank's shard, which shard, and
  // every rank's optimizer state bytes (rank order).
  std::unique_ptr<dist::ShardExchange> exchange;
  OptimizerShard shard;
  std::vector<int64_t> optimizer_bytes_per_rank;
  // restore_run: where the run starts in the data and the steps.
  std::unique_ptr<BatchLoader> loader;
  int64_t start_step = 0;
  // The logging window: what was summed since the last log line.
  int64_t window_steps = 0, window_tokens = 0;
  Clock::time_point t_start, t_window;
  double eval_seconds = 0;
  bool have_first = false;
  OffloadStats offload_logged;  // offload_stats() at the last logging step
  double comm_logged = 0;       // comm_seconds() at the last logging step
  double overlap_logged = 0;    // averager->overlap_seconds() at the last logging step
  // Seconds in the gradient all-reduce, or ZeRO's reduce-scatter and all-gather.
  double comm_seconds() const {
    return averager->seconds() + (exchange ? exchange->seconds() : 0.0);
  }
  TrainSummary summary;
};

// Everything is checked before anything is written: the arguments, the model, the data, the
// output folder and the checkpoint to resume from.
void prepare_run(Run& r) {
  const TrainArgs& args = r.args;
  validate_args(args);
  r.comm.set_timeout(static_cast<double>(args.ddp_timeout));
  dist::check_same_settings(r.comm, shared_settings(args));
  r.schedule = parse_lr_schedule(args.lr_scheduler_type);
  r.source = resolve_model(args);
  r.B = args.per_device_train_batch_size;
  r.T = r.source.seq_len;
  r.accum = args.gradient_accumulation_steps;

  r.data_path = training_data_path(args);
  std::vector<int32_t> tokens =
      load_tokens(r.data_path, *r.source.tokenizer, r.source.config.vocab_size());
  r.split = split_train_val(tokens, args.validation_split, r.T + 1);
  if (fs::exists(args.output_dir) && !fs::is_directory(args.output_dir))
    fail(ErrorKind::kInvalidArgument,
         "--output-dir '" + args.output_dir + "' exists and is not a folder");
  // Leftovers of runs killed while writing a checkpoint, before `latest` is looked for.
  if (r.main_rank) clean_stale_checkpoint_temps(args.output_dir);
  r.comm.barrier();
  if (!args.resume_from_checkpoint.empty())
    r.resume_dir = resolve_checkpoint(args.resume_from_checkpoint, args.output_dir);
}

// What reduces the gradients: the collective library, or the communicator's transport.
std::string reducer_name(const Run& r) {
  return r.ddp.device ? r.ddp.device->name() : r.comm.transport() + " through host memory";
}

// Data parallel: this rank's device (dist::device_for_rank) with its share of the host's
// threads, and a line saying which.
std::unique_ptr<Device> open_rank_device(Run& r) {
  dist::Communicator& comm = r.comm;
  std::string threads_why, device_why;
  const int threads = dist::host_threads_for_rank(comm.local_size(), &threads_why);
  dist::apply_host_threads(threads);  // before the backends start their threads
  const std::string spec = dist::device_for_rank(r.args.backend, comm.local_rank(), &device_why);
  std::unique_ptr<Device> dev = open_device(spec);
  std::printf("rank %d/%d (local %d/%d on %s, %s): %s (%s; %s), %s host threads (%s)\n",
              comm.rank(), comm.size(), comm.local_rank(), comm.local_size(), comm.host().c_str(),
              comm.transport().c_str(), dev->info().id().c_str(), dev->info().name.c_str(),
              device_why.c_str(), threads > 0 ? std::to_string(threads).c_str() : "default",
              threads_why.c_str());
  std::fflush(stdout);
  return dev;
}

// Data parallel: every rank's trainable weights hash the same `when` (collective).
void check_replicas(Run& r, const std::string& when) {
  if (r.world == 1) return;
  const Tensor flat = r.model->trainable_flat();
  std::vector<char> bytes(flat.nbytes());
  r.device->download(bytes.data(), flat, bytes.size());
  dist::check_same_weights(r.comm, dist::hash_bytes(bytes.data(), bytes.size()), when);
}

// --ddp-backend: the device's collective library or MPI through host memory, and a line per rank
// saying which and why (with one process, only where a library was asked for).
void choose_reducer(Run& r) {
  r.ddp = dist::choose_ddp_backend(r.comm, *r.device, r.args.ddp_backend);
  if (r.ddp.device) r.ddp.device->set_timeout(static_cast<double>(r.args.ddp_timeout));
  if (r.world == 1 && !r.ddp.device) return;
  std::printf("rank %d/%d: ddp backend %s: %s (%s)\n", r.comm.rank(), r.comm.size(),
              r.ddp.name.c_str(), reducer_name(r).c_str(), r.ddp.why.c_str());
  std::fflush(stdout);
}

// The device, the model on it (pretrained weights loaded), the loss scaler, the activations, the
// optimizer and the tensors every step uses.
void open_model(Run& r) {
  const TrainArgs& args = r.args;
  r.device = r.world > 1 ? open_rank_device(r) : open_device(args.backend);
  Device& dev = *r.device;
  if (args.profile) dev.set_profiling(true);
  if (args.tf32 && dev.info().tf32) dev.set_allow_tf32(true);
  if (args.tf32 && !dev.info().tf32 && r.main_rank)
    std::printf("--tf32: %s has no TF32 matmuls; it computes fp32 matmuls in full fp32\n",
                dev.info().id().c_str());
  choose_reducer(r);
  r.mopts = model_options(args, dev.info());
  r.model = make_model(dev, r.source.config, /*with_grads=*/true, r.mopts);
  Model& model = *r.model;
  model.init(args.seed);
  // The pretrained weights, unless a checkpoint replaces them (a LoRA checkpoint holds only the
  // adapters: the frozen base always comes from the folder).
  if (!r.source.pretrained.empty() && (args.resume_from_checkpoint.empty() || model.lora()))
    load_weights_from_folder(r.source.pretrained, model);
  LossScalerConfig scaler_config;
  scaler_config.init_scale = static_cast<float>(args.fp16_init_scale);
  r.scaler = std::make_unique<LossScaler>(r.mopts.policy.loss_scaling, scaler_config);
  model.allocate_activations(r.B, r.T);
  OptimizerSettings settings = optimizer_settings(args);
  if (args.zero_stage == 1) {
    const std::vector<int64_t> bounds = zero_partition(
        model.trainable_params(), model.trainable_flat().numel(), settings.kind, r.world);
    const size_t rank = static_cast<size_t>(r.comm.rank());
    r.shard = {1, r.comm.rank(), r.world, bounds[rank], bounds[rank + 1]};
    settings.shard = {r.shard.begin, r.shard.end};
    r.exchange = std::make_unique<dist::ShardExchange>(
        r.comm, dev, bounds, dist::GradientAverager::kDefaultBucketElems, r.ddp.device.get());
  }
  r.optimizer = make_optimizer(model, settings);
  // Per rank: with ZeRO stage 1 the state of this rank's shard.
  r.optimizer_bytes_per_param =
      static_cast<double>(r.optimizer->state_bytes()) / static_cast<double>(model.num_trainable());
  for (const std::string& b : r.comm.all_gather(std::to_string(r.optimizer->state_bytes())))
    r.optimizer_bytes_per_rank.push_back(std::stoll(b));
  r.inputs = dev.empty({r.B, r.T}, DType::i32, MemCategory::kActivations);
  r.targets = dev.empty({r.B, r.T}, DType::i32, MemCategory::kActivations);
  r.loss_sum = dev.empty({1}, DType::f32, MemCategory::kWorkspace);
  r.grad_norm = dev.empty({1}, DType::f32, MemCategory::kWorkspace);
  dev.fill(r.loss_sum, 0.0f);
  // The gradients' all-reduce (ZeRO stage 1: reduce-scatter), bucket by bucket as the backward
  // pass reports them final unless --no-ddp-overlap.
  r.averager = std::make_unique<dist::GradientAverager>(
      r.comm, dev, static_cast<int64_t>(args.ddp_bucket_cap_mb * (1 << 20) / sizeof(float)),
      r.exchange ? r.exchange->bounds() : std::vector<int64_t>{}, r.ddp.device.get());
  if (args.ddp_overlap && r.world > 1)
    model.set_gradients_ready(
        [averager = r.averager.get()](int64_t off, int64_t n) { averager->ready(off, n); });
  r.graph = std::make_unique<StepGraph>(
      dev, step_graph_refusal(args, dev.info(), r.scaler->enabled(), r.world));
  std::string update_refusal = r.graph->refusal();
  if (update_refusal.empty() && r.exchange)
    update_refusal = "--zero-stage 1 combines the shards' gradient norms on the host";
  if (update_refusal.empty()) update_refusal = r.optimizer->graph_refusal();
  r.update_graph = std::make_unique<StepGraph>(dev, update_refusal);
}

// Resume: weights, optimizer state, step, data position and the open logging window of the
// checkpoint, if there is one.
void restore_run(Run& r) {
  const TrainArgs& args = r.args;
  // Rank k reads rows [k B, k B + B) of each batch of world x B rows.
  r.loader = std::make_unique<BatchLoader>(r.split.train, int64_t{r.B} * r.world, r.T, args.seed, 3,
                                           RowShard{int64_t{r.comm.rank()} * r.B, int64_t{r.B}});
  if (!r.resume_dir.empty()) {
    nlohmann::json st = load_checkpoint(r.resume_dir, *r.model, *r.optimizer, r.shard);
    // The data position counts batches of world x B rows: the same rows per batch continue
    // the same data, whatever the world size (the state is the same on every rank).
    const int64_t saved_world = st.value("world_size", int64_t{1});
    const int64_t saved_rows =
        saved_world * st.value("args", nlohmann::json::object())
                          .value("per_device_train_batch_size", int64_t{r.B});
    if (saved_world != r.world && saved_rows != int64_t{r.B} * r.world)
      fail(ErrorKind::kInvalidArgument,
           r.resume_dir + " was written by " + std::to_string(saved_world) + " rank(s) reading " +
               std::to_string(saved_rows) + " rows per batch; this run has world size " +
               std::to_string(r.world) + " x " + std::to_string(r.B) + " rows: its data " +
               "position would name other data. Resume with world size " +
               std::to_string(saved_world) +
               ", or a --per-device-train-batch-size that keeps the global batch");
    r.start_step = st["step"].get<int64_t>();
    r.loader->seek(st["data_position"].get<int64_t>());
    float partial = st.value("logging_window_loss_sum", 0.0f);
    r.window_steps = st.value("logging_window_steps", int64_t{0});
    if (st.contains("loss_scaler")) r.scaler->load_state(st["loss_scaler"]);
    r.device->upload(r.loss_sum, &partial, sizeof partial);
  }
  check_replicas(r,
                 r.resume_dir.empty() ? "after initialisation" : "after loading " + r.resume_dir);
}

// ZeRO stage 1's part of optimizer_step once the averager has reduce-scattered the gradients
// (this rank's shard averaged): the fp16 check and the norm over the shards (combined across
// ranks, so every rank decides and clips alike), this rank's shard updated and the weights
// all-gathered. Returns whether fp16 found an inf/NaN (the step skipped on every rank).
bool zero_update(Run& r, double lr, int64_t step) {
  Device& dev = *r.device;
  Model& model = *r.model;
  LossScaler& scaler = *r.scaler;
  const int64_t len = r.shard.end - r.shard.begin;
  const Tensor grads = model.trainable_grads().slice_flat(r.shard.begin, {len});
  // [0]: whether a shard had an inf/NaN, [1]: the shards' squared norms.
  double sums[2] = {len > 0 && scaler.unscale_and_check(dev, grads) ? 1.0 : 0.0, 0.0};
  if (r.scaler->enabled()) r.comm.all_reduce(sums, 1, dist::ReduceOp::kSum);
  if (sums[0] > 0) return true;
  float norm = 0.0f;
  if (len > 0) {
    dev.norm(r.grad_norm, grads);
    dev.download(&norm, r.grad_norm, sizeof norm);
  }
  sums[1] = static_cast<double>(norm) * norm;
  r.comm.all_reduce(&sums[1], 1, dist::ReduceOp::kSum);
  norm = static_cast<float>(std::sqrt(sums[1]));
  dev.upload(r.grad_norm, &norm, sizeof norm);
  r.optimizer->step(model, r.grad_norm, lr, step + 1 - scaler.skipped_steps());
  r.exchange->all_gather(model.trainable_flat());
  model.refresh_compute_weights();  // every shard's weights changed, not only this rank's
  return false;
}

// The update after the gradients are final (world 1, or averaged): their norm, the optimizer's
// step `t` (1-based) at rate `lr`, and the 16-bit compute weights refreshed from the master
// (by the optimizer's own kernel where it updates_compute_copy(), else by a copy after it).
// Where the optimizer splits its step for a graph, its host part (the schedule's upload) runs
// first and the rest is run through the update's graph (captured at the second call).
void update(Run& r, double lr, int64_t t) {
  Device& dev = *r.device;
  Model& model = *r.model;
  const bool split = r.optimizer->graph_refusal().empty();
  if (split) r.optimizer->set_schedule(model, lr, t);
  r.update_graph->run([&] {
    dev.norm(r.grad_norm, model.trainable_grads());
    if (split)
      r.optimizer->apply(model, r.grad_norm);
    else
      r.optimizer->step(model, r.grad_norm, lr, t);
    if (!r.optimizer->updates_compute_copy()) model.refresh_compute_weights();
  });
}

// One optimizer step (0-based `step`): `accum` micro-batches whose gradients add up to the
// gradient of the mean loss over all of them (each backward is weighted 1/accum), then the
// update unless fp16 found an inf/NaN gradient. Returns the step's learning rate.
double optimizer_step(Run& r, int64_t step) {
  const TrainArgs& args = r.args;
  Device& dev = *r.device;
  Model& model = *r.model;
  LossScaler& scaler = *r.scaler;
  model.zero_grad();
  for (int micro = 0; micro < r.accum; ++micro) {
    Batch batch = r.loader->next();
    dev.upload(r.inputs, batch.inputs.data(), batch.inputs.size() * sizeof(int32_t));
    dev.upload(r.targets, batch.targets.data(), batch.targets.size() * sizeof(int32_t));
    // LoRA dropout masks are numbered by micro-batch (and rank): the same on resume, off for
    // evaluation.
    model.set_lora_dropout_draw(args.seed, (step * r.accum + micro) * r.world + r.comm.rank());
    // The last micro-batch's backward finishes the gradients: the averager takes the buckets it
    // reports final from here on (the earlier ones would be added to).
    if (micro + 1 == r.accum) r.averager->begin(model.trainable_grads());
    // forward and backward, the loss and its gradient over the logits in one pass (captured
    // into a graph and replayed where the device and settings allow: the same ops every time)
    const float dloss_scale = scaler.scale() / static_cast<float>(r.accum);
    r.graph->run([&] {
      Tensor loss = model.forward_backward(r.inputs, r.targets, r.B, r.T, dloss_scale);
      dev.accumulate(r.loss_sum, loss);
    });
    model.set_lora_dropout_draw(args.seed, -1);
  }
  // Data parallel: each rank's gradient is of its rows' mean loss; their mean is the gradient of
  // the whole batch's. Before the fp16 check, so an inf on one rank skips the step on all.
  const double lr = lr_at(r.schedule, args.learning_rate, step, args.warmup_steps, args.max_steps);
  bool found_inf = false;
  r.averager->finish();  // ZeRO stage 1: this rank's shard averaged
  if (r.exchange) {
    found_inf = zero_update(r, lr, step);
  } else {
    // fp16: unscale the gradients and skip the step if any is inf/NaN (GradScaler semantics).
    found_inf = scaler.unscale_and_check(dev, model.trainable_grads());
    if (!found_inf) update(r, lr, step + 1 - scaler.skipped_steps());
  }
  scaler.update(found_inf, step + 1);
  dev.flush();
  ++r.window_steps;
  r.window_tokens += static_cast<int64_t>(r.B) * r.T * r.accum * r.world;
  return lr;
}

// The log line and metrics.jsonl record after `done` steps: the window's mean loss, throughput
// and memory, and the evaluation loss when `do_eval`. Closes the window.
void log_window(Run& r, int64_t done, double lr, bool do_eval, std::ofstream& metrics,
                ProgressBar& bar) {
  const TrainArgs& args = r.args;
  Device& dev = *r.device;
  TrainSummary& s = r.summary;
  float host_loss_sum = 0, host_norm = 0;
  dev.download(&host_loss_sum, r.loss_sum, sizeof(float));
  dev.download(&host_norm, r.grad_norm, sizeof(float));
  dev.fill(r.loss_sum, 0.0f);
  r.comm.all_reduce(&host_loss_sum, 1, dist::ReduceOp::kAverage);  // the whole batch's mean
  double window_s = std::chrono::duration<double>(Clock::now() - r.t_window).count();
  double tps = static_cast<double>(r.window_tokens) / std::max(window_s, 1e-9);
  double mean_loss = host_loss_sum / static_cast<double>(r.window_steps * r.accum);
  if (!std::isfinite(mean_loss))
    fail(ErrorKind::kInvalidArgument, "training diverged: the loss is " +
                                          std::to_string(mean_loss) + " at step " +
                                          std::to_string(done) + " (try a lower --learning-rate)");
  if (!r.have_first) s.first_loss = mean_loss, r.have_first = true;
  s.final_loss = mean_loss;
  s.tokens_per_s = tps;

  nlohmann::json rec =
      log_record(done, mean_loss, lr, host_norm, tps, dev, r.optimizer_bytes_per_param,
                 *r.optimizer, r.offload_logged, *r.scaler);
  // Data parallel: ranks, and the gradient all-reduce's seconds per step in this window.
  rec["world_size"] = r.world;
  rec["ddp_backend"] = r.ddp.name;
  rec["collectives"] = reducer_name(r);
  rec["comm_s"] = (r.comm_seconds() - r.comm_logged) / static_cast<double>(r.window_steps);
  r.comm_logged = r.comm_seconds();
  // The part of comm_s that ran while the backward pass was still running (bucket overlap).
  rec["comm_overlap_s"] =
      (r.averager->overlap_seconds() - r.overlap_logged) / static_cast<double>(r.window_steps);
  r.overlap_logged = r.averager->overlap_seconds();
  // Optimizer state bytes of each rank (--zero-stage 1: of its shard; rank 0's in
  // "optimizer_bytes" and, over every parameter, in "optimizer_bytes_per_param").
  rec["zero_stage"] = args.zero_stage;
  rec["optimizer_bytes"] = r.optimizer->state_bytes();
  rec["optimizer_bytes_per_rank"] = r.optimizer_bytes_per_rank;
  // Whether micro-batches are replayed as a graph (the device counts the replays), or why not.
  if (dev.info().graphs) {
    rec["step_graph"] = r.graph->enabled() ? "on" : r.graph->refusal();
    rec["update_graph"] = r.update_graph->enabled() ? "on" : r.update_graph->refusal();
  }
  char line[256];
  std::snprintf(line, sizeof line, "step %5lld/%lld  loss %.4f  lr %.2e  grad_norm %.3f  %s tok/s",
                static_cast<long long>(done), static_cast<long long>(args.max_steps), mean_loss, lr,
                host_norm, format_count(tps).c_str());
  std::string text = line;
  if (do_eval && r.main_rank) {  // the weights are the same on every rank: rank 0 evaluates
    auto e0 = Clock::now();
    EvalResult ev = evaluate(*r.model, r.split.val, r.T, r.B, args.max_eval_batches);
    r.eval_seconds += std::chrono::duration<double>(Clock::now() - e0).count();
    rec["eval_loss"] = ev.loss;
    rec["eval_tokens"] = ev.tokens;
    s.eval_loss = ev.loss;
    std::snprintf(line, sizeof line, "  eval_loss %.4f", ev.loss);
    text += line;
  }
  if (r.main_rank) {
    metrics << rec.dump() << '\n' << std::flush;
    bar.println(text);
  }
  r.window_steps = 0;
  r.window_tokens = 0;
  r.t_window = Clock::now();  // evaluation time is not training throughput
}

// A checkpoint after `done` steps, with the open logging window so that a resumed run logs the
// same lines.
void save_step_checkpoint(Run& r, int64_t done, double lr, ProgressBar& bar) {
  const TrainArgs& args = r.args;
  float partial = 0;
  r.device->download(&partial, r.loss_sum, sizeof partial);
  // The whole batch's loss: a rank's own loss_sum continues from it on resume, and the average
  // at the next log line is then the whole batch's again.
  r.comm.all_reduce(&partial, 1, dist::ReduceOp::kAverage);
  check_replicas(r, "at the checkpoint of step " + std::to_string(done));
  const std::string base = r.source.pretrained.empty() ? args.model : r.source.pretrained;
  if (r.exchange) {  // ZeRO stage 1: every rank writes its optimizer shard, rank 0 the rest
    nlohmann::json st =
        checkpoint_state(args, done, r.loader->position(), partial, r.window_steps, r.schedule, lr,
                         *r.optimizer, *r.scaler, r.mopts.policy, r.source.config);
    st["world_size"] = r.world;
    const std::string path =
        save_sharded_checkpoint(r.comm, r.shard, args.output_dir, done, *r.model, *r.optimizer, st,
                                args.save_total_limit, r.source.tokenizer->folder(), base);
    if (r.main_rank) bar.println("saved " + path);
    r.t_window = Clock::now();
    return;
  }
  if (!r.main_rank) return;  // the state is the same on every rank: rank 0 writes it
  nlohmann::json st =
      checkpoint_state(args, done, r.loader->position(), partial, r.window_steps, r.schedule, lr,
                       *r.optimizer, *r.scaler, r.mopts.policy, r.source.config);
  st["world_size"] = r.world;
  std::string path = save_checkpoint(args.output_dir, done, *r.model, *r.optimizer, st,
                                     args.save_total_limit, r.source.tokenizer->folder(), base);
  bar.println("saved " + path);
  r.t_window = Clock::now();
}

// The summary's totals, the profile, the trained model's files and the sample.
void finish_run(Run& r) {
  const TrainArgs& args = r.args;
  Device& dev = *r.device;
  TrainSummary& s = r.summary;
  dev.synchronize();
  s.steps = args.max_steps - r.start_step;
  s.tokens = s.steps * r.B * r.T * r.accum * r.world;
  s.seconds = std::chrono::duration<double>(Clock::now() - r.t_start).count();
  s.tokens_per_s = static_cast<double>(s.tokens) / std::max(s.seconds - r.eval_seconds, 1e-9);
  s.peak_memory = dev.memory().total_peak;
  s.rank = r.comm.rank();
  s.world_size = r.world;
  s.zero_stage = args.zero_stage;
  s.optimizer_bytes = r.optimizer->state_bytes();

  check_replicas(r, "at the end of training");
  if (!r.main_rank) return;
  if (args.profile) std::printf("%s", dev.profile_report().c_str());
  save_trained_model(args, r.source, *r.model);
  if (args.sample_tokens > 0) s.sample = sample_text(args, *r.source.tokenizer, *r.model);
}

}  // namespace

OptimizerSettings optimizer_settings(const TrainArgs& a) {
  OptimizerSettings os;
  os.weight_decay = a.weight_decay;
  os.beta1 = a.adam_beta1;
  os.beta2 = a.adam_beta2;
  os.eps = a.adam_epsilon;
  os.max_grad_norm = a.max_grad_norm;
  os.kind = parse_optim(a.optim);
  os.momentum = a.sgd_momentum;
  os.dampening = a.sgd_dampening;
  os.nesterov = a.sgd_nesterov;
  os.relative_step = a.adafactor_relative_step || a.learning_rate == 0.0;
  os.scale_parameter = a.adafactor_scale_parameter || a.learning_rate == 0.0;
  os.warmup_init = a.adafactor_warmup_init;
  os.clip_threshold = a.adafactor_clip_threshold;
  os.decay_rate = a.adafactor_decay_rate;
  os.adafactor_beta1 = a.adafactor_beta1;
  os.offload = a.offload_optimizer;
  os.delayed_update = a.offload_delayed_update;
  return os;
}

TrainSummary train(const TrainArgs& args) {
  Run r(args, dist::world());
  prepare_run(r);
  open_model(r);
  restore_run(r);
  std::ofstream metrics;
  if (r.main_rank) metrics = open_metrics(args.output_dir, r.start_step);
  r.summary.device = r.device->info().id() + " (" + r.device->info().name + ")";
  r.summary.num_parameters = r.model->num_parameters();
  if (r.main_rank)
    print_run_header(args, r.source, *r.model, r.mopts, r.summary.device, r.data_path, r.split,
                     r.start_step, r.resume_dir, r.comm, reducer_name(r));
  if (r.main_rank && r.device->info().graphs) {
    if (!r.graph->enabled())
      std::printf("graph: off, each op launched on its own: %s\n", r.graph->refusal().c_str());
    else if (r.update_graph->enabled())
      std::printf(
          "graph: each micro-batch's forward and backward, and the update (norm, optimizer, "
          "weight refresh), captured at the second and replayed as one launch each "
          "(--no-cuda-graph: one launch per op)\n");
    else
      std::printf(
          "graph: each micro-batch's forward and backward captured at the second and replayed "
          "as one launch; the graph stops before the update, launched op by op: %s\n",
          r.update_graph->refusal().c_str());
    std::fflush(stdout);
  }
  ProgressBar bar(r.start_step, args.max_steps, args.progress_bar && r.main_rank);
  r.t_start = r.t_window = Clock::now();
  for (int64_t step = r.start_step; step < args.max_steps; ++step) {
    const double lr = optimizer_step(r, step);
    const int64_t done = step + 1;
    const bool last = done == args.max_steps;
    const bool do_eval = last || (args.eval_steps > 0 && done % args.eval_steps == 0);
    const bool do_log = do_eval || last || done % args.logging_steps == 0;
    const bool do_save = args.save_steps > 0 && done % args.save_steps == 0;
    // --offload-delayed-update: a checkpoint and the end of training are pipeline barriers. The
    // update in flight is finished and the model gets the weights after all `done` updates, so a
    // checkpoint holds weights and optimizer state after the same number of updates, and the
    // next step starts a new synchronous warm-up step (a resumed run does the same, which keeps
    // resuming bit-exact). Evaluations in between use the model's weights, one update behind.
    // With ZeRO stage 1 each rank finished its shard: the weights are gathered again.
    if ((last || do_save) && r.optimizer->finish(*r.model)) {
      if (r.exchange) r.exchange->all_gather(r.model->trainable_flat());
      r.model->refresh_compute_weights();
    }
    if (do_log) log_window(r, done, lr, do_eval, metrics, bar);
    if (do_save) save_step_checkpoint(r, done, lr, bar);
    bar.update(done, r.summary.final_loss, r.summary.tokens_per_s,
               r.device->memory().total_current);
  }
  r.graph->release();  // before the sample, which may size the activations anew
  r.update_graph->release();
  bar.finish();
  finish_run(r);
  return r.summary;
}

}  // namespace ct
