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
#include "core/dist/device_collectives.h"
#include "core/dist/stream_clock.h"
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

// Each rank's elements of [off, off + len) when rank r owns [bounds[r], bounds[r + 1]), in rank
// order (they add up to len): the counts of a reduce-scatter or all-gather of that bucket.
std::vector<size_t> shard_counts(const std::vector<int64_t>& bounds, int64_t off, int64_t len);

// Averages a flat f32 gradient tensor across the ranks: contiguous buckets of at most
// `bucket_elems` floats, each downloaded (asynchronously where the device can), all-reduced
// through host memory (Communicator::start_all_reduce, on the MPI communicator's own thread)
// and uploaded back. With ZeRO stage 1's shard bounds each bucket is reduce-scattered instead,
// and only this rank's shard of it comes back.
//
// Overlap with the backward pass, as PyTorch DDP's hooks do: begin() before the backward pass
// that finishes the gradients (with accumulation the last micro-batch's), ready() whenever it
// reports a range final (Model::set_gradients_ready), finish() after it. A bucket whose every
// element has been reported is downloaded then and its collective started as soon as its
// download has landed, while the backward goes on; finish() starts the rest in order, waits for
// all and uploads them. average() is begin() and finish(): every bucket after the backward pass.
// Either way the buckets and each one's reduction are the same, so are the results, bit for bit.
//
// With device collectives (--ddp-backend nccl: NCCL, RCCL, the SIMT runtime's) a bucket is not
// downloaded: its collective is enqueued on the device's stream, in place, when it is complete
// (the same points as above), and its averaging kernel after it; finish() enqueues the rest
// (later ops on the stream, the optimizer's, run after them) and polls until the stream has run
// them, as the host path waits for its uploads there: a StreamClock times each bucket from the
// moment the stream reached it to the moment it was done. On a GPU the collective's kernels take
// their turn on the one stream between the backward's kernels (interleaved, not concurrent with
// them: comm_overlap_s is the collectives' time before the backward's last kernel had run, which
// the host did not wait for). With 2 ranks the sums are a + b as MPI's, and the averaging the same
// multiply: bit for bit the host path's.
class GradientAverager {
 public:
  // 2^22 floats (16 MiB): a few messages for small models, 30 for GPT-2 124M.
  static constexpr int64_t kDefaultBucketElems = int64_t{1} << 22;

  // `shard_bounds`: empty (all-reduce), or comm.size() + 1 offsets as ShardExchange's.
  // `collectives`: the device path (nullptr: the host path); it must outlive this averager.
  GradientAverager(Communicator& comm, Device& device, int64_t bucket_elems = kDefaultBucketElems,
                   std::vector<int64_t> shard_bounds = {},
                   DeviceCollectives* collectives = nullptr);
  // grads (=) in place: the mean of every rank's grads (with shard bounds: in this rank's
  // shard; the rest unspecified). Collective; every rank passes the same numel and reports the
  // same ranges in the same order. No-op (and no time) in a world of one on the host path.
  void begin(const Tensor& grads);
  void ready(int64_t off, int64_t len);
  void finish();
  void average(const Tensor& grads) {
    begin(grads);
    finish();
  }
  // Seconds the buckets' collectives ran (on the communicator's thread, waiting for the other
  // ranks included), plus finish()'s uploads; and the part of the collectives' time before the
  // backward pass was over (when the device had run every op enqueued before finish()). Totals
  // over every call.
  double seconds() const { return seconds_; }
  double overlap_seconds() const { return overlap_seconds_; }
  int64_t calls() const { return calls_; }

 private:
  struct Slot {
    int64_t off, len;
    int64_t missing;  // elements not reported yet
    Event done;       // its download
    uint64_t ticket;  // its collective, once started
  };
  // Bucket k is complete: its download (host path) or its collective (device path) is enqueued.
  void launch(size_t k);
  void download(size_t k);
  void enqueue_collective(size_t k);
  void finish_on_device();
  // Starts the collectives of the downloaded buckets, in download order, while the oldest one
  // has landed (every one when `block`, waiting for each).
  void start_landed(bool block);
  void upload(const Slot& s);

  Communicator& comm_;
  Device& device_;
  int64_t bucket_elems_;
  std::vector<int64_t> shard_bounds_;
  Tensor grads_;  // of the pass between begin() and finish(); undefined outside
  std::vector<float> host_;
  std::vector<Slot> slots_;
  std::vector<size_t> downloading_;  // buckets downloading, in order; the first started_ started
  // The device path: the collectives, and for each enqueued bucket its StreamClock marks before
  // and after it, in enqueue order.
  DeviceCollectives* collectives_;
  StreamClock clock_;
  std::vector<std::pair<size_t, size_t>> enqueued_;
  size_t started_ = 0;
  double seconds_ = 0, overlap_seconds_ = 0;
  int64_t calls_ = 0;
};

}  // namespace ct::dist
