#include "router/policy.h"

#include <algorithm>

namespace strata::router {
namespace {

class RoundRobinPolicy final : public Policy {
 public:
  int Pick(std::span<const Candidate> candidates, std::string_view) override {
    // The first candidate after the last worker picked (candidates are in
    // worker order), so an unhealthy worker dropping out does not make the
    // rotation skip or repeat the others.
    std::lock_guard lock(mu_);
    const Candidate* next = nullptr;
    for (const Candidate& c : candidates)
      if (c.worker > last_) {
        next = &c;
        break;
      }
    if (next == nullptr) next = &candidates.front();
    last_ = next->worker;
    return last_;
  }
  std::string_view name() const override { return "round_robin"; }

 private:
  std::mutex mu_;
  int last_ = -1;
};

class RandomPolicy final : public Policy {
 public:
  explicit RandomPolicy(uint64_t seed) : rng_(seed ? seed : std::random_device{}()) {}
  int Pick(std::span<const Candidate> candidates, std::string_view) override {
    std::lock_guard lock(mu_);
    std::uniform_int_distribution<size_t> d(0, candidates.size() - 1);
    return candidates[d(rng_)].worker;
  }
  std::string_view name() const override { return "random"; }

 private:
  std::mutex mu_;
  std::mt19937_64 rng_;
};

class LeastLoadPolicy final : public Policy {
 public:
  int Pick(std::span<const Candidate> candidates, std::string_view) override {
    return LeastLoaded(candidates).worker;
  }
  std::string_view name() const override { return "least_load"; }
};

// FNV-1a over the block, seeded with the previous block's hash: the chain.
uint64_t HashBlock(uint64_t prev, std::string_view block) {
  uint64_t h = prev ^ 0xcbf29ce484222325ull;
  for (unsigned char c : block) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  // A final mix so that short blocks spread over the whole word.
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  return h;
}

}  // namespace

std::vector<uint64_t> PrefixBlockHashes(std::string_view text, size_t block_bytes,
                                        size_t max_blocks) {
  std::vector<uint64_t> out;
  uint64_t h = 0;
  for (size_t pos = 0; pos < text.size() && out.size() < max_blocks; pos += block_bytes) {
    h = HashBlock(h, text.substr(pos, block_bytes));
    out.push_back(h);
  }
  return out;
}

const Candidate& LeastLoaded(std::span<const Candidate> candidates) {
  return *std::min_element(candidates.begin(), candidates.end(),
                           [](const Candidate& a, const Candidate& b) { return a.load < b.load; });
}

StatusOr<std::unique_ptr<Policy>> Policy::Create(const PolicyOptions& options) {
  if (options.name == "round_robin") return std::unique_ptr<Policy>(new RoundRobinPolicy());
  if (options.name == "random") return std::unique_ptr<Policy>(new RandomPolicy(options.seed));
  if (options.name == "least_load") return std::unique_ptr<Policy>(new LeastLoadPolicy());
  if (options.name == "cache_aware") return std::unique_ptr<Policy>(new CacheAwarePolicy(options));
  return InvalidArgument("policy '" + options.name + "' is not one of " +
                         std::string(kPolicyNames));
}

int CacheAwarePolicy::Pick(std::span<const Candidate> candidates, std::string_view prefix_text) {
  const std::vector<uint64_t> hashes = PrefixBlockHashes(prefix_text);
  const Candidate& least = LeastLoaded(candidates);
  std::lock_guard lock(mu_);
  const Candidate* target = nullptr;
  // The longest remembered prefix whose worker is a candidate now.
  for (size_t k = hashes.size(); k-- > 0 && target == nullptr;) {
    auto it = owner_.find(hashes[k]);
    if (it == owner_.end()) continue;
    for (const Candidate& c : candidates)
      if (c.worker == it->second.worker) target = &c;
  }
  if (target != nullptr) {
    const bool far_above =
        target->load - least.load > options_.balance_abs_threshold &&
        static_cast<double>(target->load) > options_.balance_rel_threshold * least.load;
    if (far_above) target = &least;
  } else {
    target = &least;
  }
  Remember(hashes, target->worker);
  return target->worker;
}

void CacheAwarePolicy::Remember(const std::vector<uint64_t>& hashes, int worker) {
  for (uint64_t h : hashes) {
    auto it = owner_.find(h);
    if (it != owner_.end()) {
      it->second.worker = worker;
      lru_.splice(lru_.begin(), lru_, it->second.lru);
      continue;
    }
    lru_.push_front(h);
    owner_.emplace(h, Entry{worker, lru_.begin()});
  }
  while (owner_.size() > std::max<size_t>(1, options_.max_entries)) {
    owner_.erase(lru_.back());
    lru_.pop_back();
  }
}

size_t CacheAwarePolicy::entries() const {
  std::lock_guard lock(mu_);
  return owner_.size();
}

}  // namespace strata::router
