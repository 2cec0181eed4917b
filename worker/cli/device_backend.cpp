#include "worker/cli/device_backend.hpp"

#include <stdexcept>

#include "common/cli_args.hpp"

#ifdef SY_HAVE_CUDA
#include "kernels/cuda/device_info.cuh"
#include "worker/model/cuda_forward.hpp"
#endif

namespace sy {

device_choice parse_device_choice(const cli_args& a) {
  device_choice d;
  const std::string dev = a.get("device", "cpu");
  if (dev == "cuda") {
    d.cuda = true;
  } else if (dev.rfind("cuda:", 0) == 0) {
    const std::string n = dev.substr(5);
    if (n.empty() || n.size() > 4 || n.find_first_not_of("0123456789") != std::string::npos)
      throw std::invalid_argument("--device: '" + dev + "' is not cpu, cuda or cuda:N");
    d.cuda = true;
    d.index = std::stoi(n);
  } else if (dev != "cpu") {
    throw std::invalid_argument("--device: '" + dev + "' is not cpu, cuda or cuda:N");
  }
  const std::string graphs = a.get("cuda-graphs", "on");
  if (graphs != "on" && graphs != "off") throw std::invalid_argument("--cuda-graphs must be on or off");
  d.cuda_graphs = graphs == "on";
#ifndef SY_HAVE_CUDA
  if (d.cuda)
    throw std::runtime_error("--device " + dev +
                             ": this switchyard-worker was built without CUDA (no nvcc at build time)");
#endif
  return d;
}

std::unique_ptr<forward_backend> make_cuda_backend(const llama_model& model, const device_choice& d,
                                                   const cuda_backend_settings& s) {
#ifdef SY_HAVE_CUDA
  cuda_forward_config c;
  c.device = d.index;
  c.block_size = s.block_size;
  c.n_kv_blocks = s.n_kv_blocks;
  c.kv_memory_fraction = s.kv_memory_fraction;
  c.max_tokens_per_step = s.max_tokens_per_step;
  c.max_seqs_per_step = s.max_running;
  c.max_blocks_per_seq = static_cast<int32_t>((s.max_context + s.block_size - 1) / s.block_size);
  c.cuda_graphs = d.cuda_graphs;
  return std::make_unique<cuda_forward>(model, c);
#else
  (void)model;
  (void)s;
  throw std::runtime_error("--device " + d.name() + ": this switchyard-worker was built without CUDA");
#endif
}

double measure_copy_bandwidth(const device_choice& d) {
#ifdef SY_HAVE_CUDA
  if (d.cuda) return cuda::copy_bandwidth(d.index, size_t{1} << 30);
#endif
  (void)d;
  return 0;
}

}  // namespace sy
