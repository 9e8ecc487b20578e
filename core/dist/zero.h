// ZeRO stage 1's traffic (--zero-stage 1): each rank keeps optimizer state for one contiguous
// shard of the flat trainable parameters (the partition rule: zero_partition in
// core/train/optimizer.h). The gradients are reduce-scattered in buckets by GradientAverager
// given the shard bounds (overlapping the backward pass as its all-reduce does), so each rank
// holds the average of its own shard; after the update of its shard, the weights are
// all-gathered here, so every rank holds all of them again, through host memory in buckets of
// the same size. Together the two move the bytes of one all-reduce. With device collectives
// (--ddp-backend nccl) the all-gather runs in place on the device instead, one grouped broadcast
// per bucket enqueued on its stream, and all_gather() returns once the stream has run them (so
// that seconds() times them; see StreamClock).
#pragma once

#include <cstdint>
#include <vector>

#include "core/device.h"
#include "core/dist/communicator.h"
#include "core/dist/data_parallel.h"
#include "core/tensor.h"

namespace ct::dist {

class ShardExchange {
 public:
  // `bounds`: comm.size() + 1 offsets into the flat buffers, rank r's shard [bounds[r],
  // bounds[r + 1]), bounds[0] = 0 and bounds.back() their numel.
  // `collectives`: the device path (nullptr: through host memory); it must outlive this object.
  ShardExchange(Communicator& comm, Device& device, std::vector<int64_t> bounds,
                int64_t bucket_elems = GradientAverager::kDefaultBucketElems,
                DeviceCollectives* collectives = nullptr);
  // Every other rank's shard of params (=) that rank's; this rank's shard is sent. Collective.
  void all_gather(const Tensor& params);
  int64_t begin() const { return bounds_[rank_]; }
  int64_t end() const { return bounds_[rank_ + 1]; }
  const std::vector<int64_t>& bounds() const { return bounds_; }
  double seconds() const { return seconds_; }  // total time in all_gather, transfers included

 private:
  void check(const Tensor& t, const char* what) const;
  void all_gather_on_device(const Tensor& params);

  Communicator& comm_;
  Device& device_;
  std::vector<int64_t> bounds_;
  size_t rank_;
  int64_t bucket_elems_;
  std::vector<float> host_;
  DeviceCollectives* collectives_;
  double seconds_ = 0;
};

}  // namespace ct::dist
