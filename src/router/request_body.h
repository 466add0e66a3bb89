// What the router reads from and writes into a request body: the text the
// cache_aware policy hashes, the three PD fields of docs/architecture/disagg.md
// (bootstrap_host, bootstrap_port, bootstrap_room), the room id and the
// request id. The router forwards bodies as they came otherwise; it parses
// one only when the policy needs its prompt or PD mode needs the fields.
//
// Thread-safety: pure functions (DrawRoom and MakeRequestId use the caller's
// generator).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <string_view>

#include "util/status.h"

namespace strata::router {

using ojson = nlohmann::ordered_json;  // keeps the client's key order when rewritten

// The body as a JSON object; InvalidArgument (saying what is wrong) otherwise.
StatusOr<ojson> ParseBodyObject(std::string_view body);

// The prompt as text for prefix affinity: "prompt" (a string; the first of an
// array of strings; token ids as their JSON text) for completions, the
// "messages" array as compact JSON for chat, "instructions" then "input" (a
// string, or items as compact JSON) for /v1/responses; "" when the body has
// none of them.
std::string PromptText(const ojson& body);

// Sets bootstrap_host, bootstrap_port and bootstrap_room (replacing any the
// client sent: the router's are the ones the roles must agree on) and returns
// the body to send to both roles.
std::string WithBootstrapFields(ojson body, std::string_view host, int port, uint64_t room);

// The stored response a request refers to: previous_response_id of a POST
// /v1/responses (body: the parsed body, or null), the {id} of GET / DELETE
// /v1/responses/{id}[/input_items]; "" for anything else. The router sends
// it to the worker whose instance made that id (server/openai_responses.h
// ResponseIdInstance): each worker's response store is its own.
std::string ReferencedResponseId(std::string_view method, std::string_view target,
                                 const ojson* body);

// Rooms are below 2^53 so JSON numbers stay exact, with room to spare for the
// n consecutive rooms R..R+n-1 of a request with n choices.
inline constexpr uint64_t kRoomLimit = (uint64_t{1} << 53) - (uint64_t{1} << 16);
uint64_t DrawRoom(std::mt19937_64& rng);

// The client's X-Request-Id when it is usable (1..128 printable ASCII
// characters, no spaces), else a new "rtr-" + 16 hex digits.
std::string MakeRequestId(std::string_view client_id, std::mt19937_64& rng);

}  // namespace strata::router
