#include "engine/model_runner.h"

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <string>

#include "util/logging.h"

namespace strata {

namespace {

// Where a step's arrays lie in the metadata buffer: packed in this order,
// each at a 16-byte boundary, for the step's counts. They go up in ONE copy
// of `end` bytes, and a decode step's addresses depend only on its counts
// (a recording needs the same addresses every step of its key). With a
// window backing (KvPool::window_backing) the windowed groups' slots,
// sequences and page tables follow, the same sizes again.
struct MetaLayout {
  uint64_t tokens, positions, slots, logit_rows, seqs, pages, wslots, wseqs, wpages, end;
};
MetaLayout LayoutFor(uint64_t tokens, uint64_t logit_rows, uint64_t seqs, uint64_t pages,
                     bool windowed) {
  auto al = [](uint64_t b) { return (b + 15) / 16 * 16; };
  MetaLayout m{};
  uint64_t o = 0;
  m.tokens = o;
  o += al(tokens * sizeof(int32_t));
  m.positions = o;
  o += al(tokens * sizeof(int32_t));
  m.slots = o;
  o += al(tokens * sizeof(int64_t));
  m.logit_rows = o;
  o += al(logit_rows * sizeof(int32_t));
  m.seqs = o;
  o += al(seqs * sizeof(AttentionSeq));
  m.pages = o;
  o += al(pages * sizeof(int32_t));
  const uint64_t w = windowed ? 1 : 0;
  m.wslots = o;
  o += al(w * tokens * sizeof(int64_t));
  m.wseqs = o;
  o += al(w * seqs * sizeof(AttentionSeq));
  m.wpages = o;
  m.end = o + w * pages * sizeof(int32_t);
  return m;
}

// Bytes of the per-step buffers: the metadata (at the limits) and the logits.
std::vector<uint64_t> BufferBytes(const RunnerLimits& l, int64_t vocab, bool windowed) {
  const uint64_t t = static_cast<uint64_t>(std::max(1, l.max_batch_tokens));
  const uint64_t s = static_cast<uint64_t>(std::max(1, l.max_seqs));
  const uint64_t r = static_cast<uint64_t>(std::max(1, l.max_logit_rows));
  const uint64_t pages = s * static_cast<uint64_t>(std::max<int64_t>(1, l.max_pages_per_seq));
  return {LayoutFor(t, r, s, pages, windowed).end, r * static_cast<uint64_t>(vocab) * sizeof(float)};
}

}  // namespace

int32_t DecodeKvLenHint(int32_t kv_len) {
  int64_t h = 64;
  while (h < kv_len) h *= 2;
  return static_cast<int32_t>(std::min<int64_t>(h, INT32_MAX));
}

uint64_t ModelRunner::DeviceBytes(const RunnerLimits& limits, int64_t vocab, bool windowed) {
  uint64_t total = 0;
  for (uint64_t b : BufferBytes(limits, vocab, windowed)) total += ArenaBlockBytes(b);
  return total;
}

ModelRunner::ModelRunner(Model& model, Backend& backend, KvPool& pool, const RunnerLimits& limits,
                         const StepRecordingOptions& recording)
    : model_(model), backend_(backend), pool_(pool), limits_(limits), rec_opts_(recording) {
  can_record_ = rec_opts_.enabled && backend.SupportsRecording() && model.ForwardIsReplayable();
  const KvLayout& layout = pool.layout();
  for (int g = 0; g < static_cast<int>(layout.groups.size()); ++g)
    for (int l = 0; l < layout.groups[g].num_layers; ++l) kv_.push_back(pool.Layer(g, l));
}

ModelRunner::~ModelRunner() {
  for (auto& [key, state] : keys_)
    if (state.recording >= 0) backend_.ForgetRecording(state.recording);
  if (stage_pinned_) backend_.UnpinHostMemory(stage_.get());
}

StatusOr<std::unique_ptr<ModelRunner>> ModelRunner::Create(Model& model, Backend& backend,
                                                           KvPool& pool, const RunnerLimits& limits,
                                                           const StepRecordingOptions& recording) {
  if (limits.max_batch_tokens < 1 || limits.max_seqs < 1 || limits.max_logit_rows < 1 ||
      limits.max_pages_per_seq < 1)
    return InvalidArgument("ModelRunner: every limit must be >= 1");
  std::unique_ptr<ModelRunner> r(new ModelRunner(model, backend, pool, limits, recording));
  const std::vector<uint64_t> bytes =
      BufferBytes(limits, model.config().vocab_size, pool.window_backing() != nullptr);
  Buffer* bufs[] = {&r->meta_, &r->logits_};
  for (size_t i = 0; i < bytes.size(); ++i) {
    auto b = backend.Allocate(bytes[i]);
    if (!b.ok())
      return b.status().Annotate("allocating the per-step buffers (" + std::to_string(bytes[i]) +
                                 " bytes)");
    *bufs[i] = std::move(b).value();
  }
  // The host staging of the metadata, whole pages, pinned where the backend
  // pins (a GPU's copy from it is then one DMA, not a staged copy; a
  // failure to pin only costs that).
  const size_t stage_bytes = (bytes[0] + 4095) / 4096 * 4096;
  r->stage_.reset(static_cast<uint8_t*>(std::aligned_alloc(4096, stage_bytes)));
  if (!r->stage_) return ResourceExhausted("ModelRunner: no host memory for the step staging");
  r->stage_pinned_ = backend.PinHostMemory(r->stage_.get(), stage_bytes).ok();
  return r;
}

Status ModelRunner::Run(std::span<const StepItem> items, Tensor* logits) {
  h_tokens_.clear();
  h_positions_.clear();
  h_slots_.clear();
  h_pages_.clear();
  h_logit_rows_.clear();
  h_seqs_.clear();
  h_wslots_.clear();
  h_wpages_.clear();
  const WindowBacking* backing = pool_.window_backing();
  std::vector<size_t> page_offsets;
  for (const StepItem& it : items) {
    if (it.num_tokens <= 0) return Internal("ModelRunner: empty step item");
    const int32_t q_start = static_cast<int32_t>(h_tokens_.size());
    const int64_t end = int64_t{it.start_pos} + it.num_tokens;
    if (it.table->capacity() < end) return Internal("ModelRunner: page table too small for step");
    for (int32_t i = 0; i < it.num_tokens; ++i) {
      h_tokens_.push_back(it.tokens[i]);
      h_positions_.push_back(it.start_pos + i);
      h_slots_.push_back(it.table->Slot(it.start_pos + i));
    }
    if (backing) {
      const int64_t ps = it.table->page_size();
      for (int32_t i = 0; i < it.num_tokens; ++i) {
        const int64_t pos = int64_t{it.start_pos} + i;
        const int32_t slot = backing->slot(it.table->pages()[static_cast<size_t>(pos / ps)]);
        if (slot < 0)
          return Internal("ModelRunner: position " + std::to_string(pos) +
                          " is written into a page without window backing (a scheduler bug)");
        h_wslots_.push_back(int64_t{slot} * ps + pos % ps);
      }
    }
    for (int32_t r = it.num_logit_rows(); r > 0; --r)
      h_logit_rows_.push_back(static_cast<int32_t>(h_tokens_.size()) - r);
    const int64_t pages_used = (end + it.table->page_size() - 1) / it.table->page_size();
    page_offsets.push_back(h_pages_.size());
    h_pages_.insert(h_pages_.end(), it.table->pages().begin(), it.table->pages().begin() + pages_used);
    if (backing) {  // tombstones map to -1: outside every window, never read
      for (int64_t i = 0; i < pages_used; ++i)
        h_wpages_.push_back(backing->slot_of_page()[static_cast<size_t>(it.table->pages()[i])]);
    }
    AttentionSeq s;
    s.q_start = q_start;
    s.q_len = it.num_tokens;
    s.kv_len = static_cast<int32_t>(end);
    h_seqs_.push_back(s);
  }
  const int32_t n = static_cast<int32_t>(h_tokens_.size());
  const int64_t vocab = vocab_size();
  const size_t nl = h_logit_rows_.size();
  const RunnerLimits& lim = limits_;
  const MetaLayout m = LayoutFor(n, nl, h_seqs_.size(), h_pages_.size(), backing != nullptr);
  const uint64_t max_pages =
      uint64_t(std::max(1, lim.max_seqs)) * uint64_t(std::max<int64_t>(1, lim.max_pages_per_seq));
  if (n > lim.max_batch_tokens || h_seqs_.size() > static_cast<size_t>(lim.max_seqs) ||
      nl > static_cast<size_t>(lim.max_logit_rows) || h_pages_.size() > max_pages)
    return Internal(
        "ModelRunner: a step of " + std::to_string(n) + " tokens, " +
        std::to_string(h_seqs_.size()) + " sequences, " + std::to_string(nl) + " logit rows and " +
        std::to_string(h_pages_.size()) + " page-table entries exceeds the runner's limits (" +
        std::to_string(lim.max_batch_tokens) + ", " + std::to_string(lim.max_seqs) + ", " +
        std::to_string(lim.max_logit_rows) + ", " + std::to_string(max_pages) + ")");
  // Page-table pointers must point into backend memory.
  char* dev = static_cast<char*>(meta_.data());
  auto* dev_pages = reinterpret_cast<int32_t*>(dev + m.pages);
  auto* dev_wpages = reinterpret_cast<int32_t*>(dev + m.wpages);
  h_wseqs_ = h_seqs_;
  for (size_t i = 0; i < h_seqs_.size(); ++i) {
    h_seqs_[i].page_table = dev_pages + page_offsets[i];
    h_wseqs_[i].page_table = dev_wpages + page_offsets[i];
  }
  uint8_t* h = stage_.get();
  auto put = [&](uint64_t at, const void* src, size_t bytes) {
    if (bytes) std::memcpy(h + at, src, bytes);
  };
  put(m.tokens, h_tokens_.data(), n * sizeof(int32_t));
  put(m.positions, h_positions_.data(), n * sizeof(int32_t));
  put(m.slots, h_slots_.data(), n * sizeof(int64_t));
  put(m.logit_rows, h_logit_rows_.data(), nl * sizeof(int32_t));
  put(m.seqs, h_seqs_.data(), h_seqs_.size() * sizeof(AttentionSeq));
  put(m.pages, h_pages_.data(), h_pages_.size() * sizeof(int32_t));
  if (backing) {
    put(m.wslots, h_wslots_.data(), n * sizeof(int64_t));
    put(m.wseqs, h_wseqs_.data(), h_wseqs_.size() * sizeof(AttentionSeq));
    put(m.wpages, h_wpages_.data(), h_wpages_.size() * sizeof(int32_t));
  }
  backend_.CopyToDevice(dev, h, m.end);

  ForwardBatch b;
  b.num_tokens = n;
  b.token_ids = reinterpret_cast<const int32_t*>(dev + m.tokens);
  b.positions = reinterpret_cast<const int32_t*>(dev + m.positions);
  b.kv_slots = reinterpret_cast<const int64_t*>(dev + m.slots);
  b.seqs = reinterpret_cast<const AttentionSeq*>(dev + m.seqs);
  b.window_kv_slots = backing ? reinterpret_cast<const int64_t*>(dev + m.wslots) : b.kv_slots;
  b.window_seqs = backing ? reinterpret_cast<const AttentionSeq*>(dev + m.wseqs) : b.seqs;
  b.num_seqs = static_cast<int32_t>(h_seqs_.size());
  b.logit_rows = reinterpret_cast<const int32_t*>(dev + m.logit_rows);
  b.num_logit_rows = static_cast<int32_t>(nl);
  for (const AttentionSeq& s : h_seqs_) b.max_kv_len = std::max(b.max_kv_len, s.kv_len);
  Tensor out = logits_.AsTensor(DType::kF32, static_cast<int64_t>(nl), vocab);
  // Decode: one token and one logits row per sequence.
  const bool candidate = can_record_ && static_cast<size_t>(n) == h_seqs_.size() &&
                         nl == h_seqs_.size() && n <= rec_opts_.max_seqs;
  if (candidate) {
    b.max_kv_len = DecodeKvLenHint(b.max_kv_len);
    RETURN_IF_ERROR(ForwardDecode(b, out));
  } else {
    RETURN_IF_ERROR(model_.Forward(b, kv_, out));
  }
  *logits = out;
  return OkStatus();
}

Status ModelRunner::ForwardDecode(const ForwardBatch& b, Tensor logits) {
  KeyState& key = keys_[{b.num_seqs, b.max_kv_len}];
  if (key.recording >= 0) {
    if (backend_.Replay(key.recording)) {
      ++rec_stats_.replayed;
      return OkStatus();
    }
    // Dropped by the backend (memory it used moved): record it anew next time.
    backend_.ForgetRecording(key.recording);
    key.recording = -1;
    --num_recordings_;
    ++rec_stats_.dropped;
    ++rec_stats_.eager_decode;
    return model_.Forward(b, kv_, logits);
  }
  if (!key.seen || key.eager || num_recordings_ >= rec_opts_.max_recordings) {
    // First sight (its ops grow what they need), or never recorded.
    key.seen = true;
    ++rec_stats_.eager_decode;
    return model_.Forward(b, kv_, logits);
  }
  const Status begin = backend_.BeginRecording();
  StatusOr<int> id = begin.ok() ? StatusOr<int>(-1) : StatusOr<int>(begin);
  if (begin.ok()) {
    const Status forward = model_.Forward(b, kv_, logits);
    id = backend_.EndRecording();
    RETURN_IF_ERROR(forward);  // nothing of it ran: the step fails as an eager one would
  }
  if (!id.ok()) {
    STRATA_LOG(WARN) << "decode steps of " << b.num_seqs << " sequences (context hint "
                     << b.max_kv_len << ") run op by op: " << id.status().ToString();
    key.eager = true;
    ++rec_stats_.failed;
    ++rec_stats_.eager_decode;
    return model_.Forward(b, kv_, logits);
  }
  key.recording = *id;
  ++num_recordings_;
  ++rec_stats_.recorded;
  if (!backend_.Replay(key.recording))
    return Internal("ModelRunner: the backend dropped a recording it had just made");
  ++rec_stats_.replayed;
  return OkStatus();
}

}  // namespace strata
