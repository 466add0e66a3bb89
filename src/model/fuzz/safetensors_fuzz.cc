// Fuzz target: one safetensors file's bytes (8-byte header length, JSON
// header, data area) through the parser WeightStore::Open uses per file, and
// the finite-value sample of every tensor it accepts.
// Checks: errors are DataLoss/Unimplemented with a message; every accepted
// tensor lies inside the data area, its byte size equals shape x dtype size,
// names are unique and no two tensors overlap.
#include <algorithm>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "model/fuzz/model_fuzz.h"
#include "model/weights.h"

namespace strata::fuzz {

int SafetensorsOneInput(const uint8_t* data, size_t size) {
  // libFuzzer passes a heap copy of exactly `size` bytes, so ASan reports any
  // read past the end, as a read past the end of a mapped file would fault.
  auto infos = ParseSafetensorsBytes(data, size, "fuzz.safetensors");
  if (!infos.ok()) {
    const StatusCode code = infos.status().code();
    FUZZ_CHECK(code == StatusCode::kDataLoss || code == StatusCode::kUnimplemented);
    FUZZ_CHECK(!infos.status().message().empty());
    return 0;
  }
  FUZZ_CHECK(size >= 8);
  std::set<std::string> names;
  std::vector<std::pair<const uint8_t*, const uint8_t*>> ranges;
  for (const WeightInfo& w : *infos) {
    FUZZ_CHECK(names.insert(w.name).second);
    const auto* begin = static_cast<const uint8_t*>(w.data);
    FUZZ_CHECK(begin >= data + 8 && begin <= data + size);
    FUZZ_CHECK(w.nbytes <= static_cast<size_t>(data + size - begin));
    uint64_t elems = 1;
    for (int64_t d : w.shape) {
      FUZZ_CHECK(d >= 0);
      FUZZ_CHECK(!__builtin_mul_overflow(elems, static_cast<uint64_t>(d), &elems));
    }
    FUZZ_CHECK(elems * DTypeSize(w.dtype) == w.nbytes);
    if (w.nbytes > 0) {
      volatile uint8_t sink = begin[0] ^ begin[w.nbytes - 1];
      (void)sink;
      ranges.push_back({begin, begin + w.nbytes});
    }
    const FiniteSample s = SampleFinite(w);
    FUZZ_CHECK(s.sampled <= kFiniteSampleCount + 2);
    FUZZ_CHECK(s.nan + s.inf <= s.sampled);
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) FUZZ_CHECK(ranges[i].first >= ranges[i - 1].second);
  return 0;
}

}  // namespace strata::fuzz

STRATA_FUZZ_ENTRY(SafetensorsOneInput)
