#include "server/response_store.h"

#include <utility>

#include "server/openai_response.h"

namespace strata {

using Json = nlohmann::ordered_json;

ResponseStore::ResponseStore(ResponseStoreOptions options) : options_(options) {}

bool ResponseStore::Put(const std::string& id, const Json& response, const Json& input_items) {
  if (!enabled()) return false;
  // Serialised outside the lock: the store keeps text (the bytes it counts).
  auto e = std::make_shared<Entry>();
  e->id = id;
  e->response = DumpJson(response);
  e->bytes = static_cast<int64_t>(id.size() + e->response.size());
  size_t index = 0;  // into input, then output
  auto keep = [&](const Json& items, std::vector<std::string>* out) {
    if (!items.is_array()) return;
    for (const Json& item : items) {
      out->push_back(DumpJson(item));
      e->bytes += static_cast<int64_t>(out->back().size());
      if (const auto it = item.find("id"); it != item.end() && it->is_string())
        e->item_ids.emplace_back(it->get<std::string>(), index);
      ++index;
    }
  };
  keep(input_items, &e->input);
  if (const auto out = response.find("output"); out != response.end()) keep(*out, &e->output);

  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = by_id_.find(id); it != by_id_.end()) Remove(it->second);
  if (e->bytes > options_.max_bytes) {
    stats_.too_large++;
    return false;
  }
  while (!lru_.empty() && stats_.responses + 1 > options_.max_items) {
    Remove(std::prev(lru_.end()));
    stats_.evicted_max_items++;
  }
  while (!lru_.empty() && stats_.bytes + e->bytes > options_.max_bytes) {
    Remove(std::prev(lru_.end()));
    stats_.evicted_max_bytes++;
  }
  lru_.push_front(e);
  by_id_[id] = lru_.begin();
  for (const auto& [item, index] : e->item_ids) items_[item] = ItemAt{id, index};  // newest wins
  stats_.responses++;
  stats_.bytes += e->bytes;
  return true;
}

void ResponseStore::Remove(Lru::iterator it) {
  const Entry& e = **it;
  for (const auto& [item, index] : e.item_ids)
    if (auto at = items_.find(item); at != items_.end() && at->second.response == e.id)
      items_.erase(at);
  stats_.responses--;
  stats_.bytes -= e.bytes;
  by_id_.erase(e.id);
  lru_.erase(it);
}

std::shared_ptr<const ResponseStore::Entry> ResponseStore::Touch(const std::string& id) {
  auto it = by_id_.find(id);
  if (it == by_id_.end()) return nullptr;
  lru_.splice(lru_.begin(), lru_, it->second);  // iterators stay valid
  return lru_.front();
}

std::optional<Json> ResponseStore::Get(const std::string& id) {
  std::shared_ptr<const Entry> e;
  {
    std::lock_guard<std::mutex> lock(mu_);
    e = Touch(id);
  }
  if (!e) return std::nullopt;
  return Json::parse(e->response);
}

std::optional<Json> ResponseStore::Conversation(const std::string& id) {
  std::shared_ptr<const Entry> e;
  {
    std::lock_guard<std::mutex> lock(mu_);
    e = Touch(id);
  }
  if (!e) return std::nullopt;
  Json items = Json::array();
  for (const std::string& s : e->input) items.push_back(Json::parse(s));
  for (const std::string& s : e->output) items.push_back(Json::parse(s));
  return items;
}

std::optional<Json> ResponseStore::InputItems(const std::string& id) {
  std::shared_ptr<const Entry> e;
  {
    std::lock_guard<std::mutex> lock(mu_);
    e = Touch(id);
  }
  if (!e) return std::nullopt;
  Json items = Json::array();
  for (const std::string& s : e->input) items.push_back(Json::parse(s));
  return items;
}

std::optional<Json> ResponseStore::Item(const std::string& item_id) {
  std::shared_ptr<const Entry> e;
  size_t index = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto at = items_.find(item_id);
    if (at == items_.end()) return std::nullopt;
    index = at->second.index;
    e = Touch(at->second.response);
  }
  if (!e) return std::nullopt;  // never: the index follows the entries
  return Json::parse(index < e->input.size() ? e->input[index]
                                             : e->output[index - e->input.size()]);
}

bool ResponseStore::Delete(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_id_.find(id);
  if (it == by_id_.end()) return false;
  Remove(it->second);
  return true;
}

ResponseStore::Stats ResponseStore::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

bool ResponseStore::CheckIntegrity() const {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t bytes = 0, n = 0;
  for (auto it = lru_.begin(); it != lru_.end(); ++it) {
    const Entry& e = **it;
    auto found = by_id_.find(e.id);
    if (found == by_id_.end() || found->second != it) return false;
    bytes += e.bytes;
    ++n;
  }
  for (const auto& [item, at] : items_) {
    auto found = by_id_.find(at.response);
    if (found == by_id_.end()) return false;
    const Entry& e = **found->second;
    if (at.index >= e.input.size() + e.output.size()) return false;
  }
  return n == stats_.responses && static_cast<size_t>(n) == by_id_.size() &&
         bytes == stats_.bytes && n <= options_.max_items && bytes <= options_.max_bytes;
}

}  // namespace strata
