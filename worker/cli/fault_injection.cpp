#include "worker/cli/fault_injection.hpp"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>
#include <stdexcept>
#include <thread>
#include <vector>

#include "common/tokenizer/tokenizer.hpp"

namespace sy {
namespace {

// Forwards everything to the real backend; only run() may fail.
class fault_backend final : public forward_backend {
 public:
  fault_backend(std::unique_ptr<forward_backend> inner, bool step_throw, std::string marker, int slow_ms, bool simulate,
                const tokenizer& vocab, const std::optional<std::string>& script)
      : inner_(std::move(inner)),
        step_throw_(step_throw),
        marker_(std::move(marker)),
        slow_ms_(slow_ms),
        simulate_(simulate),
        scripted_(script.has_value()),
        vocab_(vocab) {
    if (simulate_)
      script_ = vocab_.encode(script.value_or(" a simulated worker streams these words at a steady pace,"));
    if (scripted_) script_.push_back(vocab_.eos());  // the answer ends after the text
    if (script_.empty()) script_.push_back(0);
  }

  void run(std::span<const batch_seq> batch, std::span<const row_sampling> sampling, step_output& out) override {
    if (step_throw_) throw std::runtime_error("fault injection (step-throw): the device reports a sticky error");
    if (slow_ms_ > 0) std::this_thread::sleep_for(std::chrono::milliseconds(slow_ms_));
    if (simulate_) {
      simulate(batch, out);
      return;
    }
    if (!marker_.empty()) {
      for (const batch_seq& s : batch) {
        if (s.pos0 >= s.n_prompt) continue;  // a decode step: no prompt text in it
        const size_t n = std::min(s.tokens.size(), static_cast<size_t>(s.n_prompt - s.pos0));
        if (vocab_.decode(s.tokens.first(n)).find(marker_) == std::string::npos) continue;
        std::fprintf(stderr, "switchyard-worker: fault injection (crash-on): marker seen, killing this process\n");
        std::fflush(stderr);
        ::kill(::getpid(), SIGKILL);
      }
    }
    inner_->run(batch, sampling, out);
  }
  bool samples() const override { return !simulate_ && inner_->samples(); }
  int32_t n_kv_blocks() const override { return inner_->n_kv_blocks(); }
  int32_t n_window_blocks() const override { return inner_->n_window_blocks(); }
  int32_t block_size() const override { return inner_->block_size(); }
  size_t kv_bytes() const override { return inner_->kv_bytes(); }
  size_t weight_read_bytes() const override { return inner_->weight_read_bytes(); }
  size_t kv_bytes_per_token() const override { return inner_->kv_bytes_per_token(); }
  std::string describe() const override { return inner_->describe() + " [fault injection]"; }

 private:
  // sim: no forward at all. Each logits row puts all its weight on the next word of a fixed
  // script (by position), so the engine samples, detokenizes and streams as always, at the
  // pace slow_ms sets, for the price of a memset.
  void simulate(std::span<const batch_seq> batch, step_output& out) {
    const size_t n_vocab = vocab_.vocab_size();
    size_t rows = 0;
    for (const batch_seq& b : batch) rows += !b.logits ? 0 : b.all_logits ? b.tokens.size() : 1;
    out.tokens.assign(rows, step_output::k_not_sampled);
    out.logits.assign(rows * n_vocab, -30.0f);
    size_t r = 0;
    for (const batch_seq& b : batch) {
      if (!b.logits) continue;
      const size_t first = b.all_logits ? 0 : b.tokens.size() - 1;
      for (size_t t = first; t < b.tokens.size(); ++t, ++r) {
        const auto pos = static_cast<size_t>(b.pos0) + t;
        // A given script is the output from its first token (the row at the prompt's last
        // position predicts it), then EOS for good; the default one runs on by position.
        size_t at = pos % script_.size();
        if (scripted_) {
          const int64_t out_at = b.pos0 + static_cast<int64_t>(t) + 1 - b.n_prompt;
          at = out_at <= 0 ? 0 : std::min(static_cast<size_t>(out_at), script_.size() - 1);
        }
        out.logits[r * n_vocab + static_cast<size_t>(script_[at])] = 30.0f;
      }
    }
  }

  std::unique_ptr<forward_backend> inner_;
  bool step_throw_;
  std::string marker_;  // crash-on: empty when off
  int slow_ms_;         // slow-step (and sim's pace): 0 when off
  bool simulate_;       // sim: no forward
  bool scripted_;       // sim:MS:TEXT: the output is TEXT, then EOS
  const tokenizer& vocab_;
  std::vector<token_id> script_;  // sim: the words it streams
};

}  // namespace

namespace {

constexpr std::string_view k_drop_frames = "drop-frames:", k_mute_first = "mute-first:";

// N of PREFIX + N (1..1000000), 0 when `mode` is another one.
uint32_t link_fault_count(const std::string& mode, std::string_view prefix) {
  if (mode.rfind(prefix, 0) != 0) return 0;
  long n = 0;
  try {
    n = std::stol(mode.substr(prefix.size()));
  } catch (const std::exception&) {
    n = 0;
  }
  if (n < 1 || n > 1000000)
    throw std::invalid_argument("--fault-inject " + std::string(prefix) + "N needs N in 1..1000000");
  std::fprintf(stderr,
               "switchyard-worker: WARNING: fault injection '%s' is on: this worker loses frames on purpose (tests "
               "only)\n",
               mode.c_str());
  return static_cast<uint32_t>(n);
}

}  // namespace

uint32_t dropped_frames_of(const std::string& mode) { return link_fault_count(mode, k_drop_frames); }
uint32_t muted_requests_of(const std::string& mode) { return link_fault_count(mode, k_mute_first); }

bool is_backend_fault(const std::string& mode) {
  return !mode.empty() && mode.rfind(k_drop_frames, 0) != 0 && mode.rfind(k_mute_first, 0) != 0;
}

std::unique_ptr<forward_backend> with_fault_injection(std::unique_ptr<forward_backend> inner, const std::string& mode,
                                                      const tokenizer& vocab) {
  static constexpr std::string_view k_crash_on = "crash-on:", k_slow_step = "slow-step:", k_sim = "sim:";
  bool step_throw = false, simulate = false;
  std::string marker;
  std::optional<std::string> script;
  int slow_ms = 0;
  if (mode == "step-throw") {
    step_throw = true;
  } else if (mode.rfind(k_crash_on, 0) == 0 && mode.size() > k_crash_on.size()) {
    marker = mode.substr(k_crash_on.size());
  } else if (mode.rfind(k_slow_step, 0) == 0 && mode.size() > k_slow_step.size()) {
    try {
      slow_ms = std::stoi(mode.substr(k_slow_step.size()));
    } catch (const std::exception&) {
      slow_ms = 0;
    }
    if (slow_ms <= 0 || slow_ms > 600000) throw std::invalid_argument("--fault-inject slow-step:MS needs 1..600000 ms");
  } else if (mode.rfind(k_sim, 0) == 0 && mode.size() > k_sim.size()) {
    const size_t text_at = mode.find(':', k_sim.size());
    if (text_at != std::string::npos) script = mode.substr(text_at + 1);
    try {
      slow_ms = std::stoi(
          mode.substr(k_sim.size(), text_at == std::string::npos ? std::string::npos : text_at - k_sim.size()));
    } catch (const std::exception&) {
      slow_ms = -1;
    }
    if (slow_ms < 0 || slow_ms > 60000) throw std::invalid_argument("--fault-inject sim:MS needs 0..60000 ms per step");
    simulate = true;
  } else {
    throw std::invalid_argument(
        "--fault-inject: unknown mode '" + mode +
        "' (step-throw, crash-on:MARKER, slow-step:MS, sim:MS[:TEXT], drop-frames:N, mute-first:N)");
  }
  std::fprintf(stderr,
               "switchyard-worker: WARNING: fault injection '%s' is on: this worker fails on purpose (tests only)\n",
               mode.c_str());
  return std::make_unique<fault_backend>(std::move(inner), step_throw, std::move(marker), slow_ms, simulate, vocab,
                                         script);
}

}  // namespace sy
