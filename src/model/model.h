// The model interface the engine drives: one Forward() over a batch of
// tokens from many sequences, reading and writing paged KV.
//
// A Model holds weight views (into the memory-mapped checkpoint) and its own
// activation workspace, sized at creation for ModelOptions::max_batch_tokens.
// It knows nothing of requests or scheduling: the engine describes each step
// with a ForwardBatch (explicit metadata, no global state).
// Thread-safety: Forward() is called from the engine thread only.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "cache/kv_layout.h"
#include "model/hf_config.h"
#include "util/status.h"

namespace strata {

class WeightStore;

// One step's tokens. All pointers are in backend memory.
// Row i of the batch is token token_ids[i] at position positions[i], whose
// K/V goes to slot kv_slots[i]. seqs describe which rows belong to which
// sequence and each sequence's page table (see AttentionSeq). logit_rows
// lists the rows whose next-token logits the caller wants, in order.
struct ForwardBatch {
  int32_t num_tokens = 0;
  const int32_t* token_ids = nullptr;
  const int32_t* positions = nullptr;
  const int64_t* kv_slots = nullptr;
  const AttentionSeq* seqs = nullptr;
  int32_t num_seqs = 0;
  const int32_t* logit_rows = nullptr;
  int32_t num_logit_rows = 0;
  // Host-side: max over seqs of kv_len (0: unknown), for
  // AttentionParams::max_kv_len.
  int32_t max_kv_len = 0;
  // The windowed pool groups' addresses (PoolGroupSpec::sliding_window > 0;
  // cache/window_backing.h): each token's slot and each sequence's page
  // table in those groups, whose pages may be backed by fewer physical
  // pages than there are page ids. seqs[i] and window_seqs[i] differ only in
  // page_table. A model stores and reads its windowed groups through these,
  // every other group through kv_slots and seqs. Equal to kv_slots and seqs
  // when the pool has no window backing (or a caller leaves them null).
  const int64_t* window_kv_slots = nullptr;
  const AttentionSeq* window_seqs = nullptr;
  const int64_t* WindowKvSlots() const { return window_kv_slots ? window_kv_slots : kv_slots; }
  const AttentionSeq* WindowSeqs() const { return window_seqs ? window_seqs : seqs; }
};

struct ModelOptions {
  int32_t max_batch_tokens = 2048;  // most rows one Forward() may carry
};

class Model {
 public:
  virtual ~Model() = default;
  virtual const ModelConfig& config() const = 0;
  // The KV cache this model needs, as pool groups (cache/kv_layout.h): the
  // engine sizes, allocates, caches and moves pages from this alone, never
  // from model specifics. `dtype` is the operator's --kv-cache-dtype for the
  // groups that take it. Forward()'s kv spans every layer of every group, in
  // group order.
  virtual KvLayout kv_layout(int page_size, DType dtype) const = 0;
  // Most rows one Forward() may carry (ModelOptions::max_batch_tokens).
  virtual int32_t max_batch_tokens() const = 0;
  // REQUIRES: batch.num_tokens <= options.max_batch_tokens; kv has
  // one entry per layer of kv_layout()'s groups; logits is F32
  // [batch.num_logit_rows, vocab_size] in backend memory.
  virtual Status Forward(const ForwardBatch& batch, std::span<const KvLayerView> kv,
                         Tensor logits) = 0;
  // True when Forward may be recorded and replayed (Backend::BeginRecording):
  // for equal host-side fields of the batch (num_tokens, num_seqs,
  // num_logit_rows, max_kv_len), the same kv and the same logits tensor,
  // Forward issues the same ops with the same arguments and reads the
  // step's values only through the batch's device arrays -- no copy to the
  // host, no host-side state that changes between steps. The ModelRunner
  // then replays decode steps instead of issuing them (a CUDA graph). False
  // by default: a model that reads device values on the host (a MoE router
  // on the host) must not be replayed.
  virtual bool ForwardIsReplayable() const { return false; }
};

// Architecture registry (model/registry.cc). Adding an architecture is one
// file defining its factory and its layout function plus one line in the
// registry table.
using ModelFactory = StatusOr<std::unique_ptr<Model>> (*)(const ModelConfig&, WeightStore&,
                                                          Backend&, const ModelOptions&);
// The pool groups a model of this config declares, from config.json alone:
// what Model::kv_layout returns once the weights are loaded (a test holds
// the two equal for every architecture).
using KvLayoutFunction = KvLayout (*)(const ModelConfig&, int page_size, DType dtype);
ModelFactory FindArchitecture(const std::string& name);
std::vector<std::string> SupportedArchitectures();

// The KV layout of config's architecture before any weight is read, so
// startup validation sizes the device pool and the host tier first.
// Unimplemented (naming the supported architectures) for an unknown one;
// the layout's own Validate() problems otherwise.
StatusOr<KvLayout> KvLayoutForConfig(const ModelConfig& config, int page_size, DType dtype);

}  // namespace strata
