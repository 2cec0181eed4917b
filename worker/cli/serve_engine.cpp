#include "worker/cli/serve_engine.hpp"

#include <algorithm>
#include <cstdio>
#include <stdexcept>

#include "common/cli_args.hpp"
#include "worker/cli/fault_injection.hpp"

namespace sy {
namespace {

// MemAvailable from /proc/meminfo in bytes (what can be allocated without swapping), or -1.
int64_t available_memory_bytes() {
  std::FILE* f = std::fopen("/proc/meminfo", "r");
  if (!f) return -1;
  char line[256];
  long long kb = -1;
  while (std::fgets(line, sizeof line, f))
    if (std::sscanf(line, "MemAvailable: %lld kB", &kb) == 1) break;
  std::fclose(f);
  return kb < 0 ? -1 : kb * 1024;
}

}  // namespace

prompt_panels parse_prompt_panels(const std::string& value) {
  if (value == "per-step") return prompt_panels::per_step;
  if (value == "resident") return prompt_panels::resident;
  if (value == "integer") return prompt_panels::integer;
  throw std::invalid_argument("--prompt-panels must be per-step, resident or integer, not '" + value + "'");
}

void apply_prompt_panels(prompt_panels mode, llama_model& model, cpu::thread_pool& pool, const char* who) {
  if (mode == prompt_panels::resident)
    std::fprintf(stderr, "%s: prompt GEMM panels resident: %.1f MiB\n", who,
                 static_cast<double>(model.keep_prompt_panels(pool)) / (1 << 20));
  if (mode == prompt_panels::integer)
    std::fprintf(stderr, "%s: prompt tokens on the integer kernel in %d layers (8-bit activations)\n", who,
                 model.use_integer_prompts());
}

// "fault-inject" is for tests only (worker/cli/fault_injection.hpp) and absent from the usage text.
const std::vector<std::string>& serve_options() {
  static const std::vector<std::string> k = {
      "model",
      "listen",
      "metrics-host",
      "metrics-port",
      "kv-blocks",
      "kv-memory-mb",
      "block-size",
      "max-context",
      "max-running",
      "max-batch-tokens",
      "threads",
      "worker-id",
      "hwm",
      "link-backlog",
      "engine-silence-s",
      "kv-type",
      "no-prefix-cache",
      "kv-memory-fraction",
      "device",
      "cuda-graphs",
      "chat-template",
      "drain-timeout-s",
      "max-step-ms",
      "prompt-panels",
      "served-model-name",
      "curve-secret-key",
      "curve-allowed-clients",
      "allow-example-keys",
      "embeddings",
      "pooling",
      "kv-window-release",
      "fault-inject",
  };
  return k;
}

std::unique_ptr<engine> make_serve_engine(const cli_args& a, const device_choice& dev, const llama_model& model,
                                          cpu::thread_pool& pool) {
  const auto& hp = model.hparams();
  engine_config ec;
  ec.block_size = static_cast<int32_t>(a.get_int("block-size", 16));
  ec.max_context = std::min<int64_t>(a.get_int("max-context", 2048), hp.n_ctx_train);
  ec.sched.max_running = static_cast<int32_t>(a.get_int("max-running", 32));
  ec.sched.max_tokens_per_step = static_cast<int32_t>(a.get_int("max-batch-tokens", 256));
  ec.sched.max_step_ms = a.get_float("max-step-ms", k_default_max_step_ms);
  if (!(ec.sched.max_step_ms >= 0)) throw std::invalid_argument("--max-step-ms must be >= 0 (0: no step-time budget)");
  std::string kv_error;
  const auto kvt = cpu::parse_kv_type(a.get("kv-type", "f16"), hp.head_dim, kv_error);
  if (!kvt) throw std::invalid_argument("--kv-type: " + kv_error);
  ec.kv_type = *kvt;
  ec.prefix_caching = !a.has("no-prefix-cache");
  ec.kv_window_release = parse_kv_window_release(a.get("kv-window-release", "on"));
  if (dev.cuda && ec.kv_window_release && hp.sliding_window > 0)
    std::fprintf(stderr,
                 "serve: the CUDA backend keeps every layer's KV blocks for the whole sequence "
                 "(the sliding-window release is CPU only)\n");
  // Embeddings (docs/worker.md, "Embeddings"): served only when asked for, pooled as --pooling says.
  if (a.has("pooling") && !a.has("embeddings")) throw std::invalid_argument("--pooling needs --embeddings");
  if (a.has("embeddings")) {
    const std::string p = a.get("pooling", "mean");
    if (p != "mean" && p != "last") throw std::invalid_argument("--pooling: '" + p + "' is not one of mean, last");
    if (dev.cuda)
      throw std::invalid_argument(
          "--embeddings: the CUDA backend does not compute embeddings; serve them from a CPU "
          "worker (--device cpu)");
    ec.pooling = p == "mean" ? embedding_pooling::mean : embedding_pooling::last;
  }
  if (dev.cuda && ec.kv_type != cpu::kv_type::f16)
    throw std::invalid_argument("--kv-type: the CUDA backend stores K/V as f16 only");
  const int64_t block_bytes = kv_arena::block_bytes(hp.n_layer, ec.block_size, hp.kv_dim(), ec.kv_type);
  double kv_fraction = 0;  // CUDA: a fraction of the device memory left free, sized by the backend
  if (a.has("kv-blocks")) {
    ec.n_kv_blocks = static_cast<int32_t>(a.get_int("kv-blocks", 1024));
  } else if (a.has("kv-memory-fraction")) {
    const double f = a.get_float("kv-memory-fraction", 0.5);
    if (!(f > 0 && f <= 0.95)) throw std::invalid_argument("--kv-memory-fraction must be in (0, 0.95]");
    if (dev.cuda) {
      kv_fraction = f;
      ec.n_kv_blocks = 0;
    } else {
      const int64_t avail = available_memory_bytes();
      if (avail <= 0) throw std::runtime_error("--kv-memory-fraction: cannot read MemAvailable from /proc/meminfo");
      ec.n_kv_blocks = static_cast<int32_t>(std::min<int64_t>(static_cast<int64_t>(f * avail) / block_bytes, 1 << 30));
    }
  } else {
    ec.n_kv_blocks = static_cast<int32_t>(a.get_int("kv-memory-mb", 512) * (1 << 20) / block_bytes);
  }
  if (ec.block_size < 1 || ec.block_size > 256 || (ec.n_kv_blocks < 1 && kv_fraction == 0) ||
      ec.sched.max_running < 1 || ec.sched.max_tokens_per_step < 1 || ec.max_context < 2)
    throw std::invalid_argument(
        "serve: --block-size, --kv-blocks/--kv-memory-mb, --max-running, "
        "--max-batch-tokens and --max-context must be positive");
  // Tests only (worker/cli/fault_injection.hpp): the real backend, wrapped to fail on purpose.
  const std::string mode = a.get("fault-inject", "");
  const std::string fault = is_backend_fault(mode) ? mode : "";  // link faults: worker/cli/serve.cpp
  if (!dev.cuda && fault.empty()) return std::make_unique<engine>(model, pool, ec);
  if (!dev.cuda)
    return std::make_unique<engine>(model,
                                    with_fault_injection(make_cpu_backend(model, pool, ec), fault, model.vocab()), ec);
  cuda_backend_settings cs;
  cs.block_size = ec.block_size;
  cs.n_kv_blocks = ec.n_kv_blocks;
  cs.kv_memory_fraction = kv_fraction > 0 ? kv_fraction : 0.5;
  cs.max_tokens_per_step = ec.sched.max_tokens_per_step;
  cs.max_running = ec.sched.max_running;
  cs.max_context = ec.max_context;
  std::unique_ptr<forward_backend> backend = make_cuda_backend(model, dev, cs);
  if (!fault.empty()) backend = with_fault_injection(std::move(backend), fault, model.vocab());
  return std::make_unique<engine>(model, std::move(backend), ec);
}

}  // namespace sy
