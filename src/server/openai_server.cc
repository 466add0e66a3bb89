#include "server/openai_server.h"

#include <atomic>
#include <cctype>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <thread>

#include "constrain/constraint.h"
#include "server/chat_prompt.h"
#include "server/http_auth.h"
#include "server/json_body.h"
#include "server/openai_response.h"
#include "server/openai_responses.h"
#include "server/reasoning_parser.h"
#include "server/stop_matcher.h"
#include "server/tool_call_parser.h"
#include "util/logging.h"

namespace strata {
namespace {

// PD: the failure reason a handoff's error starts with ("kv_full",
// "peer_lost", ...; disagg/bootstrap.h FailureReasonName), or "".
std::string PdFailureReason(const Status& error) {
  const std::string& m = error.message();
  for (const char* r :
       {"kv_full", "bootstrap_timeout", "transfer_timeout", "peer_lost", "aborted", "rejected"}) {
    const size_t n = std::strlen(r);
    if (m.size() > n && m.compare(0, n, r) == 0 && m[n] == ':') return r;
  }
  return "";
}

using Clock = std::chrono::steady_clock;
using ojson = nlohmann::ordered_json;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// How long an integrity check waits for the engine to go idle before it
// answers 503.
constexpr std::chrono::seconds kIntegrityTimeout{5};

void SendApiError(HttpResponder& res, const ApiError& err, HttpHeaders extra = {}) {
  extra.emplace_back("Content-Type", "application/json");
  res.Send(err.http_status, std::move(extra), DumpJson(ErrorJson(err)));
}

// What AbortInFlight answers: 503, OpenAI's error shape.
ApiError AbortedError(const std::string& why) {
  ApiError e;
  e.http_status = 503;
  e.type = "server_error";
  e.code = "request_aborted";
  e.message = "the server aborted this request: " + why;
  return e;
}

// "%2F" -> "/" (model names such as "org/name" arrive percent-encoded).
std::string PercentDecode(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size() && std::isxdigit(static_cast<unsigned char>(s[i + 1])) &&
        std::isxdigit(static_cast<unsigned char>(s[i + 2]))) {
      out += static_cast<char>(std::stoi(std::string(s.substr(i + 1, 2)), nullptr, 16));
      i += 2;
    } else {
      out += s[i];
    }
  }
  return out;
}

// One choice of one HTTP request: an engine request plus the streaming text
// state (detokenizer, stop strings).
struct Choice {
  int index = 0;
  std::shared_ptr<RequestHandle> handle;
  std::unique_ptr<IncrementalDecoder> detok;
  std::unique_ptr<StopMatcher> stop;
  std::vector<int32_t> stop_token_ids;
  std::string text;                    // produced so far (non-streaming: all of it)
  std::vector<GeneratedToken> tokens;  // kept when logprobs are asked (non-streaming)
  int64_t prompt_tokens = 0;
  int64_t cached_tokens = 0;
  int64_t completion_tokens = 0;
  bool done = false;
  FinishReason reason = FinishReason::kNone;
  StopReason stop_reason;
  Status error;
  Clock::time_point last_token;
  bool started_seen = false;
  std::string echo_text;                        // completions with echo: the prompt's text
  std::vector<int32_t> prompt_ids, output_ids;  // kept for return_token_ids (and echo logprobs)
  std::vector<PromptLogprob> prompt_logprobs;   // as the engine sends them (prompt tokens 1..)
  bool prompt_logprobs_sent = false;            // streaming: with the first chunk
  // Chat with --reasoning-parser / --tool-call-parser: the text after stop
  // strings goes through these, in this order (Deliver).
  std::unique_ptr<ReasoningParser> reasoning;
  std::unique_ptr<ToolCallParser> tools;
  std::string reasoning_text;       // non-streaming: all of it
  bool include_reasoning = true;    // the request's include_reasoning
  bool parallel_tool_calls = true;  // false: calls after the first are dropped
  bool parsers_finished = false;

  // The calls to report (parallel_tool_calls false: the first only).
  std::vector<ToolCall> ToolCalls() const {
    if (!tools) return {};
    std::vector<ToolCall> calls = tools->calls();
    if (!parallel_tool_calls && calls.size() > 1) calls.resize(1);
    return calls;
  }
};

// Completions with echo and logprobs: the prompt's tokens as the first
// entries of logprobs, the first without a logprob (nothing precedes it).
std::vector<GeneratedToken> EchoTokens(const Choice& c) {
  std::vector<GeneratedToken> out;
  if (c.prompt_ids.empty()) return out;
  out.push_back(GeneratedToken{c.prompt_ids[0], 0, {}});
  for (const PromptLogprob& p : c.prompt_logprobs)
    out.push_back(GeneratedToken{p.id, p.logprob, p.top});
  return out;
}

// The prompt_logprobs field's entries: the top alternatives cut to its N
// (the engine computed max(N, echo's logprobs)).
std::vector<PromptLogprob> PromptLogprobsCut(const Choice& c, int n) {
  std::vector<PromptLogprob> out = c.prompt_logprobs;
  for (PromptLogprob& p : out)
    if (p.top.size() > static_cast<size_t>(n)) p.top.resize(static_cast<size_t>(n));
  return out;
}

// Text that passed the stop strings, through the reasoning and tool-call
// parsers into the delta and the choice's text. at_end: the output is
// complete; the parsers give back what they held.
void Deliver(Choice& c, std::string text, bool at_end, StreamDelta& delta) {
  std::string reasoning;
  if (c.reasoning) {
    ReasoningParser::Output o = c.reasoning->Add(text);
    if (at_end) {
      ReasoningParser::Output f = c.reasoning->Finish();
      o.reasoning += f.reasoning;
      o.content += f.content;
    }
    reasoning = std::move(o.reasoning);
    text = std::move(o.content);
  }
  if (c.tools) {
    ToolParseOutput o = c.tools->Add(text);
    if (at_end) AppendToolParseOutput(o, c.tools->Finish());
    text = std::move(o.content);
    for (ToolCallEvent& e : o.events)
      if (c.parallel_tool_calls || e.index == 0) delta.tool_calls.push_back(std::move(e));
  }
  if (at_end) c.parsers_finished = true;
  if (!reasoning.empty() && c.include_reasoning) {
    delta.reasoning_content = delta.reasoning_content.value_or("") + reasoning;
    c.reasoning_text += reasoning;
  }
  delta.text += text;
  c.text += text;
}

}  // namespace

struct OpenAiServer::Impl {
  const LoadedModel& model;
  AsyncEngine& engine;
  metrics::Registry& registry;
  ServerOptions options;
  std::unique_ptr<HttpServer> http;
  ProtocolLimits limits;
  ToolCallFormat tool_format = ToolCallFormat::kNone;  // resolved from options.tool_call_parser
  ReasoningFormat reasoning_format = ReasoningFormat::kNone;  // from options.reasoning_parser
  std::atomic<bool> draining{false};
  // This process's id (/server_info; the PD role's when it has one): it
  // changes when the process is replaced, and names this server inside its
  // stored responses' ids (NewStoredResponseId).
  std::string instance_id;

  // Structured outputs: compiled grammars over this model's vocabulary,
  // cached by their text. Built by the prewarm thread at startup
  // (ServerOptions::prewarm_constraints), else on the first constrained
  // request (the vocabulary trie costs a moment for a large vocabulary).
  std::once_flag constraints_once;
  std::shared_ptr<const constrain::Vocabulary> vocabulary;
  std::unique_ptr<constrain::ConstraintCompiler> constraints;
  void MakeConstraintCompiler();
  std::thread prewarm_thread;
  std::atomic<bool> prewarm_stop{false};
  // The automaton for a request's structured output, or its 400.
  ApiOr<std::shared_ptr<constrain::Automaton>> CompileConstraint(const StructuredOutput& so);
  std::atomic<int64_t> in_flight{0};
  // /v1/responses' store; shared with the metrics callbacks, which the
  // registry may run after the server is gone.
  std::shared_ptr<ResponseStore> response_store;

  // Request threads: the I/O thread queues parse/render/tokenize/submit
  // work here. A job keeps its responder so AbortInFlight can answer it.
  struct Job {
    std::function<void()> run;
    std::shared_ptr<HttpResponder> res;
    bool generation = false;  // counted in strata_requests_total
  };
  std::mutex req_mu;
  std::condition_variable req_cv;
  std::deque<Job> req_queue;
  bool req_stop = false;
  std::vector<std::thread> req_threads;

  // Metrics.
  metrics::Family<metrics::Counter>* requests_total = nullptr;
  metrics::Family<metrics::Counter>* rejected_total = nullptr;
  metrics::Histogram* ttft = nullptr;
  metrics::Histogram* itl = nullptr;
  metrics::Histogram* e2e = nullptr;
  metrics::Histogram* queue_time = nullptr;

  // Output threads: engine notifiers enqueue exchanges here.
  struct Exchange;
  std::mutex out_mu;
  std::condition_variable out_cv;
  std::deque<std::shared_ptr<Exchange>> out_queue;
  bool out_stop = false;
  std::vector<std::thread> out_threads;
  // Exchanges whose responses are in progress (owned here until complete;
  // engine notifiers hold only weak references).
  std::mutex active_mu;
  std::vector<std::shared_ptr<Exchange>> active;
  bool aborted = false;      // guarded by active_mu: AbortInFlight was called
  std::string abort_reason;  // guarded by active_mu
  void Retire(Exchange& ex);

  Impl(const LoadedModel& m, AsyncEngine& e, metrics::Registry& r, const ServerOptions& o,
       std::unique_ptr<HttpServer> h)
      : model(m), engine(e), registry(r), options(o), http(std::move(h)) {}

  Status Init();
  void Route();
  void Defer(std::shared_ptr<HttpResponder> res, bool generation, std::function<void()> run);
  void RequestLoop();
  void AbortInFlight(const std::string& why);
  // The abort reason if AbortInFlight was called, else nullopt.
  std::optional<std::string> AbortReason();
  void Abort(Exchange& ex, const std::string& why);  // REQUIRES: ex.mu held
  Usage UsageOf(const Exchange& ex) const;
  void Enqueue(const std::shared_ptr<Exchange>& ex);
  void OutputLoop();
  bool Authorized(const HttpRequest& req, HttpResponder& res);
  void SendError(HttpResponder& res, const ApiError& err, HttpHeaders extra = {});
  void CountRequest(const char* outcome) { requests_total->Get({outcome}).Inc(); }

  // The generation endpoints; /v1/responses runs the chat path (openai_responses.h).
  enum class Api { kCompletions, kChat, kResponses };
  void HandleCompletions(HttpRequest& req, const std::shared_ptr<HttpResponder>& res, Api api,
                         Clock::time_point arrival);
  void HandleTokenize(HttpRequest& req, HttpResponder& res);
  void HandleDetokenize(HttpRequest& req, HttpResponder& res);
  void HandleModels(HttpRequest&& req, std::shared_ptr<HttpResponder> res);
  void HandleUnrouted(HttpRequest&& req, std::shared_ptr<HttpResponder> res);
  void HandleStoredResponse(const HttpRequest& req, HttpResponder& res);
  ojson ModelJson() const;
  void Process(Exchange& ex);
};

// One HTTP request to a generation endpoint and all its choices.
struct OpenAiServer::Impl::Exchange {
  std::mutex mu;
  std::atomic<bool> queued{false};
  bool chat = false;
  bool stream = false;
  bool headers_sent = false;
  bool complete = false;
  bool first_token_seen = false;
  std::shared_ptr<HttpResponder> responder;
  std::vector<Choice> choices;
  ResponseMeta meta;
  LogprobOptions logprobs;
  std::unique_ptr<StreamEncoder> encoder;
  // /v1/responses: its context, and its own event stream in place of encoder.
  std::optional<ResponsesContext> responses;
  std::unique_ptr<ResponsesStreamEncoder> responses_encoder;
  bool store_response = false;  // kept in the store once finished
  ojson responses_input;        // its input items, as the store keeps them
  std::string role = "assistant";
  Clock::time_point arrival;
  bool echo = false;
  bool echo_logprobs = false;  // completions echo + logprobs: the prompt's tokens lead the logprobs
  bool echo_only = false;      // echo with max_tokens 0: the prompt alone, nothing generated
  int prompt_logprobs = -1;    // the prompt_logprobs field's N; -1: not asked
  bool return_token_ids = false;
  int n = 1;  // choices per prompt

  // The stream's events, in whichever encoding the endpoint speaks.
  std::string StreamStart() {
    return responses_encoder ? responses_encoder->Start() : encoder->Start();
  }
  std::string StreamDeltaEvents(const StreamDelta& d) {
    return responses_encoder ? responses_encoder->Delta(d) : encoder->Delta(d);
  }
  std::string StreamFinish(const Usage& u) {
    return responses_encoder ? responses_encoder->Finish(u) : encoder->Finish(u);
  }
  // An error mid-stream, and the stream's end.
  std::string StreamErrorEnd(const ApiError& e, const Usage& u) {
    return responses_encoder ? responses_encoder->Error(e, u)
                             : StreamEncoder::Error(e) + encoder->Finish(u);
  }
};

void OpenAiServer::Impl::Retire(Exchange& ex) {
  ex.complete = true;
  in_flight--;
  std::lock_guard<std::mutex> lock(active_mu);
  std::erase_if(active, [&](const std::shared_ptr<Exchange>& p) { return p.get() == &ex; });
}

OpenAiServer::OpenAiServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
OpenAiServer::~OpenAiServer() { Stop(); }

StatusOr<std::unique_ptr<OpenAiServer>> OpenAiServer::Create(const LoadedModel& model,
                                                             AsyncEngine& engine,
                                                             metrics::Registry& registry,
                                                             const ServerOptions& options,
                                                             std::unique_ptr<HttpServer> http) {
  auto impl = std::make_unique<Impl>(model, engine, registry, options, std::move(http));
  RETURN_IF_ERROR(impl->Init());
  return std::unique_ptr<OpenAiServer>(new OpenAiServer(std::move(impl)));
}

Status OpenAiServer::Impl::Init() {
  limits.vocab_size = model.config.vocab_size;
  response_store = std::make_shared<ResponseStore>(options.responses_store);
  limits.prompt_logprobs_supported =
      options.pd == nullptr;  // PD: the prefill would have to send them
  if (options.tool_call_parser == "auto") {
    tool_format = DetectToolCallFormat(model.chat_template_source);
    STRATA_LOG(INFO)
        << "tool-call parser: " << ToolCallFormatName(tool_format)
        << " (--tool-call-parser auto, chosen by the chat template"
        << (tool_format == ToolCallFormat::kNone
                ? ", which writes no known tool-call syntax: tool calls stay in the content)"
                : ")");
  } else if (!options.tool_call_parser.empty()) {
    auto f = ToolCallFormatFromName(options.tool_call_parser);
    if (!f)
      return InvalidArgument("--tool-call-parser: '" + options.tool_call_parser +
                             "' is not one of " + std::string(kToolCallParserNames));
    tool_format = *f;
    STRATA_LOG(INFO) << "tool-call parser: " << ToolCallFormatName(tool_format);
  }
  if (!options.reasoning_parser.empty()) {
    auto f = ReasoningFormatFromName(options.reasoning_parser);
    if (!f)
      return InvalidArgument("--reasoning-parser: '" + options.reasoning_parser +
                             "' is not one of " + std::string(kReasoningParserNames));
    reasoning_format = *f;
    STRATA_LOG(INFO) << "reasoning parser: " << ReasoningFormatName(reasoning_format);
  }
  auto rt = registry.AddCounter(
      "strata_requests_total",
      "Generation requests by outcome: ok, rejected (shed by admission control), "
      "aborted (client gone, deadline), error.",
      {"outcome"});
  if (!rt.ok()) return rt.status();
  requests_total = *rt;
  for (const char* o : {"ok", "rejected", "aborted", "error"}) requests_total->Get({o});
  auto rj = registry.AddCounter("strata_rejected_requests_total",
                                "Requests refused by admission control, by the limit they hit.",
                                {"reason"});
  if (!rj.ok()) return rj.status();
  rejected_total = *rj;
  for (const char* r : {"max_queued_requests", "max_queued_tokens", "max_queue_time", "draining"})
    rejected_total->Get({r});
  auto hist = [&](const char* name, const char* help) -> StatusOr<metrics::Histogram*> {
    ASSIGN_OR_RETURN(auto* f, registry.AddHistogram(name, help));
    return &f->Get();
  };
  ASSIGN_OR_RETURN(ttft, hist("strata_time_to_first_token_seconds",
                              "From request arrival to its first generated token."));
  ASSIGN_OR_RETURN(itl, hist("strata_inter_token_latency_seconds",
                             "Time between consecutive tokens of a choice."));
  ASSIGN_OR_RETURN(
      e2e, hist("strata_e2e_request_latency_seconds", "From request arrival to its last token."));
  ASSIGN_OR_RETURN(queue_time, hist("strata_queue_time_seconds",
                                    "From request arrival to the start of its prefill."));
  {
    std::shared_ptr<ResponseStore> st = response_store;
    RETURN_IF_ERROR(registry.AddCallbackGauge(
        "strata_responses_store_responses",
        "Responses kept for previous_response_id, item_reference and GET /v1/responses/{id}.",
        [st] { return static_cast<double>(st->stats().responses); }));
    RETURN_IF_ERROR(registry.AddCallbackGauge(
        "strata_responses_store_bytes",
        "Bytes of JSON the response store keeps (bounded by --responses-store-max-bytes).",
        [st] { return static_cast<double>(st->stats().bytes); }));
    RETURN_IF_ERROR(registry.AddCallbackCounter(
        "strata_responses_store_evictions_total",
        "Stored responses evicted (least recently used first) to stay within "
        "--responses-store-max-items or --responses-store-max-bytes.",
        [st] {
          const ResponseStore::Stats s = st->stats();
          return static_cast<double>(s.evicted_max_items + s.evicted_max_bytes);
        }));
    RETURN_IF_ERROR(
        registry.AddCallbackCounter("strata_responses_store_too_large_total",
                                    "Responses with store: true not kept because one alone exceeds "
                                    "--responses-store-max-bytes.",
                                    [st] { return static_cast<double>(st->stats().too_large); }));
  }

  // The transport checks the key when a request's headers arrive (routes
  // are HttpAuth::kApiKey unless marked kPublic below). A transport bound
  // by the caller was created with the same key (cli/cmd_serve.cc).
  if (!http) {
    HttpServerOptions http_options = options.http;
    http_options.api_key = options.api_key;
    ASSIGN_OR_RETURN(http, HttpServer::Create(http_options));
  }
  Route();
  for (int i = 0; i < std::max(1, options.output_threads); ++i)
    out_threads.emplace_back([this] { OutputLoop(); });
  for (int i = 0; i < std::max(1, options.request_threads); ++i)
    req_threads.emplace_back([this] { RequestLoop(); });
  if (options.prewarm_constraints && model.tokenizer) {
    prewarm_thread = std::thread([this] {
      const auto t0 = std::chrono::steady_clock::now();
      MakeConstraintCompiler();
      const int64_t masks = constrain::PrewarmFragments(vocabulary, &prewarm_stop);
      STRATA_LOG(INFO) << "structured outputs: vocabulary built and " << masks
                       << " masks prewarmed in "
                       << std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
                              .count()
                       << " s";
    });
  }
  return OkStatus();
}

void OpenAiServer::Impl::SendError(HttpResponder& res, const ApiError& err, HttpHeaders extra) {
  SendApiError(res, err, std::move(extra));
}

void OpenAiServer::Impl::Defer(std::shared_ptr<HttpResponder> res, bool generation,
                               std::function<void()> run) {
  {
    std::lock_guard<std::mutex> lock(req_mu);
    if (!req_stop) {
      req_queue.push_back(Job{std::move(run), std::move(res), generation});
      req_cv.notify_one();
      return;
    }
  }
  // Stopping: nobody will run it.
  SendError(*res,
            OverloadedError("the server is shutting down and accepts no new requests", "draining"));
}

void OpenAiServer::Impl::RequestLoop() {
  for (;;) {
    Job job;
    {
      std::unique_lock<std::mutex> lock(req_mu);
      req_cv.wait(lock, [&] { return req_stop || !req_queue.empty(); });
      if (req_stop) return;  // Stop(): the transport is gone; queued jobs are dropped
      job = std::move(req_queue.front());
      req_queue.pop_front();
    }
    try {
      job.run();
    } catch (const std::exception& e) {  // a bug: answer, keep serving the others
      STRATA_LOG(ERROR) << "server: request handler threw: " << e.what();
      ApiError err = ApiErrorFromStatus(Internal("internal error in the request handler"));
      SendError(*job.res, err);
    }
  }
}

std::optional<std::string> OpenAiServer::Impl::AbortReason() {
  std::lock_guard<std::mutex> lock(active_mu);
  if (!aborted) return std::nullopt;
  return abort_reason;
}

Usage OpenAiServer::Impl::UsageOf(const Exchange& ex) const {
  Usage usage;
  for (const Choice& c : ex.choices) usage.completion_tokens += c.completion_tokens;
  // Prompt tokens: each prompt once, though its n choices each ran it.
  int64_t cached = 0;
  for (size_t i = 0; i < ex.choices.size(); i += static_cast<size_t>(ex.n)) {
    usage.prompt_tokens += ex.choices[i].prompt_tokens;
    cached += ex.choices[i].cached_tokens;
  }
  usage.cached_tokens = cached;
  return usage;
}

void OpenAiServer::Impl::Abort(Exchange& ex, const std::string& why) {
  if (ex.complete) return;
  for (Choice& c : ex.choices) c.handle->Cancel();
  const ApiError e = AbortedError(why);
  HttpResponder& res = *ex.responder;
  if (ex.stream && ex.headers_sent) {
    // Mid-stream: a final error event, then the stream's normal end, so the
    // client sees a clean, explained end rather than a cut connection.
    res.Write(ex.StreamErrorEnd(e, UsageOf(ex)));
    res.End();
  } else {
    SendError(res, e);
    ex.headers_sent = true;
  }
  CountRequest("aborted");
  Retire(ex);
}

void OpenAiServer::Impl::AbortInFlight(const std::string& why) {
  std::vector<std::shared_ptr<Exchange>> exchanges;
  {
    std::lock_guard<std::mutex> lock(active_mu);
    if (!aborted) {
      aborted = true;
      abort_reason = why;
    }
    exchanges = active;  // Retire() edits `active`: iterate a copy
  }
  std::deque<Job> jobs;
  {
    std::lock_guard<std::mutex> lock(req_mu);
    jobs.swap(req_queue);
  }
  for (Job& j : jobs) {
    if (j.generation) CountRequest("aborted");
    SendError(*j.res, AbortedError(why));
  }
  for (auto& ex : exchanges) {
    std::lock_guard<std::mutex> lock(ex->mu);
    Abort(*ex, why);
  }
}

// For the one route the transport does not check (the public fallback):
// the same answer the transport gives (http_auth.h, constant time).
bool OpenAiServer::Impl::Authorized(const HttpRequest& req, HttpResponder& res) {
  if (options.api_key.empty()) return true;
  if (CheckBearer(req.Header("Authorization"), options.api_key) == BearerCheck::kOk) return true;
  ApiError e;
  e.http_status = 401;
  e.type = "authentication_error";
  e.code = "invalid_api_key";
  e.message = req.Header("Authorization").empty()
                  ? "missing API key: send the header 'Authorization: Bearer <key>'"
                  : "invalid API key";
  SendError(res, e, {{"WWW-Authenticate", "Bearer"}});
  return false;
}

void OpenAiServer::Impl::Route() {
  http->Handle(
      "GET", "/health",
      [this](HttpRequest&&, std::shared_ptr<HttpResponder> res) {
        if (draining.load()) {
          res->SendJson(503, R"({"status":"draining"})");
          return;
        }
        res->SendJson(200, R"({"status":"ok"})");
      },
      HttpAuth::kPublic);
  // For `strata router` (docs/architecture/disagg.md): what this server is
  // (role, model, page size, an id that changes when the process is
  // replaced) and how loaded it is now (from the engine's snapshot). Public,
  // like /health: the router's health checks send no key.
  {
    std::string instance = options.pd ? options.pd->instance_id() : "";
    if (instance.empty()) {
      std::random_device rd;
      char id[24];
      std::snprintf(id, sizeof id, "%08x%08x", rd(), rd());
      instance = id;
    }
    instance_id = instance;
    ojson j{{"role", options.pd ? options.pd->mode() : "colocated"},
            {"disaggregation_mode", options.pd ? options.pd->mode() : "null"},
            {"model", options.served_model_name},
            {"instance_id", instance},
            {"page_size", engine.facts().page_size}};
    if (options.pd && options.pd->mode() == "prefill")
      j["disaggregation_bootstrap_port"] = options.pd->bootstrap_port();
    const std::string info = DumpJson(j);
    for (const char* path : {"/server_info", "/get_server_info"})
      http->Handle(
          "GET", path,
          [info](HttpRequest&&, std::shared_ptr<HttpResponder> res) { res->SendJson(200, info); },
          HttpAuth::kPublic);
    http->Handle(
        "GET", "/load",
        [this](HttpRequest&&, std::shared_ptr<HttpResponder> res) {
          const EngineSnapshot s = engine.snapshot();
          res->SendJson(200, DumpJson(ojson{{"running", s.running},
                                            {"queued", s.queued_requests},
                                            {"queued_tokens", s.queued_tokens},
                                            {"pages_free", s.pages_total - s.pages_active}}));
        },
        HttpAuth::kPublic);
  }
  // Runs every cache and engine invariant check once the engine is idle:
  // 200 {"integrity":"ok"} or 500 with the first violation; 503 +
  // Retry-After when a check is already pending or the engine stays busy
  // past kIntegrityTimeout. For tests and operators chasing a suspected
  // leak. The engine thread answers (no thread per call); the callback holds
  // only the responder, which outlives the server safely.
  http->Handle("GET", "/debug/integrity",
               [this](HttpRequest&& req, std::shared_ptr<HttpResponder> res) {
                 engine.CheckIntegrity(kIntegrityTimeout, [res](Status st) {
                   if (st.ok()) {
                     res->SendJson(200, R"({"integrity":"ok"})");
                   } else if (st.code() == StatusCode::kUnavailable) {
                     SendApiError(*res, OverloadedError(st.message(), "integrity_check_busy"),
                                  {{"Retry-After", "1"}});
                   } else {
                     res->SendJson(
                         500, DumpJson(ojson{{"integrity", "failed"}, {"message", st.ToString()}}));
                   }
                 });
               });
  http->Handle(
      "GET", "/metrics",
      [this](HttpRequest&&, std::shared_ptr<HttpResponder> res) {
        res->Send(200, {{"Content-Type", std::string(metrics::kContentType)}}, registry.Render());
      },
      HttpAuth::kPublic);
  http->Handle("GET", "/v1/models", [this](HttpRequest&& r, std::shared_ptr<HttpResponder> res) {
    HandleModels(std::move(r), std::move(res));
  });
  // Parsing, templates and tokenization can take seconds for a huge body:
  // the I/O thread only checks the key and queues the work.
  for (auto [path, api] : {std::pair{"/v1/completions", Api::kCompletions},
                           std::pair{"/v1/chat/completions", Api::kChat},
                           std::pair{"/v1/responses", Api::kResponses}}) {
    http->Handle("POST", path, [this, api](HttpRequest&& r, std::shared_ptr<HttpResponder> res) {
      const Clock::time_point arrival = Clock::now();
      auto req = std::make_shared<HttpRequest>(std::move(r));
      Defer(res, true,
            [this, req, res, api, arrival] { HandleCompletions(*req, res, api, arrival); });
    });
  }
  http->Handle("POST", "/tokenize", [this](HttpRequest&& r, std::shared_ptr<HttpResponder> res) {
    auto req = std::make_shared<HttpRequest>(std::move(r));
    Defer(res, false, [this, req, res] { HandleTokenize(*req, *res); });
  });
  http->Handle("POST", "/detokenize", [this](HttpRequest&& r, std::shared_ptr<HttpResponder> res) {
    auto req = std::make_shared<HttpRequest>(std::move(r));
    Defer(res, false, [this, req, res] { HandleDetokenize(*req, *res); });
  });
  // Public so that an unknown path is a 404 with or without a key; the one
  // thing it serves, GET /v1/models/{id}, checks the key itself.
  http->SetFallback(
      [this](HttpRequest&& r, std::shared_ptr<HttpResponder> res) {
        HandleUnrouted(std::move(r), std::move(res));
      },
      HttpAuth::kPublic);
}

ojson OpenAiServer::Impl::ModelJson() const {
  return ojson{{"id", options.served_model_name},
               {"object", "model"},
               {"created", NewResponseMeta("", "").created},
               {"owned_by", "strata"},
               {"root", model.dir},
               {"max_model_len", engine.facts().context_length}};
}

void OpenAiServer::Impl::HandleModels(HttpRequest&& req, std::shared_ptr<HttpResponder> res) {
  ojson j = {{"object", "list"}, {"data", ojson::array({ModelJson()})}};
  res->SendJson(200, DumpJson(j));
}

// Paths with no exact route: GET /v1/models/{id} (OpenAI's retrieve-model;
// ids may contain '/', sent raw or as %2F), else the transport's 404.
void OpenAiServer::Impl::HandleUnrouted(HttpRequest&& req, std::shared_ptr<HttpResponder> res) {
  constexpr std::string_view kModels = "/v1/models/";
  if (req.path.starts_with("/v1/responses/")) return HandleStoredResponse(req, *res);
  if (!req.path.starts_with(kModels) || req.path.size() == kModels.size()) {
    res->SendJson(404, HttpErrorJson("Invalid URL (" + req.method + " " + req.target + ")"));
    return;
  }
  if (req.method != "GET") {
    res->Send(405, {{"Allow", "GET"}, {"Content-Type", "application/json"}},
              HttpErrorJson("method " + req.method + " is not allowed on " + req.path));
    return;
  }
  if (!Authorized(req, *res)) return;
  const std::string id = PercentDecode(std::string_view(req.path).substr(kModels.size()));
  if (id != options.served_model_name) return SendError(*res, ModelNotFoundError(id));
  res->SendJson(200, DumpJson(ModelJson()));
}

// "a=1&b=x" -> {a: "1", b: "x"} (values percent-decoded; '+' is a space).
std::map<std::string, std::string> QueryParams(std::string_view query) {
  std::map<std::string, std::string> out;
  while (!query.empty()) {
    const size_t amp = query.find('&');
    std::string_view kv = query.substr(0, amp);
    query = amp == std::string_view::npos ? std::string_view() : query.substr(amp + 1);
    const size_t eq = kv.find('=');
    std::string value = eq == std::string_view::npos ? "" : std::string(kv.substr(eq + 1));
    std::replace(value.begin(), value.end(), '+', ' ');
    out[PercentDecode(kv.substr(0, eq))] = PercentDecode(value);
  }
  return out;
}

// GET /v1/responses/{id}: the stored response object; DELETE: OpenAI's
// {id, object: "response", deleted: true}; GET /v1/responses/{id}/input_items:
// OpenAI's list (order desc by default, limit 1..100, default 20, after an
// item id). An id the store does not have (never stored, deleted, evicted,
// another replica's) is a 404 saying so.
void OpenAiServer::Impl::HandleStoredResponse(const HttpRequest& req, HttpResponder& res) {
  std::string id = PercentDecode(std::string_view(req.path).substr(14));
  bool input_items = false;
  if (const size_t slash = id.find('/'); slash != std::string::npos) {
    input_items = id.substr(slash + 1) == "input_items";
    if (!input_items) id.clear();  // cancel, ...: no background runs here
    id.resize(std::min(id.size(), slash));
  }
  if (id.empty()) {
    res.SendJson(404, HttpErrorJson("Invalid URL (" + req.method + " " + req.target +
                                    "): this server serves GET and DELETE /v1/responses/{id} "
                                    "and GET /v1/responses/{id}/input_items"));
    return;
  }
  if (req.method != "GET" && (input_items || req.method != "DELETE")) {
    res.Send(405,
             {{"Allow", input_items ? "GET" : "GET, DELETE"}, {"Content-Type", "application/json"}},
             HttpErrorJson("method " + req.method + " is not allowed on " + req.path));
    return;
  }
  if (!Authorized(req, res)) return;
  const std::map<std::string, std::string> query = QueryParams(req.query);
  if (req.method == "DELETE") {
    if (!response_store->Delete(id))
      return SendError(res, UnknownResponseError(id, response_store.get()));
    res.SendJson(200, DumpJson(ojson{{"id", id}, {"object", "response"}, {"deleted", true}}));
    return;
  }
  if (input_items) {
    int64_t limit = 20;
    if (auto it = query.find("limit"); it != query.end()) {
      char* end = nullptr;
      limit = std::strtoll(it->second.c_str(), &end, 10);
      if (it->second.empty() || *end != '\0' || limit < 1 || limit > 100)
        return SendError(res, InvalidRequestError("limit",
                                                  "limit must be an integer in [1, 100], "
                                                  "got '" +
                                                      it->second + "'"));
    }
    const std::string order = query.count("order") ? query.at("order") : "desc";
    if (order != "asc" && order != "desc")
      return SendError(res, InvalidRequestError(
                                "order", "order must be \"asc\" or \"desc\", got '" + order + "'"));
    std::optional<ojson> items = response_store->InputItems(id);
    if (!items) return SendError(res, UnknownResponseError(id, response_store.get()));
    if (order == "desc") std::reverse(items->begin(), items->end());
    size_t from = 0;
    if (auto it = query.find("after"); it != query.end()) {
      while (from < items->size() && (*items)[from].value("id", "") != it->second) ++from;
      if (from == items->size())
        return SendError(res, InvalidRequestError("after", "after: no input item with id '" +
                                                               it->second + "' in " + id));
      ++from;
    }
    ojson page = ojson::array();
    for (size_t i = from; i < items->size() && page.size() < static_cast<size_t>(limit); ++i)
      page.push_back((*items)[i]);
    const bool more = from + page.size() < items->size();
    ojson list{{"object", "list"},
               {"data", page},
               {"first_id", page.empty() ? ojson(nullptr) : page.front()["id"]},
               {"last_id", page.empty() ? ojson(nullptr) : page.back()["id"]},
               {"has_more", more}};
    res.SendJson(200, DumpJson(list));
    return;
  }
  if (auto it = query.find("stream"); it != query.end() && it->second == "true")
    return SendError(res, InvalidRequestError("stream",
                                              "stream: true (replaying a response's events) is "
                                              "not supported; retrieve it without stream"));
  std::optional<ojson> r = response_store->Get(id);
  if (!r) return SendError(res, UnknownResponseError(id, response_store.get()));
  res.SendJson(200, DumpJson(*r));
}

void OpenAiServer::Impl::HandleTokenize(HttpRequest& req, HttpResponder& res) {
  auto body = ParseJsonBody(req.body, limits.max_json_depth);
  if (!body.ok()) return SendError(res, body.error());
  const ojson& j = body.value();
  if (!j.is_object())
    return SendError(res, InvalidRequestError("", "the body must be a JSON object"));
  std::vector<int32_t> ids;
  if (j.contains("messages")) {
    if (!model.chat_template)
      return SendError(res, InvalidRequestError("messages", "this model has no chat template"));
    ojson chat_body = j;
    chat_body["model"] = options.served_model_name;
    auto creq = ParseChatCompletionRequest(DumpJson(chat_body), limits);
    if (!creq.ok()) return SendError(res, creq.error());
    auto text = RenderChatPrompt(*model.chat_template, creq.value(), *model.tokenizer);
    if (!text.ok()) return SendError(res, text.error());
    ids = model.tokenizer->Encode(text.value(), j.value("add_special_tokens", false));
  } else if (j.contains("prompt")) {
    if (!j["prompt"].is_string())
      return SendError(res, InvalidRequestError("prompt", "prompt must be a string"));
    const ojson& add = j.contains("add_special_tokens") ? j["add_special_tokens"] : ojson(true);
    if (!add.is_boolean())
      return SendError(
          res, InvalidRequestError("add_special_tokens", "add_special_tokens must be a boolean"));
    ids = model.tokenizer->Encode(j["prompt"].get<std::string>(), add.get<bool>());
  } else {
    return SendError(
        res, InvalidRequestError("prompt", "give either \"prompt\" (a string) or \"messages\""));
  }
  ojson out = {
      {"count", ids.size()}, {"max_model_len", engine.facts().context_length}, {"tokens", ids}};
  res.SendJson(200, DumpJson(out));
}

void OpenAiServer::Impl::HandleDetokenize(HttpRequest& req, HttpResponder& res) {
  auto body = ParseJsonBody(req.body, limits.max_json_depth);
  if (!body.ok()) return SendError(res, body.error());
  const ojson& j = body.value();
  if (!j.is_object() || !j.contains("tokens") || !j["tokens"].is_array())
    return SendError(res, InvalidRequestError("tokens", "\"tokens\" must be a list of token ids"));
  std::vector<int32_t> ids;
  for (const ojson& t : j["tokens"]) {
    if (!t.is_number_integer() || t.get<int64_t>() < 0 ||
        t.get<int64_t>() >= model.config.vocab_size)
      return SendError(
          res, InvalidRequestError("tokens", "token ids must be integers in [0, " +
                                                 std::to_string(model.config.vocab_size) + ")"));
    ids.push_back(t.get<int32_t>());
  }
  res.SendJson(200, DumpJson(ojson{{"prompt", model.tokenizer->Decode(ids, false)}}));
}

void OpenAiServer::Impl::HandleCompletions(HttpRequest& req,
                                           const std::shared_ptr<HttpResponder>& res, Api api,
                                           Clock::time_point arrival) {
  const bool chat = api != Api::kCompletions;
  if (auto why = AbortReason()) return CountRequest("aborted"), SendError(*res, AbortedError(*why));
  auto ex = std::make_shared<Exchange>();
  ex->chat = chat;
  ex->arrival = arrival;
  ex->responder = res;

  // Parse, validate, and turn every prompt into token ids.
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::string> prompt_texts;
  GenerationFields fields;
  int n = 1;
  // Chat: how each choice's output is split (tool calls, reasoning).
  ToolCallFormat tools_for_request = ToolCallFormat::kNone;
  std::optional<StructuredOutput> forced_tools;
  ReasoningStart reasoning_start = ReasoningStart::kNoReasoning;
  bool include_reasoning = true, parallel_tool_calls = true;
  if (chat) {
    auto creq = [&]() -> ApiOr<ChatCompletionRequest> {
      if (api != Api::kResponses) return ParseChatCompletionRequest(req.body, limits);
      auto r = ParseResponsesRequest(req.body, limits, response_store.get());
      if (!r.ok()) return r.error();
      ex->responses = std::move(r.value().context);
      ex->store_response = r.value().store;
      if (ex->store_response) ex->responses_input = std::move(r.value().input_items);
      return std::move(r.value().chat);
    }();
    if (!creq.ok()) return CountRequest("error"), SendError(*res, creq.error());
    if (!model.chat_template)
      return CountRequest("error"),
             SendError(*res,
                       InvalidRequestError("messages",
                                           "this model has no chat template; use /v1/completions"));
    auto text = RenderChatPrompt(*model.chat_template, creq.value(), *model.tokenizer);
    if (!text.ok()) return CountRequest("error"), SendError(*res, text.error());
    prompts.push_back(model.tokenizer->Encode(text.value(), false));
    prompt_texts.push_back(text.value());
    ex->logprobs = LogprobOptionsFor(creq.value(), model.tokenizer.get());
    ex->role = creq.value().response_role;
    const ChatCompletionRequest& cr = creq.value();
    // vLLM: calls are parsed only when tools are sent and tool_choice is
    // "auto"; with "none" the tools are still rendered, the output is not parsed.
    if (cr.tools.is_array() && !cr.tools.empty() && cr.tool_choice == "auto")
      tools_for_request = tool_format;
    // tool_choice "required" / a named function: the call is forced by
    // constrained decoding in the parser's syntax.
    if (cr.tool_choice == "required" || cr.tool_choice == "function") {
      if (tool_format == ToolCallFormat::kNone)
        return CountRequest("error"),
               SendError(*res,
                         InvalidRequestError(
                             "tool_choice",
                             "tool_choice " +
                                 std::string(cr.tool_choice == "function" ? "naming a function"
                                                                          : "\"required\"") +
                                 " needs a tool-call syntax to force: start the server "
                                 "with --tool-call-parser (" +
                                 std::string(kToolCallParserNames) + ")"));
      if (cr.structured)
        return CountRequest("error"),
               SendError(*res, InvalidRequestError(cr.structured->param,
                                                   cr.structured->param +
                                                       " cannot be combined with tool_choice " +
                                                       "forcing a call; send one of them"));
      forced_tools = ToolCallSpec(cr.tools, ToolCallFormatName(tool_format),
                                  cr.tool_choice_function, cr.parallel_tool_calls);
      tools_for_request = tool_format;
    }
    reasoning_start = ReasoningStartFor(reasoning_format, text.value(), cr.enable_thinking);
    include_reasoning = cr.include_reasoning;
    parallel_tool_calls = cr.parallel_tool_calls;
    fields = creq.value();
  } else {
    auto creq = ParseCompletionRequest(req.body, limits);
    if (!creq.ok()) return CountRequest("error"), SendError(*res, creq.error());
    for (const PromptInput& p : creq.value().prompts) {
      if (p.is_tokens) {
        prompts.push_back(p.token_ids);
        prompt_texts.push_back(creq.value().echo ? model.tokenizer->Decode(p.token_ids, false)
                                                 : "");
      } else {
        prompts.push_back(model.tokenizer->Encode(p.text, creq.value().add_special_tokens));
        prompt_texts.push_back(p.text);
      }
    }
    ex->logprobs = LogprobOptionsFor(creq.value(), model.tokenizer.get());
    ex->echo = creq.value().echo;
    ex->echo_logprobs = ex->echo && creq.value().logprobs.has_value();
    ex->echo_only = creq.value().echo_only;
    fields = creq.value();
  }
  req.body.clear();
  req.body.shrink_to_fit();  // a large body is not held for the whole generation
  if (!fields.model.empty() && fields.model != options.served_model_name)
    return CountRequest("error"), SendError(*res, ModelNotFoundError(fields.model));
  n = fields.n;
  ex->n = n;
  ex->stream = fields.stream;
  if (options.pd) {
    if (!fields.bootstrap)
      return CountRequest("error"),
             SendError(
                 *res,
                 InvalidRequestError(
                     "bootstrap_room",
                     "this server is the " + options.pd->mode() +
                         " half of a prefill/decode pair: send requests through `strata router` "
                         "(bootstrap_host, bootstrap_port and bootstrap_room are missing)"));
    if (options.pd->mode() == "prefill")
      ex->stream = false;  // the router reads the decode's stream
  }
  const char* id_prefix = api == Api::kResponses ? "resp_" : chat ? "chatcmpl-" : "cmpl-";
  ex->meta = NewResponseMeta(id_prefix, options.served_model_name);
  if (fields.request_id)
    ex->meta.id = id_prefix + *fields.request_id;
  else if (api == Api::kResponses)
    ex->meta.id = NewStoredResponseId(instance_id);
  if (ex->responses) ex->responses->meta = ex->meta, ex->responses->logprobs = ex->logprobs;
  ex->return_token_ids = fields.return_token_ids;
  const std::string prompt_param = chat ? "messages" : "prompt";

  // The engine computes the prompt's logprobs for the prompt_logprobs field
  // and for echo + logprobs, with the larger top N of the two.
  ex->prompt_logprobs = fields.prompt_logprobs.value_or(-1);
  // Structured output: compiled once per distinct schema/grammar (cached),
  // one constraint per choice.
  std::shared_ptr<constrain::Automaton> automaton;
  if (forced_tools || fields.structured) {
    auto a = CompileConstraint(forced_tools ? *forced_tools : *fields.structured);
    if (!a.ok()) return CountRequest("error"), SendError(*res, a.error());
    automaton = std::move(a.value());
  }

  // Every choice of every prompt, admitted together or not at all.
  std::vector<EngineRequest> requests;
  for (size_t p = 0; p < prompts.size(); ++p) {
    if (prompts[p].empty())
      return CountRequest("error"),
             SendError(*res, InvalidRequestError(prompt_param, "the prompt is empty"));
    auto max_tokens = ResolveMaxTokens(fields, static_cast<int64_t>(prompts[p].size()),
                                       engine.facts().context_length);
    if (!max_tokens.ok()) return CountRequest("error"), SendError(*res, max_tokens.error());
    for (int k = 0; k < n; ++k) {
      EngineRequest er;
      er.id = ex->meta.id + "-" + std::to_string(ex->choices.size());
      er.prompt = prompts[p];
      er.params = fields.sampling;
      er.params.max_tokens = max_tokens.value();
      er.prompt_logprobs = std::max(ex->prompt_logprobs, ex->echo_logprobs ? ex->logprobs.top : -1);
      if (automaton) er.constraint = constrain::NewTokenConstraint(automaton);
      // n > 1 with a fixed seed: vary it per choice so choices differ but replay.
      if (er.params.seed && k > 0) er.params.seed = *er.params.seed + static_cast<uint64_t>(k);
      er.arrival = arrival;
      if (options.pd) {
        disagg::RoomAddress a{fields.bootstrap->host, fields.bootstrap->port,
                              fields.bootstrap->room + static_cast<uint64_t>(ex->choices.size())};
        auto h = options.pd->NewHandoff(a, er.id, arrival);
        if (!h.ok())
          return CountRequest("error"),
                 SendError(*res, InvalidRequestError("bootstrap_room", h.status().message()));
        er.kv_export = std::move(h->kv_export);
        er.kv_import = std::move(h->kv_import);
      }
      std::weak_ptr<Exchange> weak = ex;
      er.notify = [this, weak] {
        if (auto e = weak.lock()) Enqueue(e);
      };
      Choice c;
      c.index = static_cast<int>(ex->choices.size());
      c.stop_token_ids = er.params.stop_token_ids;
      c.prompt_tokens = static_cast<int64_t>(er.prompt.size());
      c.detok = std::make_unique<IncrementalDecoder>(model.tokenizer, fields.skip_special_tokens);
      c.stop = std::make_unique<StopMatcher>(fields.stop, fields.include_stop_str_in_output);
      if (ex->echo) c.echo_text = prompt_texts[p];
      if (reasoning_start != ReasoningStart::kNoReasoning)
        c.reasoning = std::make_unique<ReasoningParser>(reasoning_start);
      if (tools_for_request != ToolCallFormat::kNone)
        c.tools = ToolCallParser::Create(tools_for_request);
      c.include_reasoning = include_reasoning;
      c.parallel_tool_calls = parallel_tool_calls;
      if (ex->return_token_ids || ex->echo_logprobs) c.prompt_ids = er.prompt;
      ex->choices.push_back(std::move(c));
      requests.push_back(std::move(er));
    }
  }
  prompts.clear();

  // Engine output may arrive as soon as the choices are submitted: hold the
  // exchange's lock so the output thread waits until the exchange is whole.
  std::unique_lock<std::mutex> ex_lock(ex->mu);
  SubmitResult sr = engine.SubmitAll(std::move(requests));
  if (sr.handles.empty()) {
    ex->complete = true;  // nothing was queued
    if (sr.status.code() == StatusCode::kUnavailable) {
      CountRequest("rejected");
      rejected_total->Get({sr.limit}).Inc();
      const int retry = static_cast<int>(std::ceil(sr.retry_after_seconds));
      return SendError(*res, OverloadedError(sr.status.message(), sr.limit),
                       {{"Retry-After", std::to_string(std::max(1, retry))}});
    }
    ApiError e = ApiErrorFromStatus(sr.status);
    // A limit the request exceeds on its own: name the field that makes it big.
    e.param = !sr.limit.empty() && sr.limit == "max_queued_requests" && n > 1 ? "n" : prompt_param;
    if (!sr.limit.empty()) e.code = sr.limit;
    return CountRequest("error"), SendError(*res, e);
  }
  for (size_t i = 0; i < ex->choices.size(); ++i) ex->choices[i].handle = sr.handles[i];
  if (ex->stream) {
    StreamSettings ss;
    ss.num_choices = static_cast<int>(ex->choices.size());
    ss.role = ex->role;
    ss.options = fields.stream_options;
    ss.logprobs = ex->logprobs;
    ss.prompt_tokens = ex->choices.empty() ? 0 : ex->choices[0].prompt_tokens;
    ss.return_token_ids = ex->return_token_ids;
    for (const Choice& c : ex->choices) ss.prompt_token_ids.push_back(c.prompt_ids);
    if (ex->responses)
      ex->responses_encoder = std::make_unique<ResponsesStreamEncoder>(*ex->responses);
    else
      ex->encoder = std::make_unique<StreamEncoder>(
          chat ? StreamEncoder::Kind::kChat : StreamEncoder::Kind::kCompletion, ex->meta, ss);
  }
  in_flight++;
  std::optional<std::string> why;
  {
    std::lock_guard<std::mutex> lock(active_mu);
    active.push_back(ex);
    if (aborted) why = abort_reason;  // AbortInFlight ran while this was parsed
  }
  if (why) return Abort(*ex, *why);
  // Client gone: cancel every choice; the engine frees pages at its next step.
  std::weak_ptr<Exchange> weak = ex;
  res->OnClose([weak] {
    if (auto e = weak.lock())
      for (Choice& c : e->choices)
        c.handle->Cancel();  // handles are thread-safe; the vector is final
  });
  ex_lock.unlock();
  Enqueue(ex);  // output may already be there
}

void OpenAiServer::Impl::MakeConstraintCompiler() {
  std::call_once(constraints_once, [&] {
    vocabulary = constrain::VocabularyFromTokenizer(*model.tokenizer, model.config.vocab_size,
                                                    model.eos_token_ids);
    constraints = std::make_unique<constrain::ConstraintCompiler>(vocabulary);
  });
}

ApiOr<std::shared_ptr<constrain::Automaton>> OpenAiServer::Impl::CompileConstraint(
    const StructuredOutput& so) {
  MakeConstraintCompiler();
  auto a = constraints->Compile(so.spec);
  if (!a.ok()) return InvalidRequestError(so.param, a.status().message());
  return a.value();
}

void OpenAiServer::Impl::Enqueue(const std::shared_ptr<Exchange>& ex) {
  if (ex->queued.exchange(true)) return;
  {
    std::lock_guard<std::mutex> lock(out_mu);
    out_queue.push_back(ex);
  }
  out_cv.notify_one();
}

void OpenAiServer::Impl::OutputLoop() {
  for (;;) {
    std::shared_ptr<Exchange> ex;
    {
      std::unique_lock<std::mutex> lock(out_mu);
      out_cv.wait(lock, [&] { return out_stop || !out_queue.empty(); });
      if (out_queue.empty()) return;
      ex = std::move(out_queue.front());
      out_queue.pop_front();
    }
    ex->queued.store(false);
    std::lock_guard<std::mutex> lock(ex->mu);
    if (!ex->complete) Process(*ex);
  }
}

// Takes whatever the engine produced for each choice, turns it into text
// (detokenizer, stop strings) and writes it out. Runs on an output thread,
// under ex.mu.
void OpenAiServer::Impl::Process(Exchange& ex) {
  const Clock::time_point now = Clock::now();
  std::string events;
  bool any_output = false;
  for (Choice& c : ex.choices) {
    if (c.done) continue;
    RequestOutput out = c.handle->Take();
    for (PromptLogprob& p : out.prompt_logprobs) c.prompt_logprobs.push_back(std::move(p));
    if (out.started && !c.started_seen) {
      c.started_seen = true;
      c.cached_tokens = out.cached_tokens;
      queue_time->Observe(Seconds(out.started_at - ex.arrival));
    }
    StreamDelta delta;
    delta.index = c.index;
    // The prompt's logprobs all came before (or with) the first token.
    if (ex.echo && c.completion_tokens == 0 && !out.tokens.empty()) {
      delta.text = c.echo_text;
      c.text = c.echo_text;
      if (ex.echo_logprobs) {
        (ex.stream ? delta.tokens : c.tokens) = EchoTokens(c);
        delta.leading_null_logprobs = 1;
      }
    }
    if (ex.stream && ex.prompt_logprobs >= 0 && !c.prompt_logprobs_sent && !out.tokens.empty()) {
      delta.prompt_logprobs = PromptLogprobsCut(c, ex.prompt_logprobs);
      c.prompt_logprobs_sent = true;
    }
    if (ex.echo_only && !out.tokens.empty()) {
      // max_tokens 0: the prompt alone; the one token the engine had to
      // sample is not shown (vLLM: finish_reason "length", no completion tokens).
      out.tokens.clear();
      c.done = true;
      c.reason = FinishReason::kLength;
      c.handle->Cancel();
    }
    for (GeneratedToken& t : out.tokens) {
      if (c.stop->stopped()) break;  // tokens after a stop string are dropped
      if (!ex.first_token_seen) {
        ex.first_token_seen = true;
        ttft->Observe(Seconds(now - ex.arrival));
      } else if (c.completion_tokens > 0) {
        itl->Observe(Seconds(now - c.last_token));
      }
      c.last_token = now;
      c.completion_tokens++;
      if (ex.return_token_ids) c.output_ids.push_back(t.id);
      const bool is_stop_token = std::find(c.stop_token_ids.begin(), c.stop_token_ids.end(),
                                           t.id) != c.stop_token_ids.end();
      StopMatcher::Result r = c.stop->Add(c.detok->Add(t.id));
      Deliver(c, std::move(r.text), false, delta);
      if (ex.logprobs.enabled) {
        if (ex.stream)
          delta.tokens.push_back(t);
        else
          c.tokens.push_back(t);
      } else if (ex.stream) {
        delta.tokens.push_back(GeneratedToken{t.id, 0, {}});
      }
      if (r.stop_index) {
        c.done = true;
        c.reason = FinishReason::kStop;
        c.stop_reason = c.stop->matched();
        c.handle->Cancel();  // the engine stops computing it
      } else if (is_stop_token) {
        c.stop_reason = t.id;
      }
    }
    if (!c.done && out.finished) {
      c.done = true;
      if (!out.error.ok()) {
        c.error = out.error;
        c.reason = FinishReason::kAbort;
      } else if (out.finish_reason == FinishReason::kLength ||
                 out.finish_reason == FinishReason::kStop) {
        c.reason = out.finish_reason;
      } else {
        c.reason = FinishReason::kAbort;
      }
      if (c.error.ok()) {
        std::string rest = c.stop->Add(c.detok->Flush()).text;
        if (!c.stop->stopped()) rest += c.stop->Flush();
        Deliver(c, std::move(rest), false, delta);
      }
    }
    // Finished (EOS, length, a stop string): the parsers give back what they held.
    if (c.done && c.error.ok() && !c.parsers_finished) Deliver(c, "", true, delta);
    if (c.done) {
      delta.finish_reason = c.reason, delta.stop_reason = c.stop_reason;
      delta.made_tool_calls = !c.ToolCalls().empty();
    }
    if (ex.stream && c.error.ok()) {
      std::string ev = ex.StreamDeltaEvents(delta);
      if (!ev.empty()) any_output = true;
      events += ev;
    }
  }

  bool all_done = true;
  const Choice* failed = nullptr;
  for (const Choice& c : ex.choices) {
    all_done &= c.done;
    if (!c.error.ok() && !failed) failed = &c;
  }
  const Usage usage = UsageOf(ex);

  HttpResponder& res = *ex.responder;
  if (failed && !ex.headers_sent) {
    // Nothing was sent yet: a plain HTTP error (e.g. 503 for a queue timeout).
    for (Choice& c : ex.choices) c.handle->Cancel();
    ApiError e = ApiErrorFromStatus(failed->error);
    HttpHeaders h;
    const std::string pd_reason = options.pd ? PdFailureReason(failed->error) : "";
    if (pd_reason == "kv_full") {
      e.code = "kv_full";
      h.emplace_back("Retry-After", "1");
      rejected_total->Get({"kv_full"}).Inc();
      CountRequest("rejected");
    } else if (!pd_reason.empty()) {
      // The other half of the pair failed: a gateway error naming why.
      e.http_status = 502;
      e.type = "server_error";
      e.code = pd_reason;
      CountRequest("error");
    } else if (e.http_status == 503) {
      h.emplace_back("Retry-After", "1");
      rejected_total->Get({"max_queue_time"}).Inc();
      CountRequest("rejected");
    } else {
      CountRequest("error");
    }
    SendError(res, e, std::move(h));
    Retire(ex);
    return;
  }
  if (ex.stream) {
    if (!ex.headers_sent && (any_output || all_done)) {
      res.StartStream(200, {{"Content-Type", "text/event-stream"}, {"Cache-Control", "no-cache"}});
      ex.headers_sent = true;
      events = ex.StreamStart() + events;
    }
    if (failed && all_done)
      events += ex.StreamErrorEnd(ApiErrorFromStatus(failed->error), usage);
    else if (failed)
      events += StreamEncoder::Error(ApiErrorFromStatus(failed->error));
    else if (all_done)
      events += ex.StreamFinish(usage);
    // Kept before the last event goes out: a client's next request may
    // name it as soon as it has read it.
    if (all_done && !failed && ex.store_response && ex.responses_encoder &&
        ex.choices[0].reason != FinishReason::kAbort)  // not a client that left
      response_store->Put(ex.meta.id, ex.responses_encoder->final_response(), ex.responses_input);
    if (!events.empty()) res.Write(std::move(events));
    if (all_done) res.End();
  } else if (all_done) {
    std::vector<ChoiceOutput> outs;
    for (Choice& c : ex.choices) {
      ChoiceOutput o;
      o.index = c.index;
      o.text = c.text;
      o.tool_calls = c.ToolCalls();
      if (c.reasoning && c.reasoning->reasoning_seen() && c.include_reasoning)
        o.reasoning_content = c.reasoning_text;
      o.tokens = std::move(c.tokens);
      if (ex.echo_logprobs) o.leading_null_logprobs = 1;
      if (ex.prompt_logprobs >= 0) o.prompt_logprobs = PromptLogprobsCut(c, ex.prompt_logprobs);
      o.finish_reason = c.reason;
      o.stop_reason = c.stop_reason;
      o.echo_offset = ex.echo && !ex.echo_logprobs ? CodePointCount(c.echo_text) : 0;
      if (ex.return_token_ids)
        o.prompt_token_ids = c.prompt_ids, o.token_ids = std::move(c.output_ids);
      outs.push_back(std::move(o));
    }
    ojson body = ex.responses ? ResponseObjectJson(*ex.responses, outs[0], usage)
                 : ex.chat ? ChatCompletionResponseJson(ex.meta, outs, usage, ex.logprobs, ex.role)
                           : CompletionResponseJson(ex.meta, outs, usage, ex.logprobs);
    if (ex.store_response && outs[0].finish_reason != FinishReason::kAbort)
      response_store->Put(ex.meta.id, body, ex.responses_input);
    res.SendJson(200, DumpJson(body));
    ex.headers_sent = true;
  }
  if (all_done) {
    // Every choice finished and the last event (or the body) was handed to
    // the transport: that is a served request, even if the client closes
    // at once (openai-node closes right after reading `data: [DONE]`, racing
    // the chunked terminator). A client that left earlier cancelled its
    // choices, which then finished with kAbort.
    bool aborted = false;
    for (const Choice& c : ex.choices) aborted |= c.reason == FinishReason::kAbort;
    CountRequest(failed ? "error" : aborted ? "aborted" : "ok");
    e2e->Observe(Seconds(Clock::now() - ex.arrival));
    Retire(ex);
  }
}

Status OpenAiServer::Start() { return impl_->http->Start(); }
int OpenAiServer::port() const { return impl_->http->port(); }
bool OpenAiServer::draining() const { return impl_->draining.load(); }
int64_t OpenAiServer::in_flight() const { return impl_->in_flight.load(); }

void OpenAiServer::BeginDrain() {
  impl_->draining.store(true);
  impl_->engine.Drain();
}

void OpenAiServer::AbortInFlight(std::string_view why) { impl_->AbortInFlight(std::string(why)); }

void OpenAiServer::Stop() {
  if (!impl_) return;
  if (impl_->http) impl_->http->Stop();
  // No handler runs any more: stop the request threads (queued jobs are
  // dropped; their connections are closed), then the output threads.
  {
    std::lock_guard<std::mutex> lock(impl_->req_mu);
    impl_->req_stop = true;
    impl_->req_queue.clear();
  }
  impl_->req_cv.notify_all();
  for (auto& t : impl_->req_threads)
    if (t.joinable()) t.join();
  impl_->req_threads.clear();
  {
    std::lock_guard<std::mutex> lock(impl_->out_mu);
    impl_->out_stop = true;
  }
  impl_->out_cv.notify_all();
  for (auto& t : impl_->out_threads)
    if (t.joinable()) t.join();
  impl_->out_threads.clear();
  impl_->prewarm_stop.store(true);
  if (impl_->prewarm_thread.joinable()) impl_->prewarm_thread.join();
  // Whatever is still in flight will never be read: free its engine work.
  std::lock_guard<std::mutex> lock(impl_->active_mu);
  for (auto& ex : impl_->active)
    for (Choice& c : ex->choices)
      if (c.handle) c.handle->Cancel();
}

}  // namespace strata
