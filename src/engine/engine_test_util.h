// Test helper: a CPU backend, a fixture model and an Engine over them, for
// the engine's tests on a real (tiny) model.
// REQUIRES: STRATA_SOURCE_DIR defined by the build; gtest.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "engine/engine.h"

namespace strata::test {

struct EngineStack {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<LoadedModel> model;
  std::unique_ptr<Engine> engine;
};

// One-thread CPU backend, tests/fixtures/models/<fixture>, Engine::Create(eo).
inline EngineStack MakeEngineStack(const EngineOptions& eo,
                                   const std::string& fixture = "llama_default") {
  EngineStack s;
  CpuBackendOptions bo;
  bo.num_threads = 1;
  s.backend = std::move(*CreateCpuBackend(bo));
  LoadOptions lo;
  lo.model.max_batch_tokens = eo.chunked_prefill_size + eo.max_running_requests;
  auto m = LoadModelDir(std::string(STRATA_SOURCE_DIR) + "/tests/fixtures/models/" + fixture,
                        *s.backend, lo);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  if (!m.ok()) return s;
  s.model = std::move(*m);
  auto e = Engine::Create(*s.model, *s.backend, eo);
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  if (e.ok()) s.engine = std::move(*e);
  return s;
}

}  // namespace strata::test
