// Unit tests of the Jinja engine's pieces. End-to-end behaviour against
// transformers is in chat_template_test.cc (goldens); these pin the parts
// whose Python semantics are easy to get subtly wrong.
#include <gtest/gtest.h>

#include <ctime>

#include "model/jinja/jinja_interp.h"
#include "model/jinja/jinja_lexer.h"
#include "model/jinja/jinja_parser.h"
#include "model/jinja/jinja_value.h"

namespace strata::jinja {
namespace {

std::string Render(const std::string& src,
                   const nlohmann::ordered_json& vars = nlohmann::ordered_json::object()) {
  auto prog = ParseTemplate(src);
  EXPECT_TRUE(prog.ok()) << prog.status().ToString();
  if (!prog.ok()) return "<parse error>";
  Value ctx = Value::FromJson(vars);
  std::tm now{};
  Interpreter interp(**prog, ctx.as_dict(), now);
  try {
    return interp.Render();
  } catch (const RenderError& e) {
    return "<error: " + e.message + ">";
  }
}

TEST(JinjaValue, FloatReprMatchesPython) {
  EXPECT_EQ(PyFloatRepr(1.0), "1.0");
  EXPECT_EQ(PyFloatRepr(0.1), "0.1");
  EXPECT_EQ(PyFloatRepr(-0.0), "-0.0");
  EXPECT_EQ(PyFloatRepr(1e16), "1e+16");
  EXPECT_EQ(PyFloatRepr(1e15), "1000000000000000.0");
  EXPECT_EQ(PyFloatRepr(1.5e-7), "1.5e-07");
  EXPECT_EQ(PyFloatRepr(0.0001), "0.0001");
  EXPECT_EQ(PyFloatRepr(123456789.125), "123456789.125");
  EXPECT_EQ(PyFloatRepr(1.0 / 3), "0.3333333333333333");
}

TEST(JinjaValue, JsonDumpsLikePython) {
  Value v = Value::FromJson(
      nlohmann::ordered_json::parse(R"({"b": [1, 2.0, null, true], "a": {}, "é": "x\"\n"})"));
  Value none = Value::MakeNone();
  EXPECT_EQ(JsonDumps(v, false, none, none, false),
            R"({"b": [1, 2.0, null, true], "a": {}, "é": "x\"\n"})");
  EXPECT_EQ(JsonDumps(v, true, none, none, true),
            R"({"a": {}, "b": [1, 2.0, null, true], "\u00e9": "x\"\n"})");
  EXPECT_EQ(JsonDumps(v, false, Value(2), none, false),
            "{\n  \"b\": [\n    1,\n    2.0,\n    null,\n    true\n  ],\n  \"a\": {},\n  \"é\": "
            "\"x\\\"\\n\"\n}");
  EXPECT_EQ(JsonDumps(Value("🎉"), true, none, none, false), "\"\\ud83c\\udf89\"");
}

TEST(JinjaValue, ReprAndEquality) {
  Value v =
      Value::FromJson(nlohmann::ordered_json::parse(R"(["it's", "a\"b", 1, null, {"k": false}])"));
  EXPECT_EQ(v.Str(), R"(["it's", 'a"b', 1, None, {'k': False}])");
  EXPECT_TRUE(Value(1).Equals(Value(1.0)));
  EXPECT_TRUE(Value(true).Equals(Value(1)));
  EXPECT_FALSE(Value("1").Equals(Value(1)));
  EXPECT_FALSE(Value::MakeTuple({Value(1)}).Equals(Value(List{Value(1)})));
  EXPECT_EQ(Value::MakeTuple({Value(1)}).Repr(), "(1,)");
}

TEST(JinjaLexer, WhitespaceControl) {
  // trim_blocks eats one newline after %}, lstrip_blocks the indentation
  // before {%; '-' strips all whitespace, '+' keeps it; one trailing
  // newline of the source is dropped.
  EXPECT_EQ(Render("a\n  {% if true %}\n  b\n  {% endif %}\nc\n"), "a\n  b\nc");
  EXPECT_EQ(Render("a  {%- if true -%}  b  {%- endif -%}  c"), "abc");
  EXPECT_EQ(Render("a\n  {%+ if true %}b{% endif %}"), "a\n  b");
  EXPECT_EQ(Render("x {{ 1 }}\n{{- 2 }} {{ 3 -}}\n y"), "x 12 3y");
  EXPECT_EQ(Render("a\n  {# note #}\nb"), "a\nb");
  EXPECT_EQ(Render("{% raw %}{{ x }}{% endraw %}"), "{{ x }}");
  EXPECT_EQ(Render("a\r\nb\rc"), "a\nb\nc");
}

TEST(JinjaLexer, StringEscapes) {
  EXPECT_EQ(Render(R"({{ 'a\nb\t\x41\u00e9\\ \q' }})"), "a\nb\tAé\\ \\q");
  EXPECT_EQ(Render("{{ \"one \\\ntwo\" }}"), "one two");  // backslash-newline joins lines
  EXPECT_EQ(Render("{{ 'x' \"y\" }}"), "xy");
}

TEST(JinjaParser, ErrorsNameTheLineAndConstruct) {
  auto p = ParseTemplate("ok\n\n{% include 'x' %}");
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("line 3"), std::string::npos) << p.status().message();
  EXPECT_NE(p.status().message().find("include"), std::string::npos) << p.status().message();
  p = ParseTemplate("{{ x | nope }}");
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("unknown filter 'nope'"), std::string::npos);
  p = ParseTemplate("{% for x in y %}{% endif %}");
  ASSERT_FALSE(p.ok());
}

TEST(JinjaParser, PrecedenceFollowsJinja2) {
  // Filters and tests bind tighter than arithmetic; `not` is looser than `is`.
  EXPECT_EQ(Render("{{ ' a ' | trim + 'b' }}"), "ab");
  EXPECT_EQ(Render("{{ [1, 2, 3] | length - 1 }}"), "2");
  EXPECT_EQ(Render("{{ not x is defined }}"), "True");
  EXPECT_EQ(Render("{{ 1 + 2 * 3 ** 2 }}"), "19");
  EXPECT_EQ(Render("{{ 1 ~ 2 * 3 }}"), "16");  // ~ is below * ...
  EXPECT_NE(Render("{{ 'a' ~ 1 + 2 }}").find("concatenate"), std::string::npos);  // ... and above +
  EXPECT_EQ(Render("{{ 'y' if 0 else 'n' if 1 else 'z' }}"), "n");
}

TEST(JinjaInterp, ScopingLikeJinja2) {
  // A set inside a for body does not leak; namespaces carry state out.
  EXPECT_EQ(Render("{% set x = 0 %}{% for i in [1, 2] %}{% set x = i %}{% endfor %}{{ x }}"), "0");
  EXPECT_EQ(Render("{% set ns = namespace(x=0) %}{% for i in [1, 2] %}{% set ns.x = i %}{% endfor "
                   "%}{{ ns.x }}"),
            "2");
  EXPECT_EQ(Render("{% if true %}{% set y = 3 %}{% endif %}{{ y }}"), "3");
}

TEST(JinjaInterp, CallBlocksAndArgumentSplats) {
  // Expected values are jinja2 3.1.6's.
  EXPECT_EQ(Render("{%- macro wrap(a, b='!') -%}<{{ a }} {{ caller() }}{{ b }}>{%- endmacro %}"
                   "{%- call wrap('hi') -%}there{%- endcall -%}"),
            "<hi there!>");
  EXPECT_EQ(Render("{% macro each(xs) %}{% for x in xs %}{{ caller(x) }}{% endfor %}{% endmacro %}"
                   "{% call(v) each([1, 2]) %}[{{ v * 10 }}]{% endcall %}"),
            "[10][20]");
  EXPECT_EQ(Render("{% macro mul(a, b, c) %}{{ a * b * c }}{% endmacro %}{{ mul(*[1, 2, 3]) }}|{{ "
                   "mul(2, **{'b': 3, "
                   "'c': 4}) }}|{% set fs = [mul] %}{{ fs[0](*[1, 1, 5]) }}"),
            "6|24|5");
}

TEST(JinjaInterp, UndefinedSemantics) {
  EXPECT_EQ(Render("[{{ nope }}]"), "[]");
  EXPECT_EQ(Render("{{ nope | length }}{% for x in nope %}x{% endfor %}"), "0");
  EXPECT_EQ(Render("{{ d.missing is defined }}", {{"d", {{"a", 1}}}}), "False");
  EXPECT_NE(Render("{{ nope.attr }}").find("'nope' is undefined"), std::string::npos);
  EXPECT_NE(Render("{{ nope + 1 }}").find("<error"), std::string::npos);
  EXPECT_EQ(Render("{{ n.x is defined }}", {{"n", nullptr}}),
            "False");  // attribute of None: undefined
}

TEST(JinjaInterp, SandboxRefusesMutation) {
  EXPECT_NE(Render("{{ xs.append(1) }}", {{"xs", {1}}}).find("unsafe"), std::string::npos);
  EXPECT_NE(Render("{{ d.update({}) }}", {{"d", {{"a", 1}}}}).find("unsafe"), std::string::npos);
}

TEST(JinjaInterp, DictMethodsWinOverKeysForAttributeAccess) {
  // jinja2: d.items is the method, d['items'] is the key.
  EXPECT_EQ(Render("{{ d['items'] }}|{{ d.items() | list | length }}",
                   {{"d", {{"items", "key"}, {"a", 1}}}}),
            "key|2");
}

TEST(JinjaInterp, StrMethodsUseCodePoints) {
  EXPECT_EQ(Render("{{ s[1:3] }}|{{ s | length }}|{{ s[-1] }}|{{ s.upper() }}", {{"s", "aé🎉b"}}),
            "é🎉|4|b|AÉ🎉B");
  EXPECT_EQ(
      Render("{{ s.split('</think>')[-1].lstrip('\\n') }}", {{"s", "<think>r</think>\n\nanswer"}}),
      "answer");
  EXPECT_EQ(Render("{{ '  a  b '.split() }}|{{ 'a,b,c'.split(',', 1) }}"),
            "['a', 'b']|['a', 'b,c']");
  // After maxsplit the rest keeps its outer whitespace.
  EXPECT_EQ(Render("{{ ' a  b '.rsplit(None, 1) }}|{{ 'a b '.split(None, 1) }}"),
            "[' a', 'b']|['a', 'b ']");
  EXPECT_EQ(Render("{{ 'v1.txt'.removesuffix('.txt') }}|{{ 'a=b=c'.partition('=') }}|{{ "
                   "'abc'.rpartition('x') }}"),
            "v1|('a', '=', 'b=c')|('', '', 'abc')");
  EXPECT_EQ(Render("{{ 'straße'.upper() }}|{{ 'İ'.lower()|length }}|{{ 'ΟΔΟΣ'.lower() }}"),
            "STRASSE|2|οδος");
}

// What a hostile template could do to the process before these bounds:
// overflow the stack, allocate without limit, spin, or hit signed overflow.
std::string RenderWith(const std::string& src, const RenderLimits& limits) {
  auto prog = ParseTemplate(src);
  if (!prog.ok()) return "<parse error: " + prog.status().message() + ">";
  Dict ctx;
  std::tm now{};
  Interpreter interp(**prog, ctx, now, limits);
  try {
    return interp.Render();
  } catch (const RenderError& e) {
    return "<error: " + e.message + ">";
  }
}

TEST(JinjaLimits, DeepNestingIsAParseErrorNotAStackOverflow) {
  const int n = 100'000;
  for (const std::string& src : {"{{ " + std::string(n, '(') + "1" + std::string(n, ')') + " }}",
                                 "{{ " + std::string(n, '[') + std::string(n, ']') + " }}",
                                 "{{ " + std::string(4 * n, '-') + "1 }}",
                                 "{{ " +
                                     [&] {
                                       std::string s;
                                       for (int i = 0; i < n; ++i) s += "not ";
                                       return s;
                                     }() +
                                     "x }}",
                                 [&] {
                                   std::string s;
                                   for (int i = 0; i < n; ++i) s += "{% if x %}";
                                   return s;
                                 }()}) {
    auto prog = ParseTemplate(src);
    ASSERT_FALSE(prog.ok());
    EXPECT_NE(prog.status().message().find("levels deep"), std::string::npos)
        << prog.status().message();
  }
  // Loops build left-deep trees without recursing: 1+1+1..., a.b.c..., x|f|f...
  std::string sum = "{{ 1", attrs = "{{ a", filters = "{{ x";
  for (int i = 0; i < n; ++i) {
    sum += "+1";
    attrs += ".b";
    filters += "|string";
  }
  for (const std::string& src : {sum + " }}", attrs + " }}", filters + " }}"}) {
    auto prog = ParseTemplate(src);
    ASSERT_FALSE(prog.ok());
    EXPECT_NE(prog.status().message().find("nests more than 100 levels"), std::string::npos)
        << prog.status().message();
  }
  // Real templates stay far below the limit.
  EXPECT_EQ(Render("{{ ((((1 + 2)))) * [[[3]]][0][0][0] }}"), "9");
}

// Found by model_fuzz_replay_test: std::stod/stoll threw out_of_range past
// the RenderError/ParseError handlers, out of ChatTemplate::Parse/Render.
TEST(JinjaLimits, NumberLiteralsOutOfRange) {
  EXPECT_EQ(Render("{{ 1e999 }} {{ -1e999 }} {{ 1e-999 }}"), "inf -inf 0.0");
  auto prog = ParseTemplate("{{ x.99999999999999999999 }}");
  ASSERT_FALSE(prog.ok());
  EXPECT_NE(prog.status().message().find("integer literal out of range"), std::string::npos);
  EXPECT_EQ(Render("{{ xs | map(attribute='99999999999999999999') | list | length }}",
                   {{"xs", nlohmann::ordered_json::array({nlohmann::ordered_json::array({1})})}}),
            "1");
}

TEST(JinjaLimits, OutputSizeIsBounded) {
  RenderLimits small;
  small.max_output_bytes = 1000;
  for (const char* src :
       {"{{ 'a' * 1001 }}", "{{ 'ab' * 9223372036854775807 }}",
        "{% set ns = namespace(s='x') %}{% for i in range(20) %}"
        "{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
        "{% for i in range(2000) %}a{% endfor %}", "{{ 'a' | indent(5000) }}",
        "{{ ('a' * 100) | replace('', 'bbbbbbbbbb') }}", "{{ [[[1]]] | tojson(indent=999) }}",
        "{{ ('a\n' * 100) | indent(20, true) }}"}) {
    std::string out = RenderWith(src, small);
    EXPECT_NE(out.find("<error: "), std::string::npos) << src << " -> " << out.substr(0, 80);
    EXPECT_NE(out.find("limit"), std::string::npos) << src << " -> " << out.substr(0, 200);
  }
  EXPECT_EQ(RenderWith("{{ 'ab' * 3 }}{{ 'a' | indent(-5) }}", small),
            "ababab"
            "a");
}

TEST(JinjaLimits, StepBudgetBoundsLoopsAndRepetition) {
  RenderLimits small;
  small.max_steps = 1000;
  for (const char* src :
       {"{% for i in range(100000) %}{% endfor %}",
        "{% for i in range(40) %}{% for j in range(40) %}{% endfor %}{% endfor %}",
        "{{ ([1] * 5000) | length }}", "{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}"}) {
    std::string out = RenderWith(src, small);
    EXPECT_NE(out.find("<error: "), std::string::npos) << src << " -> " << out.substr(0, 80);
  }
  EXPECT_EQ(RenderWith("{% for i in range(30) %}{% for j in range(30) %}{% endfor %}{% endfor %}ok",
                       small),
            "ok");
}

TEST(JinjaLimits, IntegerOverflowIsAnErrorNotUndefinedBehaviour) {
  for (const char* src :
       {"{{ 9223372036854775807 + 1 }}", "{{ -9223372036854775807 - 2 }}",
        "{{ 4611686018427387904 * 2 }}", "{{ 2 ** 63 }}", "{{ 3 ** 1000000000000000000 }}",
        "{{ (-9223372036854775807 - 1) // -1 }}", "{{ -(-9223372036854775807 - 1) }}",
        "{{ (-9223372036854775807 - 1) | abs }}"}) {
    std::string out = Render(src);
    EXPECT_NE(out.find("integer overflow"), std::string::npos) << src << " -> " << out;
  }
  EXPECT_EQ(Render("{{ 2 ** 62 }} {{ (-2) ** 63 }} {{ 1 ** 1000000000000000000 }} {{ 7 % -1 }}"),
            "4611686018427387904 -9223372036854775808 1 0");
}

}  // namespace
}  // namespace strata::jinja
