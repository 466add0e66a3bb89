// The SVG latency plot of `strata bench serve --plot` (declared in loadgen.h):
// hand-written SVG, no dependencies.
#include <algorithm>
#include <cstdio>

#include "cli/loadgen.h"

namespace strata::cli {

namespace {

std::string Fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), f, v);
  return buf;
}

}  // namespace

std::string RenderLatencySvg(const std::vector<RequestRecord>& records) {
  constexpr double kW = 440, kH = 300, kPad = 50, kTop = 40;
  double max_start = 1e-3, max_ttft = 1e-3, max_e2e = 1e-3;
  std::vector<double> e2e;
  for (const auto& r : records) {
    max_start = std::max(max_start, r.start_s * 1e3);
    if (r.http_status == 200 && r.ttft_s >= 0) max_ttft = std::max(max_ttft, r.ttft_s * 1e3);
    if (r.http_status != 200 && r.http_status != 0) max_ttft = std::max(max_ttft, r.e2e_s * 1e3);
    if (r.http_status == 200 && r.error.empty()) e2e.push_back(r.e2e_s * 1e3);
  }
  std::sort(e2e.begin(), e2e.end());
  if (!e2e.empty()) max_e2e = std::max(max_e2e, e2e.back());
  std::string s;
  s += "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"960\" height=\"" +
       Fmt("%.0f", kH + kTop + 60) + "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  s += "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  auto panel = [&](double x0, const std::string& title, const std::string& xlabel, double xmax,
                   const std::string& ylabel, double ymax) {
    s += "<g transform=\"translate(" + Fmt("%.0f", x0 + kPad) + "," + Fmt("%.0f", kTop) + ")\">\n";
    s += "<rect width=\"" + Fmt("%.0f", kW - kPad) + "\" height=\"" + Fmt("%.0f", kH - kPad) +
         "\" fill=\"none\" stroke=\"black\"/>\n";
    s += "<text x=\"0\" y=\"-10\" font-weight=\"bold\">" + title + "</text>\n";
    s += "<text x=\"" + Fmt("%.0f", (kW - kPad) / 2) + "\" y=\"" + Fmt("%.0f", kH - kPad + 30) +
         "\" text-anchor=\"middle\">" + xlabel + " (0 .. " + Fmt("%.1f", xmax) + ")</text>\n";
    s += "<text x=\"-8\" y=\"0\" text-anchor=\"end\">" + Fmt("%.0f", ymax) + "</text>\n";
    s += "<text x=\"-8\" y=\"" + Fmt("%.0f", kH - kPad) + "\" text-anchor=\"end\">0</text>\n";
    s += "<text transform=\"translate(-35," + Fmt("%.0f", (kH - kPad) / 2) +
         ") rotate(-90)\" text-anchor=\"middle\">" + ylabel + "</text>\n";
  };
  const double pw = kW - kPad, ph = kH - kPad;
  panel(0, "TTFT by request start (dots: 200, red x: rejected)", "request start, ms", max_start,
        "ms", max_ttft);
  for (const auto& r : records) {
    const double x = r.start_s * 1e3 / max_start * pw;
    if (r.http_status == 200 && r.ttft_s >= 0) {
      const double y = ph - r.ttft_s * 1e3 / max_ttft * ph;
      s += "<circle cx=\"" + Fmt("%.1f", x) + "\" cy=\"" + Fmt("%.1f", y) +
           "\" r=\"2\" fill=\"steelblue\"/>\n";
    } else if (r.http_status != 0 && r.http_status != 200) {
      const double y = ph - r.e2e_s * 1e3 / max_ttft * ph;
      s += "<path d=\"M" + Fmt("%.1f", x - 2) + " " + Fmt("%.1f", y - 2) +
           "l4 4m0 -4l-4 4\" stroke=\"red\"/>\n";
    }
  }
  s += "</g>\n";
  panel(kW + 20, "End-to-end latency CDF (200s)", "latency, ms", max_e2e, "fraction", 1);
  if (!e2e.empty()) {
    s += "<polyline fill=\"none\" stroke=\"darkgreen\" stroke-width=\"1.5\" points=\"";
    for (size_t i = 0; i < e2e.size(); ++i) {
      const double x = e2e[i] / max_e2e * pw;
      const double y = ph - static_cast<double>(i + 1) / static_cast<double>(e2e.size()) * ph;
      s += Fmt("%.1f", x) + "," + Fmt("%.1f", y) + " ";
    }
    s += "\"/>\n";
  }
  s += "</g>\n</svg>\n";
  return s;
}

}  // namespace strata::cli
