// Minimal command-line parsing shared by the binaries: `--name value`, `--name=value` and
// boolean `--flag`. Unknown options are an error that names the option.
#pragma once

#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace sy {

class cli_args {
 public:
  // `flags`: options that take no value.
  cli_args(int argc, char** argv, int first, const std::vector<std::string>& flags) {
    for (int i = first; i < argc; ++i) {
      std::string a = argv[i];
      if (a.rfind("--", 0) != 0) {
        positional_.push_back(a);
        continue;
      }
      std::string name = a.substr(2), value;
      const auto eq = name.find('=');
      bool is_flag = false;
      for (const auto& f : flags) is_flag |= (f == name);
      if (eq != std::string::npos) {
        value = name.substr(eq + 1);
        name = name.substr(0, eq);
      } else if (is_flag) {
        value = "1";
      } else {
        if (i + 1 >= argc) throw std::invalid_argument("option --" + name + " needs a value");
        value = argv[++i];
      }
      values_[name].push_back(value);
    }
  }

  bool has(const std::string& name) const { return values_.count(name) != 0; }
  std::string get(const std::string& name, const std::string& fallback = "") const {
    auto it = values_.find(name);
    return it == values_.end() ? fallback : it->second.back();
  }
  std::vector<std::string> all(const std::string& name) const {
    auto it = values_.find(name);
    return it == values_.end() ? std::vector<std::string>{} : it->second;
  }
  long long get_int(const std::string& name, long long fallback) const {
    if (!has(name)) return fallback;
    const std::string v = get(name);
    size_t used = 0;
    long long r = 0;
    try {
      r = std::stoll(v, &used);
    } catch (...) {
      used = 0;
    }
    if (used != v.size() || v.empty())
      throw std::invalid_argument("option --" + name + ": '" + v + "' is not an integer");
    return r;
  }
  double get_float(const std::string& name, double fallback) const {
    if (!has(name)) return fallback;
    const std::string v = get(name);
    size_t used = 0;
    double r = 0;
    try {
      r = std::stod(v, &used);
    } catch (...) {
      used = 0;
    }
    if (used != v.size() || v.empty())
      throw std::invalid_argument("option --" + name + ": '" + v + "' is not a number");
    return r;
  }
  // Throws naming the first option not in `known`.
  void check_known(const std::vector<std::string>& known) const {
    for (const auto& [k, v] : values_) {
      bool ok = false;
      for (const auto& n : known) ok |= (n == k);
      if (!ok) throw std::invalid_argument("unknown option --" + k);
    }
  }
  const std::vector<std::string>& positional() const { return positional_; }

 private:
  std::map<std::string, std::vector<std::string>> values_;
  std::vector<std::string> positional_;
};

}  // namespace sy
