#include "worker/engine/stop_matcher.hpp"

#include <algorithm>

namespace sy {

stop_matcher::stop_matcher(std::vector<std::string> stops) : stops_(std::move(stops)) {
  stops_.erase(std::remove(stops_.begin(), stops_.end(), std::string()), stops_.end());
}

std::string stop_matcher::push(std::string_view delta) {
  if (stopped_) return {};
  held_ += delta;
  size_t first = std::string::npos;
  const std::string* seen = nullptr;
  for (const auto& s : stops_) {
    const size_t at = held_.find(s);
    if (at < first) {
      first = at;
      seen = &s;
    }
  }
  if (seen) {
    stopped_ = true;
    matched_ = *seen;
    std::string out = held_.substr(0, first);
    held_.clear();
    return out;
  }
  // Longest suffix of held_ that is a proper prefix of some stop string stays held.
  size_t keep = 0;
  for (const auto& s : stops_) {
    const size_t max_h = std::min(s.size() - 1, held_.size());
    for (size_t h = max_h; h > keep; --h)
      if (held_.compare(held_.size() - h, h, s, 0, h) == 0) {
        keep = h;
        break;
      }
  }
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

std::string stop_matcher::flush() {
  std::string out;
  out.swap(held_);
  return stopped_ ? std::string() : out;
}

}  // namespace sy
