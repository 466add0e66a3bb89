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

// [a-zA-Z_][a-zA-Z0-9_]* and not camelCase (promtool warns on [a-z][A-Z]).
// Colons, legal in metric names, are refused too: recording rules own them.
const char* IdentifierError(std::string_view s) {
  if (s.empty() || std::isdigit(static_cast<unsigned char>(s[0])))
    return "must not be empty or start with a digit";
  for (size_t i = 0; i < s.size(); ++i) {
    unsigned char c = s[i];
    if (c == ':') return "must not contain ':' (reserved for recording rules)";
    if (c >= 0x80 || !(std::isalnum(c) || c == '_')) return "must match [a-zA-Z_][a-zA-Z0-9_]*";
    if (i > 0 && std::islower(static_cast<unsigned char>(s[i - 1])) && std::isupper(c)) {
      return "must be snake_case, not camelCase";
    }
  }
  return nullptr;
}

Status CheckLabelName(std::string_view metric, std::string_view label) {
  const char* why = IdentifierError(label);
  if (!why && label.starts_with("__")) why = "is reserved (starts with __)";
  if (!why && (label == "le" || label == "quantile")) why = "is reserved for histograms";
  if (!why) return OkStatus();
  return InvalidArgument("metric " + std::string(metric) + ": label name \"" + std::string(label) +
                         "\" " + why);
}

// The lint rules of promtool check metrics (listed in the Registry comment).
Status CheckMetricName(std::string_view name, std::string_view type) {
  auto bad = [&](std::string_view why) {
    return InvalidArgument("metric name \"" + std::string(name) + "\" " + std::string(why));
  };
  if (const char* why = IdentifierError(name)) return bad(why);
  bool total = name.ends_with("_total");
  if (type == "counter" && !total) return bad("is a counter: end it in _total");
  if (type != "counter" && total) return bad("ends in _total but is not a counter");
  if (type != "gauge" && name.ends_with("_timestamp_seconds")) {
    return bad("ends in _timestamp_seconds: make it a gauge");
  }
  for (std::string_view s : {"_bucket", "_sum", "_count"}) {
    if (name.ends_with(s)) return bad("must not end in _bucket, _sum or _count");
  }
  static const std::string_view kAbbreviations[] = {"s",  "ms", "us", "ns", "sec", "b", "kb",
                                                    "mb", "gb", "tb", "pb", "m",   "h", "d"};
  static const std::string_view kTypes[] = {"counter", "gauge", "histogram", "summary"};
  static const std::string_view kBaseUnits[] = {"amperes", "bytes",  "celsius", "grams",   "joules",
                                                "kelvin",  "meters", "metres",  "seconds", "volts"};
  static const std::string_view kOtherUnits[] = {
      "minutes", "hours", "days",  "weeks", "kelvins",  "fahrenheit", "rankine",
      "inches",  "yards", "miles", "bits",  "calories", "pounds",     "ounces"};
  static const std::string_view kPrefixes[] = {"pico", "nano",  "micro", "milli", "centi", "deci",
                                               "deca", "hecto", "kilo",  "kibi",  "mega",  "mibi",
                                               "giga", "gibi",  "tera",  "tebi",  "peta",  "pebi"};
  auto in = [](std::string_view w, const auto& list) {
    return std::find(std::begin(list), std::end(list), w) != std::end(list);
  };
  std::string lower(name);
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  std::string_view rest = lower;
  for (bool first = true; !rest.empty() || first; first = false) {
    std::string_view w = rest.substr(0, rest.find('_'));
    rest.remove_prefix(std::min(rest.size(), w.size() + 1));
    // promtool matches abbreviations and types only after an underscore.
    if (!first && in(w, kAbbreviations)) return bad("abbreviates a unit: spell it out (seconds)");
    if (!first && in(w, kTypes)) return bad("must not contain its type");
    bool other = in(w, kOtherUnits);
    for (std::string_view p : kPrefixes) {
      if (w.starts_with(p) && w.size() > p.size()) {
        std::string_view unit = w.substr(p.size());
        other |= in(unit, kBaseUnits) || in(unit, kOtherUnits);
      }
    }
    if (other) return bad("uses unit \"" + std::string(w) + "\": use base units (seconds, bytes)");
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

Registry::Registry(Labels const_labels) {
  std::vector<std::string> values;
  for (auto& [name, value] : const_labels) {
    const_label_names_.push_back(std::move(name));
    values.push_back(std::move(value));
  }
  const_labels_text_ = internal::RenderLabels("", const_label_names_, values);
}

Status Registry::Reserve(std::string_view name, std::string_view help, std::string_view type,
                         const std::vector<std::string>& label_names) {
  RETURN_IF_ERROR(CheckMetricName(name, type));
  if (help.empty()) {
    return InvalidArgument("metric " + std::string(name) + ": help is empty: say what it counts");
  }
  std::vector<std::string> all = const_label_names_;
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
  auto family =
      std::make_unique<Family<T>>(std::string(name), std::string(help), type, const_labels_text_,
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
  CallbackFamily(std::string name, std::string help, const char* type, std::string labels,
                 std::function<double()> read)
      : name_(std::move(name)),
        help_(std::move(help)),
        type_(type),
        labels_(std::move(labels)),
        read_(std::move(read)) {}
  void Render(std::string* out) const override {
    internal::RenderHeader(name_, help_, type_, out);
    internal::RenderSample(name_, labels_, read_(), out);
  }

 private:
  const std::string name_, help_;
  const char* type_;
  const std::string labels_;
  const std::function<double()> read_;
};
}  // namespace

Status Registry::AddCallback(std::string_view name, std::string_view help, const char* type,
                             std::function<double()> read) {
  std::lock_guard lock(mu_);
  RETURN_IF_ERROR(Reserve(name, help, type, {}));
  families_.push_back(std::make_unique<CallbackFamily>(std::string(name), std::string(help), type,
                                                       const_labels_text_, std::move(read)));
  return OkStatus();
}

std::string Registry::Render() const {
  std::string out;
  std::lock_guard lock(mu_);
  for (const auto& f : families_) f->Render(&out);
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
