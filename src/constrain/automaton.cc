#include "constrain/automaton.h"

#include <algorithm>
#include <chrono>
#include <cstring>

namespace strata::constrain {
namespace {

// A state's stacks flattened: for each stack (sorted, unique), its length,
// then its element indices bottom to top. The flattened form is also the
// interning key.
std::vector<int32_t> Flatten(const std::vector<std::vector<int32_t>>& stacks) {
  std::vector<int32_t> flat;
  for (const auto& s : stacks) {
    flat.push_back(static_cast<int32_t>(s.size()));
    flat.insert(flat.end(), s.begin(), s.end());
  }
  return flat;
}

std::vector<std::vector<int32_t>> Unflatten(const std::vector<int32_t>& flat) {
  std::vector<std::vector<int32_t>> stacks;
  for (size_t i = 0; i < flat.size();) {
    const size_t n = static_cast<size_t>(flat[i++]);
    stacks.emplace_back(flat.begin() + static_cast<std::ptrdiff_t>(i),
                        flat.begin() + static_cast<std::ptrdiff_t>(i + n));
    i += n;
  }
  return stacks;
}

std::string Key(const std::vector<int32_t>& flat) {
  return std::string(reinterpret_cast<const char*>(flat.data()), flat.size() * sizeof(int32_t));
}

// A state with more stacks than this keeps the first ones: ambiguous
// grammars could otherwise grow without bound (what is kept is still
// valid; some alternatives are not offered).
constexpr size_t kMaxStacksPerState = 4096;
// Masks kept per automaton, in bytes; past it masks are computed per use.
constexpr size_t kMaxMaskBytes = size_t{64} << 20;
// Subtrees with fewer tokens are walked rather than tested for a loop.
constexpr int32_t kMinLoopSubtree = 8;

}  // namespace

Vocabulary::Vocabulary(std::vector<std::string> token_bytes, std::vector<int32_t> eos)
    : bytes_(std::move(token_bytes)), eos_(std::move(eos)) {
  trie_.emplace_back();
  for (size_t id = 0; id < bytes_.size(); ++id) {
    const std::string& b = bytes_[id];
    // EOS ends the output wherever it is allowed: never text.
    if (b.empty() || std::find(eos_.begin(), eos_.end(), static_cast<int32_t>(id)) != eos_.end())
      continue;
    int32_t node = 0;
    for (char c : b) {
      const uint8_t byte = static_cast<uint8_t>(c);
      int32_t next = -1;
      for (const auto& [kb, kn] : trie_[node].kids) {
        if (kb == byte) {
          next = kn;
          break;
        }
      }
      if (next < 0) {
        next = static_cast<int32_t>(trie_.size());
        trie_[node].kids.emplace_back(byte, next);
        trie_.emplace_back();  // invalidates references into trie_: none held
      }
      node = next;
    }
    trie_[node].tokens.push_back(static_cast<int32_t>(id));
  }
  for (Node& n : trie_) std::sort(n.kids.begin(), n.kids.end());
  // Depth-first token order and the bytes under each node, children first
  // (an explicit stack: tokens can be long).
  std::vector<std::pair<int32_t, bool>> todo = {{0, false}};
  while (!todo.empty()) {
    auto [n, done] = todo.back();
    todo.pop_back();
    if (!done) {
      trie_[n].first = static_cast<int32_t>(subtree_tokens_.size());
      subtree_tokens_.insert(subtree_tokens_.end(), trie_[n].tokens.begin(), trie_[n].tokens.end());
      todo.emplace_back(n, true);
      for (auto it = trie_[n].kids.rbegin(); it != trie_[n].kids.rend(); ++it)
        todo.emplace_back(it->second, false);
      continue;
    }
    Node& node = trie_[n];
    node.count = static_cast<int32_t>(subtree_tokens_.size()) - node.first;
    for (const auto& [b, kid] : node.kids) {
      node.below.Add(b);
      for (int i = 0; i < 4; ++i) node.below.bits[i] |= trie_[kid].below.bits[i];
    }
  }
  eos_.erase(
      std::remove_if(eos_.begin(), eos_.end(), [&](int32_t id) { return id < 0 || id >= size(); }),
      eos_.end());
}

Automaton::Automaton(std::shared_ptr<const Grammar> grammar,
                     std::shared_ptr<const Vocabulary> vocab)
    : grammar_(std::move(grammar)), vocab_(std::move(vocab)) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::vector<int32_t>> stacks;
  for (int32_t alt : grammar_->alternatives(grammar_->root())) Expand({alt}, &stacks);
  const State s = Intern(std::move(stacks));
  start_ = states_[s].stacks;
}

void Automaton::Expand(std::vector<int32_t> stack, std::vector<std::vector<int32_t>>* out) const {
  const std::vector<Element>& el = grammar_->elements();
  for (;;) {
    if (out->size() >= kMaxStacksPerState) return;
    if (stack.empty()) {
      out->push_back(std::move(stack));
      return;
    }
    const int32_t pos = stack.back();
    const Element& e = el[pos];
    if (e.kind == Element::kBytes) {
      out->push_back(std::move(stack));
      return;
    }
    if (e.kind == Element::kEnd) {
      stack.pop_back();
      continue;
    }
    // A rule reference: the frame resumes after it (or is dropped when
    // nothing follows: a tail call keeps repetition from growing the stack).
    stack.back() = pos + 1;
    if (el[pos + 1].kind == Element::kEnd) stack.pop_back();
    if (static_cast<int>(stack.size()) >= kMaxStackDepth) return;
    const std::vector<int32_t>& alts = grammar_->alternatives(e.arg);
    for (size_t i = 0; i + 1 < alts.size(); ++i) {
      std::vector<int32_t> s2 = stack;
      s2.push_back(alts[i]);
      Expand(std::move(s2), out);
    }
    stack.push_back(alts.back());
  }
}

Automaton::State Automaton::Intern(std::vector<std::vector<int32_t>> stacks) {
  std::sort(stacks.begin(), stacks.end());
  stacks.erase(std::unique(stacks.begin(), stacks.end()), stacks.end());
  return InternFlat(Flatten(stacks));
}

Automaton::State Automaton::InternFlat(const std::vector<int32_t>& flat) {
  std::string key = Key(flat);
  auto it = index_.find(key);
  if (it != index_.end()) return it->second;
  StateData sd;
  sd.stacks = flat;
  sd.distance = 1 << 30;
  bool all_empty = true;
  for (const auto& s : Unflatten(flat)) {
    int64_t d = 0;
    for (int32_t pos : s) d += grammar_->min_suffix(pos);
    sd.distance = static_cast<int32_t>(std::min<int64_t>(sd.distance, d));
    if (s.empty())
      sd.accepting = true;
    else
      all_empty = false;
  }
  sd.complete = all_empty && sd.accepting;
  const State id = static_cast<State>(states_.size());
  states_.push_back(std::move(sd));
  index_.emplace(std::move(key), id);
  return id;
}

Automaton::State Automaton::Next(State s, uint8_t b) {
  if (!states_[s].next) {
    states_[s].next = std::make_unique<std::array<State, 256>>();
    states_[s].next->fill(kUnknown);
  }
  const State known = (*states_[s].next)[b];
  if (known != kUnknown) return known;
  std::vector<std::vector<int32_t>> out;
  const std::vector<Element>& el = grammar_->elements();
  for (std::vector<int32_t>& stack : Unflatten(states_[s].stacks)) {
    if (stack.empty()) continue;
    const Element& e = el[stack.back()];
    if (e.kind != Element::kBytes || !grammar_->set(e.arg).Has(b)) continue;
    stack.back()++;
    Expand(std::move(stack), &out);
  }
  const State next = out.empty() ? kDead : Intern(std::move(out));
  (*states_[s].next)[b] = next;  // states_ may have grown: index again
  return next;
}

const ByteSet& Automaton::Loop(State s) {
  if (!states_[s].has_loop) {
    ByteSet loop;
    for (int b = 0; b < 256; ++b)
      if (Next(s, static_cast<uint8_t>(b)) == s) loop.Add(static_cast<uint8_t>(b));
    states_[s].loop = loop;
    states_[s].has_loop = true;
  }
  return states_[s].loop;
}

void Automaton::Reset() {
  states_.clear();
  index_.clear();
  cached_masks_ = 0;
  ++generation_;
}

Automaton::State Automaton::Resolve(Position& p) {
  if (states_.size() >= kMaxStates) Reset();
  if (p.generation != generation_ || p.state < 0 || p.state >= static_cast<State>(states_.size())) {
    p.state = InternFlat(p.stacks);
    p.generation = generation_;
  }
  return p.state;
}

Automaton::Position Automaton::Start() {
  std::lock_guard<std::mutex> lock(mu_);
  Position p;
  p.stacks = start_;
  p.generation = generation_ + 1;  // resolved on first use
  return p;
}

bool Automaton::Advance(Position& p, std::string_view bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  State s = Resolve(p);
  for (char c : bytes) {
    s = Next(s, static_cast<uint8_t>(c));
    if (s == kDead) return false;
  }
  p.state = s;
  p.stacks = states_[s].stacks;
  return true;
}

bool Automaton::Accepting(Position& p) {
  std::lock_guard<std::mutex> lock(mu_);
  return states_[Resolve(p)].accepting;
}

bool Automaton::Complete(Position& p) {
  std::lock_guard<std::mutex> lock(mu_);
  return states_[Resolve(p)].complete;
}

int32_t Automaton::Distance(Position& p) {
  std::lock_guard<std::mutex> lock(mu_);
  return states_[Resolve(p)].distance;
}

std::shared_ptr<const TokenBitmask> Automaton::Mask(Position& p, int64_t tokens_left) {
  std::lock_guard<std::mutex> lock(mu_);
  const State s = Resolve(p);
  std::shared_ptr<const TokenBitmask> plain = states_[s].mask;
  int32_t max_next = states_[s].max_next_distance;
  using Clock = std::chrono::steady_clock;
  const bool fresh = !plain;
  // The layers: the state's own when cached (no copy on the warm path),
  // else this call's (a state over the cache limit).
  std::vector<int32_t> uncached_distance;
  std::vector<std::shared_ptr<const TokenBitmask>> uncached_by;
  bool cached = !fresh;
  if (fresh) {
    const auto t0 = Clock::now();
    plain = ComputeLayers(s, &uncached_distance, &uncached_by, &max_next);
    ++mask_stats_.computed;
    mask_stats_.computed_seconds += std::chrono::duration<double>(Clock::now() - t0).count();
    // by.back() is plain itself when there are layers.
    const size_t masks = std::max<size_t>(uncached_by.size(), 1);
    if ((cached_masks_ + masks) * plain->size() * sizeof(uint32_t) <= kMaxMaskBytes) {
      StateData& sd = states_[s];
      sd.mask = plain;
      sd.max_next_distance = max_next;
      sd.by_distance = std::move(uncached_distance);
      sd.by = std::move(uncached_by);
      cached_masks_ += masks;
      cached = true;
    }
  }
  // No state is added before the last use of these (ComputeMask below may).
  const std::vector<int32_t>& by_distance = cached ? states_[s].by_distance : uncached_distance;
  const std::vector<std::shared_ptr<const TokenBitmask>>& by = cached ? states_[s].by : uncached_by;
  // After this token, tokens_left - 1 remain; distance + 1 of them must.
  const int64_t limit = tokens_left == kUnlimited ? kNoLimit : tokens_left - 2;
  if (max_next <= limit) {
    if (!fresh) ++mask_stats_.cached;
    return plain;
  }
  if (!by.empty()) {
    // The layer of the largest distance within the limit; none fits: EOS
    // alone where accepting, else the plain mask (as a walk would give).
    ++mask_stats_.layered;
    const auto it = std::upper_bound(by_distance.begin(), by_distance.end(), limit);
    if (it != by_distance.begin()) return by[static_cast<size_t>(it - by_distance.begin()) - 1];
    if (!states_[s].accepting) return plain;
    auto eos = std::make_shared<TokenBitmask>(vocab_->words(), 0u);
    for (int32_t id : vocab_->eos()) (*eos)[static_cast<size_t>(id) >> 5] |= 1u << (id & 31);
    return eos;
  }
  int32_t unused = 0;
  const auto t0 = Clock::now();
  auto limited = ComputeMask(s, limit, &unused);
  ++mask_stats_.limited;
  mask_stats_.limited_seconds += std::chrono::duration<double>(Clock::now() - t0).count();
  return limited ? limited : plain;
}

template <typename Emit>
void Automaton::Walk(State s, int64_t limit, Emit emit) {
  const std::vector<Vocabulary::Node>& trie = vocab_->trie();
  const std::vector<int32_t>& subtree = vocab_->subtree_tokens();
  std::vector<std::pair<int32_t, State>> todo = {{0, s}};
  while (!todo.empty()) {
    const auto [node, st] = todo.back();
    todo.pop_back();
    for (const auto& [b, child] : trie[node].kids) {
      const State ns = Next(st, b);
      if (ns == kDead) continue;
      const int32_t d = states_[ns].distance;
      const Vocabulary::Node& c = trie[child];
      // A subtree whose bytes all loop at ns: all its tokens end at ns.
      // Checked only for subtrees big enough to repay the loop set.
      if (c.count >= kMinLoopSubtree) {
        const ByteSet& loop = Loop(ns);
        bool inside = true;
        for (int i = 0; i < 4; ++i) inside = inside && (c.below.bits[i] & ~loop.bits[i]) == 0;
        if (inside) {
          if (d <= limit) emit(d, subtree.data() + c.first, static_cast<size_t>(c.count));
          continue;
        }
      }
      if (d <= limit && !c.tokens.empty()) emit(d, c.tokens.data(), c.tokens.size());
      if (!c.kids.empty()) todo.emplace_back(child, ns);
    }
  }
}

// Tokens whose end state is live and (limit) no farther than limit from
// the end are set. nullptr when a limited walk found no token.
std::shared_ptr<const TokenBitmask> Automaton::ComputeMask(State s, int64_t limit,
                                                           int32_t* max_next) {
  auto mask = std::make_shared<TokenBitmask>(vocab_->words(), 0u);
  bool any = false;
  *max_next = 0;
  Walk(s, limit, [&](int32_t d, const int32_t* ids, size_t n) {
    for (size_t k = 0; k < n; ++k) (*mask)[static_cast<size_t>(ids[k]) >> 5] |= 1u << (ids[k] & 31);
    any = true;
    *max_next = std::max(*max_next, d);
  });
  if (limit != kNoLimit && !any && !states_[s].accepting) return nullptr;
  if (states_[s].accepting)
    for (int32_t id : vocab_->eos()) (*mask)[static_cast<size_t>(id) >> 5] |= 1u << (id & 31);
  return mask;
}

std::shared_ptr<const TokenBitmask> Automaton::ComputeLayers(
    State s, std::vector<int32_t>* distances,
    std::vector<std::shared_ptr<const TokenBitmask>>* masks, int32_t* max_next) {
  const size_t words = vocab_->words();
  std::vector<std::pair<int32_t, TokenBitmask>> layers;  // by first appearance
  TokenBitmask rest;  // past kMaxDistanceLayers distances: everything else
  *max_next = 0;
  Walk(s, kNoLimit, [&](int32_t d, const int32_t* ids, size_t n) {
    *max_next = std::max(*max_next, d);
    TokenBitmask* m = nullptr;
    for (auto& [ld, lm] : layers)
      if (ld == d) m = &lm;
    if (!m && layers.size() < kMaxDistanceLayers) m = &layers.emplace_back(d, words).second;
    if (!m) {
      if (rest.empty()) rest.assign(words, 0u);
      m = &rest;
    }
    for (size_t k = 0; k < n; ++k) (*m)[static_cast<size_t>(ids[k]) >> 5] |= 1u << (ids[k] & 31);
  });
  std::sort(layers.begin(), layers.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  TokenBitmask acc(words, 0u);
  if (states_[s].accepting)
    for (int32_t id : vocab_->eos()) acc[static_cast<size_t>(id) >> 5] |= 1u << (id & 31);
  distances->clear();
  masks->clear();
  for (const auto& [d, m] : layers) {
    for (size_t w = 0; w < words; ++w) acc[w] |= m[w];
    if (rest.empty()) {
      distances->push_back(d);
      masks->push_back(std::make_shared<const TokenBitmask>(acc));
    }
  }
  if (rest.empty() && !masks->empty()) return masks->back();
  distances->clear();
  masks->clear();
  for (size_t w = 0; w < rest.size(); ++w) acc[w] |= rest[w];
  return std::make_shared<const TokenBitmask>(std::move(acc));
}

Automaton::MaskStats Automaton::mask_stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return mask_stats_;
}

size_t Automaton::num_states() const {
  std::lock_guard<std::mutex> lock(mu_);
  return states_.size();
}

size_t Automaton::num_cached_masks() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cached_masks_;
}

}  // namespace strata::constrain
