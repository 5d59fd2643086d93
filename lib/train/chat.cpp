// ChatSession: history, rendering through the SFT template, and the history's trimming to
// the model's max_seq_len.
#include "train/chat.h"

#include "core/check.h"
#include "train/evaluate.h"

#include <algorithm>
#include <utility>

namespace dtrain::train {

ChatSession::ChatSession(model::Model& m, const data::Tokenizer& tokenizer, data::SftTemplate tmpl, ChatOptions options)
    : m_(m), tok_(tokenizer), tmpl_(std::move(tmpl)), o_(std::move(options)) {
  DT_ENFORCE(o_.max_new_tokens >= 1, UsageError, "max new tokens must be at least 1, got {}", o_.max_new_tokens);
  TokenSampler check(o_.sampling);  // refuses bad sampling options now, not at the first answer
}

void ChatSession::reset() { history_.clear(); }

std::vector<int32_t> ChatSession::render(const std::string& user) const {
  data::SftRecord rec;
  if (!o_.system.empty()) rec.messages.push_back({data::SftRole::SYSTEM, o_.system, ""});
  rec.messages.insert(rec.messages.end(), history_.begin(), history_.end());
  rec.messages.push_back({data::SftRole::USER, user, ""});
  return data::sft_render_generation(rec, tok_, tmpl_).tokens;
}

ChatReply ChatSession::reply(const std::string& user) {
  ChatReply r;
  const size_t max_len = static_cast<size_t>(m_.config().max_seq_len);
  const size_t room = static_cast<size_t>(o_.max_new_tokens);
  std::vector<int32_t> prompt = render(user);
  // Oldest exchanges out until the prompt leaves room for a whole answer (or none is left).
  while (!history_.empty() && prompt.size() + room > max_len) {
    history_.erase(history_.begin(), history_.begin() + 2);
    ++r.dropped_exchanges;
    prompt = render(user);
  }
  r.prompt_tokens = static_cast<int>(prompt.size());
  r.prompt_cut = prompt.size() >= max_len;  // generate_batch keeps its last max_len - 1 tokens
  SamplingOptions s = o_.sampling;
  s.seed = o_.sampling.seed + answers_++;
  const std::vector<int32_t> stops = data::sft_stop_ids(tok_);
  std::vector<int32_t> gen = generate_batch(m_, {prompt}, o_.max_new_tokens, stops, s, 1, tok_.vocab_size())[0];
  r.new_tokens = static_cast<int>(gen.size());
  r.ended = !gen.empty() && std::find(stops.begin(), stops.end(), gen.back()) != stops.end();
  if (r.ended) gen.pop_back();
  r.text = tok_.decode(gen);
  history_.push_back({data::SftRole::USER, user, ""});
  history_.push_back({data::SftRole::ASSISTANT, r.text, ""});
  return r;
}

}  // namespace dtrain::train
