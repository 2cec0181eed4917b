// Prometheus text exposition helpers: counters/gauges are written directly, labelled ones as a
// metric_family; histograms keep fixed buckets. Every family's # HELP and # TYPE lines come from
// family_header. Not thread-safe: a histogram belongs to one thread, and a copy is rendered.
#pragma once

#include <atomic>
#include <concepts>
#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace sy {

// The # HELP and # TYPE lines that open a family; backslashes and newlines in `help` are escaped
// as the text format asks.
inline void family_header(std::string& out, std::string_view name, std::string_view type, std::string_view help) {
  out += "# HELP ";
  out += name;
  out += ' ';
  for (const char c : help) {
    if (c == '\\' || c == '\n') out += '\\';
    out += c == '\n' ? 'n' : c;
  }
  out += "\n# TYPE ";
  out += name;
  out += ' ';
  out += type;
  out += '\n';
}

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
    family_header(out, name, "histogram", help);
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
inline std::string label_value(std::string_view v) {
  std::string out;
  out.reserve(v.size());
  for (const char c : v) {
    if (c == '\\' || c == '"' || c == '\n') out += '\\';
    out += c == '\n' ? 'n' : c;
  }
  return out;
}

// Label names and values of one sample, in the order written.
using metric_labels = std::initializer_list<std::pair<std::string_view, std::string_view>>;

// A family of labelled samples: its header when made, then one line per sample(),
//   name{k1="v1",k2="v2"} value
// with each label value escaped (label_value); no labels: `name value`. Integer values are written
// in full, others as histogram::fmt does.
class metric_family {
 public:
  metric_family(std::string& out, std::string_view name, std::string_view type, std::string_view help)
      : out_(out), name_(name) {
    family_header(out_, name_, type, help);
  }

  template <class T>
  requires std::integral<T> || std::floating_point<T>
  void sample(metric_labels labels, T v) {
    out_ += name_;
    if (labels.size() > 0) {
      char sep = '{';
      for (const auto& [k, val] : labels) {
        out_ += sep;
        out_ += k;
        out_ += "=\"";
        out_ += label_value(val);
        out_ += '"';
        sep = ',';
      }
      out_ += '}';
    }
    out_ += ' ';
    if constexpr (std::integral<T>)
      out_ += std::to_string(v);
    else
      out_ += histogram::fmt(static_cast<double>(v));
    out_ += '\n';
  }

 private:
  std::string& out_;
  std::string name_;
};

// A family of one unlabelled sample.
inline void metric(std::string& out, const std::string& name, const char* type, const std::string& help, double v) {
  metric_family(out, name, type, help).sample({}, v);
}

// A counter another thread increments (the links' counters): its value now.
inline void counter(std::string& out, const std::string& name, const std::string& help,
                    const std::atomic<uint64_t>& v) {
  metric(out, name, "counter", help, static_cast<double>(v.load()));
}

}  // namespace sy
