#include "core/dist/communicator.h"

#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include "core/error.h"
#if CT_HAVE_MPI
#include "core/dist/mpi_communicator.h"
#endif

namespace ct::dist {
namespace {

class SingleProcess final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  int local_rank() const override { return 0; }
  int local_size() const override { return 1; }
  std::string host() const override {
    char name[256] = {};
    gethostname(name, sizeof name - 1);
    return name;
  }
  std::string transport() const override { return "single process"; }
  void all_reduce(float*, size_t, ReduceOp) override {}
  void all_reduce(double*, size_t, ReduceOp) override {}
  void reduce_scatter(float*, const std::vector<size_t>& counts, ReduceOp) override {
    CT_CHECK(counts.size() == 1,
             "reduce_scatter with " + std::to_string(counts.size()) + " counts in a world of 1");
  }
  void all_gather(float*, const std::vector<size_t>& counts) override {
    CT_CHECK(counts.size() == 1,
             "all_gather with " + std::to_string(counts.size()) + " counts in a world of 1");
  }
  void broadcast(void*, size_t, int root) override {
    CT_CHECK(root == 0, "broadcast from rank " + std::to_string(root) + " of 1");
  }
  std::vector<std::string> all_gather(const std::string& mine) override { return {mine}; }
  void barrier() override {}
  void set_timeout(double) override {}
  void abort(int) override {}
};

// A positive integer from the environment variable `name`, or 0 when unset or not one.
int env_count(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) return 0;
  char* end = nullptr;
  long n = std::strtol(v, &end, 10);
  return *end == '\0' && n > 0 && n < (1 << 30) ? static_cast<int>(n) : 0;
}

std::unique_ptr<Communicator>& world_slot() {
  static std::unique_ptr<Communicator> w;
  return w;
}

}  // namespace

uint64_t Communicator::start_all_reduce(float* data, size_t count, ReduceOp op) {
  const auto start = std::chrono::steady_clock::now();
  all_reduce(data, count, op);
  ran_[++tickets_] = {start, std::chrono::steady_clock::now()};
  return tickets_;
}

uint64_t Communicator::start_reduce_scatter(float* data, const std::vector<size_t>& counts,
                                            ReduceOp op) {
  const auto start = std::chrono::steady_clock::now();
  reduce_scatter(data, counts, op);
  ran_[++tickets_] = {start, std::chrono::steady_clock::now()};
  return tickets_;
}

Communicator::Ran Communicator::wait(uint64_t ticket) {
  auto it = ran_.find(ticket);
  CT_CHECK(it != ran_.end(), "wait for collective " + std::to_string(ticket) +
                                 ", which was not started or was waited for already");
  const Ran ran = it->second;
  ran_.erase(it);
  return ran;
}

std::unique_ptr<Communicator> make_single_process() {
  return std::make_unique<SingleProcess>();
}

Launch detect_launch() {
  Launch l;
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"}) {
    if (int n = env_count(var)) {
      l.size = n;
      l.variable = std::string(var) + "=" + std::to_string(n);
      return l;
    }
  }
  if (std::getenv("PMIX_RANK")) {
    l.size = 0;  // PMIx names the rank, not the size: MPI tells
    l.variable = std::string("PMIX_RANK=") + std::getenv("PMIX_RANK");
  }
  return l;
}

bool built_with_mpi() {
  return CT_HAVE_MPI != 0;
}

std::unique_ptr<Communicator> make_communicator(const Launch& launch, bool with_mpi) {
  if (!launch.launched()) return make_single_process();
  if (!with_mpi) {
    if (launch.size == 1) return make_single_process();
    fail(ErrorKind::kInvalidArgument,
         "this crosstrain was built without MPI (CMake found no MPI, or -DCT_MPI=OFF), but it "
         "was started by an MPI launcher as one of " +
             (launch.size > 1 ? std::to_string(launch.size) : std::string("several")) +
             " processes (" + launch.variable +
             "): each would train alone on the same data and write the same files. Install "
             "Open MPI (Debian: libopenmpi-dev openmpi-bin; scripts/setup.sh does) and rebuild, "
             "or run one process without mpirun");
  }
#if CT_HAVE_MPI
  return make_mpi_communicator();
#else
  CT_CHECK(false, "MPI requested in a build without it");
#endif
}

Communicator& world() {
  std::unique_ptr<Communicator>& w = world_slot();
  if (!w) w = make_communicator(detect_launch(), built_with_mpi());
  return *w;
}

bool world_is_distributed() {
  return world_slot() && world_slot()->size() > 1;
}

void finalize_world() {
  world_slot().reset();
}

void abort_world(int code) {
  if (world_is_distributed()) world_slot()->abort(code);
}

}  // namespace ct::dist
