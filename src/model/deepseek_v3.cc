// DeepseekV3ForCausalLM: multi-head latent attention (MLA) and a
// mixture-of-experts MLP, as transformers 5's modeling_deepseek_v3.py.
//
// Attention runs in the absorbed form (DeepSeek-V2 paper; what SGLang and
// vLLM run): per token the KV cache holds only the normalised latent c
// (kv_lora_rank) and the rotated shared key k_rot (qk_rope_head_dim): one
// K-only pool group, "mla_latent". With kv_b_proj split per head h into
// W_uk_h [nope, kv_lora] and W_uv_h [v_head, kv_lora],
//   q_h . k_h(s) = (W_uk_h^T q_nope_h) . c_s + q_rot_h . k_rot_s
//   v_h(s)       = W_uv_h c_s, so  out_h = W_uv_h (sum_s p_h(s) c_s),
// which is multi-query attention over rows [c | k_rot] (one KV head of
// kv_lora + rope dims) whose values are the same rows; only the first
// kv_lora dims of each head's output are used. Equal to transformers'
// expanded form up to float rounding.
//
// MoE layers (from first_k_dense_replace on): sigmoid router scores plus
// e_score_correction_bias choose topk_group of n_group expert groups (a
// group scores the sum of its best two), then num_experts_per_tok experts
// among them; the weights are the uncorrected scores, normalised when
// norm_topk_prob, times routed_scaling_factor. Routing is computed on the
// host from the router logits (one small copy per MoE layer); each expert
// runs on the rows routed to it and adds them back (ScaleAddRows), after
// the shared experts' output.
//
// Multi-token-prediction layers (model.layers.<num_hidden_layers + i>, as
// DeepSeek ships them) are skipped explicitly when num_nextn_predict_layers
// says they exist; any other extra tensor is an error.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "model/model.h"
#include "model/model_parts.h"
#include "model/rope.h"
#include "model/weights.h"
#include "util/logging.h"

namespace strata {
namespace {

constexpr char kLatentGroup[] = "mla_latent";

struct Mlp {
  Tensor gate, up, down;
};

struct Layer {
  Tensor input_norm, post_norm;
  // Attention.
  Tensor q, q_a, q_a_bias, q_a_norm, q_b;  // q (no q low-rank) or q_a -> norm -> q_b
  Tensor kv_a, kv_a_bias, kv_a_norm, kv_b;
  Tensor uk_t;  // [heads * kv_lora, nope]: W_uk_h^T stacked (an owned copy)
  Tensor o, o_bias;
  // MLP: dense, or MoE (router + experts + shared).
  bool moe = false;
  Mlp dense;
  Tensor router;
  std::vector<float> router_bias;  // e_score_correction_bias, host
  std::vector<Mlp> experts;
  Mlp shared;  // rows 0 when n_shared_experts == 0
};

float LoadFloat(const Tensor& t, int64_t i) {
  switch (t.dtype) {
    case DType::kF32:
      return static_cast<const float*>(t.data)[i];
    case DType::kBF16:
      return Bf16ToFloat(static_cast<const uint16_t*>(t.data)[i]);
    case DType::kF16:
      return F16ToFloat(static_cast<const uint16_t*>(t.data)[i]);
    default:
      return 0.f;
  }
}

class DeepseekV3Model final : public Model {
 public:
  DeepseekV3Model(const ModelConfig& config, Backend& backend, const ModelOptions& options)
      : config_(config), backend_(backend), options_(options) {}

  Status Init(WeightStore& w);

  const ModelConfig& config() const override { return config_; }
  KvLayout kv_layout(int page_size, DType dtype) const override;
  int32_t max_batch_tokens() const override { return options_.max_batch_tokens; }
  Status Forward(const ForwardBatch& batch, std::span<const KvLayerView> kv,
                 Tensor logits) override;

 private:
  StatusOr<Tensor> Bind(WeightStore& w, const std::string& name, std::vector<int64_t> shape) {
    ASSIGN_OR_RETURN(Tensor host, w.Get(name, shape));
    return backend_.UploadWeight(host);
  }
  StatusOr<Mlp> BindMlp(WeightStore& w, const std::string& p, int64_t inter);
  Status BindAbsorbed(WeightStore& w, const std::string& p, Layer& L);
  Status CheckUnused(const WeightStore& w) const;
  Tensor Scratch(int i, int64_t rows, int64_t cols) const {
    return buffers_[i].AsTensor(DType::kF32, rows, cols);
  }
  void Attention(const Layer& L, const ForwardBatch& batch, const KvLayerView& kv, int64_t n);
  void RunMlp(const Mlp& m, const Tensor& in, Tensor out, int64_t n);
  void Moe(const Layer& L, int64_t n);

  ModelConfig config_;
  Backend& backend_;
  ModelOptions options_;
  Tensor embed_, final_norm_, lm_head_;
  std::vector<Layer> layers_;
  std::vector<std::vector<uint8_t>> owned_;  // absorbed weights (host; CPU uses them in place)
  std::vector<float> inv_freq_;
  RopeParams q_rope_, k_rope_;
  float attn_scale_ = 1.f;
  int64_t max_inter_ = 0;
  std::vector<float> host_logits_;   // router logits, [T, experts]
  std::vector<int32_t> host_rows_;   // per expert: the rows routed to it
  std::vector<float> host_weights_;  // ... and their weights
  std::vector<Buffer> buffers_;      // see enum Buf
  enum Buf {
    kX,
    kH,
    kQa,
    kQ,
    kKv,
    kQAbs,
    kAttn,
    kVOut,
    kOut,
    kGate,
    kUp,
    kRouter,
    kXe,
    kYe,
    kRouteRows,
    kRouteWeights,
    kIdentity,
    kZeros,
    kLast,
    kNumBufs
  };
};

KvLayout DeepseekV3Layout(const ModelConfig& c, int page_size, DType dtype) {
  KvLayout layout;
  layout.page_size = page_size;
  PoolGroupSpec g;
  g.name = kLatentGroup;
  g.num_layers = static_cast<int>(c.num_hidden_layers);
  g.num_kv_heads = 1;
  g.head_dim = static_cast<int>(c.mla.kv_lora_rank + c.mla.qk_rope_head_dim);
  g.dtype = dtype;
  g.has_v = false;
  layout.groups.push_back(g);
  return layout;
}

KvLayout DeepseekV3Model::kv_layout(int page_size, DType dtype) const {
  return DeepseekV3Layout(config_, page_size, dtype);
}

StatusOr<Mlp> DeepseekV3Model::BindMlp(WeightStore& w, const std::string& p, int64_t inter) {
  const int64_t H = config_.hidden_size;
  Mlp m;
  ASSIGN_OR_RETURN(m.gate, Bind(w, p + "gate_proj.weight", {inter, H}));
  ASSIGN_OR_RETURN(m.up, Bind(w, p + "up_proj.weight", {inter, H}));
  ASSIGN_OR_RETURN(m.down, Bind(w, p + "down_proj.weight", {H, inter}));
  return m;
}

// kv_b_proj [heads * (nope + v), kv_lora]: the V rows are used in place
// (views), the K rows transposed once into uk_t so that absorbing q is a
// plain Linear per head.
Status DeepseekV3Model::BindAbsorbed(WeightStore& w, const std::string& p, Layer& L) {
  const MlaConfig& m = config_.mla;
  const int64_t nh = config_.num_attention_heads, nope = m.qk_nope_head_dim, lat = m.kv_lora_rank,
                vd = m.v_head_dim;
  const std::string name = p + "self_attn.kv_b_proj.weight";
  ASSIGN_OR_RETURN(Tensor host, w.Get(name, {nh * (nope + vd), lat}));
  ASSIGN_OR_RETURN(L.kv_b, backend_.UploadWeight(host));
  const size_t esz = DTypeSize(host.dtype);
  std::vector<uint8_t>& t = owned_.emplace_back(static_cast<size_t>(nh * lat * nope) * esz);
  const auto* src = static_cast<const uint8_t*>(host.data);
  for (int64_t h = 0; h < nh; ++h) {
    for (int64_t r = 0; r < nope; ++r) {   // row r of W_uk_h
      for (int64_t c = 0; c < lat; ++c) {  // becomes column r of uk_t's block h
        const int64_t from = (h * (nope + vd) + r) * lat + c;
        const int64_t to = (h * lat + c) * nope + r;
        std::memcpy(&t[to * esz], &src[from * esz], esz);
      }
    }
  }
  Tensor uk{t.data(), host.dtype, nh * lat, nope, 0};
  ASSIGN_OR_RETURN(L.uk_t, backend_.UploadWeight(uk));
  return OkStatus();
}

Status DeepseekV3Model::Init(WeightStore& w) {
  const ModelConfig& c = config_;
  const MlaConfig& m = c.mla;
  const MoeConfig& e = c.moe;
  const int64_t H = c.hidden_size, V = c.vocab_size, nh = c.num_attention_heads;
  const int64_t qk = m.qk_nope_head_dim + m.qk_rope_head_dim, lat = m.kv_lora_rank,
                rope = m.qk_rope_head_dim;
  if (lat + rope > 576) {
    return Unimplemented(
        "config.json: kv_lora_rank + qk_rope_head_dim = " + std::to_string(lat + rope) +
        " is more than the attention kernels support (576)");
  }
  if (c.hidden_act != "silu") {
    return Unimplemented("config.json: hidden_act '" + c.hidden_act +
                         "' is not supported (supported: silu)");
  }
  ASSIGN_OR_RETURN(embed_, Bind(w, "model.embed_tokens.weight", {V, H}));
  ASSIGN_OR_RETURN(final_norm_, Bind(w, "model.norm.weight", {H}));
  if (c.tie_word_embeddings) {
    lm_head_ = embed_;
  } else {
    ASSIGN_OR_RETURN(lm_head_, Bind(w, "lm_head.weight", {V, H}));
  }
  max_inter_ = c.intermediate_size;
  layers_.resize(c.num_hidden_layers);
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    const std::string a = p + "self_attn.";
    Layer& L = layers_[i];
    ASSIGN_OR_RETURN(L.input_norm, Bind(w, p + "input_layernorm.weight", {H}));
    ASSIGN_OR_RETURN(L.post_norm, Bind(w, p + "post_attention_layernorm.weight", {H}));
    if (m.q_lora_rank > 0) {
      ASSIGN_OR_RETURN(L.q_a, Bind(w, a + "q_a_proj.weight", {m.q_lora_rank, H}));
      if (c.attention_bias) {
        ASSIGN_OR_RETURN(L.q_a_bias, Bind(w, a + "q_a_proj.bias", {m.q_lora_rank}));
      }
      ASSIGN_OR_RETURN(L.q_a_norm, Bind(w, a + "q_a_layernorm.weight", {m.q_lora_rank}));
      ASSIGN_OR_RETURN(L.q_b, Bind(w, a + "q_b_proj.weight", {nh * qk, m.q_lora_rank}));
    } else {
      ASSIGN_OR_RETURN(L.q, Bind(w, a + "q_proj.weight", {nh * qk, H}));
    }
    ASSIGN_OR_RETURN(L.kv_a, Bind(w, a + "kv_a_proj_with_mqa.weight", {lat + rope, H}));
    if (c.attention_bias) {
      ASSIGN_OR_RETURN(L.kv_a_bias, Bind(w, a + "kv_a_proj_with_mqa.bias", {lat + rope}));
    }
    ASSIGN_OR_RETURN(L.kv_a_norm, Bind(w, a + "kv_a_layernorm.weight", {lat}));
    RETURN_IF_ERROR(BindAbsorbed(w, p, L));
    ASSIGN_OR_RETURN(L.o, Bind(w, a + "o_proj.weight", {H, nh * m.v_head_dim}));
    if (c.attention_bias) {
      ASSIGN_OR_RETURN(L.o_bias, Bind(w, a + "o_proj.bias", {H}));
    }

    L.moe = i >= e.first_k_dense_replace;
    if (!L.moe) {
      ASSIGN_OR_RETURN(L.dense, BindMlp(w, p + "mlp.", c.intermediate_size));
      continue;
    }
    const int64_t E = e.n_routed_experts, I = e.moe_intermediate_size;
    ASSIGN_OR_RETURN(L.router, Bind(w, p + "mlp.gate.weight", {E, H}));
    ASSIGN_OR_RETURN(Tensor bias, w.Get(p + "mlp.gate.e_score_correction_bias", {E}));
    L.router_bias.resize(E);
    for (int64_t x = 0; x < E; ++x) L.router_bias[x] = LoadFloat(bias, x);
    if (e.n_shared_experts > 0) {
      ASSIGN_OR_RETURN(L.shared, BindMlp(w, p + "mlp.shared_experts.", I * e.n_shared_experts));
      max_inter_ = std::max(max_inter_, I * e.n_shared_experts);
    }
    L.experts.resize(E);
    // DeepSeek's checkpoints (and transformers' save_pretrained) store each
    // expert; transformers' in-memory fused layout is accepted too.
    const std::string fused = p + "mlp.experts.gate_up_proj";
    if (w.Find(fused)) {
      ASSIGN_OR_RETURN(Tensor gu, Bind(w, fused, {E, 2 * I, H}));
      ASSIGN_OR_RETURN(Tensor down, Bind(w, p + "mlp.experts.down_proj", {E, H, I}));
      for (int64_t x = 0; x < E; ++x) {
        L.experts[x].gate = gu.Rows(x * 2 * I, I);
        L.experts[x].up = gu.Rows(x * 2 * I + I, I);
        L.experts[x].down = down.Rows(x * H, H);
      }
    } else {
      for (int64_t x = 0; x < E; ++x) {
        ASSIGN_OR_RETURN(L.experts[x], BindMlp(w, p + "mlp.experts." + std::to_string(x) + ".", I));
      }
    }
    max_inter_ = std::max(max_inter_, I);
  }
  RETURN_IF_ERROR(CheckUnused(w));

  ASSIGN_OR_RETURN(inv_freq_, ComputeInvFreq(c.rope, static_cast<int>(rope)));
  q_rope_.inv_freq = inv_freq_.data();
  q_rope_.head_dim = static_cast<int32_t>(qk);
  q_rope_.rotary_dim = static_cast<int32_t>(rope);
  q_rope_.rotary_offset = static_cast<int32_t>(m.qk_nope_head_dim);
  q_rope_.interleaved = m.rope_interleave;
  q_rope_.attention_scaling = RopeAttentionScaling(c.rope);
  k_rope_ = q_rope_;
  k_rope_.head_dim = static_cast<int32_t>(rope);
  k_rope_.rotary_offset = 0;
  // transformers' yarn_apply_mscale: any scaled rope with mscale_all_dim
  // multiplies the softmax scale by mscale(factor, mscale_all_dim)^2.
  double scale = 1.0 / std::sqrt(static_cast<double>(qk));
  if (c.rope.type != "default" && c.rope.mscale_all_dim != 0) {
    const double ms = YarnMscale(c.rope.factor, c.rope.mscale_all_dim);
    scale *= ms * ms;
  }
  attn_scale_ = static_cast<float>(scale);

  const int64_t T = options_.max_batch_tokens, E = std::max<int64_t>(e.n_routed_experts, 1),
                K = std::max<int64_t>(e.num_experts_per_tok, 1);
  const int64_t widths[kNumBufs] = {H,
                                    H,
                                    std::max<int64_t>(m.q_lora_rank, 1),
                                    nh * qk,
                                    lat + rope,
                                    nh * (lat + rope),
                                    nh * (lat + rope),
                                    nh * m.v_head_dim,
                                    H,
                                    max_inter_,
                                    max_inter_,
                                    E,
                                    H,
                                    H,
                                    K,
                                    K,
                                    1,
                                    H,
                                    H};
  buffers_.resize(kNumBufs);
  for (int b = 0; b < kNumBufs; ++b) {
    ASSIGN_OR_RETURN(buffers_[b],
                     backend_.Allocate(static_cast<size_t>(T * widths[b]) * sizeof(float)));
  }
  std::vector<int32_t> identity(T);
  std::iota(identity.begin(), identity.end(), 0);
  backend_.CopyToDevice(buffers_[kIdentity].data(), identity.data(), T * sizeof(int32_t));
  std::vector<float> zeros(static_cast<size_t>(T * H), 0.f);
  backend_.CopyToDevice(buffers_[kZeros].data(), zeros.data(), zeros.size() * sizeof(float));
  host_logits_.resize(T * E);
  host_rows_.resize(T * K);
  host_weights_.resize(T * K);
  return OkStatus();
}

// Everything in the checkpoint must be bound, except the multi-token-
// prediction layers config.json announces (num_nextn_predict_layers), which
// this engine does not run: skipped by name, with a log line.
Status DeepseekV3Model::CheckUnused(const WeightStore& w) const {
  const int64_t first_mtp = config_.num_hidden_layers;
  const int64_t end_mtp = first_mtp + config_.num_nextn_predict_layers;
  std::vector<std::string> extra;
  int64_t skipped = 0;
  for (const std::string& name : UnusedTensors(w)) {
    int64_t layer = -1;
    if (name.rfind("model.layers.", 0) == 0) {
      const size_t dot = name.find('.', 13);
      layer = std::atoll(name.substr(13, dot - 13).c_str());
    }
    if (layer >= first_mtp && layer < end_mtp) {
      ++skipped;
      continue;
    }
    extra.push_back(name);
  }
  if (skipped > 0) {
    STRATA_LOG(INFO) << "deepseek_v3: skipping " << skipped << " tensors of "
                     << config_.num_nextn_predict_layers
                     << " multi-token-prediction layer(s) (model.layers." << first_mtp
                     << (end_mtp - first_mtp > 1 ? "-" + std::to_string(end_mtp - 1) : "")
                     << "): speculative decoding with them is not implemented";
  }
  return RejectExtraTensors(extra, config_.architecture,
                            "is config.json for a different model or variant? layers past "
                            "num_hidden_layers are accepted only as num_nextn_predict_layers");
}

void DeepseekV3Model::Attention(const Layer& L, const ForwardBatch& batch, const KvLayerView& kv,
                                int64_t n) {
  const MlaConfig& m = config_.mla;
  const int64_t nh = config_.num_attention_heads, nope = m.qk_nope_head_dim,
                rope = m.qk_rope_head_dim, qk = nope + rope, lat = m.kv_lora_rank, row = lat + rope,
                vd = m.v_head_dim, H = config_.hidden_size;
  const float eps = static_cast<float>(config_.rms_norm_eps);
  auto bias = [](const Tensor& t) { return t.data ? &t : nullptr; };
  Tensor h = Scratch(kH, n, H), q = Scratch(kQ, n, nh * qk), kvt = Scratch(kKv, n, row),
         qabs = Scratch(kQAbs, n, nh * row), attn = Scratch(kAttn, n, nh * row),
         vout = Scratch(kVOut, n, nh * vd), out = Scratch(kOut, n, H);
  if (m.q_lora_rank > 0) {
    Tensor qa = Scratch(kQa, n, m.q_lora_rank);
    backend_.Linear(h, L.q_a, bias(L.q_a_bias), qa);
    backend_.RmsNorm(qa, L.q_a_norm, eps, qa);
    backend_.Linear(qa, L.q_b, nullptr, q);
  } else {
    backend_.Linear(h, L.q, nullptr, q);
  }
  backend_.Linear(h, L.kv_a, bias(L.kv_a_bias), kvt);
  Tensor latent = kvt.Cols(0, lat);
  backend_.RmsNorm(latent, L.kv_a_norm, eps, latent);
  const Tensor none{nullptr, DType::kF32, n, 0, 0};
  backend_.Rope(q, none, batch.positions, q_rope_);
  backend_.Rope(kvt.Cols(lat, rope), none, batch.positions, k_rope_);
  backend_.StoreKv(kvt, kvt, kv, batch.kv_slots);

  // Absorbed queries: per head [W_uk_h^T q_nope_h | q_rot_h].
  const int32_t* identity = static_cast<const int32_t*>(buffers_[kIdentity].data());
  for (int64_t hd = 0; hd < nh; ++hd) {
    backend_.Linear(q.Cols(hd * qk, nope), L.uk_t.Rows(hd * lat, lat), nullptr,
                    qabs.Cols(hd * row, lat));
    backend_.GatherRows(q.Cols(hd * qk + nope, rope), identity, qabs.Cols(hd * row + lat, rope));
  }
  KvLayerView values = kv;
  values.v = kv.k;
  AttentionParams ap;
  ap.num_heads = static_cast<int32_t>(nh);
  ap.num_kv_heads = 1;
  ap.head_dim = static_cast<int32_t>(row);
  ap.scale = attn_scale_;
  ap.max_kv_len = batch.max_kv_len;
  backend_.PagedAttention(qabs, values, batch.seqs, batch.num_seqs, ap, attn);
  for (int64_t hd = 0; hd < nh; ++hd) {
    backend_.Linear(attn.Cols(hd * row, lat), L.kv_b.Rows(hd * (nope + vd) + nope, vd), nullptr,
                    vout.Cols(hd * vd, vd));
  }
  backend_.Linear(vout, L.o, bias(L.o_bias), out);
}

void DeepseekV3Model::RunMlp(const Mlp& m, const Tensor& in, Tensor out, int64_t n) {
  Tensor gate = Scratch(kGate, n, m.gate.rows), up = Scratch(kUp, n, m.gate.rows);
  backend_.Linear(in, m.gate, nullptr, gate);
  backend_.Linear(in, m.up, nullptr, up);
  backend_.SiluMul(gate, up, gate);
  backend_.Linear(gate, m.down, nullptr, out);
}

void DeepseekV3Model::Moe(const Layer& L, int64_t n) {
  const MoeConfig& e = config_.moe;
  const int64_t H = config_.hidden_size, E = e.n_routed_experts, K = e.num_experts_per_tok,
                G = e.n_group, per_group = E / G;
  Tensor h = Scratch(kH, n, H), out = Scratch(kOut, n, H), logits = Scratch(kRouter, n, E);
  // transformers: F.linear(hidden.float(), weight.float()), as Linear does.
  backend_.Linear(h, L.router, nullptr, logits);
  if (L.shared.gate.data) {
    RunMlp(L.shared, h, out, n);
  } else {
    backend_.GatherRows(Scratch(kZeros, n, H),
                        static_cast<const int32_t*>(buffers_[kIdentity].data()), out);
  }
  backend_.CopyToHost(host_logits_.data(), logits.data, static_cast<size_t>(n * E) * sizeof(float));

  // Route every token (float32 throughout, as the reference).
  std::vector<std::vector<std::pair<int32_t, float>>> routed(E);
  std::vector<float> scores(E), choice(E), group_score(G);
  std::vector<int> order(std::max(E, G));
  for (int64_t t = 0; t < n; ++t) {
    const float* lg = &host_logits_[t * E];
    for (int64_t x = 0; x < E; ++x) {
      scores[x] = 1.0f / (1.0f + std::exp(-lg[x]));
      choice[x] = scores[x] + L.router_bias[x];
    }
    for (int64_t g = 0; g < G; ++g) {  // a group scores the sum of its best two
      float a = -std::numeric_limits<float>::infinity(), b = a;
      for (int64_t x = g * per_group; x < (g + 1) * per_group; ++x) {
        if (choice[x] > a) {
          b = a;
          a = choice[x];
        } else if (choice[x] > b) {
          b = choice[x];
        }
      }
      group_score[g] = a + b;
    }
    // Best topk_group groups (ties to the lower index); other experts out.
    std::iota(order.begin(), order.begin() + G, 0);
    std::stable_sort(order.begin(), order.begin() + G,
                     [&](int x, int y) { return group_score[x] > group_score[y]; });
    std::vector<bool> keep(G, false);
    for (int64_t g = 0; g < e.topk_group; ++g) keep[order[g]] = true;
    for (int64_t x = 0; x < E; ++x) {
      if (!keep[x / per_group]) choice[x] = -std::numeric_limits<float>::infinity();
    }
    std::iota(order.begin(), order.begin() + E, 0);
    std::stable_sort(order.begin(), order.begin() + E,
                     [&](int x, int y) { return choice[x] > choice[y]; });
    float sum = 0.f;
    for (int64_t k = 0; k < K; ++k) sum += scores[order[k]];
    for (int64_t k = 0; k < K; ++k) {
      float wgt = scores[order[k]];
      if (e.norm_topk_prob) wgt /= sum + 1e-20f;
      wgt *= static_cast<float>(e.routed_scaling_factor);
      routed[order[k]].emplace_back(static_cast<int32_t>(t), wgt);
    }
  }

  // One upload of every expert's rows and weights, then the experts in
  // index order (as transformers adds them).
  int64_t used = 0;
  std::vector<std::pair<int64_t, int64_t>> span(E);  // offset, count
  for (int64_t x = 0; x < E; ++x) {
    span[x] = {used, static_cast<int64_t>(routed[x].size())};
    for (const auto& [row, wgt] : routed[x]) {
      host_rows_[used] = row;
      host_weights_[used] = wgt;
      ++used;
    }
  }
  auto* rows = static_cast<int32_t*>(buffers_[kRouteRows].data());
  auto* weights = static_cast<float*>(buffers_[kRouteWeights].data());
  backend_.CopyToDevice(rows, host_rows_.data(), used * sizeof(int32_t));
  backend_.CopyToDevice(weights, host_weights_.data(), used * sizeof(float));
  for (int64_t x = 0; x < E; ++x) {
    const auto [offset, count] = span[x];
    if (count == 0) continue;
    Tensor xe = Scratch(kXe, count, H), ye = Scratch(kYe, count, H);
    backend_.GatherRows(h, rows + offset, xe);
    RunMlp(L.experts[x], xe, ye, count);
    backend_.ScaleAddRows(ye, rows + offset, weights + offset, out);
  }
}

Status DeepseekV3Model::Forward(const ForwardBatch& batch, std::span<const KvLayerView> kv,
                                Tensor logits) {
  const int64_t n = batch.num_tokens;
  if (n <= 0 || n > options_.max_batch_tokens)
    return Internal("Forward: " + std::to_string(n) + " tokens, workspace holds " +
                    std::to_string(options_.max_batch_tokens));
  if (static_cast<int64_t>(kv.size()) != config_.num_hidden_layers)
    return Internal("Forward: KV views for " + std::to_string(kv.size()) + " layers");
  const int64_t H = config_.hidden_size;
  const float eps = static_cast<float>(config_.rms_norm_eps);
  Tensor x = Scratch(kX, n, H), h = Scratch(kH, n, H), out = Scratch(kOut, n, H);
  backend_.Embedding(embed_, batch.token_ids, x);
  for (size_t l = 0; l < layers_.size(); ++l) {
    const Layer& L = layers_[l];
    backend_.RmsNorm(x, L.input_norm, eps, h);
    Attention(L, batch, kv[l], n);
    backend_.Add(x, out, x);
    backend_.RmsNorm(x, L.post_norm, eps, h);
    if (L.moe) {
      Moe(L, n);
    } else {
      RunMlp(L.dense, h, out, n);
    }
    backend_.Add(x, out, x);
  }
  LogitsOfRows(backend_, x, batch, final_norm_, lm_head_, eps,
               Scratch(kLast, batch.num_logit_rows, H), logits);
  return OkStatus();
}

}  // namespace

StatusOr<std::unique_ptr<Model>> CreateDeepseekV3(const ModelConfig& c, WeightStore& w, Backend& b,
                                                  const ModelOptions& o) {
  auto model = std::make_unique<DeepseekV3Model>(c, b, o);
  RETURN_IF_ERROR(model->Init(w));
  return std::unique_ptr<Model>(std::move(model));
}

KvLayout DeepseekV3KvLayout(const ModelConfig& c, int page_size, DType dtype) {
  return DeepseekV3Layout(c, page_size, dtype);
}

}  // namespace strata
