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

}  // namespace
}  // namespace strata::jinja
