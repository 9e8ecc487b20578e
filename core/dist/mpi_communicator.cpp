#include "core/dist/mpi_communicator.h"

#include <mpi.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <exception>
#include <functional>
#include <limits>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "core/error.h"

namespace ct::dist {
namespace {

// MPI calls return an error code (MPI_COMM_WORLD's handler is set to return, not abort).
void mpi_check(int rc, const char* call) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  MPI_Error_string(rc, text, &len);
  fail(ErrorKind::kDevice, std::string(call) + " failed: " + std::string(text, len));
}
#define CT_MPI(call) mpi_check(call, #call)

std::string seconds(double s) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f s", s);
  return text;
}

// Element counts above INT_MAX go in several calls (MPI counts are int).
constexpr size_t kMaxCount = static_cast<size_t>(std::numeric_limits<int>::max() / 2);

// The one thread of the process that calls MPI. It initialises MPI (so it is MPI's main thread:
// MPI_THREAD_FUNNELED suffices, which every MPI provides, where a second calling thread would
// need MPI_THREAD_MULTIPLE and a communicator of its own to keep the collectives in one order on
// every rank), runs the queued calls one after another in the order they came, and finalises.
// Open MPI moves a non-blocking collective on only inside MPI calls: the training thread, busy
// with the backward pass, would move data-parallel's buckets on only between its ops; this
// thread keeps polling them meanwhile. After one call failed the ones queued after it fail
// with its error without running (the run is being stopped), except those queued as `always`.
class MpiThread {
 public:
  using Clock = std::chrono::steady_clock;
  MpiThread() : thread_([this] { loop(); }) {}
  ~MpiThread() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    changed_.notify_all();
    thread_.join();
  }
  // Queues `call`; returns its ticket at once.
  uint64_t post(std::function<void()> call, bool always = false) {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back({++posted_, always, std::move(call)});
    changed_.notify_all();
    return posted_;
  }
  // Blocks until call `ticket` has run; rethrows its error.
  Communicator::Ran wait(uint64_t ticket) {
    std::unique_lock<std::mutex> lock(mutex_);
    CT_CHECK(ticket > 0 && ticket <= posted_,
             "wait for collective " + std::to_string(ticket) + ", which was not started");
    changed_.wait(lock, [&] { return done_.count(ticket) > 0; });
    const Done d = done_[ticket];
    done_.erase(ticket);
    if (d.error) std::rethrow_exception(d.error);
    return d.ran;
  }
  // Runs `call` on this thread and returns when it has.
  void run(std::function<void()> call, bool always = false) { wait(post(std::move(call), always)); }

 private:
  struct Call {
    uint64_t ticket;
    bool always;
    std::function<void()> run;
  };
  struct Done {
    Communicator::Ran ran;
    std::exception_ptr error;
  };
  void loop() {
    std::exception_ptr failed;  // the first call's error (this thread's alone)
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      changed_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopped, every call run
      Call call = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      Done d;
      d.ran.start = Clock::now();
      if (failed && !call.always) {
        d.error = failed;
      } else {
        try {
          call.run();
        } catch (...) {
          d.error = std::current_exception();
          if (!failed) failed = d.error;
        }
      }
      d.ran.end = Clock::now();
      lock.lock();
      done_[call.ticket] = d;
      changed_.notify_all();
    }
  }

  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<Call> queue_;
  std::map<uint64_t, Done> done_;  // ran, not yet waited for
  uint64_t posted_ = 0;
  bool stop_ = false;
  std::thread thread_;  // last: starts once the rest exists
};

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator() {
    mpi_.run([this] { init(); });
  }
  ~MpiCommunicator() override {
    try {
      mpi_.run([this] { finalize(); }, /*always=*/true);
    } catch (...) {  // nothing to do about it at exit
    }
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int local_rank() const override { return local_rank_; }
  int local_size() const override { return local_size_; }
  std::string host() const override { return host_; }
  std::string transport() const override { return "MPI (" + library_ + ")"; }

  void all_reduce(float* data, size_t count, ReduceOp op) override {
    mpi_.run([&] { reduce_floats(data, count, op); });
  }
  void all_reduce(double* data, size_t count, ReduceOp op) override {
    mpi_.run([&] {
      reduce(data, count, MPI_DOUBLE);
      if (op == ReduceOp::kAverage)
        for (size_t i = 0; i < count; ++i) data[i] /= size_;
    });
  }
  void reduce_scatter(float* data, const std::vector<size_t>& counts, ReduceOp op) override {
    mpi_.run([&] { scatter_floats(data, counts, op); });
  }
  uint64_t start_all_reduce(float* data, size_t count, ReduceOp op) override {
    return mpi_.post([this, data, count, op] { reduce_floats(data, count, op); });
  }
  uint64_t start_reduce_scatter(float* data, const std::vector<size_t>& counts,
                                ReduceOp op) override {
    return mpi_.post([this, data, counts, op] { scatter_floats(data, counts, op); });
  }
  Ran wait(uint64_t ticket) override { return mpi_.wait(ticket); }
  void all_gather(float* data, const std::vector<size_t>& counts) override {
    mpi_.run([&] {
      const std::vector<int> n = int_counts(counts, "all_gather");
      std::vector<int> displs(static_cast<size_t>(size_));
      for (int r = 0; r < size_; ++r) displs[r] = static_cast<int>(offset_of(counts, r));
      MPI_Request req;
      CT_MPI(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, data, n.data(), displs.data(),
                             MPI_FLOAT, MPI_COMM_WORLD, &req));
      complete(req, "an all-gather");
    });
  }
  void broadcast(void* data, size_t bytes, int root) override {
    mpi_.run([&] {
      auto* p = static_cast<char*>(data);
      for (size_t done = 0; done < bytes;) {
        const size_t n = std::min(bytes - done, kMaxCount);
        MPI_Request req;
        CT_MPI(MPI_Ibcast(p + done, static_cast<int>(n), MPI_BYTE, root, MPI_COMM_WORLD, &req));
        complete(req, "a broadcast");
        done += n;
      }
    });
  }
  std::vector<std::string> all_gather(const std::string& mine) override {
    std::vector<std::string> out;
    mpi_.run([&] { out = gather_strings(mine); });
    return out;
  }
  void barrier() override {
    mpi_.run([&] {
      MPI_Request req;
      CT_MPI(MPI_Ibarrier(MPI_COMM_WORLD, &req));
      complete(req, "a barrier");
    });
  }
  void set_timeout(double seconds) override {
    mpi_.run([&] { timeout_s_ = seconds; });
  }
  // Straight from the calling thread, not queued: the MPI thread may be waiting in a collective
  // for a rank that will never come, which is why the run is being ended.
  void abort(int code) override { MPI_Abort(MPI_COMM_WORLD, code); }

 private:
  // On the MPI thread, all of what follows.
  void init() {
    int inited = 0;
    CT_MPI(MPI_Initialized(&inited));
    if (!inited) {
      int provided = 0;
      CT_MPI(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided));
      owns_init_ = true;
    }
    CT_MPI(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
    CT_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &rank_));
    CT_MPI(MPI_Comm_size(MPI_COMM_WORLD, &size_));
    CT_MPI(
        MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &local_));
    CT_MPI(MPI_Comm_rank(local_, &local_rank_));
    CT_MPI(MPI_Comm_size(local_, &local_size_));
    char name[MPI_MAX_PROCESSOR_NAME] = {};
    int len = 0;
    CT_MPI(MPI_Get_processor_name(name, &len));
    host_.assign(name, len);
    char version[MPI_MAX_LIBRARY_VERSION_STRING] = {};
    CT_MPI(MPI_Get_library_version(version, &len));
    library_.assign(version, len);
    if (auto cut = library_.find_first_of(",\n"); cut != std::string::npos) library_.resize(cut);
  }
  void finalize() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    MPI_Comm_free(&local_);
    if (owns_init_) MPI_Finalize();
  }

  void reduce_floats(float* data, size_t count, ReduceOp op) {
    reduce(data, count, MPI_FLOAT);
    if (op == ReduceOp::kAverage) {
      const float inv = 1.0f / static_cast<float>(size_);
      for (size_t i = 0; i < count; ++i) data[i] *= inv;
    }
  }
  void scatter_floats(float* data, const std::vector<size_t>& counts, ReduceOp op) {
    const std::vector<int> n = int_counts(counts, "reduce_scatter");
    const size_t mine = counts[static_cast<size_t>(rank_)];
    scratch_.resize(std::max<size_t>(mine, 1));
    MPI_Request req;
    // Not in place: MPI's in-place form leaves the result at the start of the buffer.
    CT_MPI(MPI_Ireduce_scatter(data, scratch_.data(), n.data(), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD,
                               &req));
    complete(req, "a reduce-scatter");
    float* out = data + offset_of(counts, rank_);
    const float inv = 1.0f / static_cast<float>(size_);
    for (size_t i = 0; i < mine; ++i)
      out[i] = op == ReduceOp::kAverage ? scratch_[i] * inv : scratch_[i];
  }
  std::vector<std::string> gather_strings(const std::string& mine) {
    CT_CHECK(mine.size() < kMaxCount, "all_gather of " + std::to_string(mine.size()) + " bytes");
    int len = static_cast<int>(mine.size());
    std::vector<int> lens(size_), offsets(size_);
    MPI_Request req;
    CT_MPI(MPI_Iallgather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, MPI_COMM_WORLD, &req));
    complete(req, "an all-gather");
    size_t total = 0;
    for (int r = 0; r < size_; ++r) {
      offsets[r] = static_cast<int>(total);
      total += static_cast<size_t>(lens[r]);
    }
    CT_CHECK(total < kMaxCount, "all_gather of " + std::to_string(total) + " bytes in all");
    std::string all(total, '\0');
    CT_MPI(MPI_Iallgatherv(mine.data(), len, MPI_CHAR, all.data(), lens.data(), offsets.data(),
                           MPI_CHAR, MPI_COMM_WORLD, &req));
    complete(req, "an all-gather");
    std::vector<std::string> out(size_);
    for (int r = 0; r < size_; ++r) out[r] = all.substr(offsets[r], lens[r]);
    return out;
  }

  // Completes a non-blocking collective, or throws once it has waited timeout_s_ (a blocking
  // MPI call would wait forever for a rank that hangs). Polls: spinning for the first
  // millisecond, then yielding the core between polls for a second, then sleeping 1 ms between
  // them. Open MPI moves a non-blocking collective on only inside MPI calls (MPI_Test here), one
  // fragment exchange at a time, so a sleep between polls stalls every fragment of a 16 MiB
  // bucket: sleeping from the first millisecond on, GPT-2 124M's gradient all-reduce took 12 s
  // per step between 2 ranks here, 0.5 s yielding. A rank that waits longer (the others
  // evaluate, write a checkpoint, or hang) sleeps.
  void complete(MPI_Request& req, const char* what) {
    using Clock = std::chrono::steady_clock;
    const auto start = Clock::now();
    for (int polls = 0;; ++polls) {
      int done = 0;
      CT_MPI(MPI_Test(&req, &done, MPI_STATUS_IGNORE));
      if (done) return;
      const double waited = std::chrono::duration<double>(Clock::now() - start).count();
      if (timeout_s_ > 0 && waited > timeout_s_)
        fail(ErrorKind::kDevice, "rank " + std::to_string(rank_) + " waited " + seconds(waited) +
                                     " in " + what + " for the other " + std::to_string(size_ - 1) +
                                     " rank(s): one of them hangs or has died (--ddp-timeout " +
                                     seconds(timeout_s_) + "); stopping every rank");
      if (waited > 1.0)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      else if (waited > 1e-3)
        std::this_thread::yield();
    }
  }

  // counts as MPI's ints, one per rank, their sum below kMaxCount (callers send buckets).
  std::vector<int> int_counts(const std::vector<size_t>& counts, const char* what) const {
    CT_CHECK(counts.size() == static_cast<size_t>(size_),
             std::string(what) + " with " + std::to_string(counts.size()) + " counts for " +
                 std::to_string(size_) + " ranks");
    CT_CHECK(offset_of(counts, size_) < kMaxCount,
             std::string(what) + " of " + std::to_string(offset_of(counts, size_)) + " elements");
    return std::vector<int>(counts.begin(), counts.end());
  }
  static size_t offset_of(const std::vector<size_t>& counts, int rank) {
    size_t off = 0;
    for (int r = 0; r < rank; ++r) off += counts[static_cast<size_t>(r)];
    return off;
  }

  void reduce(void* data, size_t count, MPI_Datatype type) {
    int elem = 0;
    CT_MPI(MPI_Type_size(type, &elem));
    auto* p = static_cast<char*>(data);
    for (size_t done = 0; done < count;) {
      const size_t n = std::min(count - done, kMaxCount);
      MPI_Request req;
      CT_MPI(MPI_Iallreduce(MPI_IN_PLACE, p + done * static_cast<size_t>(elem), static_cast<int>(n),
                            type, MPI_SUM, MPI_COMM_WORLD, &req));
      complete(req, "an all-reduce");
      done += n;
    }
  }

  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1;
  bool owns_init_ = false;
  double timeout_s_ = 1800;
  MPI_Comm local_ = MPI_COMM_NULL;
  std::string host_, library_;
  std::vector<float> scratch_;  // reduce_scatter's result before it moves into place
  MpiThread mpi_;               // last: its thread starts once the rest exists, and ends first
};

}  // namespace

std::unique_ptr<Communicator> make_mpi_communicator() {
  return std::make_unique<MpiCommunicator>();
}

}  // namespace ct::dist
