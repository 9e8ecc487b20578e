#include "core/model/model_util.h"

#include <algorithm>

#include "core/dtype.h"
#include "core/error.h"

namespace ct::model_util {

void check_token_batch(const Tensor& t, int B, int T, const char* what) {
  CT_REQUIRE(
      t.defined() && t.dtype == DType::i32 && t.is_contiguous() && t.numel() == int64_t{B} * T,
      std::string(what) + " must be a contiguous i32 tensor of " + std::to_string(B) + "x" +
          std::to_string(T) + " elements, got " +
          (t.defined() ? t.describe() : std::string("none")));
}

DType check_policy(const Device& device, const PrecisionPolicy& pp, const char* model,
                   std::span<const std::pair<OpKind, const char*>> needed) {
  const DType want = pp.precision == Precision::kFp16   ? DType::f16
                     : pp.precision == Precision::kBf16 ? DType::bf16
                                                        : DType::f32;
  // The LM head multiplies activations by weights, and matmul wants a and b of one dtype.
  if (pp.compute != want || pp.activations != want)
    fail(ErrorKind::kInvalidArgument, std::string(model) + " precision policy " + pp.name() +
                                          " needs compute and activation dtype " +
                                          dtype_name(want) + ", got " + dtype_name(pp.compute) +
                                          " / " + dtype_name(pp.activations) +
                                          " (use PrecisionPolicy::make)");
  if (!pp.mixed()) return want;
  for (const auto& [op, name] : needed)
    if (!device.supports(op, want))
      fail(ErrorKind::kUnsupported, "--" + pp.name() + ": device " + device.info().id() + " (" +
                                        device.info().name + ") has no " + dtype_name(want) + " " +
                                        name + " op");
  return want;
}

std::vector<float> flatten(const std::vector<ParamInfo>& table, int64_t total,
                           const std::map<std::string, std::vector<float>>& named) {
  std::map<std::string, const ParamInfo*> rows;
  for (const ParamInfo& p : table) rows[p.name] = &p;
  for (const auto& [name, values] : named)
    if (!rows.count(name))
      fail(ErrorKind::kInvalidArgument, "upload_params: unknown parameter '" + name + "'");
  std::vector<float> flat(static_cast<size_t>(total));
  for (const ParamInfo& p : table) {
    auto it = named.find(p.name);
    if (it == named.end())
      fail(ErrorKind::kInvalidArgument, "upload_params: missing parameter '" + p.name + "'");
    if (static_cast<int64_t>(it->second.size()) != p.numel)
      fail(ErrorKind::kInvalidArgument,
           "upload_params: '" + p.name + "' has " + std::to_string(it->second.size()) +
               " values, expected " + std::to_string(p.numel) + " for shape " + p.shape.str());
    std::copy(it->second.begin(), it->second.end(), flat.begin() + p.offset);
  }
  return flat;
}

std::map<std::string, std::vector<float>> split(const std::vector<ParamInfo>& table,
                                                const std::vector<float>& flat) {
  std::map<std::string, std::vector<float>> named;
  for (const ParamInfo& p : table)
    named[p.name] = std::vector<float>(flat.begin() + p.offset, flat.begin() + p.offset + p.numel);
  return named;
}

void ForwardBatch::check(const Tensor& tokens, const Tensor* targets, int B, int T, int block_size,
                         const char* limit) {
  CT_REQUIRE(B >= 1, "batch size must be positive, got " + std::to_string(B));
  CT_REQUIRE(T >= 1 && T <= block_size, "sequence length " + std::to_string(T) + " outside [1, " +
                                            limit + " " + std::to_string(block_size) + "]");
  check_token_batch(tokens, B, T, "tokens");
  if (targets) check_token_batch(*targets, B, T, "targets");
}

void ForwardBatch::begin(const Tensor& tokens, const Tensor* targets, int B, int T) {
  b_ = B;
  t_ = T;
  tokens_ = tokens.reshape({B, T});
  have_targets_ = targets != nullptr;
  targets_ = targets ? targets->reshape({int64_t{B} * T}) : Tensor();
}

void ForwardBatch::require_targets(const char* what) const {
  CT_REQUIRE(b_ > 0 && have_targets_,
             std::string(what) + " needs a preceding forward() with targets");
}

Tensor ForwardBatch::logits(const Tensor& buffer, int64_t V) const {
  CT_REQUIRE(b_ > 0, "logits() before forward()");
  return buffer.slice_flat(0, {b_, t_, V});
}

Tensor ForwardBatch::losses(const Tensor& buffer) const {
  require_targets("losses()");
  return buffer.slice_flat(0, {b_, t_});
}

void upload_rounded(Device& device, const Tensor& dst16, const std::vector<float>& flat) {
  CT_REQUIRE(dst16.dtype == DType::bf16 || dst16.dtype == DType::f16,
             "upload_rounded: " + dst16.describe() + " is not a 16-bit float tensor");
  CT_REQUIRE(static_cast<int64_t>(flat.size()) == dst16.numel(),
             "upload_rounded: " + std::to_string(flat.size()) + " values for " + dst16.describe());
  std::vector<uint16_t> bits(flat.size());
  const bool bf = dst16.dtype == DType::bf16;
  for (size_t i = 0; i < flat.size(); ++i)
    bits[i] = bf ? f32_to_bf16(flat[i]) : f32_to_f16(flat[i]);
  device.upload(dst16, bits.data(), bits.size() * sizeof(uint16_t));
}

std::vector<float> download_widened(Device& device, const Tensor& src16) {
  CT_REQUIRE(src16.dtype == DType::bf16 || src16.dtype == DType::f16,
             "download_widened: " + src16.describe() + " is not a 16-bit float tensor");
  std::vector<uint16_t> bits(static_cast<size_t>(src16.numel()));
  device.download(bits.data(), src16, bits.size() * sizeof(uint16_t));
  std::vector<float> host(bits.size());
  const bool bf = src16.dtype == DType::bf16;
  for (size_t i = 0; i < host.size(); ++i)
    host[i] = bf ? bf16_to_f32(bits[i]) : f16_to_f32(bits[i]);
  return host;
}

}  // namespace ct::model_util
