// `crosstrain bench --report` and `--merge`: one real report of the CPU (a device that fails is
// marked failed and the rest still runs), peers cut at their time limit or killed, two reports of
// different machines merged side by side and two of one machine joined, and the refusal of a
// file that is not a report or of another format version, naming the file.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/common/test_data_dir.h"
#include "tests/tools/cli_run.h"
#include "tools/crosstrain/report_format.h"

namespace {
namespace fs = std::filesystem;
using nlohmann::json;

class Report : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("crosstrain_report_test_" + std::to_string(getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& text) const {
    const std::string path = (dir_ / name).string();
    std::ofstream(path) << text;
    return path;
  }
  static json load(const fs::path& p) {
    std::ifstream f(p);
    return json::parse(f);
  }
  // A report as another machine would have written it: one device with a train, GEMM and
  // memory row.
  static json machine(const std::string& host, const std::string& date, const std::string& id,
                      double tokens_per_s) {
    json d = {{"label", id},
              {"id", id},
              {"backend", id.substr(0, id.find(':'))},
              {"name", "a " + id + " of " + host},
              {"kind", "cpu"},
              {"precisions", {"fp32"}},
              {"status", "ok"},
              {"gemm",
               {{{"model", "tiny"},
                 {"shape", "fc"},
                 {"layout", "NT"},
                 {"M", 256},
                 {"N", 1536},
                 {"K", 384},
                 {"dtype", "f32"},
                 {"gflops", tokens_per_s / 10},
                 {"ms", 0.1},
                 {"path", "library"}}}},
              {"ops", json::array()},
              {"train",
               {{{"model", "tiny"},
                 {"precision", "fp32"},
                 {"steps", 6},
                 {"tokens_per_s", tokens_per_s},
                 {"flops_per_token", 6.0e7},
                 {"loss", 3.5}}}},
              {"memory", {{{"model", "tiny"}, {"technique", "fp32"}, {"bytes", 1 << 20}}}}};
    return {{"format", "crosstrain-report"},
            {"version", 1},
            {"build", {{"commit", "c0ffee-" + host}, {"compiler", "gcc"}, {"backend_abi", 9}}},
            {"date", date},
            {"host", {{"name", host}, {"cpu", "some cpu"}, {"cores", 4}}},
            {"devices", {d}}};
  }
  std::string text_file() const {  // enough of the test text for tiny's 257-token windows
    std::string text;
    std::ifstream h(ct::test::data_dir() + "/text/harbour.txt");
    const std::string once((std::istreambuf_iterator<char>(h)), std::istreambuf_iterator<char>());
    for (int i = 0; i < 5; ++i) text += once;
    return write("text.txt", text);
  }
  static std::string read_text(const fs::path& p) {
    std::ifstream f(p);
    return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  }
  fs::path dir_;
};

// cpu:0 measured for real (tiny, 1 step of one sequence, fp32 only, one timed call per kernel),
// beside a device that cannot open: that one is marked failed with its error, the exit status
// says so, and cpu:0's figures are all there.
TEST_F(Report, ReportOnTheCpuMarksAFailedDeviceAndGoesOn) {
  std::string text;
  std::ifstream h(ct::test::data_dir() + "/text/harbour.txt");
  const std::string once((std::istreambuf_iterator<char>(h)), std::istreambuf_iterator<char>());
  for (int i = 0; i < 5; ++i) text += once;  // enough for tiny's 257-token windows, and a split
  const std::string data = write("text.txt", text);
  // llm.c's train_gpt2cu stood in for by a script: it fails unless its token file has llm.c's
  // header (magic, version, one token per byte of the text) and prints llm.c's step lines, at
  // 1000 x step tokens/s: the median of those after its first three steps is known.
  const std::string llmc = write("train_gpt2cu", R"sh(#!/bin/sh
while [ $# -gt 0 ]; do case "$1" in -i) tok="$2"; shift 2;; -x) n="$2"; shift 2;; *) shift;; esac; done
[ "$(od -An -tu4 -N8 "$tok" | tr -s ' ')" = " 20240520 1" ] || exit 3
[ "$(stat -c %s "$tok")" -eq $((1024 + 2 * $(od -An -tu4 -j8 -N4 "$tok"))) ] || exit 4
i=1; while [ $i -le $n ]; do
  echo "step $i/$n | loss 4.5 (+nanz)| norm 1.0 (+nanz)| lr 3.00e-04 | 51.65 ms | 25.8% bf16 MFU | $((1000 * i)) tok/s"
  i=$((i + 1)); done
)sh");
  fs::permissions(llmc, fs::perms::owner_all);
  const fs::path out = dir_ / "report";
  const ct::test::ProcResult r = ct::test::run_crosstrain(
      "bench --report " + out.string() +
      " --devices cpu:0,nosuch:0 --models tiny --steps 1 --batch 1 --iters 1 --precisions fp32 "
      "--llmc " +
      dir_.string() + " --data " + data);
  EXPECT_EQ(r.status, 1) << r.output;  // one device failed
  EXPECT_NE(r.output.find("nosuch:0 failed"), std::string::npos) << r.output;
  ASSERT_TRUE(fs::exists(out / "report.json")) << r.output;
  ASSERT_TRUE(fs::exists(out / "report.md")) << r.output;
  const json j = load(out / "report.json");
  EXPECT_EQ(j["format"], "crosstrain-report");
  EXPECT_EQ(j["version"], 1);
  EXPECT_FALSE(j["build"]["commit"].get<std::string>().empty());
  EXPECT_GT(j["build"]["backend_abi"].get<int>(), 0);
  EXPECT_GT(j["host"]["cores"].get<int>(), 0);
  // the CPU's family and model on Linux/x86 (what tells a Zen 3 from a Zen 4 named "AMD EPYC")
  if (read_text("/proc/cpuinfo").find("cpu family") != std::string::npos) {
    EXPECT_EQ(j["host"]["cpu_id"].get<std::string>().rfind("family ", 0), 0u) << j["host"].dump();
  }
  ASSERT_EQ(j["devices"].size(), 2u);

  const json& cpu = j["devices"][0];
  EXPECT_EQ(cpu["label"], "cpu:0");
  EXPECT_EQ(cpu["status"], "ok") << cpu.dump(1);
  EXPECT_EQ(cpu["kind"], "cpu");
  EXPECT_EQ(cpu["precisions"], json({"fp32"}));
  ASSERT_FALSE(cpu["gemm"].empty());
  for (const json& g : cpu["gemm"]) {
    EXPECT_GT(g["gflops"].get<double>(), 0) << g.dump();
    EXPECT_TRUE(g["path"] == "library" || g["path"] == "own") << g.dump();
  }
  EXPECT_EQ(cpu["gemm"][0]["M"], 256);  // batch 1 x tiny's 256 positions
  bool layernorm_backward = false, residual_layernorm = false, fused_crossentropy = false;
  for (const json& o : cpu["ops"]) {
    EXPECT_GT(o["ms"].get<double>(), 0) << o.dump();
    layernorm_backward |= o["op"] == "layernorm" && o["direction"] == "backward";
    residual_layernorm |= o["op"] == "residual + layernorm (fused)" && o["direction"] == "forward";
    fused_crossentropy |= o["op"] == "crossentropy" && o["direction"] == "forward+backward";
  }
  EXPECT_TRUE(layernorm_backward) << cpu["ops"].dump(1);
  EXPECT_TRUE(residual_layernorm) << cpu["ops"].dump(1);
  EXPECT_TRUE(fused_crossentropy) << cpu["ops"].dump(1);
  // llm.c: 9 steps (--steps + 8), the first three left out: the median of 4000 .. 9000.
  ASSERT_EQ(j["peers"].size(), 1u) << j["peers"].dump(1);
  const json& lc = j["peers"][0];
  EXPECT_EQ(lc["peer"], "llm.c") << lc.dump();
  EXPECT_EQ(lc["model"], "gpt2");
  EXPECT_EQ(lc["precision"], "bf16");
  EXPECT_EQ(lc.value("tokens_per_s", 0.0), 7000.0) << lc.dump();
  EXPECT_EQ(lc["loss"], 4.5);
  ASSERT_EQ(cpu["train"].size(), 1u);
  const json& t = cpu["train"][0];
  EXPECT_EQ(t["precision"], "fp32");
  EXPECT_EQ(t["steps"], 1);
  EXPECT_GT(t["tokens_per_s"].get<double>(), 0);
  EXPECT_GT(t["loss"].get<double>(), 0);
  EXPECT_EQ(t["loss_diff_vs_cpu"].get<double>(), 0.0);  // it is the reference
  EXPECT_FALSE(t.contains("mfu"));                      // no known peak for this CPU
  ASSERT_EQ(cpu["memory"].size(), 1u);
  EXPECT_GT(cpu["memory"][0]["bytes"].get<int64_t>(), cpu["memory"][0]["weights"].get<int64_t>());
  ASSERT_EQ(j["cpu_reference"].size(), 1u);

  const json& bad = j["devices"][1];
  EXPECT_EQ(bad["status"], "failed");
  EXPECT_NE(bad["error"].get<std::string>().find("nosuch"), std::string::npos) << bad.dump();

  std::ifstream md(out / "report.md");
  const std::string text_md((std::istreambuf_iterator<char>(md)), std::istreambuf_iterator<char>());
  for (const char* s : {"## Devices", "## Training throughput", "## GEMM", "## Ops", "## Memory",
                        "## Failures", "| tiny | fp32 |", "| gpt2 | bf16 |  | 7,000 |",
                        "| model | precision | cpu:0 | llm.c cuda |"})
    EXPECT_NE(text_md.find(s), std::string::npos) << s << "\n" << text_md;
}

// --rounds: each precision's run repeated, the order alternating round by round; tokens/s the
// median of the rounds, and bf16's ratio to fp32 the median of the rounds' paired ratios.
TEST_F(Report, RoundsAlternateThePrecisionsAndGiveTheirRatioToFp32) {
  const std::string data = text_file();
  const fs::path out = dir_ / "report";
  const ct::test::ProcResult r = ct::test::run_crosstrain(
      "bench --report " + out.string() +
      " --devices cpu:0 --models tiny --steps 2 --batch 1 --iters 1 --precisions fp32,bf16 "
      "--rounds 3 --data " +
      data);
  ASSERT_EQ(r.status, 0) << r.output;
  std::ifstream log(out / "runs.log");
  std::vector<std::string> order;
  for (std::string line; std::getline(log, line);)
    if (line.rfind("== cpu:0 tiny ", 0) == 0) order.push_back(line.substr(14, 4));
  EXPECT_EQ(order, (std::vector<std::string>{"fp32", "bf16", "bf16", "fp32", "fp32", "bf16"}));
  const json j = load(out / "report.json");
  const json& train = j["devices"][0]["train"];
  ASSERT_EQ(train.size(), 2u) << train.dump(1);
  auto median3 = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[1];
  };
  std::vector<std::vector<double>> rounds;
  for (const json& t : train) {
    ASSERT_EQ(t["rounds"].size(), 3u) << t.dump(1);
    rounds.push_back(t["rounds"].get<std::vector<double>>());
    for (double v : rounds.back()) EXPECT_GT(v, 0) << t.dump(1);
    EXPECT_EQ(t["tokens_per_s"].get<double>(), median3(rounds.back())) << t.dump(1);
  }
  ASSERT_EQ(train[0]["precision"], "fp32");
  EXPECT_FALSE(train[0].contains("over_fp32"));
  std::vector<double> ratio;
  for (size_t k = 0; k < 3; ++k) ratio.push_back(rounds[1][k] / rounds[0][k]);
  EXPECT_EQ(train[1]["over_fp32"].get<double>(), median3(ratio)) << train[1].dump(1);
  EXPECT_EQ(train[1]["over_fp32_range"][0].get<double>(),
            *std::min_element(ratio.begin(), ratio.end()));
  EXPECT_EQ(train[1]["over_fp32_range"][1].get<double>(),
            *std::max_element(ratio.begin(), ratio.end()));
  std::ifstream md(out / "report.md");
  const std::string text_md((std::istreambuf_iterator<char>(md)), std::istreambuf_iterator<char>());
  char want[32];
  std::snprintf(want, sizeof want, "| %.3fx (", median3(ratio));
  EXPECT_NE(text_md.find("vs fp32 (rounds)"), std::string::npos) << text_md;
  EXPECT_NE(text_md.find(want), std::string::npos) << want << "\n" << text_md;
}

// Where cpu:0 is not measured, a CPU fp32 run of each model gives the loss to compare with,
// but only of the models --cpu-reference names (--quick: tiny; gpt2's costs minutes of CPU).
TEST_F(Report, CpuReferenceRunsOnlyForTheModelsAsked) {
  std::string text;
  std::ifstream h(ct::test::data_dir() + "/text/harbour.txt");
  const std::string once((std::istreambuf_iterator<char>(h)), std::istreambuf_iterator<char>());
  for (int i = 0; i < 5; ++i) text += once;
  const std::string data = write("text.txt", text);
  for (const char* reference : {"", "--cpu-reference none"}) {
    const fs::path out = dir_ / "report";
    const ct::test::ProcResult r = ct::test::run_crosstrain(
        "bench --report " + out.string() +
        " --devices nosuch:0 --models tiny --steps 1 --batch 1 --data " + data + " " + reference);
    EXPECT_EQ(r.status, 1) << r.output;  // nosuch:0 failed
    const json j = load(out / "report.json");
    ASSERT_EQ(j["cpu_reference"].size(), *reference ? 0u : 1u) << reference << j.dump(1);
    if (!*reference) {
      EXPECT_GT(j["cpu_reference"][0]["loss"].get<double>(), 0);
    }
  }
}

// Two machines' reports joined: devices side by side, each naming its build and date; equal ids
// made distinct by their host.
TEST_F(Report, MergePutsMachinesSideBySide) {
  const std::string a = write("a.json",
                              machine("alpha", "2026-11-26T10:00:00Z", "cpu:0", 1000).dump()),
                    b = write("b.json",
                              machine("beta", "2026-11-27T11:00:00Z", "cpu:0", 3000).dump());
  json c_report = machine("gamma", "2026-11-25T09:00:00Z", "cuda:0", 90000);
  const std::string c = write("c.json", c_report.dump());
  const fs::path out = dir_ / "merged";
  const ct::test::ProcResult r =
      ct::test::run_crosstrain("bench --merge " + out.string() + " " + a + " " + b + " " + c);
  ASSERT_EQ(r.status, 0) << r.output;
  const json j = load(out / "report.json");
  EXPECT_EQ(j["format"], "crosstrain-report");
  EXPECT_EQ(j["version"], 1);
  ASSERT_EQ(j["merged_from"].size(), 3u);
  EXPECT_EQ(j["merged_from"][0]["file"], a);
  EXPECT_EQ(j["merged_from"][1]["host"]["name"], "beta");
  ASSERT_EQ(j["devices"].size(), 3u);
  EXPECT_EQ(j["devices"][0]["label"], "cpu:0@alpha");
  EXPECT_EQ(j["devices"][1]["label"], "cpu:0@beta");
  EXPECT_EQ(j["devices"][2]["label"], "cuda:0");
  EXPECT_EQ(j["devices"][1]["origin"]["date"], "2026-11-27T11:00:00Z");
  EXPECT_EQ(j["devices"][2]["origin"]["build"]["commit"], "c0ffee-gamma");

  std::ifstream md(out / "report.md");
  const std::string text((std::istreambuf_iterator<char>(md)), std::istreambuf_iterator<char>());
  // One row per model and precision, a column per device.
  EXPECT_NE(text.find("| model | precision | cpu:0@alpha | cpu:0@beta | cuda:0 |"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("| tiny | fp32 | 1,000 | 3,000 | 90,000 |"), std::string::npos) << text;
  for (const char* s : {"c0ffee-alpha", "c0ffee-beta", "2026-11-27T11:00:00Z", "2026-11-25"})
    EXPECT_NE(text.find(s), std::string::npos) << s << "\n" << text;

  // A merged report merges again (the same format); alpha's cpu:0 is one device of one host, so
  // a merged with it again joins its column.
  const ct::test::ProcResult again =
      ct::test::run_crosstrain("bench --merge " + (dir_ / "twice").string() + " " +
                               (out / "report.json").string() + " " + a);
  ASSERT_EQ(again.status, 0) << again.output;
  EXPECT_EQ(load(dir_ / "twice" / "report.json")["devices"].size(), 3u);
}

// A report converted from the old gpu-check format (scripts/import_gpu_check_report.py) on a
// known device: the merge fills what it lacks (peaks, MFU, GEMM efficiency) from this
// crosstrain's table, says where it was imported from, and puts its peers beside the devices.
TEST_F(Report, MergeFillsDerivedFiguresAndNamesAnImport) {
  json h = machine("h100", "2026-11-27", "cuda:0", 250000);
  h["devices"][0]["name"] = "NVIDIA H100 80GB HBM3";
  h["devices"][0]["train"][0]["model"] = "gpt2";
  h["devices"][0]["train"][0]["precision"] = "bf16";
  h["devices"][0]["train"][0].erase("flops_per_token");
  h["devices"][0]["gemm"][0]["dtype"] = "bf16";
  h["devices"][0]["gemm"][0]["model"] = "gpt2";
  h["imported_from"] = {{"format", "gpu-check report v0"}, {"file", "report.json"}};
  h["peers"] = {{{"peer", "llm.c"},
                 {"device", "cuda"},
                 {"model", "gpt2"},
                 {"precision", "bf16"},
                 {"tokens_per_s", 317883}}};
  const std::string a = write("h100.json", h.dump());
  const fs::path out = dir_ / "merged";
  const ct::test::ProcResult r =
      ct::test::run_crosstrain("bench --merge " + out.string() + " " + a);
  ASSERT_EQ(r.status, 0) << r.output;
  const json j = load(out / "report.json");
  const json& d = j["devices"][0];
  EXPECT_EQ(d["peak_tflops"]["bf16"], 989.4);
  const json& t = d["train"][0];
  // 6 N + 12 L T C of gpt2 (124M parameters less the position table).
  EXPECT_NEAR(t["flops_per_token"].get<double>(), 6 * 123.6e6 + 12 * 12 * 1024 * 768, 2e7);
  EXPECT_NEAR(t["mfu"].get<double>(), 250000 * t["flops_per_token"].get<double>() / 989.4e12, 1e-9);
  EXPECT_NEAR(d["gemm"][0]["efficiency"].get<double>(), 25000 / 989.4e3, 1e-9);
  EXPECT_EQ(d["origin"]["imported_from"]["format"], "gpu-check report v0");
  std::ifstream md(out / "report.md");
  const std::string text((std::istreambuf_iterator<char>(md)), std::istreambuf_iterator<char>());
  for (const char* s :
       {"(imported from gpu-check report v0)", "| model | precision | cuda:0 | llm.c cuda@h100 |",
        "| gpt2 | bf16 | 250,000 | 317,883 |"})
    EXPECT_NE(text.find(s), std::string::npos) << s << "\n" << text;
}

// The H100 figures of 2026-11-27 converted from the old gpu-check report: the committed file is
// what the converter writes from the committed run, and --merge reads it.
TEST_F(Report, ImportedGpuCheckRunIsTheConvertersAndMerges) {
  const std::string run = std::string(CT_SOURCE_DIR) + "/bench/gpu-check-20261127-h100/run2";
  const fs::path mine = dir_ / "converted.json";
  ASSERT_EQ(std::system(("python3 " + std::string(CT_SOURCE_DIR) +
                         "/scripts/import_gpu_check_report.py " + run +
                         " --host h100 --date "
                         "2026-11-27 --out " +
                         mine.string() + " >/dev/null")
                            .c_str()),
            0);
  json converted = load(mine), committed = load(run + "/crosstrain-report.json");
  converted["imported_from"].erase("file");  // relative to where each was written
  committed["imported_from"].erase("file");
  EXPECT_EQ(converted, committed);
  const ct::test::ProcResult r = ct::test::run_crosstrain(
      "bench --merge " + (dir_ / "merged").string() + " " + run + "/crosstrain-report.json");
  ASSERT_EQ(r.status, 0) << r.output;
  const json j = load(dir_ / "merged" / "report.json");
  EXPECT_EQ(j["devices"][0]["name"], "NVIDIA H100 80GB HBM3");
  EXPECT_GT(j["devices"][0]["train"][0]["mfu"].get<double>(), 0);
}

// A file that is not a report, or a report of another format version, is refused naming the
// file, and nothing is written.
TEST_F(Report, MergeRefusesNonReportsAndOtherVersionsNamingTheFile) {
  const std::string good = write("good.json", machine("alpha", "2026-11-26", "cpu:0", 1).dump());
  json v2 = machine("beta", "2026-11-27", "cpu:0", 2);
  v2["version"] = 2;
  const std::string newer = write("newer.json", v2.dump());
  const std::string other = write("other.json", R"({"format": "llm.c", "version": 1})");
  const std::string bench = write("techniques.json", R"([{"backend": "cpu"}])");
  const std::string text = write("notes.txt", "tokens/s: a lot\n");
  const fs::path out = dir_ / "merged";
  struct Case {
    std::string file, says;
  };
  for (const Case& k :
       {Case{newer, "report format version 2, this crosstrain reads version 1"},
        Case{other, "not a crosstrain report"}, Case{bench, "not a crosstrain report"},
        Case{text, "not a crosstrain report (not JSON"}}) {
    const ct::test::ProcResult r =
        ct::test::run_crosstrain("bench --merge " + out.string() + " " + good + " " + k.file);
    EXPECT_EQ(r.status, 2) << k.file << "\n" << r.output;
    EXPECT_NE(r.output.find(k.file + ": " + k.says), std::string::npos) << r.output;
    EXPECT_FALSE(fs::exists(out)) << k.file;
  }
}

// The JSON scripts/torch_train.py writes, read into the report's peer row: the median of the
// steps after the first; a run stopped at its time limit keeps what it measured and says
// "N of M steps, time limit S s"; one step alone is its figure, marked as including the
// warm-up; a file that is missing, cut short or without steps is an error row naming it.
TEST_F(Report, PeerRowOfATorchRunCappedAtItsTimeLimit) {
  using ct::cli::torch_peer_row;
  const json row = {
      {"peer", "pytorch eager"}, {"device", "cpu"}, {"model", "gpt2"}, {"precision", "bf16"}};
  auto run = [](std::vector<double> tps, int requested, bool stopped) {
    json steps = json::array();
    for (size_t i = 0; i < tps.size(); ++i)
      steps.push_back({{"step", i + 1}, {"tokens_per_s", tps[i]}, {"loss", 6.0 - 0.5 * i}});
    return json{{"device", "cpu"},       {"torch", "2.15.0"},        {"steps_requested", requested},
                {"time_limit_s", 300.0}, {"stopped_early", stopped}, {"steps", steps}};
  };
  // Four of 50 steps: the median of the last three (20, 25, 30), the first being the warm-up.
  const json four =
      torch_peer_row(row, write("four.json", run({100, 20, 30, 25}, 50, true).dump()), false);
  EXPECT_EQ(four["tokens_per_s"], 25.0) << four.dump();
  EXPECT_EQ(four["steps"], 4);
  EXPECT_EQ(four["capped"], json({{"steps", 4}, {"of", 50}, {"time_limit_s", 300.0}}));
  EXPECT_FALSE(four.contains("warmup_included"));
  EXPECT_EQ(four["loss"], 4.5);
  EXPECT_EQ(four["version"], "2.15.0");
  // The ~350 s gpt2 bf16 step of a CPU without AVX512_BF16: one step of six, its own figure.
  const json one = torch_peer_row(row, write("one.json", run({2.9}, 6, true).dump()), false);
  EXPECT_EQ(one["tokens_per_s"], 2.9);
  EXPECT_EQ(one["warmup_included"], true);
  EXPECT_EQ(one["capped"]["of"], 6);
  // A full run: not capped; under torch.compile the first 8 steps are the warm-up.
  const json full = torch_peer_row(row, write("full.json", run({1, 2, 3}, 3, false).dump()), false);
  EXPECT_EQ(full["tokens_per_s"], 3.0);
  EXPECT_FALSE(full.contains("capped"));
  const json compiled =
      torch_peer_row(row, write("compiled.json", run({1, 2, 3, 4, 5}, 14, true).dump()), true);
  EXPECT_EQ(compiled["tokens_per_s"], 5.0);
  EXPECT_EQ(compiled["warmup_included"], true);
  for (const auto& [name, text, says] :
       std::vector<std::tuple<std::string, std::string, std::string>>{
           {"cut.json", run({1, 2}, 2, false).dump().substr(0, 40), "not torch_train.py's JSON"},
           {"empty.json", run({}, 2, false).dump(), "no steps"},
           {"absent.json", "", "not written"}}) {
    const std::string file = name == "absent.json" ? (dir_ / name).string() : write(name, text);
    const json bad = torch_peer_row(row, file, false);
    EXPECT_NE(bad.value("error", std::string()).find(file + ": " + says), std::string::npos)
        << bad.dump();
    EXPECT_FALSE(bad.contains("tokens_per_s")) << bad.dump();
  }

  // The Markdown: the figure and why it is partial, in the headline and under the peers.
  json report = machine("vm", "2026-11-28", "cpu:0", 216);
  report["settings"] = {{"peer_time_limit_s", 300}};
  json failed = row;
  failed["precision"] = "fp32";
  failed["error"] = "killed after 600 s, twice its time limit of 300 s (runs.log)";
  report["peers"] = {one, failed};
  const std::string md = ct::cli::report_markdown(report, dir_);
  for (const char* s :
       {"| gpt2 | bf16 |  | 2.9 (capped: 1 of 6 steps, time limit 300 s; warm-up included) |",
        "| gpt2 | fp32 |  | failed |", "each run had 300 s (--peer-time-limit)",
        "- pytorch eager gpt2 bf16: capped: 1 of 6 steps, time limit 300 s; warm-up included",
        "- pytorch eager gpt2 fp32: failed: killed after 600 s"})
    EXPECT_NE(md.find(s), std::string::npos) << s << "\n" << md;
}

// --peer-time-limit end to end, PyTorch and llm.c stood in for by scripts (no device measured):
// the fp32 run stops itself at the limit and its row keeps its steps, marked capped; the bf16
// run outlasts twice the limit and is killed, an error row; llm.c, which cannot stop itself, is
// killed at the limit and keeps the steps it logged. The report is written with all three.
// --rounds repeats each peer run: tokens/s the median of the rounds, each round's kept; a run
// capped at its time limit is not repeated.
TEST_F(Report, PeerRoundsGiveTheMedianAndACappedRunIsNotRepeated) {
  const std::string calls = (dir_ / "calls").string();
  const std::string python = write("python", R"sh(#!/bin/sh
[ "$1" = "-c" ] && exit 1  # torch's GPU probe: none
shift  # torch_train.py
prec=fp32
while [ $# -gt 0 ]; do case "$1" in --json) out="$2"; shift 2;; --bf16) prec=bf16; shift;;
  *) shift;; esac; done
echo $prec >> ")sh" + calls + R"sh("
k=$(grep -c $prec ")sh" + calls + R"sh(")
if [ $prec = bf16 ]; then
  echo '{"device": "cpu", "torch": "stand-in", "steps_requested": 3, "time_limit_s": 300,
    "stopped_early": true, "steps": [{"tokens_per_s": 1, "loss": 5.0},
    {"tokens_per_s": 7, "loss": 4.0}]}' > "$out"
else  # rounds 1, 2, 3: 300, 100, 200 tokens/s after the first step
  t=$(echo 300 100 200 | cut -d' ' -f$k)
  echo '{"device": "cpu", "torch": "stand-in", "steps": [{"tokens_per_s": 1, "loss": 5.0},
    {"tokens_per_s": '$t', "loss": 4.0}, {"tokens_per_s": '$t', "loss": 3.0}]}' > "$out"
fi
)sh");
  fs::permissions(python, fs::perms::owner_all);
  const fs::path out = dir_ / "report";
  setenv("CROSSTRAIN_PYTHON", python.c_str(), 1);
  const ct::test::ProcResult r = ct::test::run_crosstrain(
      "bench --report " + out.string() +
      " --devices nosuch:0 --cpu-reference none --models tiny --steps 3 --precisions fp32,bf16 "
      "--peers pytorch --rounds 3 --data " +
      text_file());
  unsetenv("CROSSTRAIN_PYTHON");
  EXPECT_EQ(r.status, 1) << r.output;  // nosuch:0 failed
  EXPECT_EQ(read_text(calls), "fp32\nfp32\nfp32\nbf16\n");
  const json j = load(out / "report.json");
  ASSERT_EQ(j["peers"].size(), 2u) << j["peers"].dump(1);
  const json &fp32 = j["peers"][0], &bf16 = j["peers"][1];
  EXPECT_EQ(fp32["tokens_per_s"], 200.0) << fp32.dump();
  EXPECT_EQ(fp32["rounds"], json({300.0, 100.0, 200.0})) << fp32.dump();
  EXPECT_EQ(bf16["tokens_per_s"], 7.0) << bf16.dump();
  EXPECT_FALSE(bf16.contains("rounds")) << bf16.dump();
  EXPECT_TRUE(bf16.contains("capped")) << bf16.dump();
  const std::string md = read_text(out / "report.md");
  EXPECT_NE(md.find("| 200 (median of 3 rounds: 100-300) |"), std::string::npos) << md;
}

TEST_F(Report, PeerTimeLimitCapsOrKillsEachPeerAndTheReportGoesOn) {
  const std::string python = write("python", R"sh(#!/bin/sh
[ "$1" = "-c" ] && exit 1  # torch's GPU probe: none
shift  # torch_train.py
while [ $# -gt 0 ]; do case "$1" in --json) out="$2"; shift 2;; --steps) n="$2"; shift 2;;
  --time-limit) limit="$2"; shift 2;; --bf16) exec sleep 30;; *) shift;; esac; done
[ "$limit" = "1" ] || exit 5
echo '{"device": "cpu", "torch": "stand-in", "steps_requested": '"$n"', "time_limit_s": 1,
  "stopped_early": true, "steps": [{"tokens_per_s": 100, "loss": 5.0},
  {"tokens_per_s": 300, "loss": 4.0}]}' > "$out"
)sh");
  const std::string llmc = write("train_gpt2cu", R"sh(#!/bin/sh
for i in 1 2 3 4 5; do echo "step $i/10 | loss 4.5 (+nanz)| norm 1.0 | 5 ms | 1% bf16 MFU | ${i}000 tok/s"; done
exec sleep 30
)sh");
  fs::permissions(python, fs::perms::owner_all);
  fs::permissions(llmc, fs::perms::owner_all);
  const fs::path out = dir_ / "report";
  setenv("CROSSTRAIN_PYTHON", python.c_str(), 1);
  const auto t0 = std::chrono::steady_clock::now();
  const ct::test::ProcResult r = ct::test::run_crosstrain(
      "bench --report " + out.string() +
      " --devices nosuch:0 --cpu-reference none --models tiny --steps 2 --precisions fp32,bf16 "
      "--peers pytorch --peer-time-limit 1 --llmc " +
      llmc + " --data " + text_file());
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  unsetenv("CROSSTRAIN_PYTHON");
  EXPECT_EQ(r.status, 1) << r.output;  // nosuch:0 failed
  EXPECT_LT(took, 20) << "the 30 s sleeps were not killed";
  const json j = load(out / "report.json");
  EXPECT_EQ(j["settings"]["peer_time_limit_s"], 1.0);
  ASSERT_EQ(j["peers"].size(), 3u) << j["peers"].dump(1);
  const json &fp32 = j["peers"][0], &bf16 = j["peers"][1], &lc = j["peers"][2];
  EXPECT_EQ(fp32["precision"], "fp32");
  EXPECT_EQ(fp32["tokens_per_s"], 300.0) << fp32.dump();
  EXPECT_EQ(fp32["capped"], json({{"steps", 2}, {"of", 3}, {"time_limit_s", 1.0}}));
  EXPECT_EQ(bf16["precision"], "bf16");
  EXPECT_EQ(bf16["device"], "cpu");  // in the CPU peer's column though it measured nothing
  EXPECT_NE(
      bf16.value("error", std::string()).find("killed after 2 s, twice its time limit of 1 s"),
      std::string::npos)
      << bf16.dump();
  EXPECT_FALSE(bf16.contains("tokens_per_s"));
  EXPECT_EQ(lc["peer"], "llm.c");
  EXPECT_EQ(lc["tokens_per_s"], 5000.0) << lc.dump();  // steps 4 and 5, after its three
  EXPECT_EQ(lc["capped"], json({{"steps", 5}, {"of", 10}, {"time_limit_s", 1.0}}));
  const std::string md = read_text(out / "report.md");
  for (const char* s :
       {"| tiny | fp32 | 300 (capped: 2 of 3 steps, time limit 1 s) |", "| tiny | bf16 | failed |",
        "capped: 5 of 10 steps, time limit 1 s", "failed: killed after 2 s"})
    EXPECT_NE(md.find(s), std::string::npos) << s << "\n" << md;
}

// Two reports of one machine (tiny at batch 4, gpt2 at batch 1, as bench/cpu-20261128c-vm and
// -gpt2) join into one column, each row naming the report it came from; where both measured a
// row (tiny fp32), the newer wins whatever the order given, and the older is kept under
// `superseded` and listed. Another host's cpu:0 stays a column of its own; a report merged
// with itself changes nothing.
TEST_F(Report, MergeJoinsOneHostsReportsIntoOneColumn) {
  json a = machine("vm", "2026-11-28T15:41:27Z", "cpu:0", 2339);
  a["settings"] = {{"batch", 4}};
  json b = machine("vm", "2026-11-28T15:47:46Z", "cpu:0", 216);
  b["settings"] = {{"batch", 1}};
  b["build"]["commit"] = "b0b";
  for (const char* section : {"train", "gemm", "memory"})
    b["devices"][0][section][0]["model"] = "gpt2";
  json newer = machine("vm", "2026-11-28T16:30:00Z", "cpu:0", 2500);
  newer["settings"] = {{"batch", 4}};
  newer["build"]["commit"] = "newer";
  const std::string fa = write("a.json", a.dump()), fb = write("b.json", b.dump()),
                    fn = write("newer.json", newer.dump()),
                    fo = write("other.json",
                               machine("other", "2026-11-28T10:00:00Z", "cpu:0", 1000).dump());
  const fs::path out = dir_ / "merged";
  const ct::test::ProcResult r = ct::test::run_crosstrain("bench --merge " + out.string() + " " +
                                                          fn + " " + fa + " " + fb + " " + fo);
  ASSERT_EQ(r.status, 0) << r.output;
  const json j = load(out / "report.json");
  ASSERT_EQ(j["merged_from"].size(), 4u);
  ASSERT_EQ(j["devices"].size(), 2u) << j["devices"].dump(1);
  const json& vm = j["devices"][0];
  EXPECT_EQ(vm["label"], "cpu:0@vm");
  EXPECT_EQ(j["devices"][1]["label"], "cpu:0@other");
  EXPECT_EQ(vm["origin"]["date"], "2026-11-28T16:30:00Z");  // the first given
  ASSERT_EQ(vm["train"].size(), 2u) << vm["train"].dump(1);
  const json &tiny = vm["train"][0], &gpt2 = vm["train"][1];
  EXPECT_EQ(tiny["model"], "tiny");
  EXPECT_EQ(tiny["tokens_per_s"], 2500.0);  // newer's: the newest wins
  EXPECT_EQ(tiny["batch"], 4);
  EXPECT_FALSE(tiny.contains("origin"));  // the device's own
  EXPECT_EQ(gpt2["tokens_per_s"], 216.0);
  EXPECT_EQ(gpt2["batch"], 1);
  EXPECT_EQ(gpt2["origin"]["date"], "2026-11-28T15:47:46Z");
  EXPECT_EQ(gpt2["origin"]["build"]["commit"], "b0b");
  EXPECT_EQ(vm["gemm"].size(), 2u);
  EXPECT_EQ(vm["memory"].size(), 2u);
  // a's tiny rows (train, GEMM, memory), replaced by newer's, with a's origin.
  ASSERT_EQ(vm["superseded"].size(), 3u) << vm["superseded"].dump(1);
  for (const json& s : vm["superseded"]) {
    EXPECT_EQ(s["origin"]["date"], "2026-11-28T15:41:27Z") << s.dump();
    EXPECT_EQ(s["model"], "tiny");
  }
  EXPECT_EQ(vm["superseded"][1]["section"], "train");
  EXPECT_EQ(vm["superseded"][1]["tokens_per_s"], 2339.0);

  const std::string md = read_text(out / "report.md");
  for (const char* s :
       {"| model | precision | cpu:0@vm | cpu:0@other |", "| tiny | fp32 | 2,500 | 1,000 |",
        "| gpt2 | fp32 | 216 |  |",
        "| newer, b0b | 2026-11-28T16:30:00Z, 2026-11-28T15:47:46Z | vm |",
        "| cpu:0@vm | gpt2 | fp32 | 1 | 216 |", "2026-11-28T15:47:46Z (b0b) |", "## Superseded",
        "| cpu:0@vm | train: tiny fp32, batch 4 | 2,339 tokens/s | 2026-11-28T15:41:27Z "
        "(c0ffee-vm) |"})
    EXPECT_NE(md.find(s), std::string::npos) << s << "\n" << md;

  // The merged report merged with one of its own inputs: the same rows, nothing superseded.
  const ct::test::ProcResult again =
      ct::test::run_crosstrain("bench --merge " + (dir_ / "again").string() + " " +
                               (out / "report.json").string() + " " + fb);
  ASSERT_EQ(again.status, 0) << again.output;
  const json k = load(dir_ / "again" / "report.json");
  ASSERT_EQ(k["devices"].size(), 2u);
  EXPECT_EQ(k["devices"][0]["train"], vm["train"]);
  EXPECT_EQ(k["devices"][0]["superseded"], vm["superseded"]);
}

// Two hosts of one name and one CPU model name but other CPUs (a cloud VM's "AMD EPYC", a Zen 3
// and a Zen 4): the CPU's id keeps them apart, devices and peers, each column naming it; a
// report without an id (before the field) stays a column of its own.
TEST_F(Report, MergeKeepsHostsOfOneNameWithOtherCpusApart) {
  auto on = [&](const std::string& cpu_id, double tokens_per_s, double peer_tokens_per_s) {
    json r = machine("vm", "2026-11-29T00:00:00Z", "cpu:0", tokens_per_s);
    if (!cpu_id.empty()) r["host"]["cpu_id"] = cpu_id;
    r["peers"] = {{{"peer", "pytorch eager"},
                   {"device", "cpu"},
                   {"model", "tiny"},
                   {"precision", "fp32"},
                   {"steps", 6},
                   {"tokens_per_s", peer_tokens_per_s}}};
    return r;
  };
  const std::string zen3 = write("zen3.json", on("", 2351, 1922).dump()),
                    zen4 =
                        write("zen4.json",
                              on("family 25 model 17 stepping 1, avx512_bf16", 2425, 1571).dump());
  const fs::path out = dir_ / "merged";
  const ct::test::ProcResult r =
      ct::test::run_crosstrain("bench --merge " + out.string() + " " + zen4 + " " + zen3);
  ASSERT_EQ(r.status, 0) << r.output;
  const json j = load(out / "report.json");
  ASSERT_EQ(j["devices"].size(), 2u) << j["devices"].dump(1);
  EXPECT_EQ(j["devices"][0]["label"], "cpu:0@vm (family 25 model 17 stepping 1, avx512_bf16)");
  EXPECT_EQ(j["devices"][1]["label"], "cpu:0@vm");
  EXPECT_FALSE(j["devices"][0].contains("superseded"));
  ASSERT_EQ(j["peers"].size(), 2u) << j["peers"].dump(1);
  // the peers' columns named in the JSON, for the charts too
  EXPECT_EQ(j["peers"][0]["label"],
            "pytorch eager cpu@vm (family 25 model 17 stepping 1, avx512_bf16)");
  EXPECT_EQ(j["peers"][1]["label"], "pytorch eager cpu@vm");
  const std::string md = read_text(out / "report.md");
  for (const char* s :
       {"| model | precision | cpu:0@vm (family 25 model 17 stepping 1, avx512_bf16) | cpu:0@vm | "
        "pytorch eager cpu@vm (family 25 model 17 stepping 1, avx512_bf16) | pytorch eager "
        "cpu@vm |",
        "| tiny | fp32 | 2,425 | 2,351 | 1,571 | 1,922 |",
        "vm: some cpu (family 25 model 17 stepping 1, avx512_bf16), 4 cores"})
    EXPECT_NE(md.find(s), std::string::npos) << s << "\n" << md;
}

}  // namespace
