// Chat templates: an SFT record rendered, character for character, the way a model
// family's own Hugging Face chat_template renders it, tokenized piece by piece, with a
// loss mask on the assistant turns; and `auto`, which reads the template's family from a
// model directory's tokenizer_config.json.
#pragma once

#include "data/sft_record.h"
#include "data/tokenizer.h"

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace dtrain::data {

// PLAIN (Alpaca):  [system + "\n\n"]
//                  "### Instruction:\n" + user + "\n\n" [+ "### Input:\n" + input + "\n\n"]
//                  + "### Response:\n"  then  assistant + <eos>            (masked)
//                  further turns are separated by "\n\n" (unmasked).
// CHATML:          "<|im_start|>" + role + "\n" + content + "<|im_end|>\n" per message;
//                  an Alpaca input is appended to the user content after "\n\n".
// QWEN:            CHATML with a default system message when the record has none
//                  (Qwen2.5's "You are Qwen, created by Alibaba Cloud. You are a helpful
//                  assistant.", or Qwen2's when `auto` found that one).
// QWEN3:           CHATML as Qwen3's template renders it with thinking off: an assistant
//                  turn after the last user message gets "<think>\n\n</think>\n\n" before
//                  its content (reasoning the content carries in <think>..</think> is kept
//                  there and dropped from earlier turns, as the template does); the
//                  generation prompt ends "<|im_start|>assistant\n<think>\n\n</think>\n\n".
// LLAMA3:          <bos> then "<|start_header_id|>" + role + "<|end_header_id|>\n\n" +
//                  trim(content) + "<|eot_id|>" per message.
// LLAMA2:          per user turn <bos> "[INST] " + strip(content) + " [/INST]", the system
//                  message inside the first one as "<<SYS>>\n" + system + "\n<</SYS>>\n\n";
//                  per assistant turn " " + strip(content) + " " + <eos>.
// MISTRAL (v0.3):  <bos>, per user turn "[INST] " + content + "[/INST]", per assistant turn
//                  " " + trim(content) + <eos>. The template puts the system message before
//                  the LAST user message ("[INST] " + system + "\n\n" + content), and only
//                  when the conversation ends there; dtrain puts it into the record's last
//                  user turn, so the final turn is trained on the prompt inference renders.
// LLAMA2 and MISTRAL need user/assistant turns alternating after an optional first system
// message (their templates raise otherwise): ConfigError.
//
// The mask covers each assistant turn's content and its end of turn (<|im_end|>,
// <|eot_id|> or <eos>, and for LLAMA2/MISTRAL the " " before it), every turn, not only the
// last; train_on_prompt masks nothing (every token trains, as LLaMA-Factory's option).
// Template text goes through Tokenizer::encode's special tokens only where the template
// writes one (so "<|im_start|>" is one token when the tokenizer has it); message contents
// never match special tokens, so text in the data cannot forge one.
struct SftTemplate {
  enum Kind { PLAIN, CHATML, QWEN, QWEN3, LLAMA3, LLAMA2, MISTRAL };
  Kind kind = PLAIN;
  std::string default_system;  // QWEN: the system message of records that have none

  SftTemplate(Kind k = PLAIN);  // NOLINT(google-explicit-constructor): SftTemplate::CHATML reads well
  bool operator==(const SftTemplate&) const = default;
};

// The names data.template accepts besides "auto": plain alpaca chatml qwen qwen3 llama3 llama2 mistral.
const std::vector<std::string>& sft_template_names();

// A name (above) -> its template. "auto" reads the chat_template of the directory that
// holds the tokenizer (tokenizer->name() is "bpe:<path>"), see sft_template_detect; it
// needs a tokenizer loaded from a file. Anything else: ConfigError listing the names.
SftTemplate sft_template_parse(std::string_view name, const Tokenizer* tokenizer = nullptr);

// The family of the chat_template in MODEL_DIR's tokenizer_config.json (a string, or the
// "default" of a list of named templates), else of MODEL_DIR/chat_template.jinja:
// "<|start_header_id|>" -> llama3; "<|im_start|>" with "<think>" or enable_thinking ->
// qwen3, with a default "You are ..." system message -> qwen (that message), else chatml;
// "<<SYS>>" -> llama2; "[INST]" -> mistral. ConfigError naming the file when there is no
// chat_template (a base model) or none of these markers.
SftTemplate sft_template_detect(const std::string& model_dir);

struct SftTokens {
  std::vector<int32_t> tokens;
  std::vector<uint8_t> mask;  // 1 = trained on (assistant turns), 0 = prompt
  std::string text;           // the rendered string (special tokens as their text)
};

// The whole record. add_bos prepends the tokenizer's bos (unmasked) for the templates that
// do not write one themselves (PLAIN, CHATML, QWEN, QWEN3).
SftTokens sft_render(const SftRecord& record, const Tokenizer& tokenizer, const SftTemplate& tmpl, bool add_bos = false,
                     bool train_on_prompt = false);

// All of the record's messages (a conversation ending with a user turn) and the template's
// generation prompt: what the model is given to answer next (add_generation_prompt).
SftTokens sft_render_generation(const SftRecord& record, const Tokenizer& tokenizer, const SftTemplate& tmpl,
                                bool add_bos = false);

// The messages before the record's first assistant turn and the generation prompt: what a
// model is given to answer that turn (evaluation, `dtrain generate`).
std::vector<int32_t> sft_render_prompt(const SftRecord& record, const Tokenizer& tokenizer, const SftTemplate& tmpl,
                                       bool add_bos = false);

// Token ids that end an answer: eos and, when the tokenizer has them, <|im_end|> and <|eot_id|>.
std::vector<int32_t> sft_stop_ids(const Tokenizer& tokenizer);

}  // namespace dtrain::data
