// Load-balancing policies: which of the workers that may take a request now
// gets it. The router filters the candidates (healthy, breaker not open, not
// already tried for this request) and passes each one's load; a policy only
// chooses.
//
//   round_robin  the next candidate after the last one picked
//   random       uniform among the candidates
//   least_load   the smallest load (ties: the lowest index)
//   cache_aware  prefix affinity: the candidate that last served the longest
//                prefix of this prompt (prefix_text cut into kAffinityBlockBytes
//                blocks, each block's hash chained with the previous one's, so
//                block k's hash names the first k+1 blocks), unless its load is
//                far above the least loaded one's (both: more than
//                balance_abs_threshold above it and more than
//                balance_rel_threshold times it), or nothing matched: then the
//                least loaded. The choice is remembered for every block of the
//                prompt. The router does not tokenize, so blocks are bytes of
//                the prompt text (or of the chat messages as JSON), not pages;
//                they approximate the worker's radix cache (a page of 16 tokens
//                is roughly 64 bytes of English).
//
// Thread-safety: Pick() may be called from any thread (each policy has its own
// mutex where it keeps state).
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "util/status.h"

namespace strata::router {

// One worker the policy may choose: its index in the router's worker list
// and its load (requests running + queued at the worker, as the router
// estimates it: router.h).
struct Candidate {
  int worker = 0;
  int64_t load = 0;
};

inline constexpr size_t kAffinityBlockBytes = 64;
inline constexpr size_t kAffinityMaxBlocks = 64;  // the first 4 KiB of a prompt

struct PolicyOptions {
  std::string name = "cache_aware";  // round_robin | random | least_load | cache_aware
  uint64_t seed = 0;                 // random: 0 picks one from std::random_device
  // cache_aware: the affinity target is left for the least loaded candidate
  // when its load exceeds the least one's by more than abs AND is more than
  // rel times it (SGLang router's balance thresholds).
  int64_t balance_abs_threshold = 32;
  double balance_rel_threshold = 1.5;
  // cache_aware: most prefix blocks remembered (least recently used dropped).
  size_t max_entries = 1 << 20;
};

inline constexpr std::string_view kPolicyNames = "round_robin, random, least_load, cache_aware";

class Policy {
 public:
  virtual ~Policy() = default;
  // Creates the policy `options.name` names; InvalidArgument naming the
  // allowed names otherwise.
  static StatusOr<std::unique_ptr<Policy>> Create(const PolicyOptions& options);

  // REQUIRES: !candidates.empty(). Returns one of candidates[i].worker.
  // `prefix_text`: the prompt as text (cache_aware only; others ignore it).
  virtual int Pick(std::span<const Candidate> candidates, std::string_view prefix_text) = 0;
  virtual std::string_view name() const = 0;
  // Whether Pick uses prefix_text (the router extracts it only then).
  virtual bool wants_prefix() const { return false; }
};

// The chained block hashes of the first kAffinityMaxBlocks blocks of `text`
// (the last, partial block included): element k names text[0, (k+1)*block).
std::vector<uint64_t> PrefixBlockHashes(std::string_view text,
                                        size_t block_bytes = kAffinityBlockBytes,
                                        size_t max_blocks = kAffinityMaxBlocks);

// The least loaded candidate (ties: first in the list).
const Candidate& LeastLoaded(std::span<const Candidate> candidates);

// The cache_aware policy, public for its tests.
class CacheAwarePolicy final : public Policy {
 public:
  explicit CacheAwarePolicy(const PolicyOptions& options) : options_(options) {}
  int Pick(std::span<const Candidate> candidates, std::string_view prefix_text) override;
  std::string_view name() const override { return "cache_aware"; }
  bool wants_prefix() const override { return true; }
  size_t entries() const;

 private:
  void Remember(const std::vector<uint64_t>& hashes, int worker);  // REQUIRES: mu_ held
  PolicyOptions options_;
  mutable std::mutex mu_;
  // Block hash -> (worker, position in lru_); lru_ front = most recent.
  struct Entry {
    int worker;
    std::list<uint64_t>::iterator lru;
  };
  std::unordered_map<uint64_t, Entry> owner_;
  std::list<uint64_t> lru_;
};

}  // namespace strata::router
