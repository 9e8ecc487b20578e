// The vendor-comparison report: one versioned JSON format written by `crosstrain bench --report`
// on any machine, joined across machines by `crosstrain bench --merge`, and rendered to Markdown.
//
// report.json, format "crosstrain-report" version 1 (kReportVersion; a reader refuses any other):
//   format, version           "crosstrain-report", 1
//   build {commit, compiler, build_type, backend_abi}    the crosstrain that wrote the file
//   date                      UTC, ISO 8601 ("2026-11-27T08:12:03Z")
//   host {name, cpu, cores, os}                       (an imported report: its name only)
//   settings {models[], steps, batch, iters, precisions[], peer_time_limit_s}  what --report
//                             measured with (peer_time_limit_s where peers ran; 0: none)
//   imported_from {format, file, converter}              only in a report converted from an
//                             older format (scripts/import_gpu_check_report.py: "gpu-check
//                             report v0"); its origins carry it, and the Markdown says so
//   merged_from [{file, build, date, host}]              only in a --merge result
//   devices [ one per device:
//     label                   unique within the report ("cpu:0"; "cpu:0@host" where merged ids
//     clash) id, backend, name, kind ("cpu", "discrete-gpu", ...), precisions ["fp32", "bf16", ...]
//     status "ok" | "failed", error (the first), errors [every one, "section: message"]
//     origin {build, date, host}                         where and by what it was measured
//     peak_tflops {fp32, tf32, bf16, fp16}               dense peak where the device is known
//     gemm   [{model, shape, layout "NT"|"NN"|"TN", M, N, K, dtype, gflops, ms, path
//              "library"|"own", implementation, efficiency (of peak; absent when unknown)}]
//     ops    [{model, op, direction "forward"|"backward"|"update", dtype, ms, shape}]
//     train  [{model, precision, batch, block_size, steps, tokens_per_s, flops_per_token,
//              mfu (absent when the peak is unknown), of_best_gemm, loss, loss_diff_vs_cpu
//              (absent without a CPU fp32 run of the model), error}]
//     memory [{model, technique, bytes, weights, grads, optimizer, activations, workspace}]
//     superseded [rows of the sections above, each with its section and origin]  (a merge) ]
//   peers [{peer "pytorch eager" | "pytorch compile" | "llm.c", version, device, model,
//           precision, tokens_per_s, steps, warmup_included, capped {steps, of, time_limit_s},
//           loss, origin, error}]  optional rows
//   superseded_peers [peer rows]                         (a merge)
//   cpu_reference [{model, steps, loss, device}]         the loss the train rows differ from
//
//   A peer row: tokens_per_s is the median of the steps after its warm-up (the first step; the
//   first 8 under torch.compile; llm.c's first 3), or of every step where none followed the
//   warm-up, and then warmup_included: true; steps: how many ran. A run cut at
//   settings.peer_time_limit_s has capped {steps, of, time_limit_s} ("N of M steps, time limit
//   S s"); one killed or failing has error and no figures.
//
//   A merge keys a device by its host (name, CPU, cores) and the device (id, name): reports of
//   one machine (tiny at batch 4 in one, gpt2 at batch 1 in another) join into one device, one
//   column; other hosts stay side by side. A joined device keeps the origin of the first report
//   given; a row from another report carries its own origin (a row's origin: its own where it
//   has one, else its device's), and a train row its batch. Where two reports have the same row
//   (train: model + precision; memory: model + technique; ops: model, op, direction, dtype,
//   shape; GEMM: model, shape, variant, layout, M x N x K, dtype), the table shows the newer
//   (by its origin's date; on a tie the later file given), since that is what the device does
//   with the newer build; the older moves to the device's `superseded`, listed in the Markdown.
//   Peers alike (one per peer, device, host, model and precision; the older in
//   superseded_peers). The same row twice (same date and build: a merged report merged with one
//   of its inputs) is kept once.
//
// Everything here is host code over nlohmann::json; measuring is report_run.cpp's.
#pragma once

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace ct::cli {

inline constexpr const char* kReportFormat = "crosstrain-report";
inline constexpr int kReportVersion = 1;

// {format, version, build, date, host}: the head of a report written now by this binary.
nlohmann::json report_head();
// {build, date, host} of `report` (a device's origin).
nlohmann::json report_origin(const nlohmann::json& report);

// Dense peak TFLOP/s of a known device (by its name) in `precision` ("fp32", "tf32", "bf16",
// "fp16"); 0 when unknown. {precision: TFLOP/s} for all of them in known_peaks().
double known_peak_tflops(const std::string& device_name, const std::string& precision);
nlohmann::json known_peaks(const std::string& device_name);

// The report's median of a list of figures (tokens/s of steps or rounds, ratios): the middle
// one of an odd count, the upper of the two middle ones of an even count. v is not empty.
double median(std::vector<double> v);

// Model FLOPs per trained token (forward + backward): 6 * N_matmul + 12 * n_layer * T * C
// (PaLM / nanoGPT's estimate, full T x T attention).
double model_flops_per_token(const std::string& model);

// Throws Error(kInvalidArgument) naming `file` unless `j` is a report this version reads.
void check_report(const nlohmann::json& j, const std::string& file);
// The report in `file`, checked.
nlohmann::json read_report(const std::string& file);
// Fills what a device's figures imply and it lacks (a report written without a known peak, or
// converted from an older format): the peaks of a known device, GEMM efficiency, each train
// row's model FLOPs per token, MFU and share of its best GEMM.
void derive_figures(nlohmann::json& device);
// One report of every device, peer and reference of `reports` (file name, report): devices of
// different hosts side by side, one host's device joined from its reports (the newer of two
// equal rows shown, the other superseded: above), each row keeping its origin and its derived
// figures filled; labels made unique.
nlohmann::json merge_reports(const std::vector<std::pair<std::string, nlohmann::json>>& reports);

// Completes a peer's `row` from its per-step tokens/s `tps` (step order), the first `warmup`
// steps left out of the median (all kept, and warmup_included set, where no step follows
// them); `requested` steps were asked for, and a run that stopped at `time_limit_s` before them
// is marked capped.
void peer_throughput(nlohmann::json& row, std::vector<double> tps, size_t warmup, int requested,
                     double time_limit_s, bool stopped_early);
// `row` (peer, model, precision, device) completed from the JSON scripts/torch_train.py wrote
// to `file` (`compile`: a torch.compile run, 8 steps of warm-up): tokens/s, loss, version,
// capped where the script stopped at its --time-limit. A file that is missing, not JSON or
// without steps gives the row an error naming it instead; nothing is thrown.
nlohmann::json torch_peer_row(nlohmann::json row, const std::string& file, bool compile);

// scripts/<name> beside the binary's bundle (bin/../scripts) or in the tree it was built from;
// "" when neither has it.
std::string find_script(const std::string& name);

// The Markdown rendering (charts linked when their PNG is in `dir`).
std::string report_markdown(const nlohmann::json& report, const std::filesystem::path& dir);
// Writes dir/report.json, the charts (scripts/report_charts.py when python3 has matplotlib) and
// dir/report.md; says on stdout what it wrote, and why charts were skipped. Not `final` (a
// report still being measured): the JSON and Markdown only, silently.
void write_report(const nlohmann::json& report, const std::filesystem::path& dir,
                  bool final = true);

}  // namespace ct::cli
