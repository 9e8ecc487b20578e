// The public ops of ct::Device: each checks its arguments here, once for every backend and with
// one set of messages, then calls the backend's protected kernel (core/device.h, "Argument
// checks", says what a kernel may take as given and which rules were decided here).
#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <string>

#include "core/device.h"
#include "core/error.h"

namespace ct {
namespace {

bool is_h(DType d) {
  return d == DType::f16 || d == DType::bf16;
}

// " (got f32[2, 3], ...)" for an error message.
std::string shapes(std::initializer_list<const Tensor*> ts) {
  std::string s = " (got";
  bool first = true;
  for (const Tensor* t : ts) {
    s += (first ? " " : ", ") + t->describe();
    first = false;
  }
  return s + ")";
}

bool overlaps(const Tensor& a, const Tensor& b) {
  if (a.buffer != b.buffer) return false;
  return a.offset < b.offset + b.nbytes() && b.offset < a.offset + a.nbytes();
}

// The checks of one op on one device, and the op's profiling scope (Device::op_begin/op_end
// around the whole public op, the kernel included).
class Check {
 public:
  Check(Device& dev, const char* op) : dev_(dev), op_(op) { dev_.op_begin(op); }
  ~Check() { dev_.op_end(); }
  Check(const Check&) = delete;
  Check& operator=(const Check&) = delete;

  // Defined, on this device, contiguous and within its buffer.
  void mine(const char* name, const Tensor& t) const {
    CT_REQUIRE(t.defined(), op_ + ": " + name + " is undefined");
    CT_REQUIRE(&t.buffer->device() == &dev_, op_ + ": " + name + " lives on another device (" +
                                                 t.buffer->device().info().id() + ", this is " +
                                                 dev_.info().id() + ")");
    CT_REQUIRE(t.is_contiguous(), op_ + ": " + name + " must be contiguous: " + t.describe());
    CT_REQUIRE(t.offset + t.nbytes() <= t.buffer->size(),
               op_ + ": " + name + " " + t.describe() + " exceeds its buffer of " +
                   std::to_string(t.buffer->size()) + " bytes");
  }
  // An f32-only argument: a 16-bit tensor here is an unsupported op/dtype, anything else wrong.
  void f32(const char* name, const Tensor& t) const {
    mine(name, t);
    if (is_h(t.dtype))
      fail(ErrorKind::kUnsupported, op_ + ": " + name + " must be f32 here, got " + t.describe() +
                                        " (ask supports() first)");
    CT_REQUIRE(t.dtype == DType::f32, op_ + ": " + name + " must be f32, got " + t.describe());
  }
  // An argument the mixed-precision table allows in f32 or 16 bits: 16 bits only where
  // supports(kind, dtype) says yes.
  void flt(const char* name, const Tensor& t, OpKind kind) const {
    mine(name, t);
    if (is_h(t.dtype) && !dev_.supports(kind, t.dtype))
      fail(ErrorKind::kUnsupported, op_ + ": " + name + " is " + dtype_name(t.dtype) + ", which " +
                                        dev_.info().id() +
                                        " does not support for this op (ask supports() first)");
    CT_REQUIRE(t.dtype == DType::f32 || is_h(t.dtype),
               op_ + ": " + name + " must be f32, f16 or bf16, got " + t.describe());
  }
  void is(const char* name, const Tensor& t, DType d) const {
    mine(name, t);
    CT_REQUIRE(t.dtype == d,
               op_ + ": " + name + " must be " + dtype_name(d) + ", got " + t.describe());
  }
  void same_numel(const Tensor& a, const Tensor& b) const {
    CT_REQUIRE(a.numel() == b.numel(), op_ + ": element counts differ" + shapes({&a, &b}));
  }
  void same_dtype(std::initializer_list<const Tensor*> ts) const {
    for (const Tensor* t : ts)
      CT_REQUIRE(t->dtype == (*ts.begin())->dtype,
                 op_ + ": these tensors must share one dtype" + shapes(ts));
  }
  // grad_norm when the optimizer clips (max_grad_norm > 0): f32 [1]. Unread otherwise.
  void clip_norm(const Tensor& grad_norm, float max_grad_norm) const {
    if (!(max_grad_norm > 0.0f)) return;
    f32("grad_norm", grad_norm);
    CT_REQUIRE(grad_norm.numel() == 1, op_ + ": grad_norm must be [1] when clipping");
  }
  void step(int64_t step) const {
    CT_REQUIRE(step >= 1, op_ + ": step must be >= 1 (got " + std::to_string(step) + ")");
  }
  const std::string& op() const { return op_; }

 private:
  Device& dev_;
  std::string op_;
};

// n_kv_head resolved (0: n_head) and checked: positive and dividing n_head.
int kv_heads(const Check& k, int n_head, int n_kv_head) {
  const int nkv = n_kv_head == 0 ? n_head : n_kv_head;
  CT_REQUIRE(n_head > 0 && nkv > 0 && n_head % nkv == 0,
             k.op() + ": n_kv_head " + std::to_string(n_kv_head) + " must divide n_head " +
                 std::to_string(n_head) + " (0 means n_head)");
  return nkv;
}

// out (or dout) [B,T,C] and qkv [B,T,C + 2 n_kv_head hs], hs = C / n_head; stats is att
// [B,NH,T,T] (unfused) or lse [B,NH,T] (fused).
// last_rows (flash_attention_forward): out [B,Tq,C] and lse [B,NH,Tq] with 1 <= Tq <= T.
void attention_dims(const Check& k, const Tensor& out, const Tensor& stats, const Tensor& qkv,
                    int n_head, int n_kv_head, bool fused, bool last_rows = false) {
  std::string desc = shapes({&out, &stats, &qkv}) + " n_head " + std::to_string(n_head) +
                     " n_kv_head " + std::to_string(n_kv_head);
  const char* stats_shape = last_rows ? "lse [B,NH,Tq]" : fused ? "lse [B,NH,T]" : "att [B,NH,T,T]";
  CT_REQUIRE(out.ndim() == 3 && qkv.ndim() == 3 && stats.ndim() == (fused ? 3 : 4),
             k.op() + ": expected out [B," + (last_rows ? "Tq" : "T") + ",C], " + stats_shape +
                 ", qkv [B,T,C+2*NKV*C/NH]" + desc);
  int64_t B = out.shape[0], Tq = out.shape[1], C = out.shape[2], T = qkv.shape[1];
  CT_REQUIRE(C % n_head == 0, k.op() + ": C must be a multiple of n_head" + desc);
  CT_REQUIRE(last_rows ? Tq >= 1 && Tq <= T : Tq == T,
             k.op() + ": out's rows must " +
                 (last_rows ? "be the last 1 to T of qkv's positions" : "be qkv's") + desc);
  const int64_t W = C + 2 * int64_t{n_kv_head} * (C / n_head);
  bool ok = qkv.shape[0] == B && qkv.shape[2] == W && stats.shape[0] == B &&
            stats.shape[1] == n_head && stats.shape[2] == Tq && (fused || stats.shape[3] == T);
  CT_REQUIRE(ok,
             k.op() + ": shape mismatch (qkv's last dim must be " + std::to_string(W) + ")" + desc);
}

// logits [N,V] or [V] (one row), targets [N].
void crossentropy_dims(const Check& k, const Tensor& logits, const Tensor& targets, int64_t valid) {
  CT_REQUIRE(logits.ndim() >= 1, k.op() + ": logits must be [N,V]");
  int64_t V = logits.shape[-1], N = V ? logits.numel() / V : 0;
  CT_REQUIRE(targets.numel() == N,
             k.op() + ": expected logits [N,V], targets [N]" + shapes({&logits, &targets}));
  CT_REQUIRE(valid >= 1 && valid <= V, k.op() + ": valid = " + std::to_string(valid) +
                                           " classes must be in [1, " + std::to_string(V) +
                                           "] (the logits' last dimension)" +
                                           shapes({&logits, &targets}));
}

// Whether x ([..., r, c]) carries c's batch dims (true) or is one matrix broadcast (false).
bool batch_matches(const Check& k, const Tensor& x, const Tensor& c, const std::string& desc) {
  if (x.ndim() == 2) return false;
  bool same = x.ndim() == c.ndim();
  for (int i = 0; same && i < c.ndim() - 2; ++i) same = x.shape[i] == c.shape[i];
  CT_REQUIRE(same, k.op() +
                       ": batch dimensions of an operand must match c's or the operand must "
                       "be 2-D" +
                       desc);
  return true;
}

}  // namespace

// -- memory ---------------------------------------------------------------------------------------

void Device::upload(const Tensor& dst, const void* host, size_t bytes) {
  Check(*this, "upload").mine("tensor", dst);
  CT_REQUIRE(bytes <= dst.nbytes(),
             "upload: " + std::to_string(bytes) + " bytes do not fit " + dst.describe());
  if (bytes) upload_kernel(dst, host, bytes);
}

void Device::download(void* host, const Tensor& src, size_t bytes) {
  Check(*this, "download").mine("tensor", src);
  CT_REQUIRE(bytes <= src.nbytes(),
             "download: " + std::to_string(bytes) + " bytes do not fit " + src.describe());
  if (bytes) download_kernel(host, src, bytes);
}

// -- elementwise ----------------------------------------------------------------------------------

void Device::fill(const Tensor& t, float value) {
  Check k(*this, "fill");
  k.mine("t", t);
  if (!supports(OpKind::kFill, t.dtype))
    fail(ErrorKind::kUnsupported, std::string("fill: t is ") + dtype_name(t.dtype) + ", which " +
                                      info().id() + " does not support for this op");
  fill_kernel(t, value);
}

void Device::copy(const Tensor& dst, const Tensor& src) {
  Check k(*this, "copy");
  k.mine("dst", dst);
  k.mine("src", src);
  CT_REQUIRE(dst.numel() == src.numel(), "copy: dst " + dst.describe() + " and src " +
                                             src.describe() + " differ in element count");
  if (dst.dtype != src.dtype) {
    CT_REQUIRE(dtype_is_float(dst.dtype) && dtype_is_float(src.dtype),
               "copy: converts only between f32, f16 and bf16" + shapes({&dst, &src}));
    for (const Tensor* t : {&dst, &src})
      if (!supports(OpKind::kCopy, t->dtype))
        fail(ErrorKind::kUnsupported, std::string("copy: ") + (t == &dst ? "dst" : "src") + " is " +
                                          dtype_name(t->dtype) + ", which " + info().id() +
                                          " does not support for this op");
    CT_REQUIRE(!overlaps(dst, src),
               "copy: a converting copy must not overlap its source" + shapes({&dst, &src}));
  }
  if (dst.numel() == 0) return;
  if (dst.dtype == src.dtype && dst.buffer == src.buffer && dst.offset == src.offset) return;
  copy_kernel(dst, src);
}

void Device::add(const Tensor& out, const Tensor& a, const Tensor& b) {
  Check k(*this, "add");
  k.f32("out", out);
  k.f32("a", a);
  k.flt("b", b, OpKind::kAdd);
  k.same_numel(out, a);
  k.same_numel(out, b);
  add_kernel(out, a, b);
}

void Device::accumulate(const Tensor& dst, const Tensor& src) {
  Check k(*this, "accumulate");
  k.f32("dst", dst);
  k.f32("src", src);
  k.same_numel(dst, src);
  accumulate_kernel(dst, src);
}

void Device::scale(const Tensor& t, float s) {
  Check(*this, "scale").f32("t", t);
  scale_kernel(t, s);
}

// -- transformer ops ------------------------------------------------------------------------------

void Device::embedding_forward(const Tensor& out, const Tensor& tokens, const Tensor& wte,
                               const Tensor& wpe) {
  Check k(*this, "embedding_forward");
  k.f32("out", out);
  k.is("tokens", tokens, DType::i32);
  k.flt("wte", wte, OpKind::kEmbedding);
  const bool pos = wpe.defined();  // undefined: no position table
  if (pos) {
    k.flt("wpe", wpe, OpKind::kEmbedding);
    k.same_dtype({&wte, &wpe});
  }
  std::string desc = pos ? shapes({&out, &tokens, &wte, &wpe}) : shapes({&out, &tokens, &wte});
  CT_REQUIRE(out.ndim() == 3 && tokens.ndim() == 2 && wte.ndim() == 2 && (!pos || wpe.ndim() == 2),
             k.op() + ": expected out [B,T,C], tokens [B,T], wte [V,C], wpe [maxT,C]" + desc);
  int64_t B = out.shape[0], T = out.shape[1], C = out.shape[2];
  CT_REQUIRE(tokens.shape[0] == B && tokens.shape[1] == T && wte.shape[1] == C &&
                 (!pos || (wpe.shape[1] == C && wpe.shape[0] >= T)),
             k.op() + ": shape mismatch" + desc);
  embedding_forward_kernel(out, tokens, wte, wpe);
}

void Device::embedding_backward(const Tensor& dwte, const Tensor& dwpe, const Tensor& dout,
                                const Tensor& tokens) {
  Check k(*this, "embedding_backward");
  k.f32("dwte", dwte);
  const bool pos = dwpe.defined();  // undefined: no position table
  if (pos) k.f32("dwpe", dwpe);
  k.f32("dout", dout);
  k.is("tokens", tokens, DType::i32);
  std::string desc = pos ? shapes({&dwte, &dwpe, &dout, &tokens}) : shapes({&dwte, &dout, &tokens});
  CT_REQUIRE(
      dout.ndim() == 3 && tokens.ndim() == 2 && dwte.ndim() == 2 && (!pos || dwpe.ndim() == 2),
      k.op() + ": expected dout [B,T,C], tokens [B,T], dwte [V,C], dwpe [maxT,C]" + desc);
  int64_t B = dout.shape[0], T = dout.shape[1], C = dout.shape[2];
  CT_REQUIRE(tokens.shape[0] == B && tokens.shape[1] == T && dwte.shape[1] == C &&
                 (!pos || (dwpe.shape[1] == C && dwpe.shape[0] >= T)),
             k.op() + ": shape mismatch" + desc);
  embedding_backward_kernel(dwte, dwpe, dout, tokens);
}

void Device::layernorm_forward(const Tensor& out, const Tensor& mean, const Tensor& rstd,
                               const Tensor& x, const Tensor& w, const Tensor& b, float eps) {
  Check k(*this, "layernorm_forward");
  for (auto [n, t] : {std::pair{"mean", &mean}, {"rstd", &rstd}, {"x", &x}, {"w", &w}, {"b", &b}})
    k.f32(n, *t);
  k.flt("out", out, OpKind::kLayerNorm);
  CT_REQUIRE(x.ndim() >= 1, k.op() + ": x must have a last dimension");
  int64_t C = x.shape[-1], N = x.numel() / std::max<int64_t>(C, 1);
  CT_REQUIRE(out.shape == x.shape && w.numel() == C && b.numel() == C && mean.numel() == N &&
                 rstd.numel() == N,
             k.op() + ": expected x, out [N,C], w, b [C], mean, rstd [N]" +
                 shapes({&out, &mean, &rstd, &x, &w, &b}));
  layernorm_forward_kernel(out, mean, rstd, x, w, b, eps);
}

void Device::residual_layernorm_forward(const Tensor& residual, const Tensor& out,
                                        const Tensor& mean, const Tensor& rstd, const Tensor& x,
                                        const Tensor& r, const Tensor& w, const Tensor& b,
                                        float eps) {
  Check k(*this, "residual_layernorm_forward");
  for (auto [n, t] : {std::pair{"residual", &residual},
                      {"mean", &mean},
                      {"rstd", &rstd},
                      {"x", &x},
                      {"w", &w},
                      {"b", &b}})
    k.f32(n, *t);
  k.flt("r", r, OpKind::kLayerNorm);
  k.flt("out", out, OpKind::kLayerNorm);
  k.same_dtype({&r, &out});
  CT_REQUIRE(x.ndim() >= 1, k.op() + ": x must have a last dimension");
  int64_t C = x.shape[-1], N = x.numel() / std::max<int64_t>(C, 1);
  CT_REQUIRE(residual.shape == x.shape && r.shape == x.shape && out.shape == x.shape &&
                 w.numel() == C && b.numel() == C && mean.numel() == N && rstd.numel() == N,
             k.op() + ": expected residual, out, x, r [N,C], w, b [C], mean, rstd [N]" +
                 shapes({&residual, &out, &mean, &rstd, &x, &r, &w, &b}));
  for (const Tensor* t : {&out, &mean, &rstd, &x, &r, &w, &b})
    CT_REQUIRE(!overlaps(residual, *t),
               k.op() + ": residual overlaps another argument" + shapes({&residual, t}));
  residual_layernorm_forward_kernel(residual, out, mean, rstd, x, r, w, b, eps);
}

void Device::layernorm_backward(const Tensor& dx, const Tensor& dw, const Tensor& db,
                                const Tensor& dout, const Tensor& x, const Tensor& w,
                                const Tensor& mean, const Tensor& rstd) {
  Check k(*this, "layernorm_backward");
  for (auto [n, t] : {std::pair{"dx", &dx},
                      {"dw", &dw},
                      {"db", &db},
                      {"x", &x},
                      {"w", &w},
                      {"mean", &mean},
                      {"rstd", &rstd}})
    k.f32(n, *t);
  k.flt("dout", dout, OpKind::kLayerNorm);
  CT_REQUIRE(x.ndim() >= 1, k.op() + ": x must have a last dimension");
  int64_t C = x.shape[-1], N = x.numel() / std::max<int64_t>(C, 1);
  CT_REQUIRE(dx.shape == x.shape && dout.shape == x.shape && w.numel() == C && dw.numel() == C &&
                 db.numel() == C && mean.numel() == N && rstd.numel() == N,
             k.op() + ": expected dx, dout, x [N,C], dw, db, w [C], mean, rstd [N]" +
                 shapes({&dx, &dw, &db, &dout, &x, &w, &mean, &rstd}));
  layernorm_backward_kernel(dx, dw, db, dout, x, w, mean, rstd);
}

void Device::rmsnorm_forward(const Tensor& out, const Tensor& rstd, const Tensor& x,
                             const Tensor& w, float eps) {
  Check k(*this, "rmsnorm_forward");
  for (auto [n, t] : {std::pair{"rstd", &rstd}, {"x", &x}, {"w", &w}}) k.f32(n, *t);
  k.flt("out", out, OpKind::kRMSNorm);
  CT_REQUIRE(x.ndim() >= 1, k.op() + ": x must have a last dimension");
  CT_REQUIRE(eps >= 0.0f, k.op() + ": eps must be >= 0, got " + std::to_string(eps));
  int64_t C = x.shape[-1], N = x.numel() / std::max<int64_t>(C, 1);
  CT_REQUIRE(out.shape == x.shape && w.numel() == C && rstd.numel() == N,
             k.op() + ": expected x, out [N,C], w [C], rstd [N]" + shapes({&out, &rstd, &x, &w}));
  rmsnorm_forward_kernel(out, rstd, x, w, eps);
}

void Device::residual_rmsnorm_forward(const Tensor& residual, const Tensor& out, const Tensor& rstd,
                                      const Tensor& x, const Tensor& r, const Tensor& w,
                                      float eps) {
  Check k(*this, "residual_rmsnorm_forward");
  for (auto [n, t] : {std::pair{"residual", &residual}, {"rstd", &rstd}, {"x", &x}, {"w", &w}})
    k.f32(n, *t);
  k.flt("r", r, OpKind::kRMSNorm);
  k.flt("out", out, OpKind::kRMSNorm);
  k.same_dtype({&r, &out});
  CT_REQUIRE(x.ndim() >= 1, k.op() + ": x must have a last dimension");
  CT_REQUIRE(eps >= 0.0f, k.op() + ": eps must be >= 0, got " + std::to_string(eps));
  int64_t C = x.shape[-1], N = x.numel() / std::max<int64_t>(C, 1);
  CT_REQUIRE(residual.shape == x.shape && r.shape == x.shape && out.shape == x.shape &&
                 w.numel() == C && rstd.numel() == N,
             k.op() + ": expected residual, out, x, r [N,C], w [C], rstd [N]" +
                 shapes({&residual, &out, &rstd, &x, &r, &w}));
  for (const Tensor* t : {&out, &rstd, &x, &r, &w})
    CT_REQUIRE(!overlaps(residual, *t),
               k.op() + ": residual overlaps another argument" + shapes({&residual, t}));
  residual_rmsnorm_forward_kernel(residual, out, rstd, x, r, w, eps);
}

void Device::rmsnorm_backward(const Tensor& dx, const Tensor& dw, const Tensor& dout,
                              const Tensor& x, const Tensor& w, const Tensor& rstd) {
  Check k(*this, "rmsnorm_backward");
  for (auto [n, t] : {std::pair{"dx", &dx}, {"dw", &dw}, {"x", &x}, {"w", &w}, {"rstd", &rstd}})
    k.f32(n, *t);
  k.flt("dout", dout, OpKind::kRMSNorm);
  CT_REQUIRE(x.ndim() >= 1, k.op() + ": x must have a last dimension");
  int64_t C = x.shape[-1], N = x.numel() / std::max<int64_t>(C, 1);
  CT_REQUIRE(dx.shape == x.shape && dout.shape == x.shape && w.numel() == C && dw.numel() == C &&
                 rstd.numel() == N,
             k.op() + ": expected dx, dout, x [N,C], dw, w [C], rstd [N]" +
                 shapes({&dx, &dw, &dout, &x, &w, &rstd}));
  rmsnorm_backward_kernel(dx, dw, dout, x, w, rstd);
}

namespace {

// matmul()'s operands checked and its dimensions resolved (the fused products share them).
MatmulDims matmul_dims(const Check& k, const Tensor& c, const Tensor& a, const Tensor& b,
                       bool trans_a, bool trans_b) {
  k.flt("a", a, OpKind::kMatmul);
  k.flt("b", b, OpKind::kMatmul);
  std::string desc =
      shapes({&c, &a, &b}) + (trans_a ? " trans_a" : "") + (trans_b ? " trans_b" : "");
  CT_REQUIRE(c.ndim() >= 2 && a.ndim() >= 2 && b.ndim() >= 2,
             k.op() + ": operands must be at least 2-D" + desc);
  MatmulDims d;
  d.M = c.shape[-2];
  d.N = c.shape[-1];
  d.batch = c.numel() / std::max<int64_t>(d.M * d.N, 1);
  int64_t am = trans_a ? a.shape[-1] : a.shape[-2], ak = trans_a ? a.shape[-2] : a.shape[-1];
  int64_t bk = trans_b ? b.shape[-1] : b.shape[-2], bn = trans_b ? b.shape[-2] : b.shape[-1];
  d.K = ak;
  CT_REQUIRE(am == d.M && bn == d.N && ak == bk,
             k.op() + ": inner or outer dimensions do not match" + desc);
  CT_REQUIRE(a.dtype == b.dtype && (c.dtype == DType::f32 || c.dtype == a.dtype),
             k.op() + ": a and b must share a dtype, and c be f32 or that dtype" + desc);
  CT_REQUIRE(!overlaps(c, a) && !overlaps(c, b), k.op() + ": c must not overlap a or b" + desc);
  d.a_batched = batch_matches(k, a, c, desc);
  d.b_batched = batch_matches(k, b, c, desc);
  return d;
}

// A fused product's second output (or saved input) t beside its output c: c's shape and dtype,
// overlapping neither c nor a, b.
void epilogue_tensor(const Check& k, const char* name, const Tensor& t, const char* c_name,
                     const Tensor& c, const Tensor& a, const Tensor& b) {
  k.flt(name, t, OpKind::kMatmul);
  CT_REQUIRE(
      t.shape == c.shape && t.dtype == c.dtype,
      k.op() + ": " + name + " must have " + c_name + "'s shape and dtype" + shapes({&t, &c}));
  CT_REQUIRE(
      !overlaps(t, c) && !overlaps(t, a) && !overlaps(t, b),
      k.op() + ": " + name + " must not overlap " + c_name + ", a or b" + shapes({&t, &c, &a, &b}));
}

}  // namespace

void Device::matmul(const Tensor& c, const Tensor& a, const Tensor& b, bool trans_a, bool trans_b,
                    float alpha, float beta, const Tensor* bias) {
  Check k(*this, "matmul");
  k.flt("c", c, OpKind::kMatmul);
  const MatmulDims d = matmul_dims(k, c, a, b, trans_a, trans_b);
  if (bias) {
    k.f32("bias", *bias);
    CT_REQUIRE(bias->numel() == d.N,
               k.op() + ": bias must be [N]" + shapes({&c, bias}) + " bias " + bias->describe());
  }
  matmul_kernel(c, a, b, d, trans_a, trans_b, alpha, beta, bias);
}

void Device::matmul_bias_gelu(const Tensor& out, const Tensor& pre, const Tensor& a,
                              const Tensor& b, bool trans_a, bool trans_b, const Tensor& bias) {
  Check k(*this, "matmul_bias_gelu");
  k.flt("pre", pre, OpKind::kMatmul);
  const MatmulDims d = matmul_dims(k, pre, a, b, trans_a, trans_b);
  epilogue_tensor(k, "out", out, "pre", pre, a, b);
  k.f32("bias", bias);
  CT_REQUIRE(bias.numel() == d.N, k.op() + ": bias must be [N]" + shapes({&pre, &bias}));
  matmul_bias_gelu_kernel(out, pre, a, b, d, trans_a, trans_b, bias);
}

void Device::matmul_gelu_backward(const Tensor& dpre, const Tensor& a, const Tensor& b,
                                  bool trans_a, bool trans_b, const Tensor& pre) {
  Check k(*this, "matmul_gelu_backward");
  k.flt("dpre", dpre, OpKind::kMatmul);
  const MatmulDims d = matmul_dims(k, dpre, a, b, trans_a, trans_b);
  epilogue_tensor(k, "pre", pre, "dpre", dpre, a, b);
  matmul_gelu_backward_kernel(dpre, a, b, d, trans_a, trans_b, pre);
}

void Device::matmul_bias_gelu_kernel(const Tensor& out, const Tensor& pre, const Tensor& a,
                                     const Tensor& b, const MatmulDims& d, bool trans_a,
                                     bool trans_b, const Tensor& bias) {
  matmul_kernel(pre, a, b, d, trans_a, trans_b, 1.0f, 0.0f, &bias);
  gelu_forward_kernel(out, pre);
}

void Device::matmul_gelu_backward_kernel(const Tensor& dpre, const Tensor& a, const Tensor& b,
                                         const MatmulDims& d, bool trans_a, bool trans_b,
                                         const Tensor& pre) {
  matmul_kernel(dpre, a, b, d, trans_a, trans_b, 1.0f, 0.0f, nullptr);
  gelu_backward_kernel(dpre, pre, dpre);
}

void Device::bias_backward(const Tensor& dbias, const Tensor& dout) {
  Check k(*this, "bias_backward");
  k.f32("dbias", dbias);
  k.flt("dout", dout, OpKind::kBiasGrad);
  CT_REQUIRE(dout.ndim() >= 1 && dbias.numel() == dout.shape[-1],
             "bias_backward: expected dout [M,N], dbias [N]" + shapes({&dbias, &dout}));
  bias_backward_kernel(dbias, dout);
}

void Device::attention_forward(const Tensor& out, const Tensor& att, const Tensor& qkv, int n_head,
                               int n_kv_head) {
  Check k(*this, "attention_forward");
  k.flt("out", out, OpKind::kAttention);
  k.flt("att", att, OpKind::kAttention);
  k.flt("qkv", qkv, OpKind::kAttention);
  k.same_dtype({&out, &att, &qkv});
  const int nkv = kv_heads(k, n_head, n_kv_head);
  attention_dims(k, out, att, qkv, n_head, nkv, false);
  attention_forward_kernel(out, att, qkv, n_head, nkv);
}

void Device::attention_backward(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv,
                                const Tensor& att, int n_head, int n_kv_head) {
  Check k(*this, "attention_backward");
  k.flt("dqkv", dqkv, OpKind::kAttention);
  k.flt("dout", dout, OpKind::kAttention);
  k.flt("qkv", qkv, OpKind::kAttention);
  k.flt("att", att, OpKind::kAttention);
  k.same_dtype({&dqkv, &dout, &qkv, &att});
  CT_REQUIRE(dqkv.shape == qkv.shape,
             k.op() + ": dqkv must have the shape of qkv" + shapes({&dqkv, &qkv}));
  const int nkv = kv_heads(k, n_head, n_kv_head);
  attention_dims(k, dout, att, qkv, n_head, nkv, false);
  attention_backward_kernel(dqkv, dout, qkv, att, n_head, nkv);
}

void Device::flash_attention_forward(const Tensor& out, const Tensor& lse, const Tensor& qkv,
                                     int n_head, int n_kv_head) {
  Check k(*this, "flash_attention_forward");
  k.flt("out", out, OpKind::kAttention);
  k.f32("lse", lse);
  k.flt("qkv", qkv, OpKind::kAttention);
  k.same_dtype({&out, &qkv});
  const int nkv = kv_heads(k, n_head, n_kv_head);
  attention_dims(k, out, lse, qkv, n_head, nkv, true, /*last_rows=*/true);
  flash_attention_forward_kernel(out, lse, qkv, n_head, nkv);
}

void Device::flash_attention_backward(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv,
                                      const Tensor& out, const Tensor& lse, int n_head,
                                      int n_kv_head) {
  Check k(*this, "flash_attention_backward");
  k.flt("dqkv", dqkv, OpKind::kAttention);
  k.flt("dout", dout, OpKind::kAttention);
  k.flt("qkv", qkv, OpKind::kAttention);
  k.flt("out", out, OpKind::kAttention);
  k.f32("lse", lse);
  k.same_dtype({&dqkv, &dout, &qkv, &out});
  CT_REQUIRE(dqkv.shape == qkv.shape,
             k.op() + ": dqkv must have the shape of qkv" + shapes({&dqkv, &qkv}));
  CT_REQUIRE(dout.shape == out.shape,
             k.op() + ": dout must have the shape of out" + shapes({&dout, &out}));
  const int nkv = kv_heads(k, n_head, n_kv_head);
  attention_dims(k, dout, lse, qkv, n_head, nkv, true);
  flash_attention_backward_kernel(dqkv, dout, qkv, out, lse, n_head, nkv);
}

void Device::gelu_forward(const Tensor& out, const Tensor& x) {
  Check k(*this, "gelu_forward");
  k.flt("out", out, OpKind::kGelu);
  k.flt("x", x, OpKind::kGelu);
  k.same_dtype({&out, &x});
  k.same_numel(out, x);
  gelu_forward_kernel(out, x);
}

void Device::gelu_backward(const Tensor& dx, const Tensor& x, const Tensor& dout) {
  Check k(*this, "gelu_backward");
  k.flt("dx", dx, OpKind::kGelu);
  k.flt("x", x, OpKind::kGelu);
  k.flt("dout", dout, OpKind::kGelu);
  k.same_dtype({&dx, &x, &dout});
  k.same_numel(dx, x);
  k.same_numel(dx, dout);
  gelu_backward_kernel(dx, x, dout);
}

void Device::swiglu_forward(const Tensor& out, const Tensor& gu) {
  Check k(*this, "swiglu_forward");
  k.flt("out", out, OpKind::kSwiGLU);
  k.flt("gu", gu, OpKind::kSwiGLU);
  k.same_dtype({&out, &gu});
  CT_REQUIRE(out.ndim() >= 1 && gu.ndim() == out.ndim(),
             k.op() + ": expected out [...,F], gu [...,2F]" + shapes({&out, &gu}));
  bool ok = gu.shape[-1] == 2 * out.shape[-1];
  for (int d = 0; d + 1 < out.ndim(); ++d) ok = ok && gu.shape[d] == out.shape[d];
  CT_REQUIRE(ok, k.op() + ": expected out [...,F], gu [...,2F]" + shapes({&out, &gu}));
  CT_REQUIRE(!overlaps(out, gu), k.op() + ": out must not overlap gu" + shapes({&out, &gu}));
  swiglu_forward_kernel(out, gu);
}

void Device::swiglu_backward(const Tensor& dgu, const Tensor& gu, const Tensor& dout) {
  Check k(*this, "swiglu_backward");
  k.flt("dgu", dgu, OpKind::kSwiGLU);
  k.flt("gu", gu, OpKind::kSwiGLU);
  k.flt("dout", dout, OpKind::kSwiGLU);
  k.same_dtype({&dgu, &gu, &dout});
  CT_REQUIRE(dout.ndim() >= 1 && gu.ndim() == dout.ndim() && dgu.shape == gu.shape,
             k.op() + ": expected dgu, gu [...,2F], dout [...,F]" + shapes({&dgu, &gu, &dout}));
  bool ok = gu.shape[-1] == 2 * dout.shape[-1];
  for (int d = 0; d + 1 < dout.ndim(); ++d) ok = ok && gu.shape[d] == dout.shape[d];
  CT_REQUIRE(ok, k.op() + ": expected dgu, gu [...,2F], dout [...,F]" + shapes({&dgu, &gu, &dout}));
  CT_REQUIRE(dgu.offset == gu.offset || !overlaps(dgu, gu),
             k.op() + ": dgu must be gu itself or not overlap it" + shapes({&dgu, &gu}));
  CT_REQUIRE(!overlaps(dgu, dout), k.op() + ": dgu must not overlap dout" + shapes({&dgu, &dout}));
  swiglu_backward_kernel(dgu, gu, dout);
}

namespace {
void check_rope(Check& k, const Tensor& out, const Tensor& x, const Tensor& cos, const Tensor& sin,
                int64_t head_dim, int64_t rot_heads, const char* xname) {
  k.flt("out", out, OpKind::kRope);
  k.flt(xname, x, OpKind::kRope);
  k.same_dtype({&out, &x});
  k.f32("cos", cos);
  k.f32("sin", sin);
  const std::string desc = shapes({&out, &x, &cos, &sin});
  CT_REQUIRE(x.ndim() == 3 && out.shape == x.shape,
             k.op() + ": expected " + xname + " and out [B,T,W]" + desc);
  CT_REQUIRE(head_dim >= 2 && head_dim % 2 == 0 && x.shape[2] % head_dim == 0,
             k.op() + ": head_dim " + std::to_string(head_dim) +
                 " must be even and divide the width " + std::to_string(x.shape[2]));
  CT_REQUIRE(rot_heads >= 0 && rot_heads <= x.shape[2] / head_dim,
             k.op() + ": rot_heads " + std::to_string(rot_heads) + " outside [0, " +
                 std::to_string(x.shape[2] / head_dim) + "]");
  CT_REQUIRE(cos.ndim() == 2 && cos.shape == sin.shape && cos.shape[0] == x.shape[1] &&
                 cos.shape[1] == head_dim / 2,
             k.op() + ": expected cos, sin [T, head_dim/2]" + desc);
  CT_REQUIRE(out.offset == x.offset || !overlaps(out, x),
             k.op() + ": out must be " + xname + " itself or not overlap it" + desc);
}
}  // namespace

void Device::rope_forward(const Tensor& out, const Tensor& x, const Tensor& cos, const Tensor& sin,
                          int64_t head_dim, int64_t rot_heads) {
  Check k(*this, "rope_forward");
  check_rope(k, out, x, cos, sin, head_dim, rot_heads, "x");
  rope_kernel(out, x, cos, sin, head_dim, rot_heads, false);
}

void Device::rope_backward(const Tensor& dx, const Tensor& dout, const Tensor& cos,
                           const Tensor& sin, int64_t head_dim, int64_t rot_heads) {
  Check k(*this, "rope_backward");
  check_rope(k, dx, dout, cos, sin, head_dim, rot_heads, "dout");
  rope_kernel(dx, dout, cos, sin, head_dim, rot_heads, true);
}

void Device::dropout(const Tensor& out, const Tensor& x, float p, uint64_t seed, uint64_t stream) {
  Check k(*this, "dropout");
  k.flt("out", out, OpKind::kDropout);
  k.flt("x", x, OpKind::kDropout);
  k.same_dtype({&out, &x});
  k.same_numel(out, x);
  CT_REQUIRE(std::isfinite(p) && p >= 0.0f && p < 1.0f,
             k.op() + ": p = " + std::to_string(p) + " must be in [0, 1)");
  CT_REQUIRE(out.offset == x.offset || !overlaps(out, x),
             k.op() + ": out may be x exactly but not overlap it partially" + shapes({&out, &x}));
  DropoutMask mask;
  mask.seed = seed;
  mask.stream = stream;
  mask.threshold = static_cast<uint32_t>(std::llround(static_cast<double>(p) * 16777216.0));
  mask.scale = static_cast<float>(1.0 / (1.0 - static_cast<double>(p)));
  if (mask.threshold >= 16777216u) mask.threshold = 16777215u;  // p within 2^-25 of 1
  dropout_kernel(out, x, mask);
}

void Device::crossentropy_forward(const Tensor& losses, const Tensor& logits, const Tensor& targets,
                                  int64_t valid) {
  Check k(*this, "crossentropy_forward");
  k.f32("losses", losses);
  k.flt("logits", logits, OpKind::kCrossEntropy);
  k.is("targets", targets, DType::i32);
  crossentropy_dims(k, logits, targets, valid);
  CT_REQUIRE(losses.numel() == targets.numel(),
             k.op() + ": losses must be [N]" + shapes({&losses, &logits, &targets}));
  crossentropy_forward_kernel(losses, logits, targets, valid);
}

void Device::crossentropy_backward(const Tensor& dlogits, const Tensor& logits,
                                   const Tensor& targets, int64_t valid, float dloss) {
  Check k(*this, "crossentropy_backward");
  k.flt("dlogits", dlogits, OpKind::kCrossEntropy);
  k.flt("logits", logits, OpKind::kCrossEntropy);
  k.is("targets", targets, DType::i32);
  k.same_dtype({&dlogits, &logits});
  crossentropy_dims(k, logits, targets, valid);
  CT_REQUIRE(dlogits.shape == logits.shape,
             k.op() + ": dlogits must match logits" + shapes({&dlogits, &logits}));
  CT_REQUIRE(dlogits.offset == logits.offset || !overlaps(dlogits, logits),
             k.op() + ": dlogits may alias logits exactly but not partially" +
                 shapes({&dlogits, &logits}));
  crossentropy_backward_kernel(dlogits, logits, targets, valid, dloss);
}

void Device::crossentropy_forward_backward(const Tensor& losses, const Tensor& logits,
                                           const Tensor& targets, int64_t valid, float dloss) {
  Check k(*this, "crossentropy_forward_backward");
  k.f32("losses", losses);
  k.flt("logits", logits, OpKind::kCrossEntropy);
  k.is("targets", targets, DType::i32);
  crossentropy_dims(k, logits, targets, valid);
  CT_REQUIRE(losses.numel() == targets.numel(),
             k.op() + ": losses must be [N]" + shapes({&losses, &logits, &targets}));
  CT_REQUIRE(!overlaps(losses, logits),
             k.op() + ": losses must not overlap logits" + shapes({&losses, &logits}));
  crossentropy_forward_backward_kernel(losses, logits, targets, valid, dloss);
}

// -- reductions and optimizer ---------------------------------------------------------------------

void Device::sum(const Tensor& out, const Tensor& x, float scale) {
  Check k(*this, "sum");
  k.f32("out", out);
  k.f32("x", x);
  CT_REQUIRE(out.numel() == 1, "sum: out must be [1]" + shapes({&out, &x}));
  sum_kernel(out, x, scale);
}

void Device::norm(const Tensor& out, const Tensor& x) {
  Check k(*this, "norm");
  k.f32("out", out);
  k.f32("x", x);
  CT_REQUIRE(out.numel() == 1, "norm: out must be [1]" + shapes({&out, &x}));
  norm_kernel(out, x);
}

void Device::check_finite(const Tensor& flag, const Tensor& x) {
  Check k(*this, "check_finite");
  k.is("flag", flag, DType::i32);
  k.f32("x", x);
  CT_REQUIRE(flag.numel() == 1, "check_finite: flag must be [1] i32" + shapes({&flag, &x}));
  check_finite_kernel(flag, x);
}

void Device::unscale_check(const Tensor& x, const Tensor& flag, float inv_scale) {
  Check k(*this, "unscale_check");
  k.f32("x", x);
  k.is("flag", flag, DType::i32);
  CT_REQUIRE(flag.numel() == 1, "unscale_check: flag must be [1] i32" + shapes({&flag, &x}));
  unscale_check_kernel(x, flag, inv_scale);
}

void Device::unscale_check_kernel(const Tensor& x, const Tensor& flag, float inv_scale) {
  scale_kernel(x, inv_scale);
  check_finite_kernel(flag, x);
}

namespace {

// What adamw and adamw_groups both ask of their buffers: four f32 tensors of one length, the
// clip's norm where clipping is on, and a 16-bit copy of that length apart from them, if any.
void check_adamw_buffers(Check& k, const Tensor& param, const Tensor& grad, const Tensor& m,
                         const Tensor& v, const Tensor& grad_norm, const AdamWHyper& hp,
                         const Tensor& param16) {
  k.f32("param", param);
  k.f32("grad", grad);
  k.f32("m", m);
  k.f32("v", v);
  k.same_numel(param, grad);
  k.same_numel(param, m);
  k.same_numel(param, v);
  k.clip_norm(grad_norm, hp.max_grad_norm);
  if (!param16.defined()) return;
  k.mine("param16", param16);
  CT_REQUIRE(is_h(param16.dtype),
             k.op() + ": param16 must be f16 or bf16, got " + param16.describe());
  k.same_numel(param, param16);
  for (const Tensor* t : {&param, &grad, &m, &v})
    CT_REQUIRE(!overlaps(param16, *t),
               k.op() + ": param16 overlaps another argument" + shapes({&param16, t}));
}

}  // namespace

void Device::adamw(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
                   const Tensor& grad_norm, const AdamWHyper& hp, const Tensor& param16) {
  Check k(*this, "adamw");
  check_adamw_buffers(k, param, grad, m, v, grad_norm, hp, param16);
  k.step(hp.step);
  adamw_kernel(param, grad, m, v, grad_norm, hp, param16);
}

void Device::adamw_groups(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
                          const Tensor& grad_norm, const Tensor& schedule,
                          const AdamWGroups& groups, const AdamWHyper& hp, const Tensor& param16) {
  Check k(*this, "adamw_groups");
  check_adamw_buffers(k, param, grad, m, v, grad_norm, hp, param16);
  k.f32("schedule", schedule);
  CT_REQUIRE(schedule.numel() == kAdamWScheduleLen,
             "adamw_groups: schedule must be [4] (AdamWSchedule)" + shapes({&schedule}));
  CT_REQUIRE(groups.count >= 0 && groups.count <= AdamWGroups::kMaxRanges,
             "adamw_groups: " + std::to_string(groups.count) + " ranges (at most " +
                 std::to_string(AdamWGroups::kMaxRanges) + ")");
  int64_t end = 0;  // of the previous range
  for (int i = 0; i < groups.count; ++i) {
    const AdamWGroups::Range& r = groups.ranges[i];
    CT_REQUIRE(r.begin >= end && r.len >= 0 && r.begin + r.len <= param.numel(),
               "adamw_groups: range " + std::to_string(i) + " [" + std::to_string(r.begin) + ", " +
                   std::to_string(r.begin + r.len) +
                   ") must follow the one before it and end within the " +
                   std::to_string(param.numel()) + " elements");
    end = r.begin + r.len;
  }
  adamw_groups_kernel(param, grad, m, v, grad_norm, schedule, groups, hp, param16);
}

// -- optimizers -----------------------------------------------------------------------------------

void Device::sgd(const Tensor& param, const Tensor& grad, const Tensor& momentum_buf,
                 const Tensor& grad_norm, const SgdHyper& hp) {
  Check k(*this, "sgd");
  k.f32("param", param);
  k.f32("grad", grad);
  k.same_numel(param, grad);
  if (hp.momentum != 0.0f) {
    k.f32("momentum_buf", momentum_buf);
    k.same_numel(param, momentum_buf);
  }
  CT_REQUIRE(!hp.nesterov || (hp.momentum > 0.0f && hp.dampening == 0.0f),
             "sgd: nesterov needs momentum > 0 and dampening 0");
  k.step(hp.step);
  k.clip_norm(grad_norm, hp.max_grad_norm);
  sgd_kernel(param, grad, momentum_buf, grad_norm, hp);
}

void Device::lion(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& grad_norm,
                  const LionHyper& hp) {
  Check k(*this, "lion");
  k.f32("param", param);
  k.f32("grad", grad);
  k.f32("m", m);
  k.same_numel(param, grad);
  k.same_numel(param, m);
  k.clip_norm(grad_norm, hp.max_grad_norm);
  lion_kernel(param, grad, m, grad_norm, hp);
}

void Device::adamw_8bit(const Tensor& param, const Tensor& grad, const Tensor& m_q,
                        const Tensor& v_q, const Tensor& m_absmax, const Tensor& v_absmax,
                        const Tensor& qmap_signed, const Tensor& qmap_unsigned,
                        const Tensor& grad_norm, const AdamWHyper& hp) {
  Check k(*this, "adamw_8bit");
  for (auto [n, t] : {std::pair{"param", &param},
                      {"grad", &grad},
                      {"m_absmax", &m_absmax},
                      {"v_absmax", &v_absmax},
                      {"qmap_signed", &qmap_signed},
                      {"qmap_unsigned", &qmap_unsigned}})
    k.f32(n, *t);
  k.is("m_q", m_q, DType::u8);
  k.is("v_q", v_q, DType::u8);
  k.same_numel(param, grad);
  k.same_numel(param, m_q);
  k.same_numel(param, v_q);
  const int64_t nb = quant_blocks(param.numel());
  CT_REQUIRE(m_absmax.numel() == nb && v_absmax.numel() == nb && qmap_signed.numel() == 256 &&
                 qmap_unsigned.numel() == 256,
             k.op() + ": expected m_absmax, v_absmax [" + std::to_string(nb) + "] and qmaps [256]" +
                 shapes({&m_absmax, &v_absmax, &qmap_signed, &qmap_unsigned}));
  k.step(hp.step);
  k.clip_norm(grad_norm, hp.max_grad_norm);
  adamw_8bit_kernel(param, grad, m_q, v_q, m_absmax, v_absmax, qmap_signed, qmap_unsigned,
                    grad_norm, hp);
}

void Device::adafactor(const Tensor& param, const Tensor& grad, const Tensor& row,
                       const Tensor& col, const Tensor& v, const Tensor& exp_avg,
                       const Tensor& grad_norm, const AdafactorHyper& hp) {
  Check k(*this, "adafactor");
  k.f32("param", param);
  k.f32("grad", grad);
  k.same_numel(param, grad);
  CT_REQUIRE(param.numel() > 0, "adafactor: param is empty");
  k.step(hp.step);
  const bool factored = param.ndim() >= 2;
  const int64_t C = factored ? param.shape[-1] : param.numel(), R = param.numel() / C;
  if (factored) {
    k.f32("row", row);
    k.f32("col", col);
    CT_REQUIRE(row.numel() == R && col.numel() == C && !v.defined(),
               "adafactor: a rank >= 2 param [R,C] takes row [R], col [C] and no v" +
                   shapes({&param, &row, &col}));
  } else {
    k.f32("v", v);
    k.same_numel(param, v);
    CT_REQUIRE(!row.defined() && !col.defined(), "adafactor: a 1-D param takes v, not row/col");
  }
  if (hp.beta1 > 0.0f) {
    k.f32("exp_avg", exp_avg);
    k.same_numel(param, exp_avg);
  }
  k.clip_norm(grad_norm, hp.max_grad_norm);
  adafactor_kernel(param, grad, row, col, v, exp_avg, grad_norm, hp);
}

// The optimizer kernels a backend need not have.
void Device::sgd_kernel(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                        const SgdHyper&) {
  fail(ErrorKind::kUnsupported, "sgd: not implemented on " + info().id());
}
void Device::lion_kernel(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                         const LionHyper&) {
  fail(ErrorKind::kUnsupported, "lion: not implemented on " + info().id());
}
void Device::adamw_8bit_kernel(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                               const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                               const Tensor&, const AdamWHyper&) {
  fail(ErrorKind::kUnsupported, "adamw_8bit: not implemented on " + info().id());
}
void Device::adafactor_kernel(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                              const Tensor&, const Tensor&, const Tensor&, const AdafactorHyper&) {
  fail(ErrorKind::kUnsupported, "adafactor: not implemented on " + info().id());
}

}  // namespace ct
