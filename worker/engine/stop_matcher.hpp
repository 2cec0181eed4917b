// Stop strings over streamed text: holds back any tail that could still become a stop string,
// so text before a stop string is emitted and the stop string itself never is.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace sy {

class stop_matcher {
 public:
  explicit stop_matcher(std::vector<std::string> stops);
  // Adds generated text; returns the text now safe to emit. After a stop string is seen,
  // stopped() is true and later pushes return nothing.
  std::string push(std::string_view delta);
  // The held-back tail, when generation ends for another reason.
  std::string flush();
  bool stopped() const { return stopped_; }
  // The stop string seen (empty before): of those the text completed in the same push, the one
  // that starts first; at the same place, the first listed.
  const std::string& matched() const { return matched_; }

 private:
  std::vector<std::string> stops_;
  std::string held_;
  bool stopped_ = false;
  std::string matched_;
};

}  // namespace sy
