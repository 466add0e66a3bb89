// OpenAiServer: the HTTP endpoints of `strata serve`, wiring the transport
// (http_server.h), the protocol (openai_protocol.h / openai_response.h), the
// tokenizer and chat template, and the AsyncEngine.
//
//   GET  /health             200 when ready; 503 while draining
//   GET  /metrics            Prometheus text
//   GET  /v1/models
//   POST /v1/completions, /v1/chat/completions  (stream or not)
//   POST /tokenize, /detokenize                   (vLLM's shapes)
//   GET  /debug/integrity    KV cache / prefix cache invariants, checked when idle
//
// Request path: an I/O thread parses and validates, tokenizes, and submits
// every choice to the AsyncEngine (admission control may refuse at once:
// 503 + Retry-After, nothing queued). Engine output is processed by a small
// pool of output threads (detokenize, stop strings, SSE), never by the engine
// thread and never blocking an I/O thread. A streaming response sends its
// headers with its first output, so a request that fails before producing
// anything (e.g. its queue deadline passed) still gets a plain 503.
// A client that disconnects cancels its requests; the engine frees their
// pages at its next step.
//
// Thread-safety: Start/BeginDrain/Stop from one controlling thread.
#pragma once

#include <memory>
#include <string>

#include "engine/async_engine.h"
#include "metrics/metrics.h"
#include "model/model_dir.h"
#include "server/http_server.h"
#include "server/openai_protocol.h"

namespace strata {

struct ServerOptions {
  std::string served_model_name;  // what /v1/models lists and requests may name
  std::string api_key;            // non-empty: /v1/*, /tokenize, /detokenize need "Bearer <key>"
  HttpServerOptions http;
  int output_threads = 1;
};

class OpenAiServer {
 public:
  // `model`, `engine` and `registry` must outlive the server. `http`: an
  // already-bound transport (so that a bad address fails before the model
  // loads), created with options.http and api_key = options.api_key; null:
  // one is created from those.
  static StatusOr<std::unique_ptr<OpenAiServer>> Create(const LoadedModel& model, AsyncEngine& engine,
                                                        metrics::Registry& registry,
                                                        const ServerOptions& options,
                                                        std::unique_ptr<HttpServer> http = nullptr);
  ~OpenAiServer();

  Status Start();
  int port() const;
  // /health turns 503 and the engine stops admitting; in-flight requests finish.
  void BeginDrain();
  bool draining() const;
  // Requests whose responses are still being produced.
  int64_t in_flight() const;
  // Ends every in-flight response now: its engine requests are cancelled,
  // streams end with an error event, others get 503 with `why`.
  // Thread-safe.
  void AbortInFlight(const std::string& why);
  // Closes the listener and every connection; joins threads.
  void Stop();

  struct Impl;

 private:
  explicit OpenAiServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata
