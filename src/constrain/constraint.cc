#include "constrain/constraint.h"

#include <chrono>
#include <nlohmann/json.hpp>

#include "constrain/json_schema.h"
#include "constrain/regex.h"
#include "model/tokenizer/tokenizer.h"

namespace strata::constrain {
namespace {

using Json = nlohmann::ordered_json;
using Node = GrammarBuilder::Node;

StatusOr<Json> ParseText(const std::string& text, const char* what) {
  Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return InvalidArgument(std::string(what) + " is not valid JSON");
  return j;
}

// One call of `tool` in `format`'s syntax (tool_call_parser.h shows each).
StatusOr<Node> ToolCall(GrammarBuilder& b, const std::string& format, const Json& tool,
                        size_t index) {
  if (!tool.is_object() || !tool.contains("name") || !tool["name"].is_string())
    return InvalidArgument("tools[" + std::to_string(index) + "] needs a name");
  const std::string name = tool["name"].get<std::string>();
  static const Json kAnyObject = Json{{"type", "object"}};
  const Json& params = tool.contains("parameters") && !tool["parameters"].is_null()
                           ? tool["parameters"]
                           : kAnyObject;
  if (params.is_object() && params.contains("type") && params["type"] != "object")
    return InvalidArgument("tools[" + std::to_string(index) +
                           "].function.parameters must describe an object (type \"object\")");
  auto args = CompileJsonSchema(b, params);
  if (!args.ok())
    return InvalidArgument("tools[" + std::to_string(index) +
                           "].function.parameters: " + args.status().message());
  const std::string quoted = Json(name).dump();
  if (format == "hermes")
    return b.Seq({b.Literal("<tool_call>\n{\"name\": " + quoted + ", \"arguments\": "),
                  args.value(), b.Literal("}\n</tool_call>")});
  if (format == "llama3")
    return b.Seq(
        {b.Literal("{\"name\": " + quoted + ", \"parameters\": "), args.value(), b.Literal("}")});
  if (format == "mistral")
    return b.Seq(
        {b.Literal("{\"name\": " + quoted + ", \"arguments\": "), args.value(), b.Literal("}")});
  if (format == "deepseekv3")
    return b.Seq({b.Literal("<｜tool▁call▁begin｜>function<｜tool▁sep｜>" + name + "\n```json\n"),
                  args.value(), b.Literal("\n```<｜tool▁call▁end｜>")});
  return InvalidArgument("unknown tool-call format '" + format +
                         "' (hermes, llama3, mistral, deepseekv3)");
}

StatusOr<Node> ToolCalls(GrammarBuilder& b, const Json& spec) {
  const std::string format = spec.value("format", "");
  const Json& tools = spec.contains("tools") ? spec["tools"] : Json();
  if (!tools.is_array() || tools.empty()) return InvalidArgument("no tools to call");
  std::vector<Node> calls;
  for (size_t i = 0; i < tools.size(); ++i) {
    ASSIGN_OR_RETURN(Node c, ToolCall(b, format, tools[i], i));
    calls.push_back(c);
  }
  const GrammarBuilder::Rule call = b.NewRule("tool_call");
  b.Define(call, b.Alt(std::move(calls)));
  const bool parallel = spec.value("parallel", true);
  const char* separator = format == "hermes"    ? "\n"
                          : format == "llama3"  ? "; "
                          : format == "mistral" ? ", "
                                                : "";
  const Node more = b.Repeat(b.Seq({b.Literal(separator), b.Ref(call)}), 0,
                             parallel ? GrammarBuilder::kUnbounded : 0);
  const Node list = b.Seq({b.Ref(call), more});
  if (format == "mistral") return b.Seq({b.Literal("[TOOL_CALLS]["), list, b.Literal("]")});
  if (format == "deepseekv3")
    return b.Seq({b.Literal("<｜tool▁calls▁begin｜>"), list, b.Literal("<｜tool▁calls▁end｜>")});
  return list;
}

class GrammarConstraint final : public TokenConstraint {
 public:
  explicit GrammarConstraint(std::shared_ptr<Automaton> a) : a_(std::move(a)), pos_(a_->Start()) {}

  std::span<const uint32_t> Allowed(int64_t tokens_left) override {
    if (done_) return EosOnly();
    mask_ = a_->Mask(pos_, tokens_left);
    return *mask_;
  }

  void Advance(int32_t token) override {
    if (done_) return;
    const Vocabulary& v = a_->vocab();
    for (int32_t e : v.eos()) {
      if (e == token) {
        done_ = true;
        return;
      }
    }
    // A token the mask did not allow (a PD prefill without the constraint,
    // or a bug) leaves nothing valid to add: only EOS from here on.
    if (token < 0 || token >= v.size() || v.bytes(token).empty() ||
        !a_->Advance(pos_, v.bytes(token)))
      done_ = true;
  }

 private:
  std::span<const uint32_t> EosOnly() {
    if (eos_only_.empty()) {
      const Vocabulary& v = a_->vocab();
      eos_only_.assign(v.words(), 0u);
      for (int32_t e : v.eos()) eos_only_[static_cast<size_t>(e) >> 5] |= 1u << (e & 31);
      if (v.eos().empty()) eos_only_.assign(v.words(), ~0u);  // nothing ends it: do not block
    }
    return eos_only_;
  }

  std::shared_ptr<Automaton> a_;
  Automaton::Position pos_;
  std::shared_ptr<const TokenBitmask> mask_;
  TokenBitmask eos_only_;
  bool done_ = false;
};

}  // namespace

const char* ConstraintKindName(ConstraintSpec::Kind kind) {
  switch (kind) {
    case ConstraintSpec::Kind::kJsonSchema:
      return "json_schema";
    case ConstraintSpec::Kind::kJsonObject:
      return "json_object";
    case ConstraintSpec::Kind::kRegex:
      return "regex";
    case ConstraintSpec::Kind::kChoice:
      return "choice";
    case ConstraintSpec::Kind::kGrammar:
      return "grammar";
    case ConstraintSpec::Kind::kToolCalls:
      return "tool_calls";
  }
  return "unknown";
}

StatusOr<std::shared_ptr<const Grammar>> CompileSpec(const ConstraintSpec& spec) {
  GrammarBuilder b;
  const GrammarBuilder::Rule root = b.NewRule("root");
  switch (spec.kind) {
    case ConstraintSpec::Kind::kJsonSchema: {
      ASSIGN_OR_RETURN(Json schema, ParseText(spec.text, "the JSON schema"));
      ASSIGN_OR_RETURN(Node n, CompileJsonSchema(b, schema));
      b.Define(root, n);
      break;
    }
    case ConstraintSpec::Kind::kJsonObject:
      b.Define(root, AnyJsonObject(b));
      break;
    case ConstraintSpec::Kind::kRegex: {
      ASSIGN_OR_RETURN(Node n, CompileRegex(b, spec.text));
      b.Define(root, n);
      break;
    }
    case ConstraintSpec::Kind::kChoice: {
      ASSIGN_OR_RETURN(Json choices, ParseText(spec.text, "the choices"));
      if (!choices.is_array() || choices.empty())
        return InvalidArgument("the choices must be a non-empty array of strings");
      std::vector<Node> options;
      for (const Json& c : choices) {
        if (!c.is_string() || c.get_ref<const std::string&>().empty())
          return InvalidArgument("every choice must be a non-empty string");
        options.push_back(b.Literal(c.get<std::string>()));
      }
      b.Define(root, b.Alt(std::move(options)));
      break;
    }
    case ConstraintSpec::Kind::kGrammar: {
      ASSIGN_OR_RETURN(GrammarBuilder::Rule r, CompileEbnf(b, spec.text));
      b.Define(root, b.Ref(r));
      break;
    }
    case ConstraintSpec::Kind::kToolCalls: {
      ASSIGN_OR_RETURN(Json j, ParseText(spec.text, "the tool-call spec"));
      ASSIGN_OR_RETURN(Node n, ToolCalls(b, j));
      b.Define(root, n);
      break;
    }
  }
  return b.Build(root);
}

std::shared_ptr<const Vocabulary> VocabularyFromTokenizer(const Tokenizer& tokenizer,
                                                          int64_t vocab_size,
                                                          std::vector<int32_t> eos) {
  std::vector<std::string> bytes(static_cast<size_t>(vocab_size));
  const int64_t known = std::min(vocab_size, tokenizer.vocab_size());
  for (int32_t id = 0; id < known; ++id) {
    if (tokenizer.IsSpecial(id)) continue;
    bytes[id] = tokenizer.TokenBytes(id);
  }
  return std::make_shared<Vocabulary>(std::move(bytes), std::move(eos));
}

ConstraintCompiler::ConstraintCompiler(std::shared_ptr<const Vocabulary> vocab, size_t max_cached)
    : vocab_(std::move(vocab)), max_cached_(std::max<size_t>(max_cached, 1)) {}

StatusOr<std::shared_ptr<Automaton>> ConstraintCompiler::Compile(const ConstraintSpec& spec) {
  const std::string key = std::string(ConstraintKindName(spec.kind)) + '\0' + spec.text;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = index_.find(key);
    if (it != index_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second);
      ++stats_.hits;
      return it->second->second;
    }
  }
  // Compiled outside the lock: two requests with one new schema may both
  // compile it; the second result replaces nothing.
  const auto t0 = std::chrono::steady_clock::now();
  ASSIGN_OR_RETURN(std::shared_ptr<const Grammar> g, CompileSpec(spec));
  auto automaton = std::make_shared<Automaton>(std::move(g), vocab_);
  const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::lock_guard<std::mutex> lock(mu_);
  ++stats_.misses;
  stats_.compile_seconds += dt;
  auto it = index_.find(key);
  if (it != index_.end()) return it->second->second;
  lru_.emplace_front(key, automaton);
  index_[key] = lru_.begin();
  while (lru_.size() > max_cached_) {
    index_.erase(lru_.back().first);
    lru_.pop_back();
  }
  return automaton;
}

ConstraintCompiler::Stats ConstraintCompiler::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

std::shared_ptr<TokenConstraint> NewTokenConstraint(std::shared_ptr<Automaton> automaton) {
  return std::make_shared<GrammarConstraint>(std::move(automaton));
}

int64_t PrewarmFragments(std::shared_ptr<const Vocabulary> vocab, const std::atomic<bool>* stop) {
  using Kind = ConstraintSpec::Kind;
  // Compact answers (the constraints' default whitespace): strings with
  // spaces, escapes and non-ASCII, bounded (a string with n characters left
  // is one fragment whatever its bound) and not, integers, signed decimals
  // with exponents, literals, nested objects and arrays.
  static const struct {
    Kind kind;
    const char* spec;
    const char* answer;
  } kCanned[] = {
      {Kind::kJsonObject, "",
       R"({"name":"Ada Lovelace","age":36,"score":-1.25e2,"ok":true,"note":null,)"
       R"("tags":["math","po\"etry","caf\u00e9 ü"],"nested":{"k":"v w","n":[1,2.5,0]}})"},
      {Kind::kJsonSchema,
       R"({"type":"object","properties":{"name":{"type":"string"},"count":{"type":"integer"},)"
       R"("ratio":{"type":"number"},"flag":{"type":"boolean"},)"
       R"("items":{"type":"array","items":{"type":"string"}},)"
       R"("short":{"type":"string","maxLength":64}},)"
       R"("required":["name","count","ratio","flag","items","short"]})",
       R"({"name":"Grace Hopper","count":3,"ratio":0.5,"flag":false,"items":["a b","c\"d, e"],)"
       R"("short":"abcdefghijklmnopqrstuvwxyzabcdefghijklmnopqrstuvwxyzabcdefghijkl"})"},
  };
  int64_t masks = 0;
  for (const auto& c : kCanned) {
    auto grammar = CompileSpec(ConstraintSpec{c.kind, c.spec});
    if (!grammar.ok()) continue;  // a bug in the canned text: nothing to warm
    Automaton a(*grammar, vocab);
    Automaton::Position p = a.Start();
    // Byte by byte: every state the answer passes through, whatever token
    // boundaries a model would choose.
    for (const char* b = c.answer; *b != '\0'; ++b) {
      if (stop && stop->load(std::memory_order_relaxed)) return masks;
      a.Mask(p);
      ++masks;
      if (!a.Advance(p, std::string_view(b, 1))) break;
    }
  }
  return masks;
}

}  // namespace strata::constrain
