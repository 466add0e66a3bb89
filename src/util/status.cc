#include "util/status.h"

#include <cerrno>
#include <cstring>

namespace strata {

const char* StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "OK";
    case StatusCode::kInvalidArgument: return "INVALID_ARGUMENT";
    case StatusCode::kNotFound: return "NOT_FOUND";
    case StatusCode::kDataLoss: return "DATA_LOSS";
    case StatusCode::kUnimplemented: return "UNIMPLEMENTED";
    case StatusCode::kFailedPrecondition: return "FAILED_PRECONDITION";
    case StatusCode::kResourceExhausted: return "RESOURCE_EXHAUSTED";
    case StatusCode::kUnavailable: return "UNAVAILABLE";
    case StatusCode::kInternal: return "INTERNAL";
    case StatusCode::kAborted: return "ABORTED";
    case StatusCode::kIoError: return "IO_ERROR";
  }
  return "UNKNOWN";
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  return std::string(StatusCodeName(code_)) + ": " + message_;
}

Status Status::Annotate(std::string_view context) const {
  if (ok()) return *this;
  return Status(code_, std::string(context) + ": " + message_);
}

Status InvalidArgument(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
Status NotFound(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
Status DataLoss(std::string m) { return {StatusCode::kDataLoss, std::move(m)}; }
Status Unimplemented(std::string m) { return {StatusCode::kUnimplemented, std::move(m)}; }
Status FailedPrecondition(std::string m) {
  return {StatusCode::kFailedPrecondition, std::move(m)};
}
Status ResourceExhausted(std::string m) { return {StatusCode::kResourceExhausted, std::move(m)}; }
Status Unavailable(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }
Status Internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }
Status Aborted(std::string m) { return {StatusCode::kAborted, std::move(m)}; }
Status IoError(std::string m) {
  int e = errno;
  if (e != 0) m += std::string(" (") + std::strerror(e) + ")";
  return {StatusCode::kIoError, std::move(m)};
}

}  // namespace strata
