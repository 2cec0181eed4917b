// switchyard-worker: the worker binary. Subcommands so far:
//   serve     the worker process (router protocol over ZeroMQ, CAF actors)
//   generate  load a GGUF model and stream a completion to stdout
//   bench     prompt-processing and decode throughput on this machine (JSON with --json)
//   bench-engine  engine-level benchmark (worker/cli/bench_engine.cpp)
//   info      model and kernel facts
// Built with SY_NO_SERVE (SY_DEVICE_ONLY builds: switchyard-bench, no CAF/ZeroMQ/msgpack) it has
// every subcommand but `serve`, and `serve-check` instead: serve's start-up (flags, model,
// backend, KV arena; worker/cli/serve_engine.hpp) without sockets.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "common/cli_args.hpp"
#include "common/gguf.hpp"
#include "common/tokenizer/chat_template.hpp"
#include "kernels/cpu/cpu_features.hpp"
#include "kernels/cpu/thread_pool.hpp"
#include "worker/cli/bench_engine.hpp"
#include "worker/cli/serve_engine.hpp"
#include "worker/engine/generator.hpp"
#include "worker/model/llama_model.hpp"
#ifdef SY_NO_SERVE
#include "worker/cli/device_backend.hpp"
#else
#include "common/wire/curve_keys.hpp"
#include "worker/cli/grammar_cli.hpp"
#include "worker/cli/serve.hpp"
#include "worker/cli/tokenizer_export.hpp"
#endif

namespace {

#ifdef SY_NO_SERVE
constexpr const char* k_program = "switchyard-bench";
constexpr const char* k_serve = "serve-check";
#else
constexpr const char* k_program = "switchyard-worker";
constexpr const char* k_serve = "serve";
#endif

const char* default_model() {
  const char* e = std::getenv("SY_MODEL");
  return e ? e : "models/SmolLM2-135M-Instruct.Q4_1.gguf";
}

void usage() {
  std::fprintf(
      stderr,
      "usage: %s <command> [options]\n"
#ifdef SY_NO_SERVE
      "  (no serve in this build: serve-check runs serve's start-up, without sockets)\n"
#endif
      "  %s    [--listen tcp://127.0.0.1:5555] [--metrics-port 9100] [--kv-memory-mb 512 | --kv-blocks N]\n"
      "           [--kv-memory-fraction F] [--kv-type f16|f32|q8_0] [--no-prefix-cache]\n"
      "           [--kv-window-release on|off]   (sliding-window layers keep only their window's blocks; CPU)\n"
      "           [--embeddings [--pooling mean|last]]   (serve POST /v1/embeddings through routers; CPU only)\n"
      "           [--block-size 16] [--max-context 2048] [--max-running 32] [--max-batch-tokens 256]\n"
      "           [--max-step-ms MS]   (while streams decode, a step's prompt tokens fit MS; 0: off, the default)\n"
      "           [--prompt-panels per-step|resident|integer]   (resident: the prompt GEMM's bf16 weight panels\n"
      "                                built once, 2 bytes per weight, so small prompt chunks are cheap; integer:\n"
      "                                Q4_0..Q8_0 prompts on the 8-bit kernel, faster, less exact; CPU only)\n"
      "           [--device cpu|cuda|cuda:N] [--cuda-graphs on|off] [--chat-template NAME|FILE]\n"
      "           [--drain-timeout-s 30]   (after SIGTERM, what runs may finish for at most that long)\n"
      "           [--served-model-name NAME]...   (more names routers accept for the model, e.g. its HF id)\n"
      "           [--curve-secret-key FILE [--curve-allowed-clients FILE]]   (authenticated link; keygen)\n"
      "           [--allow-example-keys]   (start with a CURVE key published with Switchyard: demos only)\n"
      "           [--link-backlog 100000]   (frames waiting per router whose connection is full; beyond, its\n"
      "           heartbeats and KV events drop first, then its oldest frames)\n"
      "           [--engine-silence-s 60]   (the link repeats the engine's heartbeats during a step this long at\n"
      "                                      most; past it routers see the worker as dead)\n"
      "  generate --prompt TEXT [--chat] [--system TEXT] [--chat-template NAME|FILE] [--model PATH]\n"
      "           [--max-tokens N] [--temperature T] [--top-k K] [--top-p P] [--min-p P]\n"
      "           [--repeat-penalty R] [--seed S] [--stop TEXT]... [--ignore-eos] [--ctx N] [--threads N]\n"
      "           [--stats]\n"
      "  bench    [--model PATH] [--prompt-tokens 512] [--gen-tokens 128] [--repeat 3] [--prompt-panels MODE]\n"
      "           [--threads N] [--json FILE]\n"
      "  tokenize --prompt TEXT [--chat] [--system TEXT] [--chat-template NAME|FILE]   (token ids as JSON)\n"
#ifndef SY_NO_SERVE
      "  export-tokenizer --out DIR [--model PATH] [--chat-template NAME|FILE]\n"
      "           (a Hugging Face tokenizer folder, for clients that count tokens: aiperf, guidellm)\n"
      "  json-grammar --schema JSON|@FILE | --json-object  [--sample N [--seed S]] [--check] [--dump]\n"
      "           (the JSON Schema compiler of structured outputs: its error, grammar, documents)\n"
      "  keygen   --out PREFIX   (a CURVE key pair for the worker link: PREFIX.key secret, PREFIX.pub;\n"
      "           serve --curve-secret-key F [--curve-allowed-clients F]; router --curve-server-key F)\n"
#endif
      "  score    --tokens ID,ID,... --out FILE [--model PATH]   (raw f32 logits per position)\n"
      "  bench-engine [--concurrency 1,4,16,32] [--prompt-tokens 128] [--gen-tokens 128] [--json FILE]\n"
      "           [--kv-type f16|f32|q8_0] [--sections decode,batching,prefix,memory,window]\n"
      "           [--kv-window-release on|off]   (window: Gemma-shaped sequences in a KV budget, release on vs off)\n"
      "           [--skip batching,sequential,prefix,memory] [--device cpu|cuda:N] [--cuda-graphs on|off]\n"
      "           (on cuda:N the default is --sections decode --concurrency 1,8,64,256)\n"
      "  info     [--model PATH]\n"
      "The model defaults to $SY_MODEL or %s.\n"
      "--chat-template: one of %s, or a Jinja file; default: the model's.\n",
      k_program, k_serve, default_model(), sy::chat_format_names().c_str());
}

// --chat-template's template, checked before the model loads; nullopt when not given.
std::optional<sy::chat_template> chat_template_option(const sy::cli_args& a) {
  if (!a.has("chat-template")) return std::nullopt;
  return sy::chat_template::parse(sy::chat_template::read_option(a.get("chat-template")));
}

// --prompt as token ids; with --chat through the chat template (--chat-template's, else the
// model's) and --system.
std::vector<sy::token_id> prompt_ids(const sy::llama_model& model, const sy::cli_args& a,
                                     const std::optional<sy::chat_template>& chat_override) {
  std::string prompt = a.get("prompt");
  if (a.has("chat")) {
    const sy::chat_template& tmpl = chat_override ? *chat_override : model.chat();
    if (!tmpl.supported()) {
      throw std::runtime_error("--chat: the model's chat template cannot be applied (" + tmpl.unsupported_reason +
                               "); pass --chat-template NAME (" + sy::chat_format_names() + ") or a Jinja file");
    }
    std::vector<sy::chat_message> msgs;
    if (a.has("system")) msgs.push_back({"system", a.get("system")});
    msgs.push_back({"user", prompt});
    prompt = tmpl.apply(msgs, true);
  }
  return model.vocab().encode(prompt, {.parse_special = a.has("chat")});
}

double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

int cmd_generate(const sy::cli_args& a) {
  a.check_known({"model", "prompt", "chat", "system", "chat-template", "max-tokens", "temperature", "top-k", "top-p",
                 "min-p", "repeat-penalty", "seed", "stop", "ignore-eos", "ctx", "threads", "stats"});
  if (!a.has("prompt")) throw std::invalid_argument("generate needs --prompt");
  const auto chat_override = chat_template_option(a);
  sy::cpu::thread_pool pool(static_cast<int>(a.get_int("threads", 0)));
  auto model = sy::llama_model::load(a.get("model", default_model()), pool);
  const auto ids = prompt_ids(*model, a, chat_override);
  sy::sampling_params sp;
  sp.max_tokens = static_cast<int32_t>(a.get_int("max-tokens", 256));
  sp.temperature = static_cast<float>(a.get_float("temperature", 0.0));
  sp.top_k = static_cast<int32_t>(a.get_int("top-k", 0));
  sp.top_p = static_cast<float>(a.get_float("top-p", 1.0));
  sp.min_p = static_cast<float>(a.get_float("min-p", 0.0));
  sp.repetition_penalty = static_cast<float>(a.get_float("repeat-penalty", 1.0));
  if (a.has("seed")) {
    sp.seed = static_cast<uint64_t>(a.get_int("seed", 0));
    sp.has_seed = true;
  }
  sp.stop = a.all("stop");
  sp.ignore_eos = a.has("ignore-eos");
  if (const auto e = sy::validate(sp))
    throw std::invalid_argument("sampling parameter " + e->field + ": " + e->message);
  if (sp.top_k < 0) throw std::invalid_argument("--top-k must be >= 0");
  if (sp.min_p < 0 || sp.min_p > 1) throw std::invalid_argument("--min-p must be in [0, 1]");
  const int64_t n_ctx = std::min<int64_t>(a.get_int("ctx", 2048), model->hparams().n_ctx_train);
  sy::generator gen(*model, pool, n_ctx);
  auto res = gen.generate(ids, sp, [](std::string_view s) {
    std::fwrite(s.data(), 1, s.size(), stdout);
    std::fflush(stdout);
    return true;
  });
  std::fputc('\n', stdout);
  if (a.has("stats")) {
    const double n_dec = std::max<double>(1, static_cast<double>(res.tokens.size()) - 1);
    std::fprintf(stderr,
                 "[prompt %lld tokens in %.1f ms (%.1f tok/s); %zu tokens generated, %.1f tok/s; finish: %s; kernels: "
                 "%s, %d threads]\n",
                 static_cast<long long>(res.n_prompt), res.prompt_ms, res.n_prompt * 1000.0 / res.prompt_ms,
                 res.tokens.size(), n_dec * 1000.0 / std::max(res.decode_ms, 1e-3),
                 std::string(sy::name(res.finish_reason)).c_str(), sy::cpu::kernel_isa_name(), pool.size());
  }
  return 0;
}

// Prompt processing (pp) and decode (tg) throughput as llama-bench defines them: pp = one
// forward over N prompt tokens from an empty cache; tg = M single-token forwards from an
// empty cache. Median over --repeat runs after one warm-up.
int cmd_bench(const sy::cli_args& a) {
  a.check_known({"model", "prompt-tokens", "gen-tokens", "repeat", "threads", "json", "prompt-panels"});
  const auto panels = sy::parse_prompt_panels(a.get("prompt-panels", "per-step"));
  sy::cpu::thread_pool pool(static_cast<int>(a.get_int("threads", 0)));
  const double t_load = now_ms();
  auto model = sy::llama_model::load(a.get("model", default_model()), pool);
  const double load_ms = now_ms() - t_load;
  sy::apply_prompt_panels(panels, *model, pool, "switchyard-worker bench");
  const int64_t n_pp = a.get_int("prompt-tokens", 512), n_tg = a.get_int("gen-tokens", 128);
  const int reps = static_cast<int>(a.get_int("repeat", 3));
  std::string text;
  while (static_cast<int64_t>(model->vocab().encode(text, {.add_special = false, .parse_special = false}).size()) <
         n_pp)
    text += "The quick brown fox jumps over the lazy dog while the engineers measure tokens per second. ";
  auto ids = model->vocab().encode(text, {.add_special = false, .parse_special = false});
  ids.resize(static_cast<size_t>(n_pp));
  sy::kv_arena kv(model->hparams().n_layer, (n_pp + n_tg + 15) / 16, 16, model->hparams().kv_dim());
  std::vector<int32_t> blocks(static_cast<size_t>(kv.n_blocks()));
  for (size_t i = 0; i < blocks.size(); ++i) blocks[i] = static_cast<int32_t>(i);
  sy::cpu_forward fwd(*model, pool, n_pp + n_tg);
  std::vector<float> logits;
  std::vector<double> pp, tg;
  for (int r = 0; r <= reps; ++r) {
    double t0 = now_ms();
    sy::batch_seq b{ids, 0, blocks, false};
    b.n_prompt = n_pp;
    fwd.run(std::span<const sy::batch_seq>(&b, 1), kv, logits);
    const double pp_ms = now_ms() - t0;
    t0 = now_ms();
    sy::token_id tok = ids[0];
    for (int64_t i = 0; i < n_tg; ++i) {
      sy::batch_seq d{std::span<const sy::token_id>(&tok, 1), i, blocks, false};  // n_prompt 0: decode
      fwd.run(std::span<const sy::batch_seq>(&d, 1), kv, logits);
      tok = sy::argmax(logits);
    }
    const double tg_ms = now_ms() - t0;
    if (r == 0) continue;  // warm-up
    pp.push_back(n_pp * 1000.0 / pp_ms);
    tg.push_back(n_tg * 1000.0 / tg_ms);
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  const double pp_s = median(pp), tg_s = median(tg);
  std::printf("switchyard  model=%s  kernels=%s  threads=%d  load=%.0f ms\n", model->hparams().name.c_str(),
              sy::cpu::kernel_isa_name(), pool.size(), load_ms);
  std::printf("  pp%lld: %8.1f tok/s\n  tg%lld: %8.1f tok/s\n", static_cast<long long>(n_pp), pp_s,
              static_cast<long long>(n_tg), tg_s);
  if (a.has("json")) {
    std::ofstream out(a.get("json"));
    out << "{\"engine\":\"switchyard\",\"kernels\":\"" << sy::cpu::kernel_isa_name() << "\",\"threads\":" << pool.size()
        << ",\"pp_tokens\":" << n_pp << ",\"pp_tok_s\":" << pp_s << ",\"tg_tokens\":" << n_tg
        << ",\"tg_tok_s\":" << tg_s << ",\"load_ms\":" << load_ms << "}\n";
  }
  return 0;
}

// Token ids of a prompt (after the chat template with --chat), as a JSON array on stdout.
int cmd_tokenize(const sy::cli_args& a) {
  a.check_known({"model", "prompt", "chat", "system", "chat-template", "threads"});
  const auto chat_override = chat_template_option(a);
  sy::cpu::thread_pool pool(1);
  auto model = sy::llama_model::load(a.get("model", default_model()), pool);
  const auto ids = prompt_ids(*model, a, chat_override);
  std::string out = "[";
  for (size_t i = 0; i < ids.size(); ++i) out += (i ? "," : "") + std::to_string(ids[i]);
  std::printf("%s]\n", out.c_str());
  return 0;
}

#ifndef SY_NO_SERVE
// A Hugging Face tokenizer folder from the model's metadata (worker/cli/tokenizer_export.hpp); the
// weights are not loaded.
int cmd_export_tokenizer(const sy::cli_args& a) {
  a.check_known({"model", "out", "chat-template"});
  if (!a.has("out")) throw std::invalid_argument("export-tokenizer: --out DIR is required");
  const auto chat_override = chat_template_option(a);
  const auto f = sy::gguf::file::open(a.get("model", default_model()));
  const std::string arch = f.get_string("general.architecture");
  const auto ctx = static_cast<int64_t>(f.get_uint_or(arch + ".context_length", 2048));
  sy::export_hf_tokenizer(f, chat_override ? *chat_override : sy::chat_template::from_gguf(f), ctx, a.get("out"));
  std::printf("wrote tokenizer.json, tokenizer_config.json and generation_config.json to %s\n", a.get("out").c_str());
  return 0;
}

// A CURVE key pair for the worker link: PREFIX.key (secret, 0600) and PREFIX.pub; the same
// command makes a router's pair (common/wire/curve_keys.hpp, docs/operations.md).
int cmd_keygen(const sy::cli_args& a) {
  a.check_known({"out"});
  if (!a.has("out")) throw std::invalid_argument("keygen: --out PREFIX is required");
  const auto k = sy::curve::generate();
  sy::curve::write_key_files(k, a.get("out"));
  std::printf("%s\n", k.public_z85.c_str());  // the public key: safe to print, needed by the peer
  return 0;
}
#endif

// Teacher-forced logits of a token sequence, as raw little-endian f32 [n_tokens][n_vocab]
// (for comparisons with other implementations).
int cmd_score(const sy::cli_args& a) {
  a.check_known({"model", "tokens", "out", "threads"});
  sy::cpu::thread_pool pool(static_cast<int>(a.get_int("threads", 0)));
  auto model = sy::llama_model::load(a.get("model", default_model()), pool);
  std::vector<sy::token_id> ids;
  std::string list = a.get("tokens");
  for (size_t p = 0; p < list.size();) {
    size_t q = list.find(',', p);
    if (q == std::string::npos) q = list.size();
    ids.push_back(static_cast<sy::token_id>(std::stol(list.substr(p, q - p))));
    p = q + 1;
  }
  sy::generator gen(*model, pool, static_cast<int64_t>(ids.size()) + 16);
  const auto logits = gen.score(ids);
  std::ofstream out(a.get("out"), std::ios::binary);
  out.write(reinterpret_cast<const char*>(logits.data()), static_cast<std::streamsize>(logits.size() * 4));
  return out.good() ? 0 : 1;
}

int cmd_info(const sy::cli_args& a) {
  a.check_known({"model", "threads"});
  sy::cpu::thread_pool pool(static_cast<int>(a.get_int("threads", 0)));
  auto model = sy::llama_model::load(a.get("model", default_model()), pool);
  const auto& hp = model->hparams();
  std::printf("model: %s (%s), %lld layers, n_embd %lld, heads %lld/%lld, ff %lld, vocab %lld, ctx %lld\n",
              hp.name.c_str(), hp.arch.c_str(), (long long)hp.n_layer, (long long)hp.n_embd, (long long)hp.n_head,
              (long long)hp.n_head_kv, (long long)hp.n_ff, (long long)hp.n_vocab, (long long)hp.n_ctx_train);
  std::printf("weights: %.1f MiB in file, %.1f MiB repacked (bf16 panels)\n", model->weight_bytes() / 1048576.0,
              model->repacked_bytes() / 1048576.0);
  std::printf("cpu kernels: %s, %d threads, K-panel software prefetch %s\n", sy::cpu::kernel_isa_name(), pool.size(),
              sy::cpu::kq_line_prefetch_status());
  std::printf("amx: %s\n", sy::cpu::amx_status());
  std::printf("cuda: %s\n", sy::describe_cuda().c_str());
  return 0;
}

#ifdef SY_NO_SERVE
// serve's start-up as `serve` does it (the same flags, engine and messages), then exit 0 with
// what serve would print, instead of opening sockets.
int cmd_serve_check(const sy::cli_args& a) {
  a.check_known(sy::serve_options());
  const sy::device_choice dev = sy::parse_device_choice(a);
  chat_template_option(a);  // a bad --chat-template fails as serve's would
  const auto panels = sy::parse_prompt_panels(a.get("prompt-panels", "per-step"));  // and --prompt-panels
  sy::cpu::thread_pool pool(static_cast<int>(a.get_int("threads", 0)));
  auto model = sy::llama_model::load(a.get("model", default_model()), pool);
  if (!dev.cuda) sy::apply_prompt_panels(panels, *model, pool, "serve-check");
  const auto eng = sy::make_serve_engine(a, dev, *model, pool);
  const sy::engine_config& used = eng->config();
  const std::string device =
      dev.cuda ? eng->backend().describe() : std::string("cpu (") + sy::cpu::kernel_isa_name() + " kernels)";
  std::printf("serve-check: ok: %s on %s; %d KV blocks x %d tokens (%.0f MiB %s), max context %lld, max running %d\n",
              model->hparams().name.c_str(), device.c_str(), used.n_kv_blocks, used.block_size,
              static_cast<double>(eng->backend().kv_bytes()) / (1 << 20), sy::cpu::kv_type_name(used.kv_type),
              static_cast<long long>(used.max_context), used.sched.max_running);
  return 0;
}
#endif

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    usage();
    return 2;
  }
  const std::string cmd = argv[1];
  try {
    if (cmd == "generate") return cmd_generate(sy::cli_args(argc, argv, 2, {"chat", "ignore-eos", "stats"}));
    if (cmd == "bench") return cmd_bench(sy::cli_args(argc, argv, 2, {}));
    if (cmd == "bench-engine") return sy::run_bench_engine(sy::cli_args(argc, argv, 2, {}), default_model());
#ifdef SY_NO_SERVE
    if (cmd == "serve-check")
      return cmd_serve_check(sy::cli_args(argc, argv, 2, {"no-prefix-cache", "allow-example-keys", "embeddings"}));
#else
    if (cmd == "serve")
      return sy::run_serve(sy::cli_args(argc, argv, 2, {"no-prefix-cache", "allow-example-keys", "embeddings"}),
                           default_model());
    if (cmd == "export-tokenizer") return cmd_export_tokenizer(sy::cli_args(argc, argv, 2, {}));
    if (cmd == "keygen") return cmd_keygen(sy::cli_args(argc, argv, 2, {}));
    if (cmd == "json-grammar")
      return sy::run_json_grammar(sy::cli_args(argc, argv, 2, {"json-object", "check", "dump"}));
#endif
    if (cmd == "tokenize") return cmd_tokenize(sy::cli_args(argc, argv, 2, {"chat"}));
    if (cmd == "score") return cmd_score(sy::cli_args(argc, argv, 2, {}));
    if (cmd == "info") return cmd_info(sy::cli_args(argc, argv, 2, {}));
    if (cmd == "--help" || cmd == "-h" || cmd == "help") {
      usage();
      return 0;
    }
    std::fprintf(stderr, "%s: unknown command '%s'\n", k_program, cmd.c_str());
    usage();
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: error: %s\n", k_program, e.what());
    return 1;
  }
}
