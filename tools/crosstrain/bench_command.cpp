// `crosstrain bench --techniques`: the single-GPU training guides' table, measured. Each row is a
// separate `crosstrain train` process (so its peak RSS is its own) on the same model, data and
// effective batch; results go to Markdown, JSON and (with gnuplot) a PNG chart.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <variant>
#include <vector>

#include "core/amp/precision.h"
#include "core/error.h"
#include "core/model/config.h"
#include "core/model/gpt2.h"
#include "core/model/llama.h"
#include "core/model/model_config.h"
#include "core/registry.h"
#include "core/train/progress.h"
#include "tools/crosstrain/cli_util.h"
#include "tools/crosstrain/commands.h"
#include "tools/crosstrain/report_run.h"

namespace ct::cli {
namespace {
namespace fs = std::filesystem;

struct Technique {
  std::string name = "";
  std::vector<std::string> flags = {};  // besides the common ones
  int micro_batch_divisor = 1;          // accumulation: micro-batch = batch / divisor
  bool mixed = false;                   // a 16-bit policy: adds a 2-byte weight copy
  bool checkpointing = false;
  double optimizer_bytes_per_param = 8;  // AdamW: two fp32 moments
  bool unfused_attention = false;        // --attention unfused: the probabilities stored
  int lora_r = 0;                        // LoRA: the base frozen, adapters on lora_targets
  std::string lora_targets = "";
};

// Optimizer state bytes per parameter of --optim `kind` on cfg's tensors (optimizer.h's formulas).
double optimizer_bytes_per_param(const ModelConfig& cfg, const std::string& kind) {
  double bytes = 0, n = 0;
  const std::vector<ParamInfo> table =
      cfg.is_llama() ? llama_param_table(cfg.llama()) : gpt2_param_table(cfg.gpt2());
  for (const ParamInfo& p : table) {
    const double numel = static_cast<double>(p.numel), cols = static_cast<double>(p.shape.d[1]);
    n += numel;
    if (kind == "adafactor")
      bytes += p.shape.ndim >= 2 ? 4 * (numel / cols + cols) : 4 * numel;
    else if (kind == "adamw_8bit" && p.numel >= 4096)
      bytes += 2 * numel + 8.0 * static_cast<double>(quant_blocks(p.numel));
    else
      bytes += 8 * numel;
  }
  return bytes / n;
}

// The row's adapters (alpha 16 on its targets), or none.
LoraOptions row_lora(const Technique& t) {
  LoraOptions lo;
  if (t.lora_r <= 0) return lo;
  lo.r = t.lora_r;
  lo.alpha = 16.0f;
  std::stringstream ss(t.lora_targets);
  for (std::string m; std::getline(ss, m, ',');) lo.target_modules.push_back(m);
  return lo;
}

// Device memory a row needs, from first principles: fp32 weights (+ a 16-bit copy when mixed;
// LoRA under bf16: the 16-bit base only), fp32 gradients, optimizer state, and the
// activations the model's formula predicts. With LoRA the gradients and the optimizer state are
// the adapters' (LoraAdapters::weight_bytes: their master and compute copy).
int64_t predicted_bytes(const ModelConfig& mc, const Technique& t, int micro_batch) {
  const int64_t n = mc.num_parameters();
  const PrecisionPolicy policy =
      PrecisionPolicy::make(t.mixed ? Precision::kBf16 : Precision::kFp32);
  const LoraOptions lora = row_lora(t);
  int64_t weights = 0, trained = n, activations = 0;
  if (mc.is_llama()) {
    ModelOptions o;
    o.gradient_checkpointing = t.checkpointing;
    o.fused_attention = !t.unfused_attention;
    o.policy = policy;
    o.lora = Llama::resolved_lora(lora);
    const LlamaConfig& c = mc.llama();
    weights = Llama::base_weight_bytes(c, o);  // with the rotary tables
    if (lora.enabled()) {
      trained = LoraAdapters::parameter_count(Llama::lora_sites(c), o.lora);
      weights += LoraAdapters::weight_bytes(Llama::lora_sites(c), o.lora, policy.compute);
    }
    activations = Llama::activation_bytes(c, o, micro_batch, c.block_size);
  } else {
    const GPT2Config& cfg = mc.gpt2();
    ModelOptions o;
    o.gradient_checkpointing = t.checkpointing;
    o.fused_attention = !t.unfused_attention;
    o.policy = policy;
    o.lora = GPT2::resolved_lora(lora);
    weights = GPT2::base_weight_bytes(cfg, o);
    if (lora.enabled()) {
      trained = GPT2::lora_parameter_count(cfg, o.lora);
      weights += LoraAdapters::weight_bytes(GPT2::lora_sites(cfg), o.lora, policy.compute);
    }
    activations = GPT2::activation_bytes(cfg, o, micro_batch, cfg.block_size);
  }
  return weights + trained * 4 +
         static_cast<int64_t>(t.optimizer_bytes_per_param * static_cast<double>(trained)) +
         activations;
}

struct Row {
  std::string backend, technique;
  int64_t predicted = 0;
  double samples_per_s = 0, tokens_per_s = 0, final_loss = 0;
  int64_t peak_accounted = 0, peak_rss = 0;
  int64_t weights = 0, grads = 0, optimizer = 0, activations = 0, workspace = 0;
  std::string error;
};

Row read_row(const fs::path& dir, int64_t batch_tokens, int T) {
  std::ifstream f(dir / "metrics.jsonl");
  std::vector<nlohmann::json> recs;
  std::string line;
  while (std::getline(f, line)) recs.push_back(nlohmann::json::parse(line));
  Row r;
  if (recs.empty()) {
    r.error = "no metrics";
    return r;
  }
  std::vector<double> tps;  // the first record includes warm-up: leave it out when we can
  for (size_t i = recs.size() > 1 ? 1 : 0; i < recs.size(); ++i)
    tps.push_back(recs[i]["tokens_per_s"].get<double>());
  std::sort(tps.begin(), tps.end());
  r.tokens_per_s = tps[tps.size() / 2];
  r.samples_per_s = r.tokens_per_s / T;
  r.final_loss = recs.back()["loss"].get<double>();
  const auto& m = recs.back()["memory"];
  r.peak_accounted = m["peak"].get<int64_t>();
  r.weights = m["weights"].get<int64_t>();
  r.grads = m["grads"].get<int64_t>();
  r.optimizer = m["optimizer"].get<int64_t>();
  r.activations = m["activations"].get<int64_t>();
  r.workspace = m["workspace"].get<int64_t>();
  (void)batch_tokens;
  return r;
}

struct BenchOpts {
  bool techniques = false, quick = false;
  ReportOptions report;
  std::string models, devices, peers, precisions, reference;
  std::vector<std::string> merge;  // OUT, then the reports
  std::string model = "tiny", backends, output_dir = "bench-out", data;
  int batch = 8, accumulation = 4, steps = 12, logging = 3, block_size = 0;
};

// --backends as a list, or every backend that opens.
std::vector<std::string> bench_backends(const std::string& csv) {
  std::vector<std::string> backends;
  if (csv.empty()) {
    for (const auto& e : ct::backends())
      if (e.error.empty()) backends.push_back(e.name);
  } else {
    std::stringstream ss(csv);
    for (std::string b; std::getline(ss, b, ',');) backends.push_back(b);
  }
  return backends;
}

// The table's rows: the training guides' techniques alone and combined, the optimizers, LoRA.
std::vector<Technique> bench_techniques(const ModelConfig& cfg, int accumulation) {
  const std::string acc = std::to_string(accumulation);
  std::vector<Technique> techniques = {
      {.name = "vanilla fp32"},
      {.name = "unfused attention", .flags = {"--attention", "unfused"}, .unfused_attention = true},
      {.name = "+ accumulation x" + acc,
       .flags = {"--gradient-accumulation-steps", acc},
       .micro_batch_divisor = accumulation},
      {.name = "+ checkpointing", .flags = {"--gradient-checkpointing"}, .checkpointing = true},
      {.name = "+ fp16", .flags = {"--fp16"}, .mixed = true},
      {.name = "+ bf16", .flags = {"--bf16"}, .mixed = true},
      {.name = "bf16 + checkpointing + accumulation x" + acc,
       .flags = {"--bf16", "--gradient-checkpointing", "--gradient-accumulation-steps", acc},
       .micro_batch_divisor = accumulation,
       .mixed = true,
       .checkpointing = true},
  };
  // The optimizer rows (core/train/optimizer.h): state bytes per parameter on the device.
  const double bpp_af = optimizer_bytes_per_param(cfg, "adafactor");
  const double bpp_8 = optimizer_bytes_per_param(cfg, "adamw_8bit");
  techniques.push_back({.name = "+ adafactor",
                        .flags = {"--optim", "adafactor"},
                        .optimizer_bytes_per_param = bpp_af});
  techniques.push_back({.name = "+ 8-bit AdamW",
                        .flags = {"--optim", "adamw_8bit"},
                        .optimizer_bytes_per_param = bpp_8});
  techniques.push_back({.name = "+ offload optimizer",
                        .flags = {"--offload-optimizer"},
                        .optimizer_bytes_per_param = 0.0});
  techniques.push_back({.name = "bf16 + checkpointing + 8-bit AdamW",
                        .flags = {"--bf16", "--gradient-checkpointing", "--optim", "adamw_8bit"},
                        .mixed = true,
                        .checkpointing = true,
                        .optimizer_bytes_per_param = bpp_8});
  // LoRA r=8 on the attention projections (PEFT's names), as in the fine-tuning guides.
  const std::string targets =
      cfg.is_llama() ? "q_proj,k_proj,v_proj,o_proj" : "attn.c_attn,attn.c_proj";
  Technique lora{.name = "LoRA r=8 (attention)",
                 .flags = {"--lora-r", "8", "--lora-alpha", "16", "--lora-target-modules", targets},
                 .lora_r = 8,
                 .lora_targets = targets};
  techniques.push_back(lora);
  Technique lora16 = lora;
  lora16.name = "bf16 + LoRA r=8 (attention)";
  lora16.flags.push_back("--bf16");
  lora16.mixed = true;
  techniques.push_back(lora16);
  return techniques;
}

// The `crosstrain train` command line of technique t on `backend`, writing into `dir`.
std::vector<std::string> train_argv(const BenchOpts& o, const std::string& exe,
                                    const std::string& backend, const Technique& t,
                                    const fs::path& dir) {
  std::vector<std::string> argv = {exe,
                                   "train",
                                   "--no-progress",
                                   "--model",
                                   o.model,
                                   "--backend",
                                   backend,
                                   "--output-dir",
                                   dir.string(),
                                   "--max-steps",
                                   std::to_string(o.steps),
                                   "--logging-steps",
                                   std::to_string(o.logging),
                                   "--eval-steps",
                                   "0",
                                   "--max-eval-batches",
                                   "1",
                                   "--sample-tokens",
                                   "0",
                                   "--warmup-steps",
                                   "2",
                                   "--per-device-train-batch-size",
                                   std::to_string(o.batch / t.micro_batch_divisor)};
  if (o.block_size > 0) argv.insert(argv.end(), {"--block-size", std::to_string(o.block_size)});
  if (!o.data.empty()) argv.insert(argv.end(), {"--data", o.data});
  // Every row but "unfused attention" runs the fused attention the prediction assumes
  // (--attention auto would pick unfused on lavapipe).
  if (!t.unfused_attention) argv.insert(argv.end(), {"--attention", "fused"});
  argv.insert(argv.end(), t.flags.begin(), t.flags.end());
  return argv;
}

// One row per backend and technique, each a `crosstrain train` process of its own.
std::vector<Row> run_rows(const BenchOpts& o, const ModelConfig& cfg,
                          const std::vector<std::string>& backends,
                          const std::vector<Technique>& techniques) {
  const std::string exe = (fs::path(executable_dir()) / "crosstrain").string();
  const std::string log = (fs::path(o.output_dir) / "runs.log").string();
  std::vector<Row> rows;
  int T = 0;
  for (const auto& backend : backends) {
    for (const auto& t : techniques) {
      fs::path dir =
          fs::path(o.output_dir) / "runs" / (backend + "-" + std::to_string(rows.size()));
      fs::remove_all(dir);
      std::fprintf(stderr, "bench: %s / %s ...\n", backend.c_str(), t.name.c_str());
      const ChildResult child = run_child(train_argv(o, exe, backend, t, dir), log);
      Row r;
      if (child.status == 0) {
        T = cfg.block_size();  // LoRA rows write adapters, no config.json
        r = read_row(dir, 0, T);
      } else {
        r.error = "exit status " + std::to_string(child.status) + " (see " + log + ")";
      }
      r.backend = backend;
      r.technique = t.name;
      r.predicted = predicted_bytes(cfg, t, o.batch / t.micro_batch_divisor);
      r.peak_rss = child.peak_rss;
      rows.push_back(r);
    }
  }
  return rows;
}

// The Markdown table. "model" = weights + grads + optimizer + activations: what the
// first-principles formula predicts. Backend workspace (scratch of its kernels) is shown apart.
std::string rows_markdown(const std::vector<Row>& rows) {
  std::ostringstream md;
  md << "| backend | technique | samples/s | tokens/s | peak memory (accounting) | model tensors "
        "| "
        "predicted | model vs predicted | workspace | process RSS | activations | final loss |\n"
     << "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
  for (const auto& r : rows) {
    if (!r.error.empty()) {
      md << "| " << r.backend << " | " << r.technique << " | failed: " << r.error
         << " | | | | | | | | | |\n";
      continue;
    }
    char buf[512];
    const int64_t model = r.weights + r.grads + r.optimizer + r.activations;
    double dev = 100.0 * (static_cast<double>(model) / static_cast<double>(r.predicted) - 1.0);
    std::snprintf(buf, sizeof buf,
                  "| %s | %s | %.2f | %s | %s | %s | %s | %+.1f%% | %s | %s | %s | %.4f |\n",
                  r.backend.c_str(), r.technique.c_str(), r.samples_per_s,
                  format_count(r.tokens_per_s).c_str(), format_bytes(r.peak_accounted).c_str(),
                  format_bytes(model).c_str(), format_bytes(r.predicted).c_str(), dev,
                  format_bytes(r.workspace).c_str(), format_bytes(r.peak_rss).c_str(),
                  format_bytes(r.activations).c_str(), r.final_loss);
    md << buf;
  }
  return md.str();
}

nlohmann::json rows_json(const std::vector<Row>& rows) {
  nlohmann::json js = nlohmann::json::array();
  for (const auto& r : rows)
    js.push_back({{"backend", r.backend},
                  {"technique", r.technique},
                  {"samples_per_s", r.samples_per_s},
                  {"tokens_per_s", r.tokens_per_s},
                  {"peak_memory_accounted", r.peak_accounted},
                  {"peak_rss", r.peak_rss},
                  {"predicted_memory", r.predicted},
                  {"weights", r.weights},
                  {"grads", r.grads},
                  {"optimizer", r.optimizer},
                  {"activations", r.activations},
                  {"workspace", r.workspace},
                  {"final_loss", r.final_loss},
                  {"error", r.error}});
  return js;
}

// The chart's data and gnuplot script at `base`.dat / .gp; true when gnuplot drew `base`.png
// (Debian's gnuplot-nox; the table stands on its own otherwise).
bool write_chart(const std::vector<Row>& rows, const fs::path& base, const std::string& model) {
  std::ofstream dat(base.string() + ".dat");
  for (size_t i = 0; i < rows.size(); ++i)
    dat << i << " \"" << rows[i].backend << ": " << rows[i].technique << "\" "
        << rows[i].samples_per_s << " " << rows[i].peak_accounted / 1048576.0 << "\n";
  dat.close();
  std::ofstream gp(base.string() + ".gp");
  gp << "set terminal pngcairo size 1200,680 font ',10'\nset output '" << base.string() << ".png'\n"
     << "set multiplot layout 1,2 title 'crosstrain techniques (" << model << ")'\n"
     << "set style fill solid 0.8\nset boxwidth 0.7\nset xtics rotate by -35 left\nset grid "
        "ytics\nset yrange [0:*]\nset bmargin 14\n"
     << "set title 'throughput'\nset ylabel 'samples/s'\nplot '" << base.string()
     << ".dat' using 1:3:xtic(2) with boxes notitle lc rgb '#4477aa'\n"
     << "set title 'peak memory (accounting)'\nset ylabel 'MiB'\nplot '" << base.string()
     << ".dat' using 1:4:xtic(2) with boxes notitle lc rgb '#cc6677'\nunset multiplot\n";
  gp.close();
  return std::system(("command -v gnuplot >/dev/null 2>&1 && gnuplot '" + base.string() + ".gp'")
                         .c_str()) == 0;
}

}  // namespace

Run add_bench(CLI::App& app) {
  auto o = std::make_shared<BenchOpts>();
  app.add_flag("--techniques", o->techniques, "the training-techniques table");
  flag(&app, "--report", o->report.dir,
       "measure every device into DIR/report.json, report.md and charts: GEMM GFLOP/s, ops "
       "forward/backward, training tokens/s per precision, loss vs the CPU, memory")
      ->type_name("DIR");
  app.add_option(names("--merge"), o->merge,
                 "--merge OUT a.json b.json ...: join reports of several machines into "
                 "OUT/report.json and report.md")
      ->expected(2, 1 << 20)
      ->type_name("OUT FILE...");
  app.add_flag("--quick", o->quick,
               "--report: the GPU check's size: tiny and gpt2, fp32 and bf16, 6 steps, 3 timed "
               "calls per kernel, the CPU's loss of tiny only (each overridden by its own flag)");
  CLI::Option* models = flag(&app, "--models", o->models,
                             "--report: comma-separated presets (tiny, gpt2, smollm-135m)")
                            ->default_str("tiny");
  flag(&app, "--devices", o->devices,
       "--report: comma-separated devices (cpu:0,vulkan:0), or all; default: the first device "
       "of each type per backend, test-only and virtual ones (simt) left out");
  CLI::Option* steps = flag(&app, "--steps", o->report.steps,
                            "--report: training steps per run (the loss is compared after them)");
  flag(&app, "--batch", o->report.batch, "--report: sequences per training step and GEMM rows");
  CLI::Option* iters =
      flag(&app, "--iters", o->report.iters, "--report: timed calls per GEMM and op (at most)");
  CLI::Option* precisions =
      flag(&app, "--precisions", o->precisions,
           "--report: train, and time GEMMs and ops, only in these (fp32, tf32, bf16, fp16; "
           "default: every one the device has)");
  flag(&app, "--peers", o->peers,
       "--report: comma-separated peers measured beside: pytorch, pytorch-compile "
       "(scripts/torch_train.py)");
  CLI::Option* reference =
      flag(&app, "--cpu-reference", o->reference,
           "--report: the models whose loss after --steps a CPU fp32 run gives to compare with, "
           "where cpu:0 is not measured (none; default: every model, --quick: tiny)");
  flag(&app, "--peer-time-limit", o->report.peer_time_limit,
       "--report: seconds each peer run may take; PyTorch stops after the step that crosses "
       "it, llm.c is killed at it, and the report keeps the steps measured, marked capped "
       "(0: no limit)")
      ->type_name("SECONDS");
  flag(&app, "--rounds", o->report.rounds,
       "--report: training runs per model and precision, the precisions alternating; tokens/s "
       "is their median, and each precision's ratio to fp32 the median of the rounds' ratios "
       "(3 or more on a shared machine)");
  flag(&app, "--llmc", o->report.llmc,
       "--report: llm.c's train_gpt2cu (or the folder holding it): gpt2 bf16 tokens/s beside")
      ->type_name("PATH");
  flag(&app, "--model", o->model, "model preset");
  flag(&app, "--block-size", o->block_size, "override the preset's context length (0 = keep)");
  flag(&app, "--backends", o->backends, "comma-separated backends (default: every available one)");
  flag(&app, "--per-device-train-batch-size", o->batch,
       "effective batch (sequences per optimizer step)");
  flag(&app, "--gradient-accumulation-steps", o->accumulation,
       "micro-batches in the accumulation rows");
  flag(&app, "--max-steps", o->steps, "optimizer steps per row");
  flag(&app, "--logging-steps", o->logging, "steps per throughput sample");
  flag(&app, "--data", o->data, "text file or folder (default: the built-in data)");
  flag(&app, "--output-dir", o->output_dir, "where techniques.md/.json/.png and the runs go");
  return [o, models, steps, iters, precisions, reference] {
    const int chosen = o->techniques + !o->report.dir.empty() + !o->merge.empty();
    if (chosen != 1)
      fail(ErrorKind::kInvalidArgument,
           "bench: say which one benchmark (--techniques, --report DIR or --merge OUT FILE...)");
    auto split = [](const std::string& csv) {
      std::vector<std::string> v;
      std::stringstream ss(csv);
      for (std::string x; std::getline(ss, x, ',');)
        if (!x.empty()) v.push_back(x);
      return v;
    };
    if (!o->merge.empty())
      return run_merge(o->merge[0], std::vector<std::string>(o->merge.begin() + 1, o->merge.end()));
    if (!o->report.dir.empty()) {
      if (o->quick) {  // what a flag given beside it does not say
        if (!models->count()) o->models = "tiny,gpt2";
        if (!precisions->count()) o->precisions = "fp32,bf16";
        if (!steps->count()) o->report.steps = 6;
        if (!iters->count()) o->report.iters = 3;
        if (!reference->count()) o->reference = "tiny";
      }
      if (reference->count() || o->quick)
        o->report.reference_models =
            o->reference == "none" ? std::vector<std::string>{} : split(o->reference);
      o->report.models = split(o->models);
      o->report.devices = split(o->devices);
      o->report.peers = split(o->peers);
      o->report.precisions = split(o->precisions);
      o->report.data = o->data;
      return run_report(o->report);
    }
    if (o->batch <= 0 || o->accumulation <= 0 || o->batch % o->accumulation != 0)
      fail(ErrorKind::kInvalidArgument,
           "--per-device-train-batch-size " + std::to_string(o->batch) +
               " must be a positive multiple of --gradient-accumulation-steps " +
               std::to_string(o->accumulation));
    const std::vector<std::string> backends = bench_backends(o->backends);
    ModelConfig cfg = ModelConfig::preset(o->model);
    if (o->block_size > 0) std::visit([&](auto& c) { c.block_size = o->block_size; }, cfg.config);
    cfg.validate();
    const std::vector<Technique> techniques = bench_techniques(cfg, o->accumulation);

    fs::create_directories(o->output_dir);
    const std::vector<Row> rows = run_rows(*o, cfg, backends, techniques);

    const std::string md = rows_markdown(rows);
    const fs::path base = fs::path(o->output_dir) / "techniques";
    std::ofstream(base.string() + ".md") << md;
    std::ofstream(base.string() + ".json") << rows_json(rows).dump(2) << "\n";
    std::printf("%s", md.c_str());
    if (write_chart(rows, base, o->model))
      std::printf("\nwrote %s.md, .json and .png\n", base.string().c_str());
    else
      std::printf("\nwrote %s.md and .json (install gnuplot-nox for the PNG chart)\n",
                  base.string().c_str());
    return 0;
  };
}

}  // namespace ct::cli
