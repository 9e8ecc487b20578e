// `crosstrain bench --report` and `--merge`: one real report of the CPU (a device that fails is
// marked failed and the rest still runs), two reports of different machines merged side by side,
// and the refusal of a file that is not a report or of another format version, naming the file.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "tests/common/test_data_dir.h"
#include "tests/tools/cli_run.h"

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
    if (!*reference) EXPECT_GT(j["cpu_reference"][0]["loss"].get<double>(), 0);
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

  // A merged report merges again (the same format).
  const ct::test::ProcResult again =
      ct::test::run_crosstrain("bench --merge " + (dir_ / "twice").string() + " " +
                               (out / "report.json").string() + " " + a);
  ASSERT_EQ(again.status, 0) << again.output;
  EXPECT_EQ(load(dir_ / "twice" / "report.json")["devices"].size(), 4u);
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

}  // namespace
