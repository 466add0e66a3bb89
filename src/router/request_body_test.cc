#include "router/request_body.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <set>

namespace strata::router {
namespace {

using ::testing::HasSubstr;

TEST(RequestBodyTest, BootstrapFieldsAreAddedAndEverythingElseKeptInOrder) {
  auto body = ParseBodyObject(
      R"({"model":"m","prompt":"hi","temperature":0.7,"max_tokens":5,"bootstrap_room":1})");
  ASSERT_TRUE(body.ok());
  const std::string out = WithBootstrapFields(*body, "10.0.0.7", 8998, (uint64_t{1} << 53) - 1);
  EXPECT_EQ(out, R"({"model":"m","prompt":"hi","temperature":0.7,"max_tokens":5,"bootstrap_room":)"
                 R"(9007199254740991,"bootstrap_host":"10.0.0.7","bootstrap_port":8998})");
  auto back = nlohmann::json::parse(out);
  EXPECT_EQ(back["bootstrap_room"].get<uint64_t>(), (uint64_t{1} << 53) - 1);
  EXPECT_EQ(back["temperature"].get<double>(), 0.7);
}

TEST(RequestBodyTest, NonObjectsAreRefusedWithAReason) {
  EXPECT_THAT(ParseBodyObject("{oops").status().message(), HasSubstr("not valid JSON"));
  EXPECT_THAT(ParseBodyObject("[1,2]").status().message(), HasSubstr("JSON object"));
}

TEST(RequestBodyTest, PromptTextForCompletionsAndChat) {
  EXPECT_EQ(PromptText(*ParseBodyObject(R"({"prompt":"The fox"})")), "The fox");
  EXPECT_EQ(PromptText(*ParseBodyObject(R"({"prompt":["a","b"]})")), "a");
  EXPECT_EQ(PromptText(*ParseBodyObject(R"({"prompt":[1,2,3]})")), "[1,2,3]");
  const std::string chat =
      PromptText(*ParseBodyObject(R"({"messages":[{"role":"user","content":"Hi"}],"model":"m"})"));
  EXPECT_EQ(chat, R"([{"role":"user","content":"Hi"}])");
  // A conversation that grows keeps its earlier text as a prefix (mostly: the
  // closing bracket moves), so its turns land on the same worker.
  const std::string longer = PromptText(*ParseBodyObject(
      R"({"messages":[{"role":"user","content":"Hi"},{"role":"assistant","content":"Yo"}]})"));
  EXPECT_EQ(longer.substr(0, chat.size() - 1), chat.substr(0, chat.size() - 1));
  EXPECT_EQ(PromptText(*ParseBodyObject(R"({"model":"m"})")), "");
}

TEST(RequestBodyTest, PromptTextForResponses) {
  EXPECT_EQ(PromptText(*ParseBodyObject(R"({"input":"Hi","instructions":"Be brief. "})")),
            "Be brief. Hi");
  EXPECT_EQ(PromptText(*ParseBodyObject(R"({"input":[{"role":"user","content":"Hi"}]})")),
            R"([{"role":"user","content":"Hi"}])");
}

TEST(RequestBodyTest, ReferencedResponseIdFromTheBodyOrThePath) {
  auto body = ParseBodyObject(R"({"input":"x","previous_response_id":"resp_abc"})");
  ASSERT_TRUE(body.ok());
  EXPECT_EQ(ReferencedResponseId("POST", "/v1/responses", &*body), "resp_abc");
  EXPECT_EQ(ReferencedResponseId("POST", "/v1/responses?x=1", &*body), "resp_abc");
  EXPECT_EQ(ReferencedResponseId("POST", "/v1/responses", nullptr), "");
  auto plain = ParseBodyObject(R"({"input":"x","previous_response_id":7})");
  EXPECT_EQ(ReferencedResponseId("POST", "/v1/responses", &*plain), "");
  EXPECT_EQ(ReferencedResponseId("GET", "/v1/responses/resp_1", nullptr), "resp_1");
  EXPECT_EQ(ReferencedResponseId("DELETE", "/v1/responses/resp_1", nullptr), "resp_1");
  EXPECT_EQ(ReferencedResponseId("GET", "/v1/responses/resp_1/input_items?limit=2", nullptr),
            "resp_1");
  EXPECT_EQ(ReferencedResponseId("GET", "/v1/responses/", nullptr), "");
  EXPECT_EQ(ReferencedResponseId("POST", "/v1/chat/completions", &*body), "");
  EXPECT_EQ(ReferencedResponseId("GET", "/v1/responsesX/resp_1", nullptr), "");
}

TEST(RequestBodyTest, RoomsAreBelowTheLimitAndVary) {
  std::mt19937_64 rng(7);
  std::set<uint64_t> seen;
  for (int i = 0; i < 1000; ++i) {
    const uint64_t r = DrawRoom(rng);
    EXPECT_LT(r, kRoomLimit);
    EXPECT_LT(r + 65535, uint64_t{1} << 53) << "n consecutive rooms stay exact in JSON";
    seen.insert(r);
  }
  EXPECT_EQ(seen.size(), 1000u);
}

TEST(RequestBodyTest, RequestIdsAreTheClientsWhenUsable) {
  std::mt19937_64 rng(1);
  EXPECT_EQ(MakeRequestId("abc-123", rng), "abc-123");
  const std::string made = MakeRequestId("", rng);
  EXPECT_EQ(made.substr(0, 4), "rtr-");
  EXPECT_EQ(made.size(), 20u);
  EXPECT_NE(MakeRequestId("has space", rng), "has space");
  EXPECT_NE(MakeRequestId(std::string(200, 'a'), rng), std::string(200, 'a'));
  EXPECT_NE(MakeRequestId("", rng), made);
}

}  // namespace
}  // namespace strata::router
