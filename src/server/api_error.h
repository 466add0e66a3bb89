// The OpenAI error object and ApiOr<T>: how every part of the server says
// "this request fails, with this HTTP status, type, param and code".
//
// Thread-safety: plain values and pure functions.
#pragma once

#include <string>
#include <utility>
#include <variant>

#include "util/status.h"

namespace strata {

// The OpenAI error object: the server sends
// {"error": {"message", "type", "param", "code"}} with http_status
// (ErrorJson() in openai_response.h builds it).
struct ApiError {
  int http_status = 400;
  std::string type = "invalid_request_error";
  std::string message;
  std::string param;  // "" is sent as null
  std::string code;   // "" is sent as null
};

// 400 invalid_request_error for `param` ("" for the whole body).
ApiError InvalidRequestError(std::string param, std::string message);
// 503 "overloaded", e.g. code "max_queued_requests" when the queue is full.
ApiError OverloadedError(std::string message, std::string code);
// 404 for a `model` this server does not serve (OpenAI's "model_not_found").
ApiError ModelNotFoundError(const std::string& model);
// A Status from elsewhere in the server, as the HTTP error a client sees:
// InvalidArgument 400, NotFound 404, ResourceExhausted/Unavailable 503
// overloaded, Unimplemented 501, Aborted 499 (client gone), else 500
// server_error.
ApiError ApiErrorFromStatus(const Status& status);

// A value or the ApiError that explains why there is none.
template <typename T>
class ApiOr {
 public:
  ApiOr(T value) : v_(std::move(value)) {}
  ApiOr(ApiError error) : v_(std::move(error)) {}
  bool ok() const { return std::holds_alternative<T>(v_); }
  // REQUIRES: ok().
  const T& value() const& { return std::get<T>(v_); }
  T& value() & { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  // REQUIRES: !ok().
  const ApiError& error() const { return std::get<ApiError>(v_); }

 private:
  std::variant<T, ApiError> v_;
};

}  // namespace strata
