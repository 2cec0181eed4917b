// The entry point of libswitchyard-cuda.so (worker/model/cuda_module.hpp).
#include "worker/model/cuda_module.hpp"

#include "kernels/cuda/device_info.cuh"
#include "worker/model/cuda_forward.hpp"

namespace {

std::unique_ptr<sy::forward_backend> make_backend(const sy::llama_model& model, const sy::cuda_forward_config& config) {
  return std::make_unique<sy::cuda_forward>(model, config);
}

const sy::cuda_module module_table{
    sy::cuda_module_abi, sizeof(sy::cuda_forward_config), sizeof(sy::llama_model),
    make_backend,        sy::cuda::describe_devices,      sy::cuda::copy_bandwidth,
};

}  // namespace

extern "C" __attribute__((visibility("default"))) const sy::cuda_module* sy_cuda_module() { return &module_table; }
