#include "server/json_body.h"

#include <algorithm>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace strata {
namespace {

using Json = nlohmann::ordered_json;

// A SAX handler (nlohmann's interface) that builds the DOM in linear time,
// bounds the nesting depth, and keeps the parse error instead of throwing it.
//
// Values are appended to the underlying vector of the ordered object (not
// inserted through ordered_map, whose every insert searches all keys).
// Pointers into a container stay valid while it is open: only the innermost
// open container grows.
class LinearDomBuilder {
 public:
  LinearDomBuilder(Json& root, int max_depth) : root_(root), max_depth_(max_depth) {}

  bool null() { return Put(nullptr); }
  bool boolean(bool v) { return Put(v); }
  bool number_integer(Json::number_integer_t v) { return Put(v); }
  bool number_unsigned(Json::number_unsigned_t v) { return Put(v); }
  bool number_float(Json::number_float_t v, const Json::string_t& /*text*/) { return Put(v); }
  bool string(Json::string_t& v) { return Put(std::move(v)); }
  bool binary(Json::binary_t& /*v*/) {  // only binary formats (CBOR, ...) produce these
    error_ = "binary values are not JSON";
    return false;
  }
  bool start_object(std::size_t /*size: unknown for text*/) { return Open(Json::object()); }
  bool start_array(std::size_t /*size*/) { return Open(Json::array()); }
  bool end_object() { return Close(); }
  bool end_array() { return Close(); }

  bool key(Json::string_t& k) {
    Frame& f = stack_.back();
    Items& items = f.value->get_ref<Json::object_t&>();
    if (std::optional<size_t> at = f.Find(k, items)) {
      slot_ = &items[*at].second;  // duplicate: first position, last value
      *slot_ = nullptr;
      return true;
    }
    items.emplace_back(std::move(k), nullptr);
    f.Added(items);
    slot_ = &items.back().second;
    return true;
  }

  bool parse_error(std::size_t /*position*/, const std::string& /*last_token*/,
                   const nlohmann::detail::exception& ex) {
    error_ = ex.what();
    // "[json.exception.parse_error.101] parse error at line 1, column 2: ..."
    if (size_t p = error_.find("] ");
        error_.rfind("[json.exception.", 0) == 0 && p != std::string::npos) {
      error_.erase(0, p + 2);
    }
    // "last read: '<token>'" can quote a huge token; keep messages short.
    if (error_.size() > 160) error_ = error_.substr(0, 157) + "...";
    return false;
  }

  const std::string& error() const { return error_; }

 private:
  // Objects up to this many keys are searched linearly for duplicates;
  // larger ones get a hash index of their keys.
  static constexpr size_t kLinearKeys = 16;
  // The vector under ordered_map (whose own operator[] and emplace search).
  using Items = Json::object_t::Container;

  // Positions of an object's keys in an open-addressing table (linear
  // probing, at most half full), so a key is found without copying keys.
  class KeyIndex {
   public:
    std::optional<size_t> Find(const std::string& k, const Items& items) const {
      if (slots_.empty()) return std::nullopt;
      for (size_t i = Hash(k) & Mask();; i = (i + 1) & Mask()) {
        if (slots_[i] == 0) return std::nullopt;
        if (items[slots_[i] - 1].first == k) return slots_[i] - 1;
      }
    }
    // REQUIRES: items[pos]'s key is not in the index yet.
    void Insert(size_t pos, const Items& items) {
      if (2 * (count_ + 1) > slots_.size()) Rehash(std::max<size_t>(64, 2 * slots_.size()), items);
      Place(pos, items);
      ++count_;
    }

   private:
    static size_t Hash(std::string_view k) { return std::hash<std::string_view>()(k); }
    size_t Mask() const { return slots_.size() - 1; }
    void Place(size_t pos, const Items& items) {
      size_t i = Hash(items[pos].first) & Mask();
      while (slots_[i] != 0) i = (i + 1) & Mask();
      slots_[i] = pos + 1;
    }
    void Rehash(size_t size, const Items& items) {
      std::vector<size_t> old = std::move(slots_);
      slots_.assign(size, 0);
      for (size_t s : old)
        if (s != 0) Place(s - 1, items);
    }
    std::vector<size_t> slots_;  // position + 1; 0 is empty
    size_t count_ = 0;
  };

  struct Frame {
    Json* value;     // the open object or array
    KeyIndex index;  // objects past kLinearKeys keys

    std::optional<size_t> Find(const std::string& k, const Items& items) const {
      if (items.size() > kLinearKeys) return index.Find(k, items);
      for (size_t i = 0; i < items.size(); ++i)
        if (items[i].first == k) return i;
      return std::nullopt;
    }
    // After a new key was appended: the index covers every key once the
    // object is past kLinearKeys.
    void Added(const Items& items) {
      if (items.size() < kLinearKeys + 1) return;
      if (items.size() == kLinearKeys + 1) {
        for (size_t i = 0; i < items.size(); ++i) index.Insert(i, items);
      } else {
        index.Insert(items.size() - 1, items);
      }
    }
  };

  // Stores a value where the grammar says it goes: the root, the end of the
  // open array, or the slot of the key just read. Returns where it went.
  Json* Place(Json&& v) {
    if (stack_.empty()) {
      root_ = std::move(v);
      return &root_;
    }
    Json& parent = *stack_.back().value;
    if (parent.is_array()) {
      auto& arr = parent.get_ref<Json::array_t&>();
      arr.push_back(std::move(v));
      return &arr.back();
    }
    *slot_ = std::move(v);
    return slot_;
  }
  bool Put(Json&& v) {
    Place(std::move(v));
    return true;
  }
  bool Open(Json&& container) {
    if (static_cast<int>(stack_.size()) >= max_depth_) {
      error_ = "nested deeper than " + std::to_string(max_depth_) + " levels";
      return false;
    }
    Json* at = Place(std::move(container));
    stack_.push_back(Frame{at, {}});
    return true;
  }
  bool Close() {
    stack_.pop_back();
    return true;
  }

  Json& root_;
  int max_depth_;
  std::vector<Frame> stack_;
  Json* slot_ = nullptr;  // the value of the key read last
  std::string error_;
};

}  // namespace

ApiOr<nlohmann::ordered_json> ParseJsonBody(std::string_view body, int max_depth) {
  Json root;
  LinearDomBuilder sax(root, max_depth);
  bool ok = Json::sax_parse(body.begin(), body.end(), &sax, nlohmann::detail::input_format_t::json,
                            /*strict=*/true);
  if (!ok || !sax.error().empty()) {
    return InvalidRequestError(
        "", "invalid JSON: " + (sax.error().empty() ? std::string("parse error") : sax.error()));
  }
  return root;
}

}  // namespace strata
