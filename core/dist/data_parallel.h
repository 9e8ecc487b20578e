// What data-parallel training needs beyond the communicator: where each rank computes, the
// check that every rank was given the same run, the gradient all-reduce and the check that the
// ranks' weights stay identical.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/device.h"
#include "core/dist/communicator.h"
#include "core/tensor.h"

namespace ct::dist {

// The host threads a rank may use when `local_size` ranks share this machine: the cores the
// launcher bound it to, when that is fewer than the machine has (Open MPI binds each of a few
// ranks to a core); else the machine's cores / local_size; 0 (unchanged) for a lone unbound
// rank. *why says which.
int host_threads_for_rank(int local_size, std::string* why);

// Sets the host threads of the compute libraries, unless the user's environment fixes them:
// OpenMP (OMP_NUM_THREADS), the SIMT runtime (CT_SIMT_THREADS), lavapipe (LP_NUM_THREADS). Call
// before the backends are listed or a device is opened (they read them then). threads <= 0: no
// change.
void apply_host_threads(int threads);

// The device rank `local_rank` on this machine opens, given --backend `spec`. An explicit index
// ("vulkan:1") is kept. Otherwise ("vulkan", "cpu", "auto"): the backend's accelerators (its
// devices that are not the host CPU) are dealt out by local rank, local_rank % count; a backend
// whose devices are all the host CPU (cpu, lavapipe) gives every rank its first device, whose
// cores host_threads_for_rank() divides. *why says which.
std::string device_for_rank(const std::string& spec, int local_rank, std::string* why);

// Every rank's settings, as (flag, value) pairs in one order, compared with rank 0's.
// Error(kInvalidArgument) on every rank when one differs, naming the first rank that differs and
// each flag with both values. Collective.
void check_same_settings(Communicator& comm,
                         const std::vector<std::pair<std::string, std::string>>& flags);

// A 64-bit hash of `bytes` bytes (not cryptographic: it tells replicas apart).
uint64_t hash_bytes(const void* data, size_t bytes);

// `hash` (of this rank's weights) compared across ranks; Error(kInternal) on every rank when
// they differ, naming `when` and each rank whose hash is not rank 0's. Collective.
void check_same_weights(Communicator& comm, uint64_t hash, const std::string& when);

// One bucket of a bucketed download: floats [off, off + len) of the buffer, in host memory once
// `done` has completed.
struct Bucket {
  int64_t off, len;
  Event done;
};
// Enqueues the download of f32 `grads` into `host` (resized to fit) in buckets of at most
// `bucket_elems` floats, all at once (on a device with a real stream the later ones land while the
// earlier ones are reduced).
std::vector<Bucket> download_in_buckets(Device& device, const Tensor& grads,
                                        std::vector<float>& host, int64_t bucket_elems);

// Averages a flat f32 gradient tensor across the ranks after the backward pass: contiguous
// buckets of at most `bucket_elems` floats, each downloaded (asynchronously where the device
// can), all-reduced through host memory and uploaded back. The buckets run after the whole
// backward pass. The place for overlap is Model::backward: a bucket's all-reduce could start
// when the layers that write it are done, as PyTorch DDP's hooks do.
class GradientAverager {
 public:
  // 2^22 floats (16 MiB): a few messages for small models, 30 for GPT-2 124M.
  static constexpr int64_t kDefaultBucketElems = int64_t{1} << 22;

  GradientAverager(Communicator& comm, Device& device, int64_t bucket_elems = kDefaultBucketElems);
  // grads (=) in place: the mean of every rank's grads. Collective; every rank passes the same
  // numel. No-op (and no time) in a world of one.
  void average(const Tensor& grads);
  double seconds() const { return seconds_; }  // total time in average(), transfers included
  int64_t calls() const { return calls_; }

 private:
  Communicator& comm_;
  Device& device_;
  int64_t bucket_elems_;
  std::vector<float> host_;
  double seconds_ = 0;
  int64_t calls_ = 0;
};

}  // namespace ct::dist
