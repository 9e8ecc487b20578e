// Per-op profile of one fp32 GPT-2 training step on the CPU fast device: the op sequence of
// core/model/gpt2_forward.cpp / gpt2_backward.cpp (plus the global grad norm and AdamW over all
// parameters), each op timed on its own (the CPU device runs ops eagerly and synchronously).
// Prints, per op group, the median over steps of its time per step and its share; and the median
// step total. Inputs are random (the numbers do not matter, the shapes do).
//
//   step_profile [--model tiny|gpt2] [--batch B] [--seq T] [--layers L] [--steps N] [--warmup W]
//                [--detail] [--cpu-time] [--unfused-residual] [--separate-loss]
//                [--unfused-gelu]
//
// tiny = 6L/6H/384, V 256, T 256, batch 4; gpt2 = 12L/12H/768, V 50257, T 1024, batch 1 (the
// presets of bench/train_bench.py); --layers overrides the layer count (a quicker run of the same
// per-layer shapes). --detail splits the matmuls by layer role and layout. --unfused-residual
// times the residual adds and the layernorms after them as two ops each (add, layernorm_forward),
// as the model ran them before residual_layernorm_forward.
// The loss and its gradient run as the trainer runs them, in one op
// (crossentropy_forward_backward, timed as "crossentropy fwd+bwd"); --separate-loss times the two
// ops it replaced (crossentropy_forward in the forward, crossentropy_backward in the backward).
// The MLP's GELU runs in its products' epilogues as the model runs it (matmul_bias_gelu, timed as
// "matmul+gelu fwd", and matmul_gelu_backward, "matmul+gelu bwd"); --unfused-gelu times the
// products and gelu_forward / gelu_backward apart.
// --cpu-time measures process CPU time instead of wall time: with OMP_NUM_THREADS=1 it is the
// op's single-core cost, which load from other processes barely changes (with more threads it
// also counts OpenMP/OpenBLAS spin-waiting).
// The machine is shared and noisy: compare two builds by alternating runs, note `uptime`.
// Under load, libgomp's default barrier spinning dominates (OpenBLAS runs on the same OpenMP
// pool): with OMP_WAIT_POLICY=passive both this profile and PyTorch ran ~1.4-3x faster at load
// average 5-6 on the 2-core VM (2026-11-22); set it for both sides when comparing under load.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "core/device.h"
#include "core/model/model.h"

using namespace ct;

namespace {

bool g_cpu_time = false;

// Wall time, or with --cpu-time this process's CPU time (all threads).
double now() {
  timespec t;
  clock_gettime(g_cpu_time ? CLOCK_PROCESS_CPUTIME_ID : CLOCK_MONOTONIC, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

struct Profiler {
  std::map<std::string, double> step;  // seconds per label in the current step
  std::map<std::string, std::vector<double>> all;
  std::vector<double> totals;
  double t0 = 0;
  template <typename F>
  void time(const std::string& label, F&& f) {
    double a = now();
    f();
    step[label] += now() - a;
  }
  void begin() {
    step.clear();
    t0 = now();
  }
  void end(bool keep) {
    double total = now() - t0;
    if (!keep) return;
    totals.push_back(total);
    for (auto& [k, v] : step) all[k].push_back(v);
  }
};

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

int main(int argc, char** argv) {
  std::string model = "tiny";
  int B = -1, T = -1, steps = 10, warmup = 2, layers = -1;
  bool detail = false, unfused_residual = false, separate_loss = false, unfused_gelu = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() { return i + 1 < argc ? std::atoi(argv[++i]) : 0; };
    if (a == "--model" && i + 1 < argc)
      model = argv[++i];
    else if (a == "--batch")
      B = next();
    else if (a == "--seq")
      T = next();
    else if (a == "--layers")
      layers = next();
    else if (a == "--steps")
      steps = std::max(1, next());
    else if (a == "--warmup")
      warmup = std::max(0, next());
    else if (a == "--detail")
      detail = true;
    else if (a == "--cpu-time")
      g_cpu_time = true;
    else if (a == "--unfused-residual")
      unfused_residual = true;
    else if (a == "--separate-loss")
      separate_loss = true;
    else if (a == "--unfused-gelu")
      unfused_gelu = true;
    else {
      std::fprintf(stderr,
                   "usage: step_profile [--model tiny|gpt2] [--batch B] [--seq T] "
                   "[--layers L] [--steps N] [--warmup W] [--detail] [--cpu-time] "
                   "[--unfused-residual] [--separate-loss] [--unfused-gelu]\n");
      return 2;
    }
  }
  int64_t L, C, NH, V, maxT;
  if (model == "gpt2") {
    L = 12, C = 768, NH = 12, V = 50257, maxT = 1024;
    if (B < 0) B = 1;
  } else if (model == "tiny") {
    L = 6, C = 384, NH = 6, V = 256, maxT = 256;
    if (B < 0) B = 4;
  } else {
    std::fprintf(stderr, "unknown model %s\n", model.c_str());
    return 2;
  }
  if (T < 0) T = static_cast<int>(maxT);
  if (layers > 0) L = layers;
  const int64_t BT = int64_t{B} * T;
  // The LM head as the model holds it (core/model/model_base.h): padded to a multiple of 128
  // rows, the logits [BT, Vp] of which the loss takes the first V columns.
  const int64_t Vp = padded_vocab_size(V);

  std::unique_ptr<Device> dev_owner = make_cpu_device(false);
  Device& d = *dev_owner;
  auto cA = MemCategory::kActivations;
  uint64_t seed = 1;
  auto rnd = [&](const Shape& s, float scale, MemCategory c = MemCategory::kActivations) {
    Tensor t = d.empty(s, DType::f32, c);
    // Uniform with standard deviation `scale` from a 32-bit LCG: the values do not matter, and
    // this is much quicker than normal samples for the 124M model's ~0.4G floats.
    std::vector<float> v(static_cast<size_t>(s.numel()));
    uint32_t x = static_cast<uint32_t>(seed++) * 2654435761u + 12345u;
    const float k = scale * 1.7320508f / 2147483648.0f;
    for (size_t i = 0; i < v.size(); ++i) {
      x = x * 1664525u + 1013904223u;
      v[i] = k * static_cast<float>(static_cast<int32_t>(x));
    }
    d.upload(t, v.data(), v.size() * sizeof(float));
    return t;
  };

  // Parameters (one flat buffer per kind is enough for timing), grads, AdamW state.
  struct Layer {
    Tensor ln1w, ln1b, qkvw, qkvb, projw, projb, ln2w, ln2b, fcw, fcb, fcprojw, fcprojb;
  };
  auto cP = MemCategory::kWeights;
  auto cG = MemCategory::kGrads;
  auto make_layer = [&](MemCategory c) {
    Layer l;
    l.ln1w = rnd({C}, 1, c), l.ln1b = rnd({C}, 0.1f, c);
    l.qkvw = rnd({C, 3 * C}, 0.02f, c), l.qkvb = rnd({3 * C}, 0.02f, c);
    l.projw = rnd({C, C}, 0.02f, c), l.projb = rnd({C}, 0.02f, c);
    l.ln2w = rnd({C}, 1, c), l.ln2b = rnd({C}, 0.1f, c);
    l.fcw = rnd({C, 4 * C}, 0.02f, c), l.fcb = rnd({4 * C}, 0.02f, c);
    l.fcprojw = rnd({4 * C, C}, 0.02f, c), l.fcprojb = rnd({C}, 0.02f, c);
    return l;
  };
  std::vector<Layer> p, g;
  for (int64_t l = 0; l < L; ++l) p.push_back(make_layer(cP)), g.push_back(make_layer(cG));
  Tensor wte = rnd({Vp, C}, 0.02f, cP), wpe = rnd({maxT, C}, 0.01f, cP);
  Tensor lnfw = rnd({C}, 1, cP), lnfb = rnd({C}, 0.1f, cP);
  Tensor dwte = rnd({Vp, C}, 0.0f, cG), dwpe = rnd({maxT, C}, 0.0f, cG);
  Tensor dlnfw = rnd({C}, 0, cG), dlnfb = rnd({C}, 0, cG);
  int64_t nparams = V * C + maxT * C + 2 * C + L * (12 * C * C + 13 * C);
  Tensor flat_p = rnd({nparams}, 0.02f, cP), flat_g = rnd({nparams}, 1e-3f, cG);
  Tensor flat_m = rnd({nparams}, 0, MemCategory::kOptimizer);
  Tensor flat_v = rnd({nparams}, 0, MemCategory::kOptimizer);
  for (Tensor* t : {&flat_m, &flat_v}) d.fill(*t, 0.0f);

  // Activations, per layer as in the model.
  struct Acts {
    Tensor ln1, ln1m, ln1r, qkv, atty, att, attproj, res2, ln2, ln2m, ln2r, fch, fchg, fcproj;
  };
  std::vector<Acts> acts;
  for (int64_t l = 0; l < L; ++l) {
    Acts a;
    a.ln1 = d.empty({BT, C}, DType::f32, cA), a.ln1m = d.empty({BT}, DType::f32, cA);
    a.ln1r = d.empty({BT}, DType::f32, cA), a.qkv = d.empty({BT, 3 * C}, DType::f32, cA);
    a.atty = d.empty({BT, C}, DType::f32, cA), a.att = d.empty({B, NH, T, T}, DType::f32, cA);
    a.attproj = d.empty({BT, C}, DType::f32, cA), a.res2 = d.empty({BT, C}, DType::f32, cA);
    a.ln2 = d.empty({BT, C}, DType::f32, cA), a.ln2m = d.empty({BT}, DType::f32, cA);
    a.ln2r = d.empty({BT}, DType::f32, cA), a.fch = d.empty({BT, 4 * C}, DType::f32, cA);
    a.fchg = d.empty({BT, 4 * C}, DType::f32, cA), a.fcproj = d.empty({BT, C}, DType::f32, cA);
    acts.push_back(a);
  }
  std::vector<Tensor> res;
  for (int64_t l = 0; l <= L; ++l) res.push_back(d.empty({BT, C}, DType::f32, cA));
  Tensor lnf = d.empty({BT, C}, DType::f32, cA), lnfm = d.empty({BT}, DType::f32, cA),
         lnfr = d.empty({BT}, DType::f32, cA), logits = d.empty({BT, Vp}, DType::f32, cA),
         losses = d.empty({BT}, DType::f32, cA), loss = d.empty({1}, DType::f32, cA),
         gnorm = d.empty({1}, DType::f32, cA);
  Tensor dres = d.empty({BT, C}, DType::f32, cA), dln = d.empty({BT, C}, DType::f32, cA),
         d4a = d.empty({BT, 4 * C}, DType::f32, cA), d4b = d.empty({BT, 4 * C}, DType::f32, cA);
  Tensor tokens = d.empty({B, T}, DType::i32, cA), targets = d.empty({BT}, DType::i32, cA);
  {
    std::vector<int32_t> tk(static_cast<size_t>(BT));
    for (size_t i = 0; i < tk.size(); ++i) tk[i] = static_cast<int32_t>((i * 7919 + 13) % V);
    d.upload(tokens, tk.data(), tk.size() * 4);
    for (auto& x : tk) x = static_cast<int32_t>((x + 1) % V);
    d.upload(targets, tk.data(), tk.size() * 4);
  }

  Profiler prof;
  auto mm_label = [&](const char* role, const char* layout) {
    return detail ? std::string("matmul ") + role + " " + layout : std::string("matmul");
  };
  auto linear_fwd = [&](const char* role, const Tensor& out, const Tensor& inp, const Tensor& w,
                        const Tensor& b) {
    prof.time(mm_label(role, "fwd+bias"), [&] { d.matmul(out, inp, w, false, false, 1, 0, &b); });
  };
  auto linear_bwd = [&](const char* role, const Tensor& dinp, const Tensor& dw, const Tensor& db,
                        const Tensor& dout, const Tensor& inp, const Tensor& w) {
    prof.time(mm_label(role, "dx NT"), [&] { d.matmul(dinp, dout, w, false, true); });
    prof.time(mm_label(role, "dw TN+="), [&] { d.matmul(dw, inp, dout, true, false, 1, 1); });
    prof.time("bias_backward", [&] { d.bias_backward(db, dout); });
  };

  const float eps = 1e-5f;
  // residual (=) x + r, then the layernorm of residual: one op, or add and layernorm_forward.
  auto residual_ln = [&](const Tensor& residual, const Tensor& out, const Tensor& mean,
                         const Tensor& rstd, const Tensor& x, const Tensor& r, const Tensor& w,
                         const Tensor& b) {
    if (!unfused_residual) {
      prof.time("residual+layernorm fwd",
                [&] { d.residual_layernorm_forward(residual, out, mean, rstd, x, r, w, b, eps); });
      return;
    }
    prof.time("add",
              [&] { d.add(residual.reshape({BT * C}), x.reshape({BT * C}), r.reshape({BT * C})); });
    prof.time("layernorm fwd", [&] { d.layernorm_forward(out, mean, rstd, residual, w, b, eps); });
  };
  for (int s = 0; s < warmup + steps; ++s) {
    prof.begin();
    // ---- forward
    prof.time("embedding fwd", [&] {
      d.embedding_forward(res[0].reshape({B, T, C}), tokens, wte.slice_flat(0, {V, C}), wpe);
    });
    for (int64_t l = 0; l < L; ++l) {
      Layer& w = p[static_cast<size_t>(l)];
      Acts& a = acts[static_cast<size_t>(l)];
      if (l == 0)  // later blocks: done with the previous block's residual add
        prof.time("layernorm fwd",
                  [&] { d.layernorm_forward(a.ln1, a.ln1m, a.ln1r, res[l], w.ln1w, w.ln1b, eps); });
      linear_fwd("qkv", a.qkv, a.ln1, w.qkvw, w.qkvb);
      prof.time("attention fwd", [&] {
        d.attention_forward(a.atty.reshape({B, T, C}), a.att, a.qkv.reshape({B, T, 3 * C}),
                            static_cast<int>(NH));
      });
      linear_fwd("attproj", a.attproj, a.atty, w.projw, w.projb);
      residual_ln(a.res2, a.ln2, a.ln2m, a.ln2r, res[l], a.attproj, w.ln2w, w.ln2b);
      if (unfused_gelu) {
        linear_fwd("fc", a.fch, a.ln2, w.fcw, w.fcb);
        prof.time("gelu fwd", [&] {
          d.gelu_forward(a.fchg.reshape({BT * 4 * C}), a.fch.reshape({BT * 4 * C}));
        });
      } else {
        prof.time("matmul+gelu fwd",
                  [&] { d.matmul_bias_gelu(a.fchg, a.fch, a.ln2, w.fcw, false, false, w.fcb); });
      }
      linear_fwd("fcproj", a.fcproj, a.fchg, w.fcprojw, w.fcprojb);
      // the next block's ln1, or ln_f after the last block
      if (l + 1 < L) {
        Layer& wn = p[static_cast<size_t>(l) + 1];
        Acts& an = acts[static_cast<size_t>(l) + 1];
        residual_ln(res[l + 1], an.ln1, an.ln1m, an.ln1r, a.res2, a.fcproj, wn.ln1w, wn.ln1b);
      } else {
        residual_ln(res[l + 1], lnf, lnfm, lnfr, a.res2, a.fcproj, lnfw, lnfb);
      }
    }
    prof.time(mm_label("lmhead", "fwd NT"), [&] { d.matmul(logits, lnf, wte, false, true); });
    const float dloss = 1.0f / static_cast<float>(BT);
    if (separate_loss)
      prof.time("crossentropy fwd", [&] { d.crossentropy_forward(losses, logits, targets, V); });
    else
      prof.time("crossentropy fwd+bwd",
                [&] { d.crossentropy_forward_backward(losses, logits, targets, V, dloss); });
    prof.time("sum", [&] { d.sum(loss, losses, 1.0f / static_cast<float>(BT)); });
    // ---- backward
    if (separate_loss)
      prof.time("crossentropy bwd",
                [&] { d.crossentropy_backward(logits, logits, targets, V, dloss); });
    prof.time(mm_label("lmhead", "dx NN"), [&] { d.matmul(dln, logits, wte, false, false); });
    prof.time(mm_label("lmhead", "dw TN+="),
              [&] { d.matmul(dwte, logits, lnf, true, false, 1, 1); });
    prof.time("fill", [&] { d.fill(dres, 0.0f); });
    prof.time("layernorm bwd",
              [&] { d.layernorm_backward(dres, dlnfw, dlnfb, dln, res[L], lnfw, lnfm, lnfr); });
    for (int64_t l = L - 1; l >= 0; --l) {
      Layer& w = p[static_cast<size_t>(l)];
      Layer& gw = g[static_cast<size_t>(l)];
      Acts& a = acts[static_cast<size_t>(l)];
      if (unfused_gelu) {
        linear_bwd("fcproj", d4a, gw.fcprojw, gw.fcprojb, dres, a.fchg, w.fcprojw);
        prof.time("gelu bwd", [&] {
          d.gelu_backward(d4b.reshape({BT * 4 * C}), a.fch.reshape({BT * 4 * C}),
                          d4a.reshape({BT * 4 * C}));
        });
      } else {
        prof.time("matmul+gelu bwd",
                  [&] { d.matmul_gelu_backward(d4b, dres, w.fcprojw, false, true, a.fch); });
        prof.time(mm_label("fcproj", "dw TN+="),
                  [&] { d.matmul(gw.fcprojw, a.fchg, dres, true, false, 1, 1); });
        prof.time("bias_backward", [&] { d.bias_backward(gw.fcprojb, dres); });
      }
      linear_bwd("fc", dln, gw.fcw, gw.fcb, d4b, a.ln2, w.fcw);
      prof.time("layernorm bwd", [&] {
        d.layernorm_backward(dres, gw.ln2w, gw.ln2b, dln, a.res2, w.ln2w, a.ln2m, a.ln2r);
      });
      Tensor datty = d4b.slice_flat(0, {BT, C});
      linear_bwd("attproj", datty, gw.projw, gw.projb, dres, a.atty, w.projw);
      Tensor dqkv = d4a.slice_flat(0, {BT, 3 * C});
      prof.time("attention bwd", [&] {
        d.attention_backward(dqkv.reshape({B, T, 3 * C}), datty.reshape({B, T, C}),
                             a.qkv.reshape({B, T, 3 * C}), a.att, static_cast<int>(NH));
      });
      linear_bwd("qkv", dln, gw.qkvw, gw.qkvb, dqkv, a.ln1, w.qkvw);
      prof.time("layernorm bwd", [&] {
        d.layernorm_backward(dres, gw.ln1w, gw.ln1b, dln, res[l], w.ln1w, a.ln1m, a.ln1r);
      });
    }
    prof.time("embedding bwd", [&] {
      d.embedding_backward(dwte.slice_flat(0, {V, C}), dwpe, dres.reshape({B, T, C}), tokens);
    });
    // ---- optimizer: global norm, then one AdamW over all parameters (the trainer runs it per
    // group; the bytes touched are the same)
    prof.time("norm", [&] { d.norm(gnorm, flat_g); });
    AdamWHyper hp;
    hp.lr = 1e-4f, hp.weight_decay = 0.1f, hp.step = s + 1, hp.max_grad_norm = 1.0f;
    prof.time("adamw", [&] { d.adamw(flat_p, flat_g, flat_m, flat_v, gnorm, hp); });
    prof.end(s >= warmup);
  }

  double total = median(prof.totals);
  std::vector<std::pair<double, std::string>> rows;
  for (auto& [k, v] : prof.all) rows.push_back({median(v), k});
  std::sort(rows.rbegin(), rows.rend());
  std::printf("step_profile %s: B=%d T=%d, %d steps (+%d warm-up), %s time, %s\n", model.c_str(), B,
              T, steps, warmup, g_cpu_time ? "CPU" : "wall", d.info().driver.c_str());
  std::printf("%-28s %10s %7s\n", "op", "ms/step", "share");
  double listed = 0;
  for (auto& [t, k] : rows) {
    std::printf("%-28s %10.2f %6.1f%%\n", k.c_str(), 1e3 * t, 100 * t / total);
    listed += t;
  }
  std::vector<double> sorted = prof.totals;
  std::sort(sorted.begin(), sorted.end());
  std::printf("%-28s %10.2f  (min %.2f, max %.2f; sum of op medians %.2f)\n", "step total",
              1e3 * total, 1e3 * sorted.front(), 1e3 * sorted.back(), 1e3 * listed);
  std::printf("tokens/s (median step)       %10.1f\n", static_cast<double>(BT) / total);
  return 0;
}
