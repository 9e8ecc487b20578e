#include "core/model/model_util.h"

#include <algorithm>

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

}  // namespace ct::model_util
