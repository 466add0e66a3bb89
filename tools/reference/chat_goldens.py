#!/usr/bin/env python3
"""Golden chat-template renderings for src/model/chat_template_test.cc.

Usage: python3 tools/reference/chat_goldens.py tests/fixtures/chat OUT_DIR

Renders every tests/fixtures/chat/<name>.jinja (the models' own templates)
with a set of conversations, plus small probe templates that pin down jinja2
semantics (whitespace control, tojson, tests, filters, scoping), and writes
OUT_DIR/goldens.json. Rendering goes through transformers'
apply_chat_template(tokenize=False) on a tokenizer carrying the template,
which is the authority Strata must match byte for byte; run it on the GPU
machine (transformers 5.x). Without transformers it falls back to a jinja2
environment configured like transformers' and says so in "renderer": such a
file is for local iteration only and must not be committed.

strftime_now() is pinned to PINNED_NOW by patching the datetime that
transformers' chat_template_utils uses; the C++ test pins the same time.
"""
import datetime as _dt
import inspect
import json
import os
import sys

PINNED_NOW = _dt.datetime(2025, 3, 7, 14, 5, 9)

LLAMA = {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}
QWEN = {"bos_token": None, "eos_token": "<|im_end|>"}
DEEPSEEK = {"bos_token": "<｜begin▁of▁sentence｜>", "eos_token": "<｜end▁of▁sentence｜>"}
MISTRAL = {"bos_token": "<s>", "eos_token": "</s>"}

TEMPLATES = {
    "llama3_1": LLAMA,
    "llama3_2": LLAMA,
    "qwen2_5": QWEN,
    "qwen3": QWEN,
    "deepseek_v3": DEEPSEEK,
    "deepseek_v3_1": DEEPSEEK,
    "mistral_7b_instruct": MISTRAL,
    "mistral_small_3_1": MISTRAL,
}

SYS = {"role": "system", "content": "You are a helpful assistant."}
U1 = {"role": "user", "content": "Hello! How are you?"}
A1 = {"role": "assistant", "content": "I'm fine, thanks. How can I help?"}
U2 = {"role": "user", "content": "What is 2 + 2?"}
A2 = {"role": "assistant", "content": "2 + 2 = 4."}
UNI = {"role": "user", "content": "Héllo wörld — 你好，世界 🎉 \"quoted\" \\backslash\\ tab\tend\nnew line"}
PADDED = {"role": "user", "content": "  \n  padded content with spaces  \n\n"}
EMPTY_U = {"role": "user", "content": ""}
EMPTY_A = {"role": "assistant", "content": ""}

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city — with unicode: Zürich",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 1, "default": 1},
                "threshold": {"type": "number", "default": 0.5},
            },
            "required": ["city"],
        },
    },
}
TIME_TOOL = {
    "type": "function",
    "function": {"name": "get_time", "description": "Current time", "parameters": {"type": "object", "properties": {}}},
}
CALL_DICT = {
    "role": "assistant",
    "content": "",
    "tool_calls": [
        {"id": "call00001", "type": "function",
         "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}}
    ],
}
CALL_STR = {
    "role": "assistant",
    "content": None,
    "tool_calls": [
        {"id": "call00001", "type": "function",
         "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"unit\": \"celsius\"}"}}
    ],
}
TOOL_RESULT = {"role": "tool", "tool_call_id": "call00001", "content": "{\"temp_c\": 18, \"sky\": \"cloudy\"}"}
U_WEATHER = {"role": "user", "content": "What's the weather in Paris?"}
A_AFTER_TOOL = {"role": "assistant", "content": "It is 18°C and cloudy in Paris."}


def case(name, messages, agp=True, tools=None, extra=None):
    return {"name": name, "messages": messages, "add_generation_prompt": agp, "tools": tools, "extra": extra or {}}


COMMON = [
    case("sys_user", [SYS, U1]),
    case("sys_user_nogen", [SYS, U1], agp=False),
    case("user_only", [U1]),
    case("multi_turn", [SYS, U1, A1, U2]),
    case("multi_turn_no_sys", [U1, A1, U2]),
    case("ends_with_assistant_nogen", [U1, A1, U2, A2], agp=False),
    case("unicode", [UNI, {"role": "assistant", "content": "Ça va 👍"}, UNI]),
    case("padded", [PADDED, {"role": "assistant", "content": "\n ok \n"}, PADDED]),
    case("empty_content", [EMPTY_U, EMPTY_A, EMPTY_U]),
]

THINK_A = {"role": "assistant", "content": "<think>\nThe user greets me.\n</think>\n\nHi there!"}
REASON_A = {"role": "assistant", "content": "The answer is 4.", "reasoning_content": "2 plus 2 is 4."}

PER_TEMPLATE = {
    "llama3_1": [
        case("tools_in_user", [SYS, U_WEATHER], tools=[WEATHER_TOOL, TIME_TOOL]),
        case("tools_call_result", [SYS, U_WEATHER, CALL_DICT, TOOL_RESULT, A_AFTER_TOOL, U2], tools=[WEATHER_TOOL]),
        case("tools_in_system", [SYS, U_WEATHER], tools=[WEATHER_TOOL], extra={"tools_in_user_message": False}),
        case("builtin_tools", [SYS, U_WEATHER],
             extra={"builtin_tools": ["brave_search", "wolfram_alpha", "code_interpreter"]}),
        case("date_string", [U1], extra={"date_string": "01 Jan 2030"}),
        case("err_two_tool_calls",
             [U_WEATHER, {"role": "assistant", "tool_calls": [CALL_DICT["tool_calls"][0]] * 2}], tools=[WEATHER_TOOL]),
    ],
    "llama3_2": [
        case("tools_in_user", [SYS, U_WEATHER], tools=[WEATHER_TOOL, TIME_TOOL]),
        case("tools_call_result", [U_WEATHER, CALL_DICT, TOOL_RESULT, A_AFTER_TOOL], tools=[WEATHER_TOOL], agp=False),
        case("err_tools_no_user", [SYS], tools=[WEATHER_TOOL]),
    ],
    "qwen2_5": [
        case("tools", [SYS, U_WEATHER], tools=[WEATHER_TOOL, TIME_TOOL]),
        case("tools_default_system", [U_WEATHER], tools=[WEATHER_TOOL]),
        case("tools_call_result", [U_WEATHER, CALL_DICT, TOOL_RESULT, TOOL_RESULT, A_AFTER_TOOL], tools=[WEATHER_TOOL]),
        case("list_content_printed", [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]),
    ],
    "qwen3": [
        case("enable_thinking_false", [SYS, U1], extra={"enable_thinking": False}),
        case("enable_thinking_true", [SYS, U1], extra={"enable_thinking": True}),
        case("think_in_content_last", [U1, THINK_A], agp=False),
        case("think_history_stripped", [U1, THINK_A, U2]),
        case("reasoning_content_last", [U2, REASON_A], agp=False),
        case("reasoning_content_history", [U2, REASON_A, U1], extra={"enable_thinking": False}),
        case("tools", [SYS, U_WEATHER], tools=[WEATHER_TOOL, TIME_TOOL]),
        case("tools_call_result", [U_WEATHER, CALL_DICT, TOOL_RESULT, A_AFTER_TOOL], tools=[WEATHER_TOOL]),
        case("tool_call_string_args", [U_WEATHER, dict(CALL_STR, content="Let me check."), TOOL_RESULT]),
    ],
    "deepseek_v3": [
        case("multi_system", [SYS, {"role": "system", "content": "Be brief."}, U1]),
        case("tool_calls", [SYS, U_WEATHER, CALL_STR, TOOL_RESULT, A_AFTER_TOOL, U2]),
        case("tool_outputs_then_gen", [U_WEATHER, CALL_STR, TOOL_RESULT]),
    ],
    "deepseek_v3_1": [
        case("thinking_true", [SYS, U1, dict(THINK_A, content="<think>hmm</think>Hi!"), U2], extra={"thinking": True}),
        case("enable_thinking_true", [U1], extra={"enable_thinking": True}),
        case("prefix_thinking", [U1, {"role": "assistant", "content": "Partial", "prefix": True}], agp=False,
             extra={"thinking": True}),
        case("tool_calls", [SYS, U_WEATHER, CALL_STR, TOOL_RESULT, A_AFTER_TOOL, U2]),
        case("tool_calls_with_content", [U_WEATHER, dict(CALL_STR, content="Checking."), TOOL_RESULT]),
    ],
    "mistral_7b_instruct": [
        case("err_alternation", [U1, U2]),
        case("err_role", [U1, {"role": "tool", "content": "x"}]),
    ],
    "mistral_small_3_1": [
        case("tools", [SYS, U1, A1, U_WEATHER], tools=[WEATHER_TOOL]),
        case("tools_call_result", [U_WEATHER, CALL_DICT, TOOL_RESULT, A_AFTER_TOOL], tools=[WEATHER_TOOL]),
        case("list_content", [{"role": "system", "content": [{"type": "text", "text": "Sys as blocks."}]},
                              {"role": "user", "content": [{"type": "text", "text": "Look: "}, {"type": "image"}]}]),
        case("err_alternation", [U1, U2]),
        case("err_short_tool_id", [U_WEATHER, dict(CALL_DICT, tool_calls=[dict(CALL_DICT["tool_calls"][0], id="abc")])]),
    ],
}

# Small templates that pin down jinja2 behaviour the model templates rely on.
# Each renders with messages=[U1] and `extra` as variables.
PROBE_VARS = {
    "s": "  Hello, World  ",
    "n": 7,
    "f": 2.5,
    "items": [3, 1, 2],
    "words": ["b", "A", "c", "a"],
    "d": {"z": 1, "a": [1, 2.0, None, True], "m": {"k": "v"}},
    "msgs": [{"role": "user", "content": "u1"}, {"role": "assistant", "content": "a1"},
             {"role": "user", "content": "u2", "extra": None}],
    "uni": "Zürich 你好 🎉",
    "floats": [1.0, 0.1, 1e16, 1.5e-7, -0.0, 123456789.125, 1e-5, 3.0e20],
}
PROBES = {
    "ws_trim_lstrip": "a\n  {% if true %}\n    b\n  {% endif %}\nc\n{# comment #}\nd {{ n }}\n  {{ n }}  \n",
    "ws_dash": "x  {%- if true -%}  y  {%- endif -%}  z\n  {{- n -}}  \n w",
    "ws_plus": "a\n  {%+ if true +%}\nb\n  {% endif %}\nc",
    "ws_comment_dash": "a  {#- c -#}  b\n{#- x #}\nc",
    "ws_raw": "{% raw %}{{ not evaluated }}{% endraw %}\n<end>",
    "ws_trailing_newline": "line\n",
    "print_values": "{{ none }}|{{ true }}|{{ False }}|{{ items }}|{{ d }}|{{ f }}|{{ n / 2 }}|{{ 7 // 2 }}|{{ -7 // 2 }}|{{ -7 % 3 }}|{{ 2 ** 10 }}|{{ undefined_var }}|{{ 'a' ~ 1 ~ none }}|{{ [1, 'x', none, {'k': 'v'}] }}|{{ 'it\\'s' }}|{{ [\"it's\"] }}",
    "tojson_variants": "{{ d | tojson }}\n{{ d | tojson(indent=2) }}\n{{ d | tojson(sort_keys=true) }}\n{{ d | tojson(separators=(',', ':')) }}\n{{ uni | tojson }}\n{{ uni | tojson(ensure_ascii=true) }}\n{{ floats | tojson }}\n{{ {} | tojson(indent=4) }}|{{ [] | tojson }}|{{ 'a\"b\\\\c\\n\\t\\u0001' | tojson }}\n{{ msgs | tojson(indent='\\t') }}",
    "float_repr": "{% for x in floats %}{{ x }},{% endfor %}",
    "tests": "{{ s is string }}{{ n is number }}{{ true is number }}{{ f is float }}{{ n is integer }}{{ true is integer }}{{ d is mapping }}{{ s is iterable }}{{ n is iterable }}{{ items is sequence }}{{ none is none }}{{ nothing is defined }}{{ nothing is undefined }}{{ n is odd }}{{ n is divisibleby 7 }}{{ 'x' is in 'xyz' }}{{ false is false }}{{ 0 is false }}{{ 1 is true }}{{ n is equalto 7 }}{{ n is eq(7) }}{{ s is not none }}{{ nothing is iterable }}{{ nothing is sequence }}{{ 'abc' is lower }}{{ none is sameas none }}",
    "string_methods": "{{ s.strip() }}|{{ s.lstrip() }}|{{ s.rstrip() }}|{{ s.strip(' H') }}|{{ s.split(',') }}|{{ s.split() }}|{{ 'a b  c'.split(' ', 1) }}|{{ 'a,b,c'.rsplit(',', 1) }}|{{ s.upper() }}|{{ s.lower() }}|{{ 'hello wORLD-x'.title() }}|{{ 'hELLO'.capitalize() }}|{{ s.replace('l', 'L', 2) }}|{{ s.startswith('  He') }}|{{ s.endswith(('x', '  ')) }}|{{ s.find('World') }}|{{ s.count('l') }}|{{ '-'.join(words) }}|{{ 'a\\nb\\r\\nc'.splitlines() }}|{{ uni.upper() }}|{{ uni[1:4] }}|{{ uni[-1] }}|{{ uni|length }}|{{ '123'.isdigit() }}",
    "slices": "{{ items[::-1] }}|{{ items[1:] }}|{{ items[:-1] }}|{{ items[-2:] }}|{{ items[::2] }}|{{ items[5:] }}|{{ 'abcdef'[-9:] }}|{{ 'abcdef'[:3] }}|{{ 'abcdef'[::-2] }}|{{ items[1] }}|{{ items[-1] }}|{{ msgs.0.role }}|{{ msgs[10] }}",
    "filters": "{{ s|trim }}|{{ s|length }}|{{ s|upper }}|{{ s|lower }}|{{ words|join(', ') }}|{{ words|first }}|{{ words|last }}|{{ words|sort }}|{{ words|sort(case_sensitive=true) }}|{{ words|unique|list }}|{{ items|sort(reverse=true) }}|{{ d|dictsort }}|{{ d|items|list }}|{{ '42'|int + 1 }}|{{ '4.7'|int }}|{{ 'x'|int }}|{{ '2.5'|float }}|{{ nothing|default('dflt') }}|{{ ''|default('dflt', true) }}|{{ msgs|selectattr('role', 'equalto', 'user')|map(attribute='content')|join }}|{{ msgs|rejectattr('role', 'equalto', 'user')|list|length }}|{{ msgs|map(attribute='extra', default='D')|list }}|{{ items|sum }}|{{ items|min }}|{{ items|max }}|{{ f|round }}|{{ 2.567|round(2) }}|{{ 'a\\nb\\n\\nc'|indent(2) }}|{{ 'one two  three'|wordcount }}|{{ 'hello world'|title }}|{{ 'hello World'|capitalize }}|{{ 'abc'|reverse }}|{{ items|reverse|list }}|{{ 'a<b>&\"\\''|escape }}|{{ s|replace(' ', '_') }}|{{ -3|abs }}|{{ words|select('lower')|list }}|{{ items|map('string')|join('+') }}|{{ n|string ~ 'x' }}|{{ d|list }}|{{ 'ab'|list }}",
    "loops": "{% for x in items %}{{ loop.index0 }}{{ loop.index }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ loop.previtem }}{{ loop.nextitem }}{{ loop.cycle('a', 'b') }};{% endfor %}|{% for x in [] %}x{% else %}empty{% endfor %}|{% for k, v in d.items() %}{{ k }}={{ v }},{% endfor %}|{% for k in d %}{{ k }}{% endfor %}|{% for x in items if x > 1 %}{{ x }}{{ loop.index }}{{ loop.length }}{% endfor %}|{% for x in items %}{% if x == 1 %}{% continue %}{% endif %}{% if x == 2 %}{% break %}{% endif %}{{ x }}{% endfor %}|{% for a, b in [[1, 2], [3, 4]] %}{{ a + b }}{% endfor %}|{% for c in 'hé' %}[{{ c }}]{% endfor %}|{% for x in nothing %}never{% endfor %}",
    "scoping": "{% set x = 1 %}{% for i in items %}{% set x = i %}{{ x }}{% endfor %}{{ x }}|{% set ns = namespace(total=0, seen=[]) %}{% for i in items %}{% set ns.total = ns.total + i %}{% set ns.seen = ns.seen + [i] %}{% endfor %}{{ ns.total }}{{ ns.seen }}|{% if true %}{% set y = 5 %}{% endif %}{{ y }}|{% set a, b = 1, 2 %}{{ a }}{{ b }}|{% set blk %}inner {{ n }}{% endset %}{{ blk }}|{% set up | upper %}shout{% endset %}{{ up }}|{% for i in [1] %}{{ x }}{% set x = 'loop' %}{{ x }}{% endfor %}{{ x }}",
    "macros": "{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('Bob') }}|{{ greet('Al', punct='?') }}|{% macro rec(k) %}{% if k > 0 %}{{ k }}{{ rec(k - 1) }}{% endif %}{% endmacro %}{{ rec(3) }}|{% filter upper %}up {{ n }}{% endfilter %}",
    "operators": "{{ 1 < 2 < 3 }}{{ 3 > 2 > 2 }}{{ 'a' in 'cat' }}{{ 'z' not in d }}{{ 'z' in d }}{{ 1 in items }}{{ not 0 }}{{ none or 'x' }}{{ 0 and 'y' }}{{ 'a' if n > 5 else 'b' }}{{ 'yes' if false }}|{{ 'ab' * 3 }}|{{ [1] * 2 + [3] }}|{{ 1 == 1.0 }}{{ true == 1 }}{{ 'a' < 'b' }}{{ [1, 2] < [1, 3] }}|{{ 10 / 4 }}|{{ 7.5 // 2 }}|{{ -7.5 % 2 }}|{{ -n }}|{{ d.m.k }}{{ d['m']['k'] }}{{ d.get('zz', 'none-here') }}{{ d.get('z') }}|{{ msgs[0] == {'role': 'user', 'content': 'u1'} }}|{{ (1, 2) }}|{{ 1_000 + 0.5 }}|{{ 'x' \"y\" }}",
    "strftime": "{{ strftime_now('%d %b %Y') }}|{{ strftime_now('%Y-%m-%d %H:%M:%S %A %B %j %a %p %I %y %e') }}",
    "context_vars": "{{ tools is defined }}|{{ tools is none }}|{{ documents is defined }}|{{ documents }}|{{ bos_token is defined }}|{{ eos_token }}|{{ add_generation_prompt }}|{{ messages|length }}|{{ messages[0].role }}",
    "dict_methods": "{% for k, v in d|items %}{{ k }}:{{ v }};{% endfor %}|{{ d.keys()|list }}|{{ d.values()|list|length }}|{{ d.items()|list|first }}|{{ msgs[2].extra is none }}|{{ msgs[0].missing is defined }}|{{ msgs[0]['missing'] is defined }}",
    "ws_more": "  {% if true %}A{% endif %}\n\t{% if true %}\tB{% endif %}\n  {{ n }}{% if true %}\n C{% endif %}\n  {# c #}  D\n{% for i in items %}\n  {{- i }}\n{% endfor %}\n{%- if true %} E {% endif -%}\n\n F{% if true -%}\n\n  G\n{%- endif %}\u3000H {%- if true %}I{% endif %}",
    "ws_set_block_newlines": "{% set x %}\n  line1\n  {% if true %}\n  line2\n  {% endif %}\n{% endset %}[{{ x }}]",
    "more_values": "{{ 1/3 }}|{{ 10 // 3.0 }}|{{ 2 ** -1 }}|{{ -2 ** 2 }}|{{ 1e3 }}|{{ 3 * 1.5 }}|{{ 0.1 + 0.2 }}|{{ [1.0, -0.5] }}|{{ {'a': \"x'y\", 'b': 'q\"r'} }}|{{ 'tab\there' | tojson }}|{{ ('a',) }}|{{ () }}|{{ msgs|map(attribute='nope')|list }}|{{ none|string|upper }}|{{ 7|string|length }}|{{ [1, 2]|join(',') }}|{{ '%d items' ~ '' }}",
    "more_loops": "{% for m in msgs %}{% for c in m.content %}{{ loop.index }}{{ c }}{% endfor %}:{{ loop.index }}{% if loop.previtem is defined %}p{% endif %};{% endfor %}|{% for k, v in d|dictsort if k != 'm' %}{{ k }}{{ loop.last }}{% endfor %}|{% for i in items %}{% endfor %}{{ i is defined }}|{% set total = 0 %}{% for i in items %}{% set total = total + i %}{{ total }}{% endfor %}{{ total }}|{% for x in range(3) %}{{ x }}{% endfor %}{% for x in range(1, 10, 3) %}{{ x }}{% endfor %}|{% for m in msgs if m.role == 'user' %}{{ m.content }}{{ loop.index }}/{{ loop.length }}{% else %}none{% endfor %}",
    "more_strings": "{{ 'a-b_c d'.title() }}|{{ 'ÉCOLE'.lower() }}|{{ 'straße'.upper() }}|{{ '  x  '|trim('x ') }}|{{ 'xxhixx'.strip('x') }}|{{ 'a.b.c'.split('.')[-1] }}|{{ 'abc'.replace('', '-') }}|{{ 'Hello'[::-1] }}|{{ 'Hello'[1:-1] }}|{{ 'a' * 0 }}|{{ 'x' in ['x', 'y'] }}|{{ 'ab' < 'b' }}|{{ 'B' < 'a' }}|{{ 'hello world'.capitalize() }}|{{ '  lead'.lstrip() ~ '|' ~ 'trail  '.rstrip() }}|{{ 'x,y,,z'.split(',') }}|{{ ' a  b '.rsplit(None, 1) }}|{{ 'abc'.find('z') }}|{{ 'aaa'.count('a') }}|{{ 'İ'|lower|length }}|{{ 'ΟΔΟΣ ΣΑ'|lower }}|{{ 'ﬁne straße'|title }}|{{ 'a b  c  '.split(None, 1) }}",
    "more_tests": "{{ items is iterable }}{{ d is iterable }}{{ none is iterable }}{{ 1.0 is integer }}{{ 1 is float }}{{ true is boolean }}{{ 'a' is sequence }}{{ d is sequence }}{{ n is not string }}{{ none is none }}{{ nothing is none }}{{ 6 is divisibleby(3) }}{{ 3 is even }}{{ 'x' is ne('y') }}{{ 2 is gt 1 }}{{ 2 is lt(1) }}{{ 2 is ge 2 }}{{ 'A' is upper }}{{ d.get is callable }}{{ d.m is mapping }}{{ msgs is not mapping }}{{ 'x' is in ['x'] }}{{ 1 is in [1.0] }}{{ 'k' is in d.m }}",
    "namespace_and_macros": "{% set ns = namespace(a=1) %}{% macro bump() %}{% set ns.a = ns.a + 10 %}{{ ns.a }}{% endmacro %}{{ bump() }}{{ ns.a }}|{% macro m(a, b=none) %}{{ a }}{{ b is none }}{% endmacro %}{{ m(1) }}{{ m(1, 2) }}{{ m(b=3, a=4) }}|{% macro outer() %}{{ n }}{% endmacro %}{{ outer() }}|{{ namespace(d) }}",
    "generation_tag": "{% for m in msgs %}{% if m.role == 'assistant' %}{% generation %}[{{ m.content }}]{% endgeneration %}{% else %}{{ m.content }}{% endif %}\n{% endfor %}",
    "err_raise": "{{ raise_exception('Custom failure: ' ~ n) }}",
    "err_undefined_attr": "{{ nothing.attr }}",
    "err_add_str_int": "{{ 'a' + n }}",
    "err_none_iter": "{% for x in none %}{% endfor %}",
    "err_items_on_list": "{{ items|items|list }}",
    "err_undefined_item": "{{ nothing['x'] }}",
    "err_list_append": "{{ items.append(4) }}",
}


def load_templates(fixtures):
    out = {}
    for name in TEMPLATES:
        with open(os.path.join(fixtures, name + ".jinja"), encoding="utf-8") as fh:
            out[name] = fh.read()
    return out


class Renderer:
    """Renders through transformers when available, else a look-alike jinja2 env."""

    def __init__(self):
        self.kind = None
        self.info = {}
        try:
            import transformers
            from transformers.utils import chat_template_utils as ctu

            class _PinnedDatetime(_dt.datetime):
                @classmethod
                def now(cls, tz=None):
                    return PINNED_NOW

            patched = False
            if hasattr(ctu, "datetime"):
                ctu.datetime = _PinnedDatetime
                patched = True
            self.info["transformers"] = transformers.__version__
            self.info["datetime_patched"] = patched
            try:
                self.info["compile_source"] = inspect.getsource(ctu._compile_jinja_template)
            except Exception as e:  # noqa: BLE001
                self.info["compile_source"] = "unavailable: %r" % (e,)
            self.kind = "transformers.apply_chat_template"
        except ImportError:
            self.kind = "jinja2-lookalike (NOT a golden: no transformers here)"
        import jinja2
        self.info["jinja2"] = jinja2.__version__

    def _tokenizer(self, bos, eos, template):
        from tokenizers import Tokenizer, models
        from transformers import PreTrainedTokenizerFast

        vocab = {"<unk>": 0}
        for t in (bos, eos):
            if t is not None:
                vocab.setdefault(t, len(vocab))
        tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>")),
                                      bos_token=bos, eos_token=eos)
        tok.chat_template = template
        return tok

    def render(self, template, bos, eos, messages, tools, agp, extra):
        if self.kind.startswith("transformers"):
            tok = self._tokenizer(bos, eos, template)
            kwargs = dict(tools=tools, add_generation_prompt=agp, tokenize=False, **extra)
            try:
                out = tok.apply_chat_template(messages, return_dict=False, **kwargs)
            except TypeError:
                out = tok.apply_chat_template(messages, **kwargs)
            if isinstance(out, list):
                out = out[0]
            return out
        return self._lookalike(template, bos, eos, messages, tools, agp, extra)

    @staticmethod
    def _lookalike(template, bos, eos, messages, tools, agp, extra):
        import jinja2
        import jinja2.ext
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message):
            raise jinja2.exceptions.TemplateError(message)

        def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
            return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

        class Gen(jinja2.ext.Extension):
            tags = {"generation"}

            def parse(self, parser):
                lineno = next(parser.stream).lineno
                body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
                return jinja2.nodes.CallBlock(self.call_method("_pass"), [], [], body).set_lineno(lineno)

            def _pass(self, caller):
                return caller()

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=[Gen, jinja2.ext.loopcontrols])
        env.filters["tojson"] = tojson
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = lambda fmt: PINNED_NOW.strftime(fmt)
        ctx = {"bos_token": bos, "eos_token": eos}
        ctx = {k: v for k, v in ctx.items() if v is not None}
        ctx.update(extra)
        return env.from_string(template).render(messages=messages, tools=tools, documents=None,
                                                add_generation_prompt=agp, **ctx)


def run_case(r, tname, source, bos, eos, c):
    rec = {"template": tname, "name": c["name"], "messages": c["messages"], "tools": c["tools"],
           "add_generation_prompt": c["add_generation_prompt"], "extra": c["extra"],
           "bos_token": bos, "eos_token": eos}
    try:
        rec["expected"] = r.render(source, bos, eos, c["messages"], c["tools"], c["add_generation_prompt"],
                                   c["extra"])
    except Exception as e:  # noqa: BLE001  (TemplateError, UndefinedError, TypeError, ...)
        rec["error"] = str(e)
        rec["error_type"] = type(e).__name__
    return rec


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    fixtures, out_dir = sys.argv[1], sys.argv[2]
    r = Renderer()
    templates = load_templates(fixtures)
    cases = []
    for tname, toks in TEMPLATES.items():
        for c in COMMON + PER_TEMPLATE.get(tname, []):
            cases.append(run_case(r, tname, templates[tname], toks["bos_token"], toks["eos_token"], c))
    probes = []
    for pname, src in PROBES.items():
        rec = run_case(r, "probe", src, "<s>", "</s>", case(pname, [U1], extra=PROBE_VARS))
        rec["source"] = src
        rec["extra"] = PROBE_VARS
        probes.append(rec)
    # The pin must have reached transformers' strftime_now.
    check = r.render("{{ strftime_now('%Y-%m-%d %H:%M:%S') }}", None, None, [U1], None, False, {})
    if check != PINNED_NOW.strftime("%Y-%m-%d %H:%M:%S"):
        sys.exit("strftime_now is not pinned (got %r); the goldens would depend on today's date" % check)
    doc = {
        "renderer": r.kind,
        "versions": {k: v for k, v in r.info.items() if k != "compile_source"},
        "pinned_now": {"year": PINNED_NOW.year, "month": PINNED_NOW.month, "day": PINNED_NOW.day,
                       "hour": PINNED_NOW.hour, "minute": PINNED_NOW.minute, "second": PINNED_NOW.second,
                       "weekday_sunday0": (PINNED_NOW.weekday() + 1) % 7,
                       "yearday0": PINNED_NOW.timetuple().tm_yday - 1},
        "cases": cases + probes,
    }
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "goldens.json"), "w", encoding="utf-8") as fh:
        json.dump(doc, fh, ensure_ascii=False, indent=1)
        fh.write("\n")
    if "compile_source" in r.info:
        with open(os.path.join(out_dir, "transformers_jinja_env.txt"), "w", encoding="utf-8") as fh:
            fh.write(r.info["compile_source"])
    n_err = sum(1 for c in doc["cases"] if "error" in c)
    print("renderer: %s; %d cases (%d errors) -> %s" % (r.kind, len(doc["cases"]), n_err, out_dir))
    for c in doc["cases"]:
        if "error" in c:
            print("  error %s/%s: %s: %s" % (c["template"], c["name"], c["error_type"], c["error"][:120]))


if __name__ == "__main__":
    main()
