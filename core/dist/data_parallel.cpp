#include "core/dist/data_parallel.h"

#include <omp.h>
#include <sched.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "core/error.h"
#include "core/registry.h"

namespace ct::dist {
namespace {

// The cores this process may run on (its affinity mask), and the machine's.
int allowed_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) return 0;
  return CPU_COUNT(&set);
}

}  // namespace

int host_threads_for_rank(int local_size, std::string* why) {
  const int cores = allowed_cores();
  const int machine = static_cast<int>(std::thread::hardware_concurrency());
  if (cores > 0 && cores < machine) {
    *why = "bound by the launcher to " + std::to_string(cores) + " of " + std::to_string(machine) +
           " cores";
    return cores;
  }
  if (local_size > 1 && machine > 0) {
    *why = std::to_string(machine) + " cores / " + std::to_string(local_size) + " local ranks";
    return std::max(1, machine / local_size);
  }
  *why = "the process's default";
  return 0;
}

std::string device_for_rank(const std::string& spec, int local_rank, std::string* why) {
  std::string name = spec;
  if (spec == "auto") {
    const std::string chosen = choose_auto_device(nullptr);
    name = chosen.substr(0, chosen.find(':'));
  }
  if (name.find(':') != std::string::npos) {
    *why = "--backend " + spec + " as given";
    return spec;
  }
  std::vector<int> accelerators;
  for (const BackendEntry& e : backends()) {
    if (e.name != name || !e.backend || !e.error.empty()) continue;
    const std::vector<DeviceInfo> devs = e.backend->devices();
    for (size_t i = 0; i < devs.size(); ++i)
      if (devs[i].type != DeviceType::kCpu) accelerators.push_back(static_cast<int>(i));
  }
  // Also an unknown or unavailable backend: open_device() then names it and what there is.
  if (accelerators.empty()) {
    *why = "the host's device, shared by the local ranks";
    return name + ":0";
  }
  const int pick = local_rank % static_cast<int>(accelerators.size());
  *why = "local rank " + std::to_string(local_rank) + " mod " +
         std::to_string(accelerators.size()) + " device(s)";
  return name + ":" + std::to_string(accelerators[pick]);
}

void apply_host_threads(int threads) {
  if (threads <= 0) return;
  const std::string n = std::to_string(threads);
  if (!std::getenv("OMP_NUM_THREADS")) omp_set_num_threads(threads);
  setenv("CT_SIMT_THREADS", n.c_str(), /*overwrite=*/0);
  setenv("LP_NUM_THREADS", n.c_str(), /*overwrite=*/0);
}

void check_same_settings(Communicator& comm,
                         const std::vector<std::pair<std::string, std::string>>& flags) {
  if (comm.size() == 1) return;
  std::string mine;
  for (const auto& [flag, value] : flags) mine += flag + '\0' + value + '\0';
  const std::vector<std::string> all = comm.all_gather(mine);
  for (int r = 1; r < comm.size(); ++r) {
    if (all[r] == all[0]) continue;
    // Split rank r's list back into pairs and name every flag whose value differs.
    auto parse = [](const std::string& s) {
      std::vector<std::pair<std::string, std::string>> out;
      for (size_t i = 0; i < s.size();) {
        size_t a = s.find('\0', i), b = s.find('\0', a + 1);
        out.emplace_back(s.substr(i, a - i), s.substr(a + 1, b - a - 1));
        i = b + 1;
      }
      return out;
    };
    const auto theirs = parse(all[r]), first = parse(all[0]);
    std::string diff;
    for (size_t i = 0; i < theirs.size() && i < first.size(); ++i)
      if (theirs[i] != first[i])
        diff += (diff.empty() ? "" : "; ") + theirs[i].first + " '" + theirs[i].second +
                "' where rank 0 has '" + first[i].second + "'";
    if (theirs.size() != first.size())
      diff += (diff.empty() ? "" : "; ") + std::string("a different list of settings (") +
              std::to_string(theirs.size()) + " vs " + std::to_string(first.size()) +
              "): ranks of different crosstrain versions";
    fail(ErrorKind::kInvalidArgument,
         "rank " + std::to_string(r) + " of " + std::to_string(comm.size()) +
             " was given another run than rank 0: " + diff +
             ". Every rank must train the same model on the same data with the same settings");
  }
}

uint64_t hash_bytes(const void* data, size_t bytes) {
  // FNV-1a over 8-byte words, then a final avalanche (splitmix64's).
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t h = 0xcbf29ce484222325ull ^ bytes;
  size_t i = 0;
  for (; i + 8 <= bytes; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    h = (h ^ w) * 0x100000001b3ull;
  }
  for (; i < bytes; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  h ^= h >> 30;
  h *= 0xbf58476d1ce4e5b9ull;
  h ^= h >> 27;
  h *= 0x94d049bb133111ebull;
  return h ^ (h >> 31);
}

void check_same_weights(Communicator& comm, uint64_t hash, const std::string& when) {
  if (comm.size() == 1) return;
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(hash));
  const std::vector<std::string> all = comm.all_gather(text);
  std::string differ;
  for (int r = 1; r < comm.size(); ++r)
    if (all[r] != all[0]) differ += (differ.empty() ? "" : ", ") + std::to_string(r) + " " + all[r];
  if (!differ.empty())
    fail(ErrorKind::kInternal, "the ranks' weights differ " + when + ": rank 0 has hash " + all[0] +
                                   ", rank(s) " + differ +
                                   " another. Data-parallel replicas must stay identical; a rank "
                                   "computed its update differently (another device or build?)");
}

std::vector<size_t> shard_counts(const std::vector<int64_t>& bounds, int64_t off, int64_t len) {
  std::vector<size_t> c(bounds.size() - 1);
  for (size_t r = 0; r < c.size(); ++r) {
    const int64_t from = std::max(bounds[r], off), to = std::min(bounds[r + 1], off + len);
    c[r] = to > from ? static_cast<size_t>(to - from) : 0;
  }
  return c;
}

GradientAverager::GradientAverager(Communicator& comm, Device& device, int64_t bucket_elems,
                                   std::vector<int64_t> shard_bounds,
                                   DeviceCollectives* collectives)
    : comm_(comm),
      device_(device),
      bucket_elems_(bucket_elems),
      shard_bounds_(std::move(shard_bounds)),
      collectives_(collectives),
      clock_(device) {
  CT_CHECK(bucket_elems > 0, "bucket of " + std::to_string(bucket_elems) + " elements");
  CT_CHECK(shard_bounds_.empty() || (shard_bounds_.size() == static_cast<size_t>(comm.size()) + 1 &&
                                     shard_bounds_.front() == 0 &&
                                     std::is_sorted(shard_bounds_.begin(), shard_bounds_.end())),
           "ZeRO shard bounds: " + std::to_string(shard_bounds_.size()) + " for " +
               std::to_string(comm.size()) + " ranks, or not ascending from 0");
}

void GradientAverager::begin(const Tensor& grads) {
  if (comm_.size() == 1 && !collectives_) return;
  CT_REQUIRE(grads.dtype == DType::f32 && grads.is_contiguous(),
             "gradient all-reduce: needs contiguous f32 gradients, got " + grads.describe());
  CT_CHECK(!grads_.defined(), "GradientAverager::begin twice without finish");
  CT_CHECK(shard_bounds_.empty() || shard_bounds_.back() == grads.numel(),
           "ZeRO reduce-scatter of " + grads.describe() + " with shards of " +
               std::to_string(shard_bounds_.back()) + " elements in all");
  grads_ = grads;
  const int64_t n = grads.numel();
  if (!collectives_) host_.resize(static_cast<size_t>(n));
  slots_.clear();
  for (int64_t off = 0; off < n; off += bucket_elems_) {
    const int64_t len = std::min(bucket_elems_, n - off);
    slots_.push_back({off, len, len, Event(), 0});
  }
  downloading_.clear();
  started_ = 0;
  clock_.clear();
  enqueued_.clear();
}

void GradientAverager::ready(int64_t off, int64_t len) {
  if (!grads_.defined() || len <= 0) return;
  CT_CHECK(off >= 0 && off + len <= grads_.numel(), "gradients [" + std::to_string(off) + ", +" +
                                                        std::to_string(len) + ") reported of " +
                                                        std::to_string(grads_.numel()));
  for (auto k = static_cast<size_t>(off / bucket_elems_);
       k < slots_.size() && slots_[k].off < off + len; ++k) {
    Slot& s = slots_[k];
    s.missing -= std::min(s.off + s.len, off + len) - std::max(s.off, off);
    CT_CHECK(s.missing >= 0, "gradients [" + std::to_string(off) + ", +" + std::to_string(len) +
                                 ") reported twice");
    if (s.missing == 0) launch(k);
  }
  if (collectives_)
    clock_.poll();
  else
    start_landed(/*block=*/false);
}

void GradientAverager::launch(size_t k) {
  slots_[k].missing = 0;
  if (collectives_)
    enqueue_collective(k);
  else
    download(k);
}

void GradientAverager::enqueue_collective(size_t k) {
  const Slot& s = slots_[k];
  const size_t before = clock_.mark();
  const Tensor bucket = grads_.slice_flat(s.off, {s.len});
  if (shard_bounds_.empty())
    collectives_->all_reduce(bucket, ReduceOp::kAverage);
  else
    collectives_->reduce_scatter(bucket, shard_counts(shard_bounds_, s.off, s.len),
                                 ReduceOp::kAverage);
  enqueued_.emplace_back(before, clock_.mark());
}

void GradientAverager::download(size_t k) {
  Slot& s = slots_[k];
  s.done = device_.download_async(host_.data() + s.off, grads_.slice_flat(s.off, {s.len}),
                                  static_cast<size_t>(s.len) * sizeof(float));
  downloading_.push_back(k);
}

void GradientAverager::start_landed(bool block) {
  for (; started_ < downloading_.size(); ++started_) {
    Slot& s = slots_[downloading_[started_]];
    if (block)
      device_.wait_event(s.done);
    else if (!device_.event_done(s.done))
      return;
    float* data = host_.data() + s.off;
    s.ticket = shard_bounds_.empty()
                   ? comm_.start_all_reduce(data, static_cast<size_t>(s.len), ReduceOp::kAverage)
                   : comm_.start_reduce_scatter(data, shard_counts(shard_bounds_, s.off, s.len),
                                                ReduceOp::kAverage);
  }
}

void GradientAverager::upload(const Slot& s) {
  int64_t from = s.off, to = s.off + s.len;
  if (!shard_bounds_.empty()) {  // this rank's part of the bucket, averaged
    const auto rank = static_cast<size_t>(comm_.rank());
    from = std::max(shard_bounds_[rank], from);
    to = std::min(shard_bounds_[rank + 1], to);
  }
  if (to > from)
    device_.upload(grads_.slice_flat(from, {to - from}), host_.data() + from,
                   static_cast<size_t>(to - from) * sizeof(float));
}

void GradientAverager::finish_on_device() {
  // The backward pass is over once the stream has reached this point.
  const size_t backward_done = clock_.mark();
  for (size_t k = 0; k < slots_.size(); ++k)
    if (slots_[k].missing > 0) launch(k);
  collectives_->wait(clock_);
  for (const auto& [before, after] : enqueued_) {
    const double took = std::chrono::duration<double>(clock_.at(after) - clock_.at(before)).count();
    seconds_ += took;
    overlap_seconds_ += std::clamp(
        std::chrono::duration<double>(clock_.at(backward_done) - clock_.at(before)).count(), 0.0,
        took);
  }
  grads_ = Tensor();
  ++calls_;
}

void GradientAverager::finish() {
  if (!grads_.defined()) return;
  if (collectives_) return finish_on_device();
  using Clock = std::chrono::steady_clock;
  start_landed(/*block=*/false);
  // The backward pass is over once the device has run every op enqueued so far.
  const Event backward_done = device_.record_event();
  for (size_t k = 0; k < slots_.size(); ++k)
    if (slots_[k].missing > 0) launch(k);
  device_.wait_event(backward_done);
  const Clock::time_point backward_end = Clock::now();
  start_landed(/*block=*/true);
  for (size_t k : downloading_) {
    const Communicator::Ran ran = comm_.wait(slots_[k].ticket);
    const double took = std::chrono::duration<double>(ran.end - ran.start).count();
    seconds_ += took;
    overlap_seconds_ +=
        std::clamp(std::chrono::duration<double>(backward_end - ran.start).count(), 0.0, took);
  }
  const Clock::time_point t0 = Clock::now();
  for (const Slot& s : slots_) upload(s);
  seconds_ += std::chrono::duration<double>(Clock::now() - t0).count();
  grads_ = Tensor();
  ++calls_;
}

}  // namespace ct::dist
