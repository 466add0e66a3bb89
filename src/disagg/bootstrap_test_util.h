// Fixtures shared by the bootstrap tests (bootstrap_messages_test.cc,
// bootstrap_test.cc): a KV layout and a Hello of either role.
#pragma once

#include <string>

#include "disagg/bootstrap.h"

namespace strata::disagg::test {

inline PoolGroupSpec Group(const char* name, int layers, int heads, int dim, DType dtype,
                           bool has_v, int window = 0) {
  PoolGroupSpec g;
  g.name = name;
  g.num_layers = layers;
  g.num_kv_heads = heads;
  g.head_dim = dim;
  g.dtype = dtype;
  g.has_v = has_v;
  g.sliding_window = window;
  return g;
}

inline KvLayout TestLayout() {
  KvLayout l;
  l.page_size = 16;
  l.groups = {Group("full_attention", 28, 4, 128, DType::kBF16, true)};
  return l;
}

inline Hello MakeHello(const std::string& role, std::string instance = "") {
  Hello h;
  h.instance_id = instance.empty() ? NewInstanceId() : instance;
  h.role = role;
  h.model = "test-model";
  h.layout = TestLayout();
  h.num_pages = 4096;
  h.transport = "ucx";
  if (role == "decode") h.transport_descriptor = std::string("\x00\x01\xfe\xff ucx", 8);
  return h;
}

}  // namespace strata::disagg::test
