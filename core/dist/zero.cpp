#include "core/dist/zero.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "core/error.h"

namespace ct::dist {
namespace {

double since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

ShardExchange::ShardExchange(Communicator& comm, Device& device, std::vector<int64_t> bounds,
                             int64_t bucket_elems, DeviceCollectives* collectives)
    : comm_(comm),
      device_(device),
      bounds_(std::move(bounds)),
      rank_(static_cast<size_t>(comm.rank())),
      bucket_elems_(bucket_elems),
      collectives_(collectives) {
  CT_CHECK(bucket_elems > 0, "bucket of " + std::to_string(bucket_elems) + " elements");
  CT_CHECK(bounds_.size() == static_cast<size_t>(comm.size()) + 1 && bounds_.front() == 0 &&
               std::is_sorted(bounds_.begin(), bounds_.end()),
           "ZeRO shard bounds: " + std::to_string(bounds_.size()) + " for " +
               std::to_string(comm.size()) + " ranks, or not ascending from 0");
}

void ShardExchange::check(const Tensor& t, const char* what) const {
  CT_REQUIRE(t.dtype == DType::f32 && t.is_contiguous() && t.numel() == bounds_.back(),
             std::string("ZeRO ") + what + ": needs the contiguous f32 flat buffer of " +
                 std::to_string(bounds_.back()) + " elements, got " + t.describe());
}

void ShardExchange::all_gather(const Tensor& params) {
  check(params, "all-gather");
  if (collectives_) return all_gather_on_device(params);
  if (comm_.size() == 1) return;
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t n = params.numel();
  host_.resize(static_cast<size_t>(n));
  if (end() > begin())
    device_.download(host_.data() + begin(), params.slice_flat(begin(), {end() - begin()}),
                     static_cast<size_t>(end() - begin()) * sizeof(float));
  for (int64_t off = 0; off < n; off += bucket_elems_) {
    const int64_t len = std::min(bucket_elems_, n - off);
    comm_.all_gather(host_.data() + off, shard_counts(bounds_, off, len));
    // The other ranks' parts of the bucket: before and after this rank's shard.
    const int64_t own_from = std::clamp(begin(), off, off + len);
    const int64_t own_to = std::clamp(end(), off, off + len);
    for (auto [from, to] : {std::pair{off, own_from}, std::pair{own_to, off + len}})
      if (to > from)
        device_.upload(params.slice_flat(from, {to - from}), host_.data() + from,
                       static_cast<size_t>(to - from) * sizeof(float));
  }
  seconds_ += since(t0);
}

void ShardExchange::all_gather_on_device(const Tensor& params) {
  StreamClock clock(device_);
  const size_t before = clock.mark();
  for (int64_t off = 0; off < params.numel(); off += bucket_elems_) {
    const int64_t len = std::min(bucket_elems_, params.numel() - off);
    collectives_->all_gather(params.slice_flat(off, {len}), shard_counts(bounds_, off, len));
  }
  const size_t after = clock.mark();
  collectives_->wait(clock);
  seconds_ += std::chrono::duration<double>(clock.at(after) - clock.at(before)).count();
}

}  // namespace ct::dist
