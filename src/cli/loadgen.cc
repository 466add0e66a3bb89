#include "cli/loadgen.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <deque>
#include <memory>
#include <random>
#include <unordered_map>

namespace strata::cli {

Status ParseUrl(const std::string& url, LoadgenConfig* config) {
  const std::string scheme = "http://";
  if (url.rfind(scheme, 0) != 0)
    return InvalidArgument("--url '" + url +
                           "': only http://HOST:PORT is supported (e.g. http://127.0.0.1:8000)");
  std::string rest = url.substr(scheme.size());
  while (!rest.empty() && rest.back() == '/') rest.pop_back();
  if (rest.find('/') != std::string::npos)
    return InvalidArgument(
        "--url '" + url +
        "': give the server root without a path; the load goes to /v1/completions");
  std::string host = rest;
  int port = 80;
  const size_t colon = rest.rfind(':');
  if (colon != std::string::npos) {
    host = rest.substr(0, colon);
    const std::string p = rest.substr(colon + 1);
    char* end = nullptr;
    const long v = std::strtol(p.c_str(), &end, 10);
    if (p.empty() || *end != '\0' || v < 1 || v > 65535)
      return InvalidArgument("--url '" + url + "': port '" + p + "' is not a number in 1..65535");
    port = static_cast<int>(v);
  }
  if (host == "localhost") host = "127.0.0.1";
  in_addr addr{};
  if (inet_pton(AF_INET, host.c_str(), &addr) != 1)
    return InvalidArgument("--url '" + url + "': host '" + host +
                           "' is not an IPv4 address or localhost");
  config->host = host;
  config->port = port;
  return OkStatus();
}

double Percentile(const std::vector<double>& sorted, double p) {
  if (sorted.empty()) return 0;
  const double rank = std::clamp(p, 0.0, 100.0) / 100.0 * static_cast<double>(sorted.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(rank));
  const size_t hi = std::min(lo + 1, sorted.size() - 1);
  const double frac = rank - static_cast<double>(lo);
  return sorted[lo] + (sorted[hi] - sorted[lo]) * frac;
}

std::vector<std::string> SseParser::Feed(std::string_view bytes) {
  std::vector<std::string> events;
  for (char c : bytes) {
    if (c != '\n') {
      line_.push_back(c);
      continue;
    }
    if (!line_.empty() && line_.back() == '\r') line_.pop_back();
    if (line_.empty()) {
      if (has_data_) events.push_back(std::move(data_));
      data_.clear();
      has_data_ = false;
    } else if (line_.rfind("data:", 0) == 0) {
      std::string_view v(line_);
      v.remove_prefix(5);
      if (!v.empty() && v.front() == ' ') v.remove_prefix(1);
      if (has_data_) data_.push_back('\n');
      data_.append(v);
      has_data_ = true;
    }  // other fields (event:, id:, retry:) and comments (':') carry nothing we count
    line_.clear();
  }
  return events;
}

StatusOr<SseChunk> ParseCompletionChunk(const std::string& data, int64_t prev_completion_tokens) {
  SseChunk c;
  if (data == "[DONE]") {
    c.done = true;
    return c;
  }
  nlohmann::json j = nlohmann::json::parse(data, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object())
    return InvalidArgument("stream chunk is not a JSON object: '" + data.substr(0, 200) + "'");
  std::string& text = c.text;
  if (auto ch = j.find("choices"); ch != j.end() && ch->is_array() && !ch->empty()) {
    const auto& c0 = (*ch)[0];
    if (auto t = c0.find("text"); t != c0.end() && t->is_string()) text = t->get<std::string>();
    if (auto d = c0.find("delta"); d != c0.end() && d->is_object()) {
      if (auto t = d->find("content"); t != d->end() && t->is_string())
        text = t->get<std::string>();
    }
    if (auto f = c0.find("finish_reason"); f != c0.end() && f->is_string())
      c.finish_reason = f->get<std::string>();
  }
  if (auto u = j.find("usage"); u != j.end() && u->is_object()) {
    if (auto ct = u->find("completion_tokens"); ct != u->end() && ct->is_number_integer())
      c.completion_tokens = ct->get<int64_t>();
    if (auto pt = u->find("prompt_tokens"); pt != u->end() && pt->is_number_integer())
      c.prompt_tokens = pt->get<int64_t>();
    if (auto d = u->find("prompt_tokens_details"); d != u->end() && d->is_object()) {
      if (auto ct = d->find("cached_tokens"); ct != d->end() && ct->is_number_integer())
        c.cached_tokens = ct->get<int64_t>();
    }
  }
  if (c.completion_tokens >= 0) {
    c.tokens =
        std::max<int64_t>(0, c.completion_tokens - std::max<int64_t>(prev_completion_tokens, 0));
  } else {
    c.tokens = text.empty() ? 0 : 1;
  }
  return c;
}

std::vector<double> PoissonSchedule(double rate, int64_t n, uint64_t seed) {
  std::vector<double> out;
  out.reserve(static_cast<size_t>(std::max<int64_t>(n, 0)));
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  double t = 0;
  for (int64_t i = 0; i < n; ++i) {
    // Inverse-CDF sampling by hand: std::exponential_distribution's algorithm
    // is the library's choice, this one is the same everywhere.
    t += -std::log(1.0 - u(rng)) / rate;
    out.push_back(t);
  }
  return out;
}

LatencyStats ComputeLatencyStats(std::vector<double> values) {
  LatencyStats s;
  if (values.empty()) return s;
  std::sort(values.begin(), values.end());
  double sum = 0;
  for (double v : values) sum += v;
  s.count = static_cast<int64_t>(values.size());
  s.mean = sum / static_cast<double>(values.size());
  s.p50 = Percentile(values, 50);
  s.p90 = Percentile(values, 90);
  s.p99 = Percentile(values, 99);
  s.max = values.back();
  return s;
}

namespace {

bool Succeeded(const RequestRecord& r) { return r.http_status == 200 && r.error.empty(); }

nlohmann::json StatsJson(const LatencyStats& s) {
  return {{"count", s.count}, {"mean", s.mean}, {"p50", s.p50},
          {"p90", s.p90},     {"p99", s.p99},   {"max", s.max}};
}

}  // namespace

bool MeetsSlo(const RequestRecord& r, double slo_ttft_ms, double slo_itl_ms) {
  if (!Succeeded(r) || r.ttft_s < 0) return false;
  if (slo_ttft_ms > 0 && r.ttft_s * 1e3 > slo_ttft_ms) return false;
  if (slo_itl_ms > 0 && r.output_tokens > 1) {
    const double mean_itl_ms =
        (r.e2e_s - r.ttft_s) * 1e3 / static_cast<double>(r.output_tokens - 1);
    if (mean_itl_ms > slo_itl_ms) return false;
  }
  return true;
}

LoadSummary Summarize(const std::vector<RequestRecord>& records, double duration_s,
                      const LoadgenConfig& config) {
  LoadSummary s;
  s.duration_s = duration_s;
  s.requests = static_cast<int64_t>(records.size());
  std::vector<double> ttft, itl, e2e, rej;
  int64_t in_tok = 0, out_tok = 0;
  for (const RequestRecord& r : records) {
    if (r.http_status == 0) {
      ++s.connection_errors;
    } else {
      ++s.by_status[r.http_status];
      if (r.http_status == 503)
        ++s.rejected_503;
      else if (r.http_status != 200)
        ++s.other_status;
      else if (!r.error.empty())
        ++s.connection_errors;  // a 200 whose stream broke
    }
    if (r.http_status != 0 && r.http_status != 200) rej.push_back(r.e2e_s * 1e3);
    if (!Succeeded(r)) continue;
    ++s.ok;
    in_tok += r.input_tokens;
    s.cached_tokens += r.cached_tokens;
    out_tok += r.output_tokens;
    if (r.ttft_s >= 0) ttft.push_back(r.ttft_s * 1e3);
    e2e.push_back(r.e2e_s * 1e3);
    for (double g : r.itl_s) itl.push_back(g * 1e3);
    if (MeetsSlo(r, config.slo_ttft_ms, config.slo_itl_ms)) ++s.slo_met;
  }
  s.input_tokens = in_tok;
  if (duration_s > 0) {
    s.request_throughput = static_cast<double>(s.ok) / duration_s;
    s.input_tok_s = static_cast<double>(in_tok) / duration_s;
    s.output_tok_s = static_cast<double>(out_tok) / duration_s;
    s.goodput = static_cast<double>(s.slo_met) / duration_s;
  }
  s.ttft_ms = ComputeLatencyStats(std::move(ttft));
  s.itl_ms = ComputeLatencyStats(std::move(itl));
  s.e2e_ms = ComputeLatencyStats(std::move(e2e));
  s.rejection_ms = ComputeLatencyStats(std::move(rej));
  return s;
}

nlohmann::json LoadSummary::ToJson() const {
  nlohmann::json statuses = nlohmann::json::object();
  for (const auto& [code, n] : by_status) statuses[std::to_string(code)] = n;
  return {{"duration_s", duration_s},
          {"requests", requests},
          {"ok", ok},
          {"rejected_503", rejected_503},
          {"other_status", other_status},
          {"connection_errors", connection_errors},
          {"by_status", statuses},
          {"request_throughput", request_throughput},
          {"input_tok_s", input_tok_s},
          {"output_tok_s", output_tok_s},
          {"input_tokens", input_tokens},
          {"cached_tokens", cached_tokens},
          {"goodput", goodput},
          {"slo_met", slo_met},
          {"ttft_ms", StatsJson(ttft_ms)},
          {"itl_ms", StatsJson(itl_ms)},
          {"e2e_ms", StatsJson(e2e_ms)},
          {"rejection_ms", StatsJson(rejection_ms)}};
}

// ---------------------------------------------------------------------------
// The client: one epoll loop, one connection per request (Connection: close),
// so a request's latency includes its connect, as a fresh client's would.

namespace {

using Clock = std::chrono::steady_clock;

// Token ids every model in this tree has (and that are not special tokens).
constexpr int32_t kMinTokenId = 10;
constexpr int32_t kMaxTokenId = 400;

// Common English words: each is one token in the tokenizers here (with its
// leading space), so a chat prompt of n words is about n tokens.
constexpr const char* kWords[] = {
    "the",  "of",    "and",   "to",    "in",    "is",    "was",    "for",   "on",    "that",
    "with", "as",    "at",    "by",    "from",  "this",  "have",   "not",   "but",   "what",
    "all",  "were",  "when",  "we",    "there", "can",   "an",     "your",  "which", "their",
    "said", "if",    "do",    "will",  "each",  "about", "how",    "up",    "out",   "them",
    "then", "she",   "many",  "some",  "so",    "these", "would",  "other", "into",  "has",
    "more", "her",   "two",   "like",  "him",   "see",   "time",   "could", "no",    "make",
    "than", "first", "been",  "its",   "who",   "now",   "people", "my",    "made",  "over",
    "did",  "down",  "only",  "way",   "find",  "use",   "may",    "water", "long",  "little",
    "very", "after", "words", "called"};

std::string RandomWords(std::mt19937_64& rng, int64_t n) {
  std::uniform_int_distribution<size_t> pick(0, std::size(kWords) - 1);
  std::string out;
  for (int64_t i = 0; i < n; ++i) {
    if (i) out.push_back(' ');
    out += kWords[pick(rng)];
  }
  return out;
}

struct Conversation {
  std::mt19937_64 rng;
  nlohmann::json messages = nlohmann::json::array();  // chat: grows turn by turn
  std::vector<int32_t> prompt;                        // completions: grows turn by turn
  int64_t next_turn = 0;
  int64_t last_output_len = 0;
};

// An HTTP/1.1 response read incrementally: head, then a chunked,
// Content-Length or read-to-close body.
struct Conn {
  int fd = -1;
  int64_t conversation = 0;
  RequestRecord rec;
  std::string out;
  size_t out_off = 0;
  bool connected = false;

  std::string in;
  bool head_done = false;
  bool chunked = false;
  int64_t content_length = -1;
  int64_t body_seen = 0;
  int64_t chunk_left = -1;  // -1: expecting a size line; -2: expecting the CRLF after data
  bool complete = false;

  SseParser sse;
  bool stream_done = false;
  int64_t completion_tokens = 0;
  double last_token_s = -1;
  std::string error_body;
  std::string text;  // the streamed answer (chat: carried into the next turn)
};

int64_t DrawLen(std::mt19937_64& rng, int64_t len, double ratio) {
  const int64_t lo =
      std::max<int64_t>(1, static_cast<int64_t>(std::floor(static_cast<double>(len) * ratio)));
  const int64_t hi = std::max(lo, len);
  return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
}

void AppendRandomTokens(std::mt19937_64& rng, int64_t n, std::vector<int32_t>* out) {
  std::uniform_int_distribution<int32_t> id(kMinTokenId, kMaxTokenId);
  for (int64_t i = 0; i < n; ++i) out->push_back(id(rng));
}

class LoadRunner {
 public:
  LoadRunner(const LoadgenConfig& config, const ProgressFn& progress)
      : cfg_(config), progress_(progress) {}
  ~LoadRunner() {
    for (auto& [fd, c] : conns_) ::close(fd);
    if (ep_ >= 0) ::close(ep_);
  }

  StatusOr<std::vector<RequestRecord>> Run(double* duration_s) {
    ep_ = epoll_create1(EPOLL_CLOEXEC);
    if (ep_ < 0) return Internal(std::string("epoll_create1: ") + std::strerror(errno));
    if (inet_pton(AF_INET, cfg_.host.c_str(), &addr_.sin_addr) != 1)
      return InvalidArgument("host '" + cfg_.host + "' is not an IPv4 address");
    addr_.sin_family = AF_INET;
    addr_.sin_port = htons(static_cast<uint16_t>(cfg_.port));

    const int64_t n = cfg_.num_requests;
    total_ = n * cfg_.turns;
    // Shared prefixes per group, from their own seed so they do not depend on n.
    std::mt19937_64 prng(cfg_.seed ^ 0x9e3779b97f4a7c15ull);
    prefixes_.resize(static_cast<size_t>(std::max<int64_t>(cfg_.num_groups, 1)));
    for (auto& p : prefixes_) AppendRandomTokens(prng, cfg_.shared_prefix_len, &p);
    for (size_t g = 0; g < prefixes_.size(); ++g)
      prefix_texts_.push_back(RandomWords(prng, cfg_.shared_prefix_len));
    if (cfg_.mode == LoadgenConfig::Mode::kRate)
      arrivals_ = PoissonSchedule(cfg_.request_rate, n, cfg_.seed);
    if (cfg_.mode == LoadgenConfig::Mode::kBurst) arrivals_.assign(static_cast<size_t>(n), 0.0);

    start_ = Clock::now();
    double last_progress = -1;
    std::vector<epoll_event> events(256);
    while (true) {
      const double now = Now();
      const bool accepting = cfg_.duration_s <= 0 || now < cfg_.duration_s;
      if (accepting) LaunchDue(now);
      if (conns_.empty() && (!accepting || Exhausted())) break;
      if (progress_ && (now - last_progress >= 0.1)) {
        progress_(static_cast<int64_t>(records_.size()), total_, now);
        last_progress = now;
      }
      int timeout_ms = 50;
      if (next_arrival_ < arrivals_.size() && accepting) {
        const double wait = arrivals_[next_arrival_] - Now();
        timeout_ms = std::clamp(static_cast<int>(std::ceil(wait * 1e3)), 0, 50);
      }
      const int k = epoll_wait(ep_, events.data(), static_cast<int>(events.size()), timeout_ms);
      if (k < 0 && errno != EINTR)
        return Internal(std::string("epoll_wait: ") + std::strerror(errno));
      for (int i = 0; i < k; ++i) OnEvent(events[i].data.fd, events[i].events);
      CutTimedOut();
    }
    *duration_s = Now();
    if (progress_) progress_(static_cast<int64_t>(records_.size()), total_, *duration_s);
    return std::move(records_);
  }

 private:
  double Now() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }

  bool Exhausted() const {
    if (!ready_turns_.empty()) return false;
    if (cfg_.mode == LoadgenConfig::Mode::kConcurrency) return next_conv_ >= cfg_.num_requests;
    return next_arrival_ >= arrivals_.size();
  }

  void LaunchDue(double now) {
    // Later turns of running conversations first: they are already admitted work.
    while (!ready_turns_.empty()) {
      const int64_t c = ready_turns_.front();
      ready_turns_.pop_front();
      StartTurn(c);
    }
    if (cfg_.mode == LoadgenConfig::Mode::kConcurrency) {
      while (active_convs_ < cfg_.concurrency && next_conv_ < cfg_.num_requests)
        StartConversation(next_conv_++);
    } else {
      while (next_arrival_ < arrivals_.size() && arrivals_[next_arrival_] <= now) {
        ++next_arrival_;
        StartConversation(next_conv_++);
      }
    }
  }

  void StartConversation(int64_t c) {
    Conversation& conv = convs_[c];
    conv.rng.seed(cfg_.seed * 1000003ull + static_cast<uint64_t>(c) + 1);
    const size_t group = static_cast<size_t>(c) % prefixes_.size();
    if (cfg_.chat) {
      if (cfg_.shared_prefix_len > 0)
        conv.messages.push_back({{"role", "system"}, {"content", prefix_texts_[group]}});
    } else {
      conv.prompt = prefixes_[group];
    }
    ++active_convs_;
    StartTurn(c);
  }

  void EndConversation(int64_t c) {
    convs_.erase(c);
    --active_convs_;
  }

  void StartTurn(int64_t c) {
    Conversation& conv = convs_[c];
    const int64_t in_len = DrawLen(conv.rng, cfg_.input_len, cfg_.range_ratio);
    const int64_t out_len = DrawLen(conv.rng, cfg_.output_len, cfg_.range_ratio);
    nlohmann::json body = {
        {"max_tokens", out_len},
        {"ignore_eos", true},
        {"temperature", 0},
        {"stream", true},
        {"stream_options", {{"include_usage", true}, {"continuous_usage_stats", true}}}};
    if (cfg_.chat) {
      // The previous answer was appended by Finish(); add the new question.
      conv.messages.push_back({{"role", "user"}, {"content", RandomWords(conv.rng, in_len)}});
      body["messages"] = conv.messages;
    } else {
      // A later turn repeats the conversation so far: the previous prompt, a
      // stand-in for the answer (same length, random ids), then the new input.
      if (conv.next_turn > 0) AppendRandomTokens(conv.rng, conv.last_output_len, &conv.prompt);
      AppendRandomTokens(conv.rng, in_len, &conv.prompt);
      body["prompt"] = conv.prompt;
    }
    conv.last_output_len = out_len;
    if (!cfg_.model.empty()) body["model"] = cfg_.model;
    const std::string payload = body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);

    auto conn = std::make_unique<Conn>();
    conn->conversation = c;
    conn->rec.conversation = c;
    conn->rec.turn = conv.next_turn;
    conn->rec.start_s = Now();
    conn->rec.input_tokens = static_cast<int64_t>(conv.prompt.size());  // chat: from usage
    ++conv.next_turn;
    conn->out =
        std::string("POST ") + (cfg_.chat ? "/v1/chat/completions" : "/v1/completions") +
        " HTTP/1.1\r\nHost: " + cfg_.host + ":" + std::to_string(cfg_.port) +
        "\r\nContent-Type: application/json\r\nAccept: text/event-stream\r\nConnection: close\r\n";
    if (!cfg_.api_key.empty()) conn->out += "Authorization: Bearer " + cfg_.api_key + "\r\n";
    conn->out += "Content-Length: " + std::to_string(payload.size()) + "\r\n\r\n" + payload;

    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      conn->rec.error = std::string("socket: ") + std::strerror(errno);
      Finish(std::move(conn));
      return;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    conn->fd = fd;
    if (::connect(fd, reinterpret_cast<const sockaddr*>(&addr_), sizeof(addr_)) != 0 &&
        errno != EINPROGRESS) {
      conn->rec.error = std::string("connect: ") + std::strerror(errno);
      ::close(fd);
      conn->fd = -1;
      Finish(std::move(conn));
      return;
    }
    epoll_event ev{};
    ev.events = EPOLLOUT | EPOLLIN | EPOLLRDHUP;
    ev.data.fd = fd;
    epoll_ctl(ep_, EPOLL_CTL_ADD, fd, &ev);
    conns_[fd] = std::move(conn);
  }

  void OnEvent(int fd, uint32_t ev) {
    auto it = conns_.find(fd);
    if (it == conns_.end()) return;
    Conn& c = *it->second;
    if (!c.connected && (ev & (EPOLLOUT | EPOLLERR | EPOLLHUP))) {
      int err = 0;
      socklen_t len = sizeof(err);
      getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
      if (err != 0) return Close(it, std::string("connect: ") + std::strerror(err));
      c.connected = true;
    }
    if (c.connected && c.out_off < c.out.size() && (ev & EPOLLOUT)) {
      while (c.out_off < c.out.size()) {
        const ssize_t w =
            ::send(fd, c.out.data() + c.out_off, c.out.size() - c.out_off, MSG_NOSIGNAL);
        if (w > 0) {
          c.out_off += static_cast<size_t>(w);
        } else if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
          break;
        } else {
          // The server may answer (503) and close before reading the whole body.
          c.out_off = c.out.size();
          break;
        }
      }
      if (c.out_off == c.out.size()) {
        epoll_event e{};
        e.events = EPOLLIN | EPOLLRDHUP;
        e.data.fd = fd;
        epoll_ctl(ep_, EPOLL_CTL_MOD, fd, &e);
      }
    }
    if (ev & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) {
      char buf[16384];
      while (true) {
        const ssize_t r = ::recv(fd, buf, sizeof(buf), 0);
        if (r > 0) {
          OnBytes(c, std::string_view(buf, static_cast<size_t>(r)));
          if (c.complete) return Close(it, "");
        } else if (r == 0) {
          // End of stream: a read-to-close body ends here; anything else is cut short.
          const bool ok = c.head_done && !c.chunked && c.content_length < 0;
          return Close(it, ok ? "" : "connection closed before the response was complete");
        } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
          break;
        } else {
          return Close(it, std::string("recv: ") + std::strerror(errno));
        }
      }
    }
  }

  void OnBytes(Conn& c, std::string_view bytes) {
    c.in.append(bytes);
    if (!c.head_done) {
      const size_t end = c.in.find("\r\n\r\n");
      if (end == std::string::npos) return;
      ParseHead(c, c.in.substr(0, end));
      c.in.erase(0, end + 4);
      c.head_done = true;
    }
    if (!c.chunked) {
      c.body_seen += static_cast<int64_t>(c.in.size());
      Deliver(c, c.in);
      c.in.clear();
      if (c.content_length >= 0 && c.body_seen >= c.content_length) c.complete = true;
      return;
    }
    size_t pos = 0;
    while (!c.complete) {
      if (c.chunk_left == -1) {
        const size_t eol = c.in.find("\r\n", pos);
        if (eol == std::string::npos) break;
        const long size = std::strtol(c.in.c_str() + pos, nullptr, 16);
        pos = eol + 2;
        if (size <= 0) {
          c.complete = true;  // trailers ignored
          break;
        }
        c.chunk_left = size;
      } else if (c.chunk_left == -2) {
        if (c.in.size() - pos < 2) break;
        pos += 2;
        c.chunk_left = -1;
      } else {
        const size_t take = std::min<size_t>(static_cast<size_t>(c.chunk_left), c.in.size() - pos);
        if (take == 0) break;
        Deliver(c, std::string_view(c.in).substr(pos, take));
        pos += take;
        c.chunk_left -= static_cast<int64_t>(take);
        if (c.chunk_left == 0) c.chunk_left = -2;
      }
    }
    c.in.erase(0, pos);
  }

  static void ParseHead(Conn& c, const std::string& head) {
    // "HTTP/1.1 200 OK\r\nName: value\r\n..."
    if (head.size() >= 12 && head.rfind("HTTP/1.", 0) == 0)
      c.rec.http_status = std::atoi(head.c_str() + 9);
    size_t pos = head.find("\r\n");
    while (pos != std::string::npos && pos + 2 < head.size()) {
      const size_t next = head.find("\r\n", pos + 2);
      std::string line =
          head.substr(pos + 2, next == std::string::npos ? std::string::npos : next - pos - 2);
      pos = next;
      const size_t colon = line.find(':');
      if (colon == std::string::npos) continue;
      std::string name = line.substr(0, colon);
      std::transform(name.begin(), name.end(), name.begin(),
                     [](unsigned char ch) { return std::tolower(ch); });
      std::string value = line.substr(colon + 1);
      while (!value.empty() && value.front() == ' ') value.erase(0, 1);
      if (name == "transfer-encoding" && value.find("chunked") != std::string::npos)
        c.chunked = true;
      if (name == "content-length") c.content_length = std::atoll(value.c_str());
    }
  }

  void Deliver(Conn& c, std::string_view bytes) {
    if (c.rec.http_status != 200) {
      if (c.error_body.size() < 512)
        c.error_body.append(bytes.substr(0, 512 - c.error_body.size()));
      return;
    }
    for (const std::string& data : c.sse.Feed(bytes)) {
      auto chunk = ParseCompletionChunk(data, c.completion_tokens);
      if (!chunk.ok()) {
        if (c.rec.error.empty()) c.rec.error = chunk.status().message();
        continue;
      }
      if (chunk->done) {
        c.stream_done = true;
        continue;
      }
      if (chunk->prompt_tokens >= 0) c.rec.input_tokens = chunk->prompt_tokens;
      if (chunk->cached_tokens >= 0) c.rec.cached_tokens = chunk->cached_tokens;
      if (chunk->completion_tokens >= 0) c.completion_tokens = chunk->completion_tokens;
      c.text += chunk->text;
      if (chunk->tokens <= 0) continue;
      const double now = Now() - c.rec.start_s;
      if (c.rec.ttft_s < 0) {
        c.rec.ttft_s = now;
        for (int64_t i = 1; i < chunk->tokens; ++i) c.rec.itl_s.push_back(0);
      } else {
        const double gap = (now - c.last_token_s) / static_cast<double>(chunk->tokens);
        for (int64_t i = 0; i < chunk->tokens; ++i) c.rec.itl_s.push_back(gap);
      }
      c.last_token_s = now;
      c.rec.output_tokens += chunk->tokens;
    }
  }

  void Close(std::unordered_map<int, std::unique_ptr<Conn>>::iterator it,
             const std::string& error) {
    std::unique_ptr<Conn> c = std::move(it->second);
    conns_.erase(it);
    epoll_ctl(ep_, EPOLL_CTL_DEL, c->fd, nullptr);
    ::close(c->fd);
    c->fd = -1;
    if (c->rec.error.empty() && !error.empty()) c->rec.error = error;
    if (c->rec.error.empty() && c->rec.http_status == 200 && !c->stream_done)
      c->rec.error = "stream ended without data: [DONE]";
    if (c->rec.error.empty() && c->rec.http_status != 200 && !c->error_body.empty())
      c->rec.error = c->error_body.substr(0, 200);
    Finish(std::move(c));
  }

  void Finish(std::unique_ptr<Conn> c) {
    c->rec.e2e_s = Now() - c->rec.start_s;
    const bool ok = c->rec.http_status == 200 && c->rec.error.empty();
    const int64_t conv = c->conversation;
    records_.push_back(std::move(c->rec));
    auto it = convs_.find(conv);
    if (it == convs_.end()) return;
    const bool accepting = cfg_.duration_s <= 0 || Now() < cfg_.duration_s;
    if (ok && cfg_.chat)
      it->second.messages.push_back({{"role", "assistant"}, {"content", std::move(c->text)}});
    if (ok && accepting && it->second.next_turn < cfg_.turns) {
      ready_turns_.push_back(conv);
    } else {
      EndConversation(conv);
    }
  }

  void CutTimedOut() {
    if (cfg_.timeout_s <= 0) return;
    const double now = Now();
    std::vector<int> late;
    for (const auto& [fd, c] : conns_)
      if (now - c->rec.start_s > cfg_.timeout_s) late.push_back(fd);
    for (int fd : late) {
      auto it = conns_.find(fd);
      it->second->rec.http_status = 0;
      Close(it, "timed out after " + std::to_string(cfg_.timeout_s) + " s");
    }
  }

  const LoadgenConfig& cfg_;
  const ProgressFn& progress_;
  int ep_ = -1;
  sockaddr_in addr_{};
  Clock::time_point start_;
  int64_t total_ = 0;
  std::vector<std::vector<int32_t>> prefixes_;
  std::vector<std::string> prefix_texts_;  // chat: the shared system prompts
  std::vector<double> arrivals_;
  size_t next_arrival_ = 0;
  int64_t next_conv_ = 0;
  int64_t active_convs_ = 0;
  std::unordered_map<int64_t, Conversation> convs_;
  std::deque<int64_t> ready_turns_;
  std::unordered_map<int, std::unique_ptr<Conn>> conns_;
  std::vector<RequestRecord> records_;
};

}  // namespace

StatusOr<std::vector<RequestRecord>> RunLoad(const LoadgenConfig& config,
                                             const ProgressFn& progress, double* duration_s) {
  if (config.num_requests < 1) return InvalidArgument("the number of requests must be at least 1");
  if (config.mode == LoadgenConfig::Mode::kRate && !(config.request_rate > 0))
    return InvalidArgument("--request-rate must be > 0");
  if (config.mode == LoadgenConfig::Mode::kConcurrency && config.concurrency < 1)
    return InvalidArgument("--concurrency must be at least 1");
  if (config.turns < 1) return InvalidArgument("--turns must be at least 1");
  LoadRunner runner(config, progress);
  double d = 0;
  auto r = runner.Run(&d);
  if (duration_s) *duration_s = d;
  return r;
}

}  // namespace strata::cli
