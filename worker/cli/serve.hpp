// `switchyard-worker serve`: the worker process (engine actor + link actor + metrics endpoint).
#pragma once

namespace sy {
class cli_args;
int run_serve(const cli_args& args, const char* default_model);
}  // namespace sy
