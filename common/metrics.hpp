// Prometheus text exposition helpers: counters/gauges are written directly; histograms keep
// fixed buckets. Not thread-safe: a histogram belongs to one thread, and a copy is rendered.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace sy {

class histogram {
 public:
  explicit histogram(std::vector<double> upper_bounds)
      : bounds_(std::move(upper_bounds)), counts_(bounds_.size() + 1) {}
  void observe(double v) {
    size_t i = 0;
    while (i < bounds_.size() && v > bounds_[i]) ++i;
    counts_[i]++;
    sum_ += v;
    n_++;
  }
  // # TYPE line and the _bucket/_sum/_count series.
  void render(std::string& out, const std::string& name, const std::string& help) const {
    out += "# HELP " + name + " " + help + "\n# TYPE " + name + " histogram\n";
    uint64_t cum = 0;
    for (size_t i = 0; i < bounds_.size(); ++i) {
      cum += counts_[i];
      out += name + "_bucket{le=\"" + fmt(bounds_[i]) + "\"} " + std::to_string(cum) + "\n";
    }
    out += name + "_bucket{le=\"+Inf\"} " + std::to_string(n_) + "\n";
    out += name + "_sum " + fmt(sum_) + "\n" + name + "_count " + std::to_string(n_) + "\n";
  }
  uint64_t count() const { return n_; }

  static std::string fmt(double v) {
    char b[32];
    std::snprintf(b, sizeof b, "%.6g", v);
    return b;
  }

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;
  double sum_ = 0;
  uint64_t n_ = 0;
};

// A Prometheus label value with its backslashes, double quotes and newlines escaped.
inline std::string label_value(const std::string& v) {
  std::string out;
  out.reserve(v.size());
  for (const char c : v) {
    if (c == '\\' || c == '"' || c == '\n') out += '\\';
    out += c == '\n' ? 'n' : c;
  }
  return out;
}

inline void metric(std::string& out, const std::string& name, const char* type, const std::string& help, double v,
                   const std::string& labels = "") {
  out += "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
  out += name + labels + " " + histogram::fmt(v) + "\n";
}

// A counter another thread increments (the links' counters): its value now.
inline void counter(std::string& out, const std::string& name, const std::string& help,
                    const std::atomic<uint64_t>& v) {
  metric(out, name, "counter", help, static_cast<double>(v.load()));
}

}  // namespace sy
