#include "util/flags.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <sstream>

namespace strata {
namespace {

size_t EditDistance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1])});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string FormatDouble(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

}  // namespace

FlagSet::FlagSet(std::string command, std::string summary)
    : command_(std::move(command)), summary_(std::move(summary)) {}

void FlagSet::String(const std::string& name, std::string* dst, const std::string& help) {
  flags_.push_back({name, help, "STRING", *dst, [dst](const std::string& v) {
                      *dst = v;
                      return OkStatus();
                    }});
}

void FlagSet::StringList(const std::string& name, std::vector<std::string>* dst,
                         const std::string& help) {
  flags_.push_back({name, help + " (repeatable)", "STRING", "", [dst](const std::string& v) {
                      dst->push_back(v);
                      return OkStatus();
                    }});
  flags_.back().repeatable = true;
}

bool FlagSet::IsRepeatable(const std::string& name) const {
  for (const Flag& f : flags_)
    if (f.name == name) return f.repeatable;
  return false;
}

void FlagSet::Int(const std::string& name, int64_t* dst, const std::string& help, int64_t min,
                  int64_t max) {
  flags_.push_back({name, help, "INT", std::to_string(*dst), [=](const std::string& v) {
                      errno = 0;
                      char* end = nullptr;
                      long long x = std::strtoll(v.c_str(), &end, 10);
                      if (v.empty() || *end != '\0' || errno == ERANGE)
                        return InvalidArgument("--" + name + ": '" + v + "' is not an integer");
                      if (x < min || x > max) {
                        std::string range =
                            (min == INT64_MIN ? std::string("..") : std::to_string(min) + "..") +
                            (max == INT64_MAX ? std::string() : std::to_string(max));
                        return InvalidArgument("--" + name + ": " + v +
                                               " is out of range (allowed " + range + ")");
                      }
                      *dst = x;
                      return OkStatus();
                    }});
}

void FlagSet::Double(const std::string& name, double* dst, const std::string& help, double min,
                     double max) {
  flags_.push_back({name, help, "NUM", FormatDouble(*dst), [=](const std::string& v) {
                      char* end = nullptr;
                      double x = std::strtod(v.c_str(), &end);
                      if (v.empty() || *end != '\0' || !std::isfinite(x))
                        return InvalidArgument("--" + name + ": '" + v + "' is not a number");
                      if (x < min || x > max)
                        return InvalidArgument("--" + name + ": " + v +
                                               " is out of range (allowed " + FormatDouble(min) +
                                               ".." + FormatDouble(max) + ")");
                      *dst = x;
                      return OkStatus();
                    }});
}

void FlagSet::Bool(const std::string& name, bool* dst, const std::string& help) {
  flags_.push_back({name, help, "", *dst ? "true" : "false", [=](const std::string& v) {
                      if (v == "true" || v == "1" || v == "")
                        *dst = true;
                      else if (v == "false" || v == "0")
                        *dst = false;
                      else
                        return InvalidArgument("--" + name + ": '" + v + "' is not true or false");
                      return OkStatus();
                    }});
}

FlagSet::Flag* FlagSet::Find(const std::string& name) {
  for (auto& f : flags_)
    if (f.name == name) return &f;
  return nullptr;
}

bool FlagSet::IsSet(const std::string& name) const {
  for (auto& f : flags_)
    if (f.name == name) return f.seen;
  return false;
}

std::vector<std::string> FlagSet::SetFlags() const {
  std::vector<std::string> out;
  for (auto& f : flags_)
    if (f.seen) out.push_back(f.name);
  return out;
}

std::string FlagSet::Closest(const std::string& name) const {
  std::string best;
  size_t best_d = 4;
  for (auto& f : flags_) {
    size_t d = EditDistance(name, f.name);
    if (d < best_d) best_d = d, best = f.name;
  }
  return best;
}

Status FlagSet::Parse(const std::vector<std::string>& args, std::vector<std::string>* positional) {
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--help" || a == "-h") {
      help_ = true;
      continue;
    }
    if (a.rfind("--", 0) != 0 || a.size() == 2) {
      if (positional) {
        positional->push_back(a);
        continue;
      }
      return InvalidArgument("unexpected argument '" + a + "' (flags start with --; see --help)");
    }
    std::string name = a.substr(2), value;
    bool has_value = false;
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    // Accept snake_case spellings too (SGLang accepts both in configs).
    std::replace(name.begin(), name.end(), '_', '-');
    Flag* f = Find(name);
    if (!f) {
      std::string hint = Closest(name);
      return InvalidArgument(
          "unknown flag --" + name +
          (hint.empty() ? std::string(" (see --help)") : "; did you mean --" + hint + "?"));
    }
    if (!has_value && !f->kind.empty()) {
      if (i + 1 >= args.size())
        return InvalidArgument("--" + name + " needs a value (" + f->kind + ")");
      value = args[++i];
    }
    if (reject_empty_strings_ && f->kind == "STRING" && value.empty()) {
      return InvalidArgument(
          "--" + name + " is empty; give a value or leave the flag out (default: " +
          (f->default_text.empty() ? std::string("none") : "'" + f->default_text + "'") + ")");
    }
    RETURN_IF_ERROR(f->set(value));
    f->seen = true;
  }
  return OkStatus();
}

std::string FlagSet::Help() const {
  std::ostringstream os;
  os << "usage: strata " << command_ << " [flags]\n\n" << summary_ << "\n\nflags:\n";
  for (auto& f : flags_) {
    std::string left = "  --" + f.name + (f.kind.empty() ? "" : " " + f.kind);
    os << left;
    if (left.size() < 34)
      os << std::string(34 - left.size(), ' ');
    else
      os << "\n" << std::string(34, ' ');
    os << f.help;
    if (!f.default_text.empty() && f.default_text != "false")
      os << " [default: " << f.default_text << "]";
    os << "\n";
  }
  os << "  --help                          show this text\n";
  return os.str();
}

}  // namespace strata
