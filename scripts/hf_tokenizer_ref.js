// Reference encoder for the tokenizer tests and benchmark: Hugging Face's tokenizers as
// ported to JavaScript by @lenml/tokenizers (fetched by scripts/fetch_test_assets.sh).
//   node hf_tokenizer_ref.js NODE_MODULES TOKENIZER_DIR TEXTS.json OUT.json
//     encodes each string of TEXTS.json (no bos/eos added) and writes
//     {"ids": [[...], ...], "decoded": ["...", ...]} (decoded from the ids it produced).
//   node hf_tokenizer_ref.js NODE_MODULES TOKENIZER_DIR TEXTS.json --bench SECONDS
//     encodes the texts over and over for about SECONDS and prints tokens/s.
const fs = require('fs');
const path = require('path');
const [modules, dir, textsPath, out, benchSeconds] = process.argv.slice(2);
const { TokenizerLoader } = require(path.join(modules, '@lenml', 'tokenizers'));
const tok = TokenizerLoader.fromPreTrained({
  tokenizerJSON: JSON.parse(fs.readFileSync(path.join(dir, 'tokenizer.json'), 'utf8')),
  tokenizerConfig: JSON.parse(fs.readFileSync(path.join(dir, 'tokenizer_config.json'), 'utf8')),
});
const texts = JSON.parse(fs.readFileSync(textsPath, 'utf8'));
const encode = (t) => (t.length === 0 ? [] : tok.encode(t, { add_special_tokens: false }));
if (out === '--bench') {
  const limit = Number(benchSeconds || 5) * 1000;
  let tokens = 0, bytes = 0, passes = 0;
  const t0 = Date.now();
  while (Date.now() - t0 < limit && passes < 1000) {
    for (const t of texts) { tokens += encode(t).length; bytes += Buffer.byteLength(t); }
    ++passes;
  }
  const s = (Date.now() - t0) / 1000;
  console.log(JSON.stringify({ passes, tokens, bytes, seconds: s, tokens_per_s: tokens / s }));
} else {
  const ids = texts.map(encode);
  const decoded = ids.map((x) => (x.length === 0 ? '' : tok.decode(x, { skip_special_tokens: false })));
  fs.writeFileSync(out, JSON.stringify({ ids, decoded }));
}
