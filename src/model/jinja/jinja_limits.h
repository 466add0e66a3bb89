// What one Render of a chat template may cost. The template comes with the
// model, but a hostile or broken one must fail its request with a clear
// error, not exhaust memory or spin forever: `{{ 'a' * 10**12 }}`,
// `{% for i in range(100000) %}{% for j in range(100000) %}`, a string that
// doubles in a loop. Plain data; thread-safe to share.
#pragma once

#include <cstddef>
#include <cstdint>

namespace strata::jinja {

struct RenderLimits {
  // Any string the template builds, the rendered prompt included: above the
  // largest request body (32 MiB), so every prompt a client can send renders.
  size_t max_output_bytes = 64u << 20;
  // Loop iterations, macro calls and list elements built by * and +, summed
  // over the render: real templates take one pass over the messages (and
  // tools), a few iterations each.
  int64_t max_steps = 10'000'000;
};

}  // namespace strata::jinja
