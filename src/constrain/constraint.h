// Structured outputs for the server: what a request asks for (ConstraintSpec),
// compiled once per distinct text into an Automaton over the model's
// vocabulary (ConstraintCompiler, an LRU cache shared by all requests), and
// the per-request TokenConstraint the engine applies (NewTokenConstraint).
//
// Kinds and what their text is:
//   kJsonSchema  a JSON schema (json_schema.h has the subset)
//   kJsonObject  "" (any JSON object)
//   kRegex       a regular expression (regex.h), matched in full
//   kChoice      a JSON array of strings: exactly one of them
//   kGrammar     an EBNF grammar (regex.h) with a root rule
//   kToolCalls   {"format": "hermes"|"llama3"|"mistral"|"deepseekv3",
//                 "tools": [{"name", "parameters"}...], "parallel": bool}:
//                one or more calls (one when parallel is false) in the
//                format's syntax, each to one of the tools with arguments
//                valid under its parameters schema (tool_choice "required"
//                or a named function)
//
// Budget: a constraint closes its structure in time. Allowed() passes the
// tokens left to Automaton::Mask, which allows only tokens after which the
// bytes still needed plus EOS fit in what remains, so the answer is
// complete and ends with EOS inside max_tokens whenever max_tokens is above
// the grammar's shortest answer (a byte-level vocabulary can always write
// one byte a token).
//
// Thread-safety: ConstraintCompiler is thread-safe (request threads compile
// concurrently); a TokenConstraint belongs to one request.
#pragma once

#include <atomic>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "constrain/automaton.h"
#include "engine/token_constraint.h"
#include "util/status.h"

namespace strata {
class Tokenizer;
}

namespace strata::constrain {

struct ConstraintSpec {
  enum class Kind { kJsonSchema, kJsonObject, kRegex, kChoice, kGrammar, kToolCalls };
  Kind kind = Kind::kJsonObject;
  std::string text;
};
const char* ConstraintKindName(ConstraintSpec::Kind kind);

// The grammar a spec describes. InvalidArgument says what is wrong or
// unsupported, and where.
StatusOr<std::shared_ptr<const Grammar>> CompileSpec(const ConstraintSpec& spec);

// Token byte strings of a tokenizer for vocab_size ids (the logits' width):
// special tokens and ids past the tokenizer get none, so they are never
// generated under a constraint; eos: the model's end-of-sequence ids.
std::shared_ptr<const Vocabulary> VocabularyFromTokenizer(const Tokenizer& tokenizer,
                                                          int64_t vocab_size,
                                                          std::vector<int32_t> eos);

class ConstraintCompiler {
 public:
  explicit ConstraintCompiler(std::shared_ptr<const Vocabulary> vocab, size_t max_cached = 128);

  // The automaton for spec: from the cache, or compiled now and cached.
  StatusOr<std::shared_ptr<Automaton>> Compile(const ConstraintSpec& spec);

  struct Stats {
    int64_t hits = 0;
    int64_t misses = 0;
    double compile_seconds = 0;
  };
  Stats stats() const;
  const Vocabulary& vocab() const { return *vocab_; }

 private:
  std::shared_ptr<const Vocabulary> vocab_;
  size_t max_cached_;
  mutable std::mutex mu_;
  std::list<std::pair<std::string, std::shared_ptr<Automaton>>> lru_;  // most recent first
  std::unordered_map<std::string, decltype(lru_)::iterator> index_;
  Stats stats_;
};

// A request's constraint over `automaton`, from its start.
std::shared_ptr<TokenConstraint> NewTokenConstraint(std::shared_ptr<Automaton> automaton);

// Masks the shapes most answers share (strings, numbers, literals, objects
// and arrays of them) once, so that the first schemas a server sees find
// their string fragments in `vocab` (Vocabulary::FindFragment) instead of
// walking the vocabulary at every place: a few canned specs are compiled
// (outside any ConstraintCompiler's cache) and a canned valid answer of each
// is followed byte by byte, computing the mask of every state it passes.
// Stops early once *stop is true. Returns the masks computed. Thread-safe
// (the vocabulary's fragment cache is).
int64_t PrewarmFragments(std::shared_ptr<const Vocabulary> vocab,
                         const std::atomic<bool>* stop = nullptr);

}  // namespace strata::constrain
