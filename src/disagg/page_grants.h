// PageGrants: which pages of a decode's KV pool each prefill may write now,
// for the receiving side's check of writes (KvTransport::SetWriteGuard).
// The decode grants a room's pages to the prefill connection that serves it
// when it sends RoomReady, and revokes them when the room's writes are over
// (RoomDone, or the room's request ended and its pages go back to the
// pool). So a write that arrives late, from a prefill that was stopped
// while the decode gave up the room, is refused instead of landing in pages
// another request now holds. Only writes this process applies itself can be
// checked (over UCX: tcp); disagg.md "Known limit".
//
// Thread-safe: Grant/Revoke from the PD role, Check from the transport's
// progress thread.
#pragma once

#include <cstdint>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>

#include "cache/kv_layout.h"
#include "disagg/kv_transport.h"

namespace strata::disagg {

class PageGrants {
 public:
  // The pool the writes land in: group g is region first_region + g, each
  // laid out as page_ops.h says, `num_pages` pages.
  PageGrants(KvLayout layout, int64_t num_pages, RegionId first_region = 0);

  // Grants `pages` to `key` (a page granted twice needs two revokes).
  void Grant(const std::string& key, std::span<const int32_t> pages);
  void Revoke(const std::string& key, std::span<const int32_t> pages);

  // "" when every page that bytes [offset, offset + length) of `region`
  // touch is granted to `key` ("": the shared descriptor's writers, whose
  // connection is not known: granted to anyone); else why not, e.g. "page 7
  // of group 1 is not granted to bootstrap#3 (no open room of it holds it)".
  std::string Check(const std::string& key, RegionId region, uint64_t offset,
                    uint64_t length) const;

  // Pages granted to `key` now (for tests and logs).
  int64_t granted(const std::string& key) const;

 private:
  const KvLayout layout_;
  const int64_t num_pages_;
  const RegionId first_region_;
  mutable std::mutex mu_;
  // Guarded by mu_: grants by key, then by page; and over all keys.
  std::unordered_map<std::string, std::unordered_map<int32_t, int>> by_key_;
  std::unordered_map<int32_t, int> any_;
};

}  // namespace strata::disagg
