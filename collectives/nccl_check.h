#pragma once
// DPT_NCCL_CHECK(call): throws dpt::Error naming the NCCL call, file:line and NCCL's description.
// ncclInProgress is not an error: non-blocking communicators return it while work is being enqueued
// (see NcclBackend::wait_ready).
#ifdef DPT_HAVE_CUDA
#include <nccl.h>

#include "core/error.h"

namespace dpt::dist {

[[noreturn]] inline void fail_nccl(ncclResult_t status, ncclComm_t comm, const char* call, const char* file,
                                   int line) {
  const char* detail = ncclGetLastError(comm);
  ::dpt::throw_error(file, line,
                     fmt::format("NCCL call {} failed: {} ({})", call, ncclGetErrorString(status),
                                 detail != nullptr && *detail != '\0' ? detail : "no further detail"));
}

}  // namespace dpt::dist

#define DPT_NCCL_CHECK_COMM(call, comm)                                                                      \
  do {                                                                                                       \
    ncclResult_t dpt_nccl_status_ = (call);                                                                  \
    if (dpt_nccl_status_ != ncclSuccess && dpt_nccl_status_ != ncclInProgress)                               \
      ::dpt::dist::fail_nccl(dpt_nccl_status_, (comm), #call, __FILE__, __LINE__);                           \
  } while (0)

#define DPT_NCCL_CHECK(call) DPT_NCCL_CHECK_COMM(call, nullptr)

#endif  // DPT_HAVE_CUDA
