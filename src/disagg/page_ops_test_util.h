// The KV layout the page tests share (page_ops_test, page_grants_test).
#pragma once

#include "cache/kv_layout.h"

namespace strata::disagg {

// Two groups: "full" K+V in bf16 and "latent" K only in f32 (an MLA-like
// cache), so the two run sizes and the T = 2 / T = 1 strides differ.
inline KvLayout TwoGroups(int page_size) {
  KvLayout l;
  l.page_size = page_size;
  l.groups.push_back({"full", 2, 2, 4, DType::kBF16, true, 0});    // 16 B/token/tensor
  l.groups.push_back({"latent", 3, 1, 8, DType::kF32, false, 0});  // 32 B/token/tensor
  return l;
}

}  // namespace strata::disagg
