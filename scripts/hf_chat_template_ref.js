// Reference chat-template renderer for tests/data/chat_template_test.cpp: the model's own
// chat_template (tokenizer_config.json) rendered as transformers.js's apply_chat_template
// does it, with @huggingface/jinja (Hugging Face's JS Jinja for chat templates; the copy
// bundled in @lenml/tokenizers cannot parse Qwen3's template), and the rendered string
// tokenized by @lenml/tokenizers (all fetched by scripts/fetch_test_assets.sh).
//   node hf_chat_template_ref.js NODE_MODULES TOKENIZER_DIR CASES.json OUT.json
//     CASES.json: [{"messages": [{"role", "content"}...], "add_generation_prompt": bool}, ...]
//     OUT.json:   {"texts": [rendered string, ...], "ids": [[token ids of it], ...]}
//     (enable_thinking is false for every case: templates without it ignore it).
const fs = require('fs');
const path = require('path');
const [modules, dir, casesPath, out] = process.argv.slice(2);
const { TokenizerLoader } = require(path.join(modules, '@lenml', 'tokenizers'));
const tok = TokenizerLoader.fromPreTrained({
  tokenizerJSON: JSON.parse(fs.readFileSync(path.join(dir, 'tokenizer.json'), 'utf8')),
  tokenizerConfig: JSON.parse(fs.readFileSync(path.join(dir, 'tokenizer_config.json'), 'utf8')),
});
const { Template } = require(path.join(modules, '@huggingface', 'jinja'));
const config = JSON.parse(fs.readFileSync(path.join(dir, 'tokenizer_config.json'), 'utf8'));
let source = config.chat_template;
if (Array.isArray(source)) source = source.find((t) => t.name === 'default').template;
const template = new Template(source);
// The special tokens transformers.js passes to every template.
const specials = {};
for (const k of ['bos_token', 'eos_token', 'unk_token', 'sep_token', 'pad_token', 'cls_token', 'mask_token']) {
  const v = config[k];
  if (v) specials[k] = typeof v === 'string' ? v : v.content;
}
const cases = JSON.parse(fs.readFileSync(casesPath, 'utf8'));
const texts = [], ids = [];
for (const c of cases) {
  const text = template.render({ messages: c.messages, add_generation_prompt: c.add_generation_prompt,
                                 enable_thinking: false, tools: null, documents: null, ...specials });
  texts.push(text);
  ids.push(Array.from(tok.encode(text, { add_special_tokens: false })));
}
fs.writeFileSync(out, JSON.stringify({ texts, ids }));
