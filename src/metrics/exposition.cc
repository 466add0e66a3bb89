#include "metrics/exposition.h"

#include <charconv>
#include <cmath>
#include <cstdint>

#include "metrics/metrics.h"

namespace strata::metrics {
namespace {

std::string Escape(std::string_view s, bool quote) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '"' && quote) {
      out += "\\\"";
    } else {
      out += c;
    }
  }
  return out;
}

void AppendSample(std::string_view name, std::string_view suffix, std::string_view labels, double v,
                  std::string* out) {
  out->append(name).append(suffix);
  if (!labels.empty()) out->append("{").append(labels).append("}");
  out->append(" ").append(FormatValue(v)).append("\n");
}

}  // namespace

std::string FormatValue(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  // 2^53: beyond it not every integer is a double, so "exact" no longer holds.
  if (v == std::trunc(v) && std::fabs(v) <= 9007199254740992.0) {
    return std::to_string(static_cast<int64_t>(v));
  }
  char buf[32];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v);
  return std::string(buf, end);
}

std::string EscapeHelp(std::string_view help) { return Escape(help, false); }
std::string EscapeLabelValue(std::string_view value) { return Escape(value, true); }

namespace internal {

std::string RenderLabels(std::string_view prefix, std::span<const std::string> names,
                         std::span<const std::string> values) {
  std::string out(prefix);
  for (size_t i = 0; i < names.size(); ++i) {
    if (!out.empty()) out += ',';
    out.append(names[i]).append("=\"").append(EscapeLabelValue(values[i])).append("\"");
  }
  return out;
}

void RenderSample(std::string_view name, std::string_view labels, double v, std::string* out) {
  AppendSample(name, "", labels, v, out);
}

void RenderHeader(std::string_view name, std::string_view help, std::string_view type,
                  std::string* out) {
  out->append("# HELP ").append(name).append(" ").append(EscapeHelp(help)).append("\n");
  out->append("# TYPE ").append(name).append(" ").append(type).append("\n");
}

void RenderHistogram(std::string_view name, std::string_view labels, const Histogram& h,
                     std::string* out) {
  Histogram::Snapshot s = h.Read();
  std::string le(labels);
  if (!le.empty()) le += ',';
  const size_t prefix = le.size();
  for (size_t i = 0; i < s.cumulative.size(); ++i) {
    double bound = i < h.bounds().size() ? h.bounds()[i] : INFINITY;
    le.resize(prefix);
    le.append("le=\"").append(FormatValue(bound)).append("\"");
    AppendSample(name, "_bucket", le, static_cast<double>(s.cumulative[i]), out);
  }
  AppendSample(name, "_sum", labels, s.sum, out);
  AppendSample(name, "_count", labels, static_cast<double>(s.count), out);
}

}  // namespace internal
}  // namespace strata::metrics
