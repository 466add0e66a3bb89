// Scheduler: which requests compute in the next step and how many tokens
// each; the waiting queue, admission into the running set, page
// reservation, prefix-cache matching and insertion, and preemption.
// CPU-only bookkeeping (token ids, page ids, refcounts): no tensors, no
// backend calls; the engine runs the batch and samples.
//
// Every request is a Sequence with one explicit state:
//
//   kWaiting ──admit──▶ kPrefilling ──last prompt token computed──▶ kDecoding
//      ▲                    │  │                                    │
//      └──────preempt───────┘  └──────────────▶ kFinished ◀─────────┘
//                                  (stop, length, abort, error; from any state)
//
//   kWaiting ──admit, prefix on the host──▶ kLoadingPrefix ──copied──▶ kPrefilling
//
//   kLoadingPrefix (HiCache): the request holds device pages for the
//   host-resident part of its prefix while the cache controller copies it
//   back; it is never preempted there, and a cancellation waits for the copy
//   before the pages are freed (the copy writes into them). With a storage
//   tier, a waiting request whose prompt continues in storage first waits
//   in the queue for that prefetch (--hicache-storage-prefetch-policy), then
//   is admitted with the prefetched pages as host hits.
//   PD disaggregation (engine/kv_handoff.h has the whole contract):
//   prefill: kWaiting (not admitted until the decode's pages are known) ──▶
//            kPrefilling ──first token──▶ kTransferring ──KV delivered──▶ kFinished
//   decode:  kWaiting ──pages reserved (or fail: kv_full)──▶ kAwaitingKv
//            ──KV and first token arrived──▶ kDecoding
//   Neither kAwaitingKv nor kTransferring is ever preempted: a remote
//   process writes into (or reads from) their pages.
//
// Window backing (KvPool::window_backing, cache/window_backing.h): the
// windowed groups' pages of a running sequence are backed from the first
// page its next token may attend to (FirstPageInWindow of `computed`, the
// layout's largest window) to the end of its table; pages it alone holds
// become tombstones as they leave that window (Computed). Pages shared with
// the tree or another sequence stay backed until slots run out; then
// ReservePages reclaims the slots of free page ids, then of pages no running
// sequence's window needs, then evicts and preempts as for pages. A prefix
// match is cut back to the longest page boundary whose window before it is
// backed (Admit), so a sequence never reads a tombstone.
//
// Prefix sharing: a prefilling sequence inserts its prompt's whole pages
// into the radix tree as each chunk completes (and locks them), not only
// when it finishes, so a request that arrives while a shared prefix is
// being computed adopts those pages. A waiting request whose prompt shares
// more than a page beyond the cache with a sequence that is computing it
// right now is deferred until that sequence's next chunk is in (in-batch
// prefix sharing: the n > 1 choices of one request and bursts with one
// system prompt compute the shared part once).
//
// Not thread-safe: the engine thread owns it.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "cache/hicache.h"
#include "cache/kv_pool.h"
#include "cache/page_table.h"
#include "cache/radix_tree.h"
#include "engine/model_runner.h"
#include "engine/request.h"
#include "engine/sampler.h"

namespace strata {

enum class RequestState {
  kWaiting,        // queued (also after preemption); holds no pages
  kLoadingPrefix,  // HiCache load-back of a host-resident prefix (not yet entered)
  kPrefilling,     // admitted; prompt chunks computing
  kDecoding,       // one token per step
  kAwaitingKv,     // PD decode: pages reserved, the prefill writes them
  kTransferring,   // PD prefill: first token sampled, KV writes draining
  kFinished,
};
const char* RequestStateName(RequestState state);

// One request's scheduling state. Owned by the Scheduler; the engine reads
// and extends `tokens` after sampling.
struct Sequence {
  Sequence(EngineRequest r, std::shared_ptr<RequestHandle> h, int page_size);

  EngineRequest req;
  std::shared_ptr<RequestHandle> handle;
  RequestState state = RequestState::kWaiting;
  std::vector<int32_t> tokens;  // prompt + output so far
  int64_t prompt_len = 0;
  int64_t computed = 0;  // leading tokens whose KV is in the pool
  int64_t limit = 0;     // total tokens at which the sequence stops (length)
  PageTable table;
  Sampler sampler;
  TokenHistory history;
  // The radix node covering the prefix this sequence uses from the tree
  // (matched at admission, then extended as its chunks are inserted);
  // locked while prefix_locked.
  RadixNodeHandle prefix;
  bool prefix_locked = false;
  int64_t cached_len = 0;  // tokens of `tokens` the tree holds for this sequence
  bool reported_start = false;
  // HiCache (kLoadingPrefix): the host pages being copied into the table's
  // pages [computed, load_end) and the copy's ticket.
  int64_t load_end = 0;
  std::vector<int32_t> load_host_pages;
  uint64_t load_ticket = 0;
  // Storage prefetch while waiting: id (0: none), when to stop waiting for
  // it, whether the lookup was done, and the storage tokens it brought.
  uint64_t prefetch_id = 0;
  std::chrono::steady_clock::time_point prefetch_deadline{};
  bool prefetch_checked = false;
  int64_t storage_tokens = 0;
  // PD: prompt pages handed to req.kv_export so far; cached tokens at
  // admission (the usage number the prefill reports); the first token's
  // finish decision while kTransferring; an abort sent to req.kv_import.
  int64_t exported_pages = 0;
  int64_t started_cached = 0;
  FinishReason transfer_finish = FinishReason::kNone;
  bool import_aborted = false;
  // prompt_logprobs: the next prompt position whose token's logprob has not
  // been sent (from 1; position 0 has none). Kept across preemption, so a
  // recomputed prompt sends nothing twice.
  int64_t prompt_logprobs_next = 1;
  // Window backing (KvPool::window_backing): pages of `table` before this
  // index have been looked at for tombstoning (the ones only this sequence
  // held were released as they left its window).
  int64_t window_dropped = 0;

  // Tokens still to compute before the next sample.
  int64_t remaining() const { return static_cast<int64_t>(tokens.size()) - computed; }
  bool finished() const { return state == RequestState::kFinished; }
  // Prompt logprobs still to compute: the prompt is computed (not matched
  // in the prefix cache: cached KV has no logits) with every row's logits.
  bool NeedsPromptLogits() const {
    return req.prompt_logprobs >= 0 && prompt_logprobs_next < prompt_len;
  }
};

struct SchedulerOptions {
  int32_t page_size = 16;
  int32_t max_running_requests = 64;
  int32_t chunked_prefill_size = 512;  // prompt tokens per step
  int32_t max_batch_tokens = 576;      // every token of one step (runner's capacity)
  bool defer_shared_prefixes = true;   // in-batch prefix sharing (see above)
  // Prompt tokens per step that get logits for prompt logprobs (each row is
  // vocab_size floats on the host): bounds that buffer; such prompts are
  // chunked to fit.
  int32_t max_prompt_logit_rows = 256;
  // Decode headroom at admission (SGLang's new_token_ratio): with others
  // running, a waiting request is admitted only while the free and
  // evictable pages cover, for it and for every running sequence, the
  // prompt tokens not yet reserved plus ratio x the tokens left to
  // generate (each clipped at clip_new_tokens_estimate). The ratio starts at
  // init_new_token_ratio, falls linearly to min_new_token_ratio over
  // new_token_ratio_decay_steps steps, and is set back to init at each
  // preemption: a burst of long answers fills the pool with prompts it
  // cannot decode (each preemption throws away a prompt's KV to recompute
  // it) only as far as the ratio allows. 0 and 0: admission on the prompt's
  // pages alone, as before.
  double init_new_token_ratio = 0.7;
  double min_new_token_ratio = 0.1;
  int32_t new_token_ratio_decay_steps = 600;
  int64_t clip_new_tokens_estimate = 4096;
};

// One step's work: items[i] is seqs[i]'s part of the batch.
struct ScheduledBatch {
  std::vector<StepItem> items;
  std::vector<Sequence*> seqs;
  bool empty() const { return items.empty(); }
};

// Counters the engine folds into EngineStats.
struct SchedulerStats {
  int64_t preemptions = 0;
  int64_t finished_requests = 0;
  int64_t aborted_requests = 0;
  int64_t deferred_admissions = 0;  // waits for a shared prefix in computation
  int64_t headroom_waits = 0;       // steps whose admission waited for decode headroom
};

class Scheduler {
 public:
  // `radix` may be null (prefix caching off); `hicache` may be null (no host
  // tier; REQUIRES radix when set). All must outlive the scheduler.
  Scheduler(const SchedulerOptions& options, KvPool& pool, RadixTree* radix,
            HiCache* hicache = nullptr);
  // Gives back every page still held.
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queues a new request at the back of the waiting queue.
  void Add(std::unique_ptr<Sequence> seq);
  bool HasWork() const { return !waiting_.empty() || !running_.empty(); }
  // True when a request waits for a HiCache load-back or prefetch: an empty
  // batch is then a wait for the copy, not a stall.
  bool WaitingOnHiCache() const;
  // True when a request waits on a PD handoff (the decode's pages, the
  // prefill's KV, writes draining): an empty batch is then a wait too.
  bool WaitingOnHandoff() const;
  // PD prefill: the first token of `seq` (kDecoding, req.kv_export set) was
  // just sampled and appended to seq.tokens; hands the rest of its prompt
  // to the export and moves it to kTransferring (finish: what the token
  // decided, kNone when the request would go on).
  void StartTransfer(Sequence& seq, const GeneratedToken& first, FinishReason finish);

  // Finishes cancelled and expired requests, then picks the next batch:
  // one decode token per decoding sequence (oldest first; preempting the
  // newest when pages run out), then prompt chunks of running prefills and
  // newly admitted requests under the chunked-prefill budget (never
  // preempting). Pages for every item are reserved on return.
  void Schedule(ScheduledBatch* batch);
  // The batch ran: each item's tokens now hold KV. Moves prefills whose
  // prompt is complete to kDecoding and caches the whole prompt pages of
  // each prefill chunk in the radix tree.
  void Computed(const ScheduledBatch& batch);

  // Ends `seq` (any state): pages released (its computed prefix cached when
  // `error` is OK and reason is not kAbort), handle finished. Idempotent.
  void Finish(Sequence& seq, FinishReason reason, Status error = OkStatus());
  // Finishes every queued and running request.
  void FinishAll(FinishReason reason, const Status& error);
  // Drops finished sequences from the queues.
  void Reap();

  int64_t num_running() const { return static_cast<int64_t>(running_.size()); }
  int64_t num_waiting() const { return static_cast<int64_t>(waiting_.size()); }
  int64_t waiting_tokens() const { return waiting_tokens_; }
  double new_token_ratio() const { return new_token_ratio_; }
  const SchedulerStats& stats() const { return stats_; }
  // Every running and waiting sequence holds what its state says: pages
  // in use covering its computed tokens; waiting ones none but a locked
  // prefix; the state matches the counters.
  Status CheckIntegrity() const;

 private:
  bool ReservePages(Sequence& s, int64_t total_tokens, bool may_preempt);
  // Tokens s may still add beyond the pages its table holds, at the
  // current new_token_ratio (SchedulerOptions::init_new_token_ratio).
  int64_t FutureTokens(const Sequence& s) const;
  // Free and evictable tokens less every running sequence's FutureTokens.
  int64_t DecodeHeadroom() const;
  void Admit(Sequence& s);
  void Preempt(Sequence& s);
  void ReleaseKv(Sequence& s, bool cache_prefix);
  // Inserts s.tokens[0, full pages of `upto`) into the tree and moves s's
  // lock to the inserted node.
  void CachePrefix(Sequence& s, int64_t upto);
  // True when a running prefill is computing more than a page of s's prompt
  // beyond what the cache already holds for it.
  bool SharesPrefixInComputation(const Sequence& s, int64_t cached) const;
  // HiCache: moves finished load-backs to kPrefilling.
  void AdvanceLoads();
  // HiCache: starts the storage prefetch of a waiting request; true while
  // the request should keep waiting for it.
  bool AwaitPrefetch(Sequence& s, std::chrono::steady_clock::time_point now);
  // HiCache: after Admit, starts copying the host part of the prefix into
  // reserved device pages. False if the pages cannot be had now.
  bool StartLoad(Sequence& s);
  // PD: polls exports and imports, applies arrivals and failures.
  void AdvanceHandoffs(std::chrono::steady_clock::time_point now);
  // PD decode: admits waiting imports (prefix match, whole-prompt
  // reservation, Reserved()) while running slots last.
  void AdmitImports();
  // PD prefill: hands newly whole prompt pages to the export.
  void ExportPages(Sequence& s);
  // Window backing (null backing_: all no-ops / 0). Pages of s's table
  // from the window of position from_pos on that lack a slot.
  int64_t UnbackedWindowPages(const Sequence& s, int64_t from_pos) const;
  // Frees slots until n are free (see the class comment), never of a page
  // in the window of `for_seq` (which may not be running yet: its adopted
  // prefix) or of a running sequence; true if they are.
  bool ReclaimWindowSlots(int64_t n, const Sequence& for_seq);
  // Backs s's pages from the window of from_pos on. REQUIRES: enough free
  // slots (UnbackedWindowPages).
  void BackWindow(Sequence& s, int64_t from_pos);
  // Tombstones the pages s alone holds that left its window.
  void DropOutOfWindow(Sequence& s);
  // Swaps the tree's tombstoned pages of s.tokens[0, upto) for s's backed
  // ones (RadixTree::ReplaceDevicePages), so a prefix recomputed after its
  // window was reclaimed is matchable again.
  void ReplaceTombstones(Sequence& s, int64_t upto);
  // The longest prefix of `pages` (a match) whose window before its end is
  // backed: the pages a sequence may adopt.
  size_t UsableMatch(std::span<const int32_t> pages) const;

  SchedulerOptions options_;
  KvPool& pool_;
  RadixTree* radix_;
  HiCache* hicache_;
  WindowBacking* backing_;  // pool_.window_backing(), null: none
  int64_t window_ = 0;      // the layout's largest sliding window, with a backing
  std::deque<std::unique_ptr<Sequence>> waiting_;
  std::vector<std::unique_ptr<Sequence>> running_;  // admission order
  int64_t waiting_tokens_ = 0;
  double new_token_ratio_ = 0;
  SchedulerStats stats_;
};

}  // namespace strata
