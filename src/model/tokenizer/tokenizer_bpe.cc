#include "model/tokenizer/tokenizer_bpe.h"

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "model/tokenizer/tokenizer_text.h"

namespace strata::tok {

using nlohmann::json;

namespace {

std::string OptString(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}

bool OptBool(const json& j, const char* key, bool def) {
  auto it = j.find(key);
  return it != j.end() && it->is_boolean() ? it->get<bool>() : def;
}

uint64_t PairKey(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

}  // namespace

StatusOr<std::unique_ptr<BpeModel>> BpeModel::FromJson(const json& model,
                                                       const std::string& where) {
  std::unique_ptr<BpeModel> m(new BpeModel());
  auto vocab_it = model.find("vocab");
  if (vocab_it == model.end() || !vocab_it->is_object()) {
    return InvalidArgument(
        where +
        ": field model.vocab is missing or not an object {token: id}; the file is not a "
        "valid BPE tokenizer.json");
  }
  auto dropout = model.find("dropout");
  if (dropout != model.end() && dropout->is_number() && dropout->get<double>() != 0.0) {
    return Unimplemented(
        where +
        ": model.dropout is set; BPE dropout is a training-time feature and is not "
        "supported for inference (set it to null)");
  }
  m->vocab_.reserve(vocab_it->size());
  int32_t max_id = -1;
  for (auto it = vocab_it->begin(); it != vocab_it->end(); ++it) {
    // Ids index dense tables; real vocabularies stay far below 2^24.
    if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0 ||
        it.value().get<int64_t>() >= kMaxTokenId) {
      return InvalidArgument(where + ": model.vocab[\"" + it.key() +
                             "\"] is not an integer id in [0, " + std::to_string(kMaxTokenId) +
                             ")");
    }
    int32_t id = it.value().get<int32_t>();
    m->vocab_[it.key()] = id;
    max_id = std::max(max_id, id);
  }
  m->id_to_token_.resize(max_id + 1);
  m->has_id_.assign(max_id + 1, false);
  for (const auto& [tok, id] : m->vocab_) {
    m->id_to_token_[id] = tok;
    m->has_id_[id] = true;
  }
  m->prefix_ = OptString(model, "continuing_subword_prefix");
  m->suffix_ = OptString(model, "end_of_word_suffix");
  m->fuse_unk_ = OptBool(model, "fuse_unk", false);
  m->byte_fallback_ = OptBool(model, "byte_fallback", false);
  m->ignore_merges_ = OptBool(model, "ignore_merges", false);
  std::string unk = OptString(model, "unk_token");
  if (!unk.empty()) {
    auto it = m->vocab_.find(unk);
    // HF fails at encode time when the unk token is missing; we drop unknown
    // characters instead of failing requests.
    if (it != m->vocab_.end()) m->unk_id_ = it->second;
  }
  m->all_byte_ids_ = true;
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    auto it = m->vocab_.find(std::string_view(name));
    m->byte_ids_[b] = it == m->vocab_.end() ? -1 : it->second;
    if (it == m->vocab_.end()) m->all_byte_ids_ = false;
  }
  for (const auto& [tok, id] : m->vocab_) {
    size_t i = 0;
    if (tok.empty() || !IsValidUtf8(tok)) continue;
    char32_t cp = NextCodepoint(tok, i);
    if (i == tok.size()) m->char_ids_[cp] = id;
  }

  auto merges_it = model.find("merges");
  if (merges_it == model.end() || !merges_it->is_array()) {
    return InvalidArgument(
        where +
        ": field model.merges is missing or not an array; the file is not a valid BPE "
        "tokenizer.json");
  }
  m->merges_.reserve(merges_it->size());
  const size_t prefix_len = m->prefix_.size();
  uint32_t rank = 0;
  for (const json& mj : *merges_it) {
    std::string a, b;
    if (mj.is_string()) {
      const std::string& s = mj.get_ref<const std::string&>();
      size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos) {
        return InvalidArgument(where + ": model.merges[" + std::to_string(rank) + "] = \"" + s +
                               "\" is not two tokens separated by one space");
      }
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else if (mj.is_array() && mj.size() == 2 && mj[0].is_string() && mj[1].is_string()) {
      a = mj[0].get<std::string>();
      b = mj[1].get<std::string>();
    } else {
      return InvalidArgument(where + ": model.merges[" + std::to_string(rank) +
                             "] is neither \"a b\" nor [\"a\", \"b\"]");
    }
    auto ia = m->vocab_.find(a), ib = m->vocab_.find(b);
    if (ia == m->vocab_.end() || ib == m->vocab_.end()) {
      return InvalidArgument(where + ": model.merges[" + std::to_string(rank) + "] uses token \"" +
                             (ia == m->vocab_.end() ? a : b) + "\" that is not in model.vocab");
    }
    std::string merged = a + (b.size() >= prefix_len ? b.substr(prefix_len) : std::string());
    auto im = m->vocab_.find(merged);
    if (im == m->vocab_.end()) {
      return InvalidArgument(where + ": model.merges[" + std::to_string(rank) + "] produces \"" +
                             merged + "\" which is not in model.vocab");
    }
    m->merges_[PairKey(ia->second, ib->second)] =
        MergeInfo{rank, im->second};  // later duplicates win, as in HF
    ++rank;
  }
  return m;
}

std::optional<int32_t> BpeModel::TokenToId(std::string_view token) const {
  auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* BpeModel::IdToToken(int32_t id) const {
  if (id < 0 || id >= static_cast<int32_t>(id_to_token_.size()) || !has_id_[id]) return nullptr;
  return &id_to_token_[id];
}

void BpeModel::Tokenize(std::string_view word, std::vector<int32_t>* out) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    auto it = vocab_.find(word);
    if (it != vocab_.end()) {
      out->push_back(it->second);
      return;
    }
  }
  const bool cacheable = word.size() <= kMaxCachedWordBytes;
  CacheShard* shard = nullptr;
  if (cacheable) {
    shard = &cache_[StringHash{}(word) % kCacheShards];
    std::lock_guard<std::mutex> lock(shard->mu);
    auto it = shard->map.find(word);
    if (it != shard->map.end()) {
      out->insert(out->end(), it->second.begin(), it->second.end());
      return;
    }
  }
  size_t before = out->size();
  MergeWord(word, out);
  if (cacheable) {
    std::lock_guard<std::mutex> lock(shard->mu);
    if (shard->map.size() < kCacheShardCapacity) {
      shard->map.emplace(std::string(word),
                         std::vector<int32_t>(out->begin() + before, out->end()));
    }
  }
}

void BpeModel::MergeWord(std::string_view word, std::vector<int32_t>* out) const {
  struct Symbol {
    int32_t id;
    int32_t prev;
    int32_t next;
    bool alive;
  };
  thread_local std::vector<Symbol> symbols;
  symbols.clear();
  auto add = [&](int32_t id) {
    int32_t n = static_cast<int32_t>(symbols.size());
    symbols.push_back(Symbol{id, n - 1, -1, true});
    if (n > 0) symbols[n - 1].next = n;
  };

  // 1. Initial symbols, one per character (HF BPE::merge_word).
  int32_t pending_unk = -1;  // HF keeps an unk pending so fuse_unk can extend it
  std::string scratch;
  size_t i = 0;
  while (i < word.size()) {
    size_t start = i;
    char32_t cp = NextCodepoint(word, i);
    const bool is_first = start == 0, is_last = i == word.size();
    int32_t id = -1;
    std::string_view s = word.substr(start, i - start);
    if ((prefix_.empty() || is_first) && (suffix_.empty() || !is_last)) {
      auto it = char_ids_.find(cp);
      if (it != char_ids_.end()) id = it->second;
    } else {
      scratch.clear();
      if (!is_first) scratch += prefix_;
      scratch += s;
      if (is_last) scratch += suffix_;
      s = scratch;
      auto it = vocab_.find(s);
      if (it != vocab_.end()) id = it->second;
    }
    if (id >= 0) {
      if (pending_unk >= 0) {
        add(pending_unk);
        pending_unk = -1;
      }
      add(id);
      continue;
    }
    if (byte_fallback_) {
      bool all = true;
      for (unsigned char c : s) all = all && byte_ids_[c] >= 0;
      if (all) {
        // As in HF, a pending unk is not flushed here: it lands after these bytes.
        for (unsigned char c : s) add(byte_ids_[c]);
        continue;
      }
    }
    if (unk_id_ >= 0) {
      if (pending_unk >= 0 && !fuse_unk_) add(pending_unk);
      pending_unk = unk_id_;
    }
  }
  if (pending_unk >= 0) add(pending_unk);

  // 2. Merge by rank (lowest first, leftmost on ties) until nothing applies.
  struct Candidate {
    uint32_t rank;
    int32_t pos;
    int32_t new_id;
    bool operator<(const Candidate& o) const {  // the heap's top is the largest
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  thread_local std::vector<Candidate> queue;  // a binary heap (std::push_heap / pop_heap)
  queue.clear();
  auto push = [&](Candidate c) {
    queue.push_back(c);
    std::push_heap(queue.begin(), queue.end());
  };
  auto lookup = [&](int32_t a, int32_t b) -> const MergeInfo* {
    auto it = merges_.find(PairKey(a, b));
    return it == merges_.end() ? nullptr : &it->second;
  };
  for (size_t k = 0; k + 1 < symbols.size(); ++k) {
    if (const MergeInfo* m = lookup(symbols[k].id, symbols[k + 1].id)) {
      push(Candidate{m->rank, static_cast<int32_t>(k), m->new_id});
    }
  }
  while (!queue.empty()) {
    std::pop_heap(queue.begin(), queue.end());
    Candidate top = queue.back();
    queue.pop_back();
    Symbol& cur = symbols[top.pos];
    if (!cur.alive || cur.next < 0) continue;
    Symbol& right = symbols[cur.next];
    const MergeInfo* m = lookup(cur.id, right.id);
    if (m == nullptr || m->new_id != top.new_id) continue;  // stale entry
    cur.id = top.new_id;
    right.alive = false;
    cur.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = top.pos;
    if (cur.prev >= 0) {
      if (const MergeInfo* pm = lookup(symbols[cur.prev].id, cur.id)) {
        push(Candidate{pm->rank, cur.prev, pm->new_id});
      }
    }
    if (cur.next >= 0) {
      if (const MergeInfo* nm = lookup(cur.id, symbols[cur.next].id)) {
        push(Candidate{nm->rank, top.pos, nm->new_id});
      }
    }
  }
  for (const Symbol& s : symbols) {
    if (s.alive) out->push_back(s.id);
  }
}

}  // namespace strata::tok
