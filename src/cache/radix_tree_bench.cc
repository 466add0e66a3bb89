// Host cost of the prefix cache per scheduled request: matching a cached
// 4,096-token prompt (1,024-token shared system prompt + 3,072 own tokens),
// the steady-state churn of admit -> insert -> evict with a full pool, and
// with a host tier (HiCache) the churn of back up -> offload -> load back
// (the tree's bookkeeping only; the copies themselves are not here).
// Args: page_size. Items are prompt tokens, so items/s compares directly
// with the tokens/s the engine must sustain.
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "cache/page_allocator.h"
#include "cache/radix_tree.h"

namespace strata {
namespace {

constexpr int kSystem = 1024;
constexpr int kOwn = 3072;
constexpr int kPrompts = 64;

std::vector<int32_t> Prompt(int i) {
  std::vector<int32_t> t(kSystem + kOwn);
  for (int j = 0; j < kSystem; ++j) t[static_cast<size_t>(j)] = j;  // shared by all
  std::mt19937 gen(static_cast<unsigned>(i) + 1);
  for (int j = kSystem; j < kSystem + kOwn; ++j)
    t[static_cast<size_t>(j)] = static_cast<int32_t>(gen() % 150000);
  return t;
}

// Inserts prompt i using freshly allocated pages, leaving the tree as the only owner.
void Cache(RadixTree& tree, PageAllocator& alloc, const std::vector<int32_t>& prompt) {
  const int64_t need = static_cast<int64_t>(prompt.size()) / tree.page_size();
  if (!alloc.CanAllocate(need)) tree.Evict(need - alloc.num_free());
  std::vector<int32_t> pages;
  if (!alloc.Allocate(need, &pages).ok()) std::abort();
  tree.Insert(prompt, pages);
  for (int32_t p : pages) alloc.Unref(p);
}

void BM_MatchCachedPrompt(benchmark::State& state) {
  const int ps = static_cast<int>(state.range(0));
  PageAllocator alloc(int64_t{kPrompts} * (kSystem + kOwn) / ps);
  RadixTree tree({ps}, &alloc);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < kPrompts; ++i) {
    prompts.push_back(Prompt(i));
    Cache(tree, alloc, prompts.back());
  }
  size_t i = 0;
  for (auto _ : state) {
    RadixTree::MatchResult m = tree.MatchPrefix(prompts[i++ % prompts.size()]);
    benchmark::DoNotOptimize(m.num_tokens);
  }
  state.SetItemsProcessed(state.iterations() * (kSystem + kOwn));
}

void BM_InsertEvictChurn(benchmark::State& state) {
  const int ps = static_cast<int>(state.range(0));
  // Room for 8 prompts: every insert past that evicts the oldest.
  PageAllocator alloc(int64_t{8} * (kSystem + kOwn) / ps);
  RadixTree tree({ps}, &alloc);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < kPrompts; ++i) prompts.push_back(Prompt(i));
  size_t i = 0;
  for (auto _ : state) Cache(tree, alloc, prompts[i++ % prompts.size()]);
  state.SetItemsProcessed(state.iterations() * (kSystem + kOwn));
}

// Device pool for 8 prompts, host pool for all 64: every prompt was backed
// up when first cached, so a later request finds it on the host, loads it
// back (Insert of fresh device pages, offloading older prompts to make room).
void BM_OffloadLoadBackChurn(benchmark::State& state) {
  const int ps = static_cast<int>(state.range(0));
  const int64_t per_prompt = (kSystem + kOwn) / ps;
  PageAllocator alloc(8 * per_prompt);
  PageAllocator host(kPrompts * per_prompt);
  RadixTree tree({ps}, &alloc, &host);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < kPrompts; ++i) prompts.push_back(Prompt(i));
  for (const auto& p : prompts) {
    const int64_t need = static_cast<int64_t>(p.size()) / ps;
    if (!alloc.CanAllocate(need)) tree.Evict(need - alloc.num_free());
    std::vector<int32_t> pages;
    if (!alloc.Allocate(need, &pages).ok()) std::abort();
    RadixTree::InsertResult ins = tree.Insert(p, pages);
    for (int32_t pg : pages) alloc.Unref(pg);
    for (const auto& job : tree.StartBackup(ins.handle)) tree.CompleteBackup(job.id);
  }
  size_t i = 0;
  for (auto _ : state) {
    const auto& p = prompts[i++ % prompts.size()];
    RadixTree::MatchResult m = tree.MatchPrefix(p);
    if (m.host_tokens == 0) continue;
    tree.Lock(m.host_handle);
    const int64_t need = m.host_tokens / ps;
    if (!alloc.CanAllocate(need)) tree.Evict(need - alloc.num_free());
    std::vector<int32_t> pages = m.pages;
    if (!alloc.Allocate(need, &pages).ok()) std::abort();
    tree.Insert(p, pages);
    tree.Unlock(m.host_handle);
    for (size_t k = m.pages.size(); k < pages.size(); ++k) alloc.Unref(pages[k]);
  }
  state.SetItemsProcessed(state.iterations() * (kSystem + kOwn));
}

BENCHMARK(BM_MatchCachedPrompt)->Arg(1)->Arg(16)->Arg(64);
BENCHMARK(BM_InsertEvictChurn)->Arg(1)->Arg(16)->Arg(64);
BENCHMARK(BM_OffloadLoadBackChurn)->Arg(1)->Arg(16)->Arg(64);

}  // namespace
}  // namespace strata

BENCHMARK_MAIN();
