// Fuzz target: one bootstrap frame payload through DecodeMessage.
// Checks: every error is InvalidArgument with a message; a message accepted
// re-encodes to a payload that decodes again and re-encodes to the same
// bytes (the encoder's output is a fixed point), and its fields are in the
// ranges bootstrap.h promises (a Hello's layout validates, pages and token
// counts in range).
#include "disagg/fuzz/bootstrap_fuzz.h"

#include <string>
#include <string_view>

#include "disagg/bootstrap.h"

namespace strata::fuzz {

namespace {

void CheckRanges(const disagg::Message& m) {
  if (const auto* h = std::get_if<disagg::Hello>(&m)) {
    FUZZ_CHECK(!h->instance_id.empty());
    FUZZ_CHECK(h->role == "prefill" || h->role == "decode");
    FUZZ_CHECK(h->layout.Validate().ok());
  } else if (const auto* r = std::get_if<disagg::RoomReady>(&m)) {
    FUZZ_CHECK(r->prompt_tokens >= 1 && r->first_page >= 0);
    for (int32_t p : r->dst_pages) FUZZ_CHECK(p >= 0 && p < kMaxKvPages);
  } else if (const auto* d = std::get_if<disagg::RoomDone>(&m)) {
    FUZZ_CHECK(d->first_token >= 0 && d->prompt_tokens >= 1);
    FUZZ_CHECK(d->cached_tokens >= 0 && d->cached_tokens <= d->prompt_tokens);
    for (const auto& t : d->top_logprobs) FUZZ_CHECK(t.token >= 0);
  }
}

}  // namespace

int BootstrapMessageOneInput(const uint8_t* data, size_t size) {
  const std::string_view payload(reinterpret_cast<const char*>(data), size);
  StatusOr<disagg::Message> m = disagg::DecodeMessage(payload);
  if (!m.ok()) {
    FUZZ_CHECK(m.status().code() == StatusCode::kInvalidArgument);
    FUZZ_CHECK(!m.status().message().empty());
    return 0;
  }
  CheckRanges(*m);
  const std::string again = disagg::EncodeMessage(*m);
  StatusOr<disagg::Message> m2 = disagg::DecodeMessage(again);
  FUZZ_CHECK(m2.ok());
  FUZZ_CHECK(m2->index() == m->index());
  FUZZ_CHECK(disagg::EncodeMessage(*m2) == again);
  return 0;
}

}  // namespace strata::fuzz

STRATA_FUZZ_ENTRY(BootstrapMessageOneInput)
