#include "disagg/page_grants.h"

#include <utility>

#include "disagg/page_ops.h"

namespace strata::disagg {

PageGrants::PageGrants(KvLayout layout, int64_t num_pages, RegionId first_region)
    : layout_(std::move(layout)), num_pages_(num_pages), first_region_(first_region) {}

void PageGrants::Grant(const std::string& key, std::span<const int32_t> pages) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& mine = by_key_[key];
  for (int32_t p : pages) {
    ++mine[p];
    ++any_[p];
  }
}

void PageGrants::Revoke(const std::string& key, std::span<const int32_t> pages) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_key_.find(key);
  if (it == by_key_.end()) return;
  for (int32_t p : pages) {
    auto mine = it->second.find(p);
    if (mine == it->second.end()) continue;  // not granted to it: nothing to undo
    if (--mine->second == 0) it->second.erase(mine);
    auto all = any_.find(p);
    if (all != any_.end() && --all->second == 0) any_.erase(all);
  }
  if (it->second.empty()) by_key_.erase(it);
}

std::string PageGrants::Check(const std::string& key, RegionId region, uint64_t offset,
                              uint64_t length) const {
  const int g = region - first_region_;
  StatusOr<std::vector<int32_t>> pages = PagesOfRange(layout_, num_pages_, g, offset, length);
  if (!pages.ok()) return "region " + std::to_string(region) + ": " + pages.status().message();
  std::lock_guard<std::mutex> lock(mu_);
  const std::unordered_map<int32_t, int>* granted = &any_;
  if (!key.empty()) {
    auto it = by_key_.find(key);
    static const std::unordered_map<int32_t, int> kNone;
    granted = it == by_key_.end() ? &kNone : &it->second;
  }
  for (int32_t p : *pages) {
    if (granted->count(p) == 0)
      return "page " + std::to_string(p) + " of group " + std::to_string(g) +
             " is not granted to " + (key.empty() ? std::string("any writer") : key) +
             " (no open room of it holds it)";
  }
  return "";
}

int64_t PageGrants::granted(const std::string& key) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_key_.find(key);
  return it == by_key_.end() ? 0 : static_cast<int64_t>(it->second.size());
}

}  // namespace strata::disagg
