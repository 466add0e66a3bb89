// ResponseStore: the in-memory store behind /v1/responses' `store: true`
// (OpenAI's default): finished responses and their items by id, so that a
// later request can continue a conversation with `previous_response_id`,
// refer to an earlier item with `item_reference` (the Vercel AI SDK's
// default provider does, in every multi-step tool loop), and clients can
// GET / DELETE /v1/responses/{id}.
//
// Bounded: at most Options::max_items responses and Options::max_bytes bytes
// (the serialised JSON of what is kept, which is what is held: entries are
// kept as text, parsed on use). Past either bound the least recently used
// responses are evicted, whole (a response with all its items); a lookup
// (Get, Conversation, Item) makes a response the most recently used. One
// larger than max_bytes on its own is not kept at all. Nothing expires by
// time; nothing survives a restart, and replicas share nothing, so a lookup
// behind a load balancer may reach a server that never saw the id (the
// server's 404 says so).
//
// Each response keeps its whole conversation, flattened: the input items the
// model saw (the previous response's conversation, then the request's own
// input, references resolved) and its output items. So a conversation goes
// on after its earlier responses were evicted, and a lookup never walks a
// chain; the cost is that a long chain keeps its prefix once per response,
// which the byte bound accounts.
//
// Thread-safety: every method may be called from any thread; entries are
// immutable once stored, and are parsed outside the lock.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace strata {

struct ResponseStoreOptions {
  int64_t max_items = 10000;               // --responses-store-max-items (0: store nothing)
  int64_t max_bytes = int64_t{256} << 20;  // --responses-store-max-bytes
};

class ResponseStore {
 public:
  explicit ResponseStore(ResponseStoreOptions options);

  bool enabled() const { return options_.max_items > 0 && options_.max_bytes > 0; }
  const ResponseStoreOptions& options() const { return options_; }

  // Keeps a finished response: `response` the object as answered (its
  // "output" the output items), `input_items` the conversation before it
  // (reference-free items). Replaces an entry of the same id. Evicts least
  // recently used responses until the bounds hold; returns false (and keeps
  // nothing) when this one alone is larger than max_bytes or the store is
  // disabled.
  bool Put(const std::string& id, const nlohmann::ordered_json& response,
           const nlohmann::ordered_json& input_items);

  // The response object, or nullopt when unknown (never stored, deleted,
  // evicted).
  std::optional<nlohmann::ordered_json> Get(const std::string& id);
  // Its conversation: input items, then output items; nullopt when unknown.
  std::optional<nlohmann::ordered_json> Conversation(const std::string& id);
  // The input items alone; nullopt when unknown.
  std::optional<nlohmann::ordered_json> InputItems(const std::string& id);
  // An item (input or output) of a kept response by its "id", from the
  // response that stored it last; nullopt when unknown.
  std::optional<nlohmann::ordered_json> Item(const std::string& item_id);
  // Removes a response and its items; false when unknown.
  bool Delete(const std::string& id);

  struct Stats {
    int64_t responses = 0;
    int64_t bytes = 0;
    int64_t evicted_max_items = 0;  // evicted to stay within max_items
    int64_t evicted_max_bytes = 0;  // evicted to stay within max_bytes
    int64_t too_large = 0;          // not kept: larger than max_bytes alone
  };
  Stats stats() const;

  // Every invariant (index, LRU list and byte count agree); for tests.
  bool CheckIntegrity() const;

 private:
  struct Entry {
    std::string id;
    std::string response;             // the object, serialised
    std::vector<std::string> input;   // the input items, serialised
    std::vector<std::string> output;  // the output items, serialised
    // The items with an "id": (id, index into input then output).
    std::vector<std::pair<std::string, size_t>> item_ids;
    int64_t bytes = 0;
  };
  using Lru = std::list<std::shared_ptr<const Entry>>;  // most recent first

  // REQUIRES: mu_ held.
  std::shared_ptr<const Entry> Touch(const std::string& id);
  void Remove(Lru::iterator it);

  const ResponseStoreOptions options_;
  mutable std::mutex mu_;
  Lru lru_;
  std::unordered_map<std::string, Lru::iterator> by_id_;
  // item id -> (response id, index into input then output).
  struct ItemAt {
    std::string response;
    size_t index = 0;
  };
  std::unordered_map<std::string, ItemAt> items_;
  Stats stats_;
};

}  // namespace strata
