#include "engine/scheduler.h"

#include <algorithm>
#include <chrono>

#include "engine/kv_handoff.h"
#include "util/logging.h"

namespace strata {
namespace {

// A shared prefix shorter than this is recomputed rather than waited for:
// deferring a request costs it a step of latency.
constexpr int64_t kMinSharedTokensToDefer = 32;

}  // namespace

const char* RequestStateName(RequestState state) {
  switch (state) {
    case RequestState::kWaiting:
      return "waiting";
    case RequestState::kLoadingPrefix:
      return "loading_prefix";
    case RequestState::kPrefilling:
      return "prefilling";
    case RequestState::kDecoding:
      return "decoding";
    case RequestState::kAwaitingKv:
      return "awaiting_kv";
    case RequestState::kTransferring:
      return "transferring";
    case RequestState::kFinished:
      return "finished";
  }
  return "unknown";
}

Sequence::Sequence(EngineRequest r, std::shared_ptr<RequestHandle> h, int page_size)
    : req(std::move(r)),
      handle(std::move(h)),
      table(page_size),
      sampler(req.params, std::nullopt) {}

Scheduler::Scheduler(const SchedulerOptions& options, KvPool& pool, RadixTree* radix,
                     HiCache* hicache)
    : options_(options),
      pool_(pool),
      radix_(radix),
      hicache_(hicache),
      backing_(pool.window_backing()),
      window_(backing_ ? pool.layout().MaxSlidingWindow() : 0),
      new_token_ratio_(options.init_new_token_ratio) {
  STRATA_CHECK(!hicache_ || radix_) << "HiCache needs the radix prefix cache";
  STRATA_CHECK(!hicache_ || !backing_) << "HiCache addresses every pool group by page id";
}

int64_t Scheduler::UnbackedWindowPages(const Sequence& s, int64_t from_pos) const {
  if (!backing_) return 0;
  const std::vector<int32_t>& pages = s.table.pages();
  int64_t n = 0;
  for (size_t i = static_cast<size_t>(FirstPageInWindow(from_pos, window_, options_.page_size));
       i < pages.size(); ++i)
    n += !backing_->backed(pages[i]);
  return n;
}

bool Scheduler::ReclaimWindowSlots(int64_t n, const Sequence& for_seq) {
  if (backing_->num_free_slots() >= n) return true;
  const PageAllocator& alloc = pool_.allocator();
  const std::vector<int32_t>& page_of = backing_->page_of_slot();
  // First the garbage: slots still mapped to page ids that are free.
  for (size_t sl = 0; sl < page_of.size() && backing_->num_free_slots() < n; ++sl)
    if (page_of[sl] >= 0 && alloc.refcount(page_of[sl]) == 0) backing_->Release(page_of[sl]);
  if (backing_->num_free_slots() >= n) return true;
  // Then pages no running sequence's window needs (the tree's, or pages
  // another sequence shared and left behind).
  std::vector<uint8_t> needed(static_cast<size_t>(backing_->num_page_ids()), 0);
  auto mark = [&](const Sequence& r) {
    const std::vector<int32_t>& pages = r.table.pages();
    for (size_t i = static_cast<size_t>(FirstPageInWindow(r.computed, window_, options_.page_size));
         i < pages.size(); ++i)
      needed[static_cast<size_t>(pages[i])] = 1;
  };
  for (const auto& r : running_) mark(*r);
  mark(for_seq);
  for (size_t sl = 0; sl < page_of.size() && backing_->num_free_slots() < n; ++sl)
    if (page_of[sl] >= 0 && !needed[static_cast<size_t>(page_of[sl])])
      backing_->Release(page_of[sl]);
  return backing_->num_free_slots() >= n;
}

void Scheduler::BackWindow(Sequence& s, int64_t from_pos) {
  if (!backing_) return;
  std::vector<int32_t> fresh;
  const std::vector<int32_t>& pages = s.table.pages();
  for (size_t i = static_cast<size_t>(FirstPageInWindow(from_pos, window_, options_.page_size));
       i < pages.size(); ++i)
    if (!backing_->backed(pages[i])) fresh.push_back(pages[i]);
  const Status st = backing_->Back(fresh);
  STRATA_CHECK(st.ok()) << st.message();
}

void Scheduler::DropOutOfWindow(Sequence& s) {
  if (!backing_) return;
  const std::vector<int32_t>& pages = s.table.pages();
  const int64_t first = std::min<int64_t>(
      FirstPageInWindow(s.computed, window_, options_.page_size), static_cast<int64_t>(pages.size()));
  for (int64_t i = s.window_dropped; i < first; ++i) {
    const int32_t p = pages[static_cast<size_t>(i)];
    if (backing_->backed(p) && pool_.allocator().refcount(p) == 1) backing_->Release(p);
  }
  s.window_dropped = std::max(s.window_dropped, first);
}

void Scheduler::ReplaceTombstones(Sequence& s, int64_t upto) {
  if (!backing_ || upto <= 0) return;
  // The tree keeps its own pages where it already had the tokens; where
  // those lost their window and s's are backed, s's are the better copy.
  radix_->ReplaceDevicePages(std::span<const int32_t>(s.tokens.data(), static_cast<size_t>(upto)),
                             s.table.pages(), [&](int32_t tree_page, int32_t page) {
                               return !backing_->backed(tree_page) && backing_->backed(page);
                             });
}

size_t Scheduler::UsableMatch(std::span<const int32_t> pages) const {
  size_t k = pages.size();
  if (!backing_) return k;
  for (;;) {
    // The last tombstone in the window before page k; none: k pages will do.
    const size_t first = static_cast<size_t>(
        FirstPageInWindow(static_cast<int64_t>(k) * options_.page_size, window_, options_.page_size));
    size_t j = k;
    for (size_t i = k; i > first; --i)
      if (!backing_->backed(pages[i - 1])) {
        j = i - 1;
        break;
      }
    if (j == k) return k;
    k = j;  // end the prefix before the tombstone
  }
}

int64_t Scheduler::FutureTokens(const Sequence& s) const {
  const int64_t have = static_cast<int64_t>(s.tokens.size());
  // A PD prefill generates one token; the decode side generates the rest.
  const int64_t left = std::min({std::max<int64_t>(s.limit - have, 0),
                                 options_.clip_new_tokens_estimate,
                                 s.req.kv_export ? int64_t{1} : INT64_MAX});
  const int64_t want = have + static_cast<int64_t>(new_token_ratio_ * static_cast<double>(left));
  return std::max<int64_t>(want - s.table.capacity(), 0);
}

int64_t Scheduler::DecodeHeadroom() const {
  int64_t pages = pool_.allocator().num_free();
  if (radix_) pages += radix_->stats().evictable_pages;
  int64_t headroom = pages * options_.page_size;
  for (const auto& s : running_) headroom -= FutureTokens(*s);
  return headroom;
}

Scheduler::~Scheduler() {
  // Pages go back before the pool and tree disappear.
  const Status down = Unavailable("aborted: the server is shutting down");
  for (auto& s : running_) {
    if (s->state == RequestState::kLoadingPrefix) hicache_->WaitLoadBack(s->load_ticket);
    if (s->req.kv_import) s->req.kv_import->Abort(down);
    if (s->req.kv_export) s->req.kv_export->Abort(down);
    ReleaseKv(*s, false);
  }
  for (auto& s : waiting_) {
    if (s->req.kv_import) s->req.kv_import->Abort(down);
    if (s->req.kv_export) s->req.kv_export->Abort(down);
    ReleaseKv(*s, false);
  }
}

void Scheduler::Add(std::unique_ptr<Sequence> seq) {
  seq->state = RequestState::kWaiting;
  waiting_tokens_ += static_cast<int64_t>(seq->tokens.size());
  waiting_.push_back(std::move(seq));
}

void Scheduler::CachePrefix(Sequence& s, int64_t upto) {
  const int64_t full = upto / options_.page_size * options_.page_size;
  if (!radix_ || full <= s.cached_len) return;
  RadixTree::InsertResult r =
      radix_->Insert(std::span<const int32_t>(s.tokens.data(), full), s.table.pages());
  ReplaceTombstones(s, full);
  // Lock the longer prefix before dropping the shorter one, so no page of it
  // is ever evictable while this sequence runs on it.
  radix_->Lock(r.handle);
  if (s.prefix_locked) radix_->Unlock(s.prefix);
  s.prefix = r.handle;
  s.prefix_locked = true;
  s.cached_len = full;
  if (hicache_) hicache_->OnInserted(r.handle);
}

void Scheduler::ReleaseKv(Sequence& s, bool cache_prefix) {
  if (radix_ && cache_prefix && s.computed >= options_.page_size) {
    const int64_t full = s.computed / options_.page_size * options_.page_size;
    if (full > s.cached_len) {
      RadixTree::InsertResult r =
          radix_->Insert(std::span<const int32_t>(s.tokens.data(), full), s.table.pages());
      if (hicache_) hicache_->OnInserted(r.handle);
    }
    ReplaceTombstones(s, full);
  }
  if (s.prefix_locked) {
    radix_->Unlock(s.prefix);
    s.prefix_locked = false;
  }
  s.table.Release(pool_.allocator());
  s.computed = 0;
  s.cached_len = 0;
  s.window_dropped = 0;
  s.load_end = 0;
  s.load_host_pages.clear();
  s.load_ticket = 0;
}

void Scheduler::Finish(Sequence& s, FinishReason reason, Status error) {
  if (s.finished()) return;
  const bool was_waiting = s.state == RequestState::kWaiting;
  // A handoff still open ends here too (one that completed or failed was
  // dropped by AdvanceHandoffs). Only shutdown and waiting requests reach
  // this with an import holding pages: a cancelled kAwaitingKv request
  // waits in AdvanceHandoffs until nothing writes into its pages.
  if (s.req.kv_import || s.req.kv_export) {
    const Status why = error.ok() ? Aborted("aborted: the request ended on this server") : error;
    if (s.req.kv_import) s.req.kv_import->Abort(why);
    if (s.req.kv_export) s.req.kv_export->Abort(why);
    s.req.kv_import.reset();
    s.req.kv_export.reset();
  }
  if (s.state == RequestState::kLoadingPrefix) {
    // The copy writes into this request's pages: they are freed only after it.
    hicache_->WaitLoadBack(s.load_ticket);
    (void)hicache_->TakeLoadBack(s.load_ticket);
    s.state = RequestState::kFinished;
    ReleaseKv(s, /*cache_prefix=*/false);
  } else {
    s.state = RequestState::kFinished;
    ReleaseKv(s, /*cache_prefix=*/error.ok());
  }
  if (s.prefetch_id) {
    hicache_->ForgetPrefetch(s.prefetch_id);
    s.prefetch_id = 0;
  }
  if (was_waiting) waiting_tokens_ -= static_cast<int64_t>(s.tokens.size());
  if (reason == FinishReason::kAbort || !error.ok())
    stats_.aborted_requests++;
  else
    stats_.finished_requests++;
  s.handle->Finish(reason, std::move(error));
}

void Scheduler::Reap() {
  std::erase_if(running_, [](const std::unique_ptr<Sequence>& s) { return s->finished(); });
  std::erase_if(waiting_, [](const std::unique_ptr<Sequence>& s) { return s->finished(); });
}

void Scheduler::FinishAll(FinishReason reason, const Status& error) {
  for (auto& s : running_) Finish(*s, reason, error);
  for (auto& s : waiting_) Finish(*s, reason, error);
  Reap();
}

// Makes s's table hold total_tokens tokens. Frees memory by evicting cached
// prefixes, then (if may_preempt) by preempting the newest other running
// sequences. False if the pages cannot be had.
bool Scheduler::ReservePages(Sequence& s, int64_t total_tokens, bool may_preempt) {
  PageAllocator& alloc = pool_.allocator();
  for (;;) {
    const int64_t need = s.table.PagesNeeded(total_tokens);
    // Window slots: the step's tokens from s.computed read back one window.
    const int64_t slots = backing_ ? UnbackedWindowPages(s, s.computed) + need : 0;
    const bool pages_ok = alloc.CanAllocate(need);
    if (pages_ok && (!backing_ || ReclaimWindowSlots(slots, s))) {
      if (!s.table.Reserve(total_tokens, alloc).ok()) return false;
      BackWindow(s, s.computed);
      return true;
    }
    // Short of pages: evict cached prefixes. Short of slots only: the
    // reclaim already took every slot no running window needs, so evicting
    // would free none; only preempting a running sequence can.
    if (!pages_ok || !backing_) {
      const int64_t short_by = need - alloc.num_free();
      if (hicache_) hicache_->PrepareEvict(short_by);  // write_back: host copies first
      if (radix_ && radix_->Evict(short_by) > 0) continue;
    }
    if (!may_preempt) return false;
    Sequence* victim = nullptr;
    for (auto it = running_.rbegin(); it != running_.rend(); ++it)
      if (it->get() != &s && (*it)->computed > 0 &&
          ((*it)->state == RequestState::kPrefilling || (*it)->state == RequestState::kDecoding)) {
        victim = it->get();
        break;
      }
    if (!victim) return false;
    Preempt(*victim);
  }
}

// Back to the front of the queue; its KV (cached in the prefix tree when
// possible) is recomputed when it is admitted again.
void Scheduler::Preempt(Sequence& s) {
  ReleaseKv(s, /*cache_prefix=*/true);
  stats_.preemptions++;
  new_token_ratio_ = options_.init_new_token_ratio;  // the estimate was short
  auto it = std::find_if(running_.begin(), running_.end(),
                         [&](const std::unique_ptr<Sequence>& p) { return p.get() == &s; });
  std::unique_ptr<Sequence> owned = std::move(*it);
  running_.erase(it);
  waiting_tokens_ += static_cast<int64_t>(owned->tokens.size());
  owned->state = RequestState::kWaiting;
  waiting_.push_front(std::move(owned));
}

// Matches the prefix cache (leaving at least one token to compute, for
// logits) and adopts the cached pages.
// With HiCache, a host-resident continuation of the match is noted for
// StartLoad (the lock on its end node pins its host pages).
void Scheduler::Admit(Sequence& s) {
  if (!radix_ || s.prefix_locked || s.NeedsPromptLogits()) return;
  auto m = radix_->MatchPrefix(std::span<const int32_t>(s.tokens.data(), s.tokens.size() - 1));
  if (backing_) {  // never adopt a prefix whose last window is gone
    m.pages.resize(UsableMatch(m.pages));
    m.num_tokens = static_cast<int64_t>(m.pages.size()) * options_.page_size;
  }
  if (m.num_tokens + m.host_tokens == 0) return;
  radix_->Lock(m.host_handle);  // the host match ends below (or at) the device match
  s.prefix = m.host_handle;
  s.prefix_locked = true;
  s.table.AdoptSharedPrefix(m.pages, pool_.allocator());
  s.computed = m.num_tokens;
  s.cached_len = m.num_tokens;
  if (backing_) s.window_dropped = FirstPageInWindow(s.computed, window_, options_.page_size);
  if (hicache_ && m.num_tokens > 0) hicache_->OnMatched(m.handle);
  if (m.host_tokens == 0) s.storage_tokens = 0;
  if (m.host_tokens > 0) {
    s.storage_tokens = std::min(s.storage_tokens, m.host_tokens);
    if (s.storage_tokens > 0) hicache_->CountPrefetchedMatch(s.storage_tokens);
    s.load_end = m.num_tokens + m.host_tokens;
    s.load_host_pages = std::move(m.host_pages);
  }
}

bool Scheduler::StartLoad(Sequence& s) {
  if (!ReservePages(s, s.load_end, /*may_preempt=*/false)) return false;
  const auto& pages = s.table.pages();
  const size_t first = static_cast<size_t>(s.computed / options_.page_size);
  const size_t n = s.load_host_pages.size();
  s.load_ticket = hicache_->StartLoadBack(
      s.load_host_pages, std::span<const int32_t>(pages.data() + first, n), s.storage_tokens);
  s.state = RequestState::kLoadingPrefix;
  return true;
}

void Scheduler::AdvanceLoads() {
  for (auto& sp : running_) {
    Sequence& s = *sp;
    if (s.state != RequestState::kLoadingPrefix) continue;
    std::optional<Status> done = hicache_->TakeLoadBack(s.load_ticket);
    if (!done) continue;
    s.load_ticket = 0;
    s.load_host_pages.clear();
    s.state = RequestState::kPrefilling;
    if (done->ok()) {
      // The copied pages join the tree (Insert attaches them to the
      // host-only nodes), and the request computes from there.
      s.computed = s.load_end;
      s.table.SetNumTokens(s.computed);
      CachePrefix(s, s.load_end);
      s.load_end = 0;
    } else {
      STRATA_LOG(WARN) << "HiCache load-back for request " << s.req.id << " failed ("
                       << done->ToString() << "); recomputing its prefix";
      ReleaseKv(s, /*cache_prefix=*/false);  // prefill starts over from token 0
    }
    if (!s.reported_start) {
      s.reported_start = true;
      s.handle->SetStarted(s.prompt_len, s.computed);
    }
  }
}

bool Scheduler::AwaitPrefetch(Sequence& s, std::chrono::steady_clock::time_point now) {
  if (!hicache_ || !hicache_->has_storage()) return false;
  if (!s.prefetch_checked) {
    s.prefetch_checked = true;
    const std::span<const int32_t> usable(s.tokens.data(), s.tokens.size() - 1);
    const RadixTree::PrefixLengths known_len = radix_->PeekPrefixLengths(usable);
    const int64_t known = known_len.device_tokens + known_len.host_tokens;
    s.prefetch_id = hicache_->StartPrefetch(usable, known);
    if (!s.prefetch_id) return false;
    switch (hicache_->options().prefetch_policy) {
      case PrefetchPolicy::kBestEffort:
        s.prefetch_deadline = now;  // use what has arrived when it is admitted
        break;
      case PrefetchPolicy::kWaitComplete:
        s.prefetch_deadline = std::chrono::steady_clock::time_point::max();
        break;
      case PrefetchPolicy::kTimeout:
        s.prefetch_deadline =
            now + std::chrono::milliseconds(hicache_->options().prefetch_timeout_ms);
        break;
    }
  }
  if (!s.prefetch_id) return false;
  if (!hicache_->PrefetchDone(s.prefetch_id) && now < s.prefetch_deadline) return true;
  s.storage_tokens = hicache_->PrefetchedTokens(s.prefetch_id);
  hicache_->ForgetPrefetch(s.prefetch_id);
  s.prefetch_id = 0;
  return false;
}

bool Scheduler::WaitingOnHiCache() const {
  if (!hicache_) return false;
  for (const auto& s : running_)
    if (s->state == RequestState::kLoadingPrefix) return true;
  for (const auto& s : waiting_)
    if (s->prefetch_id) return true;
  return false;
}

bool Scheduler::SharesPrefixInComputation(const Sequence& s, int64_t cached) const {
  const int64_t page = options_.page_size;
  const int64_t threshold = std::max<int64_t>(kMinSharedTokensToDefer, page);
  const int64_t usable =
      static_cast<int64_t>(s.tokens.size()) - 1;  // the last token is always computed
  for (const auto& r : running_) {
    if (r->state != RequestState::kPrefilling) continue;
    const int64_t n = std::min<int64_t>(usable, static_cast<int64_t>(r->tokens.size()));
    if (n - cached < threshold) continue;
    const auto diff =
        std::mismatch(s.tokens.begin() + cached, s.tokens.begin() + n, r->tokens.begin() + cached);
    const int64_t common = (diff.first - s.tokens.begin()) / page * page;
    if (common - cached >= threshold && r->cached_len < common) return true;
  }
  return false;
}

void Scheduler::Schedule(ScheduledBatch* batch) {
  batch->items.clear();
  batch->seqs.clear();
  const auto now = std::chrono::steady_clock::now();
  if (options_.new_token_ratio_decay_steps > 0)
    new_token_ratio_ = std::max(
        options_.min_new_token_ratio,
        new_token_ratio_ - (options_.init_new_token_ratio - options_.min_new_token_ratio) /
                               options_.new_token_ratio_decay_steps);
  for (auto& s : running_) {
    if (!s->handle->cancelled() && now <= s->req.deadline) continue;
    if (s->state == RequestState::kAwaitingKv) {
      // The prefill may be writing into its pages: they are freed when the
      // import says nothing writes any more (AdvanceHandoffs).
      if (!s->import_aborted) {
        s->import_aborted = true;
        s->req.kv_import->Abort(s->handle->cancelled()
                                    ? Aborted("aborted: the client went away")
                                    : Aborted("aborted: the request's deadline passed"));
      }
      continue;
    }
    Finish(*s, FinishReason::kAbort);
  }
  for (auto& s : waiting_) {
    if (s->handle->cancelled() || now > s->req.deadline) {
      Finish(*s, FinishReason::kAbort);
    } else if (now > s->req.queue_deadline) {
      Finish(*s, FinishReason::kError,
             Unavailable(
                 "the request waited longer than the queue time limit (--max-queue-time-ms) before "
                 "prefill started"));
    }
  }
  Reap();
  if (hicache_) {
    hicache_->Poll();
    AdvanceLoads();
  }
  AdvanceHandoffs(now);
  Reap();

  const int64_t cap = options_.max_batch_tokens;
  int64_t used = 0;
  int64_t logit_rows = options_.max_prompt_logit_rows;  // left for prompt logprobs
  // A prefill chunk of n tokens, cut to the prompt-logit rows left.
  auto chunk = [&](const Sequence& s, int64_t n) {
    return s.NeedsPromptLogits() ? std::min(n, logit_rows) : n;
  };
  auto add = [&](Sequence& s, int64_t n) {
    StepItem it;
    it.table = &s.table;
    it.tokens = s.tokens.data() + s.computed;
    it.num_tokens = static_cast<int32_t>(n);
    it.start_pos = static_cast<int32_t>(s.computed);
    it.want_logits = s.computed + n == static_cast<int64_t>(s.tokens.size());
    it.prompt_logits = s.NeedsPromptLogits() && s.computed < s.prompt_len;
    if (it.prompt_logits) logit_rows -= n;
    batch->items.push_back(it);
    batch->seqs.push_back(&s);
    used += n;
  };

  // 1. Decode: one token per decoding sequence, oldest first; may preempt
  //    newer sequences when pages run out. Preempted ones leave running_, so
  //    iterate over a snapshot.
  std::vector<Sequence*> snapshot;
  for (auto& s : running_) snapshot.push_back(s.get());
  for (Sequence* s : snapshot) {
    if (s->state != RequestState::kDecoding) continue;  // preempted ones are kWaiting now
    if (used + 1 > cap) break;
    if (!ReservePages(*s, s->computed + 1, /*may_preempt=*/true)) continue;
    add(*s, 1);
  }
  // A sequence added before an older one preempted it: drop its item (its
  // table is empty now).
  for (size_t i = 0; i < batch->items.size();) {
    if (batch->seqs[i]->state != RequestState::kDecoding) {
      used -= batch->items[i].num_tokens;
      batch->items.erase(batch->items.begin() + i);
      batch->seqs.erase(batch->seqs.begin() + i);
    } else {
      ++i;
    }
  }

  // PD decode: requests whose KV comes from a prefill take a running slot
  // and their pages now, but no compute budget.
  AdmitImports();

  // 2. Prefill: continue running prefills, then admit waiting requests in
  //    order, under the prompt-token budget. Never preempts.
  int64_t budget = std::min<int64_t>(options_.chunked_prefill_size, cap - used);
  for (auto& sp : running_) {
    Sequence& s = *sp;
    if (budget <= 0) break;
    if (s.state != RequestState::kPrefilling) continue;
    const int64_t n = chunk(s, std::min(s.remaining(), budget));
    if (n <= 0) continue;  // no prompt-logit rows left this step
    if (!ReservePages(s, s.computed + n, false)) break;
    add(s, n);
    budget -= n;
  }
  for (size_t i = 0; i < waiting_.size() && budget > 0 &&
                     static_cast<int32_t>(running_.size()) < options_.max_running_requests;) {
    Sequence& s = *waiting_[i];
    // PD: an import left waiting (no slot); an export whose decode has not
    // said where to write yet (the bootstrap wait) lets the others pass.
    if (s.finished() || s.req.kv_import || (s.req.kv_export && !s.req.kv_export->Ready())) {
      ++i;
      continue;
    }
    if (AwaitPrefetch(s, now)) {
      ++i;
      continue;
    }
    if (s.NeedsPromptLogits() && logit_rows <= 0) {
      ++i;
      continue;
    }
    if (options_.defer_shared_prefixes && !s.NeedsPromptLogits()) {
      const int64_t cached = radix_ ? radix_->PeekPrefixLength(std::span<const int32_t>(
                                          s.tokens.data(), s.tokens.size() - 1))
                                    : 0;
      if (SharesPrefixInComputation(s, cached)) {
        stats_.deferred_admissions++;
        ++i;
        continue;
      }
    }
    Admit(s);
    // Decode headroom (SchedulerOptions::init_new_token_ratio): with others
    // running, wait until the pool covers this one's answer too.
    if (new_token_ratio_ > 0 && !running_.empty() && FutureTokens(s) > DecodeHeadroom()) {
      stats_.headroom_waits++;
      ReleaseKv(s, false);
      break;
    }
    if (s.load_end > s.computed) {
      // HiCache: the prefix's host part is copied back first; the request
      // takes a running slot but no prefill budget until it is there.
      if (!StartLoad(s)) {
        ReleaseKv(s, false);
        break;
      }
      waiting_tokens_ -= static_cast<int64_t>(s.tokens.size());
      running_.push_back(std::move(waiting_[i]));
      waiting_.erase(waiting_.begin() + static_cast<std::ptrdiff_t>(i));
      continue;
    }
    const int64_t n = chunk(s, std::min(s.remaining(), budget));
    if (!ReservePages(s, s.computed + n, false)) {
      ReleaseKv(s, false);  // give the adopted prefix back; try next step
      break;
    }
    if (!s.reported_start) {  // first admission, not a re-admission after preemption
      s.reported_start = true;
      s.started_cached = s.computed;
      s.handle->SetStarted(s.prompt_len, s.computed);
    }
    waiting_tokens_ -= static_cast<int64_t>(s.tokens.size());
    s.state = RequestState::kPrefilling;
    running_.push_back(std::move(waiting_[i]));
    waiting_.erase(waiting_.begin() + static_cast<std::ptrdiff_t>(i));
    add(*running_.back(), n);
    budget -= n;
  }
}

void Scheduler::Computed(const ScheduledBatch& batch) {
  for (size_t i = 0; i < batch.items.size(); ++i) {
    Sequence& s = *batch.seqs[i];
    s.computed += batch.items[i].num_tokens;
    s.table.SetNumTokens(s.computed);
    DropOutOfWindow(s);
    if (s.state != RequestState::kPrefilling) continue;
    CachePrefix(s, s.computed);
    if (s.req.kv_export) ExportPages(s);
    if (s.computed == static_cast<int64_t>(s.tokens.size())) s.state = RequestState::kDecoding;
  }
}

bool Scheduler::WaitingOnHandoff() const {
  for (const auto& s : running_)
    if (s->state == RequestState::kAwaitingKv || s->state == RequestState::kTransferring)
      return true;
  for (const auto& s : waiting_)
    if (s->req.kv_export || s->req.kv_import) return true;
  return false;
}

void Scheduler::ExportPages(Sequence& s) {
  const int64_t whole = s.computed / options_.page_size;
  if (whole <= s.exported_pages) return;
  const auto& pages = s.table.pages();
  s.req.kv_export->PagesComputed(
      s.exported_pages, std::span<const int32_t>(pages.data() + s.exported_pages,
                                                 static_cast<size_t>(whole - s.exported_pages)));
  s.exported_pages = whole;
}

void Scheduler::StartTransfer(Sequence& s, const GeneratedToken& first, FinishReason finish) {
  STRATA_CHECK(s.req.kv_export && s.state == RequestState::kDecoding && s.computed == s.prompt_len)
      << "StartTransfer on request " << s.req.id << " in state " << RequestStateName(s.state);
  const int64_t total = (s.prompt_len + options_.page_size - 1) / options_.page_size;
  FirstToken ft;
  ft.token = first.id;
  ft.logprob = first.logprob;
  ft.top_logprobs = first.top;
  ft.prompt_tokens = s.prompt_len;
  ft.cached_tokens = s.started_cached;
  ft.finish = finish;
  const auto& pages = s.table.pages();
  s.req.kv_export->Complete(s.exported_pages,
                            std::span<const int32_t>(pages.data() + s.exported_pages,
                                                     static_cast<size_t>(total - s.exported_pages)),
                            ft);
  s.exported_pages = total;
  s.transfer_finish = finish;
  s.state = RequestState::kTransferring;
}

void Scheduler::AdvanceHandoffs(std::chrono::steady_clock::time_point now) {
  for (auto& sp : running_) {
    Sequence& s = *sp;
    if (s.state == RequestState::kTransferring) {
      Status err;
      const HandoffState st = s.req.kv_export->Poll(&err);
      if (st == HandoffState::kPending) continue;
      s.req.kv_export.reset();
      if (st == HandoffState::kDone)
        Finish(s, s.transfer_finish == FinishReason::kNone ? FinishReason::kLength
                                                           : s.transfer_finish);
      else
        Finish(s, FinishReason::kError, std::move(err));
      continue;
    }
    if (s.state != RequestState::kAwaitingKv) continue;
    FirstToken ft;
    Status err;
    const HandoffState st = s.req.kv_import->Poll(&ft, &err);
    if (st == HandoffState::kPending) continue;
    s.req.kv_import.reset();
    if (s.import_aborted) {  // cancelled meanwhile: nothing writes now; its KV is not used
      Finish(s, FinishReason::kAbort);
      continue;
    }
    if (st == HandoffState::kFailed) {
      Finish(s, FinishReason::kError, std::move(err));
      continue;
    }
    // The prompt's KV is in the pages: the request goes on as if it had
    // computed its prompt and sampled the first token here.
    s.computed = s.prompt_len;
    s.table.SetNumTokens(s.computed);
    CachePrefix(s, s.computed);
    s.tokens.push_back(ft.token);
    if (s.req.params.UsesPenalties()) s.history.AddOutputToken(ft.token);
    s.sampler.SkipSample();
    // The prefill sampled it under the same constraint (the same request).
    if (s.req.constraint) s.req.constraint->Advance(ft.token);
    if (!s.reported_start) {
      s.reported_start = true;
      s.handle->SetStarted(s.prompt_len, ft.cached_tokens);
    }
    s.handle->Push(GeneratedToken{ft.token, ft.logprob, std::move(ft.top_logprobs)});
    s.state = RequestState::kDecoding;
    if (ft.finish != FinishReason::kNone)
      Finish(s, ft.finish);
    else if (static_cast<int64_t>(s.tokens.size()) >= s.limit)
      Finish(s, FinishReason::kLength);
  }
  for (auto& sp : waiting_) {
    Sequence& s = *sp;
    if (!s.req.kv_export || s.finished()) continue;
    Status err;
    if (s.req.kv_export->Poll(&err) != HandoffState::kFailed) continue;
    s.req.kv_export.reset();
    Finish(s, FinishReason::kError, std::move(err));
  }
  (void)now;
}

void Scheduler::AdmitImports() {
  PageAllocator& alloc = pool_.allocator();
  for (size_t i = 0; i < waiting_.size();) {
    Sequence& s = *waiting_[i];
    if (!s.req.kv_import || s.finished()) {
      ++i;
      continue;
    }
    if (static_cast<int32_t>(running_.size()) >= options_.max_running_requests) break;
    // The decode's own cache: only device-resident pages count (a host
    // copy-back would race the prefill's writes for nothing).
    if (radix_) {
      auto m = radix_->MatchPrefix(std::span<const int32_t>(s.tokens.data(), s.tokens.size() - 1));
      if (m.num_tokens > 0) {
        radix_->Lock(m.handle);
        s.prefix = m.handle;
        s.prefix_locked = true;
        s.table.AdoptSharedPrefix(m.pages, alloc);
        s.computed = m.num_tokens;
        s.cached_len = m.num_tokens;
        if (hicache_) hicache_->OnMatched(m.handle);
      }
    }
    if (!ReservePages(s, s.prompt_len, /*may_preempt=*/false)) {
      const int64_t need = s.table.PagesNeeded(s.prompt_len);
      ReleaseKv(s, false);
      Finish(s, FinishReason::kError,
             Unavailable("kv_full: the decode server has no free KV pages for this request's " +
                         std::to_string(s.prompt_len) + " prompt tokens (" + std::to_string(need) +
                         " pages needed, " + std::to_string(alloc.num_free()) +
                         " free); retry later"));
      ++i;
      continue;
    }
    waiting_tokens_ -= static_cast<int64_t>(s.tokens.size());
    s.state = RequestState::kAwaitingKv;
    const int64_t first_page = s.computed / options_.page_size;
    const auto& pages = s.table.pages();
    s.req.kv_import->Reserved(
        first_page,
        std::span<const int32_t>(pages.data() + first_page,
                                 pages.size() - static_cast<size_t>(first_page)),
        s.prompt_len);
    running_.push_back(std::move(waiting_[i]));
    waiting_.erase(waiting_.begin() + static_cast<std::ptrdiff_t>(i));
  }
}

Status Scheduler::CheckIntegrity() const {
  for (const auto& s : running_) {
    if (s->state == RequestState::kLoadingPrefix) {
      if (!hicache_ || !s->prefix_locked || s->load_end <= s->computed ||
          s->table.capacity() < s->load_end ||
          static_cast<int64_t>(s->load_host_pages.size()) * options_.page_size !=
              s->load_end - s->computed)
        return Internal(
            "request " + s->req.id +
            " is loading a prefix without a locked host match and reserved pages for it");
      continue;
    }
    if (s->state != RequestState::kPrefilling && s->state != RequestState::kDecoding &&
        s->state != RequestState::kAwaitingKv && s->state != RequestState::kTransferring)
      return Internal("running request " + s->req.id + " is in state " +
                      RequestStateName(s->state));
    if (s->state == RequestState::kAwaitingKv &&
        (!s->req.kv_import || s->table.capacity() < s->prompt_len))
      return Internal("request " + s->req.id +
                      " awaits KV without an import and pages for its prompt");
    if (s->state == RequestState::kTransferring &&
        (!s->req.kv_export || s->computed != s->prompt_len || s->table.capacity() < s->prompt_len))
      return Internal("request " + s->req.id +
                      " transfers KV without an export and its prompt's pages");
    if (s->table.capacity() < s->computed)
      return Internal("request " + s->req.id + ": page table smaller than its computed tokens");
    for (int32_t p : s->table.pages())
      if (pool_.allocator().refcount(p) < 1)
        return Internal("request " + s->req.id + " holds free page " + std::to_string(p));
    if (backing_ && (s->state == RequestState::kPrefilling || s->state == RequestState::kDecoding)) {
      const std::vector<int32_t>& pages = s->table.pages();
      const int64_t end = (s->computed + options_.page_size - 1) / options_.page_size;
      for (int64_t i = FirstPageInWindow(s->computed, window_, options_.page_size); i < end; ++i)
        if (!backing_->backed(pages[static_cast<size_t>(i)]))
          return Internal("request " + s->req.id + ": page " + std::to_string(pages[i]) +
                          " (index " + std::to_string(i) +
                          ") is inside its window but has no window backing");
    }
    if (s->cached_len > s->computed || s->cached_len % options_.page_size != 0)
      return Internal("request " + s->req.id + ": cached prefix of " +
                      std::to_string(s->cached_len) + " tokens does not fit its " +
                      std::to_string(s->computed) + " computed tokens");
    if (s->prefix_locked != (s->cached_len > 0))
      return Internal("request " + s->req.id + ": prefix lock and cached prefix disagree");
  }
  int64_t tokens = 0;
  for (const auto& s : waiting_) {
    if (s->state != RequestState::kWaiting)
      return Internal("queued request " + s->req.id + " is in state " + RequestStateName(s->state));
    if (!s->table.pages().empty() || s->prefix_locked)
      return Internal("waiting request " + s->req.id + " holds pages");
    tokens += static_cast<int64_t>(s->tokens.size());
  }
  if (tokens != waiting_tokens_)
    return Internal("waiting token count " + std::to_string(waiting_tokens_) + " != the queue's " +
                    std::to_string(tokens));
  if (backing_) return backing_->CheckIntegrity();
  return OkStatus();
}

}  // namespace strata
