// Structured outputs and the sampler fields in the request parsers: every
// field that asks for constrained decoding becomes one ConstraintSpec, with
// the param its errors would name; forced tool calls, logit_bias, min_tokens.
#include "server/structured_output.h"

#include <gtest/gtest.h>

#include "server/openai_protocol_test_util.h"

namespace strata {
namespace {

using namespace protocol_test;  // NOLINT: test helpers

TEST(StructuredOutput, EveryFieldBecomesOneSpec) {
  using Kind = constrain::ConstraintSpec::Kind;
  struct Case {
    std::string extra;
    Kind kind;
    std::string text, param;
  };
  const std::vector<Case> cases = {
      {R"("response_format": {"type": "json_object"})", Kind::kJsonObject, "", "response_format"},
      {R"("response_format": {"type": "json_schema", "json_schema": {"name": "n", "strict": true,
          "schema": {"type": "integer"}}})",
       Kind::kJsonSchema, R"({"type":"integer"})", "response_format.json_schema.schema"},
      {R"("guided_json": "{\"type\": \"string\"}")", Kind::kJsonSchema, R"({"type":"string"})",
       "guided_json"},
      {R"("guided_regex": "a+")", Kind::kRegex, "a+", "guided_regex"},
      {R"("guided_choice": ["x", "y"])", Kind::kChoice, R"(["x","y"])", "guided_choice"},
      {R"("guided_grammar": "root ::= \"a\"")", Kind::kGrammar, R"(root ::= "a")",
       "guided_grammar"},
      {R"("structured_outputs": {"json": {"type": "null"}})", Kind::kJsonSchema,
       R"({"type":"null"})", "structured_outputs.json"},
      {R"("structured_outputs": {"json_object": true, "disable_any_whitespace": true})",
       Kind::kJsonObject, "", "structured_outputs.json_object"},
      {R"("json_schema": {"type": "boolean"})", Kind::kJsonSchema, R"({"type":"boolean"})",
       "json_schema"},
      {R"("grammar": "root ::= [a-z]")", Kind::kGrammar, "root ::= [a-z]", "grammar"},
  };
  for (const Case& c : cases) {
    ChatCompletionRequest r = Chat(ChatBody(c.extra));
    ASSERT_TRUE(r.structured.has_value()) << c.extra;
    EXPECT_EQ(r.structured->spec.kind, c.kind) << c.extra;
    EXPECT_EQ(r.structured->spec.text, c.text) << c.extra;
    EXPECT_EQ(r.structured->param, c.param) << c.extra;
  }
  EXPECT_FALSE(Chat(ChatBody(R"("response_format": {"type": "text"})")).structured.has_value());
  EXPECT_FALSE(Completion(CompletionBody("")).structured.has_value());
}

TEST(StructuredOutput, ToolChoiceLogitBiasMinTokens) {
  const std::string tools =
      R"("tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}])";
  ChatCompletionRequest r = Chat(ChatBody(tools + R"(, "tool_choice": "required")"));
  EXPECT_EQ(r.tool_choice, "required");
  r = Chat(ChatBody(tools + R"(, "tool_choice": {"type": "function", "function": {"name": "f"}})"));
  EXPECT_EQ(r.tool_choice, "function");
  EXPECT_EQ(r.tool_choice_function, "f");
  StructuredOutput so = ToolCallSpec(r.tools, "hermes", "f", true);
  EXPECT_EQ(so.spec.kind, constrain::ConstraintSpec::Kind::kToolCalls);
  EXPECT_EQ(
      so.spec.text,
      R"({"format":"hermes","tools":[{"name":"f","parameters":{"type":"object"}}],"parallel":false})");
  CompletionRequest c =
      Completion(CompletionBody(R"("logit_bias": {"7": -100, "3": 2.5}, "min_tokens": 4)"));
  EXPECT_EQ(c.sampling.min_tokens, 4);
  ASSERT_EQ(c.sampling.logit_bias.size(), 2u);
  EXPECT_EQ(c.sampling.logit_bias[0], (std::pair<int32_t, float>{7, -100.f}));
  EXPECT_EQ(c.sampling.logit_bias[1], (std::pair<int32_t, float>{3, 2.5f}));
  ProtocolLimits limits;
  limits.vocab_size = 5;
  ExpectCompletionError({CompletionBody(R"("logit_bias": {"7": 1})"), "logit_bias.7", "[0, 5)"},
                        limits);
}

}  // namespace
}  // namespace strata
