// Command-line flags for `strata` subcommands.
//
// A FlagSet binds flag names to variables the caller owns, parses
// `--name value` and `--name=value`, checks numeric ranges, and writes
// --help text. Bool flags take no value (`--flag`), or `--flag=true|false`.
// Errors name the flag and what is allowed: "--max-tokens: 0 is out of range
// (allowed 1..1000000)"; an unknown flag suggests the closest known one.
// Not thread-safe; used once at startup.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "util/status.h"

namespace strata {

class FlagSet {
 public:
  FlagSet(std::string command, std::string summary);

  void String(const std::string& name, std::string* dst, const std::string& help);
  void Int(const std::string& name, int64_t* dst, const std::string& help, int64_t min = INT64_MIN,
           int64_t max = INT64_MAX);
  void Double(const std::string& name, double* dst, const std::string& help, double min = -1e300,
              double max = 1e300);
  void Bool(const std::string& name, bool* dst, const std::string& help);
  // Repeatable: each `--name value` appends to *dst (`--worker A --worker B`).
  void StringList(const std::string& name, std::vector<std::string>* dst, const std::string& help);

  // Parses args (without the program and subcommand names). Positional
  // arguments are an error unless `positional` is non-null.
  Status Parse(const std::vector<std::string>& args,
               std::vector<std::string>* positional = nullptr);
  bool help_requested() const { return help_; }
  // Makes Parse() refuse an empty value for every String flag ("--host ''"
  // silently meaning "every interface" is the kind of surprise this stops).
  void RejectEmptyStrings() { reject_empty_strings_ = true; }
  // True if the flag appeared on the command line (even with its default
  // value): what "given explicitly" means for rules such as "--hicache-ratio
  // and --hicache-size together are an error".
  bool IsSet(const std::string& name) const;
  // True for a flag registered with StringList (it may be given many times).
  bool IsRepeatable(const std::string& name) const;
  // The names (without --) of every flag that appeared, in registration order.
  std::vector<std::string> SetFlags() const;
  std::string Help() const;

 private:
  struct Flag {
    std::string name, help, kind, default_text;
    std::function<Status(const std::string&)> set;
    bool seen = false;
    bool repeatable = false;
  };
  Flag* Find(const std::string& name);
  std::string Closest(const std::string& name) const;
  std::string command_, summary_;
  std::vector<Flag> flags_;
  bool help_ = false;
  bool reject_empty_strings_ = false;
};

}  // namespace strata
