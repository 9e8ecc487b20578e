// ZeRO stage 1's traffic (--zero-stage 1): each rank keeps optimizer state for one contiguous
// shard of the flat trainable parameters (the partition rule: zero_partition in
// core/train/optimizer.h). After the backward pass the gradients are reduce-scattered, so each
// rank holds the average of its own shard; after the update of its shard, the weights are
// all-gathered, so every rank holds all of them again. Both through host memory in buckets, as
// GradientAverager does; together they move the bytes of one all-reduce.
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
  ShardExchange(Communicator& comm, Device& device, std::vector<int64_t> bounds,
                int64_t bucket_elems = GradientAverager::kDefaultBucketElems);
  // This rank's shard of grads (=) the mean of every rank's grads there; the rest of grads is
  // left as it is. Collective.
  void reduce_scatter(const Tensor& grads);
  // Every other rank's shard of params (=) that rank's; this rank's shard is sent. Collective.
  void all_gather(const Tensor& params);
  int64_t begin() const { return bounds_[rank_]; }
  int64_t end() const { return bounds_[rank_ + 1]; }
  double seconds() const { return seconds_; }  // total time in both, transfers included

 private:
  // Each rank's elements of the bucket [off, off + len), in rank order (they add up to len).
  std::vector<size_t> counts(int64_t off, int64_t len) const;
  void check(const Tensor& t, const char* what) const;

  Communicator& comm_;
  Device& device_;
  std::vector<int64_t> bounds_;
  size_t rank_;
  int64_t bucket_elems_;
  std::vector<float> host_;
  double seconds_ = 0;
};

}  // namespace ct::dist
