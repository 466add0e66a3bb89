// Test-only: a small blocking HTTP/1.1 client on plain POSIX sockets, so the
// server tests do not check Beast against itself. Parses Content-Length,
// chunked and read-to-close bodies; no TLS, no redirects. One thread per
// client object.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace strata::http_test {

// A 127.0.0.1 port free now, for a process that binds it later. Picked at
// random below Linux's default ephemeral range (32768-60999), where neither
// another test's bind(0) listener nor an outgoing connection's source port
// can take it between the pick and the bind (a port from bind(0) itself was
// taken so in a parallel suite: "Address already in use"); bind(0)'s port if
// 64 random ones are all busy.
inline int UnusedPort() {
  auto try_bind = [](int port) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(port));
    int got = -1;
    if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
      socklen_t len = sizeof a;
      if (::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) got = ntohs(a.sin_port);
    }
    ::close(fd);
    return got;
  };
  static std::minstd_rand rng(static_cast<unsigned>(::getpid()) * 2654435761u ^
                              static_cast<unsigned>(std::chrono::steady_clock::now().time_since_epoch().count()));
  for (int i = 0; i < 64; ++i) {
    const int port = try_bind(20000 + static_cast<int>(rng() % 12768));
    if (port > 0) return port;
  }
  return try_bind(0);
}

// Connects to 127.0.0.1:port; -1 on failure (errno set). Reads and writes
// time out after `timeout` so a wedged server fails a test instead of hanging it.
inline int Connect(int port, std::chrono::milliseconds timeout = std::chrono::seconds(5)) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  timeval tv{};
  tv.tv_sec = timeout.count() / 1000;
  tv.tv_usec = (timeout.count() % 1000) * 1000;
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  int rc;
  do {
    rc = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  } while (rc != 0 &&
           errno == EINTR);  // (a connect then continues in the kernel: EALREADY/EISCONN)
  if (rc != 0 && errno == EISCONN) rc = 0;
  if (rc != 0) {
    int e = errno;
    ::close(fd);
    errno = e;
    return -1;
  }
  return fd;
}

inline bool SendAll(int fd, std::string_view data) {
  while (!data.empty()) {
    ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;  // a signal to the test process (SIGCHLD of a child)
    if (n <= 0) return false;
    data.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

// Raises this process's open-file limit to at least `want` (up to the hard
// limit); returns the limit now in force.
inline rlim_t RaiseFdLimit(rlim_t want) {
  rlimit lim{};
  ::getrlimit(RLIMIT_NOFILE, &lim);
  if (lim.rlim_cur < want) {
    lim.rlim_cur = std::min(want, lim.rlim_max);
    ::setrlimit(RLIMIT_NOFILE, &lim);
    ::getrlimit(RLIMIT_NOFILE, &lim);
  }
  return lim.rlim_cur;
}

struct Response {
  int status = 0;
  std::map<std::string, std::string> headers;  // names lower-cased
  std::string body;                            // de-chunked
  std::vector<std::string> chunks;             // chunked responses: each chunk
  bool chunked = false;

  std::string Header(const std::string& lower_name) const {
    auto it = headers.find(lower_name);
    return it == headers.end() ? "" : it->second;
  }
};

class Client {
 public:
  explicit Client(int fd) : fd_(fd) {}
  explicit Client(int port, bool /*connect*/) : fd_(Connect(port)) {}
  ~Client() { Close(); }
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  int fd() const { return fd_; }
  bool ok() const { return fd_ >= 0; }
  void Close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  bool Send(std::string_view data) { return SendAll(fd_, data); }

  // Reads one response. Returns nullopt on EOF, timeout or a malformed response.
  // `on_chunk` (optional) sees each chunk of a chunked body as it arrives.
  std::optional<Response> Read(const std::function<void(const std::string&)>& on_chunk = {}) {
    Response r;
    size_t end;
    while ((end = buf_.find("\r\n\r\n")) == std::string::npos) {
      if (!Fill()) return std::nullopt;
    }
    std::string head = buf_.substr(0, end);
    buf_.erase(0, end + 4);
    size_t eol = head.find("\r\n");
    std::string status_line = head.substr(0, eol);
    if (status_line.rfind("HTTP/1.", 0) != 0 || status_line.size() < 12) return std::nullopt;
    r.status = std::atoi(status_line.c_str() + 9);
    size_t pos = eol == std::string::npos ? head.size() : eol + 2;
    while (pos < head.size()) {
      size_t next = head.find("\r\n", pos);
      if (next == std::string::npos) next = head.size();
      std::string line = head.substr(pos, next - pos);
      size_t colon = line.find(':');
      if (colon == std::string::npos) return std::nullopt;
      std::string name = line.substr(0, colon);
      std::transform(name.begin(), name.end(), name.begin(), ::tolower);
      size_t v = line.find_first_not_of(' ', colon + 1);
      r.headers[name] = v == std::string::npos ? "" : line.substr(v);
      pos = next + 2;
    }
    if (r.status < 200 || r.status == 204 || r.status == 304 || head_request_) return r;
    if (r.Header("transfer-encoding") == "chunked") {
      r.chunked = true;
      for (;;) {
        size_t le;
        while ((le = buf_.find("\r\n")) == std::string::npos) {
          if (!Fill()) return std::nullopt;
        }
        size_t size = std::stoul(buf_.substr(0, le), nullptr, 16);
        buf_.erase(0, le + 2);
        if (!Need(size + 2)) return std::nullopt;
        if (buf_.compare(size, 2, "\r\n") != 0) return std::nullopt;
        if (size == 0) {
          buf_.erase(0, 2);
          return r;
        }
        std::string chunk = buf_.substr(0, size);
        buf_.erase(0, size + 2);
        if (on_chunk) on_chunk(chunk);
        r.body += chunk;
        r.chunks.push_back(std::move(chunk));
      }
    }
    std::string cl = r.Header("content-length");
    if (!cl.empty()) {
      size_t n = std::stoul(cl);
      if (!Need(n)) return std::nullopt;
      r.body = buf_.substr(0, n);
      buf_.erase(0, n);
      return r;
    }
    while (Fill()) {
    }
    r.body = std::move(buf_);
    buf_.clear();
    return r;
  }

  // Reads until the peer closes: true on EOF or reset, false on timeout.
  bool WaitClosed() {
    for (;;) {
      char tmp[4096];
      ssize_t n = ::recv(fd_, tmp, sizeof tmp, 0);
      if (n < 0 && errno == EINTR) continue;
      if (n == 0) return true;
      if (n < 0) return errno == ECONNRESET || errno == EPIPE;
    }
  }

  void set_head_request(bool v) { head_request_ = v; }

 private:
  bool Fill() {
    char tmp[16384];
    ssize_t n;
    do {
      n = ::recv(fd_, tmp, sizeof tmp, 0);
    } while (n < 0 && errno == EINTR);  // a signal to the test process (SIGCHLD of a child)
    if (n <= 0) return false;
    buf_.append(tmp, static_cast<size_t>(n));
    return true;
  }
  bool Need(size_t n) {
    while (buf_.size() < n) {
      if (!Fill()) return false;
    }
    return true;
  }

  int fd_;
  std::string buf_;
  bool head_request_ = false;
};

// "GET /path HTTP/1.1" with Host and the given extra header lines.
inline std::string Get(std::string_view path, std::string_view extra = "") {
  return "GET " + std::string(path) + " HTTP/1.1\r\nHost: test\r\n" + std::string(extra) + "\r\n";
}

inline std::string Post(std::string_view path, std::string_view body, std::string_view extra = "") {
  return "POST " + std::string(path) +
         " HTTP/1.1\r\nHost: test\r\nContent-Length: " + std::to_string(body.size()) + "\r\n" +
         std::string(extra) + "\r\n" + std::string(body);
}

// Polls `cond` until true or `timeout`; returns its last value.
template <typename F>
bool Eventually(F cond, std::chrono::milliseconds timeout = std::chrono::seconds(5)) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!cond()) {
    if (std::chrono::steady_clock::now() > deadline) return cond();
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

}  // namespace strata::http_test
