// Status and StatusOr<T>: how errors cross module boundaries in Strata.
//
// A Status is OK or carries a code and a message. Messages say what failed,
// where (file, tensor, flag, field), and what to do about it; callers add
// context with Status::Annotate() rather than replacing the message.
// Both types are plain values: copyable, movable, thread-compatible.
#pragma once

#include <cassert>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace strata {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,   // the caller's input is wrong (a flag, a request field)
  kNotFound,          // a file, tensor or key does not exist
  kDataLoss,          // a file exists but is corrupt or truncated
  kUnimplemented,     // valid input we do not support (yet)
  kFailedPrecondition,
  kResourceExhausted,  // out of memory, pages, queue slots
  kUnavailable,        // try again later (overload, draining)
  kInternal,           // a bug in Strata
  kAborted,            // cancelled by the client or a deadline
  kIoError,            // the OS said no
};

const char* StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }
  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "INVALID_ARGUMENT: message" or "OK".
  std::string ToString() const;
  // Prefixes context: Annotate("loading model.safetensors") gives
  // "loading model.safetensors: <old message>". No-op on OK.
  Status Annotate(std::string_view context) const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status OkStatus() { return Status(); }
Status InvalidArgument(std::string msg);
Status NotFound(std::string msg);
Status DataLoss(std::string msg);
Status Unimplemented(std::string msg);
Status FailedPrecondition(std::string msg);
Status ResourceExhausted(std::string msg);
Status Unavailable(std::string msg);
Status Internal(std::string msg);
Status Aborted(std::string msg);
Status IoError(std::string msg);  // appends strerror(errno) when errno != 0

// Holds either a T or a non-OK Status.
template <typename T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(const Status& s) : v_(s) { assert(!s.ok() && "StatusOr from OK status"); }
  StatusOr(Status&& s) : v_(std::move(s)) { assert(!std::get<Status>(v_).ok()); }
  StatusOr(const T& v) : v_(v) {}
  StatusOr(T&& v) : v_(std::move(v)) {}
  template <typename U,
            typename = std::enable_if_t<std::is_convertible_v<U&&, T> &&
                                        !std::is_same_v<std::decay_t<U>, Status> &&
                                        !std::is_same_v<std::decay_t<U>, StatusOr<T>>>>
  StatusOr(U&& v) : v_(T(std::forward<U>(v))) {}

  bool ok() const { return std::holds_alternative<T>(v_); }
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<Status>(v_);
  }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  std::variant<Status, T> v_;
};

}  // namespace strata

#define STRATA_CONCAT_INNER(a, b) a##b
#define STRATA_CONCAT(a, b) STRATA_CONCAT_INNER(a, b)

// Returns from the enclosing function if `expr` (a Status) is not OK.
#define RETURN_IF_ERROR(expr)                          \
  do {                                                 \
    ::strata::Status _st = (expr);                     \
    if (!_st.ok()) return _st;                         \
  } while (0)

// ASSIGN_OR_RETURN(auto x, FunctionReturningStatusOr());
#define ASSIGN_OR_RETURN(lhs, expr) \
  ASSIGN_OR_RETURN_IMPL(STRATA_CONCAT(_statusor_, __LINE__), lhs, expr)
#define ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                          \
  if (!tmp.ok()) return tmp.status();         \
  lhs = std::move(tmp).value()
