#include "router/request_body.h"

#include <cstdio>

namespace strata::router {

StatusOr<ojson> ParseBodyObject(std::string_view body) {
  ojson j = ojson::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded())
    return InvalidArgument(
        "the request body is not valid JSON (the router adds the PD fields to "
        "it, so it must parse): send a JSON object");
  if (!j.is_object()) return InvalidArgument("the request body must be a JSON object");
  return j;
}

std::string PromptText(const ojson& body) {
  if (auto it = body.find("messages"); it != body.end()) return it->dump();
  if (auto it = body.find("input"); it != body.end()) {  // /v1/responses
    std::string text;
    if (auto ins = body.find("instructions"); ins != body.end() && ins->is_string())
      text = ins->get<std::string>();
    return text + (it->is_string() ? it->get<std::string>() : it->dump());
  }
  auto it = body.find("prompt");
  if (it == body.end()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (it->is_array() && !it->empty() && (*it)[0].is_string()) return (*it)[0].get<std::string>();
  return it->dump();
}

std::string WithBootstrapFields(ojson body, std::string_view host, int port, uint64_t room) {
  body["bootstrap_host"] = host;
  body["bootstrap_port"] = port;
  body["bootstrap_room"] = room;
  return body.dump(-1, ' ', false, ojson::error_handler_t::replace);
}

std::string ReferencedResponseId(std::string_view method, std::string_view target,
                                 const ojson* body) {
  constexpr std::string_view kPath = "/v1/responses";
  if (target.substr(0, kPath.size()) != kPath) return "";
  std::string_view rest = target.substr(kPath.size());
  if (method == "POST" && (rest.empty() || rest[0] == '?')) {
    if (body == nullptr) return "";
    auto it = body->find("previous_response_id");
    return it != body->end() && it->is_string() ? it->get<std::string>() : "";
  }
  if (rest.size() < 2 || rest[0] != '/') return "";
  rest.remove_prefix(1);
  return std::string(rest.substr(0, rest.find_first_of("/?")));
}

uint64_t DrawRoom(std::mt19937_64& rng) {
  return std::uniform_int_distribution<uint64_t>(0, kRoomLimit - 1)(rng);
}

std::string MakeRequestId(std::string_view client_id, std::mt19937_64& rng) {
  bool usable = !client_id.empty() && client_id.size() <= 128;
  for (char c : client_id) usable = usable && c > ' ' && c < 127;
  if (usable) return std::string(client_id);
  char buf[24];
  std::snprintf(buf, sizeof buf, "rtr-%016llx", static_cast<unsigned long long>(rng()));
  return buf;
}

}  // namespace strata::router
