// The report format (report_format.h): its head, the known peaks, checking, merging, Markdown.
#include "tools/crosstrain/report_format.h"

#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <thread>
#include <utility>

#include "core/device.h"
#include "core/error.h"
#include "core/model/model_config.h"
#include "core/registry.h"
#include "core/train/progress.h"
#if __has_include("ct_build_info.h")
#include "ct_build_info.h"  // CT_GIT_COMMIT, CT_BUILD_TYPE: written at build time (cmake/)
#endif
#ifndef CT_GIT_COMMIT
#define CT_GIT_COMMIT "unknown"
#endif
#ifndef CT_BUILD_TYPE
#define CT_BUILD_TYPE "unknown"
#endif

namespace ct::cli {
namespace {
namespace fs = std::filesystem;
using nlohmann::json;

std::string compiler() {
#if defined(__clang__)
  return std::string("clang ") + __clang_version__;
#elif defined(__GNUC__)
  return std::string("gcc ") + __VERSION__;
#else
  return "unknown";
#endif
}

std::string utc_now() {
  const std::time_t t = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  for (std::string line; std::getline(f, line);) {
    if (line.rfind("model name", 0) != 0) continue;
    const size_t colon = line.find(':');
    if (colon != std::string::npos) return line.substr(line.find_first_not_of(' ', colon + 1));
  }
  struct utsname u {};
  return uname(&u) == 0 ? u.machine : "unknown";
}

// What tells two CPUs of one model name apart (a VM's "AMD EPYC" is a Zen 3 or a Zen 4): the
// family, model and stepping /proc/cpuinfo gives, and the widest of the instruction sets the
// CPU kernels choose between ("family 25 model 17 stepping 1, avx512_bf16"); "" elsewhere.
std::string cpu_id() {
  std::ifstream f("/proc/cpuinfo");
  std::string family, model, stepping, flags;
  for (std::string line; std::getline(f, line) && flags.empty();) {
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string key = line.substr(0, colon);
    key.erase(key.find_last_not_of(" \t") + 1);
    const size_t at = line.find_first_not_of(' ', colon + 1);
    const std::string value = at == std::string::npos ? "" : line.substr(at);
    if (key == "cpu family") family = value;
    if (key == "model") model = value;
    if (key == "stepping") stepping = value;
    if (key == "flags") flags = " " + value + " ";
  }
  if (family.empty() || model.empty()) return "";
  std::string id = "family " + family + " model " + model;
  if (!stepping.empty()) id += " stepping " + stepping;
  for (const char* isa : {"amx_bf16", "avx512_bf16", "avx512f", "avx2"})
    if (flags.find(std::string(" ") + isa + " ") != std::string::npos) return id + ", " + isa;
  return id;
}

json host() {
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) != 0) std::snprintf(name, sizeof name, "unknown");
  struct utsname u {};
  const std::string os = uname(&u) == 0 ? std::string(u.sysname) + " " + u.release : "unknown";
  return {{"name", name},
          {"cpu", cpu_model()},
          {"cpu_id", cpu_id()},
          {"cores", static_cast<int>(std::thread::hardware_concurrency())},
          {"os", os}};
}

// Dense (not sparse) peaks from the vendors' data sheets, TFLOP/s; the first name that the
// device's name contains wins, so the more specific names come first.
struct Peak {
  const char* name;
  double fp32, tf32, bf16, fp16;
};
constexpr Peak kPeaks[] = {
    {"H100 PCIe", 51.2, 378.0, 756.0, 756.0}, {"H100 NVL", 60.0, 418.0, 835.0, 835.0},
    {"H100", 66.9, 494.7, 989.4, 989.4},      {"H200", 66.9, 494.7, 989.4, 989.4},
    {"GH200", 66.9, 494.7, 989.4, 989.4},     {"A100", 19.5, 156.0, 312.0, 312.0},
    {"L40S", 91.6, 183.0, 362.0, 362.0},      {"L4", 30.3, 60.0, 121.0, 121.0},
    {"RTX 4090", 82.6, 82.6, 165.2, 165.2},   {"MI300X", 163.4, 653.7, 1307.4, 1307.4},
    {"MI250X", 95.7, 0.0, 383.0, 383.0},      {"MI210", 45.3, 0.0, 181.0, 181.0},
};

const Peak* find_peak(const std::string& name) {
  for (const Peak& p : kPeaks)
    if (name.find(p.name) != std::string::npos) return &p;
  return nullptr;
}

// ---- Markdown helpers ------------------------------------------------------------------------

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

std::string num(const json& v) {  // a figure for a table cell: thousands separators when big
  if (!v.is_number()) return "";
  const double x = v.get<double>();
  if (std::fabs(x) >= 1000) return format_count(x);
  if (std::fabs(x) >= 100) return fmt("%.0f", x);
  if (std::fabs(x) >= 10) return fmt("%.1f", x);
  return fmt("%.3g", x);
}

std::string str(const json& j, const char* key) {
  if (!j.is_object() || !j.contains(key)) return "";
  const json& v = j[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_null()) return "";
  return v.dump();
}

std::string cell(const std::string& s) {  // no line breaks or bars inside a table cell
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    if (c == '|') out.push_back('\\');
    out.push_back(c == '\n' || c == '\r' ? ' ' : c);
  }
  return out;
}

std::string percent(const json& v) {
  return v.is_number() ? fmt("%.1f %%", 100.0 * v.get<double>()) : "";
}

// "lo-hi" of a list of figures (a failed round's 0 left out).
std::string range_of(const json& figures) {
  double lo = 0, hi = 0;
  for (const json& v : figures)
    if (v.get<double>() > 0) {
      lo = lo > 0 ? std::min(lo, v.get<double>()) : v.get<double>();
      hi = std::max(hi, v.get<double>());
    }
  return num(lo) + "-" + num(hi);
}

// A training row's ratio to fp32 over --rounds ("0.98x (0.95-1.01, 3)"): the median of the
// rounds' ratios, their range and count; fp32's own row gives its rounds' tokens/s range.
std::string vs_fp32(const json& t) {
  const json rounds = t.value("rounds", json::array());
  if (t.contains("over_fp32")) {
    const json& r = t["over_fp32_range"];
    return fmt("%.3fx", t["over_fp32"].get<double>()) + " (" + fmt("%.3f", r[0].get<double>()) +
           "-" + fmt("%.3f", r[1].get<double>()) + ", " + std::to_string(rounds.size()) + ")";
  }
  if (rounds.size() < 2) return "";
  return "tokens/s " + range_of(rounds) + " (" + std::to_string(rounds.size()) + ")";
}

std::string row(const std::vector<std::string>& cells) {
  std::string r = "|";
  for (const auto& c : cells) {
    r.push_back(' ');
    r.append(cell(c));
    r.append(" |");
  }
  r.push_back('\n');
  return r;
}

std::string header(const std::vector<std::string>& cells, size_t left) {
  std::string r = row(cells) + "|";
  for (size_t i = 0; i < cells.size(); ++i) r += i < left ? "---|" : "---:|";
  return r + "\n";
}

std::string build_line(const json& build) {
  return str(build, "commit") + " (" + str(build, "compiler") + ", " + str(build, "build_type") +
         ", backend ABI " + str(build, "backend_abi") + ")";
}

std::string host_line(const json& h) {  // what the host said of itself (an import: its name)
  std::string about;
  for (const std::string& part :
       {str(h, "cpu") + (str(h, "cpu_id").empty() ? "" : " (" + str(h, "cpu_id") + ")"),
        h.value("cores", 0) > 0 ? str(h, "cores") + " cores" : "", str(h, "os")})
    if (!part.empty()) about += (about.empty() ? "" : ", ") + part;
  return str(h, "name") + (about.empty() ? "" : ": " + about);
}

// A table with one row per key (in first-seen order) and one column per device: `key` names a
// row of a device's `section`, `value` renders its cell.
template <typename Key, typename Value>
std::string pivot(const json& devices, const char* section, const std::vector<std::string>& heads,
                  Key key, Value value) {
  std::vector<std::vector<std::string>> keys;
  std::map<std::vector<std::string>, std::map<std::string, std::string>> cells;
  std::vector<std::string> labels;
  for (const json& d : devices) {
    if (!d.contains(section) || d[section].empty()) continue;
    const std::string label = str(d, "label");
    labels.push_back(label);
    for (const json& r : d[section]) {
      const std::vector<std::string> k = key(r);
      if (!cells.count(k)) keys.push_back(k);
      cells[k][label] = value(r, d);
    }
  }
  if (keys.empty()) return "";
  std::vector<std::string> h = heads;
  h.insert(h.end(), labels.begin(), labels.end());
  std::string md = header(h, heads.size());
  for (const auto& k : keys) {
    std::vector<std::string> r = k;
    for (const auto& l : labels) r.push_back(cells[k].count(l) ? cells[k][l] : "");
    md += row(r);
  }
  return md;
}

// The build of an origin, and where it was imported from (a report converted from an older
// format: scripts/import_gpu_check_report.py).
std::string origin_build(const json& origin) {
  std::string b = str(origin.value("build", json::object()), "commit");
  if (origin.contains("imported_from"))
    b += " (imported from " + str(origin["imported_from"], "format") + ")";
  return b;
}

// A peer's column: what ran, where ("pytorch eager cuda"), and on which host in a merged report
// (with the CPU's id where `ambiguous` holds the host's name: hosts of one name, other CPUs).
std::string peer_label(const json& p, bool merged, const std::set<std::string>& ambiguous = {}) {
  std::string device = str(p, "device");
  device = device.substr(0, device.find(':'));
  std::string label = str(p, "peer") + (device.empty() ? "" : " " + device);
  const json& h = p.value("origin", json::object()).value("host", json::object());
  if (merged) label += "@" + str(h, "name");
  if (merged && ambiguous.count(str(h, "name")) && !str(h, "cpu_id").empty())
    label += " (" + str(h, "cpu_id") + ")";
  return label;
}

// What qualifies a peer's figure: "capped: 1 of 6 steps, time limit 300 s; warm-up included";
// "" for a full run.
std::string peer_note(const json& p) {
  std::string note;
  if (p.contains("capped")) {
    const json& c = p["capped"];
    note = "capped: " + str(c, "steps") + " of " + str(c, "of") + " steps, time limit " +
           num(c.value("time_limit_s", json())) + " s";
  }
  if (p.value("warmup_included", false))
    note += (note.empty() ? "" : "; ") + std::string("warm-up included");
  return note;
}

// Host names that more than one CPU reported under (devices and peers of a merged report).
std::set<std::string> ambiguous_hosts(const json& devices, const json& peers) {
  std::map<std::string, std::set<std::string>> cpus;
  auto note_host = [&](const json& x) {
    const json& h = x.value("origin", json::object()).value("host", json::object());
    cpus[str(h, "name")].insert(str(h, "cpu") + "\n" + str(h, "cpu_id"));
  };
  for (const json& d : devices) note_host(d);
  for (const json& p : peers) note_host(p);
  std::set<std::string> ambiguous;
  for (const auto& [name, ids] : cpus)
    if (ids.size() > 1) ambiguous.insert(name);
  return ambiguous;
}

// The headline: tokens/s per model and precision, a column per device, then one per peer (its
// label, which a merge writes, or peer_label's).
std::string throughput_md(const json& devices, const json& peers, bool merged) {
  std::vector<std::vector<std::string>> keys;
  std::map<std::vector<std::string>, std::map<std::string, std::string>> cells;
  std::vector<std::string> columns;
  auto put = [&](const std::string& column, const json& row, const std::string& note) {
    const std::vector<std::string> k = {str(row, "model"), str(row, "precision")};
    if (!cells.count(k)) keys.push_back(k);
    if (std::find(columns.begin(), columns.end(), column) == columns.end())
      columns.push_back(column);
    cells[k][column] = !str(row, "error").empty() ? "failed"
                       : note.empty()             ? num(row.value("tokens_per_s", json()))
                                      : num(row.value("tokens_per_s", json())) + " (" + note + ")";
  };
  for (const json& d : devices)
    for (const json& t : d.value("train", json::array())) put(str(d, "label"), t, "");
  if (peers.is_array())
    for (const json& p : peers)
      put(p.contains("label") ? str(p, "label") : peer_label(p, merged), p, peer_note(p));
  if (keys.empty()) return "";
  std::vector<std::string> h = {"model", "precision"};
  h.insert(h.end(), columns.begin(), columns.end());
  std::string md = header(h, 2);
  for (const auto& k : keys) {
    std::vector<std::string> r = k;
    for (const auto& c : columns) r.push_back(cells[k].count(c) ? cells[k][c] : "");
    md += row(r);
  }
  return md;
}

// Every origin of a device's figures: its own, then those its rows name (a device joined from
// several reports of its host), each once.
std::vector<json> device_origins(const json& d) {
  std::vector<json> origins = {d.value("origin", json::object())};
  for (const char* section : {"train", "gemm", "ops", "memory"})
    for (const json& row : d.value(section, json::array()))
      if (row.contains("origin") &&
          std::find(origins.begin(), origins.end(), row["origin"]) == origins.end())
        origins.push_back(row["origin"]);
  return origins;
}

std::string devices_md(const json& devices) {
  std::string md = header(
      {"device", "name", "kind", "backend", "precisions", "status", "build", "date", "host"}, 9);
  for (const json& d : devices) {
    std::string prec;
    for (const json& p : d.value("precisions", json::array()))
      prec += (prec.empty() ? "" : ", ") + p.get<std::string>();
    std::string builds, dates;
    for (const json& o : device_origins(d)) {
      const std::string b = origin_build(o);
      if (builds.find(b) == std::string::npos) builds += (builds.empty() ? "" : ", ") + b;
      dates += (dates.empty() ? "" : ", ") + str(o, "date");
    }
    const json& o = d.value("origin", json::object());
    md += row({str(d, "label"), str(d, "name"), str(d, "kind"), str(d, "backend"), prec,
               str(d, "status"), builds, dates, str(o.value("host", json::object()), "name")});
  }
  return md;
}

// One row per training run; in a merged report, where each figure came from (a device joined
// from several reports mixes dates and batches).
std::string train_detail_md(const json& devices, bool merged) {
  std::string md;
  for (const json& d : devices)
    for (const json& t : d.value("train", json::array())) {
      std::vector<std::string> h = {
          "device", "model",        "precision", "batch", "tokens/s",        "model TFLOP/s",
          "MFU",    "of best GEMM", "steps",     "loss",  "loss - cpu fp32", "vs fp32 (rounds)"};
      if (merged) h.push_back("measured");
      if (md.empty()) md = header(h, 3);
      const json& o = t.contains("origin") ? t["origin"] : d.value("origin", json::object());
      const std::string measured =
          str(o, "date") + " (" + str(o.value("build", json::object()), "commit") + ")";
      std::vector<std::string> cells;
      if (!str(t, "error").empty()) {
        cells = {str(d, "label"),
                 str(t, "model"),
                 str(t, "precision"),
                 str(t, "batch"),
                 "failed: " + str(t, "error"),
                 "",
                 "",
                 "",
                 "",
                 "",
                 "",
                 ""};
      } else {
        const double tflops = t.value("tokens_per_s", 0.0) * t.value("flops_per_token", 0.0) / 1e12;
        const json diff = t.value("loss_diff_vs_cpu", json());
        cells = {str(d, "label"),
                 str(t, "model"),
                 str(t, "precision"),
                 str(t, "batch"),
                 num(t.value("tokens_per_s", json())),
                 fmt("%.3g", tflops),
                 percent(t.value("mfu", json())),
                 percent(t.value("of_best_gemm", json())),
                 str(t, "steps"),
                 t.contains("loss") ? fmt("%.4f", t["loss"].get<double>()) : "",
                 diff.is_number() ? fmt("%+.2e", diff.get<double>()) : "",
                 vs_fp32(t)};
      }
      if (merged) cells.push_back(measured);
      md += row(cells);
    }
  return md;
}

// The rows a newer measurement of the same device (or peer) replaced in a merge: kept in the
// JSON, listed here with their origin.
std::string superseded_md(const json& devices, const json& peers) {
  std::string md;
  auto add = [&](const std::string& who, const std::string& what, const json& r) {
    if (md.empty()) md = header({"device or peer", "row", "figure", "measured"}, 2);
    const std::string figure = !str(r, "error").empty()     ? "failed"
                               : r.contains("tokens_per_s") ? num(r["tokens_per_s"]) + " tokens/s"
                               : r.contains("gflops")       ? num(r["gflops"]) + " GFLOP/s"
                               : r.contains("ms")    ? fmt("%.3f", r["ms"].get<double>()) + " ms"
                               : r.contains("bytes") ? format_bytes(r["bytes"].get<int64_t>())
                                                     : "";
    const json& o = r.value("origin", json::object());
    md += row({who, what, figure, str(o, "date") + " (" + origin_build(o) + ")"});
  };
  for (const json& d : devices)
    for (const json& r : d.value("superseded", json::array())) {
      const std::string section = str(r, "section");
      std::string what = section + ": " + str(r, "model");
      for (const char* f : {"precision", "technique", "op", "direction", "shape", "dtype"})
        if (!str(r, f).empty()) what += " " + str(r, f);
      if (r.contains("batch")) what += ", batch " + str(r, "batch");
      add(str(d, "label"), what, r);
    }
  if (peers.is_array())
    for (const json& p : peers)
      add(str(p, "peer") + " " + str(p, "device"), str(p, "model") + " " + str(p, "precision"), p);
  return md;
}

std::string memory_md(const json& devices) {
  std::string md;
  for (const json& d : devices)
    for (const json& m : d.value("memory", json::array())) {
      if (md.empty())
        md = header({"device", "model", "technique", "peak", "weights (at the end)", "grads",
                     "optimizer", "activations", "workspace"},
                    3);
      auto b = [&](const char* k) { return format_bytes(m.value(k, int64_t{0})); };
      md += row({str(d, "label"), str(m, "model"), str(m, "technique"), b("bytes"), b("weights"),
                 b("grads"), b("optimizer"), b("activations"), b("workspace")});
    }
  return md;
}

std::string peers_md(const json& peers) {
  if (!peers.is_array() || peers.empty()) return "";
  std::string md = header(
      {"peer", "version", "device", "model", "precision", "tokens/s", "steps", "loss", "date"}, 5);
  for (const json& p : peers)
    md += row(
        {str(p, "peer"), str(p, "version"), str(p, "device"), str(p, "model"), str(p, "precision"),
         !str(p, "error").empty() ? "failed"
         : p.contains("rounds")
             ? num(p.value("tokens_per_s", json())) + " (median of " +
                   std::to_string(p["rounds"].size()) + " rounds: " + range_of(p["rounds"]) + ")"
             : num(p.value("tokens_per_s", json())),
         str(p, "steps"),
         p.contains("loss") && p["loss"].is_number() ? fmt("%.4f", p["loss"].get<double>()) : "",
         str(p.value("origin", json::object()), "date")});
  // Why a figure is partial, or missing: below the table, one line per peer that has a reason.
  std::string notes;
  for (const json& p : peers) {
    const std::string why = str(p, "error").empty() ? peer_note(p) : "failed: " + str(p, "error");
    if (!why.empty())
      notes += "- " + str(p, "peer") + " " + str(p, "model") + " " + str(p, "precision") + ": " +
               why + "\n";
  }
  if (!notes.empty()) md += "\n" + notes;
  return md;
}

std::string failures_md(const json& devices) {
  std::string md;
  for (const json& d : devices)
    for (const json& e : d.value("errors", json::array())) {
      if (md.empty()) md = header({"device", "error"}, 2);
      md += row({str(d, "label"), e.get<std::string>()});
    }
  return md;
}

std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// Runs the chart script on dir/report.json; "" when it drew, else why the charts were skipped.
std::string draw_charts(const fs::path& dir) {
  const std::string script = find_script("report_charts.py");
  if (script.empty()) return "scripts/report_charts.py not found beside the binary";
  // CROSSTRAIN_PYTHON (the peers' Python: it may have torch but no matplotlib), python3, then
  // the system's (Debian's python3-matplotlib, where python3 is another one: pyenv, a venv).
  std::vector<std::string> candidates;
  if (const char* py_env = std::getenv("CROSSTRAIN_PYTHON"); py_env && *py_env)
    candidates.push_back(py_env);
  candidates.push_back("python3");
  candidates.push_back("/usr/bin/python3");
  std::string py;
  for (const std::string& c : candidates)
    if (std::system((shell_quote(c) + " -c 'import matplotlib' >/dev/null 2>&1").c_str()) == 0) {
      py = c;
      break;
    }
  if (py.empty())
    return "no Python with matplotlib (tried CROSSTRAIN_PYTHON, python3, /usr/bin/python3; pip "
           "install matplotlib, or Debian's python3-matplotlib)";
  const std::string log = (dir / "charts.log").string();
  const std::string cmd = shell_quote(py) + " " + shell_quote(script) + " " +
                          shell_quote((dir / "report.json").string()) + " " +
                          shell_quote(dir.string()) + " >" + shell_quote(log) + " 2>&1";
  if (std::system(cmd.c_str()) != 0) return script + " failed (see " + log + ")";
  return "";
}

}  // namespace

std::string find_script(const std::string& name) {
  const fs::path exe = executable_dir();
  for (const fs::path& p : {exe / ".." / "scripts" / name,  // a bundle: bin/ beside scripts/
#ifdef CT_SOURCE_DIR
                            fs::path(CT_SOURCE_DIR) / "scripts" / name,  // the build's tree
#endif
                            exe / name})
    if (fs::is_regular_file(p)) return p.lexically_normal().string();
  return "";
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void peer_throughput(json& row, std::vector<double> tps, size_t warmup, int requested,
                     double time_limit_s, bool stopped_early) {
  if (tps.empty()) return;
  row["steps"] = tps.size();
  const size_t skip = std::min(warmup, tps.size() - 1);
  if (skip < warmup) row["warmup_included"] = true;
  tps.erase(tps.begin(), tps.begin() + static_cast<std::ptrdiff_t>(skip));
  row["tokens_per_s"] = median(std::move(tps));
  if (stopped_early)
    row["capped"] = {{"steps", row["steps"]}, {"of", requested}, {"time_limit_s", time_limit_s}};
}

json torch_peer_row(json row, const std::string& file, bool compile) {
  std::ifstream f(file);
  if (!f) {
    row["error"] = file + ": not written";
    return row;
  }
  try {
    const json run = json::parse(f);
    std::vector<double> tps;
    for (const json& step : run.at("steps")) tps.push_back(step.at("tokens_per_s").get<double>());
    if (tps.empty()) {
      row["error"] = file + ": no steps";
      return row;
    }
    json out = row;
    peer_throughput(out, tps, compile ? 8 : 1,
                    run.value("steps_requested", static_cast<int>(tps.size())),
                    run.value("time_limit_s", 0.0), run.value("stopped_early", false));
    out["loss"] = run["steps"].back().at("loss");
    out["device"] = run.value("device", str(row, "device"));
    out["version"] = run.value("torch", std::string());
    return out;
  } catch (const json::exception& e) {
    row["error"] = file + ": not torch_train.py's JSON (" + e.what() + ")";
    return row;
  }
}

json report_head() {
  return {{"format", kReportFormat},
          {"version", kReportVersion},
          {"build",
           {{"commit", CT_GIT_COMMIT},
            {"compiler", compiler()},
            {"build_type", CT_BUILD_TYPE},
            {"backend_abi", kBackendAbiVersion}}},
          {"date", utc_now()},
          {"host", host()}};
}

json report_origin(const json& report) {
  json o = {{"build", report.value("build", json::object())},
            {"date", report.value("date", std::string())},
            {"host", report.value("host", json::object())}};
  if (report.contains("imported_from")) o["imported_from"] = report["imported_from"];
  return o;
}

void derive_figures(json& device) {
  if (!device.contains("peak_tflops") || device["peak_tflops"].empty())
    device["peak_tflops"] = known_peaks(str(device, "name"));
  const json& peaks = device["peak_tflops"];
  auto peak = [&](const std::string& precision) {
    return peaks.contains(precision) ? peaks[precision].get<double>() : 0.0;
  };
  if (device.contains("gemm"))
    for (json& g : device["gemm"]) {
      const std::string d = str(g, "dtype");
      const double p = peak(d == "f32" ? "fp32" : d == "bf16" ? "bf16" : "fp16");
      if (!g.contains("efficiency") && p > 0 && g.contains("gflops"))
        g["efficiency"] = g["gflops"].get<double>() / (p * 1e3);
    }
  if (!device.contains("train")) return;
  for (json& t : device["train"]) {
    if (!t.contains("tokens_per_s")) continue;
    if (!t.contains("flops_per_token")) {
      try {
        t["flops_per_token"] = model_flops_per_token(str(t, "model"));
      } catch (const Error&) {
        continue;  // a model this crosstrain has no preset of
      }
    }
    const std::string prec = str(t, "precision");
    const double flops = t["tokens_per_s"].get<double>() * t["flops_per_token"].get<double>();
    if (!t.contains("mfu") && peak(prec) > 0) t["mfu"] = flops / (peak(prec) * 1e12);
    // No TF32 GEMM is timed: a tf32 run has no best GEMM of its own to be measured against.
    if (t.contains("of_best_gemm") || !device.contains("gemm") || prec == "tf32") continue;
    const std::string dtype = prec == "fp16" ? "f16" : prec == "bf16" ? "bf16" : "f32";
    double best = 0;
    for (const json& g : device["gemm"])
      if (str(g, "dtype") == dtype && str(g, "model") == str(t, "model") && g.contains("gflops"))
        best = std::max(best, g["gflops"].get<double>());
    if (best > 0) t["of_best_gemm"] = flops / (best * 1e9);
  }
}

double known_peak_tflops(const std::string& device_name, const std::string& precision) {
  const Peak* p = find_peak(device_name);
  if (!p) return 0;
  if (precision == "fp32") return p->fp32;
  if (precision == "tf32") return p->tf32;
  if (precision == "bf16") return p->bf16;
  if (precision == "fp16") return p->fp16;
  return 0;
}

json known_peaks(const std::string& device_name) {
  json j = json::object();
  for (const char* prec : {"fp32", "tf32", "bf16", "fp16"})
    if (const double v = known_peak_tflops(device_name, prec); v > 0) j[prec] = v;
  return j;
}

double model_flops_per_token(const std::string& model) {
  const ModelConfig cfg = ModelConfig::preset(model);
  double n = static_cast<double>(cfg.num_parameters());
  int L = 0, C = 0;
  if (cfg.is_llama()) {
    L = cfg.llama().n_layer;
    C = cfg.llama().n_embd;
  } else {
    L = cfg.gpt2().n_layer;
    C = cfg.gpt2().n_embd;
    n -= static_cast<double>(cfg.gpt2().block_size) * C;  // wpe is a lookup, not a matmul
  }
  return 6.0 * n + 12.0 * L * cfg.block_size() * static_cast<double>(C);
}

void check_report(const json& j, const std::string& file) {
  auto refuse = [&](const std::string& why) {
    fail(ErrorKind::kInvalidArgument, file + ": " + why);
  };
  if (!j.is_object() || !j.contains("format"))
    refuse(std::string("not a crosstrain report (no \"format\": \"") + kReportFormat + "\")");
  if (j["format"] != kReportFormat)
    refuse("not a crosstrain report (format " + j["format"].dump() + ", expected \"" +
           kReportFormat + "\")");
  if (!j.contains("version") || !j["version"].is_number_integer())
    refuse("a crosstrain report without an integer \"version\"");
  const int v = j["version"].get<int>();
  if (v != kReportVersion)
    refuse("report format version " + std::to_string(v) + ", this crosstrain reads version " +
           std::to_string(kReportVersion) +
           (v > kReportVersion ? " (written by a newer crosstrain)" : ""));
  if (!j.contains("devices") || !j["devices"].is_array())
    refuse("a crosstrain report without a \"devices\" list");
  for (const json& d : j["devices"])
    if (!d.is_object() || !d.contains("label") || !d["label"].is_string())
      refuse("a device without a \"label\"");
}

json read_report(const std::string& file) {
  std::ifstream f(file);
  if (!f) fail(ErrorKind::kIo, file + ": cannot open it");
  json j;
  try {
    j = json::parse(f);
  } catch (const json::exception& e) {
    fail(ErrorKind::kInvalidArgument,
         file + ": not a crosstrain report (not JSON: " + std::string(e.what()) + ")");
  }
  check_report(j, file);
  return j;
}

namespace {

// A device's identity across reports: its host (name, CPU and its cpu_id, cores) and the device
// (id, name). Two reports of one machine's CPU share it; the same id on another host, or on a
// host of the same name with another CPU (cloud VMs), does not.
std::string device_key(const json& d) {
  const json& h = d.value("origin", json::object()).value("host", json::object());
  return str(h, "name") + "\n" + str(h, "cpu") + "\n" + str(h, "cpu_id") + "\n" + str(h, "cores") +
         "\n" + (d.contains("id") ? str(d, "id") : str(d, "label")) + "\n" + str(d, "name");
}

// A peer's identity: the column it is shown in (peer, device, host) and its row.
std::string peer_key(const json& p) {
  const json& h = p.value("origin", json::object()).value("host", json::object());
  return str(p, "peer") + "\n" + str(p, "device") + "\n" + str(h, "name") + "\n" + str(h, "cpu") +
         "\n" + str(h, "cpu_id") + "\n" + str(p, "model") + "\n" + str(p, "precision");
}

// What makes two rows of a device's `section` the same measurement of it.
std::string row_key(const std::string& section, const json& row) {
  std::vector<const char*> fields;
  if (section == "train") fields = {"model", "precision"};
  if (section == "memory") fields = {"model", "technique"};
  if (section == "ops") fields = {"model", "op", "direction", "dtype", "shape"};
  if (section == "gemm") fields = {"model", "shape", "variant", "layout", "M", "N", "K", "dtype"};
  std::string k;
  for (const char* f : fields) k += str(row, f) + "\n";
  return k;
}

// Puts `row` into `rows` unless a row of the same key is there: then the newer of the two (by
// its origin's date, `fallback` where a row has none; the later one given on a tie) stays and
// the other goes to `superseded`, with its origin; the same measurement twice (same date and
// build) is kept once.
void add_newest(json& rows, json row, const std::string& key, const json& fallback,
                json& superseded, const std::string& section = "") {
  auto origin_of = [&](const json& r) { return r.contains("origin") ? r["origin"] : fallback; };
  auto keyed = [&](const json& r) { return section.empty() ? peer_key(r) : row_key(section, r); };
  for (json& old : rows) {
    if (keyed(old) != key) continue;
    const json a = origin_of(old), b = origin_of(row);
    if (str(a, "date") == str(b, "date") && str(a.value("build", json::object()), "commit") ==
                                                str(b.value("build", json::object()), "commit"))
      return;  // one measurement, merged twice
    json loser = str(b, "date") >= str(a, "date") ? old : row;
    if (str(b, "date") >= str(a, "date")) old = row;
    if (!loser.contains("origin")) loser["origin"] = fallback;
    if (!section.empty()) loser["section"] = section;
    if (!superseded.is_array()) superseded = json::array();
    superseded.push_back(loser);
    return;
  }
  rows.push_back(row);
}

// Joins device `d` (another report's measurement of the same device) into `into`: the union
// of their precisions, every error, and each row of `d` beside `into`'s, naming its origin
// where it differs from `into`'s; rows of the same key: the newest wins (add_newest).
void join_device(json& into, const json& d) {
  const json& origin = d["origin"];
  const bool same_origin = origin == into["origin"];
  for (const json& p : d.value("precisions", json::array()))
    if (!into.contains("precisions") ||
        std::find(into["precisions"].begin(), into["precisions"].end(), p) ==
            into["precisions"].end())
      into["precisions"].push_back(p);
  if (str(d, "status") == "failed") {
    if (!into.contains("error") && d.contains("error")) into["error"] = d["error"];
    into["status"] = "failed";
  }
  for (const json& e : d.value("errors", json::array())) into["errors"].push_back(e);
  json superseded = into.value("superseded", json::array());
  for (const char* section : {"gemm", "ops", "train", "memory"})
    for (json row : d.value(section, json::array())) {
      if (!same_origin && !row.contains("origin")) row["origin"] = origin;
      if (!into.contains(section)) into[section] = json::array();
      add_newest(into[section], row, row_key(section, row), into["origin"], superseded, section);
    }
  for (json row : d.value("superseded", json::array())) {
    if (!row.contains("origin")) row["origin"] = origin;
    superseded.push_back(row);
  }
  if (!superseded.empty()) into["superseded"] = superseded;
}

}  // namespace

json merge_reports(const std::vector<std::pair<std::string, json>>& reports) {
  json out = report_head();
  out["merged_from"] = json::array();
  out["devices"] = json::array();
  out["peers"] = json::array();
  out["cpu_reference"] = json::array();
  std::map<std::string, size_t> device_at;  // device_key -> index in out["devices"]
  for (const auto& [file, r] : reports) {
    const json origin = report_origin(r);
    json from = origin;
    from["file"] = file;
    out["merged_from"].push_back(from);
    const json& batch = r.value("settings", json::object()).value("batch", json());
    for (json d : r["devices"]) {
      if (!d.contains("origin")) d["origin"] = origin;
      if (batch.is_number() && d.contains("train"))  // a joined device mixes batches
        for (json& t : d["train"])
          if (!t.contains("batch")) t["batch"] = batch;
      derive_figures(d);
      const std::string key = device_key(d);
      if (const auto it = device_at.find(key); it != device_at.end()) {
        join_device(out["devices"][it->second], d);
      } else {
        device_at[key] = out["devices"].size();
        out["devices"].push_back(d);
      }
    }
    for (json p : r.value("peers", json::array())) {
      if (!p.contains("origin")) p["origin"] = origin;
      add_newest(out["peers"], p, peer_key(p), json(), out["superseded_peers"]);
    }
    for (json c : r.value("cpu_reference", json::array())) {
      if (!c.contains("origin")) c["origin"] = origin;
      out["cpu_reference"].push_back(c);
    }
  }
  if (out.contains("superseded_peers") && out["superseded_peers"].empty())
    out.erase("superseded_peers");
  // Labels unique: a clashing one names its host, and a number where that still clashes.
  std::map<std::string, int> count;
  for (const json& d : out["devices"]) ++count[d["label"].get<std::string>()];
  for (json& d : out["devices"])
    if (count[d["label"].get<std::string>()] > 1)
      d["label"] = str(d, "id") + "@" + str(d["origin"].value("host", json::object()), "name");
  // Still clashing, two hosts of one name: the CPU's id where the report has one.
  count.clear();
  for (const json& d : out["devices"]) ++count[d["label"].get<std::string>()];
  for (json& d : out["devices"]) {
    const std::string id = str(d["origin"].value("host", json::object()), "cpu_id");
    if (count[d["label"].get<std::string>()] > 1 && !id.empty())
      d["label"] = d["label"].get<std::string>() + " (" + id + ")";
  }
  // Still clashing (two hosts of one name and CPU, a device of another name): the date of each,
  // then a number.
  count.clear();
  for (const json& d : out["devices"]) ++count[d["label"].get<std::string>()];
  for (json& d : out["devices"])
    if (count[d["label"].get<std::string>()] > 1)
      d["label"] = d["label"].get<std::string>() + " " + str(d["origin"], "date");
  std::set<std::string> seen;
  for (json& d : out["devices"]) {
    const std::string base = d["label"].get<std::string>();
    std::string label = base;
    for (int k = 2; seen.count(label); ++k) label = base + " #" + std::to_string(k);
    seen.insert(label);
    d["label"] = label;
  }
  // The peers' columns, named once for report.md and the charts alike.
  const std::set<std::string> ambiguous = ambiguous_hosts(out["devices"], out["peers"]);
  for (json& p : out["peers"]) p["label"] = peer_label(p, true, ambiguous);
  return out;
}

std::string report_markdown(const json& r, const fs::path& dir) {
  std::ostringstream md;
  const json& devices = r["devices"];
  md << "# crosstrain report\n\n"
     << kReportFormat << " v" << r.value("version", 0) << ", written " << str(r, "date")
     << " by crosstrain " << build_line(r.value("build", json::object())) << " on "
     << host_line(r.value("host", json::object())) << ".\n";
  if (r.contains("settings")) {
    const json& s = r["settings"];
    std::string models;
    for (const json& m : s.value("models", json::array()))
      models += (models.empty() ? "" : ", ") + m.get<std::string>();
    md << "Models: " << models << "; training: " << str(s, "steps") << " steps of batch "
       << str(s, "batch") << "; GEMM and op times: the median of up to " << str(s, "iters")
       << " timed calls after a warm-up";
    std::string precisions;
    for (const json& p : s.value("precisions", json::array()))
      precisions += (precisions.empty() ? "" : ", ") + p.get<std::string>();
    if (!precisions.empty()) md << "; precisions: " << precisions;
    md << ".\n";
  }
  if (r.contains("merged_from")) {
    md << "\nMerged from " << r["merged_from"].size() << " reports:\n\n";
    for (const json& f : r["merged_from"])
      md << "- `" << str(f, "file") << "`: " << str(f, "date") << ", crosstrain "
         << build_line(f.value("build", json::object()))
         << (f.contains("imported_from") ? " imported from " + str(f["imported_from"], "format") +
                                               " (" + str(f["imported_from"], "file") + ")"
                                         : "")
         << ", " << host_line(f.value("host", json::object())) << "\n";
  }
  md << "\n## Devices\n\n" << devices_md(devices);

  const std::string tps =
      throughput_md(devices, r.value("peers", json::array()), r.contains("merged_from"));
  if (!tps.empty())
    md << "\n## Training throughput, tokens/s\n\n"
       << "Devices, then the peers measured beside them (the Peers section says which version "
          "and settings)."
       << (r.contains("merged_from")
               ? " A column is one device of one host; where its figures come from several of "
                 "its reports, the training detail says which date, build and batch each is of."
               : "")
       << "\n\n"
       << tps << "\n### Training detail\n\n"
       << "Model FLOPs per token: 6 N + 12 L T C (PaLM / nanoGPT); MFU against the device's "
          "dense peak where it is known; \"of best GEMM\": against the fastest GEMM measured "
          "here in the same dtype. Loss after the same steps, seed and data; the difference from "
          "the CPU's fp32 run. \"vs fp32 (rounds)\": where the runs were repeated (`--rounds`, "
          "the precisions alternating), the median of each round's tokens/s over fp32's of the "
          "same round, their range and count; fp32's row: its rounds' range.\n\n"
       << train_detail_md(devices, r.contains("merged_from"));

  const std::string gemm = pivot(
      devices, "gemm", {"model", "shape", "layout", "M x N x K", "dtype"},
      [](const json& g) {
        return std::vector<std::string>{
            str(g, "model"),
            str(g, "shape") + (str(g, "variant").empty() ? "" : ", " + str(g, "variant")),
            str(g, "layout"), str(g, "M") + " x " + str(g, "N") + " x " + str(g, "K"),
            str(g, "dtype")};
      },
      [](const json& g, const json&) {
        std::string c = num(g.value("gflops", json()));
        c.append(" (").append(str(g, "path")).append(")");
        if (g.contains("efficiency")) c.append(" ").append(percent(g["efficiency"]));
        return c;
      });
  if (!gemm.empty())
    md << "\n## GEMM, GFLOP/s (Device::matmul; library or own kernel; % of the dense peak where "
          "known)\n\n"
       << gemm;

  const std::string ops = pivot(
      devices, "ops", {"model", "op", "direction", "dtype", "shape"},
      [](const json& o) {
        return std::vector<std::string>{str(o, "model"), str(o, "op"), str(o, "direction"),
                                        str(o, "dtype"), str(o, "shape")};
      },
      [](const json& o, const json&) {
        return o.contains("ms") ? fmt("%.3f", o["ms"].get<double>()) : "unsupported";
      });
  if (!ops.empty()) md << "\n## Ops, ms per call (the model's shapes)\n\n" << ops;

  const std::string mem = memory_md(devices);
  if (!mem.empty())
    md << "\n## Memory per technique (device accounting, peak of the training run)\n\n" << mem;
  const std::string peers = peers_md(r.value("peers", json::array()));
  if (!peers.empty()) {
    md << "\n## Peers\n\n"
       << "tokens/s: the median of a run's steps after its warm-up (PyTorch eager: the first "
          "step, torch.compile: the first 8, llm.c: the first 3), of all of them where no step "
          "followed it";
    const json& limit = r.value("settings", json::object()).value("peer_time_limit_s", json());
    if (limit.is_number())
      md << "; each run had " << (limit.get<double>() > 0 ? num(limit) + " s" : "no time limit")
         << " (--peer-time-limit), and one stopped by it is marked capped";
    md << ".\n\n" << peers;
  }
  const std::string superseded = superseded_md(devices, r.value("superseded_peers", json()));
  if (!superseded.empty())
    md << "\n## Superseded\n\n"
       << "Rows of a device (or peer) that a newer report of the same host measured again: the "
          "tables above show the newer, report.json keeps these under `superseded`.\n\n"
       << superseded;
  const std::string failures = failures_md(devices);
  if (!failures.empty()) md << "\n## Failures\n\n" << failures;
  std::string charts;
  for (const char* png : {"tokens_per_s.png", "gemm.png", "memory.png"})
    if (fs::exists(dir / png)) charts += std::string("![") + png + "](" + png + ")\n";
  if (!charts.empty()) md << "\n## Charts\n\n" << charts;
  return md.str();
}

void write_report(const json& report, const fs::path& dir, bool final) {
  fs::create_directories(dir);
  for (const char* png : {"tokens_per_s.png", "gemm.png", "memory.png"}) fs::remove(dir / png);
  std::ofstream(dir / "report.json") << report.dump(2) << "\n";
  if (!final) {
    std::ofstream(dir / "report.md") << report_markdown(report, dir);
    return;
  }
  const std::string skipped = draw_charts(dir);
  std::ofstream(dir / "report.md") << report_markdown(report, dir);
  std::printf("wrote %s and report.md\n", (dir / "report.json").string().c_str());
  if (skipped.empty())
    std::printf("charts: %s/*.png\n", dir.string().c_str());
  else
    std::printf("charts skipped: %s\n", skipped.c_str());
}

}  // namespace ct::cli
