// The SIMT runtime's collective library: NCCL's entry points (core/dist/collective_library.h)
// for the `simt` devices, whose device memory is host memory, with MPI (the run's Communicator)
// as the transport. It lets CI run, on 2 MPI ranks without a GPU, the code that drives NCCL and
// RCCL: the unique id's broadcast, the communicator's set-up, the buckets' in-place collectives
// handed device addresses and the device's stream in the order the backward pass finishes them,
// the averaging kernel after each, ZeRO-1's grouped reduces and broadcasts.
//
// What it does not show: the SIMT runtime runs each kernel before its launch returns (its stream
// is always idle, Device::native_stream() is nullptr), so a collective runs here, on the calling
// thread, when it is called -- which is its place in the stream's order. Nothing here is
// asynchronous as on a GPU, where the call returns at once and the collective's kernel waits
// its turn on the stream; and NCCL's own algorithms (rings, trees, their summation order for
// more than 2 ranks) are not run. With 2 ranks every element is a + b either way.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "core/dist/collective_library.h"
#include "core/error.h"

namespace ct::dist {
namespace {

// NCCL's result codes that the library returns.
constexpr nccl::Result kSystemError = 2, kInternalError = 3, kInvalidArgument = 4,
                       kInvalidUsage = 5;

Communicator* g_transport = nullptr;  // simt_collective_library()'s; one per process
int g_group_depth = 0;                // GroupStart minus GroupEnd
std::string g_last_error;             // for GetErrorString

struct SimtComm {
  int rank, size;
  Communicator* transport;
};
SimtComm* as_comm(nccl::Comm c) {
  return reinterpret_cast<SimtComm*>(c);
}

// Runs `body`, turning its error into NCCL's code (a collective library returns, never throws
// through C).
template <typename Body>
nccl::Result guarded(Body body) {
  try {
    body();
    return nccl::kSuccess;
  } catch (const Error& e) {
    g_last_error = e.what();
    return e.kind() == ErrorKind::kInvalidArgument ? kInvalidArgument : kSystemError;
  } catch (const std::exception& e) {
    g_last_error = e.what();
    return kInternalError;
  }
}

void check_floats(int dtype, const char* call) {
  if (dtype != nccl::kFloat32)
    fail(ErrorKind::kInvalidArgument, std::string(call) + ": datatype " + std::to_string(dtype) +
                                          " (the SIMT library has ncclFloat32 only)");
}

nccl::Result get_version(int* v) {
  *v = 1;
  return nccl::kSuccess;
}
const char* error_string(nccl::Result r) {
  switch (r) {
    case nccl::kSuccess:
      return "no error";
    case kInvalidUsage:
      return "invalid usage";
    default:
      return g_last_error.c_str();
  }
}
nccl::Result get_unique_id(nccl::UniqueId* id) {
  // Its content only has to be the same on every rank once broadcast: InitRank checks that.
  std::memset(id->internal, 0, sizeof id->internal);
  std::snprintf(id->internal, sizeof id->internal, "simt %p", static_cast<void*>(id));
  return nccl::kSuccess;
}
nccl::Result comm_init_rank(nccl::Comm* comm, int nranks, nccl::UniqueId id, int rank) {
  return guarded([&] {
    if (!g_transport) fail(ErrorKind::kInternal, "simt collectives: no transport");
    Communicator& t = *g_transport;
    if (nranks != t.size() || rank != t.rank())
      fail(ErrorKind::kInvalidArgument, "ncclCommInitRank: rank " + std::to_string(rank) + " of " +
                                            std::to_string(nranks) + " where MPI has rank " +
                                            std::to_string(t.rank()) + " of " +
                                            std::to_string(t.size()));
    const std::vector<std::string> ids = t.all_gather(std::string(id.internal, sizeof id.internal));
    for (const std::string& other : ids)
      if (other != ids[0])
        fail(ErrorKind::kInvalidArgument,
             "ncclCommInitRank: the ranks were given different unique ids (not broadcast)");
    *comm = reinterpret_cast<nccl::Comm>(new SimtComm{rank, nranks, &t});
  });
}
nccl::Result comm_destroy(nccl::Comm comm) {
  delete as_comm(comm);
  return nccl::kSuccess;
}

nccl::Result all_reduce(const void* send, void* recv, size_t count, int dtype, int op,
                        nccl::Comm comm, nccl::Stream) {
  return guarded([&] {
    check_floats(dtype, "ncclAllReduce");
    if (op != nccl::kSum) fail(ErrorKind::kInvalidArgument, "ncclAllReduce: only ncclSum");
    if (send != recv) std::memcpy(recv, send, count * sizeof(float));
    as_comm(comm)->transport->all_reduce(static_cast<float*>(recv), count, ReduceOp::kSum);
  });
}

// To `root` only: the MPI reduce-scatter in which root's part is everything.
nccl::Result reduce(const void* send, void* recv, size_t count, int dtype, int op, int root,
                    nccl::Comm comm, nccl::Stream) {
  return guarded([&] {
    check_floats(dtype, "ncclReduce");
    if (op != nccl::kSum) fail(ErrorKind::kInvalidArgument, "ncclReduce: only ncclSum");
    SimtComm& c = *as_comm(comm);
    // In place (send == recv) as data parallel calls it; otherwise a copy, never `send`.
    std::vector<float> scratch;
    float* data = static_cast<float*>(recv);
    if (send != recv) {
      scratch.assign(static_cast<const float*>(send), static_cast<const float*>(send) + count);
      data = scratch.data();
    }
    // Root's part is [0, count), every other rank's empty: the sum lands at data on root.
    std::vector<size_t> counts(static_cast<size_t>(c.size), 0);
    counts[static_cast<size_t>(root)] = count;
    c.transport->reduce_scatter(data, counts, ReduceOp::kSum);
    if (data != recv && c.rank == root) std::memcpy(recv, data, count * sizeof(float));
  });
}

nccl::Result broadcast(const void* send, void* recv, size_t count, int dtype, int root,
                       nccl::Comm comm, nccl::Stream) {
  return guarded([&] {
    check_floats(dtype, "ncclBroadcast");
    SimtComm& c = *as_comm(comm);
    if (c.rank == root && send != recv) std::memcpy(recv, send, count * sizeof(float));
    c.transport->broadcast(recv, count * sizeof(float), root);
  });
}

// A group's calls run one after another as they are made: every rank makes the same calls in
// the same order, so MPI pairs them up without the concurrency NCCL's groups provide.
nccl::Result group_start() {
  ++g_group_depth;
  return nccl::kSuccess;
}
nccl::Result group_end() {
  if (g_group_depth == 0) return kInvalidUsage;
  --g_group_depth;
  return nccl::kSuccess;
}

}  // namespace

CollectiveLibrary simt_collective_library(Communicator& transport) {
  g_transport = &transport;
  CollectiveLibrary lib;
  lib.name = kSimtCollectives;
  lib.GetVersion = get_version;
  lib.GetErrorString = error_string;
  lib.GetUniqueId = get_unique_id;
  lib.CommInitRank = comm_init_rank;
  lib.CommDestroy = comm_destroy;
  lib.CommAbort = comm_destroy;
  lib.AllReduce = all_reduce;
  lib.Reduce = reduce;
  lib.Broadcast = broadcast;
  lib.GroupStart = group_start;
  lib.GroupEnd = group_end;
  return lib;
}

}  // namespace ct::dist
