// `dtrain eval` (task accuracy, then the validation loss) and `dtrain generate` over
// eval_target_load's model: their data, format and prompt-length rules and their output.
#include "train/eval_run.h"

#include "config/train_config.h"
#include "core/check.h"
#include "data/prepare.h"
#include "data/sft.h"
#include "train/data_loader.h"
#include "train/evaluate.h"

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

namespace dtrain::train {

namespace {

// A generated answer as the checker sees it: up to the first special token / newline.
std::string shown(const std::string& g) {
  const size_t cut = std::min(g.find("<|"), g.find('\n'));
  return cut == std::string::npos ? g : g.substr(0, cut);
}

// The prompt's tokens: the instruction rendered with the model's SFT template, or raw.
std::vector<int32_t> generate_prompt(const EvalTarget& t, const GenerateRunOptions& o) {
  if (o.raw) return t.tokenizer->encode(o.prompt);
  data::SftRecord rec;
  rec.messages.push_back({data::SftRole::USER, o.prompt, ""});
  rec.messages.push_back({data::SftRole::ASSISTANT, "", ""});
  return data::sft_render_prompt(rec, *t.tokenizer, data::sft_template_parse(t.template_name, t.tokenizer.get()));
}

}  // namespace

void eval_run(const EvalRunOptions& o) {
  EvalTarget t = eval_target_load(o.dir, o.config_path, o.init_weights);
  const std::string jsonl = o.data_jsonl.empty() ? t.valid : o.data_jsonl;
  DT_ENFORCE(!jsonl.empty(), UsageError,
             "{}: no evaluation data: pass --data FILE.jsonl (the config has no data.valid)", o.dir);
  // The tasks are instruction/response records; a plain-text or token-shard run's
  // data.valid is not one (its JSON parser would only say "invalid JSON").
  // A run whose config left data.format to detection (auto) holds what the file holds.
  std::string format = o.data_jsonl.empty() && t.cfg ? t.cfg->data.format : "";
  if (format == "auto") format = data::data_format_detect(jsonl).name;
  if (format == "text" || format == "tokens")
    DT_THROW(UsageError,
             "{}: the run trained on data.format {} ({}), but dtrain eval measures task accuracy on SFT records "
             "(alpaca or chat JSONL): pass --data FILE.jsonl with such records",
             o.dir, format, jsonl);
  std::printf("eval: %s on %s\n", t.weights.c_str(), jsonl.c_str());
  TaskAccuracy acc = eval_tasks(*t.model, *t.tokenizer, jsonl, t.template_name, o.max_records);
  for (const auto& e : acc.examples)
    std::printf("  [%s] expected %-16s got %s\n", e.correct ? "ok" : "--", ("'" + e.expected + "'").c_str(),
                ("'" + shown(e.generated) + "'").c_str());
  std::printf("accuracy %d/%d = %.1f%%\n", acc.correct, acc.total, acc.percent());

  config::DataConfig dcfg;
  dcfg.format = "sft";
  dcfg.template_name = t.template_name;
  dcfg.pack = false;
  const data::TokenDataset ds = dataset_load(jsonl, dcfg, *t.tokenizer, t.seq_len);
  const EvalLoss l = eval_loss(*t.model, ds, 8);
  std::printf("eval_loss %.4f | eval_ppl %.3f | %lld tokens\n", l.mean(), l.ppl(), static_cast<long long>(l.tokens));
  std::fflush(stdout);
}

void generate_run(const GenerateRunOptions& o) {
  EvalTarget t = eval_target_load(o.dir, "", o.init_weights);
  const std::vector<int32_t> ids = generate_prompt(t, o);
  // The model sees at most max_seq_len tokens: a longer prompt is cut to its last
  // max_seq_len - 1 tokens (generate_greedy_batch), which leaves room for one new token.
  // Said, not silent.
  const int64_t max_len = t.model->config().max_seq_len;
  const int64_t n = static_cast<int64_t>(ids.size());
  if (n >= max_len)
    std::fprintf(stderr,
                 "generate: the prompt is %lld tokens%s, and the model's max_seq_len is %lld: only its last %lld "
                 "tokens are used, leaving room for 1 new token; shorten the prompt\n",
                 static_cast<long long>(n), o.raw ? "" : " with its template", static_cast<long long>(max_len),
                 static_cast<long long>(max_len - 1));
  else if (n + o.max_new_tokens > max_len)
    std::fprintf(stderr,
                 "generate: the prompt is %lld tokens of the model's max_seq_len %lld: at most %lld new tokens\n",
                 static_cast<long long>(n), static_cast<long long>(max_len), static_cast<long long>(max_len - n));
  const std::vector<int32_t> stops = data::sft_stop_ids(*t.tokenizer);
  std::vector<int32_t> gen =
      generate_batch(*t.model, {ids}, o.max_new_tokens, stops, o.sampling, 1, t.tokenizer->vocab_size())[0];
  if (!gen.empty() && std::find(stops.begin(), stops.end(), gen.back()) != stops.end()) gen.pop_back();
  const std::string out = t.tokenizer->decode(gen);
  std::printf("%s\n", o.raw ? (o.prompt + out).c_str() : out.c_str());
  std::fflush(stdout);
}

}  // namespace dtrain::train
