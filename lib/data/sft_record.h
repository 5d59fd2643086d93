// SFT records: Alpaca ({instruction, input, output}) and chat ({messages: [{role,
// content}]}) JSONL lines parsed into a list of messages (data/chat_template.h renders them);
// and preference records, one prompt with a chosen and a rejected answer (data/pairwise.h).
#pragma once

#include <cstddef>
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
  std::string source;  // "file:line" for errors; "" when not from a file
};

// A preference pair: the conversation up to the answer (ending with a user turn) and two
// answers to it, the better (chosen) and the worse (rejected).
struct PairRecord {
  std::vector<SftMessage> prompt;
  std::string chosen, rejected;
  std::string source;  // "file:line" for errors

  // The prompt followed by the chosen (or rejected) answer as an assistant turn.
  SftRecord side(bool chosen_side) const {
    SftRecord r;
    r.messages = prompt;
    r.messages.push_back({SftRole::ASSISTANT, chosen_side ? chosen : rejected, {}});
    r.source = source;
    return r;
  }
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

}  // namespace dtrain::data
