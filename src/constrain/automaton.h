// The matcher a compiled grammar runs on, and the token masks it gives.
//
// A parse position of a Grammar is a set of stacks of element indices (the
// llama.cpp grammar form: each stack's top is a byte set to match next; an
// empty stack means the root is complete). The Automaton determinises that
// pushdown machine lazily: each distinct stack set met is interned as a
// State, and its byte transitions and token masks are computed on first use
// and kept. A state is therefore one int per request, advancing over a
// token is one table lookup per byte once the state has been seen, and a
// schema's masks are computed once and then shared by every request that
// uses it (the cache lives as long as the compiled grammar).
//
// Masks: Vocabulary holds the token byte strings in a trie laid out flat in
// depth-first order, so a state's mask is one forward scan of an array:
// each node's byte is looked up in the transition row of its parent's
// state, and a byte that kills every stack skips the node's whole subtree
// (a jump to its end). The cost is proportional to the live prefixes, not
// to vocab x token length, and the scan reads memory in order. A state's
// transition row is computed whole the first time it is needed, once per
// class of bytes the state cannot tell apart (so a string body's ~100
// ordinary bytes cost one successor, not one each). A subtree whose bytes
// all stay inside the state's run (see ComputeRun: a string body's ordinary
// characters, for as many as it has left) is taken whole from the
// depth-first token list without scanning it. Tokens with no bytes
// (special tokens, ids past the tokenizer) are never allowed; the
// end-of-sequence ids only in accepting states.
//
// Fragments: a state whose stacks all share a bottom (the context: where a
// string, say, stands) is walked as its local part alone, the stacks above
// that bottom with a mark in its place, and the walk's outcome is kept per
// vocabulary under an exact description of the grammar the local part can
// reach (Vocabulary::Fragment): the tokens it accepts whatever the context
// is ("certain", with their distance from the mark) and the tokens that
// reach the mark before their last byte ("uncertain": the context decides).
// A state's mask is then the certain tokens, shifted by the context's
// distance, plus the uncertain ones checked one by one against the whole
// state. So a string body is walked once per shape (a JSON string of at
// most n characters, n left) for every property and every schema of one
// model, and a new schema's first answer costs its structural states and
// the few tokens that close a string.
//
// Termination: every state knows its distance, the fewest bytes that
// complete the grammar from it. Given the tokens left, Mask() allows only
// tokens after which the distance plus EOS still fits, so every answer ends
// inside its token budget whatever the model prefers (as long as the
// vocabulary can write one byte a token, as byte-level BPE can).
//
// Limits: stacks deeper than kMaxStackDepth die (nesting deeper than that
// is not generated); past kMaxStates interned states the tables are dropped
// and rebuilt on demand (State values then go stale: holders re-intern
// their stacks, see Position).
//
// Thread-safety: an Automaton is shared by the requests of one grammar; its
// methods lock an internal mutex, so any thread may call them. Vocabulary is
// immutable.
#pragma once

#include <array>
#include <climits>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "constrain/grammar.h"

namespace strata::constrain {

// One bit per token id: bit (id % 32) of word id / 32.
using TokenBitmask = std::vector<uint32_t>;
inline bool MaskHas(std::span<const uint32_t> mask, int32_t id) {
  return (mask[static_cast<size_t>(id) >> 5] >> (id & 31)) & 1;
}

class Vocabulary {
 public:
  // token_bytes[id]: what token id writes ("" for tokens never allowed).
  // eos: the ids that end the output (allowed only where the grammar is
  // complete).
  Vocabulary(std::vector<std::string> token_bytes, std::vector<int32_t> eos);

  int64_t size() const { return static_cast<int64_t>(bytes_.size()); }
  size_t words() const { return (bytes_.size() + 31) / 32; }
  const std::string& bytes(int32_t id) const { return bytes_[id]; }
  const std::vector<int32_t>& eos() const { return eos_; }

  // The trie, nodes in depth-first (pre)order; node 0 is the root (no
  // byte, depth 0). Node n's subtree is nodes [n, end); its own tokens are
  // token_ids()[tok, nodes[n + 1].tok) and its subtree's tokens
  // token_ids()[tok, nodes[end].tok) (a sentinel node closes the array).
  struct TrieNode {
    int32_t end = 0;
    int32_t tok = 0;
    // Index into below() when the subtree holds >= kMinBelowTokens tokens
    // (worth testing whole), else -1.
    int32_t below = -1;
    uint16_t depth = 0;  // bytes from the root (longer tokens than 65,535 are left out)
    uint8_t byte = 0;    // the byte on the edge into this node
  };
  static constexpr int32_t kMinBelowTokens = 8;
  // Nodes and sentinel: trie().size() - 1 nodes.
  const std::vector<TrieNode>& trie() const { return trie_; }
  const std::vector<int32_t>& token_ids() const { return token_ids_; }
  // A node's subtree seen from the node: every byte on an edge below it,
  // and its height (the longest token under it, less the node's depth).
  struct Below {
    ByteSet bytes;
    int32_t height = 0;
  };
  const std::vector<Below>& below() const { return below_; }
  int32_t max_depth() const { return max_depth_; }

  // A local part's walk (see "Fragments" above), shared by every automaton
  // over this vocabulary. Token ranges index token_ids().
  struct Fragment {
    struct Range {
      int32_t distance;  // from the mark: the context's is added per state
      int32_t begin, end;
    };
    std::vector<Range> certain;
    // Trie nodes whose path reaches the mark: the tokens below each (its
    // subtree but its own tokens) are walked from the whole state.
    std::vector<int32_t> uncertain;
    // The longest local stack the walk met (the mark included): a context
    // deeper than kMaxStackDepth less this could cut a stack the local walk
    // kept, so such a state walks whole.
    int32_t max_stack = 0;
    size_t bytes() const {
      return sizeof(Fragment) + certain.size() * sizeof(Range) +
             uncertain.size() * sizeof(uncertain[0]);
    }
  };
  // The fragment described by key, or null. Thread-safe.
  std::shared_ptr<const Fragment> FindFragment(const std::string& key) const;
  // Keeps f under key (the first one kept wins; past kMaxFragmentBytes the
  // cache starts over). Thread-safe.
  void KeepFragment(const std::string& key, std::shared_ptr<const Fragment> f) const;
  static constexpr size_t kMaxFragmentBytes = size_t{256} << 20;
  // Drops every fragment (benchmarks: a process that has masked nothing).
  void ClearFragments() const;

 private:
  struct FragmentCache {
    std::mutex mu;
    std::unordered_map<std::string, std::shared_ptr<const Fragment>> map;
    size_t bytes = 0;
  };
  std::shared_ptr<FragmentCache> fragments_ = std::make_shared<FragmentCache>();
  std::vector<std::string> bytes_;
  std::vector<int32_t> eos_;
  std::vector<TrieNode> trie_;
  std::vector<int32_t> token_ids_;  // in depth-first order
  std::vector<Below> below_;
  int32_t max_depth_ = 0;
};

class Automaton {
 public:
  using State = int32_t;
  static constexpr State kDead = -1;
  static constexpr int kMaxStackDepth = 256;
  static constexpr size_t kMaxStates = 1 << 16;
  // A state whose tokens lead to more distinct distances than this keeps
  // only its plain mask; a limited mask there is walked per use.
  static constexpr size_t kMaxDistanceLayers = 8;

  Automaton(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const Vocabulary> vocab);

  // A request's place in the grammar: the State and, so that it survives a
  // reset of the tables, the stacks it stands for.
  struct Position {
    State state = kDead;
    uint64_t generation = 0;
    std::vector<int32_t> stacks;  // flattened (see automaton.cc)
  };
  Position Start();
  // Follows `bytes` from p; false (p unchanged) when the grammar does not
  // allow them.
  bool Advance(Position& p, std::string_view bytes);
  bool Accepting(Position& p);
  // Accepting and nothing can follow (only EOS may come).
  bool Complete(Position& p);
  // Fewest bytes that complete the grammar from p (0 when accepting).
  int32_t Distance(Position& p);
  // The tokens allowed next: those whose bytes keep the grammar alive, plus
  // EOS when accepting. tokens_left (this one included; kUnlimited: no
  // limit) keeps the answer inside its budget: when some allowed token
  // could leave more bytes to write than tokens to write them, only tokens
  // after which distance + 1 (for EOS) still fits are allowed, and EOS alone
  // once nothing else does. Never empty: without such a token it falls back
  // to the plain mask. The plain mask is cached per state.
  static constexpr int64_t kUnlimited = INT64_MAX;
  std::shared_ptr<const TokenBitmask> Mask(Position& p, int64_t tokens_left = kUnlimited);

  const Vocabulary& vocab() const { return *vocab_; }
  const Grammar& grammar() const { return *grammar_; }
  // For tests and benchmarks.
  size_t num_states() const;
  size_t num_cached_masks() const;
  // What Mask() calls cost, by kind: a plain mask from the state cache, a
  // plain mask walked now (a new state), a budget-limited mask.
  struct MaskStats {
    // layered: limited masks served from the state's distance layers
    // (no walk); limited: walked because the state has none.
    int64_t cached = 0, computed = 0, layered = 0, limited = 0;
    // Of the walks (computed + limited): fragments found in the
    // vocabulary's cache, walked now, and states walked whole.
    int64_t fragment_hits = 0, fragment_walks = 0, whole_walks = 0;
    double computed_seconds = 0, limited_seconds = 0;
  };
  MaskStats mask_stats() const;

 private:
  struct StateData {
    std::vector<int32_t> stacks;  // flattened
    bool accepting = false;
    bool complete = false;
    bool has_mark = false;  // a local state with a stack popped to the mark
    int32_t max_stack = 0;  // its longest stack
    std::shared_ptr<const TokenBitmask> mask;  // plain (cached)
    // The state's run, once computed (see ComputeRun()).
    bool has_run = false;
    ByteSet run_bytes;
    int32_t run_length = 0;
    int32_t max_next_distance = 0;  // over the plain mask's tokens
    // Budget-limited masks without a walk: by[k] allows the tokens after
    // which the distance is at most by_distance[k] (ascending; EOS as in
    // the plain mask), cumulative, so by.back() is the plain mask. Empty
    // when the tokens reach more than kMaxDistanceLayers distances.
    std::vector<int32_t> by_distance;
    std::vector<std::shared_ptr<const TokenBitmask>> by;
  };
  static constexpr State kUnknown = -2;

  // All REQUIRE mu_ held.
  State Intern(std::vector<std::vector<int32_t>> stacks);
  State InternFlat(const std::vector<int32_t>& flat);
  // s's transition row (kDead where no stack takes the byte), computed
  // whole on first use.
  const State* Row(State s);
  // A run of s: bytes such that every string of them of at most
  // run_length bytes leads from s to live states of s's own distance (a
  // string body's ordinary characters: run_length is what a bounded string
  // has left, kMaxRun where they loop back to s). A trie subtree using only
  // these bytes and no deeper than that is allowed whole, at that distance,
  // without walking it. Computed on first use, from the next state's run.
  static constexpr int32_t kMaxRun = INT32_MAX;
  void ComputeRun(State s);
  void Expand(std::vector<int32_t> stack, std::vector<std::vector<int32_t>>* out) const;
  State Resolve(Position& p);  // p's state in the current generation
  // limit: the largest distance allowed after a token (plain: kNoLimit).
  static constexpr int64_t kNoLimit = INT64_MAX;
  std::shared_ptr<const TokenBitmask> ComputeMask(State s, int64_t limit, int32_t* max_next);
  // The plain mask's walk, split by the distance after each token into
  // StateData::by_distance / by (empty past kMaxDistanceLayers).
  // Returns the plain mask.
  std::shared_ptr<const TokenBitmask> ComputeLayers(
      State s, std::vector<int32_t>* distances,
      std::vector<std::shared_ptr<const TokenBitmask>>* masks, int32_t* max_next);
  // The tokens from s whose end state is live and at most limit from the
  // end: emit(distance, ids, n) for each run of them. Through s's fragment
  // when s splits (Split) and its fragment applies, else by a whole walk.
  template <typename Emit>
  void Tokens(State s, int64_t limit, Emit emit);
  // The trie walk from s over nodes [from, to), a subtree's (from: its
  // first child; s: the state its root's bytes lead to) or the whole trie
  // (1, trie().size() - 1): emit as above. kLocal: s is a local state; at
  // a node whose state has the mark, the node's own tokens are emitted and
  // uncertain(node) is called instead of walking below it; *max_stack
  // gets the longest stack met.
  template <bool kLocal, typename Emit, typename Uncertain>
  void Walk(State s, int64_t limit, int32_t from, int32_t to, Emit emit, Uncertain uncertain,
            int32_t* max_stack);
  // s's local part (flattened, the mark at each stack's bottom) and the
  // context's distance; false when its stacks share no bottom to cut.
  // Returns the stacks' elements cut (0: no split).
  int32_t Split(State s, std::vector<int32_t>* local, int32_t* context_distance);
  // An exact description of what the local stacks can reach (elements,
  // byte sets, rules), independent of the grammar's numbering; empty when
  // it would describe more than kMaxFragmentElements elements.
  static constexpr size_t kMaxFragmentElements = 1024;
  std::string Describe(const std::vector<int32_t>& local) const;
  std::shared_ptr<const Vocabulary::Fragment> WalkFragment(State local);
  void Reset();

  std::shared_ptr<const Grammar> grammar_;
  std::shared_ptr<const Vocabulary> vocab_;
  mutable std::mutex mu_;
  std::vector<StateData> states_;
  // Per state too, apart from StateData because the mask walk reads them
  // per trie node: the distance, and the transition row (null until Row()
  // computes it; the array stays put while states are added).
  std::vector<int32_t> distance_;
  std::vector<std::unique_ptr<std::array<State, 256>>> rows_;
  std::unordered_map<std::string, State> index_;  // flattened stacks -> state
  uint64_t generation_ = 0;
  size_t cached_masks_ = 0;
  MaskStats mask_stats_;
  std::vector<int32_t> start_;  // the start state's flattened stacks
  // The mark standing for a local state's context: an element index past
  // the grammar's (Expand keeps it, no byte matches it, its distance is 0).
  int32_t mark_ = 0;
};

}  // namespace strata::constrain
