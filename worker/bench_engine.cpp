// `switchyard-worker bench-engine`: continuous batching, prefix caching and KV memory figures of
// the engine in-process (no sockets), each comparison measured side by side in one run.
#include "worker/bench_engine.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>
#include <stdexcept>

#include "common/cli_args.hpp"
#include "kernels/cpu/cpu_features.hpp"
#include "kernels/cpu/thread_pool.hpp"
#include "worker/engine.hpp"

namespace sy {
namespace {

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

std::vector<token_id> random_prompt(std::mt19937& rng, int n) {
  std::uniform_int_distribution<token_id> d(200, 40000);
  std::vector<token_id> p(static_cast<size_t>(n));
  for (auto& t : p) t = d(rng);
  return p;
}

sampling_params fixed_length(int n) {
  sampling_params p;
  p.max_tokens = n;
  p.ignore_eos = true;
  return p;
}

// Steps until idle; returns seconds. `on_step` sees the engine after every step.
template <class F>
double drain(engine& e, F&& on_step) {
  std::vector<request_event> ev;
  const double t0 = now_s();
  while (e.has_work()) {
    ev.clear();
    e.step(0, ev);
    on_step(ev);
  }
  return now_s() - t0;
}

double percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[std::min(v.size() - 1, static_cast<size_t>(p * (v.size() - 1) + 0.5))];
}

}  // namespace

int run_bench_engine(const cli_args& a, const char* default_model) {
  a.check_known({"model", "threads", "concurrency", "prompt-tokens", "gen-tokens", "json", "skip", "kv-type"});
  cpu::thread_pool pool(static_cast<int>(a.get_int("threads", 0)));
  auto model = llama_model::load(a.get("model", default_model), pool);
  const auto& hp = model->hparams();
  std::string kv_error;
  const auto kvt = cpu::parse_kv_type(a.get("kv-type", "f16"), hp.head_dim, kv_error);
  if (!kvt) throw std::invalid_argument("--kv-type: " + kv_error);
  const int n_prompt = static_cast<int>(a.get_int("prompt-tokens", 128));
  const int n_gen = static_cast<int>(a.get_int("gen-tokens", 128));
  std::vector<int> levels;
  {
    std::stringstream ss(a.get("concurrency", "1,4,16,32"));
    for (std::string x; std::getline(ss, x, ',');) levels.push_back(std::stoi(x));
  }
  const std::string skip = a.get("skip", "");
  std::ostringstream js;
  js << "{\"kernels\":\"" << cpu::kernel_isa_name() << "\",\"threads\":" << pool.size() << ",\"kv_type\":\""
     << cpu::kv_type_name(*kvt) << "\"";
  std::printf("switchyard engine benchmark: %s, %d threads, kernels %s, KV cache %s\n", hp.name.c_str(), pool.size(),
              cpu::kernel_isa_name(), cpu::kv_type_name(*kvt));

  // 1. Continuous batching vs one at a time, same requests, same engine settings.
  if (skip.find("batching") == std::string::npos) {
    std::printf("\n[batching] %d-token prompts, %d new tokens each (ignore_eos), greedy\n", n_prompt, n_gen);
    std::printf(
        "  output tok/s = generated tokens / wall time from submission (prefill included);\n"
        "  decode tok/s = tokens sampled in pure-decode steps / the time of those steps\n");
    std::printf("%12s %18s %18s %8s %18s %18s %8s\n", "concurrency", "continuous output", "sequential output", "ratio",
                "continuous decode", "sequential decode", "ratio");
    js << ",\"batching\":[";
    for (size_t li = 0; li < levels.size(); ++li) {
      const int c = levels[li];
      std::mt19937 rng(1234 + c);
      std::vector<std::vector<token_id>> prompts;
      for (int i = 0; i < c; ++i) prompts.push_back(random_prompt(rng, n_prompt));
      engine_config cfg;
      cfg.n_kv_blocks = std::max(64, c * (n_prompt + n_gen) / 16 + c + 8);
      cfg.sched.max_running = std::max(32, c);
      cfg.prefix_caching = false;
      cfg.kv_type = *kvt;
      double t_cont, t_seq;
      // Pure-decode steps (every scheduled sequence fed exactly one token): time and tokens.
      double dec_ms[2] = {0, 0}, dec_tok[2] = {0, 0};
      auto decode_meter = [&](engine& e, int k) {
        return [&e, &dec_ms, &dec_tok, k](const std::vector<request_event>&) {
          const auto st = e.stats();
          if (st.last_batch_seqs > 0 && st.last_batch_tokens == st.last_batch_seqs) {
            dec_ms[k] += st.last_step_ms;
            dec_tok[k] += st.last_batch_seqs;
          }
        };
      };
      {
        engine e(*model, pool, cfg);
        for (int i = 0; i < c; ++i) e.submit("r" + std::to_string(i), prompts[i], fixed_length(n_gen), 0);
        t_cont = drain(e, decode_meter(e, 0));
      }
      if (skip.find("sequential") != std::string::npos) {
        t_seq = 1e30;  // profiling the batched path alone
      } else {
        engine e(*model, pool, cfg);
        t_seq = 0;
        for (int i = 0; i < c; ++i) {
          e.submit("r" + std::to_string(i), prompts[i], fixed_length(n_gen), 0);
          t_seq += drain(e, decode_meter(e, 1));
        }
      }
      const double tc = c * n_gen / t_cont, ts = c * n_gen / t_seq;
      const double dc = dec_tok[0] * 1000 / dec_ms[0], ds = dec_tok[1] * 1000 / dec_ms[1];
      std::printf("%12d %18.1f %18.1f %7.2fx %18.1f %18.1f %7.2fx\n", c, tc, ts, tc / ts, dc, ds, dc / ds);
      std::fflush(stdout);
      js << (li ? "," : "") << "{\"concurrency\":" << c << ",\"continuous_tok_s\":" << tc
         << ",\"sequential_tok_s\":" << ts << ",\"ratio\":" << tc / ts << ",\"continuous_decode_tok_s\":" << dc
         << ",\"sequential_decode_tok_s\":" << ds << ",\"decode_ratio\":" << dc / ds << "}";
    }
    js << "]";
  }

  // 2. Shared prefix: 16 requests = the same 512-token system prompt + their own 32-token
  // question, arriving one after another (each after the previous one's first token).
  if (skip.find("prefix") == std::string::npos) {
    std::mt19937 rng(99);
    const auto system = random_prompt(rng, 512);
    std::vector<std::vector<token_id>> reqs;
    for (int i = 0; i < 16; ++i) {
      auto p = system;
      auto q = random_prompt(rng, 32);
      p.insert(p.end(), q.begin(), q.end());
      reqs.push_back(p);
    }
    std::vector<double> ttft[2];
    for (int cached = 1; cached >= 0; --cached) {
      engine_config cfg;
      cfg.n_kv_blocks = 1024;
      cfg.prefix_caching = cached;
      cfg.kv_type = *kvt;
      engine e(*model, pool, cfg);
      for (int i = 0; i < 16; ++i) {
        const std::string id = "p" + std::to_string(i);
        e.submit(id, reqs[i], fixed_length(8), 0);
        const double t0 = now_s();
        bool first = false;
        drain(e, [&](const std::vector<request_event>& ev) {
          for (const auto& x : ev)
            if (!first && x.id == id && !x.tokens.empty()) {
              first = true;
              ttft[cached].push_back((now_s() - t0) * 1000);
            }
        });
      }
    }
    const double p50c = percentile(ttft[1], 0.5), p50u = percentile(ttft[0], 0.5);
    double meanc = 0, meanu = 0;
    for (double x : ttft[1]) meanc += x / 16;
    for (double x : ttft[0]) meanu += x / 16;
    std::printf("\n[prefix] 16 requests sharing a 512-token system prompt (+32 own tokens), arriving in turn\n");
    std::printf("  TTFT with prefix caching:    p50 %7.1f ms  mean %7.1f ms\n", p50c, meanc);
    std::printf("  TTFT without prefix caching: p50 %7.1f ms  mean %7.1f ms\n", p50u, meanu);
    std::printf("  speed-up: p50 %.2fx, mean %.2fx\n", p50u / p50c, meanu / meanc);
    js << ",\"prefix\":{\"ttft_p50_ms_cached\":" << p50c << ",\"ttft_p50_ms_uncached\":" << p50u
       << ",\"ttft_mean_ms_cached\":" << meanc << ",\"ttft_mean_ms_uncached\":" << meanu
       << ",\"speedup_p50\":" << p50u / p50c << "}";
  }

  // 3. KV memory: share of allocated KV slots holding live tokens on mixed lengths, and how
  // many sequences a fixed budget holds, against reserving a maximum context per sequence. The
  // budget is in bytes: 896 f16 blocks (14,336 tokens: 28 x 512, or 7 x 2048); a smaller KV type
  // fits more blocks in it.
  if (skip.find("memory") == std::string::npos) {
    std::mt19937 rng(7);
    std::uniform_int_distribution<int> plen(32, 400), glen(16, 200);
    engine_config cfg;
    cfg.kv_type = *kvt;
    const int64_t budget_bytes =
        896 * kv_arena::block_bytes(hp.n_layer, cfg.block_size, hp.kv_dim(), cpu::kv_type::f16);
    cfg.n_kv_blocks =
        static_cast<int32_t>(budget_bytes / kv_arena::block_bytes(hp.n_layer, cfg.block_size, hp.kv_dim(), *kvt));
    cfg.sched.max_running = 256;
    cfg.sched.max_tokens_per_step = 512;
    cfg.prefix_caching = false;
    engine e(*model, pool, cfg);
    for (int i = 0; i < 96; ++i)
      e.submit("m" + std::to_string(i), random_prompt(rng, plen(rng)), fixed_length(glen(rng)), 0);
    double util_sum = 0;
    int steps = 0, peak = 0;
    const double secs = drain(e, [&](const std::vector<request_event>&) {
      const auto ps = e.pool().stats();
      if (ps.in_use > 0) {
        util_sum += static_cast<double>(e.live_kv_tokens()) / (ps.in_use * cfg.block_size);
        ++steps;
      }
      peak = std::max(peak, e.stats().running);
    });
    const double util = util_sum / std::max(1, steps);
    const int budget = cfg.n_kv_blocks * cfg.block_size;
    std::printf(
        "\n[memory] 96 requests, prompts 32-400 tokens, outputs 16-200 tokens, KV budget %.1f MiB = %d tokens %s\n",
        static_cast<double>(budget_bytes) / (1 << 20), budget, cpu::kv_type_name(*kvt));
    std::printf("  live tokens / allocated KV slots: %.1f%% (mean over %d steps)\n", util * 100, steps);
    std::printf("  peak concurrent sequences: %d paged, vs %d reserving 2048 tokens each, %d reserving 512\n", peak,
                budget / 2048, budget / 512);
    std::printf("  (%.1f s, %llu preemptions)\n", secs, static_cast<unsigned long long>(e.stats().preemptions));
    js << ",\"memory\":{\"budget_tokens\":" << budget << ",\"kv_slot_utilization\":" << util
       << ",\"peak_sequences_paged\":" << peak << ",\"sequences_reserved_2048\":" << budget / 2048
       << ",\"sequences_reserved_512\":" << budget / 512 << "}";
  }
  js << "}\n";
  if (a.has("json")) std::ofstream(a.get("json")) << js.str();
  return 0;
}

}  // namespace sy
