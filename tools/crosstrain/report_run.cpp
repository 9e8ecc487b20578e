// `crosstrain bench --report`: on every device, GEMM GFLOP/s on the models' shapes, a per-op
// table (forward, backward), training tokens/s in each precision the device has (a `crosstrain
// train` child process per run, so a crash is that run's), the loss after a fixed number of
// steps against the CPU's fp32 run, memory per technique; `--merge` joins reports.
#include "tools/crosstrain/report_run.h"

#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/data/text_dataset.h"
#include "core/device.h"
#include "core/error.h"
#include "core/model/model.h"
#include "core/model/model_config.h"
#include "core/registry.h"
#include "core/train/train_args.h"
#include "tools/crosstrain/report_format.h"

namespace ct::cli {
namespace {
namespace fs = std::filesystem;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

// The reference every train row's loss is compared with.
constexpr const char* kReferenceDevice = "cpu:0";
constexpr double kTimeBudgetS = 0.25;  // timed calls of one GEMM / op stop past this

// ---- progress on stderr ------------------------------------------------------------------------
// A bar redrawn in place on a terminal; elsewhere one line per section (a log stays short).
class Progress {
 public:
  explicit Progress(int total) : total_(std::max(total, 1)), tty_(isatty(fileno(stderr))) {}
  ~Progress() { finish(); }
  void step(const std::string& section, const std::string& detail) {
    ++done_;
    if (tty_) {
      const int width = 30, filled = width * std::min(done_, total_) / total_;
      std::fprintf(stderr, "\r\033[K[%s%s] %d/%d %s %s", std::string(filled, '#').c_str(),
                   std::string(width - filled, '.').c_str(), done_, total_, section.c_str(),
                   detail.c_str());
      std::fflush(stderr);
    } else if (section != last_) {
      std::fprintf(stderr, "report [%d/%d] %s\n", done_, total_, section.c_str());
    }
    last_ = section;
  }
  void note(const std::string& line) {
    if (tty_) std::fprintf(stderr, "\r\033[K");
    std::fprintf(stderr, "%s\n", line.c_str());
  }
  void finish() {
    if (tty_ && !finished_) std::fprintf(stderr, "\r\033[K");
    finished_ = true;
  }

 private:
  int total_, done_ = 0;
  bool tty_, finished_ = false;
  std::string last_;
};

// Median seconds of `call` (each followed by a synchronize) after one warm-up call; at most
// `iters` timed calls, fewer once they took kTimeBudgetS together.
double median_seconds(Device& dev, int iters, const std::function<void()>& call) {
  call();
  dev.synchronize();
  std::vector<double> t;
  double total = 0;
  for (int i = 0; i < iters; ++i) {
    const auto t0 = Clock::now();
    call();
    dev.synchronize();
    t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    total += t.back();
    if (total > kTimeBudgetS) break;
  }
  return median(std::move(t));
}

std::string precision_dtype(const std::string& p) {
  return p == "fp16" ? "f16" : p == "bf16" ? "bf16" : "f32";
}

// The precisions a device trains in: fp32, tf32 where it has it, fp16 / bf16 where its matmul
// takes them.
std::vector<std::string> precisions(const Device& dev) {
  std::vector<std::string> p = {"fp32"};
  if (dev.info().tf32) p.push_back("tf32");
  if (dev.supports(OpKind::kMatmul, DType::bf16)) p.push_back("bf16");
  if (dev.supports(OpKind::kMatmul, DType::f16)) p.push_back("fp16");
  return p;
}

// The dtypes `kind` is measured in: f32, and the 16-bit ones the device supports for it, of the
// --precisions asked (all when none were).
std::vector<DType> float_dtypes(const Device& dev, OpKind kind,
                                const std::vector<std::string>& asked) {
  auto wanted = [&](DType t) {
    if (asked.empty()) return true;
    for (const std::string& p : asked)
      if (precision_dtype(p) == dtype_name(t)) return true;
    return false;
  };
  std::vector<DType> d;
  for (DType t : {DType::f32, DType::bf16, DType::f16})
    if ((t == DType::f32 || dev.supports(kind, t)) && wanted(t)) d.push_back(t);
  return d;
}

std::string extra(const DeviceInfo& info, const std::string& key) {
  for (const auto& [k, v] : info.extra)
    if (k == key) return v;
  return "";
}

// Which GEMM runs a `dtype` product here, as the device describes it: (path, implementation).
std::pair<std::string, std::string> gemm_path(const DeviceInfo& info, DType dtype) {
  std::string impl = extra(info, "gemm");  // a native GPU runtime: its library or own kernel
  if (impl.empty()) impl = extra(info, dtype == DType::f32 ? "blas" : "bf16 matmul");
  if (impl.empty()) return {"own", extra(info, "matmul variant")};
  const bool own = impl.rfind("none", 0) == 0 || impl.rfind("widened", 0) == 0 ||
                   impl.find("own") != std::string::npos;
  return {own ? "own" : "library", impl};
}

// ---- the plan
// ------------------------------------------------------------------------------------

struct GemmShape {
  std::string model, name, layout;
  int64_t M, N, K;
};

// The models' GEMMs: the forward projections (activations x weight^T, "NT"), and the MLP's
// input-gradient ("NN") and weight-gradient ("TN") products. A test-only device (the SIMT
// runtime) gets every dimension capped at 256.
std::vector<GemmShape> gemm_shapes(const std::string& model, int batch, bool small) {
  const ModelConfig cfg = ModelConfig::preset(model);
  // The LM head at the padded vocabulary, as the models run it (core/model/model_base.h).
  const int64_t BT = static_cast<int64_t>(batch) * cfg.block_size(),
                V = padded_vocab_size(cfg.vocab_size());
  std::vector<GemmShape> s;
  if (cfg.is_llama()) {
    const LlamaConfig& c = cfg.llama();
    const int64_t C = c.n_embd, I = c.intermediate_size, hs = C / c.n_head;
    s = {{model, "qkv", "NT", BT, C + 2 * c.n_kv_head * hs, C},
         {model, "o proj", "NT", BT, C, C},
         {model, "gate+up", "NT", BT, 2 * I, C},
         {model, "down", "NT", BT, C, I},
         {model, "lm head", "NT", BT, V, C},
         {model, "gate+up dx", "NN", BT, C, 2 * I},
         {model, "gate+up dw", "TN", 2 * I, C, BT}};
  } else {
    const int64_t C = cfg.gpt2().n_embd;
    s = {{model, "qkv", "NT", BT, 3 * C, C},  {model, "attn proj", "NT", BT, C, C},
         {model, "fc", "NT", BT, 4 * C, C},   {model, "fc proj", "NT", BT, C, 4 * C},
         {model, "lm head", "NT", BT, V, C},  {model, "fc dx", "NN", BT, C, 4 * C},
         {model, "fc dw", "TN", 4 * C, C, BT}};
  }
  if (small)
    for (GemmShape& g : s)
      g.M = std::min<int64_t>(g.M, 256), g.N = std::min<int64_t>(g.N, 256),
      g.K = std::min<int64_t>(g.K, 256);
  return s;
}

// One op of the per-op table: prepare(dtype) allocates its tensors and returns the timed call.
struct OpCase {
  std::string model, op, direction, shape;
  OpKind kind;
  bool half;  // the 16-bit dtypes apply (else f32 only)
  std::function<std::function<void()>(Device&, DType)> prepare;
};

Tensor filled(Device& d, const Shape& s, DType t, float v) {
  Tensor x = d.empty(s, t, MemCategory::kActivations);
  d.fill(x, v);
  return x;
}

// The main ops of `model` at batch x block (test-only devices: batch 1, 64 positions).
std::vector<OpCase> op_cases(const std::string& model, int batch, bool small) {
  const ModelConfig cfg = ModelConfig::preset(model);
  const int64_t B = small ? 1 : batch,
                T = small ? std::min(64, cfg.block_size()) : cfg.block_size();
  const int64_t V = cfg.vocab_size(), BT = B * T;
  const bool llama = cfg.is_llama();
  const int64_t C = llama ? cfg.llama().n_embd : cfg.gpt2().n_embd;
  const int NH = llama ? cfg.llama().n_head : cfg.gpt2().n_head;
  const int KV = llama ? cfg.llama().n_kv_head : NH;
  const int64_t hs = C / NH, QKV = C + 2 * KV * hs;
  const int64_t P = small ? std::min<int64_t>(cfg.num_parameters(), 1 << 20) : cfg.num_parameters();
  const std::string bt = std::to_string(B) + "x" + std::to_string(T);
  const std::string btc = bt + "x" + std::to_string(C);
  constexpr DType f32 = DType::f32, i32 = DType::i32;
  std::vector<OpCase> ops;
  auto add = [&](const std::string& op, const std::string& dir, const std::string& shape,
                 OpKind kind, bool half, auto prepare) {
    ops.push_back({model, op, dir, shape, kind, half, prepare});
  };
  add("embedding", "forward", btc, OpKind::kEmbedding, true, [=](Device& d, DType t) {
    Tensor out = filled(d, {B, T, C}, f32, 0), tok = filled(d, {B, T}, i32, 1);
    Tensor wte = filled(d, {V, C}, t, 0.01f);
    Tensor wpe = llama ? Tensor() : filled(d, {T, C}, t, 0.01f);
    return std::function<void()>([=, &d] { d.embedding_forward(out, tok, wte, wpe); });
  });
  add("embedding", "backward", btc, OpKind::kEmbedding, false, [=](Device& d, DType) {
    Tensor dwte = filled(d, {V, C}, f32, 0), dout = filled(d, {B, T, C}, f32, 0.01f);
    Tensor tok = filled(d, {B, T}, i32, 1);
    Tensor dwpe = llama ? Tensor() : filled(d, {T, C}, f32, 0);
    return std::function<void()>([=, &d] { d.embedding_backward(dwte, dwpe, dout, tok); });
  });
  if (llama) {
    add("rmsnorm", "forward", btc, OpKind::kRMSNorm, true, [=](Device& d, DType t) {
      Tensor out = filled(d, {BT, C}, t, 0), rstd = filled(d, {BT}, f32, 0);
      Tensor x = filled(d, {BT, C}, f32, 0.5f), w = filled(d, {C}, f32, 1);
      return std::function<void()>([=, &d] { d.rmsnorm_forward(out, rstd, x, w, 1e-5f); });
    });
    // The residual add fused into the norm after it (the models' path between blocks).
    add("residual + rmsnorm (fused)", "forward", btc, OpKind::kRMSNorm, true,
        [=](Device& d, DType t) {
          Tensor res = filled(d, {BT, C}, f32, 0), out = filled(d, {BT, C}, t, 0);
          Tensor rstd = filled(d, {BT}, f32, 0), x = filled(d, {BT, C}, f32, 0.5f);
          Tensor rr = filled(d, {BT, C}, t, 0.25f), w = filled(d, {C}, f32, 1);
          return std::function<void()>(
              [=, &d] { d.residual_rmsnorm_forward(res, out, rstd, x, rr, w, 1e-5f); });
        });
    add("rmsnorm", "backward", btc, OpKind::kRMSNorm, true, [=](Device& d, DType t) {
      Tensor dx = filled(d, {BT, C}, f32, 0), dw = filled(d, {C}, f32, 0);
      Tensor dout = filled(d, {BT, C}, t, 0.01f), x = filled(d, {BT, C}, f32, 0.5f);
      Tensor w = filled(d, {C}, f32, 1), rstd = filled(d, {BT}, f32, 1);
      return std::function<void()>([=, &d] { d.rmsnorm_backward(dx, dw, dout, x, w, rstd); });
    });
    const int64_t I = cfg.llama().intermediate_size;
    const std::string sh = bt + "x" + std::to_string(I);
    add("swiglu", "forward", sh, OpKind::kSwiGLU, true, [=](Device& d, DType t) {
      Tensor out = filled(d, {BT, I}, t, 0), gu = filled(d, {BT, 2 * I}, t, 0.5f);
      return std::function<void()>([=, &d] { d.swiglu_forward(out, gu); });
    });
    add("swiglu", "backward", sh, OpKind::kSwiGLU, true, [=](Device& d, DType t) {
      Tensor dgu = filled(d, {BT, 2 * I}, t, 0), gu = filled(d, {BT, 2 * I}, t, 0.5f);
      Tensor dout = filled(d, {BT, I}, t, 0.01f);
      return std::function<void()>([=, &d] { d.swiglu_backward(dgu, gu, dout); });
    });
    const std::string rs = bt + "x" + std::to_string(QKV);
    add("rope", "forward", rs, OpKind::kRope, true, [=](Device& d, DType t) {
      Tensor x = filled(d, {B, T, QKV}, t, 0.5f), out = filled(d, {B, T, QKV}, t, 0);
      Tensor cs = filled(d, {T, hs / 2}, f32, 1), sn = filled(d, {T, hs / 2}, f32, 0);
      return std::function<void()>([=, &d] { d.rope_forward(out, x, cs, sn, hs, NH + KV); });
    });
    add("rope", "backward", rs, OpKind::kRope, true, [=](Device& d, DType t) {
      Tensor dout = filled(d, {B, T, QKV}, t, 0.5f), dx = filled(d, {B, T, QKV}, t, 0);
      Tensor cs = filled(d, {T, hs / 2}, f32, 1), sn = filled(d, {T, hs / 2}, f32, 0);
      return std::function<void()>([=, &d] { d.rope_backward(dx, dout, cs, sn, hs, NH + KV); });
    });
  } else {
    add("layernorm", "forward", btc, OpKind::kLayerNorm, true, [=](Device& d, DType t) {
      Tensor out = filled(d, {BT, C}, t, 0), mean = filled(d, {BT}, f32, 0);
      Tensor rstd = filled(d, {BT}, f32, 0), x = filled(d, {BT, C}, f32, 0.5f);
      Tensor w = filled(d, {C}, f32, 1), b = filled(d, {C}, f32, 0);
      return std::function<void()>(
          [=, &d] { d.layernorm_forward(out, mean, rstd, x, w, b, 1e-5f); });
    });
    add("residual + layernorm (fused)", "forward", btc, OpKind::kLayerNorm, true,
        [=](Device& d, DType t) {
          Tensor res = filled(d, {BT, C}, f32, 0), out = filled(d, {BT, C}, t, 0);
          Tensor mean = filled(d, {BT}, f32, 0), rstd = filled(d, {BT}, f32, 0);
          Tensor x = filled(d, {BT, C}, f32, 0.5f), rr = filled(d, {BT, C}, t, 0.25f);
          Tensor w = filled(d, {C}, f32, 1), b = filled(d, {C}, f32, 0);
          return std::function<void()>(
              [=, &d] { d.residual_layernorm_forward(res, out, mean, rstd, x, rr, w, b, 1e-5f); });
        });
    add("layernorm", "backward", btc, OpKind::kLayerNorm, true, [=](Device& d, DType t) {
      Tensor dx = filled(d, {BT, C}, f32, 0), dw = filled(d, {C}, f32, 0);
      Tensor db = filled(d, {C}, f32, 0), dout = filled(d, {BT, C}, t, 0.01f);
      Tensor x = filled(d, {BT, C}, f32, 0.5f), w = filled(d, {C}, f32, 1);
      Tensor mean = filled(d, {BT}, f32, 0), rstd = filled(d, {BT}, f32, 1);
      return std::function<void()>(
          [=, &d] { d.layernorm_backward(dx, dw, db, dout, x, w, mean, rstd); });
    });
    const std::string gs = bt + "x" + std::to_string(4 * C);
    add("gelu", "forward", gs, OpKind::kGelu, true, [=](Device& d, DType t) {
      Tensor out = filled(d, {BT * 4 * C}, t, 0), x = filled(d, {BT * 4 * C}, t, 0.5f);
      return std::function<void()>([=, &d] { d.gelu_forward(out, x); });
    });
    add("gelu", "backward", gs, OpKind::kGelu, true, [=](Device& d, DType t) {
      Tensor dx = filled(d, {BT * 4 * C}, t, 0), x = filled(d, {BT * 4 * C}, t, 0.5f);
      Tensor dout = filled(d, {BT * 4 * C}, t, 0.01f);
      return std::function<void()>([=, &d] { d.gelu_backward(dx, x, dout); });
    });
    add("attention (unfused)", "forward", btc, OpKind::kAttention, true, [=](Device& d, DType t) {
      Tensor out = filled(d, {B, T, C}, t, 0), att = filled(d, {B, NH, T, T}, t, 0);
      Tensor qkv = filled(d, {B, T, QKV}, t, 0.1f);
      return std::function<void()>([=, &d] { d.attention_forward(out, att, qkv, NH); });
    });
    add("attention (unfused)", "backward", btc, OpKind::kAttention, true, [=](Device& d, DType t) {
      Tensor dqkv = filled(d, {B, T, QKV}, t, 0), dout = filled(d, {B, T, C}, t, 0.01f);
      Tensor qkv = filled(d, {B, T, QKV}, t, 0.1f), att = filled(d, {B, NH, T, T}, t, 0);
      d.attention_forward(filled(d, {B, T, C}, t, 0), att, qkv, NH);
      return std::function<void()>([=, &d] { d.attention_backward(dqkv, dout, qkv, att, NH); });
    });
  }
  add("attention (fused)", "forward", btc, OpKind::kAttention, true, [=](Device& d, DType t) {
    Tensor out = filled(d, {B, T, C}, t, 0), lse = filled(d, {B, NH, T}, f32, 0);
    Tensor qkv = filled(d, {B, T, QKV}, t, 0.1f);
    return std::function<void()>([=, &d] { d.flash_attention_forward(out, lse, qkv, NH, KV); });
  });
  add("attention (fused)", "backward", btc, OpKind::kAttention, true, [=](Device& d, DType t) {
    Tensor dqkv = filled(d, {B, T, QKV}, t, 0), dout = filled(d, {B, T, C}, t, 0.01f);
    Tensor qkv = filled(d, {B, T, QKV}, t, 0.1f), out = filled(d, {B, T, C}, t, 0);
    Tensor lse = filled(d, {B, NH, T}, f32, 0);
    d.flash_attention_forward(out, lse, qkv, NH, KV);
    return std::function<void()>(
        [=, &d] { d.flash_attention_backward(dqkv, dout, qkv, out, lse, NH, KV); });
  });
  // Rows of the padded vocabulary Vp, of which V are classes (core/model/model_base.h).
  const int64_t Vp = padded_vocab_size(V);
  const std::string cs = std::to_string(BT) + "x" + std::to_string(Vp);
  add("crossentropy", "forward", cs, OpKind::kCrossEntropy, true, [=](Device& d, DType t) {
    Tensor losses = filled(d, {BT}, f32, 0), logits = filled(d, {BT, Vp}, t, 0.1f);
    Tensor tg = filled(d, {BT}, i32, 1);
    return std::function<void()>([=, &d] { d.crossentropy_forward(losses, logits, tg, V); });
  });
  add("crossentropy", "backward", cs, OpKind::kCrossEntropy, true, [=](Device& d, DType t) {
    Tensor dlogits = filled(d, {BT, Vp}, t, 0), logits = filled(d, {BT, Vp}, t, 0.1f);
    Tensor tg = filled(d, {BT}, i32, 1);
    return std::function<void()>(
        [=, &d] { d.crossentropy_backward(dlogits, logits, tg, V, 1.0f / BT); });
  });
  // The training step's: both in one pass, in place (repeated, it runs over its own dlogits).
  add("crossentropy", "forward+backward", cs, OpKind::kCrossEntropy, true, [=](Device& d, DType t) {
    Tensor losses = filled(d, {BT}, f32, 0), logits = filled(d, {BT, Vp}, t, 0.1f);
    Tensor tg = filled(d, {BT}, i32, 1);
    return std::function<void()>(
        [=, &d] { d.crossentropy_forward_backward(losses, logits, tg, V, 1.0f / BT); });
  });
  add("adamw", "update", std::to_string(P) + " parameters", OpKind::kAdamW, false,
      [=](Device& d, DType) {
        Tensor p = filled(d, {P}, f32, 0.1f), g = filled(d, {P}, f32, 0.01f);
        Tensor m = filled(d, {P}, f32, 0), v = filled(d, {P}, f32, 0);
        return std::function<void()>([=, &d] { d.adamw(p, g, m, v, Tensor(), AdamWHyper{}); });
      });
  return ops;
}

// ---- one device
// ----------------------------------------------------------------------------------

struct DeviceRun {
  std::string spec;
  std::unique_ptr<Device> dev;
  json out;  // the report's entry
  std::vector<std::string> precisions;
};

void record_error(json& d, const std::string& section, const std::string& what) {
  d["status"] = "failed";
  const std::string e = section + ": " + what;
  if (!d.contains("error")) d["error"] = e;
  d["errors"].push_back(e);
}

void measure_gemm(DeviceRun& r, const ReportOptions& o, Progress& bar, const std::string& variant) {
  Device& dev = *r.dev;
  const bool small = dev.info().test_only;
  for (const std::string& model : o.models)
    for (DType dt : float_dtypes(dev, OpKind::kMatmul, o.precisions))
      for (const GemmShape& s : gemm_shapes(model, o.batch, small)) {
        const bool ta = s.layout[0] == 'T', tb = s.layout[1] == 'T';
        bar.step(r.spec + " gemm" + (variant.empty() ? "" : " (" + variant + ")"),
                 std::string(dtype_name(dt)) + " " + model + " " + s.name);
        Tensor a = filled(dev, ta ? Shape{s.K, s.M} : Shape{s.M, s.K}, dt, 0.01f);
        Tensor b = filled(dev, tb ? Shape{s.N, s.K} : Shape{s.K, s.N}, dt, 0.02f);
        Tensor c = filled(dev, {s.M, s.N}, DType::f32, 0);
        const double sec = median_seconds(dev, o.iters, [&] { dev.matmul(c, a, b, ta, tb); });
        const double gflops = 2.0 * s.M * s.N * s.K / sec / 1e9;
        const auto [path, impl] = gemm_path(dev.info(), dt);
        json row = {
            {"model", model},  {"shape", s.name}, {"layout", s.layout},      {"M", s.M},
            {"N", s.N},        {"K", s.K},        {"dtype", dtype_name(dt)}, {"gflops", gflops},
            {"ms", sec * 1e3}, {"path", path},    {"implementation", impl}};
        if (!variant.empty()) row["variant"] = variant;
        const std::string prec = dt == DType::f32 ? "fp32" : dt == DType::bf16 ? "bf16" : "fp16";
        if (const double peak = known_peak_tflops(dev.info().name, prec); peak > 0)
          row["efficiency"] = gflops / (peak * 1e3);
        r.out["gemm"].push_back(row);
      }
}

void measure_ops(DeviceRun& r, const ReportOptions& o, Progress& bar) {
  Device& dev = *r.dev;
  for (const std::string& model : o.models)
    for (const OpCase& c : op_cases(model, o.batch, dev.info().test_only))
      for (DType dt :
           c.half ? float_dtypes(dev, c.kind, o.precisions) : std::vector<DType>{DType::f32}) {
        bar.step(r.spec + " ops", std::string(dtype_name(dt)) + " " + c.op + " " + c.direction);
        try {
          const std::function<void()> call = c.prepare(dev, dt);
          const double sec = median_seconds(dev, o.iters, call);
          r.out["ops"].push_back({{"model", c.model},
                                  {"op", c.op},
                                  {"direction", c.direction},
                                  {"dtype", dtype_name(dt)},
                                  {"shape", c.shape},
                                  {"ms", sec * 1e3}});
        } catch (const Error& e) {
          if (e.kind() != ErrorKind::kUnsupported) throw;
          // A backend's own limit (Vulkan's buffer range): said in the report, not a failure.
          r.out["ops"].push_back({{"model", c.model},
                                  {"op", c.op},
                                  {"direction", c.direction},
                                  {"dtype", dtype_name(dt)},
                                  {"shape", c.shape},
                                  {"error", e.what()}});
        }
      }
}

// The number of GEMM and op measurements measure_gemm / measure_ops will make.
int planned_kernels(const Device& dev, const ReportOptions& o) {
  int n = 0;
  for (const std::string& model : o.models) {
    n += static_cast<int>(float_dtypes(dev, OpKind::kMatmul, o.precisions).size() *
                          gemm_shapes(model, o.batch, false).size());
    for (const OpCase& c : op_cases(model, o.batch, dev.info().test_only))
      n += c.half ? static_cast<int>(float_dtypes(dev, c.kind, o.precisions).size()) : 1;
  }
  return n;
}

// ---- training runs
// ---------------------------------------------------------------------------------

std::string file_safe(std::string s) {
  for (char& c : s)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '.') c = '_';
  return s;
}

// One `crosstrain train` run; its row of the train section (error set when it failed) and its
// memory row.
std::pair<json, json> train_run(const ReportOptions& o, const std::string& spec,
                                const std::string& model, const std::string& precision) {
  const fs::path dir = fs::path(o.dir) / "runs" / file_safe(spec + "-" + model + "-" + precision);
  fs::remove_all(dir);
  const std::string log = (fs::path(o.dir) / "runs.log").string();
  std::vector<std::string> argv = {(fs::path(executable_dir()) / "crosstrain").string(),
                                   "train",
                                   "--no-progress",
                                   "--model",
                                   model,
                                   "--backend",
                                   spec,
                                   "--output-dir",
                                   dir.string(),
                                   "--max-steps",
                                   std::to_string(o.steps),
                                   "--logging-steps",
                                   "1",
                                   "--eval-steps",
                                   "0",
                                   "--max-eval-batches",
                                   "1",
                                   "--sample-tokens",
                                   "0",
                                   "--warmup-steps",
                                   "2",
                                   "--per-device-train-batch-size",
                                   std::to_string(o.batch)};
  if (!o.data.empty()) argv.insert(argv.end(), {"--data", o.data});
  if (precision != "fp32") argv.push_back(std::string("--").append(precision));
  {
    std::ofstream(log, std::ios::app)
        << "\n== " << spec << " " << model << " " << precision << " ==\n";
  }
  const ModelConfig cfg = ModelConfig::preset(model);
  json row = {{"model", model},   {"precision", precision},
              {"batch", o.batch}, {"block_size", cfg.block_size()},
              {"steps", o.steps}, {"flops_per_token", model_flops_per_token(model)}};
  const ChildResult child = run_child(argv, log);
  const int status = child.status;
  std::vector<json> recs;
  std::ifstream f(dir / "metrics.jsonl");
  for (std::string line; std::getline(f, line);)
    if (!line.empty()) recs.push_back(json::parse(line));
  std::error_code ec;  // only the numbers are kept: the run's weights go
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::end(it);
       it.increment(ec))
    if (it->path().extension() == ".safetensors") fs::remove(it->path(), ec);
  if (status != 0 || recs.empty()) {
    row["error"] = status != 0 ? "crosstrain train exited with status " + std::to_string(status) +
                                     " (see " + log + ")"
                               : "no metrics in " + (dir / "metrics.jsonl").string();
    return {row, json()};
  }
  std::vector<double> tps;  // the first step includes the warm-up: left out when there are more
  for (size_t i = recs.size() > 1 ? 1 : 0; i < recs.size(); ++i)
    tps.push_back(recs[i]["tokens_per_s"].get<double>());
  row["tokens_per_s"] = median(tps);
  row["loss"] = recs.back()["loss"];
  row["steps"] = recs.back()["step"];
  const json& m = recs.back()["memory"];
  json mem = {{"model", model},
              {"technique", precision == "fp32" ? "fp32" : precision + " mixed precision"},
              {"bytes", m.value("peak", int64_t{0})},
              {"process_rss", child.peak_rss}};
  for (const char* k : {"weights", "grads", "optimizer", "activations", "workspace"})
    mem[k] = m.value(k, int64_t{0});
  return {row, mem};
}

// Each model's runs in every precision, --rounds times, the order of the precisions reversed
// every other round (fp32 bf16, bf16 fp32, ...). A row is its first successful round's, with
// tokens/s the median over the rounds that ran and, past one round, each round's figure
// ("rounds") and the median and range of its ratios to fp32's run of the same round
// ("over_fp32", "over_fp32_range").
void measure_train(DeviceRun& r, const ReportOptions& o, Progress& bar) {
  const int rounds = std::max(1, o.rounds);
  for (const std::string& model : o.models) {
    const size_t np = r.precisions.size();
    std::vector<json> rows(np), mems(np);
    std::vector<std::vector<double>> tps(np, std::vector<double>(rounds, 0.0));
    for (int round = 0; round < rounds; ++round)
      for (size_t n = 0; n < np; ++n) {
        const size_t i = round % 2 ? np - 1 - n : n;
        const std::string& p = r.precisions[i];
        bar.step(r.spec + " train", model + " " + p + " (" + std::to_string(o.steps) + " steps" +
                                        (rounds > 1 ? ", round " + std::to_string(round + 1) +
                                                          " of " + std::to_string(rounds)
                                                    : "") +
                                        ")");
        auto [row, mem] = train_run(o, r.spec, model, p);
        if (row.contains("tokens_per_s")) tps[i][static_cast<size_t>(round)] = row["tokens_per_s"];
        if (rows[i].is_null() || (rows[i].contains("error") && !row.contains("error")))
          rows[i] = row, mems[i] = mem;
      }
    const auto fp32 = std::find(r.precisions.begin(), r.precisions.end(), "fp32");
    for (size_t i = 0; i < np; ++i) {
      json& row = rows[i];
      const std::string& p = r.precisions[i];
      if (row.contains("error") && !row.contains("tokens_per_s")) {
        record_error(r.out, "train " + model + " " + p, row["error"].get<std::string>());
      } else if (rounds > 1) {
        std::vector<double> ran;
        for (double t : tps[i])
          if (t > 0) ran.push_back(t);
        row["tokens_per_s"] = median(ran);
        row["rounds"] = tps[i];
        if (fp32 != r.precisions.end() && p != "fp32") {
          const auto& base = tps[static_cast<size_t>(fp32 - r.precisions.begin())];
          std::vector<double> ratio;
          for (int k = 0; k < rounds; ++k)
            if (tps[i][static_cast<size_t>(k)] > 0 && base[static_cast<size_t>(k)] > 0)
              ratio.push_back(tps[i][static_cast<size_t>(k)] / base[static_cast<size_t>(k)]);
          if (!ratio.empty()) {
            row["over_fp32"] = median(ratio);
            row["over_fp32_range"] = {*std::min_element(ratio.begin(), ratio.end()),
                                      *std::max_element(ratio.begin(), ratio.end())};
          }
        }
      }
      const double peak = known_peak_tflops(r.out["name"].get<std::string>(), p);
      if (row.contains("tokens_per_s")) {
        const double flops =
            row["tokens_per_s"].get<double>() * row["flops_per_token"].get<double>();
        if (peak > 0) row["mfu"] = flops / (peak * 1e12);
        double best = 0;  // the fastest GEMM of the run's dtype on this device
        for (const json& g : r.out["gemm"])
          if (g["dtype"] == precision_dtype(p) && g["model"] == model)
            best = std::max(best, g["gflops"].get<double>());
        if (best > 0 && p != "tf32") row["of_best_gemm"] = flops / (best * 1e9);  // no TF32 GEMM
      }
      r.out["train"].push_back(row);
      if (!mems[i].is_null()) r.out["memory"].push_back(mems[i]);
    }
  }
}

// ---- peers -------------------------------------------------------------------------------------

std::string number(double v) {  // 300, 0.5: as a user would type it
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

// PyTorch (scripts/torch_train.py) on the same models, batch, data and steps: eager with SDPA
// and fused AdamW, and torch.compile; on CUDA where torch sees it, else the CPU.
std::string peer_python() {
  const char* py_env = std::getenv("CROSSTRAIN_PYTHON");
  return py_env && *py_env ? py_env : "python3";
}

// Whether torch sees a GPU (CUDA, or ROCm through the same API): torch_train.py's device.
bool torch_sees_gpu() {
  std::string cmd = "'";
  cmd.append(peer_python())
      .append("' -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' ")
      .append(">/dev/null 2>&1");
  return std::system(cmd.c_str()) == 0;
}

// The precisions a peer runs in: bf16, tf32 and fp32 on a GPU, fp32 on the CPU (of --precisions
// where given); torch.compile only in the first (its compilation takes a minute a run).
std::vector<std::string> peer_precisions(const ReportOptions& o, bool gpu, bool compile) {
  std::vector<std::string> p;
  for (const std::string& x : gpu ? std::vector<std::string>{"bf16", "tf32", "fp32"}
                                  : std::vector<std::string>{"fp32", "bf16"})
    if (o.precisions.empty()
            ? gpu || x == "fp32"
            : std::find(o.precisions.begin(), o.precisions.end(), x) != o.precisions.end())
      p.push_back(x);
  if (compile && p.size() > 1) p.resize(1);
  return p;
}

// PyTorch (scripts/torch_train.py) on the same models, batch, data and steps: eager with SDPA
// and fused AdamW, and torch.compile; on the GPU where torch sees one, else the CPU.
json measure_peers(const ReportOptions& o, bool gpu, Progress& bar) {
  json rows = json::array();
  const std::string script = find_script("torch_train.py");
  const std::string py = peer_python();
  for (const std::string& peer : o.peers) {
    const bool compile = peer == "pytorch-compile";
    for (const std::string& model : o.models)
      for (const std::string& prec : peer_precisions(o, gpu, compile)) {
        // --rounds: the run repeated, tokens/s the median of the rounds (a run capped at its
        // time limit or failed is not repeated: the next would be the same)
        json first;
        std::vector<double> tps;
        for (int round = 0; round < std::max(1, o.rounds); ++round) {
          bar.step("peers", peer + " " + model + " " + prec +
                                (o.rounds > 1 ? " (round " + std::to_string(round + 1) + ")" : ""));
          json row = {{"peer", compile ? "pytorch compile" : "pytorch eager"},
                      {"device", gpu ? "cuda" : "cpu"},
                      {"model", model},
                      {"precision", prec}};
          const fs::path out = fs::path(o.dir) / "runs" /
                               file_safe("peer-" + peer + "-" + model + "-" + prec + ".json");
          std::vector<std::string> argv = {
              "/usr/bin/env",
              py,
              script,
              "--model",
              model,
              "--batch",
              std::to_string(o.batch),
              "--steps",
              std::to_string(compile ? o.steps + 8 : std::max(o.steps, 3)),
              "--sdpa",
              "--fused-adamw",
              "--json",
              out.string(),
              "--device",
              gpu ? "cuda" : "cpu",
              "--threads",
              std::to_string(std::thread::hardware_concurrency())};
          if (prec != "fp32") argv.push_back(std::string("--").append(prec));
          if (!o.data.empty()) argv.insert(argv.end(), {"--data", o.data});
          if (compile) argv.push_back("--compile");
          if (o.peer_time_limit > 0)
            argv.insert(argv.end(), {"--time-limit", number(o.peer_time_limit)});
          if (script.empty()) {
            first = row;
            first["error"] = "scripts/torch_train.py not found";
            break;
          }
          fs::remove(out);  // a file of an earlier report in this folder is not this run's
          // The script stops itself after the step that crosses the limit; killed only where one
          // step outlasts it (or the run hangs).
          const ChildResult child =
              run_child(argv, (fs::path(o.dir) / "runs.log").string(), 2 * o.peer_time_limit);
          if (child.timed_out) {
            row["error"] = "killed after " + number(2 * o.peer_time_limit) +
                           " s, twice its time limit of " + number(o.peer_time_limit) +
                           " s (runs.log)";
          } else if (child.status != 0) {
            row["error"] = "exit status " + std::to_string(child.status) + " (runs.log)";
          } else {
            row = torch_peer_row(row, out.string(), compile);
          }
          if (row.contains("capped"))
            bar.note("report: " + peer + " " + model + " " + prec + " stopped at its time limit (" +
                     number(o.peer_time_limit) + " s) after " + row["steps"].dump() + " of " +
                     row["capped"]["of"].dump() + " steps");
          if (first.is_null()) first = row;
          if (!row.contains("tokens_per_s") || row.contains("capped")) break;
          tps.push_back(row["tokens_per_s"].get<double>());
        }
        if (tps.size() > 1) {
          first["rounds"] = tps;
          first["tokens_per_s"] = median(tps);
        }
        rows.push_back(first);
      }
  }
  return rows;
}

// llm.c's train_gpt2cu: --llmc as given, or the binary in the folder it names.
std::string llmc_binary(const std::string& path) {
  return fs::is_directory(path) ? (fs::path(path) / "train_gpt2cu").string() : path;
}

// llm.c (train_gpt2cu: GPT-2 124M, "d12", bf16, random init) on the same text, batch and
// context, byte-tokenised into its token file (256 int32 header: magic 20240520, version 1, the
// count; then uint16 tokens); tokens/s: the median of its "tok/s" after its first three steps.
// One row, for gpt2: the only model llm.c trains. Its loss is of its own initialisation.
// Killed at --peer-time-limit, with the steps it logged by then kept (capped).
json measure_llmc(const ReportOptions& o, Progress& bar) {
  bar.step("peers", "llm.c gpt2 bf16");
  json row = {{"peer", "llm.c"},
              {"model", "gpt2"},
              {"precision", "bf16"},
              {"device", "cuda"},
              {"version", fs::path(llmc_binary(o.llmc)).filename().string()}};
  const std::string exe = llmc_binary(o.llmc);
  if (access(exe.c_str(), X_OK) != 0) {
    row["error"] = "--llmc " + o.llmc + ": no executable train_gpt2cu there";
    return row;
  }
  const fs::path dir = fs::path(o.dir) / "runs" / "peer-llmc-gpt2-bf16";
  fs::create_directories(dir);
  const fs::path tokens = dir / "tokens.bin";
  {
    const std::string text = load_text(o.data.empty() ? kDefaultDataPath : o.data);
    std::vector<int32_t> header(256, 0);
    header[0] = 20240520, header[1] = 1, header[2] = static_cast<int32_t>(text.size());
    std::vector<uint16_t> t(text.begin(), text.end());
    for (uint16_t& v : t) v &= 0xff;  // the bytes, not their sign-extended chars
    std::ofstream f(tokens, std::ios::binary);
    f.write(reinterpret_cast<const char*>(header.data()), 256 * sizeof(int32_t));
    f.write(reinterpret_cast<const char*>(t.data()), static_cast<std::streamsize>(2 * t.size()));
  }
  const int steps = o.steps + 8;
  const std::string log = (dir / "llmc.log").string();
  // -v / -s 0 divide by zero in llm.c: a period past the run's steps instead.
  fs::remove(log);  // an earlier report's steps in this folder are not this run's
  // llm.c cannot stop itself at a time: it is killed at the limit, and the steps it logged by
  // then are kept (its stdout is a file here, block-buffered: a killed run may have lost some).
  const ChildResult child = run_child({exe,
                                       "-i",
                                       tokens.string(),
                                       "-j",
                                       tokens.string(),
                                       "-e",
                                       "d12",
                                       "-b",
                                       std::to_string(o.batch),
                                       "-t",
                                       "1024",
                                       "-x",
                                       std::to_string(steps),
                                       "-v",
                                       "100000",
                                       "-s",
                                       "100000",
                                       "-n",
                                       "0",
                                       "-o",
                                       (dir / "out").string()},
                                      log, o.peer_time_limit);
  std::vector<double> tps;
  double loss = 0;
  std::ifstream f(log);
  for (std::string line; std::getline(f, line);) {
    // "step    2/16 | loss 8.723157 (+nanz)| norm ... | 51.65 ms | 25.8% bf16 MFU | 317230 tok/s"
    const size_t at = line.rfind(" tok/s");
    if (line.rfind("step ", 0) != 0 || at == std::string::npos) continue;
    const size_t bar_at = line.rfind('|', at);
    tps.push_back(std::atof(line.c_str() + bar_at + 1));
    if (const size_t l = line.find("loss "); l != std::string::npos)
      loss = std::atof(line.c_str() + l + 5);
  }
  fs::remove_all(dir / "out");
  if (child.timed_out && tps.empty()) {
    row["error"] = "killed at its time limit of " + number(o.peer_time_limit) +
                   " s before a step reached " + log;
    return row;
  }
  if ((child.status != 0 && !child.timed_out) || tps.empty()) {
    row["error"] = "exit status " + std::to_string(child.status) + " (" + log + ")";
    return row;
  }
  peer_throughput(row, tps, 3, steps, o.peer_time_limit,
                  child.timed_out && static_cast<int>(tps.size()) < steps);
  row["loss"] = loss;
  return row;
}

// ---- the device list ---------------------------------------------------------------------------

// The specs to measure: --devices as given ("all": every listed device), or the first device of
// each type per backend (cpu:0 but not the reference cpu:1, one of eight equal GPUs), leaving
// out test-only and virtual ones (the SIMT runtime).
std::vector<std::string> device_specs(const std::vector<std::string>& asked) {
  const bool all = asked.size() == 1 && asked[0] == "all";
  if (!asked.empty() && !all) return asked;
  std::vector<std::string> specs;
  for (const BackendEntry& e : backends()) {
    if (!e.backend || !e.error.empty()) continue;
    std::vector<DeviceType> seen;
    for (const DeviceInfo& d : e.backend->devices()) {
      const bool first = std::find(seen.begin(), seen.end(), d.type) == seen.end();
      seen.push_back(d.type);
      if (all || (first && !d.test_only && d.type != DeviceType::kVirtualGpu))
        specs.push_back(d.id());
    }
  }
  return specs;
}

json device_entry(const std::string& spec, const json& origin) {
  return {{"label", spec},          {"id", spec},
          {"status", "ok"},         {"errors", json::array()},
          {"origin", origin},       {"gemm", json::array()},
          {"ops", json::array()},   {"train", json::array()},
          {"memory", json::array()}};
}

}  // namespace

ChildResult run_child(const std::vector<std::string>& argv, const std::string& log,
                      double timeout_s) {
  std::fflush(stdout);
  std::fflush(stderr);
  pid_t pid = fork();
  if (pid < 0) fail(ErrorKind::kIo, "fork failed");
  if (pid == 0) {
    FILE* f = std::freopen(log.c_str(), "a", stdout);
    if (f) dup2(fileno(stdout), fileno(stderr));
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  ChildResult r;
  int status = 0;
  struct rusage ru {};
  if (timeout_s > 0) {
    // Polled: a peer's step lasts milliseconds to minutes, so 50 ms late is nothing.
    const auto start = Clock::now();
    auto elapsed = [&] { return std::chrono::duration<double>(Clock::now() - start).count(); };
    pid_t done = 0;
    while ((done = wait4(pid, &status, WNOHANG, &ru)) == 0 && elapsed() < timeout_s)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    if (done == 0) {
      r.timed_out = true;
      kill(pid, SIGTERM);
      const double term_at = elapsed();
      while ((done = wait4(pid, &status, WNOHANG, &ru)) == 0 && elapsed() < term_at + 5)
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      if (done == 0) kill(pid, SIGKILL);
    }
    if (done == 0) wait4(pid, &status, 0, &ru);
  } else {
    wait4(pid, &status, 0, &ru);
  }
  r.status =
      WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  r.peak_rss = static_cast<long long>(ru.ru_maxrss) * 1024;
  return r;
}

int run_report(const ReportOptions& opts) {
  ReportOptions o = opts;
  if (o.models.empty()) o.models = {"tiny"};
  for (const std::string& m : o.models) ModelConfig::preset(m);  // names the presets otherwise
  if (o.steps < 1 || o.batch < 1 || o.iters < 1)
    fail(ErrorKind::kInvalidArgument, "--steps, --batch and --iters must be at least 1");
  if (!(o.peer_time_limit >= 0))
    fail(ErrorKind::kInvalidArgument, "--peer-time-limit: seconds, at least 0 (0: no limit)");
  for (const std::string& p : o.precisions)
    if (p != "fp32" && p != "tf32" && p != "bf16" && p != "fp16")
      fail(ErrorKind::kInvalidArgument,
           "--precisions: unknown precision '" + p + "' (fp32, tf32, bf16, fp16)");
  for (const std::string& p : o.peers)
    if (p != "pytorch" && p != "pytorch-compile")
      fail(ErrorKind::kInvalidArgument,
           "--peers: unknown peer '" + p + "' (pytorch, pytorch-compile)");
  fs::create_directories(fs::path(o.dir) / "runs");
  json report = report_head();
  report["settings"] = {
      {"models", o.models}, {"steps", o.steps}, {"batch", o.batch}, {"iters", o.iters}};
  if (!o.precisions.empty()) report["settings"]["precisions"] = o.precisions;
  if (!o.peers.empty() || !o.llmc.empty())
    report["settings"]["peer_time_limit_s"] = o.peer_time_limit;
  const json origin = report_origin(report);

  // Open every device first: the plan (and the bar's length) follows from what each supports.
  std::vector<DeviceRun> runs;
  for (const std::string& spec : device_specs(o.devices)) {
    DeviceRun r{spec, nullptr, device_entry(spec, origin), {}};
    try {
      r.dev = open_device(spec);
      const DeviceInfo& info = r.dev->info();
      r.out["id"] = r.out["label"] = r.spec = info.id();
      r.out["backend"] = info.backend;
      r.out["name"] = info.name;
      r.out["kind"] = device_type_name(info.type);
      // A test-only device (the SIMT runtime: kernel sources run on host threads, ~20 tokens/s
      // of tiny here) trains in fp32 only, unless --precisions asks for more.
      for (const std::string& p : precisions(*r.dev))
        if (o.precisions.empty()
                ? !info.test_only || p == "fp32"
                : std::find(o.precisions.begin(), o.precisions.end(), p) != o.precisions.end())
          r.precisions.push_back(p);
      r.out["precisions"] = r.precisions;
      r.out["peak_tflops"] = known_peaks(info.name);
    } catch (const std::exception& e) {
      record_error(r.out, "open", e.what());
    }
    runs.push_back(std::move(r));
  }
  // A device whose GEMM library has an own kernel beside it (CUDA/HIP: the "gemm" entry) is
  // measured a second time with CT_GPU_GEMM=own, the switch the backend reads when opened.
  auto has_own_variant = [](const DeviceRun& r) {
    return r.dev && !extra(r.dev->info(), "gemm").empty() &&
           gemm_path(r.dev->info(), DType::f32).first == "library";
  };
  int total = 0;
  for (const DeviceRun& r : runs) {
    if (!r.dev) continue;
    total += planned_kernels(*r.dev, o) +
             static_cast<int>(o.models.size() * r.precisions.size()) * std::max(1, o.rounds);
    if (has_own_variant(r))
      for (const std::string& model : o.models)
        total += static_cast<int>(float_dtypes(*r.dev, OpKind::kMatmul, o.precisions).size() *
                                  gemm_shapes(model, o.batch, false).size());
  }
  const bool have_reference = std::any_of(runs.begin(), runs.end(), [](const DeviceRun& r) {
    return r.dev && r.spec == kReferenceDevice;
  });
  // The models whose loss a separate CPU run gives (where cpu:0 is not measured anyway).
  auto extra_reference = [&](const std::string& model) {
    return !have_reference &&
           (!o.reference_models || std::find(o.reference_models->begin(), o.reference_models->end(),
                                             model) != o.reference_models->end());
  };
  for (const std::string& model : o.models) total += extra_reference(model);
  const bool peer_gpu = !o.peers.empty() && torch_sees_gpu();
  for (const std::string& peer : o.peers)
    total += static_cast<int>(o.models.size() *
                              peer_precisions(o, peer_gpu, peer == "pytorch-compile").size()) *
             std::max(1, o.rounds);       // fewer where a capped run is not repeated
  const bool run_llmc = !o.llmc.empty();  // gpt2 whatever --models says: llm.c's only model
  total += run_llmc;
  Progress bar(total);

  // The report as measured so far, written after every device: a run cut short (a timeout, a
  // crash) still leaves one.
  auto assemble = [&] {
    json j = report;
    j["devices"] = json::array();
    for (const DeviceRun& r : runs) {
      json d = r.out;
      if (d["errors"].empty()) d.erase("errors");
      j["devices"].push_back(d);
    }
    return j;
  };
  for (DeviceRun& r : runs) {
    if (!r.dev) {
      bar.note("report: " + r.spec + " failed: " + r.out["error"].get<std::string>());
      continue;
    }
    // Each section on its own: one that fails is recorded, and the next still runs.
    try {
      measure_gemm(r, o, bar, "");
    } catch (const std::exception& e) {
      record_error(r.out, "gemm", e.what());
    }
    if (has_own_variant(r)) {
      try {
        setenv("CT_GPU_GEMM", "own", 1);
        DeviceRun own{r.spec, open_device(r.spec), r.out, {}};
        unsetenv("CT_GPU_GEMM");
        own.out["gemm"] = json::array();
        measure_gemm(own, o, bar, "own kernel (CT_GPU_GEMM=own)");
        for (const json& g : own.out["gemm"]) r.out["gemm"].push_back(g);
      } catch (const std::exception& e) {
        unsetenv("CT_GPU_GEMM");
        record_error(r.out, "gemm (own kernel)", e.what());
      }
    }
    try {
      measure_ops(r, o, bar);
    } catch (const std::exception& e) {
      record_error(r.out, "ops", e.what());
    }
    try {
      r.dev->synchronize();
    } catch (const std::exception& e) {
      record_error(r.out, "synchronize", e.what());
    }
    measure_train(r, o, bar);
    if (r.out["status"] == "failed")
      bar.note("report: " + r.spec + " failed: " + r.out["error"].get<std::string>());
    write_report(assemble(), o.dir, /*final=*/false);
  }

  // The CPU's fp32 loss after the same steps: every train row's difference from it.
  report["cpu_reference"] = json::array();
  for (const std::string& model : o.models) {
    json ref;
    for (const DeviceRun& r : runs)
      if (r.spec == kReferenceDevice)
        for (const json& t : r.out["train"])
          if (t["model"] == model && t["precision"] == "fp32" && t.contains("loss")) ref = t;
    if (ref.is_null() && extra_reference(model)) {
      bar.step("cpu reference", model + " fp32");
      ref = train_run(o, kReferenceDevice, model, "fp32").first;
    }
    if (ref.is_null() || !ref.contains("loss")) continue;
    const double ref_loss = ref["loss"].get<double>();
    report["cpu_reference"].push_back({{"model", model},
                                       {"device", kReferenceDevice},
                                       {"steps", ref["steps"]},
                                       {"loss", ref_loss}});
    for (DeviceRun& r : runs)
      for (json& t : r.out["train"])
        if (t["model"] == model && t.contains("loss") && t["steps"] == ref["steps"])
          t["loss_diff_vs_cpu"] = t["loss"].get<double>() - ref_loss;
  }
  report["peers"] = o.peers.empty() ? json::array() : measure_peers(o, peer_gpu, bar);
  if (run_llmc) report["peers"].push_back(measure_llmc(o, bar));
  for (json& p : report["peers"]) p["origin"] = origin;
  bar.finish();

  int failed = 0;
  for (DeviceRun& r : runs) {
    failed += r.out["status"] == "failed";
    r.dev.reset();
  }
  write_report(assemble(), o.dir);
  if (failed)
    std::fprintf(stderr, "report: %d of %zu devices failed (their errors are in the report)\n",
                 failed, runs.size());
  return failed ? 1 : 0;
}

int run_merge(const std::string& out, const std::vector<std::string>& inputs) {
  if (inputs.empty())
    fail(ErrorKind::kInvalidArgument, "--merge OUT FILE...: name at least one report to merge");
  std::vector<std::pair<std::string, json>> reports;
  for (const std::string& f : inputs) reports.emplace_back(f, read_report(f));  // checked first
  const json merged = merge_reports(reports);
  write_report(merged, out);
  return 0;
}

}  // namespace ct::cli
