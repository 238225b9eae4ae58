// Placeholder until the NCCL backend lands: CPU builds get a clear error.
#include "distributed/backend.h"

namespace dpt::dist {

std::shared_ptr<Backend> make_nccl_backend(std::shared_ptr<Store>, int, int, const BackendOptions&) {
  DPT_FAIL("the NCCL backend is not available in this build (built without CUDA); use CPU tensors with Gloo");
}

}  // namespace dpt::dist
