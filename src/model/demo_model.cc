// The demo model is built from scratch on every call: a byte-level BPE
// tokenizer trained on an embedded text, and Llama weights drawn from a
// seeded generator. Nothing here depends on the machine, the locale or the
// time, so the files are identical everywhere.
#include "model/demo_model.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "backend/dtype.h"
#include "model/weights.h"

namespace strata {

namespace {

using Json = nlohmann::json;
using OrderedJson = nlohmann::ordered_json;

// Shape of the demo model (Llama 3 style, GQA 2:1).
constexpr int64_t kHidden = 256;
constexpr int64_t kIntermediate = 768;
constexpr int64_t kLayers = 4;
constexpr int64_t kHeads = 8;
constexpr int64_t kKvHeads = 4;
constexpr int64_t kHeadDim = kHidden / kHeads;
constexpr int64_t kVocab = 1024;
constexpr int64_t kMaxPositions = 4096;
constexpr double kRopeTheta = 500000.0;
constexpr double kRmsNormEps = 1e-5;
constexpr float kWeightStd = 0.1f;  // HF's 0.02 gives near-flat logits (TESTING.md)

// Special tokens take the last ids, after the BPE vocabulary, like Llama 3.
const char* const kSpecialTokens[] = {"<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                                      "<|end_header_id|>", "<|eot_id|>"};
constexpr int64_t kNumSpecial = 5;
constexpr int64_t kBpeVocab = kVocab - kNumSpecial;
constexpr int64_t kBosId = kBpeVocab + 0;
constexpr int64_t kEndOfTextId = kBpeVocab + 1;
constexpr int64_t kEotId = kBpeVocab + 4;

// Llama 3's pre-tokenizer split pattern.
constexpr const char* kSplitPattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// A Llama-3-style chat template: BOS, then each message as
// <|start_header_id|>role<|end_header_id|>\n\ncontent<|eot_id|>.
constexpr const char* kChatTemplate =
    "{{- bos_token }}\n"
    "{%- for message in messages %}\n"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + "
    "message['content'] | trim + '<|eot_id|>' }}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}\n"
    "{%- endif %}\n";

// The tokenizer's training text: plain English written for this file.
constexpr const char* kTrainingText = R"TEXT(
The lighthouse stood at the end of a long stone pier, and every evening the keeper climbed its one hundred and twelve steps to light the lamp. She had done this for nineteen years. The town below knew the sound of her boots on the iron stairs, and the children said they could set their clocks by it.

In the morning she wrote in the log: the weather, the ships that passed, the height of the tide, anything that seemed worth remembering. Most days the entries were short. "Wind from the west, light rain, two fishing boats returned before noon." Some days they were longer, when a storm came in from the sea and the waves broke over the pier and the whole tower seemed to hum.

People often asked her whether she was lonely. She wasn't, she told them, because the work was never finished. There was always a window to clean, a hinge to oil, a letter to answer. When the lamp was lit and the beam swept across the water, she would sit by the window with a cup of tea and read until the light of dawn made the lamp unnecessary again.

A river begins as rain on a mountain. The water gathers in small streams, the streams join, and by the time they reach the valley they have become something with a name. The river carries sand and stones and leaves. It cuts through rock over thousands of years, slowly and patiently, and it never stops moving. Farmers built their villages beside it because the soil was good and the water was near. Later the villages became towns, and the towns built bridges, mills and harbours.

Learning to cook is mostly learning to pay attention. You watch the onions until they turn golden, you listen to the oil in the pan, you taste the soup before you add more salt. A good recipe tells you what to do; experience tells you when. Bread needs flour, water, salt and time. Soup needs a pot, vegetables and patience. Most mistakes can be fixed, and the ones that can't are usually still worth eating.

A computer program is a list of instructions written for a machine that does exactly what it is told. That is both its strength and its weakness. If the instructions are right, the machine will follow them a billion times without getting tired. If they are wrong, it will make the same mistake a billion times just as carefully. Good programmers therefore spend much of their time reading, testing and checking their work. They write small pieces, test each one, and only then put the pieces together.

A language model reads text one token at a time and predicts what comes next. It doesn't understand the world the way a person does; it has learned patterns from a very large amount of writing. When you ask it a question, it writes the answer one piece at a time, each piece chosen from the ones it thinks most likely. The server that runs such a model must keep many conversations in memory at once, share the work fairly between them, and answer quickly even when many people are waiting.

Numbers appear everywhere in daily life. A recipe might call for 250 grams of flour and 3 eggs. A train leaves at 7:45 and arrives at 9:10. The year has 365 days, except when it has 366. A small town might have 4,000 people, a large city 8 million. We count, we measure, we compare, and we're often surprised by how quickly the numbers grow.

The garden in spring is a busy place. Bees move from flower to flower, birds search the grass for worms, and the first green leaves open on the apple trees. The gardener kneels in the soil, pulling weeds and planting seeds in straight rows: carrots, beans, lettuce and peas. Every morning she checks whether anything has come up. For a week nothing happens, and then, one day, small green shoots appear all at once.

Questions are the beginning of knowledge. Why is the sky blue? How far away is the moon? What makes a bird able to fly? Children ask such questions all the time, and the best teachers never tell them to stop. Instead they say: let's find out. They look at books, they try small experiments, they write down what they see. The answer is often less important than the habit of asking.

The old map showed roads that no longer existed and forests that had long been cut down. Still, the travellers found it useful. The rivers were where the map said they would be, and so were the hills. They walked north for three days, crossed a wooden bridge, and on the fourth morning they saw the sea. It was grey and calm and very wide, and they stood on the beach for a long time without saying anything.

Music is organised sound. A melody rises and falls, a rhythm keeps time, and harmony adds depth. People have made music for as long as there have been people: with their voices, with drums made from skins, with flutes carved from bone. Today we can listen to almost any piece ever recorded, at any hour, anywhere. And yet a song sung by a friend in the same room still sounds different from any recording.

When the winter came, the lighthouse keeper's work grew harder. The nights were long and the storms were frequent. Ice formed on the railings and the wind pushed against the door so that she had to lean on it with her whole weight. But the ships still needed the light, and so every evening she climbed the stairs, lit the lamp, and wrote in her log: "Clear and cold, wind from the north, all ships safe."
)TEXT";

// --- deterministic randomness -------------------------------------------

// The generator uses only IEEE-754 +, -, *, / and sqrt (exactly rounded
// everywhere), not libm's log whose last bits may differ between library
// versions: the weights must be the same bytes on every machine.
constexpr double kLn2 = 0.69314718055994530942;

// ln(u) for u > 0: u = m * 2^e with m in [sqrt(1/2), sqrt(2)), then
// ln(m) = 2 atanh(s), s = (m-1)/(m+1), |s| < 0.172, by its odd series.
double PortableLog(double u) {
  int e = 0;
  double m = std::frexp(u, &e);  // exact, m in [0.5, 1)
  if (m < 0.70710678118654752440) {
    m *= 2;  // exact
    --e;
  }
  // 1/1, 1/3, ..., 1/27 (each division is exactly rounded, so the table is
  // the same everywhere). Horner; s2^14 < 1e-21.
  static const auto kInvOdd = [] {
    std::array<double, 14> t{};
    for (int i = 0; i < 14; ++i) t[i] = 1.0 / (2 * i + 1);
    return t;
  }();
  const double s = (m - 1) / (m + 1), s2 = s * s;
  double poly = 0;
  for (int i = 13; i >= 0; --i) poly = poly * s2 + kInvOdd[i];
  return e * kLn2 + 2 * s * poly;
}

// splitmix64: a tiny, well-mixed generator with a fixed output sequence.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // Uniform in (0, 1): 53 random bits, never exactly 0.
  double Uniform() { return (static_cast<double>(Next() >> 11) + 0.5) * 0x1.0p-53; }
  // Standard normal by Box-Muller in Marsaglia's polar form (needs no
  // sin/cos; both outputs are used).
  double Normal() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    double u, v, s;
    do {
      u = 2.0 * Uniform() - 1.0;
      v = 2.0 * Uniform() - 1.0;
      s = u * u + v * v;
    } while (s >= 1.0 || s == 0.0);
    const double f = std::sqrt(-2.0 * PortableLog(s) / s);
    spare_ = v * f;
    has_spare_ = true;
    return u * f;
  }

 private:
  uint64_t state_;
  bool has_spare_ = false;
  double spare_ = 0.0;
};

// FNV-1a: seeds each tensor from its name, so tensors do not depend on the
// order they are generated in.
uint64_t HashName(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

// bf16 tensor of `shape` with values mean + std * N(0, 1).
TensorToWrite RandomBf16(const std::string& name, std::vector<int64_t> shape, double mean,
                         double std) {
  SplitMix64 rng(HashName(name) ^ 0x5354524154414d31ull);  // "STRATAM1"
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  TensorToWrite t{name, DType::kBF16, std::move(shape), std::vector<uint8_t>(n * 2)};
  for (int64_t i = 0; i < n; ++i) {
    uint16_t b = FloatToBf16(static_cast<float>(mean + std * rng.Normal()));
    t.bytes[2 * i] = static_cast<uint8_t>(b & 0xff);
    t.bytes[2 * i + 1] = static_cast<uint8_t>(b >> 8);
  }
  return t;
}

std::vector<TensorToWrite> DemoWeights() {
  std::vector<TensorToWrite> ts;
  ts.push_back(RandomBf16("model.embed_tokens.weight", {kVocab, kHidden}, 0, kWeightStd));
  for (int64_t i = 0; i < kLayers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    ts.push_back(RandomBf16(p + "input_layernorm.weight", {kHidden}, 1, 0.1));
    ts.push_back(
        RandomBf16(p + "self_attn.q_proj.weight", {kHeads * kHeadDim, kHidden}, 0, kWeightStd));
    ts.push_back(
        RandomBf16(p + "self_attn.k_proj.weight", {kKvHeads * kHeadDim, kHidden}, 0, kWeightStd));
    ts.push_back(
        RandomBf16(p + "self_attn.v_proj.weight", {kKvHeads * kHeadDim, kHidden}, 0, kWeightStd));
    ts.push_back(
        RandomBf16(p + "self_attn.o_proj.weight", {kHidden, kHeads * kHeadDim}, 0, kWeightStd));
    ts.push_back(RandomBf16(p + "post_attention_layernorm.weight", {kHidden}, 1, 0.1));
    ts.push_back(RandomBf16(p + "mlp.gate_proj.weight", {kIntermediate, kHidden}, 0, kWeightStd));
    ts.push_back(RandomBf16(p + "mlp.up_proj.weight", {kIntermediate, kHidden}, 0, kWeightStd));
    ts.push_back(RandomBf16(p + "mlp.down_proj.weight", {kHidden, kIntermediate}, 0, kWeightStd));
  }
  ts.push_back(RandomBf16("model.norm.weight", {kHidden}, 1, 0.1));
  ts.push_back(RandomBf16("lm_head.weight", {kVocab, kHidden}, 0, kWeightStd));
  return ts;
}

// --- byte-level BPE tokenizer ---------------------------------------------

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xc0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  } else {
    out->push_back(static_cast<char>(0xe0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  }
}

// GPT-2's byte -> printable character table, in GPT-2's order: printable
// bytes keep their code point and come first; the others map to 256, 257, ...
// Returns the 256 symbols in vocabulary order plus the byte -> symbol table.
void ByteLevelAlphabet(std::vector<uint8_t>* order, std::vector<std::string>* symbol_of_byte) {
  order->clear();
  symbol_of_byte->assign(256, "");
  std::vector<bool> printable(256, false);
  for (int b = 0; b < 256; ++b) {
    printable[b] = (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
  }
  for (int b = 0; b < 256; ++b) {
    if (printable[b]) {
      order->push_back(static_cast<uint8_t>(b));
      AppendUtf8(b, &(*symbol_of_byte)[b]);
    }
  }
  uint32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    if (!printable[b]) {
      order->push_back(static_cast<uint8_t>(b));
      AppendUtf8(next++, &(*symbol_of_byte)[b]);
    }
  }
}

// Splits `text` like HF's Split(pattern, behavior=Isolated): each match and
// each gap between matches is a piece.
StatusOr<std::vector<std::string>> PreTokenize(const std::string& text) {
  int err = 0;
  PCRE2_SIZE err_off = 0;
  pcre2_code* re = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(kSplitPattern), PCRE2_ZERO_TERMINATED,
                                 PCRE2_UTF | PCRE2_UCP, &err, &err_off, nullptr);
  if (re == nullptr) return Internal("demo model: split pattern does not compile");
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(re, nullptr);
  std::vector<std::string> pieces;
  size_t pos = 0, gap = 0;
  while (pos < text.size()) {
    int rc = pcre2_match(re, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), pos, 0, md,
                         nullptr);
    if (rc < 0) break;
    PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    if (ov[1] == ov[0]) {  // cannot happen with this pattern; avoid looping
      pos = ov[0] + 1;
      continue;
    }
    if (ov[0] > gap) pieces.push_back(text.substr(gap, ov[0] - gap));
    pieces.push_back(text.substr(ov[0], ov[1] - ov[0]));
    pos = gap = ov[1];
  }
  if (gap < text.size()) pieces.push_back(text.substr(gap));
  pcre2_match_data_free(md);
  pcre2_code_free(re);
  return pieces;
}

struct Bpe {
  std::vector<std::string> vocab;                           // id -> token
  std::vector<std::pair<std::string, std::string>> merges;  // in priority order
};

// Classic BPE training: repeatedly merge the most frequent adjacent pair
// (ties: the pair whose token strings sort first) until the vocabulary has
// `target` tokens.
StatusOr<Bpe> TrainBpe(const std::string& text, size_t target) {
  std::vector<uint8_t> order;
  std::vector<std::string> symbol;
  ByteLevelAlphabet(&order, &symbol);
  Bpe bpe;
  std::map<std::string, int> id_of;
  for (uint8_t b : order) {
    id_of[symbol[b]] = static_cast<int>(bpe.vocab.size());
    bpe.vocab.push_back(symbol[b]);
  }

  ASSIGN_OR_RETURN(auto pieces, PreTokenize(text));
  std::map<std::string, int64_t> piece_count;
  for (const auto& p : pieces) ++piece_count[p];
  struct Word {
    std::vector<int> ids;
    int64_t count;
  };
  std::vector<Word> words;
  for (const auto& [p, n] : piece_count) {
    Word w{{}, n};
    for (unsigned char c : p) w.ids.push_back(id_of[symbol[c]]);
    words.push_back(std::move(w));
  }

  while (bpe.vocab.size() < target) {
    std::map<std::pair<int, int>, int64_t> counts;
    for (const auto& w : words) {
      for (size_t i = 0; i + 1 < w.ids.size(); ++i) counts[{w.ids[i], w.ids[i + 1]}] += w.count;
    }
    if (counts.empty()) {
      return Internal("demo model: training text too short for " + std::to_string(target) +
                      " tokens");
    }
    const std::pair<int, int>* best = nullptr;
    int64_t best_count = 0;
    for (const auto& [pair, n] : counts) {
      if (best == nullptr || n > best_count ||
          (n == best_count && std::tie(bpe.vocab[pair.first], bpe.vocab[pair.second]) <
                                  std::tie(bpe.vocab[best->first], bpe.vocab[best->second]))) {
        best = &pair;
        best_count = n;
      }
    }
    const auto [a, b] = *best;
    const std::string merged = bpe.vocab[a] + bpe.vocab[b];
    bpe.merges.emplace_back(bpe.vocab[a], bpe.vocab[b]);
    int id;
    if (auto it = id_of.find(merged); it != id_of.end()) {
      id = it->second;  // reachable by another merge already; no new token
    } else {
      id = static_cast<int>(bpe.vocab.size());
      id_of[merged] = id;
      bpe.vocab.push_back(merged);
    }
    for (auto& w : words) {
      std::vector<int> out;
      out.reserve(w.ids.size());
      for (size_t i = 0; i < w.ids.size(); ++i) {
        if (i + 1 < w.ids.size() && w.ids[i] == a && w.ids[i + 1] == b) {
          out.push_back(id);
          ++i;
        } else {
          out.push_back(w.ids[i]);
        }
      }
      w.ids = std::move(out);
    }
  }
  return bpe;
}

OrderedJson ByteLevel(bool add_prefix_space, bool trim_offsets, bool use_regex) {
  return {{"type", "ByteLevel"},
          {"add_prefix_space", add_prefix_space},
          {"trim_offsets", trim_offsets},
          {"use_regex", use_regex}};
}

// tokenizer.json laid out as HF tokenizers writes Llama 3's.
OrderedJson TokenizerJson(const Bpe& bpe) {
  OrderedJson added = OrderedJson::array();
  for (int64_t i = 0; i < kNumSpecial; ++i) {
    added.push_back({{"id", kBpeVocab + i},
                     {"content", kSpecialTokens[i]},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", true}});
  }
  OrderedJson split = {{"type", "Split"},
                       {"pattern", {{"Regex", kSplitPattern}}},
                       {"behavior", "Isolated"},
                       {"invert", false}};
  OrderedJson pre = {{"type", "Sequence"},
                     {"pretokenizers", {split, ByteLevel(false, true, false)}}};
  const std::string bos = kSpecialTokens[0];
  auto special = [&](int type_id) {
    return OrderedJson{{"SpecialToken", {{"id", bos}, {"type_id", type_id}}}};
  };
  auto sequence = [](const char* id, int type_id) {
    return OrderedJson{{"Sequence", {{"id", id}, {"type_id", type_id}}}};
  };
  OrderedJson templ = {
      {"type", "TemplateProcessing"},
      {"single", {special(0), sequence("A", 0)}},
      {"pair", {special(0), sequence("A", 0), special(1), sequence("B", 1)}},
      {"special_tokens", {{bos, {{"id", bos}, {"ids", {kBosId}}, {"tokens", {bos}}}}}}};
  OrderedJson post = {{"type", "Sequence"}, {"processors", {ByteLevel(true, false, true), templ}}};
  OrderedJson vocab = OrderedJson::object();
  for (size_t i = 0; i < bpe.vocab.size(); ++i) vocab[bpe.vocab[i]] = i;
  OrderedJson merges = OrderedJson::array();
  for (const auto& [a, b] : bpe.merges) merges.push_back(a + " " + b);
  OrderedJson model = {{"type", "BPE"},
                       {"dropout", nullptr},
                       {"unk_token", nullptr},
                       {"continuing_subword_prefix", nullptr},
                       {"end_of_word_suffix", nullptr},
                       {"fuse_unk", false},
                       {"byte_fallback", false},
                       {"ignore_merges", true},
                       {"vocab", vocab},
                       {"merges", merges}};
  return {{"version", "1.0"},       {"truncation", nullptr},
          {"padding", nullptr},     {"added_tokens", added},
          {"normalizer", nullptr},  {"pre_tokenizer", pre},
          {"post_processor", post}, {"decoder", ByteLevel(true, true, true)},
          {"model", model}};
}

Json TokenizerConfigJson() {
  Json decoder = Json::object();
  for (int64_t i = 0; i < kNumSpecial; ++i) {
    decoder[std::to_string(kBpeVocab + i)] = {{"content", kSpecialTokens[i]}, {"lstrip", false},
                                              {"normalized", false},          {"rstrip", false},
                                              {"single_word", false},         {"special", true}};
  }
  return {
      {"added_tokens_decoder", decoder},   {"bos_token", kSpecialTokens[0]},
      {"chat_template", kChatTemplate},    {"clean_up_tokenization_spaces", false},
      {"eos_token", "<|eot_id|>"},         {"model_input_names", {"input_ids", "attention_mask"}},
      {"model_max_length", kMaxPositions}, {"tokenizer_class", "PreTrainedTokenizerFast"}};
}

Json ConfigJson() {
  return {{"architectures", {"LlamaForCausalLM"}},
          {"attention_bias", false},
          {"attention_dropout", 0.0},
          {"bos_token_id", kBosId},
          {"eos_token_id", {kEndOfTextId, kEotId}},
          {"head_dim", kHeadDim},
          {"hidden_act", "silu"},
          {"hidden_size", kHidden},
          {"initializer_range", 0.02},
          {"intermediate_size", kIntermediate},
          {"max_position_embeddings", kMaxPositions},
          {"mlp_bias", false},
          {"model_type", "llama"},
          {"num_attention_heads", kHeads},
          {"num_hidden_layers", kLayers},
          {"num_key_value_heads", kKvHeads},
          {"pretraining_tp", 1},
          {"rms_norm_eps", kRmsNormEps},
          {"rope_scaling", nullptr},
          {"rope_theta", kRopeTheta},
          {"tie_word_embeddings", false},
          {"torch_dtype", "bfloat16"},
          {"transformers_version", "4.45.0"},
          {"use_cache", true},
          {"vocab_size", kVocab}};
}

Json GenerationConfigJson() {
  return {{"bos_token_id", kBosId}, {"do_sample", true}, {"eos_token_id", {kEndOfTextId, kEotId}},
          {"temperature", 0.6},     {"top_p", 0.9},      {"transformers_version", "4.45.0"}};
}

template <typename J>
Status WriteJson(const std::string& path, const J& j) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return IoError(path + ": cannot create");
  out << j.dump(2) << "\n";
  out.close();
  if (!out) return IoError(path + ": write failed");
  return OkStatus();
}

}  // namespace

Status WriteDemoModel(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return IoError(dir + ": cannot create directory (" + ec.message() + ")");

  ASSIGN_OR_RETURN(Bpe bpe, TrainBpe(kTrainingText, kBpeVocab));
  RETURN_IF_ERROR(WriteJson(dir + "/tokenizer.json", TokenizerJson(bpe)));
  RETURN_IF_ERROR(WriteJson(dir + "/tokenizer_config.json", TokenizerConfigJson()));
  RETURN_IF_ERROR(WriteJson(dir + "/config.json", ConfigJson()));
  RETURN_IF_ERROR(WriteJson(dir + "/generation_config.json", GenerationConfigJson()));
  return WriteSafetensors(dir + "/model.safetensors", DemoWeights(), {{"format", "pt"}});
}

}  // namespace strata
