// bf16 matmul on oneDNN's matmul primitive (AMX or AVX512_BF16 kernels, fp32 accumulation):
// several times sgemm's throughput where the CPU has bf16 instructions. Also the f32 products
// for which oneDNN's f32 kernels beat OpenBLAS here (matmul_f32_onednn; fast/matmul.cpp
// chooses). One copy, shared by every ISA level of the fast kernels. libdnnl.so.2 is opened
// at run time, so the CPU backend neither links nor requires it; without it (or without the
// header at build time, or on a CPU without bf16 instructions, or with CT_CPU_NO_DNNL set)
// matmul_bf16 declines and the device widens the operands to f32 for sgemm instead.
#include <cstdlib>
#include <deque>
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>

#include "backends/cpu/kernels.h"
#include "core/error.h"

#if __has_include(<oneapi/dnnl/dnnl.h>)
#include <dlfcn.h>
#include <oneapi/dnnl/dnnl.h>
#define CT_CPU_DNNL_HEADER 1
#endif

namespace ct::cpu::fast {

#ifdef CT_CPU_DNNL_HEADER
namespace {

struct Api {
  decltype(&dnnl_engine_create) engine_create = nullptr;
  decltype(&dnnl_stream_create) stream_create = nullptr;
  decltype(&dnnl_stream_wait) stream_wait = nullptr;
  decltype(&dnnl_memory_desc_init_by_strides) md_init = nullptr;
  decltype(&dnnl_matmul_desc_init) matmul_desc_init = nullptr;
  decltype(&dnnl_primitive_attr_create) attr_create = nullptr;
  decltype(&dnnl_primitive_attr_destroy) attr_destroy = nullptr;
  decltype(&dnnl_primitive_attr_set_output_scales) attr_set_scales = nullptr;
  decltype(&dnnl_primitive_attr_set_post_ops) attr_set_post_ops = nullptr;
  decltype(&dnnl_post_ops_create) post_ops_create = nullptr;
  decltype(&dnnl_post_ops_destroy) post_ops_destroy = nullptr;
  decltype(&dnnl_post_ops_append_sum) post_ops_append_sum = nullptr;
  decltype(&dnnl_primitive_desc_create) pd_create = nullptr;
  decltype(&dnnl_primitive_desc_destroy) pd_destroy = nullptr;
  decltype(&dnnl_primitive_create) prim_create = nullptr;
  decltype(&dnnl_primitive_execute) prim_execute = nullptr;
  decltype(&dnnl_memory_create) mem_create = nullptr;
  decltype(&dnnl_memory_destroy) mem_destroy = nullptr;
  decltype(&dnnl_get_effective_cpu_isa) effective_isa = nullptr;
  dnnl_engine_t engine = nullptr;
  dnnl_stream_t stream = nullptr;
  bool ok = false;
  std::string what = "none";
};

Api load() {
  Api a;
  if (std::getenv("CT_CPU_NO_DNNL")) {
    a.what = "none (CT_CPU_NO_DNNL is set)";
    return a;
  }
  void* h = dlopen("libdnnl.so.2", RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    a.what = "none (libdnnl.so.2 not found)";
    return a;
  }
  bool all = true;
  auto sym = [&](auto& fn, const char* name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(h, name));
    all = all && fn != nullptr;
  };
  sym(a.engine_create, "dnnl_engine_create");
  sym(a.stream_create, "dnnl_stream_create");
  sym(a.stream_wait, "dnnl_stream_wait");
  sym(a.md_init, "dnnl_memory_desc_init_by_strides");
  sym(a.matmul_desc_init, "dnnl_matmul_desc_init");
  sym(a.attr_create, "dnnl_primitive_attr_create");
  sym(a.attr_destroy, "dnnl_primitive_attr_destroy");
  sym(a.attr_set_scales, "dnnl_primitive_attr_set_output_scales");
  sym(a.attr_set_post_ops, "dnnl_primitive_attr_set_post_ops");
  sym(a.post_ops_create, "dnnl_post_ops_create");
  sym(a.post_ops_destroy, "dnnl_post_ops_destroy");
  sym(a.post_ops_append_sum, "dnnl_post_ops_append_sum");
  sym(a.pd_create, "dnnl_primitive_desc_create");
  sym(a.pd_destroy, "dnnl_primitive_desc_destroy");
  sym(a.prim_create, "dnnl_primitive_create");
  sym(a.prim_execute, "dnnl_primitive_execute");
  sym(a.mem_create, "dnnl_memory_create");
  sym(a.mem_destroy, "dnnl_memory_destroy");
  sym(a.effective_isa, "dnnl_get_effective_cpu_isa");
  if (!all) {
    a.what = "none (libdnnl.so.2 lacks the oneDNN 2.x C API)";
    return a;
  }
  // Without native bf16 instructions oneDNN would emulate: no faster than widening to sgemm.
  unsigned isa = static_cast<unsigned>(a.effective_isa());
  if ((isa & dnnl_cpu_isa_avx512_core_bf16) != dnnl_cpu_isa_avx512_core_bf16) {
    a.what = "none (CPU without AVX512_BF16/AMX)";
    return a;
  }
  if (a.engine_create(&a.engine, dnnl_cpu, 0) != dnnl_success ||
      a.stream_create(&a.stream, a.engine, dnnl_stream_default_flags) != dnnl_success) {
    a.what = "none (oneDNN CPU engine failed)";
    return a;
  }
  a.ok = true;
  a.what = (isa & dnnl_cpu_isa_avx512_core_amx) == dnnl_cpu_isa_avx512_core_amx
               ? "oneDNN matmul (libdnnl.so.2, AMX)"
               : "oneDNN matmul (libdnnl.so.2, AVX512_BF16)";
  return a;
}

// Never destroyed: oneDNN's own statics may be gone at exit.
Api& api() {
  static Api* a = new Api(load());
  return *a;
}

struct Key {
  int64_t M, N, K;
  bool ta, tb, c_bf16, bias;
  float alpha, beta;
  bool f32 = false;  // a, b (and c) f32 rather than bf16
  bool operator==(const Key& o) const {
    return M == o.M && N == o.N && K == o.K && ta == o.ta && tb == o.tb && c_bf16 == o.c_bf16 &&
           bias == o.bias && alpha == o.alpha && beta == o.beta && f32 == o.f32;
  }
};

struct Prim {
  Key key;
  dnnl_primitive_t prim;
  dnnl_memory_desc_t a, b, c, bias;
};

std::mutex g_mu;
std::deque<Prim> g_cache;  // never shrinks (a model has a handful of shapes); stable addresses

bool make_prim(Api& x, const Key& k, Prim* p) {
  dnnl_dims_t ad = {k.M, k.K}, as = {k.ta ? 1 : k.K, k.ta ? k.M : 1};
  dnnl_dims_t bd = {k.K, k.N}, bs = {k.tb ? 1 : k.N, k.tb ? k.K : 1};
  dnnl_dims_t cd = {k.M, k.N}, cs = {k.N, 1};
  dnnl_dims_t vd = {1, k.N}, vs = {k.N, 1};
  const dnnl_data_type_t ab = k.f32 ? dnnl_f32 : dnnl_bf16;
  if (x.md_init(&p->a, 2, ad, ab, as) != dnnl_success ||
      x.md_init(&p->b, 2, bd, ab, bs) != dnnl_success ||
      x.md_init(&p->c, 2, cd, k.c_bf16 ? dnnl_bf16 : dnnl_f32, cs) != dnnl_success ||
      x.md_init(&p->bias, 2, vd, dnnl_f32, vs) != dnnl_success)
    return false;
  dnnl_matmul_desc_t desc;
  if (x.matmul_desc_init(&desc, &p->a, &p->b, k.bias ? &p->bias : nullptr, &p->c) != dnnl_success)
    return false;
  dnnl_primitive_attr_t attr = nullptr;
  dnnl_post_ops_t po = nullptr;
  bool ok = x.attr_create(&attr) == dnnl_success;
  if (ok && k.alpha != 1.0f) ok = x.attr_set_scales(attr, 1, 0, &k.alpha) == dnnl_success;
  if (ok && k.beta != 0.0f) {
    ok = x.post_ops_create(&po) == dnnl_success &&
         x.post_ops_append_sum(po, k.beta) == dnnl_success &&
         x.attr_set_post_ops(attr, po) == dnnl_success;
  }
  dnnl_primitive_desc_t pd = nullptr;
  ok = ok && x.pd_create(&pd, &desc, attr, x.engine, nullptr) == dnnl_success;
  ok = ok && x.prim_create(&p->prim, pd) == dnnl_success;
  if (pd) x.pd_destroy(pd);
  if (po) x.post_ops_destroy(po);
  if (attr) x.attr_destroy(attr);
  p->key = k;
  return ok;
}

// One product through a cached primitive for `k`; false (c untouched) when oneDNN declines it.
bool run(const Key& k, const void* a, const void* b, void* c, const float* bias) {
  Api& x = api();
  const Prim* p = nullptr;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    for (const Prim& q : g_cache)
      if (q.key == k) p = &q;
    if (!p) {
      Prim np{};
      if (!make_prim(x, k, &np)) return false;  // declined: c untouched
      g_cache.push_back(np);
      p = &g_cache.back();
    }
  }
  dnnl_memory_t ma = nullptr, mb = nullptr, mc = nullptr, mv = nullptr;
  bool ok =
      x.mem_create(&ma, &p->a, x.engine, const_cast<void*>(a)) == dnnl_success &&
      x.mem_create(&mb, &p->b, x.engine, const_cast<void*>(b)) == dnnl_success &&
      x.mem_create(&mc, &p->c, x.engine, c) == dnnl_success &&
      (!bias || x.mem_create(&mv, &p->bias, x.engine, const_cast<float*>(bias)) == dnnl_success);
  if (ok) {
    dnnl_exec_arg_t args[4] = {
        {DNNL_ARG_SRC, ma}, {DNNL_ARG_WEIGHTS, mb}, {DNNL_ARG_DST, mc}, {DNNL_ARG_BIAS, mv}};
    ok = x.prim_execute(p->prim, x.stream, bias ? 4 : 3, args) == dnnl_success &&
         x.stream_wait(x.stream) == dnnl_success;
  }
  for (dnnl_memory_t mem : {ma, mb, mc, mv})
    if (mem) x.mem_destroy(mem);
  // c may be half written by now: an error, not a fallback.
  if (!ok)
    fail(ErrorKind::kDevice, std::string("cpu: oneDNN ") + (k.f32 ? "f32" : "bf16") +
                                 " matmul failed (M " + std::to_string(k.M) + ", N " +
                                 std::to_string(k.N) + ", K " + std::to_string(k.K) +
                                 "); set CT_CPU_NO_DNNL=1 to use sgemm instead");
  return true;
}

}  // namespace

const char* bf16_matmul_library() {
  return api().what.c_str();
}

// c is (M,N) f32 or bf16; a is (M,K) or (K,M); b is (K,N) or (N,K); bias is (N)
bool matmul_bf16(const MatmulBf16Args& m) {
  if (!api().ok) return false;
  // With both, oneDNN would scale the bias too: keep the contract's alpha * ab + bias exact.
  if (m.alpha != 1.0f && m.bias) return false;
  Key k{m.M, m.N, m.K, m.trans_a, m.trans_b, m.c_bf16, m.bias != nullptr, m.alpha, m.beta};
  if (!m.bias || !m.c_bf16) return run(k, m.a, m.b, m.c, m.bias);
  // A bf16 c adds the bias rounded to bf16 (the op's contract); oneDNN adds the f32 it is given.
  std::vector<float> bias(static_cast<size_t>(m.N));
  for (size_t j = 0; j < bias.size(); ++j) bias[j] = round_to(DType::bf16, m.bias[j]);
  return run(k, m.a, m.b, m.c, bias.data());
}

// f32 c (M,N) = alpha a (M,K) op(b) + beta c (+ bias); b stored (K,N), or (N,K) with trans_b.
// Which products come here is matmul.cpp's choice (prefer_onednn_f32).
bool matmul_f32_onednn(float* c, const float* a, const float* b, const float* bias, int64_t M,
                       int64_t N, int64_t K, bool trans_b, float alpha, float beta) {
  if (!api().ok || M == 0 || N == 0 || K == 0) return false;
  if (alpha != 1.0f && bias) return false;
  Key k{M, N, K, false, trans_b, false, bias != nullptr, alpha, beta, true};
  return run(k, a, b, c, bias);
}

bool onednn_f32_available() {
  return api().ok;
}

bool matmul_bf16_available() {
  return api().ok;
}

const char* f32_matmul_library() {
  return onednn_f32_available()
             ? "OpenBLAS sgemm; oneDNN f32 matmul for a b^T (N <= 4096) and a b + bias (N <= 2048)"
             : "OpenBLAS sgemm";
}

#else  // no oneDNN header at build time

const char* bf16_matmul_library() {
  return "none (built without oneDNN's header)";
}
bool matmul_bf16(const MatmulBf16Args&) {
  return false;
}
bool matmul_f32_onednn(float*, const float*, const float*, const float*, int64_t, int64_t, int64_t,
                       bool, float, float) {
  return false;
}
bool onednn_f32_available() {
  return false;
}
bool matmul_bf16_available() {
  return false;
}
const char* f32_matmul_library() {
  return "OpenBLAS sgemm";
}

#endif

}  // namespace ct::cpu::fast
