// The MPI communicator (core/dist/mpi_communicator.cpp), only in builds with CT_MPI. No MPI type
// here: the rest of crosstrain reaches it through make_communicator().
#pragma once

#include <memory>

#include "core/dist/communicator.h"

namespace ct::dist {

// On first call a thread of its own that calls MPI_Init_thread (funneled: that thread alone calls
// MPI, the others queue their calls to it), and a communicator over MPI_COMM_WORLD with the
// machine-local ranks from MPI_Comm_split_type. MPI_Finalize when it is destroyed.
std::unique_ptr<Communicator> make_mpi_communicator();

}  // namespace ct::dist
