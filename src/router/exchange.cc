// Router::Impl::Exchange: one client request and its upstream hops (the
// colocated worker; or the prefill and the decode), from dispatch through
// retries to the client's answer (router_impl.h has the state).
#include <algorithm>
#include <cctype>

#include "router/router_impl.h"
#include "util/logging.h"

namespace strata::router {
namespace {

// Non-streaming answers up to this size are relayed whole, with the
// worker's Content-Length (a colocated server writes them in one piece at
// the end anyway); larger ones and every chunked (SSE) body stream through.
constexpr size_t kRelayWholeBytes = 4 << 20;
// PD: after the decode fails before its first byte, how long the router
// waits for the prefill's answer, which says better what went wrong.
constexpr auto kPrefillGrace = std::chrono::milliseconds(2'000);

bool IEquals(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) ==
                  std::tolower(static_cast<unsigned char>(y));
         });
}

// Headers of a worker's response that the client gets: all but hop-by-hop
// ones (the router's transport frames the body itself).
HttpHeaders ClientHeaders(const HttpHeaders& upstream, const std::string& request_id) {
  static const char* const kHop[] = {
      "connection", "keep-alive", "transfer-encoding", "content-length",    "te",
      "trailer",    "upgrade",    "proxy-connection",  "proxy-authenticate"};
  HttpHeaders out;
  bool has_id = false;
  for (const auto& [k, v] : upstream) {
    bool hop = false;
    for (const char* h : kHop) hop = hop || IEquals(k, h);
    if (hop) continue;
    has_id = has_id || IEquals(k, "x-request-id");
    out.emplace_back(k, v);
  }
  if (!has_id) out.emplace_back("X-Request-Id", request_id);
  return out;
}

std::string HeaderOf(const HttpHeaders& h, std::string_view name) {
  for (const auto& [k, v] : h)
    if (IEquals(k, name)) return v;
  return "";
}

std::string SseErrorEvent(const std::string& message, const std::string& code) {
  return "data: " + HttpErrorJson(message, "server_error", code) + "\n\n";
}

}  // namespace

// ---- Exchange ---------------------------------------------------------------

void Router::Impl::Exchange::Dispatch() {
  ++gen;
  ++attempts;
  if (!r.pd) {
    std::vector<Candidate> c = r.Candidates(Role::kColocated, failed);
    if (c.empty()) {
      if (last_failure) return RelayFailure(*last_failure, "the last worker tried");
      return SendError({503, "overloaded", "no_healthy_worker",
                        "no healthy worker can take the request now (see the router's /workers)",
                        true});
    }
    int w = -1;
    if (!pin_instance.empty()) {  // the worker that stores the response referred to
      for (const Candidate& cand : c) {
        Worker& cw = *r.workers[static_cast<size_t>(cand.worker)];
        std::lock_guard lock(cw.mu);
        if (cw.instance_id == pin_instance) w = cand.worker;
      }
    }
    // Else (none referred to, or its worker is gone or down: its store went
    // with it, and any worker answers that the response is not found).
    if (w < 0)
      w = generation ? r.policy->Pick(c, prefix_text)
                     : c[static_cast<size_t>(r.Rand() % c.size())].worker;
    StartHop(main, w, body, false);
    return;
  }
  std::vector<Candidate> pc = r.Candidates(Role::kPrefill, failed);
  std::vector<Candidate> dc = r.Candidates(Role::kDecode, failed);
  if (!generation) {  // relayed requests (/v1/models, ...) go to a decode
    if (dc.empty()) {
      if (last_failure) return RelayFailure(*last_failure, "the last decode server tried");
      return SendError({503, "overloaded", "no_healthy_worker",
                        "no healthy decode server can take the request now", true});
    }
    StartHop(main, dc[static_cast<size_t>(r.Rand() % dc.size())].worker, body, false);
    return;
  }
  if (pc.empty() || dc.empty()) {
    if (last_failure) return RelayFailure(*last_failure, "the last PD pair tried");
    return SendError({503, "overloaded", "no_healthy_worker",
                      std::string("no healthy ") + (pc.empty() ? "prefill" : "decode") +
                          " server can take the request now (see the router's /workers)",
                      true});
  }
  const int p = r.prefill_policy->Pick(pc, prefix_text);
  const int d = r.decode_policy->Pick(dc, prefix_text);
  Worker& pw = *r.workers[static_cast<size_t>(p)];
  int bootstrap_port;
  {
    std::lock_guard lock(pw.mu);
    bootstrap_port = pw.bootstrap_port;
  }
  const uint64_t room = r.NewRoom();
  const std::string rewritten = WithBootstrapFields(*parsed, pw.ep.host, bootstrap_port, room);
  STRATA_LOG(DEBUG) << "router: request " << request_id << " room " << room << ": prefill "
                    << pw.ep.url << ", decode " << r.workers[static_cast<size_t>(d)]->ep.url;
  decode_failed_waiting = false;
  StartHop(prefill, p, rewritten, true);
  StartHop(main, d, rewritten, false);
}

void Router::Impl::Exchange::StartHop(Hop& hop, int worker, std::string hop_body, bool is_prefill) {
  Worker& w = *r.workers[static_cast<size_t>(worker)];
  hop = Hop{};
  hop.worker = worker;
  hop.start = Clock::now();
  hop.active = true;
  {
    std::lock_guard lock(w.mu);
    w.breaker.OnSend();
    w.PublishBreaker();
    w.open[this] = weak_from_this();
  }
  w.in_flight_gauge->Set(static_cast<double>(++w.in_flight));
  UpstreamRequest up;
  up.method = method;
  up.target = target;
  up.headers = forward;
  up.body = std::move(hop_body);
  up.timeout = r.options.request_timeout;
  UpstreamHandlers h;
  auto self = shared_from_this();
  const uint64_t g = gen;
  h.on_head = [self, g, is_prefill](UpstreamResponseHead head) {
    self->OnHead(g, is_prefill, std::move(head));
  };
  h.on_body = [self, g, is_prefill](std::string piece) {
    self->OnBody(g, is_prefill, std::move(piece));
  };
  h.on_done = [self, g, is_prefill](UpstreamError e, std::string detail) {
    self->OnDone(g, is_prefill, e, std::move(detail));
  };
  hop.call = r.client->Start(w.ep, std::move(up), std::move(h));
}

// Once per hop: the worker's counts, metrics and breaker. `success`: what the
// outcome says about the worker (nullopt: nothing, e.g. cancelled by us).
void Router::Impl::Exchange::EndHop(Hop& hop, const char* outcome, std::optional<bool> success) {
  if (!hop.active) return;
  hop.active = false;
  Worker& w = *r.workers[static_cast<size_t>(hop.worker)];
  w.in_flight_gauge->Set(static_cast<double>(--w.in_flight));
  r.CountHop(w, outcome);
  if (success) w.seconds->Observe(std::chrono::duration<double>(Clock::now() - hop.start).count());
  std::lock_guard lock(w.mu);
  w.open.erase(this);
  const BreakerState before = w.breaker.state();
  if (success)
    w.breaker.Record(*success, Clock::now());
  else
    w.breaker.Forget();
  w.PublishBreaker();
  if (w.breaker.state() != before)
    STRATA_LOG(WARN) << "router: worker " << w.ep.url << " circuit breaker "
                     << BreakerStateName(before) << " -> " << BreakerStateName(w.breaker.state())
                     << " (request " << request_id << ": " << outcome << ")";
}

void Router::Impl::Exchange::CancelHop(Hop& hop, const char* outcome) {
  if (!hop.active) return;
  if (hop.call) hop.call->Cancel();
  EndHop(hop, outcome, std::nullopt);
}

void Router::Impl::Exchange::Finish() {
  if (done) return;
  done = true;
  STRATA_LOG(DEBUG) << "router: request " << request_id << " " << method << " " << target
                    << " done in " << std::chrono::duration<double>(Clock::now() - arrival).count()
                    << " s after " << attempts << " attempt(s)";
  if (holds_slot) {
    holds_slot = false;
    // Off this lock: the freed slot starts the next queued request, which
    // takes its own exchange's lock.
    std::weak_ptr<Impl> impl = keep;
    r.client->After(std::chrono::milliseconds(0), [impl] {
      if (auto p = impl.lock()) p->admission.Release();
    });
  }
  if (!generation) --r.relaying;
}

void Router::Impl::Exchange::SendError(const RouterError& e) {
  if (done) return;
  HttpHeaders h = {{"Content-Type", "application/json"}, {"X-Request-Id", request_id}};
  if (e.retry_after) h.emplace_back("Retry-After", "1");
  res->Send(e.status, std::move(h), HttpErrorJson(e.message, e.type, e.code));
  Finish();
}

void Router::Impl::Exchange::SendWhole(const Hop& hop) {
  if (done) return;
  res->Send(hop.status, ClientHeaders(hop.headers, request_id), hop.body);
  committed = true;
  Finish();
}

// The answer of a hop that failed (its error response, or ours for a
// transport failure) when nothing better is left.
void Router::Impl::Exchange::RelayFailure(const Hop& hop, const char* who) {
  if (hop.error == UpstreamError::kNone && hop.head) return SendWhole(hop);
  const std::string url = r.workers[static_cast<size_t>(hop.worker)]->ep.url;
  if (hop.error == UpstreamError::kTimeout)
    return SendError({504, "server_error", "upstream_timeout",
                      std::string(who) + " (" + url + ") timed out: " + hop.detail, false});
  SendError({502, "server_error", "upstream_unreachable",
             std::string(who) + " (" + url + ") failed: " + hop.detail, true});
}

void Router::Impl::Exchange::Retry(Hop& failed_hop, const std::string& why) {
  failed.push_back(failed_hop.worker);
  last_failure = failed_hop;
  CancelHop(main, "cancelled");
  CancelHop(prefill, "cancelled");
  r.retries_total->Inc();
  STRATA_LOG(WARN) << "router: request " << request_id << ": "
                   << r.workers[static_cast<size_t>(failed_hop.worker)]->ep.url << " " << why
                   << "; retrying elsewhere (attempt " << attempts + 1 << " of at most "
                   << r.options.max_retries + 1 << ")";
  Dispatch();
}

void Router::Impl::Exchange::OnHead(uint64_t g, bool is_prefill, UpstreamResponseHead head) {
  std::lock_guard lock(mu);
  if (done || g != gen) return;
  Hop& hop = is_prefill ? prefill : main;
  hop.head = true;
  hop.status = head.status;
  hop.headers = std::move(head.headers);
  if (is_prefill) return;  // its answer is read whole
  const bool whole =
      head.status == 503 || (head.content_length && *head.content_length <= kRelayWholeBytes);
  if (whole) return;
  // Streamed through from here: the client has the head, so no retry.
  hop.stream = true;
  committed = true;
  res->StartStream(hop.status, ClientHeaders(hop.headers, request_id));
}

void Router::Impl::Exchange::OnBody(uint64_t g, bool is_prefill, std::string piece) {
  std::lock_guard lock(mu);
  if (done || g != gen) return;
  Hop& hop = is_prefill ? prefill : main;
  if (hop.stream) {
    hop.tail = (hop.tail + piece.substr(piece.size() > 32 ? piece.size() - 32 : 0));
    if (hop.tail.size() > 32) hop.tail.erase(0, hop.tail.size() - 32);
    res->Write(std::move(piece));
  } else if (hop.body.size() < kRelayWholeBytes + (1 << 20)) {
    hop.body += piece;
  }
}

void Router::Impl::Exchange::OnDone(uint64_t g, bool is_prefill, UpstreamError e,
                                    std::string detail) {
  std::lock_guard lock(mu);
  const Hop& hop = is_prefill ? prefill : main;
  // A stale attempt, or a hop already ended here (cancelled, failed over).
  if (g != gen || !hop.active) return;
  Done(is_prefill, e, std::move(detail));
}

// The worker of an open hop failed its health checks: that hop fails now as
// if its connection had (retried elsewhere when nothing reached the client
// yet; a stream in progress ends with an error event).
void Router::Impl::Exchange::OnWorkerLost(int worker, const std::string& why) {
  std::lock_guard lock(mu);
  for (bool is_prefill : {false, true}) {
    Hop& hop = is_prefill ? prefill : main;
    if (!hop.active || hop.worker != worker) continue;
    if (hop.call) hop.call->Cancel();
    Done(is_prefill, UpstreamError::kConnect, why);
  }
}

void Router::Impl::Exchange::Done(bool is_prefill, UpstreamError e, std::string detail) {
  Hop& hop = is_prefill ? prefill : main;
  hop.done = true;
  hop.error = e;
  hop.detail = std::move(detail);
  // What the hop says about its worker.
  const char* outcome = "error";
  std::optional<bool> healthy_worker;
  switch (e) {
    case UpstreamError::kNone:
      outcome = hop.status < 400    ? "ok"
                : hop.status < 500  ? "client_error"
                : hop.status == 503 ? "overloaded"
                                    : "error";
      // A 503 is shedding on purpose, a 502 names a failure of the other PD
      // role: neither is this worker broken.
      healthy_worker = hop.status < 500 || hop.status == 502 || hop.status == 503;
      break;
    case UpstreamError::kConnect:
      outcome = "unreachable";
      healthy_worker = false;
      break;
    case UpstreamError::kTimeout:
      outcome = "timeout";
      healthy_worker = false;
      break;
    case UpstreamError::kBroken:
      outcome = "broken";
      healthy_worker = false;
      break;
  }
  EndHop(hop, outcome, healthy_worker);
  if (done) return;  // e.g. PD: the decode already answered the client

  const bool retryable =
      e == UpstreamError::kConnect || (e == UpstreamError::kNone && hop.status == 503);
  const Worker& w = *r.workers[static_cast<size_t>(hop.worker)];

  if (is_prefill) {
    if (e == UpstreamError::kNone && hop.status < 300) {
      if (decode_failed_waiting) RelayFailure(main, "the decode server");
      return;
    }
    if (committed) return;  // the decode's stream carries on and ends with its own error
    // The prefill failed before the decode sent a byte: its answer is the one.
    STRATA_LOG(WARN) << "router: request " << request_id << ": prefill " << w.ep.url
                     << " failed before the decode answered: "
                     << (e == UpstreamError::kNone ? "HTTP " + std::to_string(hop.status)
                                                   : hop.detail);
    if (retryable && CanRetry()) return Retry(hop, "(prefill) refused or unreachable");
    CancelHop(main, "cancelled");
    return RelayFailure(hop, "the prefill server");
  }

  if (hop.stream) {  // committed: the client has the head and part of the body
    if (e != UpstreamError::kNone) {
      STRATA_LOG(WARN) << "router: request " << request_id << ": " << w.ep.url
                       << " broke off mid-stream: " << hop.detail;
      if (HeaderOf(hop.headers, "content-type").find("text/event-stream") != std::string::npos) {
        res->Write(
            SseErrorEvent("the worker's stream broke off: " + hop.detail,
                          e == UpstreamError::kTimeout ? "upstream_timeout" : "upstream_broken"));
        res->End();
      }
      // Other bodies: dropping the responder unfinished cuts the connection,
      // so the client sees a truncated body, not a clean end.
    } else {
      res->End();
    }
    return Finish();
  }

  const bool ok =
      e == UpstreamError::kNone && hop.status != 503 && (!r.pd || !generation || hop.status < 300);
  if (ok) return SendWhole(hop);
  if ((retryable || (e == UpstreamError::kBroken && !committed)) && CanRetry())
    return Retry(hop, e == UpstreamError::kNone ? "answered 503" : "failed: " + hop.detail);
  if (r.pd && generation && prefill.active && !retryable) {
    // The decode failed first; the prefill's answer (soon: the decode told it)
    // usually names the cause. Wait a little for it.
    decode_failed_waiting = true;
    std::weak_ptr<Exchange> weak = shared_from_this();
    const uint64_t my_gen = gen;
    r.client->After(kPrefillGrace, [weak, my_gen] {
      if (auto ex = weak.lock()) ex->OnPrefillGrace(my_gen);
    });
    return;
  }
  RelayFailure(hop, r.pd ? "the decode server" : "the worker");
}

void Router::Impl::Exchange::OnPrefillGrace(uint64_t g) {
  std::lock_guard lock(mu);
  if (done || g != gen || !decode_failed_waiting) return;
  CancelHop(prefill, "cancelled");
  RelayFailure(main, "the decode server");
}

void Router::Impl::Exchange::OnClientGone() {
  std::lock_guard lock(mu);
  if (done) return;
  STRATA_LOG(DEBUG) << "router: request " << request_id
                    << ": the client went away; closing its upstream requests";
  if (queued && r.admission.Cancel(id)) queued = false;
  // A client that closes right after the stream's last event (openai-node
  // does, on `data: [DONE]`) got its whole answer: ok, though the worker's
  // end of the chunked body had not reached the router yet.
  if (main.active && main.stream && main.tail.find("data: [DONE]\n\n") != std::string::npos) {
    main.call->Cancel();
    EndHop(main, "ok", true);
  }
  CancelHop(main, "aborted");
  CancelHop(prefill, "aborted");
  Finish();
}

}  // namespace strata::router
