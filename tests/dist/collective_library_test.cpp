// The collective libraries' loader (core/dist/collective_library.h): NCCL from the CUDA toolkit
// found and every entry point bound (dlopen and dlsym only: no GPU needed), its version the one
// its header declares; a missing library named in the error; and the SIMT runtime's library in
// a world of one.
#include "core/dist/collective_library.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include "core/dist/communicator.h"
#include "core/error.h"

namespace ct {
namespace {
namespace fs = std::filesystem;

constexpr const char* kToolkitNccl = "/usr/local/cuda/lib64/libnccl.so.2";

// "2.28.9" from nccl.h's NCCL_MAJOR, NCCL_MINOR and NCCL_PATCH; "" where there is no header.
std::string header_version(const std::string& path) {
  std::ifstream f(path);
  std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::string v;
  for (const char* part : {"MAJOR", "MINOR", "PATCH"}) {
    std::smatch m;
    const std::regex re(std::string("#define NCCL_") + part + " +([0-9]+)");
    if (!std::regex_search(text, m, re)) return "";
    v += (v.empty() ? "" : ".") + m[1].str();
  }
  return v;
}

TEST(CollectiveLibrary, LoadsNcclFromTheCudaToolkit) {
  if (!fs::exists(kToolkitNccl))
    GTEST_SKIP() << kToolkitNccl << " is absent (no CUDA toolkit with NCCL on this machine)";
  // By soname, as the trainer asks: found on the loader's path or in the toolkit's folder.
  const dist::CollectiveLibrary lib = dist::load_collective_library("libnccl.so.2", "NCCL");
  EXPECT_EQ(lib.name.rfind("NCCL 2.", 0), 0u) << lib.name;
  for (const void* entry :
       {reinterpret_cast<const void*>(lib.GetUniqueId),
        reinterpret_cast<const void*>(lib.CommInitRank),
        reinterpret_cast<const void*>(lib.CommDestroy),
        reinterpret_cast<const void*>(lib.CommAbort), reinterpret_cast<const void*>(lib.AllReduce),
        reinterpret_cast<const void*>(lib.Reduce), reinterpret_cast<const void*>(lib.Broadcast),
        reinterpret_cast<const void*>(lib.GroupStart), reinterpret_cast<const void*>(lib.GroupEnd)})
    EXPECT_NE(entry, nullptr);
  const std::string declared = header_version("/usr/local/cuda/include/nccl.h");
  if (!declared.empty()) {
    EXPECT_EQ(lib.name.rfind("NCCL " + declared + " (", 0), 0u) << lib.name << " vs " << declared;
  }
  EXPECT_STREQ(lib.GetErrorString(dist::nccl::kSuccess), "no error");
}

TEST(CollectiveLibrary, MissingLibraryIsNamed) {
  try {
    dist::load_collective_library("librccl-absent.so.7", "RCCL");
    FAIL() << "loaded a library that does not exist";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUnsupported);
    const std::string what = e.what();
    EXPECT_NE(what.find("RCCL (librccl-absent.so.7) could not be loaded"), std::string::npos)
        << what;
    EXPECT_NE(what.find("/opt/rocm/lib/librccl-absent.so.7"), std::string::npos) << what;
  }
}

// In a world of one the SIMT library's collectives leave the data as it is (a sum over one
// rank), in place or into another buffer, and refuse what it does not implement with NCCL's
// invalid-argument code.
TEST(CollectiveLibrary, SimtLibraryInAWorldOfOne) {
  std::unique_ptr<dist::Communicator> one = dist::make_single_process();
  const dist::CollectiveLibrary lib = dist::simt_collective_library(*one);
  dist::nccl::UniqueId id{};
  ASSERT_EQ(lib.GetUniqueId(&id), dist::nccl::kSuccess);
  dist::nccl::Comm comm = nullptr;
  ASSERT_EQ(lib.CommInitRank(&comm, 1, id, 0), dist::nccl::kSuccess);
  EXPECT_NE(lib.CommInitRank(&comm, 2, id, 1), dist::nccl::kSuccess);  // MPI has 1 rank
  std::vector<float> a = {1.5f, -2.0f, 3.25f}, b(3, 0.0f);
  EXPECT_EQ(
      lib.AllReduce(a.data(), b.data(), 3, dist::nccl::kFloat32, dist::nccl::kSum, comm, nullptr),
      dist::nccl::kSuccess);
  EXPECT_EQ(a, b);
  ASSERT_EQ(lib.GroupStart(), dist::nccl::kSuccess);
  EXPECT_EQ(
      lib.Reduce(a.data(), a.data(), 3, dist::nccl::kFloat32, dist::nccl::kSum, 0, comm, nullptr),
      dist::nccl::kSuccess);
  EXPECT_EQ(lib.Broadcast(a.data(), a.data(), 3, dist::nccl::kFloat32, 0, comm, nullptr),
            dist::nccl::kSuccess);
  ASSERT_EQ(lib.GroupEnd(), dist::nccl::kSuccess);
  EXPECT_EQ(a, b);
  const dist::nccl::Result r =
      lib.AllReduce(a.data(), a.data(), 3, /*ncclFloat16*/ 6, dist::nccl::kSum, comm, nullptr);
  EXPECT_NE(r, dist::nccl::kSuccess);
  EXPECT_NE(std::string(lib.GetErrorString(r)).find("ncclFloat32 only"), std::string::npos);
  EXPECT_EQ(lib.CommDestroy(comm), dist::nccl::kSuccess);
}

}  // namespace
}  // namespace ct
