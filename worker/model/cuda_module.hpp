// The CUDA backend as a module the worker loads at run time (libswitchyard-cuda.so, built next to
// the executables wherever nvcc exists; docs/cuda-backend.md, "The CUDA module"): the CUDA runtime
// and cuBLAS are mapped only by a worker that asks for a device, so a CPU worker of a CUDA build
// starts and stays as small as one built without CUDA.
//
// The module is built from the same source as the worker and resolves the worker's own functions
// (the model, the CPU kernels) against the executable, which exports them (cuda_module.dynlist);
// `abi` and the struct sizes refuse a module from another build instead of crashing in it.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "worker/model/forward_backend.hpp"

namespace sy {

class llama_model;
struct cuda_forward_config;

struct cuda_module {
  int abi;             // cuda_module_abi of the module's build
  size_t config_size;  // sizeof(cuda_forward_config) there
  size_t model_size;   // sizeof(llama_model) there
  // cuda_forward(model, config) (worker/model/cuda_forward.hpp): throws std::runtime_error with
  // a message for the user (no device, no such device, out of device memory, a CUDA error).
  std::unique_ptr<forward_backend> (*make_backend)(const llama_model& model, const cuda_forward_config& config);
  // kernels/cuda/device_info.cuh
  std::string (*describe_devices)();
  double (*copy_bandwidth)(int device, size_t bytes);
};

// Raised whenever the table above or what its functions take changes.
inline constexpr int cuda_module_abi = 1;
inline constexpr const char* cuda_module_file = "libswitchyard-cuda.so";
// The module's one exported entry point: extern "C" const sy::cuda_module* sy_cuda_module();
inline constexpr const char* cuda_module_entry = "sy_cuda_module";

}  // namespace sy
