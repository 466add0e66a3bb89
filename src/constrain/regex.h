// Regular expressions and EBNF grammars as GrammarBuilder nodes: the front
// ends of guided_regex / structured_outputs.regex, JSON-schema `pattern`, and
// guided_grammar / structured_outputs.grammar.
//
// Regex subset (a whole-string match: a leading ^ and a trailing $ are
// accepted and change nothing): literals; . (any code point but \n);
// classes [a-z], [^...] with ranges and escapes; \d \w \s \D \W \S; escapes
// \n \r \t \f \v \0 \xHH \uHHHH \u{H...} and escaped punctuation; groups
// (...), (?:...), (?<name>...), (?P<name>...); alternation |; quantifiers
// * + ? {n} {n,} {n,m} (a lazy or possessive suffix is accepted: generation
// does not depend on it). Anything else (backreferences, lookaround,
// \p{...}, \b, inline flags) is an InvalidArgument naming it and its offset.
//
// EBNF (the GBNF dialect of llama.cpp and xgrammar, which vLLM's
// guided_grammar takes): rules `name ::= expression`, one of them `root`;
// expressions of "strings" (escapes as above), [classes], rule names,
// (groups), | , * + ? {n} {n,} {n,m}; # comments to the end of the line.
//
// Both work on code points: a class's ranges go through a CodepointSink, so
// callers can change how a code point is written (JSON strings escape " and
// \ and control characters: JsonStringSink).
//
// Thread-safety: pure functions over the builder passed in.
#pragma once

#include <functional>
#include <string_view>
#include <utility>
#include <vector>

#include "constrain/grammar.h"
#include "util/status.h"

namespace strata::constrain {

using CodepointRanges = std::vector<std::pair<uint32_t, uint32_t>>;
// Writes one code point from the (sorted, disjoint) ranges.
using CodepointSink = std::function<GrammarBuilder::Node(GrammarBuilder&, const CodepointRanges&)>;

// Code points as UTF-8 (GrammarBuilder::Codepoints).
GrammarBuilder::Node PlainCodepoints(GrammarBuilder& b, const CodepointRanges& ranges);
// Code points as they appear inside a JSON string: " and \ escaped,
// control characters as \n, \t, ... or \u00XX; everything else as UTF-8.
GrammarBuilder::Node JsonStringCodepoints(GrammarBuilder& b, const CodepointRanges& ranges);

// `pattern` as a node matching exactly the strings it matches in full.
StatusOr<GrammarBuilder::Node> CompileRegex(GrammarBuilder& b, std::string_view pattern,
                                            const CodepointSink& sink = PlainCodepoints);

// An EBNF grammar's `root` rule.
StatusOr<GrammarBuilder::Rule> CompileEbnf(GrammarBuilder& b, std::string_view grammar);

}  // namespace strata::constrain
