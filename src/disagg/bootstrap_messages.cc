// The bootstrap messages on the wire (bootstrap.h, "Wire format"): JSON
// encoding and a decoder that trusts nothing. Pure functions; the libFuzzer
// target disagg/fuzz/bootstrap_fuzz.cc drives DecodeMessage.
#include <cmath>
#include <cstring>
#include <exception>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <type_traits>

#include "disagg/bootstrap.h"
#include "util/json_snippet.h"

namespace strata::disagg {
namespace {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

// Our messages nest 4 levels (hello -> layout -> groups -> group); anything
// deeper is not ours and is refused before nlohmann builds it.
constexpr int kMaxDepth = 8;
// Generous bounds that no real model reaches but that keep arithmetic on a
// peer's layout (BytesPerPage, Describe) far from overflow.
constexpr int64_t kMaxLayoutDim = int64_t{1} << 20;
constexpr int64_t kMaxLayoutGroups = 64;
// Token counts fit in int64 with room; 2^40 is far beyond any context.
constexpr int64_t kMaxTokens = int64_t{1} << 40;

// ---- base64 (RFC 4648, with padding) ----------------------------------

constexpr char kB64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

std::string Base64Encode(std::string_view in) {
  std::string out;
  out.reserve((in.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 3 <= in.size(); i += 3) {
    const uint32_t v = (uint32_t{static_cast<uint8_t>(in[i])} << 16) |
                       (uint32_t{static_cast<uint8_t>(in[i + 1])} << 8) |
                       uint32_t{static_cast<uint8_t>(in[i + 2])};
    out += kB64[v >> 18];
    out += kB64[(v >> 12) & 63];
    out += kB64[(v >> 6) & 63];
    out += kB64[v & 63];
  }
  if (i + 1 == in.size()) {
    const uint32_t v = uint32_t{static_cast<uint8_t>(in[i])} << 16;
    out += kB64[v >> 18];
    out += kB64[(v >> 12) & 63];
    out += "==";
  } else if (i + 2 == in.size()) {
    const uint32_t v = (uint32_t{static_cast<uint8_t>(in[i])} << 16) |
                       (uint32_t{static_cast<uint8_t>(in[i + 1])} << 8);
    out += kB64[v >> 18];
    out += kB64[(v >> 12) & 63];
    out += kB64[(v >> 6) & 63];
    out += '=';
  }
  return out;
}

int B64Value(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

// Strict: canonical padding and zero spare bits, so one byte string has one
// spelling (the fuzz target checks re-encoding).
bool Base64Decode(std::string_view in, std::string* out) {
  out->clear();
  if (in.size() % 4 != 0) return false;
  out->reserve(in.size() / 4 * 3);
  for (size_t i = 0; i < in.size(); i += 4) {
    const bool last = i + 4 == in.size();
    const int pad = last ? (in[i + 3] == '=' ? (in[i + 2] == '=' ? 2 : 1) : 0) : 0;
    int v[4];
    for (int k = 0; k < 4 - pad; ++k) {
      v[k] = B64Value(in[i + k]);
      if (v[k] < 0) return false;
    }
    for (int k = 4 - pad; k < 4; ++k) v[k] = 0;
    const uint32_t w =
        (uint32_t(v[0]) << 18) | (uint32_t(v[1]) << 12) | (uint32_t(v[2]) << 6) | uint32_t(v[3]);
    if (pad == 2 && (w & 0xffff) != 0) return false;
    if (pad == 1 && (w & 0xff) != 0) return false;
    out->push_back(static_cast<char>(w >> 16));
    if (pad < 2) out->push_back(static_cast<char>((w >> 8) & 0xff));
    if (pad < 1) out->push_back(static_cast<char>(w & 0xff));
  }
  return true;
}

// ---- encoding ----------------------------------------------------------

// JSON has no infinities or NaN; a -inf logprob is real (a masked token in
// top_logprobs), so those travel as strings.
ojson FloatJson(float v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v < 0 ? "-inf" : "inf";
  return static_cast<double>(v);
}

ojson LayoutJson(const KvLayout& layout) {
  ojson groups = ojson::array();
  for (const PoolGroupSpec& g : layout.groups) {
    groups.push_back({{"name", g.name},
                      {"num_layers", g.num_layers},
                      {"num_kv_heads", g.num_kv_heads},
                      {"head_dim", g.head_dim},
                      {"dtype", DTypeName(g.dtype)},
                      {"has_v", g.has_v},
                      {"sliding_window", g.sliding_window},
                      {"tokens_per_entry", g.tokens_per_entry}});
  }
  return {{"page_size", layout.page_size}, {"groups", std::move(groups)}};
}

ojson ToJson(const Hello& m) {
  return {{"type", "hello"},
          {"protocol", kBootstrapProtocolVersion},
          {"instance_id", m.instance_id},
          {"role", m.role},
          {"model", m.model},
          {"layout", LayoutJson(m.layout)},
          {"num_pages", m.num_pages},
          {"transport", m.transport},
          {"transport_descriptor", Base64Encode(m.transport_descriptor)}};
}

ojson ToJson(const RoomReady& m) {
  return {{"type", "room_ready"},
          {"room", m.room},
          {"prompt_tokens", m.prompt_tokens},
          {"first_page", m.first_page},
          {"dst_pages", m.dst_pages}};
}

ojson ToJson(const RoomDone& m) {
  ojson top = ojson::array();
  for (const FirstTokenLogprob& t : m.top_logprobs) {
    top.push_back({{"token", t.token}, {"logprob", FloatJson(t.logprob)}});
  }
  return {{"type", "room_done"},
          {"room", m.room},
          {"first_token", m.first_token},
          {"logprob", FloatJson(m.logprob)},
          {"top_logprobs", std::move(top)},
          {"prompt_tokens", m.prompt_tokens},
          {"cached_tokens", m.cached_tokens},
          {"finished", m.finished},
          {"finish_reason", m.finish_reason}};
}

ojson ToJson(const RoomFailed& m) {
  return {{"type", "room_failed"},
          {"room", m.room},
          {"reason", FailureReasonName(m.reason)},
          {"message", m.message}};
}

ojson ToJson(const Heartbeat& m) { return {{"type", "heartbeat"}, {"seq", m.seq}}; }

// ---- decoding ----------------------------------------------------------

// True when `s` opens more than `limit` arrays/objects at once (strings are
// skipped, escapes included). A cheap pass that keeps a hostile
// [[[[...]]]] of 16 MiB from becoming 16 million nlohmann nodes.
bool NestsDeeperThan(std::string_view s, int limit) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > limit) return true;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return false;
}

// Reads the fields of one JSON object; the first problem is kept and named
// "<type> field "<path>": <what>" (later reads become no-ops).
class Fields {
 public:
  Fields(const json& obj, std::string type, std::string prefix = "")
      : obj_(obj), type_(std::move(type)), prefix_(std::move(prefix)) {}

  const Status& status() const { return *status_; }
  bool ok() const { return status_->ok(); }

  // A child object/array reader shares this reader's status.
  Fields Child(const json& obj, const std::string& path) const {
    Fields f(obj, type_, path);
    f.status_ = status_;
    return f;
  }

  const json* Get(const char* key) {
    if (!ok()) return nullptr;
    auto it = obj_.find(key);
    if (it == obj_.end()) {
      Fail(key, "missing");
      return nullptr;
    }
    return &*it;
  }

  void Fail(const std::string& key, const std::string& what) {
    if (!ok()) return;
    *status_ = InvalidArgument(type_ + " field \"" + prefix_ + key + "\": " + what);
  }

  // An integer in [lo, hi] (floats such as 1.0 are refused: the encoder
  // never writes them).
  template <typename T>
  bool Int(const char* key, int64_t lo, int64_t hi, T* out) {
    const json* v = Get(key);
    return v != nullptr && IntValue(
                               *v, [key] { return std::string(key); }, lo, hi, out);
  }
  // `key` is only built on failure (dst_pages may hold a million entries).
  template <typename T, typename KeyFn>
  bool IntValue(const json& v, KeyFn key, int64_t lo, int64_t hi, T* out) {
    const bool in_range =
        v.is_number_integer() &&
        (v.is_number_unsigned()  // nlohmann parses every non-negative integer as unsigned
             ? (v.get<uint64_t>() <= static_cast<uint64_t>(hi) &&
                (lo <= 0 || v.get<uint64_t>() >= static_cast<uint64_t>(lo)))
             : (v.get<int64_t>() >= lo && v.get<int64_t>() <= hi));
    if (!in_range) {
      Fail(key(), "must be an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                      "], got " + JsonSnippet(v));
      return false;
    }
    *out = static_cast<T>(v.is_number_unsigned() ? static_cast<int64_t>(v.get<uint64_t>())
                                                 : v.get<int64_t>());
    return true;
  }

  bool U64(const char* key, uint64_t* out) {
    const json* v = Get(key);
    if (v == nullptr) return false;
    if (!v->is_number_unsigned()) {
      Fail(key, "must be an integer in [0, 2^64), got " + JsonSnippet(*v));
      return false;
    }
    *out = v->get<uint64_t>();
    return true;
  }

  bool Str(const char* key, std::string* out) {
    const json* v = Get(key);
    if (v == nullptr) return false;
    if (!v->is_string()) {
      Fail(key, "must be a string, got " + JsonSnippet(*v));
      return false;
    }
    *out = v->get<std::string>();
    return true;
  }

  bool Bool(const char* key, bool* out) {
    const json* v = Get(key);
    if (v == nullptr) return false;
    if (!v->is_boolean()) {
      Fail(key, "must be true or false, got " + JsonSnippet(*v));
      return false;
    }
    *out = v->get<bool>();
    return true;
  }

  // A float: a JSON number within float range, or "-inf", "inf", "nan".
  bool Float(const char* key, float* out) {
    const json* v = Get(key);
    if (v == nullptr) return false;
    if (v->is_string()) {
      const std::string& s = v->get_ref<const std::string&>();
      if (s == "-inf") {
        *out = -std::numeric_limits<float>::infinity();
      } else if (s == "inf") {
        *out = std::numeric_limits<float>::infinity();
      } else if (s == "nan") {
        *out = std::numeric_limits<float>::quiet_NaN();
      } else {
        Fail(key, "must be a number, \"-inf\", \"inf\" or \"nan\", got " + JsonSnippet(*v));
        return false;
      }
      return true;
    }
    if (!v->is_number()) {
      Fail(key, "must be a number, got " + JsonSnippet(*v));
      return false;
    }
    const double d = v->get<double>();
    // Casting a double outside float's range to float is undefined.
    if (!std::isfinite(d) || std::fabs(d) > std::numeric_limits<float>::max()) {
      Fail(key, "must be a number within float range, got " + JsonSnippet(*v));
      return false;
    }
    *out = static_cast<float>(d);
    return true;
  }

  const json* Array(const char* key) {
    const json* v = Get(key);
    if (v == nullptr) return nullptr;
    if (!v->is_array()) {
      Fail(key, "must be an array, got " + JsonSnippet(*v));
      return nullptr;
    }
    return v;
  }

  const json* Object(const char* key) {
    const json* v = Get(key);
    if (v == nullptr) return nullptr;
    if (!v->is_object()) {
      Fail(key, "must be an object, got " + JsonSnippet(*v));
      return nullptr;
    }
    return v;
  }

 private:
  const json& obj_;
  std::string type_;
  std::string prefix_;
  std::shared_ptr<Status> status_ = std::make_shared<Status>();
};

constexpr int64_t kI32Max = std::numeric_limits<int32_t>::max();

StatusOr<Message> DecodeHello(Fields& f) {
  Hello m;
  int protocol = 0;
  if (f.Int("protocol", 0, kI32Max, &protocol) && protocol != kBootstrapProtocolVersion) {
    f.Fail("protocol", "is " + std::to_string(protocol) + ", this build speaks " +
                           std::to_string(kBootstrapProtocolVersion) +
                           ": run the same Strata version on the prefill and decode servers");
  }
  if (f.Str("instance_id", &m.instance_id) && m.instance_id.empty()) {
    f.Fail("instance_id", "must not be empty");
  }
  if (f.Str("role", &m.role) && m.role != "prefill" && m.role != "decode") {
    f.Fail("role", "must be \"prefill\" or \"decode\", got " + JsonSnippet(json(m.role)));
  }
  f.Str("model", &m.model);
  if (const json* layout = f.Object("layout")) {
    Fields lf = f.Child(*layout, "layout.");
    lf.Int("page_size", 1, kMaxLayoutDim, &m.layout.page_size);
    if (const json* groups = lf.Array("groups")) {
      if (groups->empty() || static_cast<int64_t>(groups->size()) > kMaxLayoutGroups) {
        lf.Fail("groups", "must hold 1 to " + std::to_string(kMaxLayoutGroups) +
                              " pool groups, got " + std::to_string(groups->size()));
      }
      for (size_t i = 0; lf.ok() && i < groups->size(); ++i) {
        const std::string path = "layout.groups[" + std::to_string(i) + "]";
        const json& gj = (*groups)[i];
        if (!gj.is_object()) {
          lf.Fail("groups[" + std::to_string(i) + "]", "must be an object, got " + JsonSnippet(gj));
          break;
        }
        Fields gf = f.Child(gj, path + ".");
        PoolGroupSpec g;
        gf.Str("name", &g.name);
        gf.Int("num_layers", 1, kMaxLayoutDim, &g.num_layers);
        gf.Int("num_kv_heads", 1, kMaxLayoutDim, &g.num_kv_heads);
        gf.Int("head_dim", 1, kMaxLayoutDim, &g.head_dim);
        std::string dtype;
        if (gf.Str("dtype", &dtype) &&
            (!ParseDType(dtype, &g.dtype) ||
             (g.dtype != DType::kF32 && g.dtype != DType::kF16 && g.dtype != DType::kBF16))) {
          gf.Fail("dtype", "must be \"F32\", \"F16\" or \"BF16\", got " + JsonSnippet(json(dtype)));
        }
        gf.Bool("has_v", &g.has_v);
        gf.Int("sliding_window", 0, kI32Max, &g.sliding_window);
        gf.Int("tokens_per_entry", 1, kI32Max, &g.tokens_per_entry);
        m.layout.groups.push_back(std::move(g));
      }
    }
    if (f.ok()) {
      // What is left: unique, non-empty group names.
      const Status v = m.layout.Validate();
      if (!v.ok()) f.Fail("layout", v.message());
    }
  }
  f.Int("num_pages", 0, int64_t{1} << 30, &m.num_pages);
  f.Str("transport", &m.transport);
  std::string b64;
  if (f.Str("transport_descriptor", &b64) && !Base64Decode(b64, &m.transport_descriptor)) {
    f.Fail("transport_descriptor",
           "must be base64 (RFC 4648, padded), got " + JsonSnippet(json(b64)));
  }
  if (!f.ok()) return f.status();
  return Message(std::move(m));
}

StatusOr<Message> DecodeRoomReady(Fields& f) {
  RoomReady m;
  f.U64("room", &m.room);
  f.Int("prompt_tokens", 1, kMaxTokens, &m.prompt_tokens);
  f.Int("first_page", 0, kMaxTokens, &m.first_page);
  if (const json* pages = f.Array("dst_pages")) {
    m.dst_pages.reserve(pages->size());
    for (size_t i = 0; f.ok() && i < pages->size(); ++i) {
      int32_t p = 0;
      if (f.IntValue((*pages)[i], [i] { return "dst_pages[" + std::to_string(i) + "]"; }, 0,
                     kMaxKvPages - 1, &p)) {
        m.dst_pages.push_back(p);
      }
    }
  }
  if (!f.ok()) return f.status();
  return Message(std::move(m));
}

StatusOr<Message> DecodeRoomDone(Fields& f) {
  RoomDone m;
  f.U64("room", &m.room);
  f.Int("first_token", 0, kI32Max, &m.first_token);
  f.Float("logprob", &m.logprob);
  if (const json* top = f.Array("top_logprobs")) {
    for (size_t i = 0; f.ok() && i < top->size(); ++i) {
      const std::string path = "top_logprobs[" + std::to_string(i) + "]";
      const json& tj = (*top)[i];
      if (!tj.is_object()) {
        f.Fail(path, "must be an object, got " + JsonSnippet(tj));
        break;
      }
      Fields tf = f.Child(tj, path + ".");
      FirstTokenLogprob t;
      tf.Int("token", 0, kI32Max, &t.token);
      tf.Float("logprob", &t.logprob);
      m.top_logprobs.push_back(t);
    }
  }
  f.Int("prompt_tokens", 1, kMaxTokens, &m.prompt_tokens);
  if (f.Int("cached_tokens", 0, kMaxTokens, &m.cached_tokens) &&
      m.cached_tokens > m.prompt_tokens) {
    f.Fail("cached_tokens", "is " + std::to_string(m.cached_tokens) +
                                ", more than prompt_tokens (" + std::to_string(m.prompt_tokens) +
                                ")");
  }
  f.Bool("finished", &m.finished);
  f.Str("finish_reason", &m.finish_reason);
  if (!f.ok()) return f.status();
  return Message(std::move(m));
}

StatusOr<Message> DecodeRoomFailed(Fields& f) {
  RoomFailed m;
  f.U64("room", &m.room);
  std::string reason;
  if (f.Str("reason", &reason) && !ParseFailureReason(reason, &m.reason)) {
    f.Fail(
        "reason",
        "must be one of bootstrap_timeout, transfer_timeout, peer_lost, aborted, rejected; got " +
            JsonSnippet(json(reason)));
  }
  f.Str("message", &m.message);
  if (!f.ok()) return f.status();
  return Message(std::move(m));
}

StatusOr<Message> DecodeHeartbeat(Fields& f) {
  Heartbeat m;
  f.U64("seq", &m.seq);
  if (!f.ok()) return f.status();
  return Message(m);
}

StatusOr<Message> DecodeJson(std::string_view payload) {
  // nlohmann stops at a NUL byte as if the input ended there, which would
  // accept `{...}\0anything`; JSON text never holds a raw NUL.
  if (payload.find('\0') != std::string_view::npos) {
    return InvalidArgument("bootstrap message holds a NUL byte at offset " +
                           std::to_string(payload.find('\0')) + "; not a Strata bootstrap message");
  }
  if (NestsDeeperThan(payload, kMaxDepth)) {
    return InvalidArgument("bootstrap message nests deeper than " + std::to_string(kMaxDepth) +
                           " levels; not a Strata bootstrap message");
  }
  const json j = json::parse(payload.begin(), payload.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    return InvalidArgument("bootstrap message of " + std::to_string(payload.size()) +
                           " bytes is not valid JSON; is a Strata server of the same version "
                           "on the other side?");
  }
  if (!j.is_object())
    return InvalidArgument("bootstrap message must be a JSON object, got " + JsonSnippet(j));
  auto t = j.find("type");
  if (t == j.end() || !t->is_string()) {
    return InvalidArgument("bootstrap message has no string field \"type\"");
  }
  const std::string type = t->get<std::string>();
  Fields f(j, type);
  if (type == "hello") return DecodeHello(f);
  if (type == "room_ready") return DecodeRoomReady(f);
  if (type == "room_done") return DecodeRoomDone(f);
  if (type == "room_failed") return DecodeRoomFailed(f);
  if (type == "heartbeat") return DecodeHeartbeat(f);
  return InvalidArgument("bootstrap message has unknown type " + JsonSnippet(*t) +
                         " (known: hello, room_ready, room_done, room_failed, heartbeat)");
}

}  // namespace

const char* FailureReasonName(FailureReason reason) {
  switch (reason) {
    case FailureReason::kBootstrapTimeout:
      return "bootstrap_timeout";
    case FailureReason::kTransferTimeout:
      return "transfer_timeout";
    case FailureReason::kPeerLost:
      return "peer_lost";
    case FailureReason::kAborted:
      return "aborted";
    case FailureReason::kRejected:
      return "rejected";
  }
  return "aborted";
}

bool ParseFailureReason(std::string_view name, FailureReason* out) {
  static constexpr FailureReason kAll[] = {
      FailureReason::kBootstrapTimeout, FailureReason::kTransferTimeout, FailureReason::kPeerLost,
      FailureReason::kAborted, FailureReason::kRejected};
  for (FailureReason r : kAll) {
    if (name == FailureReasonName(r)) {
      *out = r;
      return true;
    }
  }
  return false;
}

std::string EncodeMessage(const Message& message) {
  const ojson j = std::visit([](const auto& m) { return ToJson(m); }, message);
  return j.dump(-1, ' ', false, ojson::error_handler_t::replace);
}

StatusOr<Message> DecodeMessage(std::string_view payload) {
  // nlohmann throws from a few corners even with allow_exceptions=false
  // (a number too large for a double: out_of_range); nothing escapes.
  try {
    return DecodeJson(payload);
  } catch (const std::exception& e) {
    return InvalidArgument(std::string("bootstrap message does not parse: ") + e.what());
  }
}

std::string NewInstanceId() {
  static constexpr char kHex[] = "0123456789abcdef";
  std::random_device rd;
  const uint64_t v = (uint64_t{rd()} << 32) ^ uint64_t { rd() };
  std::string s(16, '0');
  for (int i = 0; i < 16; ++i) s[i] = kHex[(v >> (60 - 4 * i)) & 15];
  return s;
}

}  // namespace strata::disagg
