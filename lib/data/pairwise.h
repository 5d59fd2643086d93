// Preference (pairwise) data: JSONL records of one prompt and two answers, chosen and
// rejected, in alpaca or sharegpt shape (as LLaMA-Factory's ranking datasets), and a pair
// rendered through a chat template into two token sequences that train only on the answer.
#pragma once

#include "data/chat_template.h"
#include "data/sft_record.h"
#include "data/tokenizer.h"

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace dtrain::data {

// One line of a pairwise JSONL file (data.format pairwise), its shape told by its keys:
//  - "conversations": sharegpt, {"from", "value"} turns (human/observation, gpt/function_call,
//    an optional first system) ending with a human turn; "chosen" and "rejected" are
//    {"from": "gpt", "value": ...} messages; optional "system";
//  - "messages": the same with {"role", "content"} turns (user, assistant, system);
//  - else alpaca: "instruction" (+ "\n" + "input" when not empty), optional "system" and
//    "history" ([[prompt, answer], ...]); "chosen" and "rejected" answer strings.
// Any other shape is a ConfigError "file:line: ..." naming the field.
PairRecord pair_parse_line(std::string_view line, const std::string& file, size_t line_no);

// Every non-blank line of a pairwise JSONL file. IoError when unreadable, ConfigError
// (file:line) on the first malformed line.
std::vector<PairRecord> pair_load_jsonl(const std::string& path);

struct PairTokens {
  SftTokens chosen, rejected;
  size_t chosen_prompt = 0, rejected_prompt = 0;  // tokens before each side's answer
};

// Renders prompt + chosen and prompt + rejected with the template (sft_render). The mask
// covers only the final answer turn (its content and end of turn), never a history
// answer of the prompt: LLaMA-Factory's pairwise encoding. train_on_prompt: every token
// trains. With every template both sides start with the same prompt tokens, except qwen3
// when one answer carries <think> reasoning (its think block is then the answer's).
PairTokens pair_render(const PairRecord& record, const Tokenizer& tokenizer, const SftTemplate& tmpl,
                       bool add_bos = false, bool train_on_prompt = false);

}  // namespace dtrain::data
