#include "server/json_body.h"

#include <string>

namespace strata {
namespace {

using Json = nlohmann::ordered_json;

// nesting depth and keeps the parse error instead of throwing it.

class BoundedDomParser {
 public:
  BoundedDomParser(Json& root, int max_depth)
      : dom_(root, /*allow_exceptions=*/false), max_depth_(max_depth) {}

  bool null() { return dom_.null(); }
  bool boolean(bool v) { return dom_.boolean(v); }
  bool number_integer(Json::number_integer_t v) { return dom_.number_integer(v); }
  bool number_unsigned(Json::number_unsigned_t v) { return dom_.number_unsigned(v); }
  bool number_float(Json::number_float_t v, const Json::string_t& s) {
    return dom_.number_float(v, s);
  }
  bool string(Json::string_t& v) { return dom_.string(v); }
  bool binary(Json::binary_t& v) { return dom_.binary(v); }
  bool key(Json::string_t& k) { return dom_.key(k); }
  bool start_object(std::size_t n) { return Enter() && dom_.start_object(n); }
  bool end_object() {
    --depth_;
    return dom_.end_object();
  }
  bool start_array(std::size_t n) { return Enter() && dom_.start_array(n); }
  bool end_array() {
    --depth_;
    return dom_.end_array();
  }
  bool parse_error(std::size_t /*position*/, const std::string& /*last_token*/,
                   const nlohmann::detail::exception& ex) {
    error_ = ex.what();
    // "[json.exception.parse_error.101] parse error at line 1, column 2: ..."
    if (size_t p = error_.find("] ");
        error_.rfind("[json.exception.", 0) == 0 && p != std::string::npos) {
      error_.erase(0, p + 2);
    }
    // "last read: '<token>'" can quote a huge token; keep messages short.
    if (error_.size() > 160) error_ = error_.substr(0, 157) + "...";
    return false;
  }

  const std::string& error() const { return error_; }

 private:
  bool Enter() {
    if (++depth_ > max_depth_) {
      error_ = "nested deeper than " + std::to_string(max_depth_) + " levels";
      return false;
    }
    return true;
  }

  nlohmann::detail::json_sax_dom_parser<Json> dom_;
  int max_depth_;
  int depth_ = 0;
  std::string error_;
};

}  // namespace

ApiOr<nlohmann::ordered_json> ParseJsonBody(std::string_view body, int max_depth) {
  Json root;
  BoundedDomParser sax(root, max_depth);
  bool ok = Json::sax_parse(body.begin(), body.end(), &sax, nlohmann::detail::input_format_t::json,
                            /*strict=*/true);
  if (!ok || !sax.error().empty()) {
    return InvalidRequestError(
        "", "invalid JSON: " + (sax.error().empty() ? std::string("parse error") : sax.error()));
  }
  return root;
}

}  // namespace strata
