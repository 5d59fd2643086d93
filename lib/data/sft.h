// Supervised fine-tuning records: Alpaca ({instruction, input, output}) and chat
// ({messages: [{role, content}]}) JSONL, rendered through a prompt template into
// tokens plus a loss mask that is true exactly on the response tokens.
#pragma once

#include "data/tokenizer.h"

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace dtrain::data {

// ---------------------------------------------------------------------------
// Records

enum class SftRole { SYSTEM, USER, ASSISTANT };

struct SftMessage {
  SftRole role = SftRole::USER;
  std::string content;
  // Alpaca's optional "input" (context for the instruction); user turns only.
  std::string input;
};

struct SftRecord {
  std::vector<SftMessage> messages;
};

// AUTO takes each line as chat when it has "messages", else as Alpaca.
enum class SftFormat { AUTO, ALPACA, CHAT };

// Parses one JSONL line. Alpaca: "instruction" and "output" strings required, "input"
// optional (string or null); becomes [user(instruction, input), assistant(output)].
// Chat: "messages" non-empty array of {role: system|user|assistant, content: string}
// with at least one assistant turn. Any other shape is a ConfigError "file:line: ...".
SftRecord sft_parse_line(std::string_view line, SftFormat format, const std::string& file, size_t line_no);

// Every non-blank line of a JSONL file. IoError when unreadable, ConfigError (with
// file:line) on the first malformed line.
std::vector<SftRecord> sft_load_jsonl(const std::string& path, SftFormat format = SftFormat::AUTO);

// ---------------------------------------------------------------------------
// Templates
//
// PLAIN (Alpaca):  [system + "\n\n"]
//                  "### Instruction:\n" + user + "\n\n" [+ "### Input:\n" + input + "\n\n"]
//                  + "### Response:\n"  then  assistant + <eos>            (masked)
//                  further turns are separated by "\n\n" (unmasked).
// CHATML:          "<|im_start|>" + role + "\n" + content + "<|im_end|>\n" per message;
//                  the mask covers an assistant turn's content + "<|im_end|>" (its end
//                  of turn); an Alpaca input is appended to the user content after "\n\n".
// Template text is encoded with Tokenizer::encode (so "<|im_start|>" becomes a special
// token when the tokenizer has one); message contents with encode_ordinary, so text in
// the data can never forge a special token. eos must exist for PLAIN (ConfigError).
enum class SftTemplate { PLAIN, CHATML };

// "plain" / "alpaca" -> PLAIN, "chatml" -> CHATML; otherwise ConfigError.
SftTemplate sft_template_parse(std::string_view name);

struct SftTokens {
  std::vector<int32_t> tokens;
  std::vector<uint8_t> mask;  // 1 = response token (trained on), 0 = prompt
};

// add_bos prepends the tokenizer's bos (unmasked) when it has one.
SftTokens sft_render(const SftRecord& record, const Tokenizer& tokenizer, SftTemplate tmpl, bool add_bos = false);

// The prompt for generation: everything up to where the first assistant answer starts
// (for evaluation: generate from it, then compare with sft_answer_matches).
std::vector<int32_t> sft_render_prompt(const SftRecord& record, const Tokenizer& tokenizer, SftTemplate tmpl,
                                       bool add_bos = false);

// Token ids that end an answer: eos and, when the tokenizer has it, <|im_end|>.
std::vector<int32_t> sft_stop_ids(const Tokenizer& tokenizer);

// ---------------------------------------------------------------------------
// Answer checking (the eval command). The generated text is cut at the first end
// marker (<|eos|>, <|endoftext|>, <|im_end|>, <|end_of_text|>, <|eot_id|>, </s>) and
// at "\n###" (a new plain-template section); then both sides are compared with runs of
// white space collapsed to one space and leading/trailing white space removed.
bool sft_answer_matches(const std::string& expected, const std::string& generated);

}  // namespace dtrain::data
