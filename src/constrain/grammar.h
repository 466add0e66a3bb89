// Grammars over bytes, the common form every structured-output front end
// (JSON schema, regex, choice, EBNF) compiles to, and that the automaton
// (automaton.h) runs.
//
// Two layers:
//   GrammarBuilder  an expression tree the front ends build: byte sets,
//                   sequences, alternatives, bounded or unbounded repetition,
//                   named rules and references to them (recursion allowed).
//   Grammar         the flat form it lowers to, llama.cpp's shape: each rule
//                   is a list of alternatives, each alternative a run of
//                   elements (a byte set or a rule reference) ending in kEnd.
//                   A parse position is a stack of element indices.
// Build() checks what would make matching loop or never finish: undefined
// rules, left recursion (also through rules that match the empty string),
// and rules that can never end; each is an InvalidArgument naming the rule.
// It also computes, per element, the fewest bytes that complete the
// alternative from there (min_suffix), which bounds how many tokens an
// answer still needs (the automaton's "distance").
//
// Text is UTF-8: Codepoints() turns Unicode ranges into the byte sequences
// that encode them (no surrogates, no overlong forms), so every grammar
// built from code points accepts valid UTF-8 only.
//
// Thread-safety: a GrammarBuilder is used by one thread; a built Grammar is
// immutable and shared freely.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "util/status.h"

namespace strata::constrain {

class GrammarLowering;  // grammar.cc

// A set of byte values.
struct ByteSet {
  std::array<uint64_t, 4> bits{};
  void Add(uint8_t b) { bits[b >> 6] |= uint64_t{1} << (b & 63); }
  void AddRange(uint8_t lo, uint8_t hi) {
    for (int b = lo; b <= hi; ++b) Add(static_cast<uint8_t>(b));
  }
  bool Has(uint8_t b) const { return (bits[b >> 6] >> (b & 63)) & 1; }
  bool Empty() const { return (bits[0] | bits[1] | bits[2] | bits[3]) == 0; }
  ByteSet Complement() const {
    ByteSet s;
    for (int i = 0; i < 4; ++i) s.bits[i] = ~bits[i];
    return s;
  }
  bool operator==(const ByteSet&) const = default;
};

struct Element {
  enum Kind : uint8_t { kBytes, kRef, kEnd };
  Kind kind = kEnd;
  int32_t arg = 0;  // kBytes: index into Grammar::sets(); kRef: the rule
};

class Grammar {
 public:
  // Element indices of each alternative's first element.
  const std::vector<int32_t>& alternatives(int32_t rule) const { return rules_[rule]; }
  const std::vector<Element>& elements() const { return elements_; }
  const ByteSet& set(int32_t index) const { return sets_[index]; }
  int32_t root() const { return root_; }
  int32_t num_rules() const { return static_cast<int32_t>(rules_.size()); }
  const std::string& rule_name(int32_t rule) const { return names_[rule]; }
  // Fewest bytes from element `pos` to its alternative's kEnd.
  int32_t min_suffix(int32_t pos) const { return min_suffix_[pos]; }

 private:
  friend class GrammarBuilder;
  friend class GrammarLowering;
  std::vector<std::vector<int32_t>> rules_;
  std::vector<std::string> names_;
  std::vector<Element> elements_;
  std::vector<ByteSet> sets_;
  std::vector<int32_t> min_suffix_;
  int32_t root_ = 0;
};

class GrammarBuilder {
 public:
  using Node = int32_t;
  using Rule = int32_t;
  static constexpr int kUnbounded = -1;
  // Lowered grammars larger than this are refused (a schema with huge
  // bounds, e.g. maxLength 10^9, would otherwise take the memory).
  static constexpr size_t kMaxElements = size_t{1} << 21;

  Node Empty();
  Node Bytes(const ByteSet& set);
  Node Byte(uint8_t b);
  Node Literal(std::string_view bytes);
  Node Seq(std::vector<Node> parts);
  Node Alt(std::vector<Node> options);
  // node{min, max}; max kUnbounded: no upper bound. REQUIRES: 0 <= min,
  // max == kUnbounded or min <= max.
  Node Repeat(Node node, int min, int max);
  Node Optional(Node node) { return Repeat(node, 0, 1); }
  // One code point from the union of the inclusive ranges, as UTF-8.
  // Surrogates (U+D800..U+DFFF) are left out; ranges are clipped to U+10FFFF.
  Node Codepoints(const std::vector<std::pair<uint32_t, uint32_t>>& ranges);

  Rule NewRule(std::string name);
  void Define(Rule rule, Node body);
  Node Ref(Rule rule);
  bool defined(Rule rule) const { return defs_[rule] >= 0; }
  const std::string& rule_name(Rule rule) const { return names_[rule]; }

  // Lowers the rules reachable from `root`. InvalidArgument (naming the
  // rule) for an undefined rule, left recursion, a rule that never ends, or
  // a grammar over kMaxElements.
  StatusOr<std::shared_ptr<const Grammar>> Build(Rule root) const;

 private:
  struct N {
    enum Kind : uint8_t { kEmpty, kBytes, kSeq, kAlt, kRepeat, kRef } kind = kEmpty;
    ByteSet set;
    std::vector<Node> kids;
    int min = 0, max = 0;
    Rule rule = -1;
  };
  Node Add(N n);
  friend class GrammarLowering;

  std::vector<N> nodes_;
  std::vector<std::string> names_;
  std::vector<Node> defs_;
};

}  // namespace strata::constrain
