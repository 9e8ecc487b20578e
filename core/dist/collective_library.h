// A collective library for device memory with NCCL's C API: NCCL itself (libnccl.so.2, CUDA),
// RCCL (librccl.so.1, HIP: the same entry points and types), each loaded at run time so that no
// build links either, or the SIMT runtime's own (core/dist/simt_collectives.cpp: the same
// entry points over MPI, for the CPU SIMT devices whose device memory is host memory).
//
// Only what data parallel uses is declared, from NCCL's documented ABI (nccl.h; unchanged since
// NCCL 2.0): the result codes, the unique id, ncclFloat32 and ncclSum. Enum parameters are
// passed as int, as C passes an enum.
#pragma once

#include <string>

#include "core/dist/communicator.h"

namespace ct::dist {

namespace nccl {
using Result = int;           // ncclResult_t: 0 is ncclSuccess
using Comm = struct Opaque*;  // ncclComm_t
using Stream = void*;         // cudaStream_t, hipStream_t (Device::native_stream)
struct UniqueId {             // ncclUniqueId
  char internal[128];
};
inline constexpr Result kSuccess = 0;
inline constexpr int kFloat32 = 7;  // ncclFloat32
inline constexpr int kSum = 0;      // ncclSum
}  // namespace nccl

// The value of DeviceInfo::extra's "collective library" entry on the SIMT devices: this
// process's built-in library, not a file to load.
inline constexpr const char* kSimtCollectives = "crosstrain simt collectives (over MPI)";

// The entry points, named as in nccl.h without the prefix.
struct CollectiveLibrary {
  std::string name;  // "NCCL 2.28.9 (/usr/local/cuda/lib64/libnccl.so.2)"
  nccl::Result (*GetVersion)(int* version) = nullptr;
  const char* (*GetErrorString)(nccl::Result result) = nullptr;
  nccl::Result (*GetUniqueId)(nccl::UniqueId* id) = nullptr;
  nccl::Result (*CommInitRank)(nccl::Comm* comm, int nranks, nccl::UniqueId id, int rank) = nullptr;
  nccl::Result (*CommDestroy)(nccl::Comm comm) = nullptr;
  nccl::Result (*CommAbort)(nccl::Comm comm) = nullptr;
  nccl::Result (*AllReduce)(const void* send, void* recv, size_t count, int dtype, int op,
                            nccl::Comm comm, nccl::Stream stream) = nullptr;
  nccl::Result (*Reduce)(const void* send, void* recv, size_t count, int dtype, int op, int root,
                         nccl::Comm comm, nccl::Stream stream) = nullptr;
  nccl::Result (*Broadcast)(const void* send, void* recv, size_t count, int dtype, int root,
                            nccl::Comm comm, nccl::Stream stream) = nullptr;
  nccl::Result (*GroupStart)() = nullptr;
  nccl::Result (*GroupEnd)() = nullptr;
};

// dlopen(`file`) (a soname such as "libnccl.so.2", or a path) and every entry point above;
// where the soname is not found on the loader's path, also in the toolkit's folders
// ($CUDA_HOME/lib64 and /usr/local/cuda/lib64 for NCCL; $ROCM_PATH/lib and /opt/rocm/lib for
// RCCL). `label` ("NCCL", "RCCL") names it in `name` and in errors. Error(kUnsupported) naming
// the file and the loader's message when it is missing or lacks an entry point. The library
// stays loaded for the life of the process.
CollectiveLibrary load_collective_library(const std::string& file, const std::string& label);

// The SIMT runtime's library: NCCL's entry points over `transport` (MPI between the ranks'
// host-memory "device" buffers). One transport per process: the last one given here.
CollectiveLibrary simt_collective_library(Communicator& transport);

}  // namespace ct::dist
