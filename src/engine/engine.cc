#include "engine/engine.h"

#include <algorithm>
#include <chrono>

#include "cache/kv_layout.h"
#include "util/logging.h"

namespace strata {

struct Engine::Sequence {
  GenerationRequest req;
  GenerationResult result;
  std::vector<int32_t> tokens;  // prompt + output
  int64_t prompt_len = 0;
  int64_t computed = 0;  // tokens whose KV is in the pool
  int64_t limit = 0;     // total tokens at which the sequence stops ("length")
  PageTable table;
  Sampler sampler;
  TokenHistory history;
  bool finished = false;
  Sequence(GenerationRequest r, int page_size)
      : req(std::move(r)), table(page_size), sampler(req.params, std::nullopt) {}
};

Engine::Engine(LoadedModel& model, Backend& backend, const EngineOptions& options)
    : model_(model), backend_(backend), options_(options) {}
Engine::~Engine() = default;

StatusOr<std::unique_ptr<Engine>> Engine::Create(LoadedModel& model, Backend& backend,
                                                 const EngineOptions& options) {
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
    const int64_t want = e->context_length_ * std::max(1, options.max_running_requests);
    ASSIGN_OR_RETURN(int64_t by_tokens, NumKvPagesForTokens(layout, want + options.page_size));
    ASSIGN_OR_RETURN(int64_t by_bytes, NumKvPagesForBytes(layout, uint64_t{1} << 30));
    pages = std::min(by_tokens, by_bytes);
  }
  ASSIGN_OR_RETURN(e->pool_, KvPool::Create(layout, pages, backend));
  e->runner_ = std::make_unique<ModelRunner>(*model.model, backend, *e->pool_,
                                             options.chunked_prefill_size);
  return e;
}

// Decode tokens first (one per running sequence that has finished its
// prompt), then prompt chunks, oldest first, while the budget lasts.
bool Engine::Schedule(std::vector<Sequence*>& running, std::vector<StepItem>* items,
                      std::vector<Sequence*>* item_seqs) {
  items->clear();
  item_seqs->clear();
  int64_t budget = options_.chunked_prefill_size;
  PageAllocator& alloc = pool_->allocator();
  for (int pass = 0; pass < 2; ++pass) {
    for (Sequence* s : running) {
      if (s->finished || budget <= 0) continue;
      const bool decoding = s->computed >= s->prompt_len;
      if ((pass == 0) != decoding) continue;
      const int64_t remaining = static_cast<int64_t>(s->tokens.size()) - s->computed;
      const int64_t n = std::min(remaining, budget);
      if (n <= 0) continue;
      if (!s->table.Reserve(s->computed + n, alloc).ok()) continue;  // wait for pages
      s->table.SetNumTokens(s->computed + n);
      StepItem it;
      it.table = &s->table;
      it.tokens = s->tokens.data() + s->computed;
      it.num_tokens = static_cast<int32_t>(n);
      it.start_pos = static_cast<int32_t>(s->computed);
      it.want_logits = s->computed + n == static_cast<int64_t>(s->tokens.size());
      items->push_back(it);
      item_seqs->push_back(s);
      budget -= n;
    }
  }
  return !items->empty();
}

void Engine::Finish(Sequence& s, const char* reason) {
  s.finished = true;
  s.result.finish_reason = reason;
  s.table.Release(pool_->allocator());
}

void Engine::Postprocess(const std::vector<Sequence*>& item_seqs,
                         const std::vector<StepItem>& items, const std::vector<float>& logits) {
  const int64_t vocab = runner_->vocab_size();
  size_t row = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    Sequence& s = *item_seqs[i];
    s.computed += items[i].num_tokens;
    if (!items[i].want_logits) continue;
    const float* l = logits.data() + row++ * vocab;
    SampleResult r = s.sampler.Sample(l, vocab, s.history);
    StepOutput out{r.token_id, r.logprob, std::move(r.top_logprobs)};
    s.tokens.push_back(r.token_id);
    s.result.output.push_back(r.token_id);
    if (s.req.params.UsesPenalties()) s.history.AddOutputToken(r.token_id);
    if (s.req.on_token) s.req.on_token(out);
    s.result.steps.push_back(std::move(out));
    const auto& p = s.req.params;
    const bool is_eos = !p.ignore_eos && std::find(model_.eos_token_ids.begin(), model_.eos_token_ids.end(),
                                                   r.token_id) != model_.eos_token_ids.end();
    const bool is_stop =
        std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(), r.token_id) != p.stop_token_ids.end();
    if (is_eos || is_stop) Finish(s, "stop");
    else if (static_cast<int64_t>(s.tokens.size()) >= s.limit) Finish(s, "length");
  }
}

StatusOr<std::vector<GenerationResult>> Engine::Generate(std::vector<GenerationRequest> requests) {
  std::vector<std::unique_ptr<Sequence>> seqs;
  const int64_t pool_tokens = pool_->num_pages() * options_.page_size;
  for (size_t i = 0; i < requests.size(); ++i) {
    auto& r = requests[i];
    RETURN_IF_ERROR(r.params.Validate().Annotate("request " + std::to_string(i)));
    const int64_t plen = static_cast<int64_t>(r.prompt.size());
    if (plen == 0) return InvalidArgument("request " + std::to_string(i) + ": empty prompt");
    for (int32_t t : r.prompt)
      if (t < 0 || t >= model_.config.vocab_size)
        return InvalidArgument("request " + std::to_string(i) + ": token id " + std::to_string(t) +
                               " is outside the vocabulary [0, " +
                               std::to_string(model_.config.vocab_size) + ")");
    if (plen >= context_length_)
      return InvalidArgument("request " + std::to_string(i) + ": prompt has " + std::to_string(plen) +
                             " tokens; the context length is " + std::to_string(context_length_) +
                             " (prompt plus at least one generated token must fit)");
    if (plen + 1 > pool_tokens)
      return ResourceExhausted("request " + std::to_string(i) + ": prompt of " + std::to_string(plen) +
                               " tokens does not fit the KV pool of " + std::to_string(pool_tokens) +
                               " tokens (raise --max-total-tokens)");
    auto s = std::make_unique<Sequence>(std::move(r), options_.page_size);
    s->tokens = s->req.prompt;
    s->prompt_len = plen;
    s->result.prompt_tokens = plen;
    s->limit = std::min(context_length_, plen + std::max(0, s->req.params.max_tokens));
    if (s->req.params.UsesPenalties()) s->history.AddPromptTokens(s->req.prompt);
    seqs.push_back(std::move(s));
  }

  std::vector<Sequence*> running;
  size_t next = 0;
  std::vector<StepItem> items;
  std::vector<Sequence*> item_seqs;
  std::vector<float> logits;
  Status failure;
  while (true) {
    // Admit waiting sequences up to the running limit.
    running.erase(std::remove_if(running.begin(), running.end(), [](Sequence* s) { return s->finished; }),
                  running.end());
    while (next < seqs.size() && static_cast<int32_t>(running.size()) < options_.max_running_requests) {
      Sequence* s = seqs[next++].get();
      if (s->req.params.max_tokens == 0) {
        s->finished = true;
        s->result.finish_reason = "length";
        continue;
      }
      running.push_back(s);
    }
    if (running.empty()) break;
    if (!Schedule(running, &items, &item_seqs)) {
      // Nothing fits: pages are exhausted by partially computed sequences.
      // (Preemption arrives with the server's scheduler.)
      failure = ResourceExhausted("KV pool of " + std::to_string(pool_tokens) +
                                  " tokens is too small for the running requests "
                                  "(raise --max-total-tokens or lower --max-running-requests)");
      break;
    }
    const auto t0 = std::chrono::steady_clock::now();
    Status st = runner_->Run(items, &logits);
    if (!st.ok()) {
      failure = st;
      break;
    }
    Postprocess(item_seqs, items, logits);
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    int64_t prompt_toks = 0, decode_toks = 0;
    for (size_t i = 0; i < items.size(); ++i) {
      // A chunk is "decode" when it is a single token past the prompt.
      if (items[i].start_pos >= item_seqs[i]->prompt_len) decode_toks += items[i].num_tokens;
      else prompt_toks += items[i].num_tokens;
    }
    stats_.prefill_tokens += prompt_toks;
    stats_.decode_tokens += decode_toks;
    if (decode_toks == 0) stats_.prefill_seconds += dt;
    else if (prompt_toks == 0) stats_.decode_seconds += dt;
    else stats_.mixed_seconds += dt;
    stats_.steps++;
  }
  for (auto& s : seqs)
    if (!s->table.pages().empty()) s->table.Release(pool_->allocator());
  if (!failure.ok()) return failure;
  std::vector<GenerationResult> out;
  for (auto& s : seqs) out.push_back(std::move(s->result));
  return out;
}

}  // namespace strata
