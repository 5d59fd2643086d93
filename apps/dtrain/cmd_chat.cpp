// `dtrain chat`: a conversation with a run's model through its chat template
// (train::ChatSession). On a terminal a "> " prompt per message; from a pipe each
// non-blank line is a message and gets exactly one line of answer (escaped), so a script
// can pair them. What is dropped or cut to fit max_seq_len is said on stderr.
#include "commands.h"
#include "core/check.h"
#include "data/chat_template.h"
#include "train/chat.h"
#include "train/evaluate.h"

#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <string>

namespace dtrain::cli {

namespace {

// One line for an answer: backslash, newline, carriage return written as \\, \n, \r.
std::string one_line(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    if (c == '\\') out += "\\\\";
    else if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else out += c;
  }
  return out;
}

}  // namespace

int run_chat(const ChatArgs& a) {
  train::EvalTarget t = train::eval_target_load(a.dir, "", a.init);
  train::ChatOptions opts;
  opts.system = a.system;
  opts.max_new_tokens = a.max_new_tokens;
  opts.sampling = a.sampling;
  const data::SftTemplate tmpl = data::sft_template_parse(t.template_name, t.tokenizer.get());
  train::ChatSession chat(*t.model, *t.tokenizer, tmpl, opts);
  const bool tty = ::isatty(STDIN_FILENO) == 1;
  const int max_len = t.model->config().max_seq_len;
  if (tty)
    std::fprintf(stderr, "chat: %s, template %s, max_seq_len %d, %s; Ctrl-D ends, /reset forgets the conversation\n",
                 t.weights.c_str(), t.template_name.c_str(), max_len, a.sampling.greedy() ? "greedy" : "sampling");
  for (std::string line;;) {
    if (tty) {
      std::fputs("> ", stdout);
      std::fflush(stdout);
    }
    if (!std::getline(std::cin, line)) break;
    if (!line.empty() && line.back() == '\r') line.pop_back();  // a CRLF file
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    if (tty && line == "/reset") {
      chat.reset();
      std::fputs("(conversation forgotten)\n", stderr);
      continue;
    }
    const train::ChatReply r = chat.reply(line);
    if (r.dropped_exchanges > 0)
      std::fprintf(stderr,
                   "chat: dropped the %d earliest exchange(s) of the conversation: with them the prompt would leave "
                   "less than --max-new-tokens %d of the model's max_seq_len %d\n",
                   r.dropped_exchanges, a.max_new_tokens, max_len);
    if (r.prompt_cut)
      std::fprintf(stderr,
                   "chat: the message is %d tokens with its template, and the model's max_seq_len is %d: only its "
                   "last %d tokens were used, leaving room for 1 new token; shorten the message\n",
                   r.prompt_tokens, max_len, max_len - 1);
    else if (!r.ended && r.prompt_tokens + a.max_new_tokens > max_len)
      std::fprintf(stderr, "chat: the answer was cut at the model's max_seq_len %d\n", max_len);
    const std::string shown = (tty ? r.text : one_line(r.text)) + "\n";
    std::fwrite(shown.data(), 1, shown.size(), stdout);
    std::fflush(stdout);
  }
  if (tty) std::fputs("\n", stdout);
  return 0;
}

}  // namespace dtrain::cli
