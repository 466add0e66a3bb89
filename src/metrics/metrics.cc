#include "metrics/metrics.h"

#include <algorithm>
#include <cassert>
#include <cctype>
#include <cmath>

namespace strata::metrics {

void Counter::Inc(double v) {
  assert(v >= 0 && "Counter::Inc with a negative value");
  if (!(v >= 0)) return;
  value_.fetch_add(v, std::memory_order_relaxed);
}

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)),
      counts_(std::make_unique<std::atomic<uint64_t>[]>(bounds_.size() + 1)) {}

void Histogram::Observe(double v) {
  if (std::isnan(v)) return;
  size_t i = std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin();
  counts_[i].fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(v, std::memory_order_relaxed);
}

Histogram::Snapshot Histogram::Read() const {
  Snapshot s;
  s.cumulative.resize(bounds_.size() + 1);
  for (size_t i = 0; i < s.cumulative.size(); ++i) {
    s.count += counts_[i].load(std::memory_order_relaxed);
    s.cumulative[i] = s.count;
  }
  s.sum = sum_.load(std::memory_order_relaxed);
  return s;
}

std::vector<double> LatencyBuckets() {
  return {0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15,
          0.25,  0.5,    0.75,  1,      2.5,  5,     10,   20,   40,   80,   160,   300};
}

std::vector<double> ExponentialBuckets(double start, double factor, int count) {
  std::vector<double> b;
  for (int i = 0; i < count; ++i, start *= factor) b.push_back(start);
  return b;
}

namespace {

bool HasSuffix(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

bool IsLower(char c) { return c >= 'a' && c <= 'z'; }
bool IsUpper(char c) { return c >= 'A' && c <= 'Z'; }
bool IsDigit(char c) { return c >= '0' && c <= '9'; }

// Prometheus label name, snake_case (promtool warns on camelCase).
Status CheckLabelName(std::string_view metric, std::string_view label) {
  auto bad = [&](std::string_view why) {
    return InvalidArgument("metric " + std::string(metric) + ": label name \"" +
                           std::string(label) + "\" " + std::string(why));
  };
  if (label.empty() || IsDigit(label[0])) return bad("must match [a-zA-Z_][a-zA-Z0-9_]*");
  for (size_t i = 0; i < label.size(); ++i) {
    char c = label[i];
    if (!IsLower(c) && !IsUpper(c) && !IsDigit(c) && c != '_') {
      return bad("must match [a-zA-Z_][a-zA-Z0-9_]*");
    }
    if (i > 0 && IsLower(label[i - 1]) && IsUpper(c)) return bad("must be snake_case");
  }
  if (label.starts_with("__")) return bad("is reserved (names starting with __)");
  if (label == "le" || label == "quantile") return bad("is reserved for histograms/summaries");
  return OkStatus();
}

// The promtool lint rules on metric names (see the Registry comment).
Status CheckMetricName(std::string_view name, std::string_view type) {
  auto bad = [&](std::string_view why) {
    return InvalidArgument("metric name \"" + std::string(name) + "\" " + std::string(why));
  };
  if (name.empty() || IsDigit(name[0])) return bad("must match [a-zA-Z_:][a-zA-Z0-9_:]*");
  for (size_t i = 0; i < name.size(); ++i) {
    char c = name[i];
    if (c == ':') return bad("must not contain ':' (reserved for recording rules)");
    if (!IsLower(c) && !IsUpper(c) && !IsDigit(c) && c != '_') {
      return bad("must match [a-zA-Z_:][a-zA-Z0-9_:]*");
    }
    if (i > 0 && IsLower(name[i - 1]) && IsUpper(c)) return bad("must be snake_case");
  }
  bool total = HasSuffix(name, "_total");
  if (type == "counter" && !total) return bad("is a counter: end it in _total");
  if (type != "counter" && total) return bad("ends in _total but is not a counter");
  for (std::string_view s : {"_bucket", "_sum", "_count"}) {
    if (HasSuffix(name, s))
      return bad("must not end in _bucket, _sum or _count (histogram series)");
  }
  // Split into words; each word is checked for units and type names.
  static const char* const kAbbreviations[] = {"s",  "ms", "us", "ns", "sec", "b", "kb",
                                               "mb", "gb", "tb", "pb", "m",   "h", "d"};
  static const char* const kTypes[] = {"counter", "gauge", "histogram", "summary"};
  static const std::pair<const char*, const char*> kUnits[] = {
      {"amperes", "amperes"},    {"bytes", "bytes"},     {"celsius", "celsius"},
      {"grams", "grams"},        {"joules", "joules"},   {"kelvin", "kelvin"},
      {"meters", "meters"},      {"metres", "metres"},   {"seconds", "seconds"},
      {"volts", "volts"},        {"minutes", "seconds"}, {"hours", "seconds"},
      {"days", "seconds"},       {"weeks", "seconds"},   {"kelvins", "kelvin"},
      {"fahrenheit", "celsius"}, {"rankine", "celsius"}, {"inches", "meters"},
      {"yards", "meters"},       {"miles", "meters"},    {"bits", "bytes"},
      {"calories", "joules"},    {"pounds", "grams"},    {"ounces", "grams"}};
  static const char* const kPrefixes[] = {"pico", "nano",  "micro", "milli", "centi", "deci",
                                          "deca", "hecto", "kilo",  "kibi",  "mega",  "mibi",
                                          "giga", "gibi",  "tera",  "tebi",  "peta",  "pebi"};
  std::string lower(name);
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  std::vector<std::string_view> words;
  for (size_t start = 0, end; start <= lower.size(); start = end + 1) {
    end = std::min(lower.find('_', start), lower.size());
    words.push_back(std::string_view(lower).substr(start, end - start));
  }
  for (size_t i = 1; i < words.size(); ++i) {  // promtool: "_x_" or "_x" at the end
    for (const char* a : kAbbreviations) {
      if (words[i] == a) return bad("abbreviates a unit (_" + std::string(a) + "): spell it out");
    }
    for (const char* t : kTypes) {
      if (words[i] == t) return bad("must not contain its type (_" + std::string(t) + ")");
    }
  }
  for (std::string_view w : words) {
    for (const auto& [unit, base] : kUnits) {
      bool prefixed = false;
      for (const char* p : kPrefixes) {
        prefixed |= w.starts_with(p) && w.substr(std::string_view(p).size()) == unit;
      }
      if ((w == unit && unit != std::string_view(base)) || prefixed) {
        return bad("uses unit \"" + std::string(w) + "\": use the base unit \"" + base + "\"");
      }
    }
  }
  return OkStatus();
}

}  // namespace

StatusOr<std::unique_ptr<Registry>> Registry::Create(Labels const_labels) {
  for (size_t i = 0; i < const_labels.size(); ++i) {
    RETURN_IF_ERROR(CheckLabelName("(constant labels)", const_labels[i].first));
    for (size_t j = 0; j < i; ++j) {
      if (const_labels[j].first == const_labels[i].first) {
        return InvalidArgument("constant label \"" + const_labels[i].first +
                               "\" given twice: give each label once");
      }
    }
  }
  return std::unique_ptr<Registry>(new Registry(std::move(const_labels)));
}

namespace {
std::string RenderConstLabels(const Labels& labels) {
  std::vector<std::string> names, values;
  for (const auto& [n, v] : labels) {
    names.push_back(n);
    values.push_back(v);
  }
  return internal::RenderLabels(names, values);
}
}  // namespace

Registry::Registry(Labels const_labels)
    : const_labels_(std::move(const_labels)),
      const_labels_text_(RenderConstLabels(const_labels_)) {}

Status Registry::Reserve(std::string_view name, std::string_view help, std::string_view type,
                         const std::vector<std::string>& label_names) {
  RETURN_IF_ERROR(CheckMetricName(name, type));
  if (help.empty()) {
    return InvalidArgument("metric " + std::string(name) + ": help is empty: say what it counts");
  }
  std::vector<std::string> all;  // label names, constant ones first
  for (const auto& [n, v] : const_labels_) all.push_back(n);
  for (const std::string& l : label_names) {
    RETURN_IF_ERROR(CheckLabelName(name, l));
    if (std::find(all.begin(), all.end(), l) != all.end()) {
      return InvalidArgument("metric " + std::string(name) + ": label \"" + l +
                             "\" is given twice or is a constant label: drop it");
    }
    all.push_back(l);
  }
  // Names ending in _bucket/_sum/_count are refused above, so a histogram's
  // series cannot collide with another family: comparing base names suffices.
  if (std::find(taken_.begin(), taken_.end(), name) != taken_.end()) {
    return InvalidArgument("metric " + std::string(name) +
                           " is already registered: register it once and share the family");
  }
  taken_.emplace_back(name);
  return OkStatus();
}

template <typename T>
StatusOr<Family<T>*> Registry::Add(std::string_view name, std::string_view help, const char* type,
                                   std::vector<std::string> label_names,
                                   std::function<std::unique_ptr<T>()> make) {
  std::lock_guard lock(mu_);
  RETURN_IF_ERROR(Reserve(name, help, type, label_names));
  bool unlabelled = label_names.empty();
  auto family = std::make_unique<Family<T>>(std::string(name), std::string(help), type,
                                            std::move(label_names), std::move(make));
  if (unlabelled) family->Get();
  Family<T>* raw = family.get();
  families_.push_back(std::move(family));
  return raw;
}

StatusOr<Family<Counter>*> Registry::AddCounter(std::string_view name, std::string_view help,
                                                std::vector<std::string> label_names) {
  return Add<Counter>(name, help, "counter", std::move(label_names),
                      [] { return std::make_unique<Counter>(); });
}

StatusOr<Family<Gauge>*> Registry::AddGauge(std::string_view name, std::string_view help,
                                            std::vector<std::string> label_names) {
  return Add<Gauge>(name, help, "gauge", std::move(label_names),
                    [] { return std::make_unique<Gauge>(); });
}

StatusOr<Family<Histogram>*> Registry::AddHistogram(std::string_view name, std::string_view help,
                                                    std::vector<std::string> label_names,
                                                    std::vector<double> bounds) {
  for (size_t i = 0; i < bounds.size(); ++i) {
    if (!std::isfinite(bounds[i]) || (i > 0 && !(bounds[i] > bounds[i - 1]))) {
      return InvalidArgument("histogram " + std::string(name) +
                             ": bucket bounds must be finite and strictly increasing "
                             "(+Inf is added automatically); bad bound #" +
                             std::to_string(i));
    }
  }
  return Add<Histogram>(name, help, "histogram", std::move(label_names),
                        [bounds] { return std::make_unique<Histogram>(bounds); });
}

namespace {
// One series whose value is read at render time.
class CallbackFamily final : public FamilyBase {
 public:
  CallbackFamily(std::string name, std::string help, const char* type, std::function<double()> read)
      : name_(std::move(name)), help_(std::move(help)), type_(type), read_(std::move(read)) {}
  void Render(std::string_view const_labels, std::string* out) const override {
    internal::RenderHeader(name_, help_, type_, out);
    internal::RenderSample(name_, const_labels, read_(), out);
  }

 private:
  const std::string name_, help_;
  const char* type_;
  const std::function<double()> read_;
};
}  // namespace

Status Registry::AddCallbackGauge(std::string_view name, std::string_view help,
                                  std::function<double()> read) {
  std::lock_guard lock(mu_);
  RETURN_IF_ERROR(Reserve(name, help, "gauge", {}));
  families_.push_back(std::make_unique<CallbackFamily>(std::string(name), std::string(help),
                                                       "gauge", std::move(read)));
  return OkStatus();
}

Status Registry::AddCallbackCounter(std::string_view name, std::string_view help,
                                    std::function<double()> read) {
  std::lock_guard lock(mu_);
  RETURN_IF_ERROR(Reserve(name, help, "counter", {}));
  families_.push_back(std::make_unique<CallbackFamily>(std::string(name), std::string(help),
                                                       "counter", std::move(read)));
  return OkStatus();
}

std::string Registry::Render() const {
  std::string out;
  std::lock_guard lock(mu_);
  for (const auto& f : families_) f->Render(const_labels_text_, &out);
  return out;
}

Status AddBuildInfo(Registry& registry, std::string_view version) {
#if defined(__clang__)
  std::string compiler = "clang-" __clang_version__;
  compiler = compiler.substr(0, compiler.find(' '));
#elif defined(__GNUC__)
  std::string compiler = "gcc-" + std::to_string(__GNUC__) + "." + std::to_string(__GNUC_MINOR__) +
                         "." + std::to_string(__GNUC_PATCHLEVEL__);
#else
  std::string compiler = "unknown";
#endif
#if defined(__x86_64__)
  const char* arch = "x86_64";
#elif defined(__aarch64__)
  const char* arch = "aarch64";
#else
  const char* arch = "unknown";
#endif
  ASSIGN_OR_RETURN(auto* info, registry.AddGauge("strata_build_info",
                                                 "Strata build: version, compiler and CPU "
                                                 "architecture in labels; the value is always 1.",
                                                 {"version", "compiler", "arch"}));
  info->Get({version, compiler, arch}).Set(1);
  return OkStatus();
}

}  // namespace strata::metrics
