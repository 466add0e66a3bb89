#include "constrain/grammar.h"

#include <algorithm>
#include <functional>
#include <map>

namespace strata::constrain {
namespace {

constexpr int32_t kInfinite = 1 << 30;

int32_t SatAdd(int32_t a, int32_t b) { return std::min<int64_t>(int64_t{a} + b, kInfinite); }

// The UTF-8 encoding of c (REQUIRES: c <= 0x10FFFF).
std::string Utf8(uint32_t c) {
  std::string s;
  if (c < 0x80) {
    s += static_cast<char>(c);
  } else if (c < 0x800) {
    s += static_cast<char>(0xC0 | (c >> 6));
    s += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    s += static_cast<char>(0xE0 | (c >> 12));
    s += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    s += static_cast<char>(0xF0 | (c >> 18));
    s += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    s += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (c & 0x3F));
  }
  return s;
}

int Utf8Length(uint32_t c) { return c < 0x80 ? 1 : c < 0x800 ? 2 : c < 0x10000 ? 3 : 4; }

using ByteRanges = std::vector<std::pair<uint8_t, uint8_t>>;

// [lo, hi] (one encoded length) as sequences of byte ranges whose
// concatenations are exactly those code points' encodings (the split
// regex-syntax's Utf8Sequences makes: split until only the leading bytes
// differ in whole continuation blocks).
void SplitSameLength(uint32_t lo, uint32_t hi, std::vector<ByteRanges>* out) {
  const int n = Utf8Length(lo);
  for (int i = 1; i < n; ++i) {
    const uint32_t m = (uint32_t{1} << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        SplitSameLength(lo, lo | m, out);
        SplitSameLength((lo | m) + 1, hi, out);
        return;
      }
      if ((hi & m) != m) {
        SplitSameLength(lo, (hi & ~m) - 1, out);
        SplitSameLength(hi & ~m, hi, out);
        return;
      }
    }
  }
  const std::string a = Utf8(lo), b = Utf8(hi);
  ByteRanges seq;
  for (size_t i = 0; i < a.size(); ++i)
    seq.emplace_back(static_cast<uint8_t>(a[i]), static_cast<uint8_t>(b[i]));
  out->push_back(std::move(seq));
}

}  // namespace

GrammarBuilder::Node GrammarBuilder::Add(N n) {
  nodes_.push_back(std::move(n));
  return static_cast<Node>(nodes_.size() - 1);
}

GrammarBuilder::Node GrammarBuilder::Empty() { return Add(N{}); }

GrammarBuilder::Node GrammarBuilder::Bytes(const ByteSet& set) {
  N n;
  n.kind = N::kBytes;
  n.set = set;
  return Add(std::move(n));
}

GrammarBuilder::Node GrammarBuilder::Byte(uint8_t b) {
  ByteSet s;
  s.Add(b);
  return Bytes(s);
}

GrammarBuilder::Node GrammarBuilder::Literal(std::string_view bytes) {
  std::vector<Node> parts;
  for (char c : bytes) parts.push_back(Byte(static_cast<uint8_t>(c)));
  return Seq(std::move(parts));
}

GrammarBuilder::Node GrammarBuilder::Seq(std::vector<Node> parts) {
  if (parts.size() == 1) return parts[0];
  N n;
  n.kind = N::kSeq;
  n.kids = std::move(parts);
  return Add(std::move(n));
}

GrammarBuilder::Node GrammarBuilder::Alt(std::vector<Node> options) {
  if (options.size() == 1) return options[0];
  N n;
  n.kind = N::kAlt;
  n.kids = std::move(options);
  return Add(std::move(n));
}

GrammarBuilder::Node GrammarBuilder::Repeat(Node node, int min, int max) {
  N n;
  n.kind = N::kRepeat;
  n.kids = {node};
  n.min = min;
  n.max = max;
  return Add(std::move(n));
}

GrammarBuilder::Node GrammarBuilder::Codepoints(
    const std::vector<std::pair<uint32_t, uint32_t>>& ranges) {
  // Normalise: clip, drop surrogates, split at the encoded-length bounds.
  std::vector<std::pair<uint32_t, uint32_t>> parts;
  for (auto [lo, hi] : ranges) {
    hi = std::min<uint32_t>(hi, 0x10FFFF);
    if (lo > hi) continue;
    const std::pair<uint32_t, uint32_t> pieces[] = {
        {0, 0x7F}, {0x80, 0x7FF}, {0x800, 0xD7FF}, {0xE000, 0xFFFF}, {0x10000, 0x10FFFF}};
    for (auto [plo, phi] : pieces) {
      const uint32_t a = std::max(lo, plo), b = std::min(hi, phi);
      if (a <= b) parts.emplace_back(a, b);
    }
  }
  // One-byte code points gather into one byte set.
  ByteSet ascii;
  std::vector<Node> options;
  for (auto [lo, hi] : parts) {
    if (hi < 0x80) {
      ascii.AddRange(static_cast<uint8_t>(lo), static_cast<uint8_t>(hi));
      continue;
    }
    std::vector<ByteRanges> seqs;
    SplitSameLength(lo, hi, &seqs);
    for (const ByteRanges& seq : seqs) {
      std::vector<Node> bytes;
      for (auto [a, b] : seq) {
        ByteSet s;
        s.AddRange(a, b);
        bytes.push_back(Bytes(s));
      }
      options.push_back(Seq(std::move(bytes)));
    }
  }
  if (!ascii.Empty()) options.insert(options.begin(), Bytes(ascii));
  if (options.empty()) return Bytes(ByteSet{});  // matches nothing
  return Alt(std::move(options));
}

GrammarBuilder::Rule GrammarBuilder::NewRule(std::string name) {
  names_.push_back(std::move(name));
  defs_.push_back(-1);
  return static_cast<Rule>(names_.size() - 1);
}

void GrammarBuilder::Define(Rule rule, Node body) { defs_[rule] = body; }

GrammarBuilder::Node GrammarBuilder::Ref(Rule rule) {
  N n;
  n.kind = N::kRef;
  n.rule = rule;
  return Add(std::move(n));
}

// Lowers builder nodes into a Grammar's flat rules.
class GrammarLowering {
 public:
  explicit GrammarLowering(const GrammarBuilder& b) : b_(b) {}

  Grammar* g = nullptr;
  Status error;

  int32_t NewRule(const std::string& name) {
    g->rules_.emplace_back();
    g->names_.push_back(name);
    return static_cast<int32_t>(g->rules_.size() - 1);
  }
  void Commit(int32_t rule, std::vector<Element> alt) {
    if (g->elements_.size() + alt.size() + 1 > GrammarBuilder::kMaxElements) {
      if (error.ok())
        error = InvalidArgument(
            "the grammar is too large (over " + std::to_string(GrammarBuilder::kMaxElements) +
            " elements); lower the bounds (maxLength, maxItems, repetition counts) it uses");
      return;
    }
    g->rules_[rule].push_back(static_cast<int32_t>(g->elements_.size()));
    for (const Element& e : alt) g->elements_.push_back(e);
    g->elements_.push_back(Element{Element::kEnd, 0});
  }
  int32_t SetIndex(const ByteSet& s) {
    auto key = s.bits;
    auto it = set_index_.find(key);
    if (it != set_index_.end()) return it->second;
    g->sets_.push_back(s);
    const int32_t id = static_cast<int32_t>(g->sets_.size() - 1);
    set_index_.emplace(key, id);
    return id;
  }
  // The Grammar rule for builder rule r (created and queued on first use).
  int32_t MapRule(int32_t r) {
    auto it = rule_map_.find(r);
    if (it != rule_map_.end()) return it->second;
    const int32_t id = NewRule(b_.names_[r]);
    rule_map_.emplace(r, id);
    if (b_.defs_[r] < 0) {
      if (error.ok())
        error = InvalidArgument("rule '" + b_.names_[r] + "' is used but not defined");
    } else {
      pending_.emplace_back(r, id);
    }
    return id;
  }
  void Drain() {
    while (!pending_.empty() && error.ok()) {
      auto [r, id] = pending_.back();
      pending_.pop_back();
      LowerAlternatives(b_.defs_[r], id);
    }
  }
  // Defines rule `id` as node n's alternatives.
  void LowerAlternatives(int32_t n, int32_t id);
  void Emit(int32_t n, std::vector<Element>* seq);

 private:
  const GrammarBuilder& b_;
  std::map<std::array<uint64_t, 4>, int32_t> set_index_;
  std::map<int32_t, int32_t> rule_map_;
  std::vector<std::pair<int32_t, int32_t>> pending_;
  int aux_ = 0;
};

StatusOr<std::shared_ptr<const Grammar>> GrammarBuilder::Build(Rule root) const {
  auto grammar = std::make_shared<Grammar>();
  GrammarLowering low(*this);
  low.g = grammar.get();
  grammar->root_ = low.MapRule(root);
  low.Drain();
  if (!low.error.ok()) return low.error;
  Grammar& g = *grammar;

  // Fewest bytes per rule and per element suffix, by fixed point.
  std::vector<int32_t> rule_min(g.rules_.size(), kInfinite);
  g.min_suffix_.assign(g.elements_.size(), kInfinite);
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t r = 0; r < g.rules_.size(); ++r) {
      int32_t best = kInfinite;
      for (int32_t start : g.rules_[r]) {
        int32_t end = start;
        while (g.elements_[end].kind != Element::kEnd) ++end;
        int32_t suffix = 0;
        g.min_suffix_[end] = 0;
        for (int32_t p = end - 1; p >= start; --p) {
          const Element& e = g.elements_[p];
          suffix = SatAdd(suffix, e.kind == Element::kBytes ? 1 : rule_min[e.arg]);
          g.min_suffix_[p] = suffix;
        }
        best = std::min(best, suffix);
      }
      if (best < rule_min[r]) {
        rule_min[r] = best;
        changed = true;
      }
    }
  }
  for (size_t r = 0; r < g.rules_.size(); ++r) {
    if (rule_min[r] >= kInfinite)
      return InvalidArgument("rule '" + g.names_[r] +
                             "' can never finish: every alternative refers back to it; give it an "
                             "alternative without that reference");
  }
  // Left recursion: rule r reaches rule s at a position where everything
  // before it can match nothing. Matching would expand r forever.
  std::vector<std::vector<int32_t>> left(g.rules_.size());
  for (size_t r = 0; r < g.rules_.size(); ++r) {
    for (int32_t start : g.rules_[r]) {
      for (int32_t p = start; g.elements_[p].kind == Element::kRef; ++p) {
        left[r].push_back(g.elements_[p].arg);
        if (rule_min[g.elements_[p].arg] > 0) break;
      }
    }
  }
  std::vector<int8_t> color(g.rules_.size(), 0);  // 0 new, 1 on the path, 2 done
  std::string cycle;
  std::function<bool(int32_t)> visit = [&](int32_t r) {
    color[r] = 1;
    for (int32_t s : left[r]) {
      if (color[s] == 1 || (color[s] == 0 && visit(s))) {
        if (cycle.empty()) cycle = g.names_[s];
        return true;
      }
    }
    color[r] = 2;
    return false;
  };
  for (size_t r = 0; r < g.rules_.size(); ++r) {
    if (color[r] == 0 && visit(static_cast<int32_t>(r)))
      return InvalidArgument("rule '" + cycle +
                             "' is left-recursive (it can reach itself before matching any "
                             "text, e.g. x ::= x \"a\" or a repetition of something that can be "
                             "empty); rewrite it with repetition: x ::= \"a\"+");
  }
  return std::shared_ptr<const Grammar>(std::move(grammar));
}

void GrammarLowering::LowerAlternatives(int32_t n, int32_t id) {
  const auto& node = b_.nodes_[n];
  if (node.kind == GrammarBuilder::N::kAlt) {
    for (int32_t kid : node.kids) {
      std::vector<Element> alt;
      Emit(kid, &alt);
      Commit(id, std::move(alt));
    }
    return;
  }
  std::vector<Element> alt;
  Emit(n, &alt);
  Commit(id, std::move(alt));
}

void GrammarLowering::Emit(int32_t n, std::vector<Element>* seq) {
  using N = GrammarBuilder::N;
  if (!error.ok()) return;
  const N& node = b_.nodes_[n];
  switch (node.kind) {
    case N::kEmpty:
      return;
    case N::kBytes:
      seq->push_back(Element{Element::kBytes, SetIndex(node.set)});
      return;
    case N::kSeq:
      for (int32_t kid : node.kids) Emit(kid, seq);
      return;
    case N::kAlt: {
      const int32_t r = NewRule("alt" + std::to_string(aux_++));
      LowerAlternatives(n, r);
      seq->push_back(Element{Element::kRef, r});
      return;
    }
    case N::kRef:
      seq->push_back(Element{Element::kRef, MapRule(node.rule)});
      return;
    case N::kRepeat: {
      if (node.max == 0) return;
      // The repeated item as one element: itself when it lowers to one,
      // else a rule holding it.
      std::vector<Element> item;
      Emit(node.kids[0], &item);
      if (item.empty()) return;  // repeating nothing
      Element e = item[0];
      if (item.size() > 1) {
        const int32_t r = NewRule("item" + std::to_string(aux_++));
        Commit(r, std::move(item));
        e = Element{Element::kRef, r};
      }
      for (int i = 0; i < node.min; ++i) seq->push_back(e);
      if (node.max == GrammarBuilder::kUnbounded) {
        // star ::= e star | ""  (the tail reference keeps the stack flat)
        const int32_t star = NewRule("star" + std::to_string(aux_++));
        Commit(star, {e, Element{Element::kRef, star}});
        Commit(star, {});
        seq->push_back(Element{Element::kRef, star});
        return;
      }
      // opt_k ::= e opt_{k-1} | ""  (k = max - min optional copies)
      int32_t prev = -1;
      for (int k = 1; k <= node.max - node.min && error.ok(); ++k) {
        const int32_t opt = NewRule("opt" + std::to_string(aux_++));
        if (prev < 0)
          Commit(opt, {e});
        else
          Commit(opt, {e, Element{Element::kRef, prev}});
        Commit(opt, {});
        prev = opt;
      }
      if (prev >= 0) seq->push_back(Element{Element::kRef, prev});
      return;
    }
  }
}

}  // namespace strata::constrain
