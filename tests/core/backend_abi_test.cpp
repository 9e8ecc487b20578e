// The plugin ABI: the fingerprint of core/device.h and core/ops.def must be the one recorded for
// kBackendAbiVersion in core/backend_abi.h, and a plugin built for another version is listed as
// unavailable.
#include "core/backend_abi.h"

#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "core/device.h"
#include "core/io/sha256.h"

namespace ct {
namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(BackendAbi, NormaliseDropsCommentsAndLayoutOnly) {
  EXPECT_EQ(abi_normalise("int  a; // note\n/* block\n */ int\tb;\n"), "int a; int b;");
  EXPECT_EQ(abi_normalise("f(\"a // b\",  '/')"), "f(\"a // b\", '/')");
  EXPECT_NE(abi_normalise("virtual void f();"), abi_normalise("void f();"));
}

TEST(BackendAbi, DeviceHeaderMatchesTheRecordedVersion) {
  std::string normalised;
  for (const char* file : kBackendAbiFiles) {
    std::string src = read_file(std::string(CT_SOURCE_DIR) + "/" + file);
    ASSERT_FALSE(src.empty()) << "cannot read " << file;
    normalised += abi_normalise(src) + "\n";
  }
  std::string got = sha256_hex(normalised);
  const BackendAbiRevision* rev = nullptr;
  for (const auto& r : kBackendAbiHistory)
    if (r.version == kBackendAbiVersion) rev = &r;
  ASSERT_NE(rev, nullptr) << "core/backend_abi.h has no row for kBackendAbiVersion "
                          << kBackendAbiVersion << ": add {" << kBackendAbiVersion << ", \"" << got
                          << "\", \"what changed\"}";
  EXPECT_EQ(got, rev->device_h_sha256)
      << "core/device.h and core/ops.def declare another interface than backend ABI "
      << kBackendAbiVersion
      << " was recorded with. A plugin built against the old header would load and call the "
         "wrong slots: bump kBackendAbiVersion in core/device.h to "
      << kBackendAbiVersion + 1 << " and add {" << kBackendAbiVersion + 1 << ", \"" << got
      << "\", \"what changed\"} to kBackendAbiHistory in core/backend_abi.h. (Comment and "
         "whitespace changes do not count.)";
  // Versions only go up, one row each.
  int last = 0;
  for (const auto& r : kBackendAbiHistory) {
    EXPECT_EQ(r.version, last + 1);
    last = r.version;
  }
  EXPECT_EQ(last, kBackendAbiVersion);
}

#ifdef CT_STALE_PLUGIN_DIR
// `crosstrain devices` with a folder holding a plugin built for ABI version CT_FAKE_ABI_VERSION.
TEST(BackendAbi, PluginOfAnotherVersionIsListedUnavailable) {
  std::string cmd = std::string("CROSSTRAIN_BACKEND_DIR=") + CT_STALE_PLUGIN_DIR + " " +
                    CT_CROSSTRAIN_BIN + " devices 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  int status = pclose(p);
  EXPECT_EQ(status, 0) << out;
  std::string want = "libcrosstrain_backend_stale.so was built for backend ABI " +
                     std::to_string(CT_FAKE_ABI_VERSION) + ", this crosstrain expects " +
                     std::to_string(kBackendAbiVersion);
  EXPECT_NE(out.find("stale"), std::string::npos) << out;
  EXPECT_NE(out.find(want), std::string::npos) << out;
  EXPECT_NE(out.find("cpu"), std::string::npos) << out;
}
#endif

}  // namespace
}  // namespace ct
