// Stop strings over a streamed text: finds OpenAI `stop` sequences in the
// detokenized output even when one is split over many tokens, and tells the
// caller which text is safe to send to the client now.
//
// Feed it the pieces IncrementalDecoder returns, in order. It holds back the
// longest tail of the text that could still grow into a stop string, so a
// stop string (and everything after it) never reaches the client; the text
// before it always does. A stop string matches as soon as it is complete
// (vLLM and HF also stop at the first step where any stop string appears).
// When one piece completes several, the one that would have completed first
// had the text come byte by byte wins: smallest end, then earliest start,
// then the earlier one in the request's list. So the result does not depend
// on how the text was cut into tokens.
//
// Matching is byte-exact on UTF-8. The text held back always starts where a
// stop string starts, so emitted text never splits a UTF-8 character when
// the input pieces are whole characters (IncrementalDecoder's are).
//
// Thread-safety: one StopMatcher per output stream, used by one thread.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace strata {

class StopMatcher {
 public:
  // REQUIRES: no stop string is empty (the request parser rejects them).
  // include_stop_str: vLLM's include_stop_str_in_output, emit the matched
  // stop string itself (never what follows it).
  explicit StopMatcher(std::vector<std::string> stops, bool include_stop_str = false);

  struct Result {
    std::string text;                  // safe to send now (may be empty)
    std::optional<size_t> stop_index;  // set when this piece completed a stop string
  };

  // Appends the next decoded piece. Once a stop string matched, the stream
  // is finished: later calls return nothing.
  Result Add(std::string_view piece);

  // End of the stream without a stop match (EOS, length, abort): returns the
  // text still held back. Empty after a stop match.
  std::string Flush();

  bool stopped() const { return stop_index_.has_value(); }
  // The stop string that matched; REQUIRES: stopped().
  const std::string& matched() const { return stops_[*stop_index_]; }
  std::optional<size_t> stop_index() const { return stop_index_; }
  const std::vector<std::string>& stops() const { return stops_; }

 private:
  // Length of the longest suffix of text_ that is a proper prefix of some
  // stop string (0 if none).
  size_t HoldBackLength() const;

  std::vector<std::string> stops_;
  bool include_stop_str_ = false;
  size_t max_stop_len_ = 0;
  std::string text_;  // held back: a possible start of a stop string
  std::optional<size_t> stop_index_;
};

}  // namespace strata
