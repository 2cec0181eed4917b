#include "common/sampling_params.hpp"

#include <cmath>

namespace sy {

// top_p = 0 is refused: nucleus sampling over no probability mass keeps no token (the router's
// API and the sampler have always required top_p > 0; the wire once let 0 through, and the
// engine then refused it).
std::optional<sampling_error> validate(const sampling_params& p) {
  auto bad = [](std::string field, std::string why) { return sampling_error{std::move(field), std::move(why)}; };
  if (!std::isfinite(p.temperature) || p.temperature < 0) return bad("temperature", "not a finite value >= 0");
  if (p.top_k < 0) return bad("top_k", "negative");
  if (!(p.top_p > 0 && p.top_p <= 1)) return bad("top_p", "outside (0, 1]");
  if (!(p.min_p >= 0 && p.min_p <= 1)) return bad("min_p", "outside [0, 1]");
  if (!std::isfinite(p.repetition_penalty) || p.repetition_penalty <= 0)
    return bad("repetition_penalty", "not a finite value > 0");
  if (p.repeat_last_n < 0) return bad("repeat_last_n", "negative");
  if (p.max_tokens < 1) return bad("max_tokens", "less than 1");
  if (p.stop.size() > k_max_stop_strings) return bad("stop", "more than " + std::to_string(k_max_stop_strings));
  for (size_t i = 0; i < p.stop.size(); ++i) {
    const std::string at = "stop[" + std::to_string(i) + "]";
    if (p.stop[i].empty()) return bad(at, "empty");
    if (p.stop[i].size() > k_max_stop_bytes)
      return bad(at, "longer than " + std::to_string(k_max_stop_bytes) + " bytes");
  }
  if (p.logprobs < 0 || p.logprobs > k_max_top_logprobs)
    return bad("logprobs", "outside [0, " + std::to_string(k_max_top_logprobs) + "]");
  if (p.thinking_budget < 0) return bad("thinking_budget", "negative");
  if (p.thinking_end.size() > k_max_stop_bytes)
    return bad("thinking_end", "longer than " + std::to_string(k_max_stop_bytes) + " bytes");
  if (p.thinking_budget > 0 && p.thinking_end.find_first_not_of(" \t\n\r") == std::string::npos)
    return bad("thinking_end", "empty (or only whitespace) while thinking_budget is set");
  return std::nullopt;
}

}  // namespace sy
