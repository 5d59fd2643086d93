// `dtrain eval`, `dtrain generate` and `dtrain data prepare`: thin printing wrappers over
// lib/train (evaluate) and lib/data (prepare). main.cpp registers them; each returns the
// exit code.
#include "commands.h"
#include "config/train_config.h"
#include "core/check.h"
#include "data/prepare.h"
#include "data/sft.h"
#include "train/data_loader.h"
#include "train/evaluate.h"

#include <algorithm>
#include <cstdio>
#include <string>

namespace dtrain::cli {

namespace {
// A generated answer as the checker sees it: up to the first special token / newline.
std::string shown(const std::string& g) {
  const size_t cut = std::min(g.find("<|"), g.find('\n'));
  return cut == std::string::npos ? g : g.substr(0, cut);
}
}  // namespace

// ----------------------------------------------------------------------------
// Evaluates dir (a run directory, a run's final/ or an HF model directory; see
// train::eval_target_load) on an SFT JSONL file: held-out task accuracy over the first
// max_records records (<= 0: all), then the validation loss over the whole file.
// data_jsonl "" = the config's data.valid. init_weights evaluates the config's initial
// model instead of the trained one (the "before training" figure).
int run_eval(const std::string& run_dir_or_model_dir, const std::string& data_jsonl, int max_records,
             const std::string& config_override_path, bool init_weights) {
  train::EvalTarget t = train::eval_target_load(run_dir_or_model_dir, config_override_path, init_weights);
  const std::string jsonl = data_jsonl.empty() ? t.valid : data_jsonl;
  DT_ENFORCE(!jsonl.empty(), UsageError,
             "{}: no evaluation data: pass --data FILE.jsonl (the config has no data.valid)", run_dir_or_model_dir);
  // The tasks are instruction/response records; a plain-text or token-shard run's
  // data.valid is not one (its JSON parser would only say "invalid JSON").
  // A run whose config left data.format to detection (auto) holds what the file holds.
  std::string format = data_jsonl.empty() && t.cfg ? t.cfg->data.format : "";
  if (format == "auto") format = data::data_format_detect(jsonl).name;
  if (format == "text" || format == "tokens")
    DT_THROW(UsageError,
             "{}: the run trained on data.format {} ({}), but dtrain eval measures task accuracy on SFT records "
             "(alpaca or chat JSONL): pass --data FILE.jsonl with such records",
             run_dir_or_model_dir, format, jsonl);
  std::printf("eval: %s on %s\n", t.weights.c_str(), jsonl.c_str());
  train::TaskAccuracy acc = train::eval_tasks(*t.model, *t.tokenizer, jsonl, t.template_name, max_records);
  for (const auto& e : acc.examples)
    std::printf("  [%s] expected %-16s got %s\n", e.correct ? "ok" : "--", ("'" + e.expected + "'").c_str(),
                ("'" + shown(e.generated) + "'").c_str());
  std::printf("accuracy %d/%d = %.1f%%\n", acc.correct, acc.total, acc.percent());

  config::DataConfig dcfg;
  dcfg.format = "sft";
  dcfg.template_name = t.template_name;
  dcfg.pack = false;
  const data::TokenDataset ds = train::dataset_load(jsonl, dcfg, *t.tokenizer, t.seq_len);
  const train::EvalLoss l = train::eval_loss(*t.model, ds, 8);
  std::printf("eval_loss %.4f | eval_ppl %.3f | %lld tokens\n", l.mean(), l.ppl(), static_cast<long long>(l.tokens));
  std::fflush(stdout);
  return 0;
}

// Generation from dir's model, greedy or sampled (sampling; stops at the template's end of
// turn / eos). The prompt is an instruction rendered with the
// model's SFT template unless raw, in which case it is tokenized as it is.
int run_generate(const std::string& dir, const std::string& prompt, int max_new_tokens, bool raw, bool init_weights,
                 const train::SamplingOptions& sampling) {
  train::EvalTarget t = train::eval_target_load(dir, "", init_weights);
  std::vector<int32_t> ids;
  if (raw) {
    ids = t.tokenizer->encode(prompt);
  } else {
    data::SftRecord rec;
    rec.messages.push_back({data::SftRole::USER, prompt, ""});
    rec.messages.push_back({data::SftRole::ASSISTANT, "", ""});
    ids = data::sft_render_prompt(rec, *t.tokenizer, data::sft_template_parse(t.template_name, t.tokenizer.get()));
  }
  // The model sees at most max_seq_len tokens: a longer prompt is cut to its last
  // max_seq_len - 1 tokens (generate_greedy_batch), which leaves room for one new token.
  // Said, not silent.
  const int64_t max_len = t.model->config().max_seq_len;
  const int64_t n = static_cast<int64_t>(ids.size());
  if (n >= max_len)
    std::fprintf(stderr,
                 "generate: the prompt is %lld tokens%s, and the model's max_seq_len is %lld: only its last %lld "
                 "tokens are used, leaving room for 1 new token; shorten the prompt\n",
                 static_cast<long long>(n), raw ? "" : " with its template", static_cast<long long>(max_len),
                 static_cast<long long>(max_len - 1));
  else if (n + max_new_tokens > max_len)
    std::fprintf(stderr,
                 "generate: the prompt is %lld tokens of the model's max_seq_len %lld: at most %lld new tokens\n",
                 static_cast<long long>(n), static_cast<long long>(max_len), static_cast<long long>(max_len - n));
  const std::vector<int32_t> stops = data::sft_stop_ids(*t.tokenizer);
  std::vector<int32_t> gen =
      train::generate_batch(*t.model, {ids}, max_new_tokens, stops, sampling, 1, t.tokenizer->vocab_size())[0];
  if (!gen.empty() && std::find(stops.begin(), stops.end(), gen.back()) != stops.end()) gen.pop_back();
  const std::string out = t.tokenizer->decode(gen);
  std::printf("%s\n", raw ? (prompt + out).c_str() : out.c_str());
  std::fflush(stdout);
  return 0;
}

// Tokenizes the input (format text | alpaca | chat | sft, or LLaMA-Factory datasets) with
// the tokenizer ("byte" or a tokenizer.json path) into the token shard, streaming on
// `threads` threads (0: all cores) in chunks of chunk_mb MB, a progress line each second.
int run_data_prepare(const DataPrepareArgs& a) {
  data::DataPrepareOptions opts;
  opts.threads = a.threads;
  opts.chunk_bytes = static_cast<size_t>(a.chunk_mb * 1e6);
  opts.dataset = a.dataset;
  opts.sft_template = a.template_name;
  opts.train_on_prompt = a.train_on_prompt;
  opts.progress = true;
  opts.force = a.force;
  const data::DataPrepareStats s =
      data::data_prepare(a.input, data::data_format_parse(a.format), a.tokenizer, a.output, opts);
  const std::string pairs = s.pairwise ? " (" + std::to_string(s.documents / 2) + " chosen/rejected pairs)" : "";
  std::printf("wrote %s: %zu documents%s, %zu tokens, %zu trained\n", a.output.c_str(), s.documents, pairs.c_str(),
              s.tokens, s.trained_tokens);
  return 0;
}

}  // namespace dtrain::cli
