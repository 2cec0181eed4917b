// `switchyard-worker bench-engine`: engine-level benchmark (batching, prefix cache, KV memory).
#pragma once

namespace sy {
class cli_args;
int run_bench_engine(const cli_args& args, const char* default_model);
}  // namespace sy
