// ChatTemplate against transformers: every case in
// tests/fixtures/chat/goldens.json (made by tools/reference/chat_goldens.py
// with transformers' apply_chat_template) must render byte for byte, or fail
// with the same raise_exception message.
#include "model/jinja/chat_template.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>

namespace strata {
namespace {

using nlohmann::ordered_json;

std::string ReadText(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  EXPECT_TRUE(f.good()) << "cannot open " << path;
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string FixtureDir() { return std::string(STRATA_SOURCE_DIR) + "/tests/fixtures/chat/"; }

const ordered_json& Goldens() {
  static const ordered_json* g = [] {
    const char* override_path = std::getenv("STRATA_CHAT_GOLDENS");  // for local iteration only
    std::string path = override_path ? override_path : FixtureDir() + "goldens.json";
    return new ordered_json(ordered_json::parse(ReadText(path)));
  }();
  return *g;
}

std::tm PinnedNow() {
  const ordered_json& p = Goldens()["pinned_now"];
  std::tm t{};
  t.tm_year = p["year"].get<int>() - 1900;
  t.tm_mon = p["month"].get<int>() - 1;
  t.tm_mday = p["day"].get<int>();
  t.tm_hour = p["hour"].get<int>();
  t.tm_min = p["minute"].get<int>();
  t.tm_sec = p["second"].get<int>();
  t.tm_wday = p["weekday_sunday0"].get<int>();
  t.tm_yday = p["yearday0"].get<int>();
  t.tm_isdst = 0;
  return t;
}

std::shared_ptr<const ChatTemplate> Load(const std::string& name, const ordered_json& c) {
  static std::map<std::string, std::shared_ptr<const ChatTemplate>> cache;
  std::string source =
      name == "probe" ? c["source"].get<std::string>() : ReadText(FixtureDir() + name + ".jinja");
  std::string key = name == "probe" ? "probe:" + source : name;
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  auto t = ChatTemplate::Parse(source);
  EXPECT_TRUE(t.ok()) << name << ": " << t.status().ToString();
  if (!t.ok()) return nullptr;
  cache[key] = *t;
  return *t;
}

ChatTemplateInputs InputsOf(const ordered_json& c) {
  ChatTemplateInputs in;
  in.messages = c["messages"];
  in.tools = c["tools"];
  in.add_generation_prompt = c["add_generation_prompt"].get<bool>();
  in.extra = c["extra"];
  if (c["bos_token"].is_string()) in.bos_token = c["bos_token"].get<std::string>();
  if (c["eos_token"].is_string()) in.eos_token = c["eos_token"].get<std::string>();
  in.now = PinnedNow();
  return in;
}

TEST(ChatTemplateGoldens, ComeFromTransformers) {
  if (std::getenv("STRATA_CHAT_GOLDENS")) GTEST_SKIP() << "local goldens override";
  EXPECT_EQ(Goldens()["renderer"], "transformers.apply_chat_template")
      << "goldens.json must be generated with transformers, not the jinja2 look-alike";
}

TEST(ChatTemplateGoldens, EveryTemplateEveryCase) {
  int rendered = 0, errors = 0;
  for (const ordered_json& c : Goldens()["cases"]) {
    std::string label = c["template"].get<std::string>() + "/" + c["name"].get<std::string>();
    SCOPED_TRACE(label);
    auto tmpl = Load(c["template"].get<std::string>(), c);
    if (!tmpl) continue;
    StatusOr<std::string> out = tmpl->Render(InputsOf(c));
    if (c.contains("expected")) {
      ASSERT_TRUE(out.ok()) << label << ": " << out.status().ToString();
      EXPECT_EQ(*out, c["expected"].get<std::string>()) << label;
      ++rendered;
    } else {
      ASSERT_FALSE(out.ok()) << label << " rendered but transformers failed with: " << c["error"];
      EXPECT_EQ(out.status().code(), StatusCode::kInvalidArgument);
      if (c["error_type"] ==
          "TemplateError") {  // raise_exception: the template's own message, verbatim
        EXPECT_EQ(out.status().message(), c["error"].get<std::string>());
      }
      ++errors;
    }
  }
  EXPECT_GT(rendered, 50);
  EXPECT_GT(errors, 3);
}

// Every model template in the fixtures folder parses (model load succeeds).
TEST(ChatTemplate, AllFixtureTemplatesParse) {
  for (const char* name : {"llama3_1", "llama3_2", "qwen2_5", "qwen3", "deepseek_v3",
                           "deepseek_v3_1", "mistral_7b_instruct", "mistral_small_3_1"}) {
    auto t = ChatTemplate::Parse(ReadText(FixtureDir() + name + ".jinja"));
    EXPECT_TRUE(t.ok()) << name << ": " << t.status().ToString();
  }
}

TEST(ChatTemplate, UnsupportedSyntaxFailsAtParse) {
  const char* bad[] = {
      "{% include 'other.jinja' %}",
      "{% import 'macros' as m %}",
      "{% extends 'base' %}",
      "{% do items.append(1) %}",
      "{% with x = 1 %}{{ x }}{% endwith %}",
      "{% autoescape true %}x{% endautoescape %}",
      "{% call 'not a call' %}x{% endcall %}",
      "{{ x | no_such_filter }}",
      "{{ x is no_such_test }}",
      "{% for x in xs recursive %}{{ loop(x) }}{% endfor %}",
      "{{ f(*args, 1) }}",
      "{{ '{} items'.format(n) }}",
      "{{ '%d items' % n }}",
      "{% if x %}unclosed",
      "{{ 'unterminated }}",
      "{% break %}",
      "{% endfor %}",
      "{{ x ",
  };
  for (const char* src : bad) {
    auto t = ChatTemplate::Parse(src);
    EXPECT_FALSE(t.ok()) << "should not parse: " << src;
    if (!t.ok()) {
      EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument) << src;
      EXPECT_NE(t.status().message().find("line 1"), std::string::npos) << t.status().message();
    }
  }
}

TEST(ChatTemplate, RaiseExceptionIsInvalidArgumentWithTheTemplatesMessage) {
  auto t = ChatTemplate::Parse(
      "{% for m in messages %}{% if m.role == 'tool' %}{{ raise_exception('Tools are not "
      "supported: ' ~ m.content) }}"
      "{% endif %}{{ m.content }}{% endfor %}");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  ChatTemplateInputs in;
  in.messages =
      ordered_json::parse(R"([{"role":"user","content":"hi"},{"role":"tool","content":"x"}])");
  auto out = (*t)->Render(in);
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(out.status().message(), "Tools are not supported: x");

  in.messages = ordered_json::parse(R"([{"role":"user","content":"hi"}])");
  out = (*t)->Render(in);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_EQ(*out, "hi");
}

TEST(ChatTemplate, RuntimeErrorsNameTheLine) {
  auto t = ChatTemplate::Parse("ok\n{{ messages[0].content.missing.deeper }}");
  ASSERT_TRUE(t.ok());
  ChatTemplateInputs in;
  in.messages = ordered_json::parse(R"([{"role":"user","content":"hi"}])");
  auto out = (*t)->Render(in);
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(out.status().message().find("line 2"), std::string::npos) << out.status().message();
  EXPECT_NE(out.status().message().find("missing"), std::string::npos) << out.status().message();
}

TEST(ChatTemplate, BadInputsAreInvalidArgument) {
  auto t = ChatTemplate::Parse("{{ messages|length }}");
  ASSERT_TRUE(t.ok());
  ChatTemplateInputs in;
  in.messages = ordered_json::object();
  EXPECT_EQ((*t)->Render(in).status().code(), StatusCode::kInvalidArgument);
  in.messages = ordered_json::array();
  in.extra = ordered_json::parse(R"({"messages": []})");
  EXPECT_EQ((*t)->Render(in).status().code(), StatusCode::kInvalidArgument);
}

TEST(ChatTemplate, StrftimeNowUsesTheInjectedClock) {
  auto t = ChatTemplate::Parse("{{ strftime_now('%d %b %Y') }}");
  ASSERT_TRUE(t.ok());
  ChatTemplateInputs in;
  std::tm now{};
  now.tm_year = 2031 - 1900;
  now.tm_mon = 11;
  now.tm_mday = 24;
  in.now = now;
  auto out = (*t)->Render(in);
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(*out, "24 Dec 2031");
}

TEST(ChatTemplate, ToolSchemaKeyOrderSurvives) {
  auto t = ChatTemplate::Parse("{{ tools[0] | tojson }}");
  ASSERT_TRUE(t.ok());
  ChatTemplateInputs in;
  in.tools = ordered_json::parse(R"([{"name":"f","description":"d","parameters":{"b":1,"a":2}}])");
  auto out = (*t)->Render(in);
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(*out, R"({"name": "f", "description": "d", "parameters": {"b": 1, "a": 2}})");
}

}  // namespace
}  // namespace strata
