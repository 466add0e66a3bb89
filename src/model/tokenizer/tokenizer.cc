// Tokenizer: loads tokenizer.json / tokenizer_config.json and runs the HF
// pipeline: added-token extraction -> normalizer -> pre-tokenizers -> BPE
// -> post-processor; decoding through the decoder chain. The stages live in
// tokenizer_{text,pipeline,bpe,decoder}.{h,cc}.
#include "model/tokenizer/tokenizer.h"

#include <algorithm>
#include <array>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_map>

#include "model/tokenizer/tokenizer_bpe.h"
#include "model/tokenizer/tokenizer_decoder.h"
#include "model/tokenizer/tokenizer_pipeline.h"
#include "model/tokenizer/tokenizer_text.h"

namespace strata {

using nlohmann::json;
using tok::StringIdMap;

namespace {

struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool single_word = false, lstrip = false, rstrip = false, normalized = false, special = false;
};

// Finds added tokens in text like HF's AddedVocabulary::find_matches:
// Aho-Corasick leftmost-longest matching, then single_word / lstrip / rstrip.
class AddedTokenMatcher {
 public:
  // Indexes the tokens whose `normalized` flag equals `normalized`. As in
  // HF, normalized tokens are matched in normalized text, so their patterns
  // go through `normalizer` (may be null) first.
  void Build(const std::vector<AddedToken>& tokens, bool normalized,
             const tok::Normalizer* normalizer) {
    nodes_.assign(1, Node{});
    first_byte_.fill(false);
    for (size_t k = 0; k < tokens.size(); ++k) {
      const AddedToken& t = tokens[k];
      if (t.normalized != normalized) continue;
      std::string pattern = t.content;
      if (normalized && normalizer != nullptr) normalizer->Normalize(pattern);
      if (pattern.empty()) continue;
      first_byte_[static_cast<unsigned char>(pattern[0])] = true;
      int node = 0;
      for (unsigned char c : pattern) {
        int child = Child(node, c);
        if (child < 0) {
          child = static_cast<int>(nodes_.size());
          nodes_[node].next.emplace_back(c, child);
          nodes_.push_back(Node{});
        }
        node = child;
      }
      if (nodes_[node].token < 0) nodes_[node].token = static_cast<int>(k);
      empty_ = false;
    }
  }

  // Cuts s into consecutive pieces; on_piece(start, end, token or nullptr).
  // Empty s gives no pieces.
  template <typename Fn>
  void Split(std::string_view s, const std::vector<AddedToken>& tokens, Fn&& on_piece) const {
    if (s.empty()) return;
    if (empty_) {
      on_piece(0, s.size(), nullptr);
      return;
    }
    size_t start_offset = 0;
    size_t pos = 0;
    while (pos < s.size()) {
      // Leftmost-longest match at or after pos.
      size_t mstart = pos;
      int best = -1;
      size_t best_end = 0;
      for (; mstart < s.size(); ++mstart) {
        if (!first_byte_[static_cast<unsigned char>(s[mstart])]) continue;
        int node = 0;
        for (size_t i = mstart; i < s.size(); ++i) {
          node = Child(node, static_cast<unsigned char>(s[i]));
          if (node < 0) break;
          if (nodes_[node].token >= 0) {
            best = nodes_[node].token;
            best_end = i + 1;
          }
        }
        if (best >= 0) break;
      }
      if (best < 0) break;
      pos = best_end;
      const AddedToken& t = tokens[best];
      size_t start = mstart, stop = best_end;
      if (t.single_word) {
        bool start_space = start == 0 || !EndsWithWordChar(s.substr(0, start));
        bool stop_space = stop == s.size() || !StartsWithWordChar(s.substr(stop));
        if (!start_space || !stop_space) continue;
      }
      if (t.lstrip) {
        size_t b = start;
        while (b > 0) {
          size_t k = b - 1;
          while (k > 0 && (static_cast<unsigned char>(s[k]) & 0xC0) == 0x80) --k;
          size_t i = k;
          if (!tok::IsWhitespace(tok::NextCodepoint(s, i))) break;
          b = k;
        }
        start = std::max(b, start_offset);
      }
      if (t.rstrip) {
        size_t i = stop;
        while (i < s.size()) {
          size_t k = i;
          if (!tok::IsWhitespace(tok::NextCodepoint(s, k))) break;
          i = k;
        }
        stop = i;
      }
      if (start_offset < start) on_piece(start_offset, start, nullptr);
      on_piece(start, stop, &t);
      start_offset = stop;
    }
    if (start_offset < s.size()) on_piece(start_offset, s.size(), nullptr);
  }

 private:
  struct Node {
    std::vector<std::pair<unsigned char, int>> next;
    int token = -1;
  };
  int Child(int node, unsigned char c) const {
    for (const auto& [b, child] : nodes_[node].next) {
      if (b == c) return child;
    }
    return -1;
  }
  static bool EndsWithWordChar(std::string_view s) {
    if (s.empty()) return false;
    size_t k = s.size() - 1;
    while (k > 0 && (static_cast<unsigned char>(s[k]) & 0xC0) == 0x80) --k;
    char32_t c = tok::NextCodepoint(s, k);
    return tok::IsWordChar(c);
  }
  static bool StartsWithWordChar(std::string_view s) {
    if (s.empty()) return false;
    size_t k = 0;
    char32_t c = tok::NextCodepoint(s, k);
    return tok::IsWordChar(c);
  }

  std::vector<Node> nodes_;
  std::array<bool, 256> first_byte_{};
  bool empty_ = true;
};

bool GetBool(const json& j, const char* key, bool def) {
  auto it = j.find(key);
  return it != j.end() && it->is_boolean() ? it->get<bool>() : def;
}

std::string TypeOf(const json& j) {
  auto it = j.find("type");
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}

// tokenizer_config.json writes special tokens as "text" or {"content": "text", ...}.
std::string TokenName(const json& cfg, const char* key) {
  auto it = cfg.find(key);
  if (it == cfg.end()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object()) {
    auto c = it->find("content");
    if (c != it->end() && c->is_string()) return c->get<std::string>();
  }
  return "";
}

}  // namespace

class TokenizerImpl {
 public:
  Status Load(const std::string& tokenizer_json, const std::string& config_json,
              const std::string& path);
  Status ParsePostProcessor(const json& j, const std::string& where, std::vector<int32_t>* prefix,
                            std::vector<int32_t>* suffix);

  std::vector<int32_t> Encode(std::string_view text, bool add_special_tokens) const;
  // followed: decode ids[0..n) as the start of a longer sequence, so stages
  // that treat the last token specially (BPEDecoder drops the end-of-word
  // suffix there but turns it into a space elsewhere) see one more token.
  std::string Decode(const int32_t* ids, size_t n, bool skip_special, bool followed = false) const;
  void RegisterAddedToken(AddedToken t);
  const std::string* TokenString(int32_t id) const;
  bool IsSpecial(int32_t id) const {
    return id >= 0 && id < static_cast<int32_t>(special_.size()) && special_[id];
  }
  // True when text decoded from ids[0..n) may still change once more tokens
  // arrive (see IncrementalDecoder).
  bool UnstableEnd(const std::string& text, const int32_t* ids, size_t n, bool skip_special) const;

  std::unique_ptr<tok::BpeModel> model_;
  std::unique_ptr<tok::Normalizer> normalizer_;
  tok::PreTokenizerChain pretok_;
  std::unique_ptr<tok::Decoder> decoder_;
  tok::DecoderTraits decoder_traits_;
  std::vector<AddedToken> added_;
  std::unordered_map<int32_t, size_t> added_by_id_;
  StringIdMap added_by_content_;
  AddedTokenMatcher raw_matcher_, normalized_matcher_;
  std::vector<int32_t> prefix_ids_, suffix_ids_;  // post-processor, single sequence
  std::vector<bool> special_;
  std::vector<bool> byte_token_;             // "<0xNN>" tokens (ByteFallback decoding)
  std::vector<std::string> byte_level_raw_;  // per id bytes, when the decoder is ByteLevel alone
  int64_t vocab_size_ = 0;
  std::optional<int32_t> bos_id_, eos_id_;
  std::string bos_token_, eos_token_, chat_template_;
};

Status TokenizerImpl::Load(const std::string& tokenizer_json, const std::string& config_json,
                           const std::string& path) {
  const std::string file = path.empty() ? std::string("tokenizer.json") : path;
  json j;
  try {
    j = json::parse(tokenizer_json);
  } catch (const json::exception& e) {
    return InvalidArgument(file + ": not valid JSON (" + e.what() +
                           "); the tokenizer.json is corrupt or truncated");
  }
  if (!j.is_object())
    return InvalidArgument(file + ": top level is not a JSON object; expected a tokenizer.json");
  auto model_it = j.find("model");
  if (model_it == j.end() || !model_it->is_object()) {
    return InvalidArgument(
        file + ": field \"model\" is missing or not an object; expected a HF tokenizer.json");
  }
  std::string model_type = TypeOf(*model_it);
  if (model_type.empty() && model_it->contains("merges"))
    model_type = "BPE";  // untagged older files
  if (model_type != "BPE") {
    return Unimplemented(
        file + ": tokenizer model type \"" + model_type +
        "\" is not supported; Strata implements BPE models (Llama, Qwen, DeepSeek, Mistral). "
        "WordPiece/Unigram/WordLevel tokenizers are not supported");
  }
  ASSIGN_OR_RETURN(model_, tok::BpeModel::FromJson(*model_it, file));

  try {
    if (auto it = j.find("added_tokens"); it != j.end() && !it->is_null()) {
      if (!it->is_array()) return InvalidArgument(file + ": field added_tokens is not an array");
      for (size_t k = 0; k < it->size(); ++k) {
        const json& a = (*it)[k];
        AddedToken t;
        if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() ||
            !a.contains("content") || !a["content"].is_string()) {
          return InvalidArgument(file + ": added_tokens[" + std::to_string(k) +
                                 "] needs an integer \"id\" and a string \"content\"");
        }
        if (a["id"].get<int64_t>() < 0 || a["id"].get<int64_t>() >= tok::kMaxTokenId) {
          return InvalidArgument(file + ": added_tokens[" + std::to_string(k) +
                                 "].id is not in [0, " + std::to_string(tok::kMaxTokenId) + ")");
        }
        t.id = a["id"].get<int32_t>();
        t.content = a["content"].get<std::string>();
        t.single_word = GetBool(a, "single_word", false);
        t.lstrip = GetBool(a, "lstrip", false);
        t.rstrip = GetBool(a, "rstrip", false);
        t.special = GetBool(a, "special", false);
        t.normalized = GetBool(a, "normalized", !t.special);
        RegisterAddedToken(std::move(t));
      }
    }
  } catch (const json::exception& e) {
    return InvalidArgument(file + ": field added_tokens is malformed (" + e.what() + ")");
  }
  if (auto it = j.find("normalizer"); it != j.end() && !it->is_null()) {
    ASSIGN_OR_RETURN(normalizer_, tok::ParseNormalizer(*it, file + ": normalizer"));
  }
  raw_matcher_.Build(added_, false, nullptr);
  normalized_matcher_.Build(added_, true, normalizer_.get());
  {
    auto it = j.find("pre_tokenizer");
    ASSIGN_OR_RETURN(pretok_, tok::PreTokenizerChain::Parse(it == j.end() ? json() : *it,
                                                            file + ": pre_tokenizer"));
  }
  if (auto it = j.find("post_processor"); it != j.end() && !it->is_null()) {
    RETURN_IF_ERROR(ParsePostProcessor(*it, file + ": post_processor", &prefix_ids_, &suffix_ids_));
  }
  if (auto it = j.find("decoder"); it != j.end() && !it->is_null()) {
    ASSIGN_OR_RETURN(decoder_, tok::ParseDecoder(*it, file + ": decoder", &decoder_traits_));
  }

  int32_t max_id = model_->max_id();
  for (const AddedToken& t : added_) max_id = std::max(max_id, t.id);
  vocab_size_ = max_id + 1;
  // Encode emits these ids verbatim: one outside the vocabulary would index
  // past the embedding table.
  for (const std::vector<int32_t>* ids : {&prefix_ids_, &suffix_ids_}) {
    for (int32_t id : *ids) {
      if (id < 0 || id >= vocab_size_ || TokenString(id) == nullptr)
        return InvalidArgument(file + ": post_processor adds token id " + std::to_string(id) +
                               ", which is not in the vocabulary (model.vocab or added_tokens)");
    }
  }
  special_.assign(vocab_size_, false);
  byte_token_.assign(vocab_size_, false);
  for (const AddedToken& t : added_) special_[t.id] = t.special;
  if (decoder_traits_.byte_level_only) byte_level_raw_.resize(vocab_size_);
  for (int32_t id = 0; id < vocab_size_; ++id) {
    const std::string* s = TokenString(id);
    if (s == nullptr) continue;
    byte_token_[id] = tok::ByteFallbackValue(*s) >= 0;
    if (decoder_traits_.byte_level_only) {
      std::string& raw = byte_level_raw_[id];
      bool ok = tok::IsValidUtf8(*s);
      for (size_t i = 0; ok && i < s->size();) {
        int b = tok::ByteLevelByte(tok::NextCodepoint(*s, i));
        if (b < 0) ok = false;
        raw.push_back(static_cast<char>(b));
      }
      if (!ok) raw = *s;
    }
  }

  // tokenizer_config.json: special token names and the chat template.
  if (!config_json.empty()) {
    const std::string cfg_file =
        path.empty() ? std::string("tokenizer_config.json")
                     : path.substr(0, path.rfind('/') + 1) + "tokenizer_config.json";
    json cfg;
    try {
      cfg = json::parse(config_json);
    } catch (const json::exception& e) {
      return InvalidArgument(cfg_file + ": not valid JSON (" + e.what() + ")");
    }
    if (!cfg.is_object()) return InvalidArgument(cfg_file + ": top level is not a JSON object");
    bos_token_ = TokenName(cfg, "bos_token");
    eos_token_ = TokenName(cfg, "eos_token");
    if (auto it = cfg.find("chat_template"); it != cfg.end()) {
      if (it->is_string()) {
        chat_template_ = it->get<std::string>();
      } else if (it->is_array()) {  // [{"name": ..., "template": ...}]: prefer "default"
        for (const json& t : *it) {
          if (!t.is_object() || !t.contains("template") || !t["template"].is_string()) continue;
          std::string name =
              t.contains("name") && t["name"].is_string() ? t["name"].get<std::string>() : "";
          if (chat_template_.empty() || name == "default")
            chat_template_ = t["template"].get<std::string>();
          if (name == "default") break;
        }
      }
    }
  }
  auto lookup = [&](const std::string& name) -> std::optional<int32_t> {
    if (name.empty()) return std::nullopt;
    if (auto it = added_by_content_.find(name); it != added_by_content_.end()) return it->second;
    return model_->TokenToId(name);
  };
  bos_id_ = lookup(bos_token_);
  eos_id_ = lookup(eos_token_);
  if (bos_token_.empty() && prefix_ids_.size() == 1) {  // e.g. Llama 3 without a config
    bos_id_ = prefix_ids_[0];
    if (const std::string* s = TokenString(prefix_ids_[0])) bos_token_ = *s;
  }
  return OkStatus();
}

Status TokenizerImpl::ParsePostProcessor(const json& j, const std::string& where,
                                         std::vector<int32_t>* prefix,
                                         std::vector<int32_t>* suffix) {
  std::string type = TypeOf(j);
  if (type == "ByteLevel") return OkStatus();  // only moves offsets
  if (type == "Sequence") {
    auto it = j.find("processors");
    if (it == j.end() || !it->is_array())
      return InvalidArgument(where + ".processors is missing or not an array");
    for (size_t k = 0; k < it->size(); ++k) {
      std::vector<int32_t> p, s;
      RETURN_IF_ERROR(
          ParsePostProcessor((*it)[k], where + ".processors[" + std::to_string(k) + "]", &p, &s));
      // A later processor wraps what the earlier ones produced.
      prefix->insert(prefix->begin(), p.begin(), p.end());
      suffix->insert(suffix->end(), s.begin(), s.end());
    }
    return OkStatus();
  }
  if (type == "TemplateProcessing") {
    auto single = j.find("single");
    if (single == j.end() || !single->is_array()) {
      return InvalidArgument(where + ".single is missing or not an array of template pieces");
    }
    const json* specials = j.contains("special_tokens") ? &j["special_tokens"] : nullptr;
    bool seen_sequence = false;
    for (size_t k = 0; k < single->size(); ++k) {
      const json& item = (*single)[k];
      if (item.contains("Sequence")) {
        seen_sequence = true;
        continue;
      }
      const std::string item_where = where + ".single[" + std::to_string(k) + "]";
      if (!item.contains("SpecialToken") || !item["SpecialToken"].contains("id") ||
          !item["SpecialToken"]["id"].is_string()) {
        return InvalidArgument(
            item_where + " is neither {\"Sequence\": ...} nor {\"SpecialToken\": {\"id\": ...}}");
      }
      std::string name = item["SpecialToken"]["id"].get<std::string>();
      if (specials == nullptr || !specials->contains(name) || !(*specials)[name].contains("ids") ||
          !(*specials)[name]["ids"].is_array()) {
        return InvalidArgument(item_where + " names special token \"" + name + "\" that " + where +
                               ".special_tokens does not define with \"ids\"");
      }
      std::vector<int32_t>& dst = seen_sequence ? *suffix : *prefix;
      for (const json& id : (*specials)[name]["ids"]) {
        if (!id.is_number_integer())
          return InvalidArgument(where + ".special_tokens[\"" + name + "\"].ids has a non-integer");
        dst.push_back(id.get<int32_t>());
      }
    }
    return OkStatus();
  }
  if (type == "RobertaProcessing" || type == "BertProcessing") {
    auto id_of = [&](const char* key) -> std::optional<int32_t> {
      auto it = j.find(key);
      if (it == j.end() || !it->is_array() || it->size() != 2 || !(*it)[1].is_number_integer())
        return std::nullopt;
      return (*it)[1].get<int32_t>();
    };
    auto cls = id_of("cls"), sep = id_of("sep");
    if (!cls || !sep)
      return InvalidArgument(where + ": " + type + " needs \"cls\" and \"sep\" as [token, id]");
    prefix->push_back(*cls);
    suffix->push_back(*sep);
    return OkStatus();
  }
  return Unimplemented(
      where + ": post-processor type \"" + type +
      "\" is not supported (supported: TemplateProcessing, ByteLevel, Sequence, RobertaProcessing, "
      "BertProcessing)");
}

// HF re-derives added-token ids when loading (AddedVocabulary::add_tokens):
// a content already known (earlier added token, then model vocabulary) keeps
// that id; a new one gets max(added ids) + 1, or the model vocabulary size
// while all added ids are below it. The "id" in the file is only checked
// (with a warning) by HF, so it is ignored here too; for published
// tokenizers the two agree.
void TokenizerImpl::RegisterAddedToken(AddedToken t) {
  if (t.content.empty()) return;
  for (const AddedToken& a : added_) {
    if (a.content == t.content && a.single_word == t.single_word && a.lstrip == t.lstrip &&
        a.rstrip == t.rstrip && a.normalized == t.normalized && a.special == t.special) {
      return;  // identical token already registered
    }
  }
  if (auto it = added_by_content_.find(t.content); it != added_by_content_.end()) {
    t.id = it->second;
  } else if (auto mid = model_->TokenToId(t.content)) {
    t.id = *mid;
  } else {
    const int32_t model_size = static_cast<int32_t>(model_->vocab_count());
    int32_t max_added = -1;
    for (const auto& [id, idx] : added_by_id_) max_added = std::max(max_added, id);
    t.id = max_added < 0
               ? model_size
               : (max_added >= model_size || model_size == 0 ? max_added + 1 : model_size);
  }
  added_by_content_[t.content] = t.id;
  added_by_id_[t.id] = added_.size();
  added_.push_back(std::move(t));
}

const std::string* TokenizerImpl::TokenString(int32_t id) const {
  if (auto it = added_by_id_.find(id); it != added_by_id_.end()) return &added_[it->second].content;
  return model_->IdToToken(id);
}

std::vector<int32_t> TokenizerImpl::Encode(std::string_view text, bool add_special_tokens) const {
  std::string repaired;
  if (!tok::IsValidUtf8(text)) {  // HF only ever sees valid text; repair like from_utf8_lossy
    repaired = tok::Utf8Lossy(text);
    text = repaired;
  }
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + prefix_ids_.size() + suffix_ids_.size() + 4);
  if (add_special_tokens) out.insert(out.end(), prefix_ids_.begin(), prefix_ids_.end());

  struct ModelSink final : tok::PieceSink {
    const tok::BpeModel* model;
    std::vector<int32_t>* out;
    void Piece(std::string_view piece, bool) override { model->Tokenize(piece, out); }
  } sink;
  sink.model = model_.get();
  sink.out = &out;

  std::string normalized;
  raw_matcher_.Split(text, added_, [&](size_t b, size_t e, const AddedToken* t) {
    if (t != nullptr) {
      out.push_back(t->id);
      return;
    }
    std::string_view seg = text.substr(b, e - b);
    const bool first = b == 0;
    if (normalizer_) {
      normalized.assign(seg);
      normalizer_->Normalize(normalized);
      seg = normalized;
    }
    normalized_matcher_.Split(seg, added_, [&](size_t b2, size_t e2, const AddedToken* t2) {
      if (t2 != nullptr) {
        out.push_back(t2->id);
        return;
      }
      pretok_.Run(seg.substr(b2, e2 - b2), first && b2 == 0, sink);
    });
  });
  if (add_special_tokens) out.insert(out.end(), suffix_ids_.begin(), suffix_ids_.end());
  return out;
}

std::string TokenizerImpl::Decode(const int32_t* ids, size_t n, bool skip_special,
                                  bool followed) const {
  if (decoder_traits_.byte_level_only) {
    std::string bytes;
    for (size_t k = 0; k < n; ++k) {
      int32_t id = ids[k];
      if (id < 0 || id >= vocab_size_ || (skip_special && special_[id])) continue;
      bytes += byte_level_raw_[id];
    }
    return tok::Utf8Lossy(bytes);
  }
  std::vector<std::string> tokens;
  tokens.reserve(n);
  for (size_t k = 0; k < n; ++k) {
    const std::string* s = TokenString(ids[k]);
    if (s == nullptr || (skip_special && IsSpecial(ids[k]))) continue;
    tokens.push_back(*s);
  }
  std::string out;
  if (decoder_) {
    // An empty token stands for "more follows": it contributes no text of
    // its own, but the real last token is no longer last.
    if (followed && !tokens.empty()) tokens.emplace_back();
    decoder_->DecodeChain(tokens);
    for (const std::string& t : tokens) out += t;
  } else {
    for (size_t k = 0; k < tokens.size(); ++k) {
      if (k > 0) out += ' ';
      out += tokens[k];
    }
  }
  return out;
}

bool TokenizerImpl::UnstableEnd(const std::string& text, const int32_t* ids, size_t n,
                                bool skip_special) const {
  if (decoder_traits_.byte_level_only) {
    // Bytes concatenate: only an unfinished UTF-8 sequence at the very end
    // can still change (a U+FFFD for invalid bytes is final).
    std::string tail;
    for (size_t k = n; k-- > 0 && tail.size() < 4;) {
      int32_t id = ids[k];
      if (id < 0 || id >= vocab_size_ || (skip_special && special_[id])) continue;
      tail.insert(0, byte_level_raw_[id]);
    }
    return tok::CompleteUtf8Prefix(tail) < tail.size();
  }
  // Otherwise an unfinished sequence or an invalid byte run (ByteFallback)
  // shows as a trailing U+FFFD; either may still change.
  if (text.size() >= 3 && text.compare(text.size() - 3, 3, "\xEF\xBF\xBD") == 0) return true;
  // The last token may decode differently once another follows: BPEDecoder
  // turns its end-of-word suffix into "" at the end but " " elsewhere, so a
  // vocabulary token "d</w>Y" reads "dY" last and "d Y" otherwise. Text is
  // final only if it survives being followed.
  if (decoder_traits_.last_token_differs && n > 0) {
    const std::string followed = Decode(ids, n, skip_special, /*followed=*/true);
    if (followed.compare(0, text.size(), text) != 0) return true;
  }
  if (decoder_traits_.byte_fallback) {
    // A ByteFallback run is decoded as a whole: the next byte token can turn
    // already-valid bytes into U+FFFDs. Hold text while a run is open.
    for (size_t k = n; k-- > 0;) {
      int32_t id = ids[k];
      if (id < 0 || id >= vocab_size_ || TokenString(id) == nullptr) continue;
      if (skip_special && special_[id]) continue;
      return byte_token_[id];
    }
  }
  return false;
}

// ---------------------------------------------------------------------------
// Tokenizer

Tokenizer::Tokenizer() : impl_(std::make_unique<TokenizerImpl>()) {}
Tokenizer::~Tokenizer() = default;

StatusOr<std::shared_ptr<const Tokenizer>> Tokenizer::FromJson(
    const std::string& tokenizer_json, const std::string& tokenizer_config_json,
    const std::string& path) {
  std::shared_ptr<Tokenizer> t(new Tokenizer());
  RETURN_IF_ERROR(t->impl_->Load(tokenizer_json, tokenizer_config_json, path));
  return std::shared_ptr<const Tokenizer>(std::move(t));
}

namespace {

Status ReadFile(const std::string& path, std::string* out) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return NotFound(path + ": cannot open; check the model directory");
  std::ostringstream ss;
  ss << f.rdbuf();
  if (f.bad()) return IoError(path + ": read failed");
  *out = ss.str();
  return OkStatus();
}

}  // namespace

StatusOr<std::shared_ptr<const Tokenizer>> Tokenizer::FromDir(const std::string& dir) {
  const std::string base = dir.empty() || dir.back() == '/' ? dir : dir + "/";
  std::string tj, cj;
  RETURN_IF_ERROR(ReadFile(base + "tokenizer.json", &tj));
  std::ifstream probe(base + "tokenizer_config.json");
  if (probe) RETURN_IF_ERROR(ReadFile(base + "tokenizer_config.json", &cj));
  return FromJson(tj, cj, base + "tokenizer.json");
}

std::vector<int32_t> Tokenizer::Encode(std::string_view text, bool add_special_tokens) const {
  return impl_->Encode(text, add_special_tokens);
}

std::string Tokenizer::Decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
  return impl_->Decode(ids.data(), ids.size(), skip_special_tokens);
}

std::string Tokenizer::TokenBytes(int32_t id) const {
  const TokenizerImpl& impl = *impl_;
  if (id < 0 || id >= impl.vocab_size_ || impl.TokenString(id) == nullptr) return "";
  if (impl.decoder_traits_.byte_level_only) return impl.byte_level_raw_[id];
  if (impl.decoder_traits_.byte_fallback && impl.byte_token_[id]) {
    return std::string(1, static_cast<char>(tok::ByteFallbackValue(*impl.TokenString(id))));
  }
  return impl.Decode(&id, 1, /*skip_special=*/false);
}

int64_t Tokenizer::vocab_size() const { return impl_->vocab_size_; }

std::optional<int32_t> Tokenizer::TokenToId(std::string_view token) const {
  if (auto it = impl_->added_by_content_.find(token); it != impl_->added_by_content_.end())
    return it->second;
  return impl_->model_->TokenToId(token);
}

std::optional<std::string> Tokenizer::IdToToken(int32_t id) const {
  const std::string* s = impl_->TokenString(id);
  if (s == nullptr) return std::nullopt;
  return *s;
}

bool Tokenizer::IsSpecial(int32_t id) const { return impl_->IsSpecial(id); }
std::optional<int32_t> Tokenizer::bos_id() const { return impl_->bos_id_; }
std::optional<int32_t> Tokenizer::eos_id() const { return impl_->eos_id_; }
std::string Tokenizer::bos_token() const { return impl_->bos_token_; }
std::string Tokenizer::eos_token() const { return impl_->eos_token_; }
const std::string& Tokenizer::chat_template() const { return impl_->chat_template_; }

// ---------------------------------------------------------------------------
// IncrementalDecoder
//
// ids_:  [0 ........ prefix_offset_ ........ read_offset_ ........ size)
//         emitted     context window         emitted      pending
// Text for ids_[0, read_offset_) has been emitted. The pending text is
// Decode(window + pending) minus Decode(window): decoding from the same start
// makes start-of-text effects (Strip, Metaspace's first token) cancel, and
// read_offset_ only ever sits where the text was stable (complete UTF-8, no
// open byte-fallback run, the same text once another token follows), so the
// difference equals what Decode(all) adds.

IncrementalDecoder::IncrementalDecoder(std::shared_ptr<const Tokenizer> tokenizer,
                                       bool skip_special_tokens)
    : tok_(std::move(tokenizer)), skip_special_(skip_special_tokens) {}

std::string IncrementalDecoder::Add(int32_t id) {
  ids_.push_back(id);
  const TokenizerImpl& impl = *tok_->impl_;
  const int32_t* base = ids_.data() + prefix_offset_;
  const size_t n = ids_.size() - prefix_offset_;
  std::string prefix_text = impl.Decode(base, read_offset_ - prefix_offset_, skip_special_);
  std::string new_text = impl.Decode(base, n, skip_special_);
  if (new_text.size() <= prefix_text.size() ||
      new_text.compare(0, prefix_text.size(), prefix_text) != 0 ||
      impl.UnstableEnd(new_text, base, n, skip_special_)) {
    return "";
  }
  prefix_offset_ = read_offset_;
  read_offset_ = ids_.size();
  return new_text.substr(prefix_text.size());
}

std::string IncrementalDecoder::Flush() {
  if (read_offset_ == ids_.size()) return "";
  const TokenizerImpl& impl = *tok_->impl_;
  const int32_t* base = ids_.data() + prefix_offset_;
  std::string prefix_text = impl.Decode(base, read_offset_ - prefix_offset_, skip_special_);
  std::string new_text = impl.Decode(base, ids_.size() - prefix_offset_, skip_special_);
  prefix_offset_ = read_offset_;
  read_offset_ = ids_.size();
  if (new_text.compare(0, prefix_text.size(), prefix_text) != 0)
    return new_text;  // cannot happen for known decoders
  return new_text.substr(prefix_text.size());
}

}  // namespace strata
