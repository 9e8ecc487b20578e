// The optimizer ops replayed step by step against tests/data/optim/optim_golden.json, written by
// scripts/optim_reference.py (PyTorch's AdamW and SGD; numpy Lion, Adafactor with Hugging Face
// semantics, and bitsandbytes-style block-wise 8-bit AdamW), on the reference and on every device.
//
// Bounds: fp32 optimizers within PyTorch's assert_close f32 defaults (|d| <= 1e-5 + 1.3e-6 |want|)
// on parameters and state at every step. 8-bit AdamW: parameters within the same bound; each
// quantised state index within 1 of the reference's (a value that lands on a code midpoint may
// round either way with f32 vs f64 arithmetic) and equal for at least 99% of elements; absmax
// within 1e-5 relative.
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "core/optim/quant_map.h"
#include "tests/common/device_harness.h"
#include "tests/common/test_data_dir.h"

namespace ct::test {
namespace {

using nlohmann::json;

const json& golden() {
  static json j = [] {
    std::ifstream f(ct::test::data_dir() + "/optim/optim_golden.json");
    EXPECT_TRUE(f.good()) << "missing tests/data/optim/optim_golden.json";
    return json::parse(f);
  }();
  return j;
}

Vec vec(const json& a) {
  return a.get<Vec>();
}

struct MaxDiff {
  double worst = 0.0;  // max |got - want|
  bool ok = true;
  void check(const Vec& got, const Vec& want, const std::string& what) {
    ASSERT_EQ(got.size(), want.size()) << what;
    for (size_t i = 0; i < got.size(); ++i) {
      double d = std::abs(static_cast<double>(got[i]) - want[i]);
      worst = std::max(worst, d);
      if (!(d <= 1e-5 + 1.3e-6 * std::abs(want[i]))) {
        ADD_FAILURE() << what << "[" << i << "]: got " << got[i] << ", want " << want[i];
        ok = false;
        return;
      }
    }
  }
};

std::vector<uint8_t> download_u8(Device& d, const Tensor& t) {
  std::vector<uint8_t> v(static_cast<size_t>(t.numel()));
  d.download(v.data(), t, v.size());
  return v;
}

// Replays one golden case on device d; returns the largest |difference| seen.
double replay(Device& d, const json& c) {
  const std::string op = c["op"];
  const json& h = c["hyper"];
  Shape shape;
  {
    std::vector<int64_t> s = c["shape"].get<std::vector<int64_t>>();
    shape = s.size() == 1 ? Shape{s[0]} : Shape{s[0], s[1]};
  }
  const int64_t n = shape.numel();
  const std::string tag = op + shape.str() + " on " + d.info().id();
  Tensor p = upload(d, shape, vec(c["param0"])),
         g = d.empty(shape, DType::f32, MemCategory::kGrads);
  Tensor gn = upload(d, {1}, {c["grad_norm"].get<float>()});
  std::map<std::string, Tensor> st;
  auto zeros = [&](const std::string& name, const Shape& s) {
    st[name] = upload(d, s, Vec(static_cast<size_t>(s.numel()), 0.0f));
  };
  Tensor qs, qu, mq, vq;
  if (op == "adamw") zeros("m", shape), zeros("v", shape);
  if (op == "sgd" && h["momentum"].get<float>() != 0.0f) zeros("buf", shape);
  if (op == "lion") zeros("m", shape);
  if (op == "adamw_8bit") {
    qs = upload(d, {256}, Vec(dynamic_map_signed().begin(), dynamic_map_signed().end()));
    qu = upload(d, {256}, Vec(dynamic_map_unsigned().begin(), dynamic_map_unsigned().end()));
    mq = d.empty({n}, DType::u8, MemCategory::kOptimizer);
    vq = d.empty({n}, DType::u8, MemCategory::kOptimizer);
    d.fill(mq, 0.0f);
    d.fill(vq, 0.0f);
    zeros("m_absmax", {quant_blocks(n)});
    zeros("v_absmax", {quant_blocks(n)});
  }
  if (op == "adafactor") {
    if (shape.ndim >= 2)
      zeros("row", {shape[0]}), zeros("col", {shape[1]});
    else
      zeros("v", shape);
    if (h["beta1"].get<float>() > 0.0f) zeros("exp_avg", shape);
  }
  MaxDiff md;
  int64_t step = 0;
  for (const json& s : c["steps"]) {
    ++step;
    Vec gv = vec(c["grads"][step - 1]);
    d.upload(g, gv.data(), gv.size() * sizeof(float));
    if (op == "adamw" || op == "adamw_8bit") {
      AdamWHyper hp;
      hp.lr = h["lr"];
      hp.beta1 = h["beta1"];
      hp.beta2 = h["beta2"];
      hp.eps = h["eps"];
      hp.weight_decay = h["weight_decay"];
      hp.max_grad_norm = h["max_grad_norm"];
      hp.step = step;
      if (op == "adamw")
        d.adamw(p, g, st["m"], st["v"], gn, hp);
      else
        d.adamw_8bit(p, g, mq, vq, st["m_absmax"], st["v_absmax"], qs, qu, gn, hp);
    } else if (op == "sgd") {
      SgdHyper hp;
      hp.lr = h["lr"];
      hp.momentum = h["momentum"];
      hp.dampening = h["dampening"];
      hp.weight_decay = h["weight_decay"];
      hp.nesterov = h["nesterov"];
      hp.max_grad_norm = h["max_grad_norm"];
      hp.step = step;
      d.sgd(p, g, st.count("buf") ? st["buf"] : Tensor{}, gn, hp);
    } else if (op == "lion") {
      LionHyper hp;
      hp.lr = h["lr"];
      hp.beta1 = h["beta1"];
      hp.beta2 = h["beta2"];
      hp.weight_decay = h["weight_decay"];
      hp.max_grad_norm = h["max_grad_norm"];
      d.lion(p, g, st["m"], gn, hp);
    } else {
      AdafactorHyper hp;
      hp.lr = h["lr"];
      hp.eps1 = h["eps1"];
      hp.eps2 = h["eps2"];
      hp.clip_threshold = h["clip_threshold"];
      hp.decay_rate = h["decay_rate"];
      hp.beta1 = h["beta1"];
      hp.weight_decay = h["weight_decay"];
      hp.relative_step = h["relative_step"];
      hp.scale_parameter = h["scale_parameter"];
      hp.warmup_init = h["warmup_init"];
      hp.max_grad_norm = h["max_grad_norm"];
      hp.step = step;
      auto get = [&](const char* k) { return st.count(k) ? st[k] : Tensor{}; };
      d.adafactor(p, g, get("row"), get("col"), get("v"), get("exp_avg"), gn, hp);
    }
    const std::string at = tag + " step " + std::to_string(step);
    md.check(download(d, p), vec(s["param"]), at + " param");
    for (auto& [name, t] : st) {
      if (name.find("absmax") != std::string::npos) {
        Vec got = download(d, t), want = vec(s["state"][name]);
        for (size_t i = 0; i < got.size(); ++i)
          EXPECT_NEAR(got[i], want[i], 1e-5 * std::abs(want[i]) + 1e-12) << at << " " << name;
      } else {
        md.check(download(d, t), vec(s["state"][name]), at + " " + name);
      }
    }
    if (op == "adamw_8bit") {
      for (auto [name, t] : {std::pair{"m_q", &mq}, {"v_q", &vq}}) {
        std::vector<uint8_t> got = download_u8(d, *t);
        std::vector<int> want = s["state"][name].get<std::vector<int>>();
        size_t same = 0;
        for (size_t i = 0; i < got.size(); ++i) {
          EXPECT_LE(std::abs(int(got[i]) - want[i]), 1) << at << " " << name << "[" << i << "]";
          same += int(got[i]) == want[i];
        }
        EXPECT_GE(same, got.size() * 99 / 100) << at << " " << name;
      }
    }
    if (!md.ok) break;
  }
  return md.worst;
}

TEST(OptimizerGoldenMaps, QuantMapsMatchTheReference) {
  Vec s = vec(golden()["qmap_signed"]), u = vec(golden()["qmap_unsigned"]);
  ASSERT_EQ(s.size(), 256u);
  for (size_t i = 0; i < 256; ++i) {
    EXPECT_EQ(dynamic_map_signed()[i], s[i]) << i;
    EXPECT_EQ(dynamic_map_unsigned()[i], u[i]) << i;
  }
  EXPECT_EQ(dynamic_map_unsigned()[0], 0.0f);
  EXPECT_EQ(dynamic_map_unsigned()[255], 1.0f);
  EXPECT_EQ(dynamic_map_signed()[255], 1.0f);
  for (size_t i = 1; i < 256; ++i) EXPECT_LT(dynamic_map_signed()[i - 1], dynamic_map_signed()[i]);
}

OpKind op_kind(const std::string& op) {
  if (op == "adamw") return OpKind::kAdamW;
  if (op == "sgd") return OpKind::kSgd;
  if (op == "lion") return OpKind::kLion;
  if (op == "adafactor") return OpKind::kAdafactor;
  return OpKind::kAdamW8bit;
}

void replay_all(Device& d, const std::function<std::string(OpKind)>& unsupported) {
  std::map<std::string, double> worst;
  std::string skipped;
  for (const json& c : golden()["cases"]) {
    std::string op = c["op"].get<std::string>();
    if (std::string why = unsupported(op_kind(op)); !why.empty()) {
      if (skipped.find(why) == std::string::npos) skipped += "; " + why;
      continue;
    }
    double w = replay(d, c);
    std::string key = op + " " + d.info().id();
    worst[key] = std::max(worst[key], w);
  }
  for (auto& [k, w] : worst) std::printf("  golden max |diff| %-22s %.3g\n", k.c_str(), w);
  if (!skipped.empty()) GTEST_SKIP() << "the supported ops passed" << skipped;
}

TEST(ReferenceOptimizerGolden, EveryCase) {
  replay_all(ref(), [](OpKind) { return std::string(); });
}

using OptimizerGolden = DeviceTest;

TEST_P(OptimizerGolden, EveryCase) {
  replay_all(dev(), [this](OpKind op) { return unsupported(op, DType::f32); });
}

CT_INSTANTIATE_DEVICE_SUITE(OptimizerGolden);

}  // namespace
}  // namespace ct::test
