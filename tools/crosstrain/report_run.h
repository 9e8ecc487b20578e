// `crosstrain bench --report DIR` and `--merge OUT FILE...`: measure every device present into
// one report (report_format.h), or join reports of several machines into one.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace ct::cli {

// --peer-time-limit's default: a GPU peer (torch.compile's minute of compiling included) and a
// CPU fp32 gpt2 run of a few steps fit in it; PyTorch's bf16 autocast on a CPU without
// AVX512_BF16 (~350 s a gpt2 step) is cut to the step that crosses it.
inline constexpr double kDefaultPeerTimeLimitS = 300;

struct ReportOptions {
  std::string dir;                      // where report.json, report.md, charts and runs/ go
  std::vector<std::string> models;      // presets; empty: tiny
  std::vector<std::string> devices;     // specs ("cpu:0"); empty: every device not test-only or
                                        // virtual; "all": every device
  int steps = 4;                        // training steps per run (the loss compared after them)
  int batch = 1;                        // sequences per step (and the GEMMs' rows: batch x block)
  int iters = 5;                        // timed calls per GEMM / op (fewer past ~0.25 s)
  std::vector<std::string> precisions;  // train only these of the device's (empty: all it has)
  std::string data;                     // text for the training runs (default: the built-in)
  std::vector<std::string> peers;       // "pytorch", "pytorch-compile" (scripts/torch_train.py)
  std::string llmc;                     // llm.c's train_gpt2cu (or its folder): a gpt2 bf16 peer
  // Seconds of wall time each peer run may take (0: none). torch_train.py stops after the step
  // that crosses it and is killed at twice it; llm.c, which cannot stop itself, is killed at it.
  double peer_time_limit = kDefaultPeerTimeLimitS;
  // Training runs per model and precision, the precisions alternating (fp32 bf16, bf16 fp32,
  // ...): tokens/s is the median over the rounds, each round's figure is kept, and each
  // precision's ratio to fp32 is the median of the rounds' ratios (a shared machine's drift
  // falls on both sides of a pair).
  int rounds = 1;
  // Where cpu:0 is not measured, the models whose loss a CPU fp32 run of their own gives to
  // compare with (gpt2 at batch 16 costs minutes of CPU); unset: every model.
  std::optional<std::vector<std::string>> reference_models;
};

// Measures, writes the report; 0 when every device succeeded, 1 when one failed (its error is
// in the report, and the others were still measured).
int run_report(const ReportOptions& o);

// Joins `inputs` (report.json files) into out/report.json + report.md; refuses (an Error
// naming the file) one that is not a report or of another format version.
int run_merge(const std::string& out, const std::vector<std::string>& inputs);

struct ChildResult {
  int status = 0;          // exit status; 128 + the signal when one ended it
  long long peak_rss = 0;  // bytes
  bool timed_out = false;  // killed at its time limit
};
// Runs argv as a child process, its output appended to `log`. Past `timeout_s` seconds (0: no
// limit) it is sent SIGTERM, and SIGKILL 5 s later.
ChildResult run_child(const std::vector<std::string>& argv, const std::string& log,
                      double timeout_s = 0);

}  // namespace ct::cli
