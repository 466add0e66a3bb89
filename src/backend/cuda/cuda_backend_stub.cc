// CreateCudaBackend in a build without CUDA (STRATA_CUDA=OFF or no nvcc at
// configure time): says so and how to get one, so callers need no #ifdefs.
#include "backend/backend.h"

namespace strata {

StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(const CudaBackendOptions&) {
  return Unavailable(
      "no CUDA device: this strata was built without the CUDA backend (reconfigure with "
      "-DSTRATA_CUDA=ON, "
      "which needs nvcc and cuBLASLt from CUDA 13); use --device cpu");
}

StatusOr<DeviceMemoryFacts> ReadCudaMemoryFacts(int) {
  return Unavailable("no CUDA device: this strata was built without the CUDA backend");
}

}  // namespace strata
