#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>

#include "core/registry.h"
#include "core/train/progress.h"
#include "tools/crosstrain/cli_util.h"
#include "tools/crosstrain/commands.h"

namespace ct::cli {

static nlohmann::json device_json(const DeviceInfo& d) {
  nlohmann::json dtypes = nlohmann::json::array();
  for (DType t : d.dtypes) dtypes.push_back(dtype_name(t));
  nlohmann::json extra = nlohmann::json::object();
  for (const auto& [k, v] : d.extra) extra[k] = v;
  return {
      {"id", d.id()},
      {"name", d.name},
      {"type", device_type_name(d.type)},
      {"driver", d.driver},
      {"memory_bytes", d.memory_bytes},
      {"memory_budget_bytes", d.memory_budget_bytes},
      {"max_allocation_bytes", d.max_allocation_bytes},
      {"max_buffer_range_bytes", d.max_buffer_range_bytes},
      {"dtypes", dtypes},
      {"cooperative_matrix", d.cooperative_matrix},
      {"fp16_arithmetic", d.fp16_arithmetic},
      {"bf16_arithmetic", d.bf16_arithmetic},
      {"tf32", d.tf32},
      {"graphs", d.graphs},
      {"native_stack", d.native_stack},
      {"test_only", d.test_only},
      {"preferred_attention", d.preferred_attention == AttentionPath::kFused ? "fused" : "unfused"},
      {"extra", extra}};
}

// A device whose description is settled only when it is opened (Vulkan: the coopmat self-test
// without a cached verdict): opened here, so the listing says what a run would use.
static DeviceInfo settled_info(Backend& backend, const DeviceInfo& listed) {
  std::fprintf(stderr, "%s: opening it to settle its description (%s)\n", listed.id().c_str(),
               "the coopmat GEMM's start-up self-test; the verdict is cached");
  try {
    std::unique_ptr<Device> dev = backend.open(listed.index);
    DeviceInfo info = dev->info();
    info.memory_budget_bytes = listed.memory_budget_bytes;  // as listed, before this open
    return info;
  } catch (const std::exception& ex) {
    DeviceInfo info = listed;
    info.extra.push_back({"opening it failed", ex.what()});
    return info;
  }
}

Run add_devices(CLI::App& app) {
  auto as_json = std::make_shared<bool>(false);
  app.add_flag("--json", *as_json, "one JSON document instead of text");
  return [as_json] {
    nlohmann::json out = nlohmann::json::array();
    for (const BackendEntry& e : backends()) {
      nlohmann::json b = {{"backend", e.name}, {"path", e.path}, {"available", e.error.empty()}};
      if (!e.error.empty()) b["reason"] = e.error;
      std::vector<DeviceInfo> devs;
      if (e.backend && e.error.empty()) devs = e.backend->devices();
      for (DeviceInfo& d : devs)
        if (d.settled_on_open) d = settled_info(*e.backend, d);
      b["devices"] = nlohmann::json::array();
      for (const auto& d : devs) b["devices"].push_back(device_json(d));
      out.push_back(b);
      if (*as_json) continue;
      std::printf("%s (%s): %s\n", e.name.c_str(), e.path.c_str(),
                  e.error.empty() ? "available" : ("unavailable: " + e.error).c_str());
      for (const auto& d : devs) {
        std::printf("  %-9s %s [%s]\n", d.id().c_str(), d.name.c_str(), device_type_name(d.type));
        if (!d.driver.empty()) std::printf("            driver: %s\n", d.driver.c_str());
        std::printf("            memory: %s", format_bytes(d.memory_bytes).c_str());
        if (d.memory_budget_bytes)
          std::printf(" (budget %s)", format_bytes(d.memory_budget_bytes).c_str());
        std::printf(", max allocation %s, max buffer range %s\n",
                    format_bytes(d.max_allocation_bytes).c_str(),
                    format_bytes(d.max_buffer_range_bytes).c_str());
        std::string dt;
        for (DType t : d.dtypes) dt += std::string(dt.empty() ? "" : " ") + dtype_name(t);
        std::printf(
            "            dtypes: %s; fp16 arithmetic: %s; bf16 arithmetic: %s; cooperative matrix: "
            "%s\n",
            dt.c_str(), d.fp16_arithmetic ? "yes" : "no", d.bf16_arithmetic ? "yes" : "no",
            d.cooperative_matrix ? "yes" : "no");
        std::printf("            attention (auto): %s; tf32: %s; graphs: %s%s%s\n",
                    d.preferred_attention == AttentionPath::kFused ? "fused" : "unfused",
                    d.tf32 ? "yes (--tf32)" : "no",
                    d.graphs ? "yes (the step replayed; --no-cuda-graph)" : "no",
                    d.native_stack ? "; native stack" : "",
                    d.test_only ? "; for tests (never --backend auto)" : "");
        for (const auto& [k, v] : d.extra)
          std::printf("            %s: %s\n", k.c_str(), v.c_str());
      }
    }
    if (*as_json) std::printf("%s\n", out.dump(2).c_str());
    return 0;
  };
}

}  // namespace ct::cli
