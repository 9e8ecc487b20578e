#include "core/dist/device_collectives.h"

#include <cstring>
#include <exception>
#include <utility>

#include "core/error.h"

namespace ct::dist {
namespace {

size_t offset_of(const std::vector<size_t>& counts, size_t rank) {
  size_t off = 0;
  for (size_t r = 0; r < rank; ++r) off += counts[r];
  return off;
}

// The device's collective library as its DeviceInfo::extra names it; "" where it names none.
std::string library_of(const DeviceInfo& info) {
  for (const auto& [key, value] : info.extra)
    if (key == "collective library") return value;
  return "";
}

}  // namespace

DeviceCollectives::DeviceCollectives(Communicator& comm, Device& device, CollectiveLibrary library)
    : comm_(comm), device_(device), lib_(std::move(library)) {
  nccl::UniqueId id{};
  if (comm.rank() == 0) check(lib_.GetUniqueId(&id), "ncclGetUniqueId");
  comm.broadcast(&id, sizeof id, 0);
  check(lib_.CommInitRank(&nccl_comm_, comm.size(), id, comm.rank()), "ncclCommInitRank");
}

DeviceCollectives::~DeviceCollectives() {
  if (!nccl_comm_) return;
  // Leaving on an error (a timeout: a collective may wait forever on the device for a rank that
  // hangs): abort the communicator, which ends its kernels, instead of waiting for them.
  if (std::uncaught_exceptions() > 0) {
    lib_.CommAbort(nccl_comm_);
    return;
  }
  // Destroy waits for the communicator's enqueued work; the device may be in an error state.
  try {
    device_.synchronize();
    lib_.CommDestroy(nccl_comm_);
  } catch (...) {
    lib_.CommAbort(nccl_comm_);
  }
}

void DeviceCollectives::check(nccl::Result r, const char* call) const {
  if (r == nccl::kSuccess) return;
  fail(ErrorKind::kDevice, std::string(call) + " (" + lib_.name + ") on rank " +
                               std::to_string(comm_.rank()) + " failed: " + lib_.GetErrorString(r) +
                               " (result " + std::to_string(r) + ")");
}

void DeviceCollectives::wait(StreamClock& clock) const {
  if (clock.wait_all(timeout_s_)) return;
  fail(ErrorKind::kDevice, "rank " + std::to_string(comm_.rank()) + " waited " +
                               std::to_string(static_cast<long long>(timeout_s_)) +
                               " s for its collectives (" + lib_.name + ") on " +
                               device_.info().id() + ": one of the other " +
                               std::to_string(comm_.size() - 1) +
                               " rank(s) hangs or has died (--ddp-timeout); stopping every rank");
}

float* DeviceCollectives::address(const Tensor& t) const {
  CT_REQUIRE(
      t.dtype == DType::f32 && t.is_contiguous() && t.buffer && &t.buffer->device() == &device_,
      "device collective: needs a contiguous f32 tensor on " + device_.info().id() + ", got " +
          t.describe());
  void* p = device_.native_address(t);
  CT_CHECK(p != nullptr, device_.info().id() + " gives no device address for " + lib_.name);
  return static_cast<float*>(p);
}

void DeviceCollectives::all_reduce(const Tensor& t, ReduceOp op) {
  if (t.numel() == 0) return;
  float* p = address(t);
  check(lib_.AllReduce(p, p, static_cast<size_t>(t.numel()), nccl::kFloat32, nccl::kSum, nccl_comm_,
                       device_.native_stream()),
        "ncclAllReduce");
  if (op == ReduceOp::kAverage) device_.scale(t, 1.0f / static_cast<float>(comm_.size()));
}

void DeviceCollectives::reduce_scatter(const Tensor& t, const std::vector<size_t>& counts,
                                       ReduceOp op) {
  CT_CHECK(counts.size() == static_cast<size_t>(comm_.size()) &&
               offset_of(counts, counts.size()) == static_cast<size_t>(t.numel()),
           "device reduce-scatter of " + t.describe() + " in " + std::to_string(counts.size()) +
               " parts");
  float* p = address(t);
  check(lib_.GroupStart(), "ncclGroupStart");
  for (size_t r = 0; r < counts.size(); ++r) {
    if (counts[r] == 0) continue;
    float* part = p + offset_of(counts, r);
    check(lib_.Reduce(part, part, counts[r], nccl::kFloat32, nccl::kSum, static_cast<int>(r),
                      nccl_comm_, device_.native_stream()),
          "ncclReduce");
  }
  check(lib_.GroupEnd(), "ncclGroupEnd");
  const auto me = static_cast<size_t>(comm_.rank());
  if (op == ReduceOp::kAverage && counts[me] > 0)
    device_.scale(t.slice_flat(static_cast<int64_t>(offset_of(counts, me)),
                               {static_cast<int64_t>(counts[me])}),
                  1.0f / static_cast<float>(comm_.size()));
}

void DeviceCollectives::all_gather(const Tensor& t, const std::vector<size_t>& counts) {
  CT_CHECK(
      counts.size() == static_cast<size_t>(comm_.size()) &&
          offset_of(counts, counts.size()) == static_cast<size_t>(t.numel()),
      "device all-gather of " + t.describe() + " in " + std::to_string(counts.size()) + " parts");
  float* p = address(t);
  check(lib_.GroupStart(), "ncclGroupStart");
  for (size_t r = 0; r < counts.size(); ++r) {
    if (counts[r] == 0) continue;
    float* part = p + offset_of(counts, r);
    check(lib_.Broadcast(part, part, counts[r], nccl::kFloat32, static_cast<int>(r), nccl_comm_,
                         device_.native_stream()),
          "ncclBroadcast");
  }
  check(lib_.GroupEnd(), "ncclGroupEnd");
}

DdpBackend choose_ddp_backend(Communicator& comm, Device& device, const std::string& flag) {
  DdpBackend b;
  b.name = "mpi";
  const std::string id = device.info().id();
  if (flag == "mpi") {
    b.why = "--ddp-backend mpi";
    return b;
  }
  const bool forced = flag == "nccl";
  CT_REQUIRE(forced || flag == "auto", "--ddp-backend '" + flag + "': auto, mpi or nccl");
  const std::string library = library_of(device.info());
  if (library.empty()) {
    if (forced)
      fail(ErrorKind::kInvalidArgument,
           "--ddp-backend nccl: " + id + " has no device collective library (NCCL is for cuda, " +
               "RCCL for hip, the SIMT runtime's for simt); use --ddp-backend mpi or auto");
    b.why = id + " has no device collective library";
    return b;
  }
  if (!forced && comm.size() == 1) {
    b.why = "a world of one: nothing to reduce";
    return b;
  }
  CollectiveLibrary lib;
  if (library == kSimtCollectives) {
    lib = simt_collective_library(comm);
  } else {
    const std::string label = library.rfind("librccl", 0) == 0 ? "RCCL" : "NCCL";
    try {
      lib = load_collective_library(library, label);
    } catch (const Error& e) {
      if (forced) throw;
      b.why = std::string(e.what()) + "; --ddp-backend nccl would stop here";
      return b;
    }
  }
  b.device = std::make_unique<DeviceCollectives>(comm, device, std::move(lib));
  b.name = "nccl";
  b.why =
      (forced ? "--ddp-backend nccl" : "auto") + std::string(", in place on ") + id + "'s stream";
  return b;
}

}  // namespace ct::dist
