#include "core/train/trainer.h"

#include <sys/resource.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/data/batch_loader.h"
#include "core/data/text_dataset.h"
#include "core/data/tokenizer.h"
#include "core/error.h"
#include "core/model/gpt2.h"
#include "core/registry.h"
#include "core/train/evaluate.h"
#include "core/train/model_files.h"
#include "core/train/progress.h"
#include "core/train/schedule.h"

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
  require_flag(a.warmup_steps >= 0, "--warmup-steps", std::to_string(a.warmup_steps), "must be >= 0");
  require_flag(std::isfinite(a.weight_decay) && a.weight_decay >= 0, "--weight-decay",
               std::to_string(a.weight_decay), "must be >= 0");
  require_flag(a.adam_beta1 >= 0 && a.adam_beta1 < 1, "--adam-beta1", std::to_string(a.adam_beta1),
               "must be in [0, 1)");
  require_flag(a.adam_beta2 >= 0 && a.adam_beta2 < 1, "--adam-beta2", std::to_string(a.adam_beta2),
               "must be in [0, 1)");
  require_flag(a.adam_epsilon > 0, "--adam-epsilon", std::to_string(a.adam_epsilon), "must be > 0");
  require_flag(std::isfinite(a.max_grad_norm) && a.max_grad_norm >= 0, "--max-grad-norm",
               std::to_string(a.max_grad_norm), "must be >= 0 (0 disables clipping)");
  require_flag(a.logging_steps > 0, "--logging-steps", std::to_string(a.logging_steps), "must be > 0");
  require_flag(a.eval_steps >= 0, "--eval-steps", std::to_string(a.eval_steps),
               "must be >= 0 (0 evaluates only at the end)");
  require_flag(a.validation_split > 0 && a.validation_split < 1, "--validation-split",
               std::to_string(a.validation_split), "must be in (0, 1)");
  require_flag(a.max_eval_batches >= 0, "--max-eval-batches", std::to_string(a.max_eval_batches),
               "must be >= 0 (0 evaluates every window)");
  require_flag(a.sample_tokens >= 0, "--sample-tokens", std::to_string(a.sample_tokens), "must be >= 0");
}

GPT2Config resolve_config(const TrainArgs& a) {
  GPT2Config c = GPT2Config::preset(a.model);
  auto override_dim = [](int v, int& field, const char* flag) {
    if (v < 0) fail(ErrorKind::kInvalidArgument, std::string(flag) + " " + std::to_string(v) + ": must be > 0");
    if (v > 0) field = v;
  };
  override_dim(a.n_layer, c.n_layer, "--n-layer");
  override_dim(a.n_head, c.n_head, "--n-head");
  override_dim(a.n_embd, c.n_embd, "--n-embd");
  override_dim(a.block_size, c.block_size, "--block-size");
  override_dim(a.vocab_size, c.vocab_size, "--vocab-size");
  c.validate();
  if (c.vocab_size < ByteTokenizer().vocab_size())
    fail(ErrorKind::kInvalidArgument, "--vocab-size " + std::to_string(c.vocab_size) +
                                          ": the byte-level tokenizer needs at least 256");
  return c;
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

}  // namespace

TrainSummary train(const TrainArgs& args) {
  // ---- everything is checked before anything is written --------------------------------------
  validate_args(args);
  LrSchedule schedule = parse_lr_schedule(args.lr_scheduler_type);
  GPT2Config config = resolve_config(args);
  const int B = args.per_device_train_batch_size;
  const int T = config.block_size;

  std::string data_path = args.data.empty() ? kDefaultDataPath : args.data;
  if (args.data.empty() && !fs::exists(data_path))
    fail(ErrorKind::kInvalidArgument,
         "the built-in default data " + data_path +
             " is missing: install Debian's 'fortunes' package (the setup script does) or pass --data");
  ByteTokenizer tokenizer;
  std::vector<int32_t> tokens = tokenizer.encode(load_text(data_path, 1));
  TokenSplit split = split_train_val(tokens, args.validation_split, T + 1);
  if (fs::exists(args.output_dir) && !fs::is_directory(args.output_dir))
    fail(ErrorKind::kInvalidArgument, "--output-dir '" + args.output_dir + "' exists and is not a folder");

  std::unique_ptr<Device> device = open_device(args.backend);
  Device& dev = *device;
  GPT2 model(dev, config);
  model.init(args.seed);
  model.allocate_activations(B, T);
  const int64_t n = model.num_parameters(), nd = model.decay_count();
  Tensor m = dev.empty({n}, DType::f32, MemCategory::kOptimizer);
  Tensor v = dev.empty({n}, DType::f32, MemCategory::kOptimizer);
  dev.fill(m, 0.0f);
  dev.fill(v, 0.0f);
  Tensor inputs = dev.empty({B, T}, DType::i32, MemCategory::kActivations);
  Tensor targets = dev.empty({B, T}, DType::i32, MemCategory::kActivations);
  Tensor loss_sum = dev.empty({1}, DType::f32, MemCategory::kWorkspace);
  Tensor grad_norm = dev.empty({1}, DType::f32, MemCategory::kWorkspace);
  dev.fill(loss_sum, 0.0f);

  std::error_code ec;
  fs::create_directories(args.output_dir, ec);
  if (ec) fail(ErrorKind::kIo, "cannot create --output-dir '" + args.output_dir + "': " + ec.message());
  std::string metrics_path = (fs::path(args.output_dir) / "metrics.jsonl").string();
  std::ofstream metrics(metrics_path, std::ios::trunc);
  if (!metrics) fail(ErrorKind::kIo, "cannot write " + metrics_path);

  TrainSummary s;
  s.device = dev.info().id() + " (" + dev.info().name + ")";
  s.num_parameters = n;
  std::printf("crosstrain: training GPT-2 %s (%s, %s parameters) on %s\n", args.model.c_str(),
              config.str().c_str(), format_count(static_cast<double>(n)).c_str(), s.device.c_str());
  std::printf("data: %s, %s train / %s validation tokens; batch %d x %d; %lld steps\n",
              data_path.c_str(), format_count(static_cast<double>(split.train.size())).c_str(),
              format_count(static_cast<double>(split.val.size())).c_str(), B, T,
              static_cast<long long>(args.max_steps));
  std::fflush(stdout);

  BatchLoader loader(split.train, B, T, args.seed);
  ProgressBar bar(0, args.max_steps, args.progress_bar);
  auto t_start = Clock::now(), t_window = t_start;
  double eval_seconds = 0;
  int64_t window_steps = 0;
  bool have_first = false;

  for (int64_t step = 0; step < args.max_steps; ++step) {
    Batch batch = loader.next();
    dev.upload(inputs, batch.inputs.data(), batch.inputs.size() * sizeof(int32_t));
    dev.upload(targets, batch.targets.data(), batch.targets.size() * sizeof(int32_t));
    model.zero_grad();
    Tensor loss = model.forward(inputs, &targets, B, T);
    model.backward();
    dev.accumulate(loss_sum, loss);
    dev.norm(grad_norm, model.grads_flat());

    double lr = lr_at(schedule, args.learning_rate, step, args.warmup_steps, args.max_steps);
    AdamWHyper hp;
    hp.lr = static_cast<float>(lr);
    hp.beta1 = static_cast<float>(args.adam_beta1);
    hp.beta2 = static_cast<float>(args.adam_beta2);
    hp.eps = static_cast<float>(args.adam_epsilon);
    hp.step = step + 1;
    hp.max_grad_norm = static_cast<float>(args.max_grad_norm);
    hp.weight_decay = static_cast<float>(args.weight_decay);
    dev.adamw(model.params_decay(), model.grads_decay(), m.slice_flat(0, {nd}),
              v.slice_flat(0, {nd}), grad_norm, hp);
    hp.weight_decay = 0.0f;
    dev.adamw(model.params_no_decay(), model.grads_no_decay(), m.slice_flat(nd, {n - nd}),
              v.slice_flat(nd, {n - nd}), grad_norm, hp);
    dev.flush();
    ++window_steps;

    const int64_t done = step + 1;
    const bool last = done == args.max_steps;
    const bool do_eval = last || (args.eval_steps > 0 && done % args.eval_steps == 0);
    const bool do_log = do_eval || last || done % args.logging_steps == 0;
    if (!do_log) {
      bar.update(done, s.final_loss, s.tokens_per_s, dev.memory().total_current);
      continue;
    }
    float host_loss_sum = 0, host_norm = 0;
    dev.download(&host_loss_sum, loss_sum, sizeof(float));
    dev.download(&host_norm, grad_norm, sizeof(float));
    dev.fill(loss_sum, 0.0f);
    auto now = Clock::now();
    double window_s = std::chrono::duration<double>(now - t_window).count();
    double tps = static_cast<double>(window_steps) * B * T / std::max(window_s, 1e-9);
    double mean_loss = host_loss_sum / static_cast<double>(window_steps);
    if (!std::isfinite(mean_loss))
      fail(ErrorKind::kInvalidArgument, "training diverged: the loss is " + std::to_string(mean_loss) +
                                            " at step " + std::to_string(done) +
                                            " (try a lower --learning-rate)");
    if (!have_first) s.first_loss = mean_loss, have_first = true;
    s.final_loss = mean_loss;
    s.tokens_per_s = tps;

    nlohmann::json rec;
    rec["step"] = done;
    rec["loss"] = mean_loss;
    rec["lr"] = lr;
    rec["grad_norm"] = host_norm;
    rec["tokens_per_s"] = tps;
    rec["memory"] = memory_json(dev.memory());
    char line[256];
    std::snprintf(line, sizeof line, "step %5lld/%lld  loss %.4f  lr %.2e  grad_norm %.3f  %s tok/s",
                  static_cast<long long>(done), static_cast<long long>(args.max_steps), mean_loss, lr,
                  host_norm, format_count(tps).c_str());
    std::string text = line;
    if (do_eval) {
      auto e0 = Clock::now();
      EvalResult ev = evaluate(model, split.val, T, B, args.max_eval_batches);
      double es = std::chrono::duration<double>(Clock::now() - e0).count();
      eval_seconds += es;
      rec["eval_loss"] = ev.loss;
      rec["eval_tokens"] = ev.tokens;
      s.eval_loss = ev.loss;
      std::snprintf(line, sizeof line, "  eval_loss %.4f", ev.loss);
      text += line;
    }
    t_window = Clock::now();  // evaluation time is not training throughput
    window_steps = 0;
    metrics << rec.dump() << '\n' << std::flush;
    bar.println(text);
    bar.update(done, mean_loss, tps, dev.memory().total_current);
  }
  bar.finish();
  dev.synchronize();
  s.steps = args.max_steps;
  s.tokens = args.max_steps * B * T;
  s.seconds = std::chrono::duration<double>(Clock::now() - t_start).count();
  s.tokens_per_s = static_cast<double>(s.tokens) / std::max(s.seconds - eval_seconds, 1e-9);
  s.peak_memory = dev.memory().total_peak;

  save_model(args.output_dir, model);
  if (args.sample_tokens > 0) {
    SampleOptions so;
    so.temperature = 0.8f;
    so.top_k = 40;
    so.seed = args.seed;
    std::vector<int32_t> prompt = tokenizer.encode(args.sample_prompt.empty() ? "\n" : args.sample_prompt);
    s.sample = args.sample_prompt + tokenizer.decode(model.generate(prompt, args.sample_tokens, so));
  }
  return s;
}

}  // namespace ct
