#include "engine/engine.h"

#include <algorithm>
#include <chrono>

#include "cache/kv_layout.h"
#include "util/logging.h"

namespace strata {

struct Engine::Sequence {
  EngineRequest req;
  std::shared_ptr<RequestHandle> handle;
  std::vector<int32_t> tokens;  // prompt + output
  int64_t prompt_len = 0;
  int64_t computed = 0;  // leading tokens whose KV is in the pool
  int64_t limit = 0;     // total tokens at which the sequence stops ("length")
  PageTable table;
  Sampler sampler;
  TokenHistory history;
  RadixNodeHandle prefix;  // locked prefix-cache node while prefix_locked
  bool prefix_locked = false;
  bool started = false;
  bool finished = false;
  Sequence(EngineRequest r, std::shared_ptr<RequestHandle> h, int page_size)
      : req(std::move(r)), handle(std::move(h)), table(page_size), sampler(req.params, std::nullopt) {}
  // Tokens still to compute before the next sample.
  int64_t remaining() const { return static_cast<int64_t>(tokens.size()) - computed; }
  bool decoding() const { return remaining() == 1 && computed >= prompt_len; }
};

Engine::Engine(LoadedModel& model, Backend& backend, const EngineOptions& options)
    : model_(model), backend_(backend), options_(options) {}

Engine::~Engine() {
  // Pages go back before the pool and tree disappear.
  for (auto& s : running_) ReleaseKv(*s, false);
  for (auto& s : waiting_) ReleaseKv(*s, false);
}

StatusOr<std::unique_ptr<Engine>> Engine::Create(LoadedModel& model, Backend& backend,
                                                 const EngineOptions& options) {
  if (options.page_size < 1) return InvalidArgument("page size must be >= 1");
  if (options.max_running_requests < 1) return InvalidArgument("max running requests must be >= 1");
  if (options.chunked_prefill_size < 1) return InvalidArgument("chunked prefill size must be >= 1");
  std::unique_ptr<Engine> e(new Engine(model, backend, options));
  const KvRequirements req = model.model->kv_requirements();
  KvLayout layout;
  layout.page_size = options.page_size;
  layout.groups.push_back({"full_attention", req.num_layers, req.num_kv_heads, req.head_dim,
                           options.kv_dtype, true});
  RETURN_IF_ERROR(layout.Validate());
  e->context_length_ = options.context_length > 0 ? options.context_length
                                                  : model.config.max_position_embeddings;
  if (e->context_length_ <= 0) e->context_length_ = 4096;
  int64_t pages = 0;
  if (options.max_total_tokens > 0) {
    ASSIGN_OR_RETURN(pages, NumKvPagesForTokens(layout, options.max_total_tokens));
  } else {
    const int64_t want = e->context_length_ * options.max_running_requests;
    ASSIGN_OR_RETURN(int64_t by_tokens, NumKvPagesForTokens(layout, want + options.page_size));
    ASSIGN_OR_RETURN(int64_t by_bytes, NumKvPagesForBytes(layout, uint64_t{1} << 30));
    pages = std::min(by_tokens, by_bytes);
  }
  ASSIGN_OR_RETURN(e->pool_, KvPool::Create(layout, pages, backend));
  if (!options.disable_radix_cache)
    e->radix_ = std::make_unique<RadixTree>(RadixTreeConfig{options.page_size}, &e->pool_->allocator());
  e->runner_ = std::make_unique<ModelRunner>(*model.model, backend, *e->pool_,
                                             model.model->max_batch_tokens());
  return e;
}

Status Engine::Validate(const EngineRequest& r) const {
  RETURN_IF_ERROR(r.params.Validate());
  const int64_t plen = static_cast<int64_t>(r.prompt.size());
  if (plen == 0) return InvalidArgument("the prompt is empty");
  for (int32_t t : r.prompt)
    if (t < 0 || t >= model_.config.vocab_size)
      return InvalidArgument("token id " + std::to_string(t) + " is outside the vocabulary [0, " +
                             std::to_string(model_.config.vocab_size) + ")");
  if (plen >= context_length_)
    return InvalidArgument("the prompt has " + std::to_string(plen) +
                           " tokens; this model's context length is " + std::to_string(context_length_) +
                           " (the prompt plus at least one generated token must fit)");
  const int64_t pool_tokens = pool_->num_pages() * options_.page_size;
  if (plen + 1 > pool_tokens)
    return InvalidArgument("the prompt has " + std::to_string(plen) + " tokens; the KV cache holds " +
                           std::to_string(pool_tokens) + " (raise --max-total-tokens)");
  return OkStatus();
}

void Engine::Add(EngineRequest request, std::shared_ptr<RequestHandle> handle) {
  auto s = std::make_unique<Sequence>(std::move(request), std::move(handle), options_.page_size);
  s->tokens = s->req.prompt;
  s->prompt_len = static_cast<int64_t>(s->tokens.size());
  const int64_t pool_tokens = pool_->num_pages() * options_.page_size;
  s->limit = std::min({context_length_, pool_tokens, s->prompt_len + std::max(0, s->req.params.max_tokens)});
  if (s->req.params.UsesPenalties()) s->history.AddPromptTokens(s->req.prompt);
  waiting_tokens_ += s->prompt_len;
  waiting_.push_back(std::move(s));
}

EngineLoad Engine::load() const {
  EngineLoad l;
  l.running = static_cast<int64_t>(running_.size());
  l.waiting = static_cast<int64_t>(waiting_.size());
  l.waiting_tokens = waiting_tokens_;
  l.pages_total = pool_->num_pages();
  // The tree holds one reference per stored page; requests hold the pages
  // they adopted from it through locked nodes, and insert their own only
  // when they finish. So the pages held by the cache alone are the stored
  // pages outside locked nodes.
  int64_t cached_only = 0;
  if (radix_) {
    const RadixTreeStats st = radix_->stats();
    cached_only = st.cached_pages - st.locked_pages;
  }
  l.pages_cached = cached_only;
  l.pages_active = pool_->allocator().num_used() - cached_only;
  return l;
}

void Engine::ReleaseKv(Sequence& s, bool cache_prefix) {
  if (radix_ && cache_prefix && s.computed >= options_.page_size) {
    const int64_t full = s.computed / options_.page_size * options_.page_size;
    radix_->Insert(std::span<const int32_t>(s.tokens.data(), full), s.table.pages());
  }
  if (s.prefix_locked) {
    radix_->Unlock(s.prefix);
    s.prefix_locked = false;
  }
  s.table.Release(pool_->allocator());
  s.computed = 0;
}

void Engine::Finish(Sequence& s, const std::string& reason, Status error) {
  if (s.finished) return;
  s.finished = true;
  ReleaseKv(s, /*cache_prefix=*/error.ok());
  if (!s.started) waiting_tokens_ -= static_cast<int64_t>(s.tokens.size());
  if (reason == "abort" || !error.ok()) stats_.aborted_requests++;
  else stats_.finished_requests++;
  s.handle->Finish(reason, std::move(error));
}

void Engine::ReapFinished() {
  std::erase_if(running_, [](const std::unique_ptr<Sequence>& s) { return s->finished; });
  std::erase_if(waiting_, [](const std::unique_ptr<Sequence>& s) { return s->finished; });
}

void Engine::AbortAll(const std::string& reason, const Status& error) {
  for (auto& s : running_) Finish(*s, reason, error);
  for (auto& s : waiting_) Finish(*s, reason, error);
  ReapFinished();
}

// Makes s's table hold total_tokens tokens. Frees memory by evicting cached
// prefixes, then (if may_preempt) by preempting the newest other running
// sequences. False if the pages cannot be had.
bool Engine::ReservePages(Sequence& s, int64_t total_tokens, bool may_preempt) {
  PageAllocator& alloc = pool_->allocator();
  for (;;) {
    const int64_t need = s.table.PagesNeeded(total_tokens);
    if (alloc.CanAllocate(need)) return s.table.Reserve(total_tokens, alloc).ok();
    const int64_t short_by = need - alloc.num_free();
    if (radix_ && radix_->Evict(short_by) > 0) continue;
    if (!may_preempt) return false;
    Sequence* victim = nullptr;
    for (auto it = running_.rbegin(); it != running_.rend(); ++it)
      if (it->get() != &s && !(*it)->finished && (*it)->computed > 0) {
        victim = it->get();
        break;
      }
    if (!victim) return false;
    Preempt(*victim);
  }
}

// Back to the front of the queue; its KV (cached in the prefix tree when
// possible) is recomputed when it is admitted again.
void Engine::Preempt(Sequence& s) {
  ReleaseKv(s, /*cache_prefix=*/true);
  stats_.preemptions++;
  auto it = std::find_if(running_.begin(), running_.end(),
                         [&](const std::unique_ptr<Sequence>& p) { return p.get() == &s; });
  std::unique_ptr<Sequence> owned = std::move(*it);
  running_.erase(it);
  waiting_tokens_ += static_cast<int64_t>(owned->tokens.size());
  owned->started = false;  // counts as waiting again
  waiting_.push_front(std::move(owned));
}

// Matches the prefix cache (leaving at least one token to compute, for
// logits) and adopts the cached pages.
void Engine::Admit(Sequence& s) {
  if (!radix_ || s.prefix_locked) return;
  auto m = radix_->MatchPrefix(std::span<const int32_t>(s.tokens.data(), s.tokens.size() - 1));
  if (m.num_tokens == 0) return;
  radix_->Lock(m.handle);
  s.prefix = m.handle;
  s.prefix_locked = true;
  s.table.AdoptSharedPrefix(m.pages, pool_->allocator());
  s.computed = m.num_tokens;
}

void Engine::Schedule(std::vector<StepItem>* items, std::vector<Sequence*>* item_seqs) {
  items->clear();
  item_seqs->clear();
  const auto now = std::chrono::steady_clock::now();
  for (auto& s : running_)
    if (s->handle->cancelled() || now > s->req.deadline) Finish(*s, "abort");
  for (auto& s : waiting_) {
    if (s->handle->cancelled() || now > s->req.deadline) Finish(*s, "abort");
    else if (now > s->req.queue_deadline)
      Finish(*s, "error", Unavailable("the request waited longer than the queue time limit (--max-queue-time-ms) before prefill started"));
  }
  ReapFinished();

  const int64_t cap = runner_->max_batch_tokens();
  int64_t used = 0;
  auto add = [&](Sequence& s, int64_t n) {
    StepItem it;
    it.table = &s.table;
    it.tokens = s.tokens.data() + s.computed;
    it.num_tokens = static_cast<int32_t>(n);
    it.start_pos = static_cast<int32_t>(s.computed);
    it.want_logits = s.computed + n == static_cast<int64_t>(s.tokens.size());
    items->push_back(it);
    item_seqs->push_back(&s);
    used += n;
  };

  // 1. Decode: one token per running sequence, oldest first; may preempt
  //    newer sequences when pages run out. Preempted ones leave running_, so
  //    iterate over a snapshot.
  std::vector<Sequence*> snapshot;
  for (auto& s : running_) snapshot.push_back(s.get());
  for (Sequence* s : snapshot) {
    if (s->finished || !s->decoding()) continue;
    if (used + 1 > cap) break;
    if (std::find_if(running_.begin(), running_.end(),
                     [&](const std::unique_ptr<Sequence>& p) { return p.get() == s; }) == running_.end())
      continue;  // preempted by an older sequence this step
    if (!ReservePages(*s, s->computed + 1, /*may_preempt=*/true)) continue;
    add(*s, 1);
  }
  // A preempted sequence may have been added before it was preempted by an
  // older one: drop such items (their tables are empty now).
  for (size_t i = 0; i < items->size();) {
    if ((*item_seqs)[i]->table.capacity() < (*items)[i].start_pos + (*items)[i].num_tokens) {
      used -= (*items)[i].num_tokens;
      items->erase(items->begin() + i);
      item_seqs->erase(item_seqs->begin() + i);
    } else {
      ++i;
    }
  }

  // 2. Prefill: continue running sequences' chunks, then admit waiting
  //    ones, under the prompt-token budget. Never preempts.
  int64_t budget = std::min<int64_t>(options_.chunked_prefill_size, cap - used);
  for (auto& sp : running_) {
    Sequence& s = *sp;
    if (budget <= 0) break;
    if (s.finished || s.decoding()) continue;
    const int64_t n = std::min(s.remaining(), budget);
    if (!ReservePages(s, s.computed + n, false)) break;
    add(s, n);
    budget -= n;
  }
  while (budget > 0 && !waiting_.empty() &&
         static_cast<int32_t>(running_.size()) < options_.max_running_requests) {
    Sequence& s = *waiting_.front();
    Admit(s);
    const int64_t n = std::min(s.remaining(), budget);
    if (!ReservePages(s, s.computed + n, false)) {
      ReleaseKv(s, false);  // give the adopted prefix back; try next step
      break;
    }
    if (static_cast<int64_t>(s.tokens.size()) == s.prompt_len)  // first admission, not a preempted one
      s.handle->SetStarted(s.prompt_len, s.computed);
    waiting_tokens_ -= static_cast<int64_t>(s.tokens.size());
    s.started = true;
    running_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
    add(*running_.back(), n);
    budget -= n;
  }
}

void Engine::Postprocess(const std::vector<Sequence*>& item_seqs,
                         const std::vector<StepItem>& items, const std::vector<float>& logits) {
  const int64_t vocab = runner_->vocab_size();
  size_t row = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    Sequence& s = *item_seqs[i];
    s.computed += items[i].num_tokens;
    s.table.SetNumTokens(s.computed);
    if (!items[i].want_logits) continue;
    const float* l = logits.data() + row++ * vocab;
    SampleResult r = s.sampler.Sample(l, vocab, s.history);
    stats_.generated_tokens++;
    s.tokens.push_back(r.token_id);
    if (s.req.params.UsesPenalties()) s.history.AddOutputToken(r.token_id);
    s.handle->Push(GeneratedToken{r.token_id, r.logprob, std::move(r.top_logprobs)});
    const auto& p = s.req.params;
    const auto& eos = model_.eos_token_ids;
    const bool is_eos = !p.ignore_eos && std::find(eos.begin(), eos.end(), r.token_id) != eos.end();
    const bool is_stop =
        std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(), r.token_id) != p.stop_token_ids.end();
    if (is_eos || is_stop) Finish(s, "stop");
    else if (static_cast<int64_t>(s.tokens.size()) >= s.limit) Finish(s, "length");
  }
  ReapFinished();
}

Status Engine::Step() {
  std::vector<StepItem> items;
  std::vector<Sequence*> item_seqs;
  Schedule(&items, &item_seqs);
  if (items.empty()) {
    if (!running_.empty() || !waiting_.empty()) {
      Status err = Internal("scheduler made no progress: " + std::to_string(running_.size()) +
                            " running, " + std::to_string(waiting_.size()) + " waiting, " +
                            std::to_string(pool_->allocator().num_free()) + " free pages");
      AbortAll("error", err);
      return err;
    }
    return OkStatus();
  }
  const auto t0 = std::chrono::steady_clock::now();
  Status st = runner_->Run(items, &logits_);
  if (!st.ok()) {
    AbortAll("error", st);
    return st;
  }
  int64_t prompt_toks = 0, decode_toks = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    if (items[i].num_tokens == 1 && item_seqs[i]->decoding()) decode_toks += 1;
    else prompt_toks += items[i].num_tokens;
  }
  Postprocess(item_seqs, items, logits_);
  const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  stats_.prefill_tokens += prompt_toks;
  stats_.decode_tokens += decode_toks;
  if (decode_toks == 0) stats_.prefill_seconds += dt;
  else if (prompt_toks == 0) stats_.decode_seconds += dt;
  else stats_.mixed_seconds += dt;
  stats_.steps++;
  return OkStatus();
}

Status Engine::CheckIntegrity() const {
  RETURN_IF_ERROR(pool_->allocator().CheckIntegrity());
  if (radix_) RETURN_IF_ERROR(radix_->CheckIntegrity());
  // Every page a request holds is in use; a request's table covers what it computed.
  for (const auto& s : running_) {
    if (s->table.capacity() < s->computed)
      return Internal("request " + s->req.id + ": page table smaller than its computed tokens");
    for (int32_t p : s->table.pages())
      if (pool_->allocator().refcount(p) < 1)
        return Internal("request " + s->req.id + " holds free page " + std::to_string(p));
  }
  for (const auto& s : waiting_)
    if (!s->table.pages().empty() && !s->prefix_locked)
      return Internal("waiting request " + s->req.id + " holds pages");
  return OkStatus();
}

StatusOr<std::vector<GenerationResult>> Engine::Generate(std::vector<GenerationRequest> requests) {
  struct Pending {
    std::shared_ptr<RequestHandle> handle;
    std::function<void(const StepOutput&)> on_token;
    GenerationResult result;
    bool done = false;
  };
  std::vector<Pending> pending(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    EngineRequest er;
    er.id = "generate-" + std::to_string(i);
    er.prompt = std::move(requests[i].prompt);
    er.params = requests[i].params;
    Status v = Validate(er);
    if (!v.ok()) {
      AbortAll("abort", v);
      return v.Annotate("request " + std::to_string(i));
    }
    pending[i].handle = std::make_shared<RequestHandle>();
    pending[i].on_token = std::move(requests[i].on_token);
    pending[i].result.prompt_tokens = static_cast<int64_t>(er.prompt.size());
    Add(std::move(er), pending[i].handle);
  }
  auto collect = [&]() -> Status {
    for (Pending& p : pending) {
      if (p.done) continue;
      RequestOutput out = p.handle->Take();
      for (GeneratedToken& t : out.tokens) {
        StepOutput so{t.id, t.logprob, std::move(t.top)};
        if (p.on_token) p.on_token(so);
        p.result.output.push_back(so.token);
        p.result.steps.push_back(std::move(so));
      }
      p.result.cached_tokens = out.cached_tokens;
      if (out.finished) {
        p.done = true;
        p.result.finish_reason = out.finish_reason;
        if (!out.error.ok()) return out.error;
      }
    }
    return OkStatus();
  };
  while (HasWork()) {
    RETURN_IF_ERROR(Step());
    RETURN_IF_ERROR(collect());
  }
  RETURN_IF_ERROR(collect());
  std::vector<GenerationResult> out;
  for (Pending& p : pending) out.push_back(std::move(p.result));
  return out;
}

}  // namespace strata
