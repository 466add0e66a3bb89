// End-to-end tests of structured outputs through the real binary on the
// demo model (random weights: the text is gibberish), where every
// constrained answer must still parse and validate: response_format
// json_schema / json_object, guided_regex / guided_choice / guided_grammar
// and structured_outputs, greedy and sampled, streamed and not, batched with
// unconstrained requests (whose greedy output must not change). Also the
// 400s naming unsupported keywords, logit_bias and min_tokens.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <regex>
#include <thread>

#include "cli/serve_test_process.h"
#include "server/http_test_client.h"

namespace {

using namespace strata::http_test;
using ::testing::HasSubstr;
using json = nlohmann::json;
// Generous: a loaded 2-core machine takes seconds; a hang takes forever.
constexpr std::chrono::seconds kTimeout{120};

// The schema the json_schema cases use, and its check (every keyword the
// compiler supports that a validator can see here).
const json kPerson = json::parse(R"({
  "type": "object",
  "properties": {
    "name": {"type": "string", "maxLength": 12},
    "age": {"type": "integer", "minimum": 0, "maximum": 130},
    "email": {"type": "string", "format": "email"},
    "role": {"enum": ["admin", "user", "guest"]},
    "scores": {"type": "array", "items": {"type": "number"}, "minItems": 1, "maxItems": 3},
    "address": {"type": "object",
                "properties": {"city": {"type": "string"}, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                "required": ["city", "zip"], "additionalProperties": false},
    "nick": {"anyOf": [{"type": "string", "maxLength": 4}, {"type": "null"}]},
    "active": {"type": "boolean"}
  },
  "required": ["name", "age", "role", "scores", "address", "nick", "active"],
  "additionalProperties": false
})");

void ExpectPerson(const std::string& text) {
  SCOPED_TRACE(text);
  const json j = json::parse(text, nullptr, false);
  ASSERT_TRUE(j.is_object());
  for (const auto& [k, v] : j.items())
    EXPECT_TRUE(kPerson["properties"].contains(k)) << "extra property " << k;
  for (const auto& r : kPerson["required"]) EXPECT_TRUE(j.contains(r.get<std::string>())) << r;
  EXPECT_TRUE(j["name"].is_string());
  EXPECT_LE(j["name"].get<std::string>().size(), 12u * 4);  // code points, up to 4 bytes each
  EXPECT_TRUE(j["age"].is_number_integer() && j["age"] >= 0 && j["age"] <= 130);
  if (j.contains("email"))
    EXPECT_TRUE(
        std::regex_match(j["email"].get<std::string>(), std::regex(R"([^@]+@[^@]+\.[a-z]+)")));
  EXPECT_THAT(j["role"].get<std::string>(), ::testing::AnyOf("admin", "user", "guest"));
  ASSERT_TRUE(j["scores"].is_array());
  EXPECT_GE(j["scores"].size(), 1u);
  EXPECT_LE(j["scores"].size(), 3u);
  for (const json& x : j["scores"]) EXPECT_TRUE(x.is_number());
  EXPECT_TRUE(j["address"]["city"].is_string());
  EXPECT_TRUE(std::regex_match(j["address"]["zip"].get<std::string>(), std::regex("[0-9]{5}")));
  EXPECT_EQ(j["address"].size(), 2u);
  EXPECT_TRUE(j["nick"].is_null() || j["nick"].is_string());
  EXPECT_TRUE(j["active"].is_boolean());
}

// Content of a response, streamed (SSE deltas joined) or not.
std::string ContentOf(const Response& r, bool chat, bool stream, std::string* finish = nullptr) {
  if (!stream) {
    const json j = json::parse(r.body);
    const json& c = j["choices"][0];
    if (finish) *finish = c["finish_reason"];
    return chat ? c["message"]["content"].get<std::string>() : c["text"].get<std::string>();
  }
  std::string out;
  size_t pos = 0;
  while ((pos = r.body.find("data: ", pos)) != std::string::npos) {
    const size_t end = r.body.find("\n\n", pos);
    const std::string data = r.body.substr(pos + 6, end - pos - 6);
    pos = end;
    if (data == "[DONE]") break;
    const json ev = json::parse(data);
    for (const json& ch : ev["choices"]) {
      const json& piece = chat ? ch["delta"]["content"] : ch["text"];
      if (piece.is_string()) out += piece.get<std::string>();
      if (finish && ch["finish_reason"].is_string()) *finish = ch["finish_reason"];
    }
  }
  return out;
}

json Chat(json extra) {
  json body = {{"model", "m"},
               {"messages", {{{"role", "user"}, {"content", "Describe a person."}}}},
               {"max_tokens", 300}};
  if (extra.is_object()) body.update(extra);
  return body;
}

class StructuredOutputE2E : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    server_ = new Server({"--served-model-name", "m", "--max-running-requests", "8"});
    ASSERT_GT(server_->port(), 0) << server_->Log();
  }
  static void TearDownTestSuite() { delete server_; }
  static Server* server_;
};
Server* StructuredOutputE2E::server_ = nullptr;

TEST_F(StructuredOutputE2E, JsonSchemaValidatesGreedyAndSampledStreamedAndNot) {
  for (const float temperature : {0.f, 1.f}) {
    for (const bool stream : {false, true}) {
      for (int seed = 0; seed < (temperature > 0 ? 3 : 1); ++seed) {
        SCOPED_TRACE("temperature " + std::to_string(temperature) + (stream ? " stream" : "") +
                     " seed " + std::to_string(seed));
        const json body = Chat(
            {{"temperature", temperature},
             {"seed", seed},
             {"stream", stream},
             {"response_format",
              {{"type", "json_schema"},
               {"json_schema", {{"name", "person"}, {"strict", true}, {"schema", kPerson}}}}}});
        Response r = server_->PostJson("/v1/chat/completions", body.dump(), "", kTimeout);
        ASSERT_EQ(r.status, 200) << r.body;
        std::string finish;
        ExpectPerson(ContentOf(r, true, stream, &finish));
        EXPECT_EQ(finish, "stop");  // ended with EOS inside max_tokens
      }
    }
  }
}

TEST_F(StructuredOutputE2E, EveryKindOfConstraintHolds) {
  struct Case {
    const char* name;
    json field;
    std::function<bool(const std::string&)> valid;
  };
  const std::regex email(R"([a-z]+[0-9]?@[a-z]+\.(com|org))");
  const std::regex arith(R"(\(?[0-9]+([+*-]\(?[0-9]+\)?)*\)?)");
  const std::vector<Case> cases = {
      {"json_object",
       {{"response_format", {{"type", "json_object"}}}},
       [](const std::string& t) { return json::parse(t, nullptr, false).is_object(); }},
      {"guided_json",
       {{"guided_json", {{"type", "array"}, {"items", {{"type", "integer"}}}, {"maxItems", 4}}}},
       [](const std::string& t) {
         const json j = json::parse(t, nullptr, false);
         if (!j.is_array() || j.size() > 4) return false;
         for (const json& x : j)
           if (!x.is_number_integer()) return false;
         return true;
       }},
      {"guided_regex",
       {{"guided_regex", R"([a-z]+[0-9]?@[a-z]+\.(com|org))"}},
       [&](const std::string& t) { return std::regex_match(t, email); }},
      {"guided_choice",
       {{"guided_choice", {"sunny", "rainy", "foggy"}}},
       [](const std::string& t) { return t == "sunny" || t == "rainy" || t == "foggy"; }},
      {"guided_grammar",
       {{"guided_grammar", "root ::= term ([+*-] term)*\nterm ::= [0-9]+ | \"(\" [0-9]+ \")\""}},
       [&](const std::string& t) { return std::regex_match(t, arith); }},
      {"structured_outputs",
       {{"structured_outputs", {{"choice", {"yes", "no"}}}}},
       [](const std::string& t) { return t == "yes" || t == "no"; }},
      {"llama.cpp json_schema",
       {{"json_schema", {{"type", "boolean"}}}},
       [](const std::string& t) { return t == "true" || t == "false"; }},
  };
  for (const Case& c : cases) {
    for (const bool chat : {true, false}) {
      for (const float temperature : {0.f, 1.f}) {
        for (const bool stream : {false, true}) {
          SCOPED_TRACE(std::string(c.name) + (chat ? " chat" : " completion") + " temperature " +
                       std::to_string(temperature) + (stream ? " stream" : ""));
          json body = chat ? Chat({})
                           : json{{"model", "m"}, {"prompt", "The answer:"}, {"max_tokens", 120}};
          body.update(c.field);
          body["temperature"] = temperature;
          body["seed"] = 11;
          body["stream"] = stream;
          Response r = server_->PostJson(chat ? "/v1/chat/completions" : "/v1/completions",
                                         body.dump(), "", kTimeout);
          ASSERT_EQ(r.status, 200) << r.body;
          std::string finish;
          const std::string text = ContentOf(r, chat, stream, &finish);
          EXPECT_TRUE(c.valid(text)) << text;
          EXPECT_EQ(finish, "stop") << text;
        }
      }
    }
  }
}

TEST_F(StructuredOutputE2E, BatchedWithUnconstrainedRequests) {
  const json plain = {
      {"model", "m"}, {"prompt", "Once upon a time"}, {"max_tokens", 40}, {"temperature", 0}};
  Response alone = server_->PostJson("/v1/completions", plain.dump(), "", kTimeout);
  ASSERT_EQ(alone.status, 200);
  const std::string expected = json::parse(alone.body)["choices"][0]["text"];
  std::vector<std::thread> threads;
  std::vector<Response> constrained(4), unconstrained(4);
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] {
      json body = Chat(
          {{"temperature", 0.7},
           {"seed", i},
           {"n", 2},
           {"response_format",
            {{"type", "json_schema"}, {"json_schema", {{"name", "p"}, {"schema", kPerson}}}}}});
      constrained[i] = server_->PostJson("/v1/chat/completions", body.dump(), "", kTimeout);
    });
    threads.emplace_back([&, i] {
      unconstrained[i] = server_->PostJson("/v1/completions", plain.dump(), "", kTimeout);
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < 4; ++i) {
    ASSERT_EQ(constrained[i].status, 200) << constrained[i].body;
    const json j = json::parse(constrained[i].body);
    ASSERT_EQ(j["choices"].size(), 2u);
    for (const json& c : j["choices"]) ExpectPerson(c["message"]["content"]);
    ASSERT_EQ(unconstrained[i].status, 200);
    EXPECT_EQ(json::parse(unconstrained[i].body)["choices"][0]["text"], expected);
  }
}

TEST_F(StructuredOutputE2E, UnsupportedOrBadSpecsAre400sNamingTheProblem) {
  struct Case {
    json field;
    std::string param, message;
  };
  const std::vector<Case> cases = {
      {{{"response_format",
         {{"type", "json_schema"},
          {"json_schema", {{"name", "x"}, {"schema", {{"type", "integer"}, {"multipleOf", 3}}}}}}}},
       "response_format.json_schema.schema",
       "multipleOf"},
      {{{"guided_json",
         {{"type", "object"},
          {"properties", {{"a", {{"type", "string"}, {"format", "hostname"}}}}}}}},
       "guided_json",
       "properties.a.format"},
      {{{"guided_regex", "(?=x)y"}}, "guided_regex", "not supported"},
      {{{"guided_grammar", "root ::= missing"}},
       "guided_grammar",
       "'missing' is used but not defined"},
      {{{"guided_grammar", "root ::= root \"a\""}}, "guided_grammar", "never finish"},
      {{{"response_format", {{"type", "json_object"}}}, {"guided_regex", "a"}},
       "guided_regex",
       "both ask"},
  };
  for (const Case& c : cases) {
    json body = Chat(c.field);
    Response r = server_->PostJson("/v1/chat/completions", body.dump(), "", kTimeout);
    EXPECT_EQ(r.status, 400) << r.body;
    const json j = json::parse(r.body);
    EXPECT_EQ(j["error"]["param"], c.param) << r.body;
    EXPECT_THAT(j["error"]["message"].get<std::string>(), HasSubstr(c.message));
  }
}

// Greedy completion token ids of `body` (return_token_ids).
std::vector<int> TokenIds(Server& s, json body) {
  body["return_token_ids"] = true;
  Response r = s.PostJson("/v1/completions", body.dump(), "", kTimeout);
  EXPECT_EQ(r.status, 200) << r.body;
  return json::parse(r.body)["choices"][0]["token_ids"].get<std::vector<int>>();
}

TEST_F(StructuredOutputE2E, LogitBiasAndMinTokens) {
  const json base = {
      {"model", "m"}, {"prompt", "The lighthouse"}, {"max_tokens", 8}, {"temperature", 0}};
  const std::vector<int> greedy = TokenIds(*server_, base);
  ASSERT_EQ(greedy.size(), 8u);
  // +100 makes a token the argmax; -100 removes the greedy one.
  json up = base;
  up["logit_bias"] = {{"77", 100}};
  EXPECT_EQ(TokenIds(*server_, up)[0], 77);
  json down = base;
  down["logit_bias"] = {{std::to_string(greedy[0]), -100}};
  EXPECT_NE(TokenIds(*server_, down)[0], greedy[0]);
  // The greedy first token as a stop token ends the output at once; with
  // min_tokens 3 it cannot come before the fourth token.
  json stop = base;
  stop["stop_token_ids"] = {greedy[0]};
  EXPECT_EQ(TokenIds(*server_, stop).size(), 1u);
  stop["min_tokens"] = 3;
  const std::vector<int> held = TokenIds(*server_, stop);
  ASSERT_GE(held.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_NE(held[i], greedy[0]) << i;
  json bad = base;
  bad["min_tokens"] = 9;  // above max_tokens
  Response r = server_->PostJson("/v1/completions", bad.dump(), "", kTimeout);
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_THAT(r.body, HasSubstr("min_tokens"));
}

}  // namespace
