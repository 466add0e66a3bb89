// DeepseekV4ForCausalLM, as transformers 5.17's modeling_deepseek_v4.py
// (docs/architecture/model.md "DeepSeek V4 forward" writes the math down;
// this file follows it step by step).
//
// Per layer: hyper-connection streams collapse into one block input;
// attention is one shared K=V head (head_dim) over the last sliding_window
// tokens plus, on compressed layers, a history of compressed entries (one
// per compress_rate tokens: CSA layers choose index_topk of them per query
// with a lightning indexer, HCA layers see all); a grouped low-rank output
// projection; then a MoE (sqrt(softplus) or sigmoid scores; hash routing on
// hash_moe layers) with a shared expert; both blocks expand back into the
// streams through the Sinkhorn-projected mixing matrix.
//
// KV state, all in pool groups (kv_layout below), so that a sequence
// continues from its cached pages exactly, whatever its chunking or prefix
// hit:
//   sliding_kv            every layer, per token: the rotated K=V row
//   csa_compressed_kv     CSA layers, one entry per csa_rate tokens
//   csa_indexer_keys      CSA layers, one entry per csa_rate tokens
//   csa_compressor_inputs CSA layers, per token: compressor kv (K) and gate (V)
//   csa_indexer_inputs    CSA layers, per token: the indexer's kv and gate
//   hca_compressed_kv     HCA layers, one entry per hca_rate tokens
//   hca_compressor_inputs HCA layers, per token: compressor kv (K) and gate (V)
// An entry is computed once, by the forward in which its window's last
// token arrives, from the inputs of its window (and, for CSA, the window
// before) read back from the pool. The per-token groups are sized for the
// whole sequence in this version (cache.md: the ring allocator that frees
// tokens older than the window is the next step).
//
// This version runs on the CPU backend only: the V4-specific steps
// (compressors, indexer top-k, hyper-connections, sinks, the K=V
// attention) are host loops on the engine thread over backend memory,
// which on the CPU is host memory; matmuls and norms go through the backend's ops. Creation on
// another backend fails with Unimplemented.
//
// Multi-token-prediction weights (mtp.* or model.layers.<num_hidden_layers
// + i>.*) are skipped explicitly with a log line, as transformers ignores
// them; any other unused tensor is an error.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>

#include "model/model.h"
#include "model/model_parts.h"
#include "model/rope.h"
#include "model/weights.h"
#include "util/logging.h"

namespace strata {
namespace {

using Kind = DeepseekV4Config::Attention;

constexpr char kSliding[] = "sliding_kv";
constexpr char kCsaEntries[] = "csa_compressed_kv";
constexpr char kCsaIndexKeys[] = "csa_indexer_keys";
constexpr char kCsaInputs[] = "csa_compressor_inputs";
constexpr char kCsaIndexInputs[] = "csa_indexer_inputs";
constexpr char kHcaEntries[] = "hca_compressed_kv";
constexpr char kHcaInputs[] = "hca_compressor_inputs";

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

float LoadFloat(const Tensor& t, int64_t i) {
  switch (t.dtype) {
    case DType::kF32: return static_cast<const float*>(t.data)[i];
    case DType::kBF16: return Bf16ToFloat(static_cast<const uint16_t*>(t.data)[i]);
    case DType::kF16: return F16ToFloat(static_cast<const uint16_t*>(t.data)[i]);
    default: return 0.f;
  }
}

std::vector<float> ToFloats(const Tensor& t) {
  std::vector<float> v(static_cast<size_t>(t.rows * t.cols));
  for (int64_t r = 0; r < t.rows; ++r)
    for (int64_t c = 0; c < t.cols; ++c) v[r * t.cols + c] = LoadFloat(t, r * t.row_stride() + c);
  return v;
}

// One row of `n` elements at slot `slot` of a KV tensor (k or v of a view).
void LoadRow(const KvLayerView& view, const void* base, int64_t slot, int64_t n, float* out) {
  const int64_t at = slot * n;
  switch (view.dtype) {
    case DType::kF32: std::memcpy(out, static_cast<const float*>(base) + at, n * sizeof(float)); break;
    case DType::kBF16:
      for (int64_t i = 0; i < n; ++i) out[i] = Bf16ToFloat(static_cast<const uint16_t*>(base)[at + i]);
      break;
    case DType::kF16:
      for (int64_t i = 0; i < n; ++i) out[i] = F16ToFloat(static_cast<const uint16_t*>(base)[at + i]);
      break;
    default: STRATA_CHECK(false) << "KV dtype " << DTypeName(view.dtype);
  }
}
void StoreRow(const KvLayerView& view, void* base, int64_t slot, int64_t n, const float* in) {
  const int64_t at = slot * n;
  switch (view.dtype) {
    case DType::kF32: std::memcpy(static_cast<float*>(base) + at, in, n * sizeof(float)); break;
    case DType::kBF16:
      for (int64_t i = 0; i < n; ++i) static_cast<uint16_t*>(base)[at + i] = FloatToBf16(in[i]);
      break;
    case DType::kF16:
      for (int64_t i = 0; i < n; ++i) static_cast<uint16_t*>(base)[at + i] = FloatToF16(in[i]);
      break;
    default: STRATA_CHECK(false) << "KV dtype " << DTypeName(view.dtype);
  }
}

// Slot of token `pos` of a sequence, and of entry `e` of a group of
// tokens_per_entry r (cache/kv_layout.h: in the page of its last token).
int64_t TokenSlot(const AttentionSeq& s, int32_t page_size, int64_t pos) {
  return int64_t{s.page_table[pos / page_size]} * page_size + pos % page_size;
}
int64_t EntrySlot(const AttentionSeq& s, const KvLayerView& v, int64_t e) {
  const int64_t r = v.tokens_per_entry, last = (e + 1) * r - 1;
  const int64_t per_page = (v.page_size + r - 1) / r;
  return int64_t{s.page_table[last / v.page_size]} * per_page + (last % v.page_size) / r;
}

// x * rsqrt(mean(x^2) + eps) (* weight), in place (transformers'
// DeepseekV4RMSNorm / UnweightedRMSNorm in f32).
void RmsNormRow(float* x, int64_t n, const float* weight, float eps) {
  float ss = 0.f;
  for (int64_t i = 0; i < n; ++i) ss += x[i] * x[i];
  const float inv = 1.0f / std::sqrt(ss / static_cast<float>(n) + eps);
  for (int64_t i = 0; i < n; ++i) x[i] = (weight ? weight[i] : 1.f) * (x[i] * inv);
}

float Sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

// a . b over n floats in 16 independent partial sums, so the compiler keeps
// several vector additions in flight: one running sum is a serial chain of n
// dependent additions, and that chain was 80% of this file's attention and
// 43% of a 512-token prefill (docs/perf.md "DeepSeek V4 on the CPU").
float Dot(const float* a, const float* b, int64_t n) {
  constexpr int kParts = 16;
  float part[kParts] = {};
  int64_t i = 0;
  for (; i + kParts <= n; i += kParts)
    for (int p = 0; p < kParts; ++p) part[p] += a[i + p] * b[i + p];
  float sum = 0.f;
  for (; i < n; ++i) sum += a[i] * b[i];
  for (int p = 0; p < kParts; ++p) sum += part[p];
  return sum;
}

// out += sum_j w[j] * rows[j] over n rows of `dim` floats, four rows per
// pass over `out` (a pass per row is a load and a store of out per row: half
// of this file's attention time once the dot products were vectorized).
void AddWeightedRows(const float* w, const float* rows, int64_t n, int64_t dim, float* out) {
  int64_t j = 0;
  for (; j + 4 <= n; j += 4) {
    const float *r0 = rows + j * dim, *r1 = r0 + dim, *r2 = r1 + dim, *r3 = r2 + dim;
    for (int64_t d = 0; d < dim; ++d)
      out[d] += (w[j] * r0[d] + w[j + 1] * r1[d]) + (w[j + 2] * r2[d] + w[j + 3] * r3[d]);
  }
  for (; j < n; ++j)
    for (int64_t d = 0; d < dim; ++d) out[d] += w[j] * rows[j * dim + d];
}

// cos and sin of inv_freq[i] * pos: one position's rope angles, computed
// once and applied to all of its heads (computed per head, sincos was 4% of a
// bf16-matmul prefill).
struct RopeAngles {
  std::vector<float> cos, sin;
  void Set(const std::vector<float>& inv_freq, int64_t pos) {
    cos.resize(inv_freq.size());
    sin.resize(inv_freq.size());
    for (size_t i = 0; i < inv_freq.size(); ++i) {
      const float f = inv_freq[i] * static_cast<float>(pos);
      cos[i] = std::cos(f);
      sin[i] = std::sin(f);
    }
  }
};

// V4's interleaved rope on the trailing rope dims of one head: pair (2i,
// 2i+1) of the slice rotates by inv_freq[i] * pos and stays in place;
// `sign` -1 rotates back (the attention output's de-rotation).
void RopeRow(float* head, int64_t head_dim, const RopeAngles& angles, float sign) {
  const int64_t rd = static_cast<int64_t>(angles.cos.size()) * 2;
  float* x = head + head_dim - rd;
  for (size_t i = 0; i < angles.cos.size(); ++i) {
    const float c = angles.cos[i], s = sign * angles.sin[i];
    const float a = x[2 * i], b = x[2 * i + 1];
    x[2 * i] = a * c - b * s;
    x[2 * i + 1] = b * c + a * s;
  }
}

// The entries torch.topk(scores, k) picks on the CPU (set, not order): the
// same std::nth_element / std::partial_sort over (value, index) pairs with
// its comparator, so ties between equal scores (ReLU makes many exact
// zeros) fall the same way as in the reference.
void TorchTopK(const std::vector<float>& scores, int64_t k, std::vector<int64_t>* out) {
  using Elem = std::pair<double, int64_t>;
  std::vector<Elem> q(scores.size());
  for (size_t j = 0; j < scores.size(); ++j) q[j] = {scores[j], static_cast<int64_t>(j)};
  auto larger = [](const Elem& x, const Elem& y) {
    return (std::isnan(x.first) && !std::isnan(y.first)) || (x.first > y.first);
  };
  const int64_t n = static_cast<int64_t>(q.size());
  if (k * 64 <= n) {
    std::partial_sort(q.begin(), q.begin() + k, q.end(), larger);
  } else {
    std::nth_element(q.begin(), q.begin() + k - 1, q.end(), larger);
  }
  out->clear();
  for (int64_t i = 0; i < k; ++i) out->push_back(q[i].second);
}

struct Mlp {
  Tensor gate, up, down;  // w1, w3, w2
};

// A compressor (CSA: two overlapping series, width 2 * dim; HCA: one).
struct Compressor {
  Tensor kv, gate;        // [width, hidden]
  std::vector<float> ape;  // position bias [rate, width]
  std::vector<float> norm;  // [dim]
  int64_t dim = 0, rate = 0;
  bool overlap = false;
};

struct HyperConnection {
  Tensor fn;                // [(2 + N) * N, N * hidden] (or [N, N * hidden] for the head)
  std::vector<float> base;  // [(2 + N) * N]
  std::vector<float> scale;  // [3] (or [1])
};

struct Layer {
  Kind kind = Kind::kSliding;
  int32_t kind_index = 0;  // index among the layers of its kind (CSA or HCA)
  Tensor attn_norm, ffn_norm;
  HyperConnection hc_attn, hc_ffn;
  Tensor wq_a, q_norm, wq_b, wkv, kv_norm, wo_a, wo_b;
  std::vector<float> sinks;
  Compressor comp, index_comp;
  Tensor index_wq_b, index_weights;
  // MoE.
  bool hash = false;
  Tensor router;
  std::vector<float> router_bias;  // e_score_correction_bias (routed layers)
  std::vector<int64_t> tid2eid;    // [vocab, k] (hash layers)
  Mlp shared;
  std::vector<Mlp> experts;
};

KvLayout DeepseekV4Layout(const ModelConfig& c, int page_size, DType dtype) {
  const DeepseekV4Config& v = c.v4;
  int csa = 0, hca = 0;
  for (Kind k : v.layer_types) {
    csa += k == Kind::kCompressedSparse;
    hca += k == Kind::kHeavilyCompressed;
  }
  KvLayout layout;
  layout.page_size = page_size;
  auto add = [&](const char* name, int layers, int64_t dim, bool has_v, int64_t per_entry,
                 int64_t window) {
    if (layers == 0) return;
    PoolGroupSpec g;
    g.name = name;
    g.num_layers = layers;
    g.num_kv_heads = 1;
    g.head_dim = static_cast<int>(dim);
    g.dtype = dtype;
    g.has_v = has_v;
    g.tokens_per_entry = static_cast<int>(per_entry);
    g.sliding_window = static_cast<int>(window);
    layout.groups.push_back(g);
  };
  const int64_t hd = c.head_dim, id = v.index_head_dim;
  add(kSliding, static_cast<int>(c.num_hidden_layers), hd, false, 1, c.sliding_window);
  add(kCsaEntries, csa, hd, false, v.csa_rate, 0);
  add(kCsaIndexKeys, csa, id, false, v.csa_rate, 0);
  add(kCsaInputs, csa, 2 * hd, true, 1, 2 * v.csa_rate);
  add(kCsaIndexInputs, csa, 2 * id, true, 1, 2 * v.csa_rate);
  add(kHcaEntries, hca, hd, false, v.hca_rate, 0);
  add(kHcaInputs, hca, hd, true, 1, v.hca_rate);
  return layout;
}

class DeepseekV4Model : public Model {
 public:
  DeepseekV4Model(const ModelConfig& c, Backend& b, const ModelOptions& o)
      : config_(c), backend_(b), options_(o) {}
  const ModelConfig& config() const override { return config_; }
  KvLayout kv_layout(int page_size, DType dtype) const override {
    return DeepseekV4Layout(config_, page_size, dtype);
  }
  int32_t max_batch_tokens() const override { return options_.max_batch_tokens; }
  Status Init(WeightStore& w);
  Status Forward(const ForwardBatch& batch, std::span<const KvLayerView> kv,
                 Tensor logits) override;

 private:
  // The views of one layer's groups, out of Forward()'s kv span.
  struct LayerKv {
    const KvLayerView* sliding = nullptr;
    const KvLayerView* entries = nullptr;      // CSA or HCA compressed K=V
    const KvLayerView* inputs = nullptr;       // its compressor inputs
    const KvLayerView* index_keys = nullptr;   // CSA
    const KvLayerView* index_inputs = nullptr;  // CSA
  };
  LayerKv ViewsOf(size_t layer, std::span<const KvLayerView> kv) const;

  StatusOr<Tensor> Bind(WeightStore& w, const std::string& name, std::vector<int64_t> shape) {
    ASSIGN_OR_RETURN(Tensor host, w.Get(name, shape));
    return backend_.UploadWeight(host);
  }
  StatusOr<std::vector<float>> Floats(WeightStore& w, const std::string& name,
                                      std::vector<int64_t> shape) {
    ASSIGN_OR_RETURN(Tensor host, w.Get(name, shape));
    return ToFloats(host);
  }
  StatusOr<Mlp> BindMlp(WeightStore& w, const std::string& p);
  StatusOr<HyperConnection> BindHc(WeightStore& w, const std::string& fn, const std::string& base,
                                   const std::string& scale, int64_t outputs, int64_t scales);
  StatusOr<Compressor> BindCompressor(WeightStore& w, const std::string& p, int64_t dim,
                                      int64_t rate, bool overlap);
  Status CheckUnused(const WeightStore& w, const std::vector<std::string>& read_raw) const;

  // A [rows, cols] F32 tensor over host memory.
  // (Ops write only to their `out` tensor; inputs are not modified.)
  static Tensor View(const std::vector<float>& v, int64_t rows, int64_t cols) {
    return Tensor{const_cast<float*>(v.data()), DType::kF32, rows, cols, 0};
  }

  // Hyper-connection weights of n rows of streams x [n, N * H]: post [n, N],
  // comb [n, N, N] and the collapsed block input [n, H].
  void HcWeights(const HyperConnection& hc, const std::vector<float>& x, int64_t n,
                 std::vector<float>* post, std::vector<float>* comb, std::vector<float>* collapsed);
  // x = post * y + comb^T x, per row.
  void HcMix(std::vector<float>& x, const std::vector<float>& y, const std::vector<float>& post,
             const std::vector<float>& comb, int64_t n) const;
  void Attention(const Layer& L, const ForwardBatch& batch, const LayerKv& kv,
                 const std::vector<float>& h, int64_t n, std::vector<float>* out);
  // Projects and stores the compressor inputs of the batch's tokens, then
  // computes and stores every entry whose window closed in this batch.
  void Compress(const Compressor& c, const ForwardBatch& batch, const KvLayerView& inputs,
                const KvLayerView& entries, const std::vector<float>& h, int64_t n,
                const std::vector<float>& inv_freq);
  // CSA: per row, the entries its query may read (indexer top-k, valid).
  void Select(const Layer& L, const ForwardBatch& batch, const KvLayerView& index_keys,
              const std::vector<float>& h, const std::vector<float>& q_residual, int64_t n,
              std::vector<std::vector<int64_t>>* chosen);
  void Moe(const Layer& L, const ForwardBatch& batch, const std::vector<float>& h, int64_t n,
           std::vector<float>* out);
  void RunMlp(const Mlp& m, const std::vector<float>& x, int64_t n, std::vector<float>* out);

  ModelConfig config_;
  Backend& backend_;
  ModelOptions options_;
  Tensor embed_, final_norm_, lm_head_;
  HyperConnection hc_head_;
  std::vector<Layer> layers_;
  std::vector<float> main_inv_freq_, compress_inv_freq_;
  int num_csa_ = 0, num_hca_ = 0;
};

DeepseekV4Model::LayerKv DeepseekV4Model::ViewsOf(size_t l, std::span<const KvLayerView> kv) const {
  // Group order and sizes as DeepseekV4Layout declares them.
  const int64_t n = config_.num_hidden_layers;
  const int64_t csa = num_csa_, hca = num_hca_;
  const int64_t sliding0 = 0, csa_entries0 = n, csa_keys0 = n + csa, csa_in0 = n + 2 * csa,
                csa_idx_in0 = n + 3 * csa, hca_entries0 = n + 4 * csa, hca_in0 = n + 4 * csa + hca;
  const Layer& L = layers_[l];
  LayerKv v;
  v.sliding = &kv[sliding0 + l];
  if (L.kind == Kind::kCompressedSparse) {
    v.entries = &kv[csa_entries0 + L.kind_index];
    v.index_keys = &kv[csa_keys0 + L.kind_index];
    v.inputs = &kv[csa_in0 + L.kind_index];
    v.index_inputs = &kv[csa_idx_in0 + L.kind_index];
  } else if (L.kind == Kind::kHeavilyCompressed) {
    v.entries = &kv[hca_entries0 + L.kind_index];
    v.inputs = &kv[hca_in0 + L.kind_index];
  }
  return v;
}

StatusOr<Mlp> DeepseekV4Model::BindMlp(WeightStore& w, const std::string& p) {
  const int64_t H = config_.hidden_size, I = config_.moe.moe_intermediate_size;
  Mlp m;
  ASSIGN_OR_RETURN(m.gate, Bind(w, p + "w1.weight", {I, H}));
  ASSIGN_OR_RETURN(m.up, Bind(w, p + "w3.weight", {I, H}));
  ASSIGN_OR_RETURN(m.down, Bind(w, p + "w2.weight", {H, I}));
  return m;
}

StatusOr<HyperConnection> DeepseekV4Model::BindHc(WeightStore& w, const std::string& fn,
                                                  const std::string& base,
                                                  const std::string& scale, int64_t outputs,
                                                  int64_t scales) {
  const int64_t N = config_.v4.hc_mult, H = config_.hidden_size;
  HyperConnection hc;
  ASSIGN_OR_RETURN(hc.fn, Bind(w, fn, {outputs, N * H}));
  ASSIGN_OR_RETURN(hc.base, Floats(w, base, {outputs}));
  ASSIGN_OR_RETURN(hc.scale, Floats(w, scale, {scales}));
  return hc;
}

StatusOr<Compressor> DeepseekV4Model::BindCompressor(WeightStore& w, const std::string& p,
                                                     int64_t dim, int64_t rate, bool overlap) {
  const int64_t H = config_.hidden_size, width = overlap ? 2 * dim : dim;
  Compressor c;
  c.dim = dim;
  c.rate = rate;
  c.overlap = overlap;
  ASSIGN_OR_RETURN(c.kv, Bind(w, p + "wkv.weight", {width, H}));
  ASSIGN_OR_RETURN(c.gate, Bind(w, p + "wgate.weight", {width, H}));
  ASSIGN_OR_RETURN(c.ape, Floats(w, p + "ape", {rate, width}));
  ASSIGN_OR_RETURN(c.norm, Floats(w, p + "norm.weight", {dim}));
  return c;
}

Status DeepseekV4Model::Init(WeightStore& w) {
  const ModelConfig& c = config_;
  const DeepseekV4Config& v = c.v4;
  if (backend_.Name().rfind("cpu", 0) != 0) {
    return Unimplemented(c.architecture + " runs on the CPU backend only in this version (its " +
                         "compressors, indexer and hyper-connections are host loops); got " +
                         backend_.Name() + ": use --device cpu");
  }
  const int64_t H = c.hidden_size, V = c.vocab_size, nh = c.num_attention_heads, hd = c.head_dim,
                N = v.hc_mult, E = c.moe.n_routed_experts, K = c.moe.num_experts_per_tok;
  if (static_cast<int64_t>(v.layer_types.size()) != c.num_hidden_layers ||
      static_cast<int64_t>(v.hash_moe.size()) != c.num_hidden_layers) {
    return InvalidArgument("config.json: deepseek_v4 needs layer_types and mlp_layer_types for "
                           "every layer");
  }
  ASSIGN_OR_RETURN(embed_, Bind(w, "model.embed_tokens.weight", {V, H}));
  ASSIGN_OR_RETURN(final_norm_, Bind(w, "model.norm.weight", {H}));
  if (c.tie_word_embeddings) {
    lm_head_ = embed_;
  } else {
    ASSIGN_OR_RETURN(lm_head_, Bind(w, "head.weight", {V, H}));
  }
  ASSIGN_OR_RETURN(hc_head_, BindHc(w, "model.hc_head.hc_fn", "model.hc_head.hc_base",
                                    "model.hc_head.hc_scale", N, 1));
  std::vector<std::string> read_raw;
  layers_.resize(c.num_hidden_layers);
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    Layer& L = layers_[i];
    const std::string p = "model.layers." + std::to_string(i) + ".", a = p + "attn.";
    L.kind = v.layer_types[i];
    if (L.kind == Kind::kCompressedSparse) L.kind_index = num_csa_++;
    if (L.kind == Kind::kHeavilyCompressed) L.kind_index = num_hca_++;
    ASSIGN_OR_RETURN(L.attn_norm, Bind(w, p + "attn_norm.weight", {H}));
    ASSIGN_OR_RETURN(L.ffn_norm, Bind(w, p + "ffn_norm.weight", {H}));
    ASSIGN_OR_RETURN(L.hc_attn, BindHc(w, p + "hc_attn_fn", p + "hc_attn_base",
                                       p + "hc_attn_scale", (2 + N) * N, 3));
    ASSIGN_OR_RETURN(L.hc_ffn, BindHc(w, p + "hc_ffn_fn", p + "hc_ffn_base", p + "hc_ffn_scale",
                                      (2 + N) * N, 3));
    ASSIGN_OR_RETURN(L.wq_a, Bind(w, a + "wq_a.weight", {v.q_lora_rank, H}));
    ASSIGN_OR_RETURN(L.q_norm, Bind(w, a + "q_norm.weight", {v.q_lora_rank}));
    ASSIGN_OR_RETURN(L.wq_b, Bind(w, a + "wq_b.weight", {nh * hd, v.q_lora_rank}));
    ASSIGN_OR_RETURN(L.wkv, Bind(w, a + "wkv.weight", {hd, H}));
    ASSIGN_OR_RETURN(L.kv_norm, Bind(w, a + "norm.weight", {hd}));
    ASSIGN_OR_RETURN(L.wo_a,
                     Bind(w, a + "wo_a.weight", {v.o_groups * v.o_lora_rank, nh * hd / v.o_groups}));
    ASSIGN_OR_RETURN(L.wo_b, Bind(w, a + "wo_b.weight", {H, v.o_groups * v.o_lora_rank}));
    ASSIGN_OR_RETURN(L.sinks, Floats(w, a + "attn_sink", {nh}));
    if (L.kind == Kind::kCompressedSparse) {
      ASSIGN_OR_RETURN(L.comp, BindCompressor(w, a + "compressor.", hd, v.csa_rate, true));
      ASSIGN_OR_RETURN(L.index_comp, BindCompressor(w, a + "indexer.compressor.",
                                                    v.index_head_dim, v.csa_rate, true));
      ASSIGN_OR_RETURN(L.index_wq_b, Bind(w, a + "indexer.wq_b.weight",
                                          {v.index_n_heads * v.index_head_dim, v.q_lora_rank}));
      ASSIGN_OR_RETURN(L.index_weights,
                       Bind(w, a + "indexer.weights_proj.weight", {v.index_n_heads, H}));
    } else if (L.kind == Kind::kHeavilyCompressed) {
      ASSIGN_OR_RETURN(L.comp, BindCompressor(w, a + "compressor.", hd, v.hca_rate, false));
    }

    const std::string f = p + "ffn.";
    L.hash = v.hash_moe[i];
    ASSIGN_OR_RETURN(L.router, Bind(w, f + "gate.weight", {E, H}));
    if (L.hash) {
      // tid2eid is an integer table (WeightStore::Get takes floats only).
      const std::string name = f + "gate.tid2eid";
      const WeightInfo* t = w.Find(name);
      if (t == nullptr) return NotFound("model.safetensors: missing tensor '" + name + "'");
      if ((t->dtype != DType::kI64 && t->dtype != DType::kI32) ||
          t->shape != std::vector<int64_t>{V, K}) {
        return InvalidArgument("model.safetensors: tensor '" + name + "' must be I64 or I32 [" +
                               std::to_string(V) + ", " + std::to_string(K) + "]");
      }
      L.tid2eid.resize(static_cast<size_t>(V * K));
      for (int64_t x = 0; x < V * K; ++x) {
        L.tid2eid[x] = t->dtype == DType::kI64 ? static_cast<const int64_t*>(t->data)[x]
                                               : static_cast<const int32_t*>(t->data)[x];
        if (L.tid2eid[x] < 0 || L.tid2eid[x] >= E) {
          return InvalidArgument("model.safetensors: '" + name + "' names expert " +
                                 std::to_string(L.tid2eid[x]) + " of " + std::to_string(E));
        }
      }
      read_raw.push_back(name);
    } else {
      ASSIGN_OR_RETURN(L.router_bias, Floats(w, f + "gate.bias", {E}));
    }
    ASSIGN_OR_RETURN(L.shared, BindMlp(w, f + "shared_experts."));
    L.experts.resize(E);
    for (int64_t x = 0; x < E; ++x) {
      ASSIGN_OR_RETURN(L.experts[x], BindMlp(w, f + "experts." + std::to_string(x) + "."));
    }
  }
  RETURN_IF_ERROR(CheckUnused(w, read_raw));
  ASSIGN_OR_RETURN(main_inv_freq_, ComputeInvFreq(v.main_rope, static_cast<int>(v.rope_dim)));
  ASSIGN_OR_RETURN(compress_inv_freq_,
                   ComputeInvFreq(v.compress_rope, static_cast<int>(v.rope_dim)));
  // transformers multiplies cos/sin by the attention factor (1 for both
  // default and, in V4, yarn): only 1 is supported.
  if (RopeAttentionScaling(v.main_rope) != 1.f || RopeAttentionScaling(v.compress_rope) != 1.f) {
    return Unimplemented("config.json: deepseek_v4 rope with an attention factor other than 1");
  }
  return OkStatus();
}

// Everything in the checkpoint must be bound, except multi-token-prediction
// weights (transformers' _keys_to_ignore_on_load_unexpected "mtp.*"; DeepSeek's
// own exports put them at model.layers.<num_hidden_layers + i>): skipped by
// name, with a log line.
Status DeepseekV4Model::CheckUnused(const WeightStore& w,
                                    const std::vector<std::string>& read_raw) const {
  const int64_t first_mtp = config_.num_hidden_layers;
  const int64_t end_mtp = first_mtp + config_.num_nextn_predict_layers;
  std::vector<std::string> extra;
  int64_t skipped = 0;
  for (const std::string& name : UnusedTensors(w)) {
    if (std::find(read_raw.begin(), read_raw.end(), name) != read_raw.end()) continue;
    int64_t layer = -1;
    if (name.rfind("model.layers.", 0) == 0) {
      layer = std::atoll(name.substr(13, name.find('.', 13) - 13).c_str());
    }
    const bool mtp = name.rfind("mtp.", 0) == 0 || name.find(".mtp.") != std::string::npos ||
                     (layer >= first_mtp && layer < end_mtp);
    if (mtp && config_.num_nextn_predict_layers > 0) {
      ++skipped;
      continue;
    }
    extra.push_back(name);
  }
  if (config_.num_nextn_predict_layers > 0) {
    STRATA_LOG(INFO) << "deepseek_v4: " << config_.num_nextn_predict_layers
                     << " multi-token-prediction layer(s) in config.json not run (speculative "
                        "decoding with them is not implemented); skipped "
                     << skipped << " of their tensors in the checkpoint";
  }
  return RejectExtraTensors(extra, config_.architecture,
                            "is config.json for a different model or variant?");
}

void DeepseekV4Model::HcWeights(const HyperConnection& hc, const std::vector<float>& x, int64_t n,
                                std::vector<float>* post, std::vector<float>* comb,
                                std::vector<float>* collapsed) {
  const DeepseekV4Config& v = config_.v4;
  const int64_t N = v.hc_mult, H = config_.hidden_size, M = (2 + N) * N;
  const float eps = static_cast<float>(config_.rms_norm_eps), hc_eps = static_cast<float>(v.hc_eps);
  std::vector<float> flat(x.begin(), x.begin() + n * N * H), mix(static_cast<size_t>(n * M));
  for (int64_t t = 0; t < n; ++t) RmsNormRow(&flat[t * N * H], N * H, nullptr, eps);
  backend_.Linear(View(flat, n, N * H), hc.fn, nullptr, View(mix, n, M));
  post->assign(static_cast<size_t>(n * N), 0.f);
  comb->assign(static_cast<size_t>(n * N * N), 0.f);
  collapsed->assign(static_cast<size_t>(n * H), 0.f);
  for (int64_t t = 0; t < n; ++t) {
    const float* m = &mix[t * M];
    float* cb = &(*comb)[t * N * N];
    std::vector<float> pre(N);
    for (int64_t j = 0; j < N; ++j) {
      pre[j] = Sigmoid(m[j] * hc.scale[0] + hc.base[j]) + hc_eps;
      (*post)[t * N + j] = 2 * Sigmoid(m[N + j] * hc.scale[1] + hc.base[N + j]);
    }
    for (int64_t j = 0; j < N; ++j) {  // softmax over each row, + eps
      float mx = kNegInf;
      for (int64_t k = 0; k < N; ++k) {
        cb[j * N + k] = m[2 * N + j * N + k] * hc.scale[2] + hc.base[2 * N + j * N + k];
        mx = std::max(mx, cb[j * N + k]);
      }
      float sum = 0.f;
      for (int64_t k = 0; k < N; ++k) sum += cb[j * N + k] = std::exp(cb[j * N + k] - mx);
      for (int64_t k = 0; k < N; ++k) cb[j * N + k] = cb[j * N + k] / sum + hc_eps;
    }
    // Sinkhorn: columns, then (iters - 1) x (rows, columns).
    auto columns = [&] {
      for (int64_t k = 0; k < N; ++k) {
        float s = 0.f;
        for (int64_t j = 0; j < N; ++j) s += cb[j * N + k];
        for (int64_t j = 0; j < N; ++j) cb[j * N + k] /= s + hc_eps;
      }
    };
    columns();
    for (int64_t it = 1; it < v.hc_sinkhorn_iters; ++it) {
      for (int64_t j = 0; j < N; ++j) {
        float s = 0.f;
        for (int64_t k = 0; k < N; ++k) s += cb[j * N + k];
        for (int64_t k = 0; k < N; ++k) cb[j * N + k] /= s + hc_eps;
      }
      columns();
    }
    float* out = &(*collapsed)[t * H];
    for (int64_t j = 0; j < N; ++j)
      for (int64_t d = 0; d < H; ++d) out[d] += pre[j] * x[(t * N + j) * H + d];
  }
}

void DeepseekV4Model::HcMix(std::vector<float>& x, const std::vector<float>& y,
                            const std::vector<float>& post, const std::vector<float>& comb,
                            int64_t n) const {
  const int64_t N = config_.v4.hc_mult, H = config_.hidden_size;
  std::vector<float> mixed(static_cast<size_t>(N * H));
  for (int64_t t = 0; t < n; ++t) {
    const float* cb = &comb[t * N * N];
    for (int64_t k = 0; k < N; ++k) {
      for (int64_t d = 0; d < H; ++d) {
        float s = 0.f;
        for (int64_t j = 0; j < N; ++j) s += cb[j * N + k] * x[(t * N + j) * H + d];
        mixed[k * H + d] = post[t * N + k] * y[t * H + d] + s;
      }
    }
    std::copy(mixed.begin(), mixed.end(), x.begin() + t * N * H);
  }
}

void DeepseekV4Model::Compress(const Compressor& c, const ForwardBatch& batch,
                               const KvLayerView& inputs, const KvLayerView& entries,
                               const std::vector<float>& h, int64_t n,
                               const std::vector<float>& inv_freq) {
  const int64_t H = config_.hidden_size, width = c.overlap ? 2 * c.dim : c.dim, r = c.rate,
                D = c.dim;
  std::vector<float> kv(static_cast<size_t>(n * width)), gate(kv.size());
  backend_.Linear(View(h, n, H), c.kv, nullptr, View(kv, n, width));
  backend_.Linear(View(h, n, H), c.gate, nullptr, View(gate, n, width));
  for (int64_t i = 0; i < n; ++i) {
    // The compressor inputs are a windowed group (their own page tables).
    StoreRow(inputs, inputs.k, batch.WindowKvSlots()[i], width, &kv[i * width]);
    StoreRow(inputs, inputs.v, batch.WindowKvSlots()[i], width, &gate[i * width]);
  }
  const float eps = static_cast<float>(config_.rms_norm_eps);
  // Slots of a window: CSA reads the first series (Ca, [:D]) of the window
  // before and the second (Cb, [D:]) of its own; HCA its own tokens.
  const int64_t slots = c.overlap ? 2 * r : r;
  std::vector<float> skv(static_cast<size_t>(slots * D)), sg(skv.size()), row(width), grow(width),
      entry(D);
  RopeAngles angles;
  for (int32_t s = 0; s < batch.num_seqs; ++s) {
    const AttentionSeq& q = batch.seqs[s];          // the entries' pages
    const AttentionSeq& wq = batch.WindowSeqs()[s];  // the inputs' pages
    const int64_t first = (q.kv_len - q.q_len) / r, end = q.kv_len / r;
    for (int64_t e = first; e < end; ++e) {
      for (int64_t j = 0; j < slots; ++j) {
        const bool previous = c.overlap && j < r;
        const int64_t pos = previous ? (e - 1) * r + j : e * r + (c.overlap ? j - r : j);
        const int64_t half = c.overlap && !previous ? D : 0, ape_row = previous ? j : j % r;
        if (pos < 0) {  // window 0 has no previous window: weight 0
          std::fill(&skv[j * D], &skv[j * D] + D, 0.f);
          std::fill(&sg[j * D], &sg[j * D] + D, kNegInf);
          continue;
        }
        const int64_t slot = TokenSlot(wq, inputs.page_size, pos);
        LoadRow(inputs, inputs.k, slot, width, row.data());
        LoadRow(inputs, inputs.v, slot, width, grow.data());
        for (int64_t d = 0; d < D; ++d) {
          skv[j * D + d] = row[half + d];
          sg[j * D + d] = grow[half + d] + c.ape[ape_row * width + half + d];
        }
      }
      for (int64_t d = 0; d < D; ++d) {  // softmax over the slots, per channel
        float mx = kNegInf;
        for (int64_t j = 0; j < slots; ++j) mx = std::max(mx, sg[j * D + d]);
        float sum = 0.f;
        for (int64_t j = 0; j < slots; ++j) sum += std::exp(sg[j * D + d] - mx);
        float acc = 0.f;
        for (int64_t j = 0; j < slots; ++j)
          acc += skv[j * D + d] * (std::exp(sg[j * D + d] - mx) / sum);
        entry[d] = acc;
      }
      RmsNormRow(entry.data(), D, c.norm.data(), eps);
      angles.Set(inv_freq, e * r);
      RopeRow(entry.data(), D, angles, 1.f);
      StoreRow(entries, entries.k, EntrySlot(q, entries, e), D, entry.data());
    }
  }
}

void DeepseekV4Model::Select(const Layer& L, const ForwardBatch& batch,
                             const KvLayerView& index_keys, const std::vector<float>& h,
                             const std::vector<float>& q_residual, int64_t n,
                             std::vector<std::vector<int64_t>>* chosen) {
  const DeepseekV4Config& v = config_.v4;
  const int64_t H = config_.hidden_size, ih = v.index_n_heads, id = v.index_head_dim,
                r = v.csa_rate;
  std::vector<float> iq(static_cast<size_t>(n * ih * id)), wts(static_cast<size_t>(n * ih));
  backend_.Linear(View(q_residual, n, v.q_lora_rank), L.index_wq_b, nullptr, View(iq, n, ih * id));
  backend_.Linear(View(h, n, H), L.index_weights, nullptr, View(wts, n, ih));
  const float softmax_scale = 1.0f / std::sqrt(static_cast<float>(id)),
              weights_scale = 1.0f / std::sqrt(static_cast<float>(ih));
  chosen->assign(static_cast<size_t>(n), {});
  std::vector<float> keys, scores;
  std::vector<int64_t> top;
  RopeAngles angles;
  for (int32_t s = 0; s < batch.num_seqs; ++s) {
    const AttentionSeq& q = batch.seqs[s];
    const int64_t entries = q.kv_len / r;  // transformers: what the cache holds after this call
    keys.resize(static_cast<size_t>(entries * id));
    for (int64_t e = 0; e < entries; ++e)
      LoadRow(index_keys, index_keys.k, EntrySlot(q, index_keys, e), id, &keys[e * id]);
    const int64_t k = std::min<int64_t>(v.index_topk, entries);
    for (int64_t i = q.q_start; i < q.q_start + q.q_len; ++i) {
      const int64_t t = batch.positions[i], visible = (t + 1) / r;
      angles.Set(compress_inv_freq_, t);
      for (int64_t hd = 0; hd < ih; ++hd) RopeRow(&iq[(i * ih + hd) * id], id, angles, 1.f);
      if (entries == 0) continue;
      scores.assign(static_cast<size_t>(entries), 0.f);
      for (int64_t e = 0; e < entries; ++e) {
        if (e >= visible) {
          scores[e] = kNegInf;
          continue;
        }
        float sum = 0.f;
        for (int64_t hd = 0; hd < ih; ++hd) {
          const float dot = Dot(&iq[(i * ih + hd) * id], &keys[e * id], id);
          sum += std::max(dot, 0.f) * softmax_scale * (wts[i * ih + hd] * weights_scale);
        }
        scores[e] = sum;
      }
      TorchTopK(scores, k, &top);
      for (int64_t e : top)
        if (e < visible) (*chosen)[i].push_back(e);
      std::sort((*chosen)[i].begin(), (*chosen)[i].end());
    }
  }
}

void DeepseekV4Model::Attention(const Layer& L, const ForwardBatch& batch, const LayerKv& kv,
                                const std::vector<float>& h, int64_t n,
                                std::vector<float>* out) {
  const DeepseekV4Config& v = config_.v4;
  const int64_t H = config_.hidden_size, nh = config_.num_attention_heads,
                hd = config_.head_dim, ql = v.q_lora_rank, W = config_.sliding_window;
  const float eps = static_cast<float>(config_.rms_norm_eps);
  const std::vector<float>& inv_freq =
      L.kind == Kind::kSliding ? main_inv_freq_ : compress_inv_freq_;
  std::vector<float> qr(static_cast<size_t>(n * ql)), q(static_cast<size_t>(n * nh * hd)),
      kvr(static_cast<size_t>(n * hd));
  backend_.Linear(View(h, n, H), L.wq_a, nullptr, View(qr, n, ql));
  backend_.RmsNorm(View(qr, n, ql), L.q_norm, eps, View(qr, n, ql));
  backend_.Linear(View(qr, n, ql), L.wq_b, nullptr, View(q, n, nh * hd));
  backend_.Linear(View(h, n, H), L.wkv, nullptr, View(kvr, n, hd));
  backend_.RmsNorm(View(kvr, n, hd), L.kv_norm, eps, View(kvr, n, hd));
  RopeAngles angles;
  for (int64_t i = 0; i < n; ++i) {
    angles.Set(inv_freq, batch.positions[i]);
    for (int64_t a = 0; a < nh; ++a) {
      RmsNormRow(&q[(i * nh + a) * hd], hd, nullptr, eps);
      RopeRow(&q[(i * nh + a) * hd], hd, angles, 1.f);
    }
    RopeRow(&kvr[i * hd], hd, angles, 1.f);
    StoreRow(*kv.sliding, kv.sliding->k, batch.WindowKvSlots()[i], hd, &kvr[i * hd]);
  }

  std::vector<std::vector<int64_t>> chosen;
  if (L.kind != Kind::kSliding) {
    Compress(L.comp, batch, *kv.inputs, *kv.entries, h, n, compress_inv_freq_);
  }
  if (L.kind == Kind::kCompressedSparse) {
    Compress(L.index_comp, batch, *kv.index_inputs, *kv.index_keys, h, n, compress_inv_freq_);
    Select(L, batch, *kv.index_keys, h, qr, n, &chosen);
  }

  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  std::vector<float> attn(static_cast<size_t>(n * nh * hd), 0.f), keys, logits;
  for (int32_t s = 0; s < batch.num_seqs; ++s) {
    const AttentionSeq& sq = batch.seqs[s];           // the entries' pages
    const AttentionSeq& wsq = batch.WindowSeqs()[s];  // the sliding window's
    for (int64_t i = sq.q_start; i < sq.q_start + sq.q_len; ++i) {
      const int64_t t = batch.positions[i];
      // Keys: the window's tokens, then the compressed entries it may read.
      std::vector<int64_t> entries;
      if (L.kind == Kind::kCompressedSparse) {
        entries = chosen[i];
      } else if (L.kind == Kind::kHeavilyCompressed) {
        for (int64_t e = 0; e < (t + 1) / v.hca_rate; ++e) entries.push_back(e);
      }
      const int64_t lo = std::max<int64_t>(0, t - W + 1), nwin = t - lo + 1;
      const int64_t nk = nwin + static_cast<int64_t>(entries.size());
      keys.resize(static_cast<size_t>(nk * hd));
      for (int64_t p = lo; p <= t; ++p)
        LoadRow(*kv.sliding, kv.sliding->k, TokenSlot(wsq, kv.sliding->page_size, p), hd,
                &keys[(p - lo) * hd]);
      for (size_t x = 0; x < entries.size(); ++x)
        LoadRow(*kv.entries, kv.entries->k, EntrySlot(sq, *kv.entries, entries[x]), hd,
                &keys[(nwin + x) * hd]);
      logits.resize(static_cast<size_t>(nk));
      angles.Set(inv_freq, t);
      for (int64_t a = 0; a < nh; ++a) {
        const float* qh = &q[(i * nh + a) * hd];
        float mx = L.sinks[a];
        for (int64_t j = 0; j < nk; ++j) {
          logits[j] = Dot(qh, &keys[j * hd], hd) * scale;
          mx = std::max(mx, logits[j]);
        }
        float sum = std::exp(L.sinks[a] - mx);
        for (int64_t j = 0; j < nk; ++j) sum += logits[j] = std::exp(logits[j] - mx);
        float* o = &attn[(i * nh + a) * hd];
        for (int64_t j = 0; j < nk; ++j) logits[j] /= sum;
        AddWeightedRows(logits.data(), keys.data(), nk, hd, o);
        RopeRow(o, hd, angles, -1.f);  // K=V carried the rotation into the output
      }
    }
  }

  // Grouped low-rank output projection.
  const int64_t per = nh * hd / v.o_groups, ol = v.o_lora_rank;
  std::vector<float> grouped(static_cast<size_t>(n * v.o_groups * ol));
  Tensor at = View(attn, n, nh * hd), gt = View(grouped, n, v.o_groups * ol);
  for (int64_t g = 0; g < v.o_groups; ++g)
    backend_.Linear(at.Cols(g * per, per), L.wo_a.Rows(g * ol, ol), nullptr, gt.Cols(g * ol, ol));
  out->assign(static_cast<size_t>(n * H), 0.f);
  backend_.Linear(gt, L.wo_b, nullptr, View(*out, n, H));
}

// gate = min(x w1, limit), up = clamp(x w3, +-limit), out = (silu(gate) * up) w2.
void DeepseekV4Model::RunMlp(const Mlp& m, const std::vector<float>& x, int64_t n,
                             std::vector<float>* out) {
  const int64_t H = config_.hidden_size, I = config_.moe.moe_intermediate_size;
  const float limit = static_cast<float>(config_.v4.swiglu_limit);
  std::vector<float> gate(static_cast<size_t>(n * I)), up(gate.size());
  backend_.Linear(View(x, n, H), m.gate, nullptr, View(gate, n, I));
  backend_.Linear(View(x, n, H), m.up, nullptr, View(up, n, I));
  for (size_t i = 0; i < gate.size(); ++i) {
    const float g = std::min(gate[i], limit), u = std::clamp(up[i], -limit, limit);
    gate[i] = g / (1.0f + std::exp(-g)) * u;
  }
  out->assign(static_cast<size_t>(n * H), 0.f);
  backend_.Linear(View(gate, n, I), m.down, nullptr, View(*out, n, H));
}

void DeepseekV4Model::Moe(const Layer& L, const ForwardBatch& batch, const std::vector<float>& h,
                          int64_t n, std::vector<float>* out) {
  const MoeConfig& e = config_.moe;
  const int64_t H = config_.hidden_size, E = e.n_routed_experts, K = e.num_experts_per_tok;
  std::vector<float> logits(static_cast<size_t>(n * E));
  backend_.Linear(View(h, n, H), L.router, nullptr, View(logits, n, E));
  std::vector<std::vector<std::pair<int64_t, float>>> routed(E);
  std::vector<float> scores(E);
  std::vector<int64_t> order(E);
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t x = 0; x < E; ++x) {
      const float l = logits[t * E + x];
      // torch softplus: x above its threshold 20, else log1p(exp(x)).
      scores[x] = e.scoring_func == "sigmoid" ? Sigmoid(l)
                                              : std::sqrt(l > 20.f ? l : std::log1p(std::exp(l)));
    }
    if (L.hash) {
      const int32_t tok = batch.token_ids[t];
      for (int64_t k = 0; k < K; ++k) order[k] = L.tid2eid[tok * K + k];
    } else {
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
        return scores[a] + L.router_bias[a] > scores[b] + L.router_bias[b];
      });
    }
    float sum = 0.f;
    for (int64_t k = 0; k < K; ++k) sum += scores[order[k]];
    for (int64_t k = 0; k < K; ++k) {
      const float w = scores[order[k]] / (sum + 1e-20f) * static_cast<float>(e.routed_scaling_factor);
      routed[order[k]].emplace_back(t, w);
    }
  }
  // Experts in index order add into zeros, then the shared expert (as the reference).
  std::vector<float> routed_out(static_cast<size_t>(n * H), 0.f), xe, ye;
  for (int64_t x = 0; x < E; ++x) {
    const auto& rows = routed[x];
    if (rows.empty()) continue;
    const int64_t m = static_cast<int64_t>(rows.size());
    xe.resize(static_cast<size_t>(m * H));
    for (int64_t r = 0; r < m; ++r)
      std::copy(&h[rows[r].first * H], &h[rows[r].first * H] + H, &xe[r * H]);
    RunMlp(L.experts[x], xe, m, &ye);
    for (int64_t r = 0; r < m; ++r)
      for (int64_t d = 0; d < H; ++d) routed_out[rows[r].first * H + d] += ye[r * H + d] * rows[r].second;
  }
  RunMlp(L.shared, h, n, out);
  for (size_t i = 0; i < out->size(); ++i) (*out)[i] = routed_out[i] + (*out)[i];
}

Status DeepseekV4Model::Forward(const ForwardBatch& batch, std::span<const KvLayerView> kv,
                                Tensor logits) {
  const int64_t n = batch.num_tokens;
  if (n <= 0 || n > options_.max_batch_tokens)
    return Internal("Forward: " + std::to_string(n) + " tokens, workspace holds " +
                    std::to_string(options_.max_batch_tokens));
  const size_t views = static_cast<size_t>(config_.num_hidden_layers + 4 * num_csa_ + 2 * num_hca_);
  if (kv.size() != views)
    return Internal("Forward: " + std::to_string(kv.size()) + " KV views, the layout has " +
                    std::to_string(views));
  const int64_t H = config_.hidden_size, N = config_.v4.hc_mult;
  const float eps = static_cast<float>(config_.rms_norm_eps);
  std::vector<float> emb(static_cast<size_t>(n * H)), x(static_cast<size_t>(n * N * H));
  backend_.Embedding(embed_, batch.token_ids, View(emb, n, H));
  for (int64_t t = 0; t < n; ++t)
    for (int64_t j = 0; j < N; ++j) std::copy(&emb[t * H], &emb[t * H] + H, &x[(t * N + j) * H]);
  std::vector<float> post, comb, collapsed, y;
  for (size_t l = 0; l < layers_.size(); ++l) {
    const Layer& L = layers_[l];
    HcWeights(L.hc_attn, x, n, &post, &comb, &collapsed);
    backend_.RmsNorm(View(collapsed, n, H), L.attn_norm, eps, View(collapsed, n, H));
    Attention(L, batch, ViewsOf(l, kv), collapsed, n, &y);
    HcMix(x, y, post, comb, n);
    HcWeights(L.hc_ffn, x, n, &post, &comb, &collapsed);
    backend_.RmsNorm(View(collapsed, n, H), L.ffn_norm, eps, View(collapsed, n, H));
    Moe(L, batch, collapsed, n, &y);
    HcMix(x, y, post, comb, n);
  }
  // Final collapse of the streams (hc_head: sigmoid weights, no Sinkhorn).
  std::vector<float> flat(x), mix(static_cast<size_t>(n * N)), head(static_cast<size_t>(n * H), 0.f);
  for (int64_t t = 0; t < n; ++t) RmsNormRow(&flat[t * N * H], N * H, nullptr, eps);
  backend_.Linear(View(flat, n, N * H), hc_head_.fn, nullptr, View(mix, n, N));
  for (int64_t t = 0; t < n; ++t)
    for (int64_t j = 0; j < N; ++j) {
      const float pre = Sigmoid(mix[t * N + j] * hc_head_.scale[0] + hc_head_.base[j]) +
                        static_cast<float>(config_.v4.hc_eps);
      for (int64_t d = 0; d < H; ++d) head[t * H + d] += pre * x[(t * N + j) * H + d];
    }
  std::vector<float> last(static_cast<size_t>(std::max<int32_t>(batch.num_logit_rows, 1) * H));
  LogitsOfRows(backend_, View(head, n, H), batch, final_norm_, lm_head_, eps,
               View(last, batch.num_logit_rows, H), logits);
  return OkStatus();
}

}  // namespace

StatusOr<std::unique_ptr<Model>> CreateDeepseekV4(const ModelConfig& c, WeightStore& w, Backend& b,
                                                  const ModelOptions& o) {
  auto model = std::make_unique<DeepseekV4Model>(c, b, o);
  RETURN_IF_ERROR(model->Init(w));
  return std::unique_ptr<Model>(std::move(model));
}

KvLayout DeepseekV4KvLayout(const ModelConfig& c, int page_size, DType dtype) {
  return DeepseekV4Layout(c, page_size, dtype);
}

}  // namespace strata
