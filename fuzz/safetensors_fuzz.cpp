// libFuzzer target for the safetensors reader: any byte string must either parse into tensors
// whose byte ranges lie inside the file, or be refused with ct::Error — never crash, hang or read
// out of bounds (run under ASan/UBSan by scripts/fuzz.sh).
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

#include "core/error.h"
#include "core/io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path =
      "/dev/shm/crosstrain_fuzz_" + std::to_string(getpid()) + ".safetensors";
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return 0;
  std::fwrite(data, 1, size, f);
  std::fclose(f);
  try {
    ct::SafetensorsFile st = ct::read_safetensors(path);
    volatile uint8_t sink = 0;
    for (const auto& name : st.names()) {
      auto bytes = st.data(name);
      if (!bytes.empty())
        sink = sink ^ static_cast<uint8_t>(bytes.front()) ^ static_cast<uint8_t>(bytes.back());
      (void)st.info(name).to_shape();
    }
    (void)sink;
  } catch (const ct::Error&) {
  }
  return 0;
}
