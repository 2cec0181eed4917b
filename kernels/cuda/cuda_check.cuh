// Every CUDA runtime and cuBLAS call is checked (docs/cuda-backend.md, "Layout"): a failure
// throws std::runtime_error naming the call, the file:line and the error string. Callers at the edge
// (worker startup, a step) turn it into a clear error; nothing continues past a failed call.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

namespace sy::cuda {

[[noreturn]] inline void fail_call(const char* what, const char* file, int line, const std::string& why) {
  throw std::runtime_error(std::string(what) + " failed at " + file + ":" + std::to_string(line) + ": " + why);
}

}  // namespace sy::cuda

#define SY_CUDA_CHECK(call)                                                                                    \
  do {                                                                                                         \
    const cudaError_t sy_err_ = (call);                                                                        \
    if (sy_err_ != cudaSuccess) ::sy::cuda::fail_call(#call, __FILE__, __LINE__, cudaGetErrorString(sy_err_)); \
  } while (0)

#define SY_CUBLAS_CHECK(call)                                                                                        \
  do {                                                                                                               \
    const cublasStatus_t sy_st_ = (call);                                                                            \
    if (sy_st_ != CUBLAS_STATUS_SUCCESS)                                                                             \
      ::sy::cuda::fail_call(#call, __FILE__, __LINE__, "cuBLAS status " + std::to_string(static_cast<int>(sy_st_))); \
  } while (0)

// After a kernel launch: launch-configuration errors surface here, not at the next call.
#define SY_CUDA_CHECK_LAUNCH() SY_CUDA_CHECK(cudaGetLastError())
