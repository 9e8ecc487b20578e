// The plugin ABI's version history. A plugin (core/device.h: libcrosstrain_backend_<name>.so)
// is built against one core/device.h and the op list it expands, core/ops.def; the registry
// loads it only when its version is kBackendAbiVersion. Each version records the fingerprint of
// the interface it stands for: the SHA-256 of the files of kBackendAbiFiles with comments
// removed and whitespace collapsed (abi_normalise()), each followed by a newline, so a change to
// a comment or the layout keeps it, any change to a declaration or to a line of ops.def does
// not. tests/core/backend_abi_test.cpp fails when the fingerprint is not the one recorded for
// kBackendAbiVersion: then bump kBackendAbiVersion in core/device.h and add a row here with the
// fingerprint the test prints. (Versions up to 8 fingerprinted core/device.h alone.)
#pragma once

#include <string>
#include <string_view>

namespace ct {

// The files that declare the plugin interface, in the order they are fingerprinted.
inline constexpr const char* kBackendAbiFiles[] = {"core/device.h", "core/ops.def"};

struct BackendAbiRevision {
  int version;
  const char* device_h_sha256;  // the fingerprint (see above); "" where not recorded
  const char* what;
};

inline constexpr BackendAbiRevision kBackendAbiHistory[] = {
    {1, "", "the first plugin interface (before fingerprints were recorded)"},
    {2, "4a619556eb151fe62ff7324bd9175e9f93f0ac3bdb5b0999d47de09360402400",
     "ops non-virtual, checked in core; backends implement protected *_kernel virtuals; "
     "events, download_async and native_stream"},
    {3, "7a264063441836efce8bb0aee8a1f5f08e6d523783453e3a015a482536f5930c",
     "flash_attention_forward/backward (fused attention, lse saved)"},
    {4, "4dd4a5dddc7b28ac287af6eaa4af1e53e04094a35470dfec462052acc6e8fc3d",
     "dropout (Philox mask, DropoutMask handed to dropout_kernel), OpKind::kDropout"},
    {5, "543049ecc1810a1b3aa26f234993042e59d684a0ab4e71f851f62bc06a9ba4b6",
     "rmsnorm_forward/backward (Llama's RMSNorm), OpKind::kRMSNorm; embedding_forward takes "
     "16-bit tables"},
    {6, "055a41a89be03cfe765f3d1dff61c153af3ae83a05dbcf3df12028758e754f89",
     "swiglu_forward/backward (Llama's MLP activation over a fused gate/up projection) and "
     "rope_forward/backward (rotary embedding, rotate-half, caller's cos/sin tables); "
     "OpKind::kSwiGLU, kRope; grouped-query attention (n_kv_head) in the four attention ops"},
    {7, "e22939219bd923de1d692e4cd725226601e20afea3b55c3e4b1d1c118f7bd79b",
     "embedding_forward / embedding_backward without a position table (wpe, dwpe undefined; "
     "wpe defaults to none)"},
    {8, "d88fa140f64641cdb8d132fdc1590d3920c7057b69b2a7c67b2dd31d2c4aada2",
     "DeviceInfo::settled_on_open (a description settled only by opening the device: the "
     "Vulkan coopmat self-test without a cached verdict)"},
    {9, "3fb9bea1c702261f1b5c86caac022dfd642fcebc2924ac2124da366de201fbe3",
     "the op set declared once in core/ops.def (OpKind, the *_kernel virtuals) and fingerprinted "
     "with device.h; the same kernels, in the same order, and the same OpKind values. "
     "Capabilities instead of backend names: DeviceInfo::native_stack, test_only, "
     "preferred_attention (AttentionPath), tf32; Device::set_allow_tf32 (--tf32 as a device "
     "option, not an environment variable)"},
    {10, "e9cc6c3d89573a44f3da0b5c57da5dc6b6a75f79f1b4f7a0520bf69d3fbb6c05",
     "crossentropy_forward/backward take the number of classes (valid): rows of Vp >= valid "
     "columns, the padding excluded from the softmax and given zero gradients (a vocabulary "
     "padded to a multiple of 128)"},
    {11, "117b9a9f4dae7d13bbe7dca944a66321394ab08531f8198f207e74d2a609754d",
     "op_begin/op_end: the profiling scope of every public op (--profile's device time per op "
     "on CUDA, HIP and SIMT)"},
    {12, "58b795a9eeb58f6d545a2c9ab11a8eaacdcc27e2c53c777630106f1fcd114436",
     "residual_layernorm_forward and residual_rmsnorm_forward: the residual add fused into the "
     "norm after it (kLayerNorm / kRMSNorm answer for them)"},
    {13, "0e92cb1255198df7848caa7f7d4d727c1f16e0acf61b87d094592094e7fa20df",
     "crossentropy_forward_backward: the loss and its gradient in one pass over the logits, in "
     "place (the training step's; kCrossEntropy answers for it)"},
    {14, "6a74b1e94cf3fc1e63c1ab97a09afcf8822aeb24ec14108ffca1123090f7cbed",
     "Device::counters: running totals a backend keeps (host waits, GEMMs its library refused), "
     "written to metrics.jsonl"},
    {15, "f5c7db5d249984ff70bebc0daf83d974c633a8a1cac111a7410c2fe32944cfc0",
     "graphs: Device::begin_capture / end_capture / replay_graph / release_graph and "
     "DeviceInfo::graphs (a micro-batch's forward and backward replayed as a CUDA/HIP graph)"},
    {16, "1a84654e9f976c5ed21bd1bf1de2599d20c444bec5b9673a1d420e5b244821eb",
     "matmul_bias_gelu and matmul_gelu_backward: the tanh GELU in a product's epilogue, forward "
     "(pre and gelu(pre)) and backward (gelu_backward of the product); kMatmul answers for them"},
    {17, "6591fa1a462a3a6c18ceb564dcc40538dd74c0c4c0642e77b3af0d8f05bfcab9",
     "Device::native_address: a tensor's device address for a collective library (NCCL, RCCL, "
     "the SIMT runtime's) enqueued on native_stream()"},
    {18, "97f811b8c0d606eec52add0fa001f227265dfc22c4c045765b02dada15d1ca51",
     "adamw_groups: AdamW over up to 8 ranges of the flat buffers in one dispatch (AdamWGroups), "
     "lr and step read from a device tensor (AdamWSchedule) so a graph can replay it; kAdamW "
     "answers for it"},
    {19, "2d99326a3eb4ec5e05d92d54476916dd42cf313fba9b54c47903fe3995e829d8",
     "adamw and adamw_groups take param16: the f16/bf16 copy of the updated parameters written "
     "in the same pass, rounded as copy() rounds (the mixed-precision compute copy, llm.c-style)"},
    {20, "9e110d034ccd3dcdfa519ad47693ee0da2e8c853646c0c99547d5c2958786edc",
     "flash_attention_forward may take the last rows only: out [B,Tq,C] and lse [B,NH,Tq] for "
     "positions T - Tq .. T - 1 of qkv [B,T,W] (sampling's key/value cache); the signatures "
     "did not change, but a version-19 kernel would read Tq as T"},
};

// A source's text without // and /* */ comments, every run of whitespace one space, trimmed.
// String and character literals are kept as they are.
inline std::string abi_normalise(std::string_view src) {
  std::string out;
  bool space = false;
  auto put = [&](char c) {
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v') {
      space = !out.empty();
      return;
    }
    if (space) out += ' ';
    space = false;
    out += c;
  };
  for (size_t i = 0; i < src.size(); ++i) {
    char c = src[i];
    if (c == '/' && i + 1 < src.size() && src[i + 1] == '/') {
      while (i < src.size() && src[i] != '\n') ++i;
      put('\n');
    } else if (c == '/' && i + 1 < src.size() && src[i + 1] == '*') {
      i += 2;
      while (i + 1 < src.size() && !(src[i] == '*' && src[i + 1] == '/')) ++i;
      ++i;
      put(' ');
    } else if (c == '"' || c == '\'') {
      put(c);
      for (++i; i < src.size() && src[i] != c; ++i) {
        out += src[i];
        if (src[i] == '\\' && i + 1 < src.size()) out += src[++i];
      }
      if (i < src.size()) out += c;
    } else {
      put(c);
    }
  }
  return out;
}

}  // namespace ct
