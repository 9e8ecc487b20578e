// The processes of one training run and what they exchange: ranks, all-reduce, reduce-scatter,
// broadcast and all-gather. One interface, two implementations: MPI
// (core/dist/mpi_communicator.cpp, built when CMake finds MPI) and a single process. No MPI type
// appears here, so everything that includes this header builds without MPI.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace ct::dist {

enum class ReduceOp { kSum, kAverage };

class Communicator {
 public:
  virtual ~Communicator() = default;

  // This process's number among all of them, [0, size()).
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Its number among the processes on the same machine (shared memory), and how many those are.
  virtual int local_rank() const = 0;
  virtual int local_size() const = 0;
  // The machine's name, and the transport ("single process", "MPI: Open MPI v4.1.4, ...").
  virtual std::string host() const = 0;
  virtual std::string transport() const = 0;

  // data[0, count) in place: on return every rank holds the element-wise sum (or sum / size())
  // of every rank's data. Collective: every rank calls it with the same count and op.
  virtual void all_reduce(float* data, size_t count, ReduceOp op) = 0;
  // As all_reduce, for doubles (loss sums, timings).
  virtual void all_reduce(double* data, size_t count, ReduceOp op) = 0;
  // ZeRO stage 1's two halves of an all-reduce. `counts[r]` elements belong to rank r, in rank
  // order: rank r's part of data is [offset(r), offset(r) + counts[r]) with offset(r) the sum of
  // counts[0, r). Collective: every rank passes the same counts (size() of them).
  // reduce_scatter: data[0, sum) on every rank; on return this rank's part holds the sum (or
  // sum / size()) of every rank's values there (with 2 ranks bitwise all_reduce's: a + b is
  // b + a); the rest of data is unspecified.
  virtual void reduce_scatter(float* data, const std::vector<size_t>& counts, ReduceOp op) = 0;
  // all_gather: on entry this rank's part of data holds its values; on return every part holds
  // its owner's.
  virtual void all_gather(float* data, const std::vector<size_t>& counts) = 0;

  // all_reduce and reduce_scatter of floats without waiting for them (data parallel's buckets,
  // reduced while the backward pass goes on): start_*() queues the collective and returns its
  // ticket; wait(ticket) returns once it has completed, with when it ran, or throws its error.
  // Every collective of this communicator, started or blocking, runs in the order of the calls,
  // so every rank must make the same calls in the same order; `data` must stay untouched until
  // wait() returns. The MPI communicator runs them on its own thread; these defaults run the
  // collective at once, in start_*().
  struct Ran {
    std::chrono::steady_clock::time_point start, end;
  };
  virtual uint64_t start_all_reduce(float* data, size_t count, ReduceOp op);
  virtual uint64_t start_reduce_scatter(float* data, const std::vector<size_t>& counts,
                                        ReduceOp op);
  virtual Ran wait(uint64_t ticket);
  // `bytes` bytes of data from rank `root` into data on every rank. Collective.
  virtual void broadcast(void* data, size_t bytes, int root) = 0;
  // Every rank's `mine` (each any length), in rank order, on every rank. Collective; for small
  // host data (argument lists, hashes), not tensors.
  virtual std::vector<std::string> all_gather(const std::string& mine) = 0;
  // Returns once every rank has called it.
  virtual void barrier() = 0;
  // How long one collective waits for the other ranks, in seconds, before it throws
  // Error(kDevice) saying so (a rank that hangs, or died where the launcher did not notice);
  // <= 0: forever. Default 1800 (Hugging Face's ddp_timeout).
  virtual void set_timeout(double seconds) = 0;
  // Ends every process of the run with exit status `code` (MPI_Abort); for an error that only
  // some ranks have, where the others would wait forever in their next collective. Returns
  // (does nothing) in a single process.
  virtual void abort(int code) = 0;

 private:
  // The defaults of start_*() and wait(): when each collective ran, by ticket.
  std::map<uint64_t, Ran> ran_;
  uint64_t tickets_ = 0;
};

// The one process of a run not started by a launcher: rank 0 of 1; the collectives copy or do
// nothing.
std::unique_ptr<Communicator> make_single_process();

// How this process was started, from the environment a launcher sets: Open MPI's mpirun
// (OMPI_COMM_WORLD_SIZE), a PMI launcher (PMI_SIZE: MPICH's hydra, Slurm's srun) or PMIx
// (PMIX_RANK, size unknown: 0). size 1 and an empty variable when no launcher is seen.
struct Launch {
  int size = 1;
  std::string variable;  // "OMPI_COMM_WORLD_SIZE=2", or empty
  bool launched() const { return !variable.empty(); }
};
Launch detect_launch();

// Whether this build has the MPI communicator (CMake's CT_MPI).
bool built_with_mpi();

// The communicator of a process started as `launch`: MPI when it was launched and `with_mpi`,
// the single process when it was not launched (or launched as one process without MPI).
// Error(kInvalidArgument) when it was launched as several processes and `with_mpi` is false:
// each would train alone, on the same data, and write the same files, so it refuses, saying so.
std::unique_ptr<Communicator> make_communicator(const Launch& launch, bool with_mpi);

// This process's communicator: on first use make_communicator(detect_launch(),
// built_with_mpi()) (MPI_Init then), the same object afterwards.
Communicator& world();
// Whether world() has been made and spans more than one process.
bool world_is_distributed();
// MPI_Finalize when world() initialised MPI; the tool's main calls it on a normal return.
// Idempotent; world() must not be used afterwards.
void finalize_world();
// For main's error path: when world() spans several processes, ends all of them with `code`
// (their next collective would wait forever for this one); otherwise returns.
void abort_world(int code);

}  // namespace ct::dist
