// Which device the worker runs on, from the command line (`--device cpu | cuda | cuda:N`,
// `--cuda-graphs on|off`), and the forward backend for it. CUDA exists only in builds with
// nvcc (SY_HAVE_CUDA), and there as a module loaded on the first use (worker/model/cuda_module.hpp);
// elsewhere, or where the module cannot load, asking for it is a clear error, not a crash.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "worker/model/forward_backend.hpp"
#include "worker/model/llama_model.hpp"

namespace sy {

class cli_args;

struct device_choice {
  bool cuda = false;
  int index = 0;            // cuda:N
  bool cuda_graphs = true;  // --cuda-graphs
  std::string name() const { return cuda ? "cuda:" + std::to_string(index) : "cpu"; }
};

// --device (default cpu) and --cuda-graphs (default on). Throws std::invalid_argument naming the
// flag for anything else, and std::runtime_error for cuda in a build without CUDA.
device_choice parse_device_choice(const cli_args& a);

// Sizes of the CUDA backend, from the engine's settings.
struct cuda_backend_settings {
  int32_t block_size = 16;
  int32_t n_kv_blocks = 0;  // 0: kv_memory_fraction of the free device memory
  double kv_memory_fraction = 0.5;
  int32_t max_tokens_per_step = 256;  // the scheduler's token budget
  int32_t max_running = 32;           // sequences per step at most (logits rows, decode buckets)
  int64_t max_context = 2048;         // longest sequence (decode block-table width)
};

// The CUDA backend on `d` (d.cuda must be set). Throws std::runtime_error with a message fit for
// the user: not built with CUDA, no device, no such device, out of device memory.
std::unique_ptr<forward_backend> make_cuda_backend(const llama_model& model, const device_choice& d,
                                                   const cuda_backend_settings& s);

// Device-to-device copy bandwidth of d's device in bytes/s (each byte counted read and written),
// measured now with a large cudaMemcpy; 0 for the CPU.
double measure_copy_bandwidth(const device_choice& d);

// For `info`: the CUDA devices (one line each), or why there are none: "not built", no device,
// or why the CUDA module did not load. Loads the module (CUDA runtime and cuBLAS) in builds with
// CUDA; nothing else in a CPU worker does (worker/model/cuda_module.hpp).
std::string describe_cuda();

}  // namespace sy
