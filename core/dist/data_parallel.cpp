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

GradientAverager::GradientAverager(Communicator& comm, Device& device, int64_t bucket_elems)
    : comm_(comm), device_(device), bucket_elems_(bucket_elems) {
  CT_CHECK(bucket_elems > 0, "bucket of " + std::to_string(bucket_elems) + " elements");
}

std::vector<Bucket> download_in_buckets(Device& device, const Tensor& grads,
                                        std::vector<float>& host, int64_t bucket_elems) {
  const int64_t n = grads.numel();
  host.resize(static_cast<size_t>(n));
  std::vector<Bucket> buckets;
  for (int64_t off = 0; off < n; off += bucket_elems) {
    const int64_t len = std::min(bucket_elems, n - off);
    buckets.push_back({off, len,
                       device.download_async(host.data() + off, grads.slice_flat(off, {len}),
                                             static_cast<size_t>(len) * sizeof(float))});
  }
  return buckets;
}

void GradientAverager::average(const Tensor& grads) {
  if (comm_.size() == 1) return;
  CT_REQUIRE(grads.dtype == DType::f32 && grads.is_contiguous(),
             "gradient all-reduce: needs contiguous f32 gradients, got " + grads.describe());
  const auto t0 = std::chrono::steady_clock::now();
  for (const Bucket& k : download_in_buckets(device_, grads, host_, bucket_elems_)) {
    const int64_t off = k.off, len = k.len;
    device_.wait_event(k.done);
    comm_.all_reduce(host_.data() + off, static_cast<size_t>(len), ReduceOp::kAverage);
    device_.upload(grads.slice_flat(off, {len}), host_.data() + off,
                   static_cast<size_t>(len) * sizeof(float));
  }
  seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ++calls_;
}

}  // namespace ct::dist
