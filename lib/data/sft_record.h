// SFT records: Alpaca ({instruction, input, output}) and chat ({messages: [{role,
// content}]}) JSONL lines parsed into a list of messages (data/chat_template.h renders them).
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
