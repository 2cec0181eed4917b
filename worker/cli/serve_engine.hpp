// The engine `switchyard-worker serve` runs, built from serve's flags — kept apart from
// serve.cpp (CAF, ZeroMQ) so that builds without them (SY_DEVICE_ONLY: switchyard-bench
// serve-check) make exactly the same engine and fail with exactly the same messages.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "kernels/cpu/thread_pool.hpp"
#include "worker/cli/device_backend.hpp"
#include "worker/engine/engine.hpp"
#include "worker/model/llama_model.hpp"

namespace sy {

class cli_args;

// --prompt-panels: per-step (the prompt GEMM's bf16 panels built in every step with prompt rows,
// the default), resident (built once at load, 2 bytes per weight), integer (no bf16 panels where
// the layer has integer panels: prompt tokens on the integer kernel with 8-bit activations;
// cpu::linear::use_integer_prompts). Throws std::invalid_argument naming the flag on anything else.
enum class prompt_panels { per_step, resident, integer };
prompt_panels parse_prompt_panels(const std::string& value);
// Applies the mode to the model's CPU layers and says what it did on stderr (`who`: the program).
void apply_prompt_panels(prompt_panels mode, llama_model& model, cpu::thread_pool& pool, const char* who);

// Every option `serve` takes (for cli_args::check_known).
const std::vector<std::string>& serve_options();

// The engine on `dev` sized by --kv-blocks / --kv-memory-mb / --kv-memory-fraction, --kv-type,
// --block-size, --max-context, --max-running, --max-batch-tokens and --no-prefix-cache. Throws
// std::invalid_argument naming the flag, or std::runtime_error from the backend (no device, out
// of device memory, ...). `pool` runs the CPU backend and must outlive the engine.
std::unique_ptr<engine> make_serve_engine(const cli_args& a, const device_choice& dev, const llama_model& model,
                                          cpu::thread_pool& pool);

}  // namespace sy
