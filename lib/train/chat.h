// A conversation with a model (`dtrain chat`): each user message is rendered with the
// earlier turns through the model's SFT template (the generation prompt after it), and
// the answer is generated up to the template's end of turn; earlier turns that no longer
// fit max_seq_len with room for the answer are dropped, oldest first.
#pragma once

#include "data/chat_template.h"
#include "data/sft_record.h"
#include "data/tokenizer.h"
#include "model/model.h"
#include "train/sampling.h"

#include <cstdint>
#include <string>
#include <vector>

namespace dtrain::train {

struct ChatOptions {
  std::string system;        ///< a system message before every conversation ("" = none)
  int max_new_tokens = 64;   ///< per answer
  SamplingOptions sampling;  ///< answer k (from 0) samples with seed sampling.seed + k
};

struct ChatReply {
  std::string text;           ///< the answer, without its end-of-turn token
  int prompt_tokens = 0;      ///< the rendered conversation the model was given
  int new_tokens = 0;         ///< generated, the end-of-turn token included
  bool ended = false;         ///< stopped at an end-of-turn / eos token (else at max_new_tokens or max_seq_len)
  int dropped_exchanges = 0;  ///< earlier user/assistant pairs dropped from the history for this answer
  bool prompt_cut = false;    ///< even alone, the message filled max_seq_len: only its last tokens were used
};

class ChatSession {
 public:
  ChatSession(model::Model& m, const data::Tokenizer& tokenizer, data::SftTemplate tmpl, ChatOptions options);

  /// Answers `user` after the conversation so far, and adds both turns to it.
  ChatReply reply(const std::string& user);

  /// Forgets the conversation (the system message stays).
  void reset();

  /// User/assistant exchanges in the history.
  size_t exchanges() const { return history_.size() / 2; }

 private:
  model::Model& m_;
  const data::Tokenizer& tok_;
  data::SftTemplate tmpl_;
  ChatOptions o_;
  std::vector<data::SftMessage> history_;  // user, assistant, user, assistant, ...
  uint64_t answers_ = 0;

  std::vector<int32_t> render(const std::string& user) const;
};

}  // namespace dtrain::train
