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

}  // namespace

Vocabulary::Vocabulary(std::vector<std::string> token_bytes, std::vector<int32_t> eos)
    : bytes_(std::move(token_bytes)), eos_(std::move(eos)) {
  eos_.erase(
      std::remove_if(eos_.begin(), eos_.end(), [&](int32_t id) { return id < 0 || id >= size(); }),
      eos_.end());
  // Tokens in byte order are the trie's depth-first order: each token adds
  // the nodes past its common prefix with the one before. EOS ends the
  // output wherever it is allowed (never text); a token too long for a
  // node's depth is never allowed either.
  std::vector<int32_t> order;
  for (size_t id = 0; id < bytes_.size(); ++id) {
    const std::string& b = bytes_[id];
    if (b.empty() || b.size() > UINT16_MAX ||
        std::find(eos_.begin(), eos_.end(), static_cast<int32_t>(id)) != eos_.end())
      continue;
    order.push_back(static_cast<int32_t>(id));
  }
  // std::string compares bytes as unsigned (char_traits<char>): byte order.
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return bytes_[a] < bytes_[b]; });
  trie_.emplace_back();  // the root
  std::vector<int32_t> parent = {-1};
  std::vector<int32_t> path = {0};  // path[d]: the node at depth d on the current token's path
  std::string_view prev;
  auto close_to = [&](size_t depth) {  // the nodes deeper than depth end here
    while (path.size() > depth + 1) {
      trie_[path.back()].end = static_cast<int32_t>(trie_.size());
      path.pop_back();
    }
  };
  for (int32_t id : order) {
    const std::string_view b = bytes_[id];
    size_t common = 0;
    while (common < prev.size() && common < b.size() && prev[common] == b[common]) ++common;
    close_to(common);
    for (size_t d = common; d < b.size(); ++d) {
      TrieNode n;
      n.tok = static_cast<int32_t>(token_ids_.size());
      n.depth = static_cast<uint16_t>(d + 1);
      n.byte = static_cast<uint8_t>(b[d]);
      parent.push_back(path.back());
      path.push_back(static_cast<int32_t>(trie_.size()));
      trie_.push_back(n);
    }
    token_ids_.push_back(id);
    max_depth_ = std::max(max_depth_, static_cast<int32_t>(b.size()));
    prev = b;
  }
  close_to(0);
  trie_[0].end = static_cast<int32_t>(trie_.size());
  TrieNode sentinel;
  sentinel.tok = static_cast<int32_t>(token_ids_.size());
  sentinel.end = static_cast<int32_t>(trie_.size()) + 1;
  trie_.push_back(sentinel);
  // The bytes below each node and its height, children before parents
  // (reverse preorder); kept for the subtrees big enough to be tested whole.
  std::vector<Below> below(trie_.size() - 1);
  for (size_t n = below.size() - 1; n >= 1; --n) {
    Below& up = below[static_cast<size_t>(parent[n])];
    up.bytes.Add(trie_[n].byte);
    for (int i = 0; i < 4; ++i) up.bytes.bits[i] |= below[n].bytes.bits[i];
    up.height = std::max(up.height, below[n].height + 1);
  }
  for (size_t n = 0; n + 1 < trie_.size(); ++n) {
    if (trie_[trie_[n].end].tok - trie_[n].tok < kMinBelowTokens) continue;
    trie_[n].below = static_cast<int32_t>(below_.size());
    below_.push_back(below[n]);
  }
}

std::shared_ptr<const Vocabulary::Fragment> Vocabulary::FindFragment(
    const std::string& key) const {
  std::lock_guard<std::mutex> lock(fragments_->mu);
  auto it = fragments_->map.find(key);
  return it == fragments_->map.end() ? nullptr : it->second;
}

void Vocabulary::KeepFragment(const std::string& key, std::shared_ptr<const Fragment> f) const {
  std::lock_guard<std::mutex> lock(fragments_->mu);
  const size_t bytes = key.size() + f->bytes();
  if (fragments_->bytes + bytes > kMaxFragmentBytes) {
    fragments_->map.clear();
    fragments_->bytes = 0;
  }
  if (fragments_->map.emplace(key, std::move(f)).second) fragments_->bytes += bytes;
}

void Vocabulary::ClearFragments() const {
  std::lock_guard<std::mutex> lock(fragments_->mu);
  fragments_->map.clear();
  fragments_->bytes = 0;
}

Automaton::Automaton(std::shared_ptr<const Grammar> grammar,
                     std::shared_ptr<const Vocabulary> vocab)
    : grammar_(std::move(grammar)), vocab_(std::move(vocab)) {
  std::lock_guard<std::mutex> lock(mu_);
  mark_ = static_cast<int32_t>(grammar_->elements().size());
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
    if (pos == mark_) {  // a local stack back at its context: the context goes on
      out->push_back(std::move(stack));
      return;
    }
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
  int32_t distance = 1 << 30;
  bool all_empty = true;
  for (const auto& s : Unflatten(flat)) {
    int64_t d = 0;
    for (int32_t pos : s)
      if (pos != mark_) d += grammar_->min_suffix(pos);
    if (!s.empty() && s.back() == mark_) sd.has_mark = true;
    sd.max_stack = std::max(sd.max_stack, static_cast<int32_t>(s.size()));
    distance = static_cast<int32_t>(std::min<int64_t>(distance, d));
    if (s.empty())
      sd.accepting = true;
    else
      all_empty = false;
  }
  sd.complete = all_empty && sd.accepting;
  const State id = static_cast<State>(states_.size());
  states_.push_back(std::move(sd));
  distance_.push_back(distance);
  rows_.emplace_back();
  index_.emplace(std::move(key), id);
  return id;
}

const Automaton::State* Automaton::Row(State s) {
  if (rows_[s]) return rows_[s]->data();
  // Bytes that every stack top treats alike lead to the same state: split
  // the bytes into classes by membership in each distinct top set, then
  // advance once per class.
  std::vector<std::vector<int32_t>> stacks = Unflatten(states_[s].stacks);
  const std::vector<Element>& el = grammar_->elements();
  std::vector<int32_t> sets;
  for (const auto& stack : stacks)
    if (!stack.empty() && stack.back() != mark_ && el[stack.back()].kind == Element::kBytes)
      sets.push_back(el[stack.back()].arg);
  std::sort(sets.begin(), sets.end());
  sets.erase(std::unique(sets.begin(), sets.end()), sets.end());
  std::array<int16_t, 256> cls{};  // all bytes in class 0
  int classes = 1;
  for (int32_t set : sets) {
    const ByteSet& in = grammar_->set(set);
    std::array<int16_t, 512> split;  // (class, member) -> new class
    split.fill(-1);
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      int16_t& c =
          split[static_cast<size_t>(cls[b] * 2 + (in.Has(static_cast<uint8_t>(b)) ? 1 : 0))];
      if (c < 0) c = static_cast<int16_t>(n++);
      cls[b] = c;
    }
    classes = n;
  }
  std::vector<State> to(static_cast<size_t>(classes), kUnknown);
  auto row = std::make_unique<std::array<State, 256>>();
  for (int b = 0; b < 256; ++b) {
    State& t = to[static_cast<size_t>(cls[b])];
    if (t == kUnknown) {
      std::vector<std::vector<int32_t>> out;
      for (const auto& stack : stacks) {
        if (stack.empty() || stack.back() == mark_) continue;
        const Element& e = el[stack.back()];
        if (e.kind != Element::kBytes || !grammar_->set(e.arg).Has(static_cast<uint8_t>(b)))
          continue;
        std::vector<int32_t> moved = stack;
        moved.back()++;
        Expand(std::move(moved), &out);
      }
      t = out.empty() ? kDead : Intern(std::move(out));
    }
    (*row)[b] = t;
  }
  rows_[s] = std::move(row);  // rows_ may have grown: index again
  return rows_[s]->data();
}

void Automaton::ComputeRun(State s) {
  // Forward along the chain of successors whose runs are still unknown,
  // then back, each run from the next one's.
  std::vector<State> chain;
  std::vector<State> succ;
  for (State cur = s;;) {
    const State* row = Row(cur);
    // The run's bytes: those looping back to cur where there are any, else
    // the largest set of bytes leading to one live state.
    ByteSet bytes;
    State to = kDead;
    for (int b = 0; b < 256; ++b)
      if (row[b] == cur) bytes.Add(static_cast<uint8_t>(b)), to = cur;
    if (to == kDead) {
      std::vector<std::pair<State, int>> counts;
      for (int b = 0; b < 256; ++b) {
        if (row[b] == kDead) continue;
        auto it = std::find_if(counts.begin(), counts.end(),
                               [&](const auto& c) { return c.first == row[b]; });
        if (it == counts.end())
          counts.emplace_back(row[b], 1);
        else
          ++it->second;
      }
      int best = 0;
      for (const auto& [st, c] : counts)
        if (c > best) best = c, to = st;
      for (int b = 0; b < 256; ++b)
        if (row[b] == to && to != kDead) bytes.Add(static_cast<uint8_t>(b));
    }
    StateData& sd = states_[cur];
    sd.run_bytes = bytes;
    chain.push_back(cur);
    succ.push_back(to);
    if (to == kDead || distance_[to] != distance_[cur]) {
      sd.run_length = 0;  // one byte already changes the distance
      sd.has_run = true;
      chain.pop_back(), succ.pop_back();
      break;
    }
    if (to == cur) {
      sd.run_length = kMaxRun;
      sd.has_run = true;
      chain.pop_back(), succ.pop_back();
      break;
    }
    // Past the longest token the length no longer matters: end the chain
    // there, conservatively (that state's run is one byte).
    if (states_[to].has_run || static_cast<int32_t>(chain.size()) > vocab_->max_depth()) {
      if (!states_[to].has_run) {
        states_[to].run_bytes = ByteSet{};
        states_[to].run_length = 0;
        states_[to].has_run = true;
      }
      break;
    }
    cur = to;
  }
  // chain[i] -> succ[i] by every byte of its run, at the same distance.
  for (size_t i = chain.size(); i-- > 0;) {
    StateData& sd = states_[chain[i]];
    const StateData& next = states_[succ[i]];
    bool inside = true;
    for (int w = 0; w < 4; ++w)
      inside = inside && (sd.run_bytes.bits[w] & ~next.run_bytes.bits[w]) == 0;
    if (!inside)
      sd.run_length = 1;  // one byte reaches succ[i]; past it the bytes differ
    else
      sd.run_length = next.run_length == kMaxRun ? kMaxRun : next.run_length + 1;
    sd.has_run = true;
  }
}

void Automaton::Reset() {
  states_.clear();
  distance_.clear();
  rows_.clear();
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
    s = Row(s)[static_cast<uint8_t>(c)];
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
  return distance_[Resolve(p)];
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

template <bool kLocal, typename Emit, typename Uncertain>
void Automaton::Walk(State s, int64_t limit, int32_t from, int32_t to, Emit emit,
                     Uncertain uncertain, int32_t* max_stack) {
  const Vocabulary::TrieNode* trie = vocab_->trie().data();
  const int32_t* ids = vocab_->token_ids().data();
  const Vocabulary::Below* below = vocab_->below().data();
  // rows[d]: the transition row of the state reached at depth d of the
  // current path, set only where a child follows (a leaf's state never
  // computes one).
  if (from >= to) return;
  std::vector<const State*> rows(static_cast<size_t>(vocab_->max_depth()) + 1);
  rows[trie[from].depth - 1] = Row(s);
  // Live nodes in a row usually have their tokens side by side in ids and
  // reach the same distance: runs are merged and emitted whole.
  int32_t run_begin = 0, run_end = 0, run_d = -1;
  auto add = [&](int32_t d, int32_t begin, int32_t end) {
    if (d == run_d && begin == run_end) {
      run_end = end;
      return;
    }
    if (run_end > run_begin) emit(run_d, ids + run_begin, static_cast<size_t>(run_end - run_begin));
    run_d = d, run_begin = begin, run_end = end;
  };
  for (int32_t n = from; n < to;) {
    const Vocabulary::TrieNode& t = trie[n];
    const State ns = rows[t.depth - 1][t.byte];
    if (ns == kDead) {
      n = t.end;
      continue;
    }
    const int32_t d = distance_[ns];
    if constexpr (kLocal) {
      // Past the mark the context decides: the node's own tokens end at
      // their (exact) local distance, the ones below are the context's.
      const StateData& sd = states_[ns];
      *max_stack = std::max(*max_stack, sd.max_stack);
      if (sd.has_mark) {
        const int32_t own_end = trie[n + 1].tok;
        if (own_end > t.tok && d <= limit) add(d, t.tok, own_end);
        if (trie[t.end].tok > own_end) uncertain(n);
        n = t.end;
        continue;
      }
    }
    // A subtree inside ns's run: all its tokens end at distance d. (In a
    // local walk only at d > 0: a run at distance 0 may pass the mark.)
    if (t.below >= 0 && (!kLocal || d > 0)) {
      if (!states_[ns].has_run) ComputeRun(ns);
      const StateData& sd = states_[ns];
      const Vocabulary::Below& b = below[t.below];
      if (b.height <= sd.run_length &&
          ((b.bytes.bits[0] & ~sd.run_bytes.bits[0]) | (b.bytes.bits[1] & ~sd.run_bytes.bits[1]) |
           (b.bytes.bits[2] & ~sd.run_bytes.bits[2]) | (b.bytes.bits[3] & ~sd.run_bytes.bits[3])) ==
              0) {
        if (d <= limit) add(d, t.tok, trie[t.end].tok);
        n = t.end;
        continue;
      }
    }
    const Vocabulary::TrieNode& next = trie[n + 1];
    if (next.tok > t.tok && d <= limit) add(d, t.tok, next.tok);
    if (next.depth > t.depth) rows[t.depth] = rows_[ns] ? rows_[ns]->data() : Row(ns);
    ++n;
  }
  if (run_end > run_begin) emit(run_d, ids + run_begin, static_cast<size_t>(run_end - run_begin));
}

int32_t Automaton::Split(State s, std::vector<int32_t>* local, int32_t* context_distance) {
  const std::vector<int32_t>& flat = states_[s].stacks;
  if (flat.empty() || flat[0] == 0) return 0;
  // The longest bottom every stack shares.
  const int32_t* first = flat.data() + 1;
  int32_t common = flat[0];
  for (size_t i = 0; i < flat.size();) {
    const int32_t n = flat[i];
    if (n == 0) return 0;  // an accepting stack: nothing to cut
    int32_t k = 0;
    while (k < std::min(n, common) && flat[i + 1 + static_cast<size_t>(k)] == first[k]) ++k;
    common = k;
    i += 1 + static_cast<size_t>(n);
  }
  // Keep one shared element above the cut, so that no local stack starts
  // at the mark (the walk's root state then never has it).
  const int32_t cut = common - 1;
  if (cut < 1) return 0;
  int64_t d = 0;
  for (int32_t k = 0; k < cut; ++k) d += grammar_->min_suffix(first[k]);
  *context_distance = static_cast<int32_t>(std::min<int64_t>(d, INT32_MAX / 2));
  local->clear();
  for (size_t i = 0; i < flat.size();) {
    const int32_t n = flat[i];
    local->push_back(n - cut + 1);
    local->push_back(mark_);
    local->insert(local->end(), flat.begin() + static_cast<std::ptrdiff_t>(i + 1 + cut),
                  flat.begin() + static_cast<std::ptrdiff_t>(i + 1 + n));
    i += 1 + static_cast<size_t>(n);
  }
  return cut;
}

std::string Automaton::Describe(const std::vector<int32_t>& local) const {
  // Element tails (a position to its alternative's end) and rules are
  // numbered in the order first met, and each is written out where it is
  // first met (tails) or after the stacks (rules, breadth first): equal
  // descriptions are the same grammar up to renaming.
  const std::vector<Element>& el = grammar_->elements();
  std::string out;
  std::unordered_map<int32_t, int32_t> rule_id, tail_id;
  std::vector<int32_t> rules;
  size_t elements = 0;
  auto put = [&](int32_t v) { out.append(reinterpret_cast<const char*>(&v), sizeof(v)); };
  auto tail = [&](int32_t pos) {
    for (int32_t p = pos;; ++p) {
      if (++elements > kMaxFragmentElements) return false;
      const Element& e = el[p];
      if (e.kind == Element::kEnd) {
        put(-1);
        return true;
      }
      if (e.kind == Element::kBytes) {
        put(-2);
        out.append(reinterpret_cast<const char*>(grammar_->set(e.arg).bits.data()),
                   sizeof(ByteSet::bits));
        continue;
      }
      auto [it, fresh] = rule_id.emplace(e.arg, static_cast<int32_t>(rule_id.size()));
      if (fresh) rules.push_back(e.arg);
      put(-3);
      put(it->second);
    }
  };
  for (size_t i = 0; i < local.size();) {
    const int32_t n = local[i++];
    put(-4);
    put(n);
    for (int32_t k = 0; k < n; ++k) {
      const int32_t pos = local[i + static_cast<size_t>(k)];
      if (pos == mark_) {
        put(-5);
        continue;
      }
      auto [it, fresh] = tail_id.emplace(pos, static_cast<int32_t>(tail_id.size()));
      put(-6);
      put(it->second);
      if (fresh && !tail(pos)) return {};
    }
    i += static_cast<size_t>(n);
  }
  for (size_t q = 0; q < rules.size(); ++q) {
    const std::vector<int32_t>& alts = grammar_->alternatives(rules[q]);
    put(-7);
    put(static_cast<int32_t>(alts.size()));
    for (int32_t alt : alts)
      if (!tail(alt)) return {};
  }
  return out;
}

std::shared_ptr<const Vocabulary::Fragment> Automaton::WalkFragment(State local) {
  auto f = std::make_shared<Vocabulary::Fragment>();
  const int32_t* ids = vocab_->token_ids().data();
  f->max_stack = states_[local].max_stack;
  Walk<true>(
      local, kNoLimit, 1, static_cast<int32_t>(vocab_->trie().size()) - 1,
      [&](int32_t d, const int32_t* first, size_t n) {
        const auto begin = static_cast<int32_t>(first - ids);
        f->certain.push_back({d, begin, begin + static_cast<int32_t>(n)});
      },
      [&](int32_t node) { f->uncertain.push_back(node); }, &f->max_stack);
  return f;
}

template <typename Emit>
void Automaton::Tokens(State s, int64_t limit, Emit emit) {
  const int32_t nodes = static_cast<int32_t>(vocab_->trie().size()) - 1;
  auto none = [](int32_t) {};
  // A context so deep that the whole state's stacks could hit
  // kMaxStackDepth where the local ones did not (with room for a stack
  // that grows and shrinks inside one expansion) walks whole.
  constexpr int32_t kStackMargin = 32;
  auto fits = [&](int32_t cut, int32_t local_stack) {
    return cut - 1 + local_stack + kStackMargin < kMaxStackDepth;
  };
  std::vector<int32_t> local;
  int32_t context = 0;
  const int32_t cut = Split(s, &local, &context);
  std::string key = cut > 0 && fits(cut, states_[s].max_stack - cut + 1) ? Describe(local) : "";
  std::shared_ptr<const Vocabulary::Fragment> f;
  if (!key.empty()) {
    f = vocab_->FindFragment(key);
    if (f) {
      ++mask_stats_.fragment_hits;
    } else {
      f = WalkFragment(InternFlat(local));
      vocab_->KeepFragment(key, f);
      ++mask_stats_.fragment_walks;
    }
  }
  if (!f || !fits(cut, f->max_stack)) {
    ++mask_stats_.whole_walks;
    Walk<false>(s, limit, 1, nodes, emit, none, nullptr);
    return;
  }
  const int32_t* ids = vocab_->token_ids().data();
  for (const Vocabulary::Fragment::Range& r : f->certain) {
    const int32_t d = r.distance + context;
    if (d <= limit) emit(d, ids + r.begin, static_cast<size_t>(r.end - r.begin));
  }
  // Below each uncertain node: the whole state after the node's bytes (the
  // first token under it starts with them), then the subtree from there.
  const std::vector<Vocabulary::TrieNode>& trie = vocab_->trie();
  for (int32_t node : f->uncertain) {
    const Vocabulary::TrieNode& t = trie[node];
    const std::string& bytes = vocab_->bytes(ids[t.tok]);
    State cur = s;
    for (int32_t k = 0; k < t.depth && cur != kDead; ++k)
      cur = Row(cur)[static_cast<uint8_t>(bytes[static_cast<size_t>(k)])];
    if (cur == kDead) continue;
    Walk<false>(cur, limit, node + 1, t.end, emit, none, nullptr);
  }
}

// Tokens whose end state is live and (limit) no farther than limit from
// the end are set. nullptr when a limited walk found no token.
std::shared_ptr<const TokenBitmask> Automaton::ComputeMask(State s, int64_t limit,
                                                           int32_t* max_next) {
  auto mask = std::make_shared<TokenBitmask>(vocab_->words(), 0u);
  bool any = false;
  *max_next = 0;
  Tokens(s, limit, [&](int32_t d, const int32_t* ids, size_t n) {
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
  layers.reserve(kMaxDistanceLayers);                    // `last` below stays valid
  TokenBitmask rest;  // past kMaxDistanceLayers distances: everything else
  *max_next = 0;
  int32_t last_d = -1;
  TokenBitmask* last = nullptr;  // the layer of last_d (most runs repeat it)
  Tokens(s, kNoLimit, [&](int32_t d, const int32_t* ids, size_t n) {
    if (d != last_d) {
      *max_next = std::max(*max_next, d);
      last = nullptr;
      for (auto& [ld, lm] : layers)
        if (ld == d) last = &lm;
      if (!last && layers.size() < kMaxDistanceLayers) last = &layers.emplace_back(d, words).second;
      if (!last) {
        if (rest.empty()) rest.assign(words, 0u);
        last = &rest;
      }
      last_d = d;
    }
    uint32_t* m = last->data();
    for (size_t k = 0; k < n; ++k) m[static_cast<uint32_t>(ids[k]) >> 5] |= 1u << (ids[k] & 31);
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
