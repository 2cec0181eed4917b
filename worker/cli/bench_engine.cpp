// `switchyard-worker bench-engine`: continuous batching, prefix caching and KV memory figures of
// the engine in-process (no sockets), each comparison measured side by side in one run; and
// (`--device cuda:N`, section `decode`) decode step time, aggregate tokens/s and memory-bandwidth
// utilisation per batch size.
#include "worker/cli/bench_engine.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <stdexcept>

#include "common/cli_args.hpp"
#include "kernels/cpu/cpu_features.hpp"
#include "kernels/cpu/mem_bandwidth.hpp"
#include "kernels/cpu/thread_pool.hpp"
#include "worker/cli/device_backend.hpp"
#include "worker/engine/engine.hpp"

namespace sy {
namespace {

using ordered_json = nlohmann::ordered_json;  // keys in the order the report has always had

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// Random ordinary tokens of the model's vocabulary (ids past the first 200, where the control and
// byte tokens of the usual vocabularies sit, and below 40000 as before for SmolLM2's 49k).
std::vector<token_id> random_prompt(std::mt19937& rng, int n, int64_t n_vocab) {
  const auto hi = static_cast<token_id>(std::min<int64_t>(40000, n_vocab - 1));
  std::uniform_int_distribution<token_id> d(std::min<token_id>(200, hi / 2), hi);
  std::vector<token_id> p(static_cast<size_t>(n));
  for (auto& t : p) t = d(rng);
  return p;
}

// A benchmark request the engine refuses would make every figure meaningless: stop at once.
void submit_or_throw(engine& e, const std::string& id, const std::vector<token_id>& prompt, const sampling_params& p) {
  if (auto err = e.submit(id, prompt, p, 0))
    throw std::runtime_error("bench-engine: the engine refused request " + id + ": " + err->message);
}

// A section that measured nothing (no steps, no time) fails the run instead of printing zeros.
void require_measured(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error("bench-engine: " + what + " measured nothing");
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

bool has_word(const std::string& list, const std::string& word) {
  std::stringstream ss(list);
  for (std::string x; std::getline(ss, x, ',');)
    if (x == word) return true;
  return false;
}

// What every section needs: the device, the model, the KV type and the workload flags.
struct bench_setup {
  device_choice dev;
  cpu::thread_pool* pool;
  const llama_model* model;
  cpu::kv_type kvt;
  int n_prompt, n_gen;
  float temperature, top_p;  // [batching]: greedy by default; sampled decoding (seeded) when set
  std::vector<int> levels;   // concurrency levels / batch sizes
  std::string skip;
  bool window_release;  // --kv-window-release (worker/model/kv_window.hpp)
  // [decode] on the CPU: the read-bandwidth probe, made at its first use and held until the run
  // ends (mem_bandwidth.hpp)
  std::unique_ptr<cpu::read_probe> probe = nullptr;

  // Every engine the sections made, held until the run ends: an engine freed while later steps
  // are timed gives its KV arena back, and on a VM the host's reclaiming it slows those steps
  // (docs/benchmarking.md, "Timings on virtual machines").
  std::vector<std::unique_ptr<engine>> engines = {};

  // An engine on the chosen device; the CUDA backend is sized like cfg (its KV blocks exactly).
  engine& make_engine(engine_config cfg) {
    cfg.kv_window_release = cfg.kv_window_release && window_release;
    if (!dev.cuda) return *engines.emplace_back(std::make_unique<engine>(*model, *pool, cfg));
    cuda_backend_settings cs;
    cs.block_size = cfg.block_size;
    cs.n_kv_blocks = cfg.n_kv_blocks;
    cs.max_tokens_per_step = cfg.sched.max_tokens_per_step;
    cs.max_running = cfg.sched.max_running;
    cs.max_context = cfg.max_context;
    return *engines.emplace_back(std::make_unique<engine>(*model, make_cuda_backend(*model, dev, cs), cfg));
  }
  sampling_params batching_params(int i) const {
    sampling_params p = fixed_length(n_gen);
    p.temperature = temperature;
    p.top_p = top_p;
    p.has_seed = true;
    p.seed = static_cast<uint64_t>(i);
    return p;
  }
};

// 0. Decode: per batch size, `c` requests of n_prompt random tokens submitted at once, n_gen new
// tokens each (greedy, EOS ignored: sampled by the backend where it samples). Step time and
// tokens/s over the pure decode steps with all c sequences; memory-bandwidth utilisation =
// bytes a step must read (weights + the live K/V) / (step time x measured copy bandwidth).
ordered_json bench_decode(bench_setup& b) {
  const int n_prompt = b.n_prompt, n_gen = b.n_gen;
  // bytes/s: device-to-device copy (read + write) on a GPU, read bandwidth of all threads on the CPU
  if (!b.dev.cuda && !b.probe) b.probe = std::make_unique<cpu::read_probe>(*b.pool);
  const double bw = b.dev.cuda ? measure_copy_bandwidth(b.dev) : b.probe->measure(*b.pool);
  const int c_max = *std::max_element(b.levels.begin(), b.levels.end());
  engine_config cfg;
  cfg.n_kv_blocks = c_max * ((n_prompt + n_gen + cfg.block_size - 1) / cfg.block_size + 1) + 16;
  cfg.sched.max_running = c_max;
  cfg.sched.max_tokens_per_step = std::max(2048, c_max);
  cfg.max_context = std::max<int64_t>(cfg.max_context, n_prompt + n_gen);
  cfg.prefix_caching = false;
  cfg.kv_type = b.kvt;
  engine& e = b.make_engine(cfg);
  const forward_backend& be = e.backend();
  {  // warm-up: first launches, cuBLAS heuristics, allocator
    std::mt19937 rng(1);
    for (int i = 0; i < 2; ++i)
      submit_or_throw(e, "w" + std::to_string(i), random_prompt(rng, n_prompt, b.model->hparams().n_vocab),
                      fixed_length(4));
    drain(e, [](const std::vector<request_event>&) {});
  }
  std::printf("\n[decode] %s; %d-token prompts, %d new tokens each, greedy; pure decode steps only\n",
              be.describe().c_str(), n_prompt, n_gen);
  if (bw > 0)
    std::printf("  %s: %.1f GB/s; weights read per step: %.1f MiB\n",
                b.dev.cuda ? "device copy bandwidth (cudaMemcpy D2D, read + write)"
                           : "memory read bandwidth (all threads streaming 1 GiB)",
                bw / 1e9, static_cast<double>(be.weight_read_bytes()) / (1 << 20));
  std::printf("%8s %12s %12s %12s %14s %10s\n", "batch", "step ms", "tok/s", "TTFT ms", "read MiB/step", "bw util");
  ordered_json js{{"bandwidth_gb_s", bw / 1e9},
                  {"bandwidth_kind", b.dev.cuda ? "d2d_copy" : "read"},
                  {"weight_read_bytes", be.weight_read_bytes()},
                  {"levels", ordered_json::array()}};
  for (const int c : b.levels) {
    std::mt19937 rng(1234 + c);
    std::vector<double> first(static_cast<size_t>(c), -1);
    const double t0 = now_s();
    for (int i = 0; i < c; ++i)
      submit_or_throw(e, std::to_string(i), random_prompt(rng, n_prompt, b.model->hparams().n_vocab),
                      fixed_length(n_gen));
    double dec_ms = 0, kv_tokens = 0;
    int n_steps = 0;
    drain(e, [&](const std::vector<request_event>& ev) {
      for (const auto& x : ev)
        if (!x.tokens.empty() && first[std::stoul(x.id)] < 0) first[std::stoul(x.id)] = (now_s() - t0) * 1000;
      const auto st = e.stats();
      if (st.last_batch_seqs == c && st.last_batch_tokens == c) {
        dec_ms += st.last_step_ms;
        kv_tokens += static_cast<double>(e.live_kv_tokens());  // keys attention read in that step
        ++n_steps;
      }
    });
    require_measured(n_steps > 0 && dec_ms > 0, "[decode] at batch " + std::to_string(c));
    const double step_ms = dec_ms / n_steps;
    const double tok_s = step_ms > 0 ? c * 1000.0 / step_ms : 0;
    const double ttft = *std::max_element(first.begin(), first.end());  // every request's first token
    const double read = static_cast<double>(be.weight_read_bytes()) +
                        (n_steps ? kv_tokens / n_steps : 0) * static_cast<double>(be.kv_bytes_per_token());
    const double util = bw > 0 && step_ms > 0 ? read / (step_ms / 1000 * bw) : 0;
    if (bw > 0)
      std::printf("%8d %12.3f %12.0f %12.1f %14.1f %9.1f%%\n", c, step_ms, tok_s, ttft, read / (1 << 20), util * 100);
    else
      std::printf("%8d %12.3f %12.0f %12.1f %14.1f %10s\n", c, step_ms, tok_s, ttft, read / (1 << 20), "-");
    std::fflush(stdout);
    js["levels"].push_back({{"batch", c},
                            {"step_ms", step_ms},
                            {"tok_s", tok_s},
                            {"ttft_ms", ttft},
                            {"read_bytes", read},
                            {"bw_util", util},
                            {"decode_steps", n_steps}});
  }
  return js;
}

// 1. Continuous batching vs one at a time, same requests, same engine settings.
ordered_json bench_batching(bench_setup& b) {
  const int n_prompt = b.n_prompt, n_gen = b.n_gen;
  if (b.temperature > 0)
    std::printf("\n[batching] %d-token prompts, %d new tokens each (ignore_eos), temperature %.2f, top-p %.2f\n",
                n_prompt, n_gen, b.temperature, b.top_p);
  else
    std::printf("\n[batching] %d-token prompts, %d new tokens each (ignore_eos), greedy\n", n_prompt, n_gen);
  std::printf(
      "  output tok/s = generated tokens / wall time from submission (prefill included);\n"
      "  decode tok/s = tokens sampled in pure-decode steps / the time of those steps\n");
  std::printf("%12s %18s %18s %8s %18s %18s %8s\n", "concurrency", "continuous output", "sequential output", "ratio",
              "continuous decode", "sequential decode", "ratio");
  ordered_json js = ordered_json::array();
  // One engine, sized for the largest level, runs every level both ways (prefix caching off:
  // nothing of one run helps the next), so no arena is freed between the runs compared.
  const int c_max = *std::max_element(b.levels.begin(), b.levels.end());
  engine_config cfg;
  cfg.n_kv_blocks = std::max(64, c_max * (n_prompt + n_gen) / 16 + c_max + 8);
  cfg.sched.max_running = std::max(32, c_max);
  cfg.prefix_caching = false;
  cfg.kv_type = b.kvt;
  engine& e = b.make_engine(cfg);
  for (const int c : b.levels) {
    std::mt19937 rng(1234 + c);
    std::vector<std::vector<token_id>> prompts;
    for (int i = 0; i < c; ++i) prompts.push_back(random_prompt(rng, n_prompt, b.model->hparams().n_vocab));
    double t_cont, t_seq;
    // Pure-decode steps (every scheduled sequence fed exactly one token): time and tokens.
    double dec_ms[2] = {0, 0}, dec_tok[2] = {0, 0};
    auto decode_meter = [&](int k) {
      return [&e, &dec_ms, &dec_tok, k](const std::vector<request_event>&) {
        const auto st = e.stats();
        if (st.last_batch_seqs > 0 && st.last_batch_tokens == st.last_batch_seqs) {
          dec_ms[k] += st.last_step_ms;
          dec_tok[k] += st.last_batch_seqs;
        }
      };
    };
    for (int i = 0; i < c; ++i) submit_or_throw(e, "r" + std::to_string(i), prompts[i], b.batching_params(i));
    t_cont = drain(e, decode_meter(0));
    require_measured(t_cont > 0 && dec_ms[0] > 0, "[batching] at concurrency " + std::to_string(c));
    if (has_word(b.skip, "sequential")) {
      t_seq = 1e30;  // profiling the batched path alone
    } else {
      t_seq = 0;
      for (int i = 0; i < c; ++i) {
        submit_or_throw(e, "r" + std::to_string(i), prompts[i], b.batching_params(i));
        t_seq += drain(e, decode_meter(1));
      }
    }
    const double tc = c * n_gen / t_cont, dc = dec_tok[0] * 1000 / dec_ms[0];
    if (t_seq >= 1e30) {  // skipped: no sequential figures, no ratios
      std::printf("%12d %18.1f %18s %8s %18.1f %18s %8s\n", c, tc, "-", "-", dc, "-", "-");
      std::fflush(stdout);
      js.push_back({{"concurrency", c}, {"continuous_tok_s", tc}, {"continuous_decode_tok_s", dc}});
      continue;
    }
    require_measured(t_seq > 0 && dec_ms[1] > 0, "[batching] sequential at concurrency " + std::to_string(c));
    const double ts = c * n_gen / t_seq, ds = dec_tok[1] * 1000 / dec_ms[1];
    std::printf("%12d %18.1f %18.1f %7.2fx %18.1f %18.1f %7.2fx\n", c, tc, ts, tc / ts, dc, ds, dc / ds);
    std::fflush(stdout);
    js.push_back({{"concurrency", c},
                  {"continuous_tok_s", tc},
                  {"sequential_tok_s", ts},
                  {"ratio", tc / ts},
                  {"continuous_decode_tok_s", dc},
                  {"sequential_decode_tok_s", ds},
                  {"decode_ratio", dc / ds}});
  }
  return js;
}

// 2. Shared prefix: 16 requests = the same 512-token system prompt + their own 32-token
// question, arriving one after another (each after the previous one's first token).
ordered_json bench_prefix(bench_setup& b) {
  std::mt19937 rng(99);
  const auto system = random_prompt(rng, 512, b.model->hparams().n_vocab);
  std::vector<std::vector<token_id>> reqs;
  for (int i = 0; i < 16; ++i) {
    auto p = system;
    auto q = random_prompt(rng, 32, b.model->hparams().n_vocab);
    p.insert(p.end(), q.begin(), q.end());
    reqs.push_back(p);
  }
  std::vector<double> ttft[2];
  for (int cached = 1; cached >= 0; --cached) {
    engine_config cfg;
    cfg.n_kv_blocks = 1024;
    cfg.prefix_caching = cached;
    cfg.kv_type = b.kvt;
    engine& e = b.make_engine(cfg);
    for (int i = 0; i < 16; ++i) {
      const std::string id = "p" + std::to_string(i);
      submit_or_throw(e, id, reqs[i], fixed_length(8));
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
  require_measured(ttft[0].size() == 16 && ttft[1].size() == 16, "[prefix]");
  const double p50c = percentile(ttft[1], 0.5), p50u = percentile(ttft[0], 0.5);
  double meanc = 0, meanu = 0;
  for (double x : ttft[1]) meanc += x / 16;
  for (double x : ttft[0]) meanu += x / 16;
  std::printf("\n[prefix] 16 requests sharing a 512-token system prompt (+32 own tokens), arriving in turn\n");
  std::printf("  TTFT with prefix caching:    p50 %7.1f ms  mean %7.1f ms\n", p50c, meanc);
  std::printf("  TTFT without prefix caching: p50 %7.1f ms  mean %7.1f ms\n", p50u, meanu);
  std::printf("  speed-up: p50 %.2fx, mean %.2fx\n", p50u / p50c, meanu / meanc);
  return {{"ttft_p50_ms_cached", p50c},
          {"ttft_p50_ms_uncached", p50u},
          {"ttft_mean_ms_cached", meanc},
          {"ttft_mean_ms_uncached", meanu},
          {"speedup_p50", p50u / p50c}};
}

// 3. KV memory: share of allocated KV slots holding live tokens on mixed lengths, and how
// many sequences a fixed budget holds, against reserving a maximum context per sequence. The
// budget is in bytes: 896 f16 blocks (14,336 tokens: 28 x 512, or 7 x 2048); a smaller KV type
// fits more blocks in it.
ordered_json bench_memory(bench_setup& b) {
  const llama_hparams& hp = b.model->hparams();
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> plen(32, 400), glen(16, 200);
  engine_config cfg;
  cfg.kv_type = b.kvt;
  const int64_t budget_bytes = 896 * kv_arena::block_bytes(hp.n_layer, cfg.block_size, hp.kv_dim(), cpu::kv_type::f16);
  cfg.n_kv_blocks =
      static_cast<int32_t>(budget_bytes / kv_arena::block_bytes(hp.n_layer, cfg.block_size, hp.kv_dim(), b.kvt));
  cfg.sched.max_running = 256;
  cfg.sched.max_tokens_per_step = 512;
  cfg.prefix_caching = false;
  engine& e = b.make_engine(cfg);
  for (int i = 0; i < 96; ++i)
    submit_or_throw(e, "m" + std::to_string(i), random_prompt(rng, plen(rng), hp.n_vocab), fixed_length(glen(rng)));
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
  require_measured(steps > 0 && secs > 0, "[memory]");
  const double util = util_sum / steps;
  const int budget = cfg.n_kv_blocks * cfg.block_size;
  std::printf(
      "\n[memory] 96 requests, prompts 32-400 tokens, outputs 16-200 tokens, KV budget %.1f MiB = %d tokens %s\n",
      static_cast<double>(budget_bytes) / (1 << 20), budget, cpu::kv_type_name(b.kvt));
  std::printf("  live tokens / allocated KV slots: %.1f%% (mean over %d steps)\n", util * 100, steps);
  std::printf("  peak concurrent sequences: %d paged, vs %d reserving 2048 tokens each, %d reserving 512\n", peak,
              budget / 2048, budget / 512);
  std::printf("  (%.1f s, %llu preemptions)\n", secs, static_cast<unsigned long long>(e.stats().preemptions));
  return {{"budget_tokens", budget},
          {"kv_slot_utilization", util},
          {"peak_sequences_paged", peak},
          {"sequences_reserved_2048", budget / 2048},
          {"sequences_reserved_512", budget / 512}};
}

// 4. Sliding-window release (worker/model/kv_window.hpp; a model with sliding-window layers, e.g.
// Gemma 3): how many 2048-token sequences a KV budget of 7 such sequences' bytes (f16, every
// layer) holds at once, with the release as `--kv-window-release` says and without it, side by
// side. 24 requests of 1920 prompt tokens + 128 generated arrive together and prefill in 512-token
// chunks while the admitted ones decode, so the first still runs when the budget is full; a run
// ends when the first request finishes. Figures: the peak of KV tokens held for running
// requests, in 2048-token sequences, and the peak of running requests.
ordered_json bench_window(bench_setup& b) {
  const llama_hparams& hp = b.model->hparams();
  if (hp.sliding_window <= 0)
    throw std::invalid_argument("bench-engine [window]: " + hp.name +
                                " has no sliding-window layers (a gemma3 file, e.g. Gemma 3 270M)");
  constexpr int n_seq_tokens = 2048, n_gen = 128, n_requests = 24;
  int n_windowed = 0;
  for (const llama_layer& L : b.model->layers()) n_windowed += L.windowed;
  std::mt19937 rng(11);
  std::vector<std::vector<token_id>> prompts;
  for (int i = 0; i < n_requests; ++i) prompts.push_back(random_prompt(rng, n_seq_tokens - n_gen, hp.n_vocab));
  engine_config base;
  base.kv_type = b.kvt;
  base.max_context = n_seq_tokens;
  base.prefix_caching = false;
  base.sched.max_running = n_requests;
  base.sched.max_tokens_per_step = 512;
  base.n_kv_blocks =
      static_cast<int32_t>(7 * n_seq_tokens / base.block_size *
                           kv_arena::block_bytes(hp.n_layer, base.block_size, hp.kv_dim(), cpu::kv_type::f16) /
                           kv_arena::block_bytes(hp.n_layer, base.block_size, hp.kv_dim(), b.kvt));
  struct figures {
    double peak_seqs = 0;
    int peak_running = 0, global_blocks = 0, window_blocks = 0;
    double secs = 0;
  };
  auto measure = [&](bool release) {
    engine_config cfg = base;
    cfg.kv_window_release = release;
    engine& e = b.make_engine(cfg);
    for (int i = 0; i < n_requests; ++i) submit_or_throw(e, "w" + std::to_string(i), prompts[i], fixed_length(n_gen));
    figures f;
    f.global_blocks = e.pool().n_blocks();
    f.window_blocks = e.window_pool().n_blocks();
    std::vector<request_event> ev;
    const double t0 = now_s();
    bool finished = false;
    while (e.has_work() && !finished) {
      ev.clear();
      e.step(0, ev);
      for (const auto& x : ev) finished = finished || x.finish != finish_reason::none;
      f.peak_seqs = std::max(f.peak_seqs, static_cast<double>(e.live_kv_tokens()) / n_seq_tokens);
      f.peak_running = std::max(f.peak_running, e.stats().running);
    }
    f.secs = now_s() - t0;
    for (int i = 0; i < n_requests; ++i) e.cancel("w" + std::to_string(i));
    drain(e, [](const std::vector<request_event>&) {});
    return f;
  };
  const bool release = b.window_release;
  const figures off = measure(false), on = release ? measure(true) : off;
  require_measured(off.peak_seqs > 0 && on.peak_seqs > 0 && on.window_blocks >= 0, "[window]");
  if (release && on.window_blocks == 0)
    throw std::runtime_error("bench-engine [window]: the backend on " + b.dev.name() +
                             " keeps every layer's blocks (the sliding-window release is CPU only)");
  std::printf(
      "\n[window] %d requests of %d tokens (%d prompt + %d generated), sliding window %lld on %d of %lld "
      "layers; KV budget = 7 such sequences (%d blocks of every layer, %s)\n",
      n_requests, n_seq_tokens, n_seq_tokens - n_gen, n_gen, static_cast<long long>(hp.sliding_window), n_windowed,
      static_cast<long long>(hp.n_layer), base.n_kv_blocks, cpu::kv_type_name(b.kvt));
  std::printf("  release off: %5.1f sequences' KV held at once (peak), %2d running; %d blocks (%.1f s)\n",
              off.peak_seqs, off.peak_running, off.global_blocks, off.secs);
  if (release) {
    std::printf(
        "  release on:  %5.1f sequences' KV held at once (peak), %2d running; %d global + %d window blocks "
        "(%.1f s)\n",
        on.peak_seqs, on.peak_running, on.global_blocks, on.window_blocks, on.secs);
    std::printf("  %.2fx the sequences in the same KV memory\n", on.peak_seqs / off.peak_seqs);
  }
  ordered_json js{{"seq_tokens", n_seq_tokens},
                  {"budget_blocks", base.n_kv_blocks},
                  {"peak_sequences_off", off.peak_seqs},
                  {"peak_running_off", off.peak_running}};
  if (release) {
    js["peak_sequences_on"] = on.peak_seqs;
    js["peak_running_on"] = on.peak_running;
    js["global_blocks_on"] = on.global_blocks;
    js["window_blocks_on"] = on.window_blocks;
    js["ratio"] = on.peak_seqs / off.peak_seqs;
  }
  return js;
}

std::vector<int> concurrency_levels(const cli_args& a, bool cuda) {
  std::vector<int> levels;
  std::stringstream ss(a.get("concurrency", cuda ? "1,8,64,256" : "1,4,16,32"));
  for (std::string x; std::getline(ss, x, ',');) levels.push_back(std::stoi(x));
  if (levels.empty() || *std::min_element(levels.begin(), levels.end()) < 1)
    throw std::invalid_argument("--concurrency: a list of positive numbers");
  return levels;
}

}  // namespace

int run_bench_engine(const cli_args& a, const char* default_model) {
  a.check_known({"model", "threads", "concurrency", "prompt-tokens", "gen-tokens", "json", "skip", "kv-type", "device",
                 "cuda-graphs", "sections", "temperature", "top-p", "kv-window-release"});
  const device_choice dev = parse_device_choice(a);
  cpu::thread_pool pool(static_cast<int>(a.get_int("threads", 0)));
  auto model = llama_model::load(a.get("model", default_model), pool);
  const auto& hp = model->hparams();
  std::string kv_error;
  const auto kvt = cpu::parse_kv_type(a.get("kv-type", "f16"), hp.head_dim, kv_error);
  if (!kvt) throw std::invalid_argument("--kv-type: " + kv_error);
  if (dev.cuda && *kvt != cpu::kv_type::f16) throw std::invalid_argument("--kv-type: the CUDA backend stores f16");
  bench_setup b{dev,
                &pool,
                model.get(),
                *kvt,
                static_cast<int>(a.get_int("prompt-tokens", 128)),
                static_cast<int>(a.get_int("gen-tokens", 128)),
                static_cast<float>(a.get_float("temperature", 0.0)),
                static_cast<float>(a.get_float("top-p", 1.0)),
                concurrency_levels(a, dev.cuda),
                a.get("skip", ""),
                parse_kv_window_release(a.get("kv-window-release", "on"))};
  // Sections: --sections (default: decode on a GPU, the CPU figures elsewhere) minus --skip.
  const std::string sections = a.get("sections", dev.cuda ? "decode" : "batching,prefix,memory");
  auto run_section = [&](const std::string& s) { return has_word(sections, s) && !has_word(b.skip, s); };
  ordered_json js{{"device", dev.name()},
                  {"kernels", cpu::kernel_isa_name()},
                  {"threads", pool.size()},
                  {"kv_type", cpu::kv_type_name(*kvt)}};
  std::printf("switchyard engine benchmark: %s on %s, %d threads, kernels %s, KV cache %s\n", hp.name.c_str(),
              dev.name().c_str(), pool.size(), cpu::kernel_isa_name(), cpu::kv_type_name(*kvt));
  if (run_section("decode")) js["decode"] = bench_decode(b);
  if (run_section("batching")) js["batching"] = bench_batching(b);
  if (run_section("prefix")) js["prefix"] = bench_prefix(b);
  if (run_section("memory")) js["memory"] = bench_memory(b);
  if (run_section("window")) js["window"] = bench_window(b);
  if (a.has("json")) std::ofstream(a.get("json")) << js.dump() << "\n";
  return 0;
}

}  // namespace sy
