#include "server/stop_matcher.h"

#include <algorithm>
#include <utility>

namespace strata {

StopMatcher::StopMatcher(std::vector<std::string> stops, bool include_stop_str)
    : stops_(std::move(stops)), include_stop_str_(include_stop_str) {
  for (const std::string& s : stops_) max_stop_len_ = std::max(max_stop_len_, s.size());
}

StopMatcher::Result StopMatcher::Add(std::string_view piece) {
  Result result;
  if (stopped()) return result;
  if (stops_.empty()) {
    result.text.assign(piece);
    return result;
  }
  // Every stop string found in the previous text_ would already have matched,
  // so a match now must end inside `piece`: search only from where such a
  // match could start.
  const size_t old_size = text_.size();
  text_.append(piece);
  // The stop that completes first wins, as if the text arrived one byte at a
  // time: smallest end, then earliest start, then the earlier listed. So the
  // result does not depend on how the text was cut into tokens.
  size_t best_pos = std::string::npos;
  size_t best_end = std::string::npos;
  size_t best_index = 0;
  for (size_t i = 0; i < stops_.size(); ++i) {
    const std::string& s = stops_[i];
    if (s.empty() || s.size() > text_.size()) continue;
    size_t from = old_size + 1 > s.size() ? old_size + 1 - s.size() : 0;
    size_t pos = text_.find(s, from);
    if (pos == std::string::npos) continue;
    size_t end = pos + s.size();
    if (end < best_end || (end == best_end && pos < best_pos)) {
      best_pos = pos;
      best_end = end;
      best_index = i;
    }
  }
  if (best_pos != std::string::npos) {
    stop_index_ = best_index;
    size_t end = best_pos + (include_stop_str_ ? stops_[best_index].size() : 0);
    result.text = text_.substr(0, end);
    result.stop_index = best_index;
    text_.clear();
    return result;
  }
  size_t hold = HoldBackLength();
  result.text = text_.substr(0, text_.size() - hold);
  text_.erase(0, text_.size() - hold);
  return result;
}

std::string StopMatcher::Flush() {
  std::string out;
  out.swap(text_);
  return out;
}

size_t StopMatcher::HoldBackLength() const {
  // A proper prefix of a stop string is shorter than the longest stop.
  size_t longest = std::min(text_.size(), max_stop_len_ > 0 ? max_stop_len_ - 1 : 0);
  for (size_t len = longest; len > 0; --len) {
    std::string_view tail(text_.data() + text_.size() - len, len);
    for (const std::string& s : stops_) {
      if (s.size() > len && std::string_view(s).substr(0, len) == tail) return len;
    }
  }
  return 0;
}

}  // namespace strata
