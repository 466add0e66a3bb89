#include "model/decoder.h"

#include <cmath>

#include "model/model_parts.h"
#include "model/rope.h"
#include "util/logging.h"

namespace strata {
namespace {

struct LayerWeights {
  Tensor input_norm, post_norm;
  Tensor q, k, v, o;
  Tensor q_bias, k_bias, v_bias, o_bias;
  Tensor q_norm, k_norm;
  Tensor gate, up, down;
  Tensor gate_bias, up_bias, down_bias;
};

class DecoderModel final : public Model {
 public:
  DecoderModel(const ModelConfig& config, const DecoderOptions& d, Backend& backend,
               const ModelOptions& options)
      : config_(config), d_(d), backend_(backend), options_(options) {}

  Status Init(WeightStore& w);

  const ModelConfig& config() const override { return config_; }
  KvLayout kv_layout(int page_size, DType dtype) const override {
    return DecoderKvLayout(config_, d_, page_size, dtype);
  }
  int32_t max_batch_tokens() const override { return options_.max_batch_tokens; }
  Status Forward(const ForwardBatch& batch, std::span<const KvLayerView> kv,
                 Tensor logits) override;
  // Forward's ops depend on the batch's host fields alone (its scratch
  // buffers and weights never move; positions, slots and page tables are
  // read on the device).
  bool ForwardIsReplayable() const override { return true; }

 private:
  StatusOr<Tensor> Bind(WeightStore& w, const std::string& name, std::vector<int64_t> shape);
  Tensor Scratch(int i, int64_t rows, int64_t cols) const {
    return buffers_[i].AsTensor(DType::kF32, rows, cols);
  }

  ModelConfig config_;
  DecoderOptions d_;
  Backend& backend_;
  ModelOptions options_;
  Tensor embed_, final_norm_, lm_head_;
  std::vector<LayerWeights> layers_;
  std::vector<float> inv_freq_;
  RopeParams rope_;
  std::vector<Buffer> buffers_;  // see enum Buf
  enum Buf { kX, kH, kQ, kK, kV, kAttn, kOut, kGate, kUp, kLast, kNumBufs };
};

StatusOr<Tensor> DecoderModel::Bind(WeightStore& w, const std::string& name,
                                    std::vector<int64_t> shape) {
  ASSIGN_OR_RETURN(Tensor host, w.Get(name, shape));
  return backend_.UploadWeight(host);
}

Status DecoderModel::Init(WeightStore& w) {
  const int64_t H = config_.hidden_size, I = config_.intermediate_size, V = config_.vocab_size;
  const int64_t nh = config_.num_attention_heads, nkv = config_.num_key_value_heads,
                hd = config_.head_dim;
  if (H <= 0 || I <= 0 || V <= 0 || nh <= 0 || nkv <= 0 || hd <= 0 || nh % nkv != 0)
    return InvalidArgument("config.json: inconsistent model dimensions");
  ASSIGN_OR_RETURN(embed_, Bind(w, "model.embed_tokens.weight", {V, H}));
  ASSIGN_OR_RETURN(final_norm_, Bind(w, "model.norm.weight", {H}));
  if (d_.tied_embeddings) {
    lm_head_ = embed_;
    // Some tied checkpoints still carry a copy of the head: accept it (with
    // the right shape) but use the embeddings, as transformers does.
    if (w.Find("lm_head.weight")) {
      ASSIGN_OR_RETURN(Tensor copy, w.Get("lm_head.weight", {V, H}));
      (void)copy;
    }
  } else {
    ASSIGN_OR_RETURN(lm_head_, Bind(w, "lm_head.weight", {V, H}));
  }
  layers_.resize(config_.num_hidden_layers);
  for (int64_t i = 0; i < config_.num_hidden_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    LayerWeights& L = layers_[i];
    ASSIGN_OR_RETURN(L.input_norm, Bind(w, p + "input_layernorm.weight", {H}));
    ASSIGN_OR_RETURN(L.post_norm, Bind(w, p + "post_attention_layernorm.weight", {H}));
    ASSIGN_OR_RETURN(L.q, Bind(w, p + "self_attn.q_proj.weight", {nh * hd, H}));
    ASSIGN_OR_RETURN(L.k, Bind(w, p + "self_attn.k_proj.weight", {nkv * hd, H}));
    ASSIGN_OR_RETURN(L.v, Bind(w, p + "self_attn.v_proj.weight", {nkv * hd, H}));
    ASSIGN_OR_RETURN(L.o, Bind(w, p + "self_attn.o_proj.weight", {H, nh * hd}));
    if (d_.qkv_bias) {
      ASSIGN_OR_RETURN(L.q_bias, Bind(w, p + "self_attn.q_proj.bias", {nh * hd}));
      ASSIGN_OR_RETURN(L.k_bias, Bind(w, p + "self_attn.k_proj.bias", {nkv * hd}));
      ASSIGN_OR_RETURN(L.v_bias, Bind(w, p + "self_attn.v_proj.bias", {nkv * hd}));
    }
    if (d_.o_bias) {
      ASSIGN_OR_RETURN(L.o_bias, Bind(w, p + "self_attn.o_proj.bias", {H}));
    }
    if (d_.qk_norm) {
      ASSIGN_OR_RETURN(L.q_norm, Bind(w, p + "self_attn.q_norm.weight", {hd}));
      ASSIGN_OR_RETURN(L.k_norm, Bind(w, p + "self_attn.k_norm.weight", {hd}));
    }
    ASSIGN_OR_RETURN(L.gate, Bind(w, p + "mlp.gate_proj.weight", {I, H}));
    ASSIGN_OR_RETURN(L.up, Bind(w, p + "mlp.up_proj.weight", {I, H}));
    ASSIGN_OR_RETURN(L.down, Bind(w, p + "mlp.down_proj.weight", {H, I}));
    if (d_.mlp_bias) {
      ASSIGN_OR_RETURN(L.gate_bias, Bind(w, p + "mlp.gate_proj.bias", {I}));
      ASSIGN_OR_RETURN(L.up_bias, Bind(w, p + "mlp.up_proj.bias", {I}));
      ASSIGN_OR_RETURN(L.down_bias, Bind(w, p + "mlp.down_proj.bias", {H}));
    }
  }
  // Rotary buffers (inv_freq) are sometimes saved by old exporters; they are
  // derived from the config, so ignore them rather than call them extra.
  RETURN_IF_ERROR(RejectExtraTensors(UnusedTensors(w), config_.architecture,
                                     "is config.json for a different model or variant?"));

  const int rotary_dim = static_cast<int>(hd * config_.rope.partial_rotary_factor);
  ASSIGN_OR_RETURN(inv_freq_, ComputeInvFreq(config_.rope, rotary_dim));
  rope_.inv_freq = inv_freq_.data();
  rope_.head_dim = static_cast<int32_t>(hd);
  rope_.rotary_dim = rotary_dim;
  rope_.attention_scaling = RopeAttentionScaling(config_.rope);

  const int64_t T = options_.max_batch_tokens;
  const int64_t widths[kNumBufs] = {H, H, nh * hd, nkv * hd, nkv * hd, nh * hd, H, I, I, H};
  buffers_.resize(kNumBufs);
  for (int b = 0; b < kNumBufs; ++b) {
    ASSIGN_OR_RETURN(buffers_[b],
                     backend_.Allocate(static_cast<size_t>(T * widths[b]) * sizeof(float)));
  }
  return OkStatus();
}

Status DecoderModel::Forward(const ForwardBatch& batch, std::span<const KvLayerView> kv,
                             Tensor logits) {
  const int64_t n = batch.num_tokens;
  if (n <= 0 || n > options_.max_batch_tokens)
    return Internal("Forward: " + std::to_string(n) + " tokens, workspace holds " +
                    std::to_string(options_.max_batch_tokens));
  if (static_cast<int64_t>(kv.size()) != config_.num_hidden_layers)
    return Internal("Forward: KV views for " + std::to_string(kv.size()) + " layers");
  const int64_t H = config_.hidden_size, I = config_.intermediate_size;
  const int64_t nh = config_.num_attention_heads, nkv = config_.num_key_value_heads,
                hd = config_.head_dim;
  const float eps = static_cast<float>(config_.rms_norm_eps);
  Tensor x = Scratch(kX, n, H), h = Scratch(kH, n, H), q = Scratch(kQ, n, nh * hd),
         k = Scratch(kK, n, nkv * hd), v = Scratch(kV, n, nkv * hd),
         attn = Scratch(kAttn, n, nh * hd), out = Scratch(kOut, n, H), gate = Scratch(kGate, n, I),
         up = Scratch(kUp, n, I);
  AttentionParams ap;
  ap.num_heads = static_cast<int32_t>(nh);
  ap.num_kv_heads = static_cast<int32_t>(nkv);
  ap.head_dim = static_cast<int32_t>(hd);
  ap.scale = 1.0f / std::sqrt(static_cast<float>(hd));
  ap.sliding_window = d_.sliding_window;
  ap.max_kv_len = batch.max_kv_len;
  // A sliding-window model's one group is windowed: its pages are addressed
  // through the window backing (ForwardBatch::window_seqs).
  const bool windowed = d_.sliding_window > 0;
  const int64_t* kv_slots = windowed ? batch.WindowKvSlots() : batch.kv_slots;
  const AttentionSeq* seqs = windowed ? batch.WindowSeqs() : batch.seqs;

  auto bias = [](const Tensor& t) { return t.data ? &t : nullptr; };
  backend_.Embedding(embed_, batch.token_ids, x);
  // Each residual add is fused with the norm after it (the next layer's
  // input norm; the last layer's final norm runs on the gathered rows).
  backend_.RmsNorm(x, layers_[0].input_norm, eps, h);
  for (size_t l = 0; l < layers_.size(); ++l) {
    const LayerWeights& L = layers_[l];
    const LinearPart qkv[] = {
        {L.q, bias(L.q_bias), q}, {L.k, bias(L.k_bias), k}, {L.v, bias(L.v_bias), v}};
    backend_.LinearGroup(h, qkv);
    if (d_.qk_norm) {
      Tensor qh{q.data, DType::kF32, n * nh, hd, 0}, kh{k.data, DType::kF32, n * nkv, hd, 0};
      backend_.RmsNorm(qh, L.q_norm, eps, qh);
      backend_.RmsNorm(kh, L.k_norm, eps, kh);
    }
    backend_.RopeStoreKv(q, k, v, batch.positions, rope_, kv[l], kv_slots);
    backend_.PagedAttention(q, kv[l], seqs, batch.num_seqs, ap, attn);
    backend_.Linear(attn, L.o, bias(L.o_bias), out);
    backend_.AddRmsNorm(x, out, L.post_norm, eps, h);
    backend_.LinearSiluMul(h, {L.gate, bias(L.gate_bias), gate}, {L.up, bias(L.up_bias), up}, gate);
    backend_.Linear(gate, L.down, bias(L.down_bias), out);
    if (l + 1 < layers_.size()) {
      backend_.AddRmsNorm(x, out, layers_[l + 1].input_norm, eps, h);
    } else {
      backend_.Add(x, out, x);
    }
  }
  LogitsOfRows(backend_, x, batch, final_norm_, lm_head_, eps,
               Scratch(kLast, batch.num_logit_rows, H), logits);
  return OkStatus();
}

}  // namespace

KvLayout DecoderKvLayout(const ModelConfig& config, const DecoderOptions& d, int page_size,
                         DType dtype) {
  KvLayout layout;
  layout.page_size = page_size;
  PoolGroupSpec g;
  g.name = d.sliding_window > 0 ? "sliding_attention" : "full_attention";
  g.num_layers = static_cast<int>(config.num_hidden_layers);
  g.num_kv_heads = static_cast<int>(config.num_key_value_heads);
  g.head_dim = static_cast<int>(config.head_dim);
  g.dtype = dtype;
  g.sliding_window = d.sliding_window;
  layout.groups.push_back(g);
  return layout;
}

StatusOr<std::unique_ptr<Model>> CreateDecoderModel(const ModelConfig& config,
                                                    const DecoderOptions& decoder,
                                                    WeightStore& weights, Backend& backend,
                                                    const ModelOptions& options) {
  if (config.hidden_act != "silu")
    return Unimplemented("config.json: hidden_act '" + config.hidden_act +
                         "' is not supported (supported: silu)");
  auto model = std::make_unique<DecoderModel>(config, decoder, backend, options);
  RETURN_IF_ERROR(model->Init(weights));
  return std::unique_ptr<Model>(std::move(model));
}

}  // namespace strata
