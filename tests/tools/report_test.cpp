// `crosstrain bench --report` and `--merge`: one real report of the CPU (a device that fails is
// marked failed and the rest still runs), two reports of different machines merged side by side,
// and the refusal of a file that is not a report or of another format version, naming the file.
#include <gtest/gtest.h>
#include <unistd.h>

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
  const fs::path out = dir_ / "report";
  const ct::test::ProcResult r = ct::test::run_crosstrain(
      "bench --report " + out.string() +
      " --devices cpu:0,nosuch:0 --models tiny --steps 1 --batch 1 --iters 1 --precisions fp32 "
      "--data " +
      data);
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
  bool layernorm_backward = false;
  for (const json& o : cpu["ops"]) {
    EXPECT_GT(o["ms"].get<double>(), 0) << o.dump();
    layernorm_backward |= o["op"] == "layernorm" && o["direction"] == "backward";
  }
  EXPECT_TRUE(layernorm_backward) << cpu["ops"].dump(1);
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
                        "## Failures", "| tiny | fp32 |"})
    EXPECT_NE(text_md.find(s), std::string::npos) << s << "\n" << text_md;
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
