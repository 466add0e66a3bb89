// OpenAiServer: the HTTP endpoints of `strata serve`, wiring the transport
// (http_server.h), the protocol (openai_protocol.h / openai_response.h), the
// tokenizer and chat template, and the AsyncEngine.
//
//   GET  /health             200 when ready; 503 while draining
//   GET  /metrics            Prometheus text
//   GET  /server_info        (public; alias /get_server_info) role, disaggregation_mode,
//                            model, instance_id, page_size (docs/architecture/disagg.md)
//   GET  /load               (public) running, queued, queued_tokens, pages_free (free +
//                            evictable cached pages), for `strata router`
//   GET  /v1/models
//   GET  /v1/models/{id}     the model object, or 404 model_not_found
//   POST /v1/completions, /v1/chat/completions  (stream or not)
//   POST /v1/responses       the Responses API, run as chat (openai_responses.h)
//   GET, DELETE /v1/responses/{id}, GET /v1/responses/{id}/input_items
//                            a stored response (response_store.h), or 404
//   POST /tokenize, /detokenize                   (vLLM's shapes)
//   GET  /debug/integrity    (API key) KV cache / prefix cache invariants, checked
//                            by the engine thread when idle, one check at a time;
//                            503 + Retry-After while one is pending or the engine stays busy
//
// Request path: the I/O thread checks the API key and queues the request to
// a small pool of request threads (ServerOptions::request_threads), which
// parse and validate, render the chat template, tokenize, and submit all
// choices at once to the AsyncEngine (admission control may refuse at once:
// 503 + Retry-After, nothing queued; a request that can never be admitted is
// a 400 naming the limit). So a huge body costs a request thread, never the
// I/O threads: /health, /metrics and every stream keep flowing. Engine
// output is processed by a small pool of output threads (detokenize, stop
// strings, SSE), never by the engine thread and never blocking an I/O
// thread. A streaming response sends its headers with its first output, so a
// request that fails before producing anything (e.g. its queue deadline
// passed) still gets a plain 503. A client that disconnects cancels its
// requests; the engine frees their pages at its next step.
//
// Ownership: the server owns its request and output threads and joins them
// in Stop(); it starts no other thread.
// Thread-safety: Start/BeginDrain/Stop from one controlling thread;
// AbortInFlight, draining and in_flight from any thread.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "disagg/pd_role.h"
#include "engine/async_engine.h"
#include "metrics/metrics.h"
#include "model/model_dir.h"
#include "server/http_server.h"
#include "server/openai_protocol.h"
#include "server/response_store.h"

namespace strata {

struct ServerOptions {
  std::string served_model_name;  // what /v1/models lists and requests may name
  std::string api_key;     // non-empty: /v1/*, /tokenize, /detokenize, /debug/* need "Bearer <key>"
  HttpServerOptions http;  // used when Create() is given no HttpServer
  int output_threads = 1;  // detokenize + encode engine output
  int request_threads = 2;  // parse, render, tokenize, submit (off the I/O threads)
  // Build the structured-output vocabulary at startup, on a thread of its
  // own, and mask the shapes most answers share (constrain::PrewarmFragments),
  // so the first constrained requests do not pay for either. false: both wait
  // for the first constrained request.
  bool prewarm_constraints = true;
  // --tool-call-parser: "" (none: tool calls stay in the content), "auto"
  // (by the chat template, DetectToolCallFormat), or a name of
  // ToolCallFormatFromName. Chat requests with tools and tool_choice "auto"
  // get message.tool_calls; "required" and a named function force calls in
  // this syntax by constrained decoding (a 400 without a parser).
  std::string tool_call_parser;
  // --reasoning-parser: "" (none) or a name of ReasoningFormatFromName.
  std::string reasoning_parser;
  // --responses-store-max-items / --responses-store-max-bytes: the bounds of
  // the /v1/responses store (max_items 0: keep nothing).
  ResponseStoreOptions responses_store;
  // --disaggregation-mode prefill|decode: the role whose handoffs requests
  // get (docs/architecture/disagg.md); null: colocated. Must outlive the
  // server and the engine's requests (destroy it after AsyncEngine::Stop).
  // Generation requests then need the router's bootstrap fields (400
  // without); a prefill answers non-streaming once its part is done.
  disagg::PdRole* pd = nullptr;
};

class OpenAiServer {
 public:
  // `model`, `engine` and `registry` must outlive the server. `http`: an
  // already-bound, not yet started transport (so that a bad address fails
  // before the model loads), created with options.http and api_key =
  // options.api_key; null: one is created from those. InvalidArgument for
  // an unknown parser name.
  static StatusOr<std::unique_ptr<OpenAiServer>> Create(const LoadedModel& model,
                                                        AsyncEngine& engine,
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
  // Ends every in-flight response now: streams get a final SSE error event
  // (OpenAI error shape, message `why`) and then end cleanly; responses not
  // yet started get 503; every engine request is cancelled. Generation
  // requests that arrive later get 503 too (call it when shutting down: a
  // second signal, a drain deadline). A request being parsed or tokenized
  // right now is answered 503 as soon as that step ends. Thread-safe;
  // idempotent; not concurrently with Stop().
  void AbortInFlight(std::string_view why);
  // Closes the listener and every connection; joins threads.
  void Stop();

  struct Impl;

 private:
  explicit OpenAiServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata
