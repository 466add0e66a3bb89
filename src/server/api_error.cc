#include "server/api_error.h"

namespace strata {

ApiError InvalidRequestError(std::string param, std::string message) {
  ApiError e;
  e.message = std::move(message);
  e.param = std::move(param);
  return e;
}

ApiError OverloadedError(std::string message, std::string code) {
  ApiError e;
  e.http_status = 503;
  e.type = "overloaded";
  e.message = std::move(message);
  e.code = std::move(code);
  return e;
}

ApiError ModelNotFoundError(const std::string& model) {
  ApiError e;
  e.http_status = 404;
  e.message = "The model `" + model + "` does not exist.";
  e.param = "model";
  e.code = "model_not_found";
  return e;
}

ApiError ApiErrorFromStatus(const Status& status) {
  ApiError e;
  e.message = status.message();
  switch (status.code()) {
    case StatusCode::kOk:  // not an error; callers should not ask
    case StatusCode::kInternal:
    case StatusCode::kDataLoss:
    case StatusCode::kIoError:
    case StatusCode::kFailedPrecondition:
      e.http_status = 500;
      e.type = "server_error";
      break;
    case StatusCode::kInvalidArgument:
      break;
    case StatusCode::kNotFound:
      e.http_status = 404;
      break;
    case StatusCode::kUnimplemented:
      e.http_status = 501;
      break;
    case StatusCode::kResourceExhausted:
    case StatusCode::kUnavailable:
      e.http_status = 503;
      e.type = "overloaded";
      break;
    case StatusCode::kAborted:
      e.http_status = 499;  // nginx's "client closed request"
      e.type = "aborted";
      break;
  }
  return e;
}

}  // namespace strata
