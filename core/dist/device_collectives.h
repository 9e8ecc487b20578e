// Data parallel's collectives on device memory (--ddp-backend nccl): one communicator of a
// collective library with NCCL's API (core/dist/collective_library.h: NCCL on CUDA, RCCL on
// HIP, the SIMT runtime's over MPI on simt) spanning every rank's device, its unique id
// broadcast through the run's Communicator. Each collective runs in place on a tensor's device
// memory, enqueued on the device's own stream after the ops enqueued before it: no host copy,
// no host wait. The alternative (--ddp-backend mpi, and every device without such a library):
// GradientAverager's host path, MPI on downloaded buffers.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/dist/collective_library.h"
#include "core/dist/communicator.h"
#include "core/dist/stream_clock.h"
#include "core/tensor.h"

namespace ct::dist {

class DeviceCollectives {
 public:
  // The library's communicator over comm's ranks, each on its `device`. Collective: every rank
  // calls it at the same point. Error(kDevice) naming the call and the library's message.
  DeviceCollectives(Communicator& comm, Device& device, CollectiveLibrary library);
  ~DeviceCollectives();
  DeviceCollectives(const DeviceCollectives&) = delete;
  DeviceCollectives& operator=(const DeviceCollectives&) = delete;

  const std::string& name() const { return lib_.name; }
  // How long a rank waits for its enqueued collectives before wait() throws (--ddp-timeout);
  // <= 0: forever. Default 1800 s, as the Communicator's.
  void set_timeout(double seconds) { timeout_s_ = seconds; }
  // Returns once `clock` has stamped every mark (the collectives enqueued before its last one
  // have run); Error(kDevice) after the timeout, saying that another rank hangs or died. A
  // collective library's kernels wait on the device for the other ranks: without this, a hung
  // rank would hold the others forever.
  void wait(StreamClock& clock) const;

  // Enqueued on the device's stream, in call order; every rank makes the same calls in the same
  // order with the same counts. `t`: contiguous f32 on this device.
  // t (=) the element-wise sum over the ranks (kAverage: then times 1 / size(), the Device's
  // scale op, as the MPI path multiplies: bit for bit the same with 2 ranks).
  void all_reduce(const Tensor& t, ReduceOp op);
  // t's part of rank r is counts[r] elements, in rank order (Communicator::reduce_scatter's
  // layout); this rank's part (=) the sum (or average) of every rank's there; the rest of t is
  // left as it was. A group of one in-place reduce per rank: NCCL's own reduce-scatter wants
  // equal parts, and ZeRO's shards are not.
  void reduce_scatter(const Tensor& t, const std::vector<size_t>& counts, ReduceOp op);
  // Every rank's part of t (=) its owner's: a group of one in-place broadcast per rank.
  void all_gather(const Tensor& t, const std::vector<size_t>& counts);

 private:
  void check(nccl::Result r, const char* call) const;
  float* address(const Tensor& t) const;

  Communicator& comm_;
  Device& device_;
  CollectiveLibrary lib_;
  nccl::Comm nccl_comm_ = nullptr;
  double timeout_s_ = 1800;
};

// --ddp-backend (Hugging Face's ddp_backend): "auto", "mpi" or "nccl" (RCCL on HIP, as PyTorch
// names it too).
struct DdpBackend {
  std::unique_ptr<DeviceCollectives> device;  // nullptr: the MPI host path
  std::string name;                           // "nccl" or "mpi", as metrics.jsonl says
  std::string why;                            // the choice, for the start-up line
};

// The collectives for `device` given --ddp-backend `flag`. The device's library is the one its
// DeviceInfo::extra names as "collective library" (cuda: libnccl.so.2, hip: librccl.so.1, simt:
// the built-in one); cpu and vulkan have none.
//   auto: the device's library where it has one and it loads, with more than one rank (a world of
//         one has nothing to reduce); else MPI, *why saying what was missing.
//   nccl: the device's library, also in a world of one (its collectives then run over one rank);
//         Error(kInvalidArgument) naming the device when it has none, Error(kUnsupported) naming
//         the library when it does not load.
//   mpi:  the host path.
// Collective (the library's communicator is made on every rank); every rank passes the same flag
// and has the same kind of device.
DdpBackend choose_ddp_backend(Communicator& comm, Device& device, const std::string& flag);

}  // namespace ct::dist
