#include "worker/cli/device_backend.hpp"

#include <stdexcept>

#include "common/cli_args.hpp"

#ifdef SY_HAVE_CUDA
#include <dlfcn.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>

#include "worker/model/cuda_forward.hpp"
#include "worker/model/cuda_module.hpp"
#endif

namespace sy {

#ifdef SY_HAVE_CUDA
namespace {

// $SY_CUDA_MODULE; else the module next to the executable (a build tree), else in
// ../lib/switchyard/ beside the executable's directory (an installed layout, the CUDA image).
std::string cuda_module_path() {
  if (const char* p = std::getenv("SY_CUDA_MODULE"); p != nullptr && *p != 0) return p;
  char buf[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return cuda_module_file;  // then the dynamic loader's search path
  const std::string exe(buf, static_cast<size_t>(n));
  const std::string dir = exe.substr(0, exe.rfind('/') + 1);
  const std::string beside = dir + cuda_module_file, installed = dir + "../lib/switchyard/" + cuda_module_file;
  return access(beside.c_str(), F_OK) != 0 && access(installed.c_str(), F_OK) == 0 ? installed : beside;
}

struct loaded_module {
  const cuda_module* table = nullptr;
  std::string error;  // why there is none
};

// Loaded on first use, once, and never unloaded (the CUDA runtime does not survive dlclose).
const loaded_module& cuda_module_once() {
  static const loaded_module loaded = [] {
    loaded_module r;
    const std::string path = cuda_module_path();
    void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr) {
      const char* e = dlerror();
      r.error = "the CUDA module did not load (" + std::string(e != nullptr ? e : path) + ")";
      return r;
    }
    const auto entry = reinterpret_cast<const cuda_module* (*)()>(dlsym(h, cuda_module_entry));
    const cuda_module* table = entry != nullptr ? entry() : nullptr;
    if (table == nullptr || table->abi != cuda_module_abi || table->config_size != sizeof(cuda_forward_config) ||
        table->model_size != sizeof(llama_model)) {
      r.error = "the CUDA module " + path + " is from another build of switchyard-worker";
      return r;
    }
    r.table = table;
    return r;
  }();
  return loaded;
}

const cuda_module& cuda_module_or_throw(const std::string& what) {
  const loaded_module& m = cuda_module_once();
  if (m.table == nullptr) throw std::runtime_error(what + ": " + m.error);
  return *m.table;
}

}  // namespace
#endif

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
  return cuda_module_or_throw("--device " + d.name()).make_backend(model, c);
#else
  (void)model;
  (void)s;
  throw std::runtime_error("--device " + d.name() + ": this switchyard-worker was built without CUDA");
#endif
}

double measure_copy_bandwidth(const device_choice& d) {
#ifdef SY_HAVE_CUDA
  if (d.cuda) return cuda_module_or_throw("--device " + d.name()).copy_bandwidth(d.index, size_t{1} << 30);
#endif
  (void)d;
  return 0;
}

std::string describe_cuda() {
#ifdef SY_HAVE_CUDA
  const loaded_module& m = cuda_module_once();
  return m.table != nullptr ? m.table->describe_devices() : m.error;
#else
  return "not built";
#endif
}

}  // namespace sy
