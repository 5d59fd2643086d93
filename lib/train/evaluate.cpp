// Validation loss, batched greedy or sampled generation and SFT task accuracy on the CPU model.
#include "train/evaluate.h"

#include "core/check.h"
#include "core/input_file.h"
#include "core/log.h"
#include "train/checkpoint_export.h"
#include "train/model_factory.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>

namespace dtrain::train {

double EvalLoss::mean() const {
  return tokens > 0 ? loss_sum / static_cast<double>(tokens) : std::numeric_limits<double>::quiet_NaN();
}
double EvalLoss::ppl() const { return std::exp(mean()); }

int eval_forwards(const data::TokenDataset& dataset, int batch_size, size_t max_samples, int world_size) {
  const size_t n = max_samples > 0 ? std::min(max_samples, dataset.size()) : dataset.size();
  const size_t W = static_cast<size_t>(std::max(1, world_size)), B = static_cast<size_t>(std::max(1, batch_size));
  return static_cast<int>(((n + W - 1) / W + B - 1) / B);
}

EvalLoss eval_loss(model::Model& m, const data::TokenDataset& dataset, int batch_size, size_t max_samples, int rank,
                   int world_size, int forwards) {
  DT_ENFORCE_GT(batch_size, 0, InternalError, "eval batch size");
  DT_ENFORCE(rank >= 0 && rank < world_size, InternalError, "eval rank {} of {}", rank, world_size);
  model::EvalScope mode(m);
  const size_t n = max_samples > 0 ? std::min(max_samples, dataset.size()) : dataset.size();
  std::vector<size_t> mine;
  for (size_t i = static_cast<size_t>(rank); i < n; i += static_cast<size_t>(world_size)) mine.push_back(i);
  const int T = static_cast<int>(dataset.seq_len());
  // A pairwise dataset's sample is two rows (chosen, rejected): both are scored.
  const int rows = dataset.rows_per_sample();
  EvalLoss out;
  std::vector<int32_t> inputs, targets, doc_start;
  int made = 0;
  for (size_t b = 0; b < mine.size(); b += static_cast<size_t>(batch_size)) {
    const size_t e = std::min(mine.size(), b + static_cast<size_t>(batch_size));
    std::vector<size_t> idx(mine.begin() + static_cast<ptrdiff_t>(b), mine.begin() + static_cast<ptrdiff_t>(e));
    inputs.resize(static_cast<size_t>(rows) * idx.size() * static_cast<size_t>(T));
    targets.resize(inputs.size());
    doc_start.resize(dataset.doc_starts() ? inputs.size() : 0);
    int32_t* ds = doc_start.empty() ? nullptr : doc_start.data();
    dataset.batch(idx, inputs.data(), targets.data(), ds);
    const float loss = m.forward(inputs.data(), targets.data(), rows * static_cast<int>(idx.size()), T, nullptr, ds);
    out.loss_sum += static_cast<double>(loss) * m.num_targets();
    out.tokens += m.num_targets();
    ++made;
  }
  // Forwards that count nothing (token 0, every target masked), of the batch shape.
  if (made < forwards) {
    inputs.assign(static_cast<size_t>(rows * batch_size) * static_cast<size_t>(T), 0);
    targets.assign(inputs.size(), -100);
    for (; made < forwards; ++made) m.forward(inputs.data(), targets.data(), rows * batch_size, T);
  }
  return out;
}

// ----------------------------------------------------------------------------
std::vector<std::vector<int32_t>> generate_greedy_batch(model::Model& m,
                                                        const std::vector<std::vector<int32_t>>& prompts,
                                                        int max_new_tokens, const std::vector<int32_t>& stop_ids,
                                                        int batch_size, int vocab_limit) {
  return generate_batch(m, prompts, max_new_tokens, stop_ids, SamplingOptions{}, batch_size, vocab_limit);
}

std::vector<std::vector<int32_t>> generate_batch(model::Model& m, const std::vector<std::vector<int32_t>>& prompts,
                                                 int max_new_tokens, const std::vector<int32_t>& stop_ids,
                                                 const SamplingOptions& sampling, int batch_size, int vocab_limit) {
  DT_ENFORCE_GT(batch_size, 0, InternalError, "generation batch size");
  model::EvalScope mode(m);
  const int max_T = m.config().max_seq_len;
  const int V = m.config().vocab_size;
  const int Vs = vocab_limit > 0 ? std::min(vocab_limit, V) : V;
  std::vector<std::vector<int32_t>> out(prompts.size());
  for (size_t b0 = 0; b0 < prompts.size(); b0 += static_cast<size_t>(batch_size)) {
    const size_t B = std::min(prompts.size() - b0, static_cast<size_t>(batch_size));
    std::vector<std::vector<int32_t>> ctx(B);
    size_t longest = 1;
    for (size_t r = 0; r < B; ++r) {
      const auto& p = prompts[b0 + r];
      const size_t keep = std::min(p.size(), static_cast<size_t>(max_T - 1));
      ctx[r].assign(p.end() - static_cast<ptrdiff_t>(keep), p.end());
      if (ctx[r].empty()) ctx[r].push_back(0);  // nothing to condition on: start from id 0
      longest = std::max(longest, ctx[r].size());
    }
    const int T = static_cast<int>(
        std::min<size_t>(static_cast<size_t>(max_T), longest + static_cast<size_t>(std::max(0, max_new_tokens))));
    std::vector<int32_t> tokens(B * static_cast<size_t>(T), 0);
    std::vector<char> done(B, 0);
    std::vector<TokenSampler> samplers;
    for (size_t r = 0; r < B; ++r) {
      SamplingOptions o = sampling;
      o.seed = sampling.seed + b0 + r;
      samplers.emplace_back(o);
    }
    for (int step = 0; step < max_new_tokens; ++step) {
      bool any = false;
      for (size_t r = 0; r < B; ++r) {
        if (ctx[r].size() >= static_cast<size_t>(T)) done[r] = 1;  // window full
        any = any || !done[r];
        if (!done[r]) std::copy(ctx[r].begin(), ctx[r].end(), tokens.begin() + static_cast<ptrdiff_t>(r * T));
      }
      if (!any) break;
      m.forward(tokens.data(), nullptr, static_cast<int>(B), T);  // causal: padding after a row's end is not seen
      const float* logits = m.logits();
      for (size_t r = 0; r < B; ++r) {
        if (done[r]) continue;
        const float* row = logits + (r * static_cast<size_t>(T) + ctx[r].size() - 1) * static_cast<size_t>(V);
        const int32_t next = samplers[r].next(row, Vs);
        ctx[r].push_back(next);
        out[b0 + r].push_back(next);
        if (std::find(stop_ids.begin(), stop_ids.end(), next) != stop_ids.end()) done[r] = 1;
      }
    }
  }
  return out;
}

std::string generate_greedy(model::Model& m, const data::Tokenizer& tokenizer, const std::vector<int32_t>& prompt,
                            int max_new_tokens, bool stop_at_eos) {
  const std::vector<int32_t> stops = stop_at_eos ? data::sft_stop_ids(tokenizer) : std::vector<int32_t>{};
  auto ids = generate_greedy_batch(m, {prompt}, max_new_tokens, stops, 1, tokenizer.vocab_size());
  return tokenizer.decode(ids[0]);
}

// ----------------------------------------------------------------------------
namespace {

const data::SftMessage* first_answer(const data::SftRecord& r) {
  for (const auto& msg : r.messages)
    if (msg.role == data::SftRole::ASSISTANT) return &msg;
  return nullptr;
}

}  // namespace

TaskAccuracy score_answers(const std::vector<data::SftRecord>& records, const std::vector<std::string>& generated,
                           const data::Tokenizer& tokenizer, data::SftTemplate tmpl, size_t keep_examples) {
  DT_ENFORCE_EQ(records.size(), generated.size(), InternalError, "score_answers: one generation per record");
  TaskAccuracy acc;
  for (size_t i = 0; i < records.size(); ++i) {
    const data::SftMessage* ans = first_answer(records[i]);
    DT_ENFORCE(ans != nullptr, ConfigError, "record {} has no assistant answer to compare with", i + 1);
    const bool ok = data::sft_answer_matches(ans->content, generated[i]);
    acc.correct += ok ? 1 : 0;
    acc.total += 1;
    if (acc.examples.size() < keep_examples)
      acc.examples.push_back(
          {tokenizer.decode(data::sft_render_prompt(records[i], tokenizer, tmpl)), ans->content, generated[i], ok});
  }
  return acc;
}

TaskAccuracy eval_tasks(model::Model& m, const data::Tokenizer& tokenizer, const std::string& jsonl,
                        const std::string& template_name, int max_records, int max_new_tokens) {
  std::vector<data::SftRecord> records = data::sft_load_jsonl(jsonl);
  if (max_records > 0 && records.size() > static_cast<size_t>(max_records))
    records.resize(static_cast<size_t>(max_records));
  const data::SftTemplate tmpl = data::sft_template_parse(template_name, &tokenizer);
  std::vector<std::vector<int32_t>> prompts;
  size_t longest_answer = 0;
  for (const auto& r : records) {
    prompts.push_back(data::sft_render_prompt(r, tokenizer, tmpl));
    if (const data::SftMessage* a = first_answer(r))
      longest_answer = std::max(longest_answer, tokenizer.encode_ordinary(a->content).size());
  }
  const int new_tokens = max_new_tokens > 0 ? max_new_tokens : static_cast<int>(longest_answer) + 8;
  auto ids = generate_greedy_batch(m, prompts, new_tokens, data::sft_stop_ids(tokenizer), 16, tokenizer.vocab_size());
  std::vector<std::string> generated;
  generated.reserve(ids.size());
  for (const auto& g : ids) generated.push_back(tokenizer.decode(g));
  return score_answers(records, generated, tokenizer, tmpl);
}

// ----------------------------------------------------------------------------
EvalTarget eval_target_load(const std::string& dir, const std::string& config_path, bool init_weights) {
  namespace fs = std::filesystem;
  EvalTarget t;
  // A link loop or a FIFO given as the directory is named here, not met as a
  // filesystem_error (or a blocked read) further on.
  input_dir_check(dir, "model or run directory");
  // Each name is looked for with lstat: a config.yaml or config.json that is a broken link
  // or a loop is opened, and the input rule names what is wrong with it.
  const auto present = [&](const fs::path& p) { return input_present(p.string(), "model or run directory file"); };
  std::string cfg_file = config_path;
  if (cfg_file.empty() && present(fs::path(dir) / "config.yaml")) cfg_file = (fs::path(dir) / "config.yaml").string();
  if (!cfg_file.empty()) t.cfg = config::config_load_file(cfg_file).cfg;

  const fs::path final_dir = fs::path(dir) / "final";
  if (init_weights) {
    DT_ENFORCE(t.cfg.has_value(), UsageError,
               "{}: --init needs the config of the model to initialise: {} has no config.yaml; pass --config", dir,
               dir);
    t.model = model_create(*t.cfg);
    t.weights = t.cfg->model.init_from.empty() ? fmt::format("initial weights (seed {})", t.cfg->training.seed)
                                               : "initial weights (" + t.cfg->model.init_from + ")";
  } else if (present(final_dir / "config.json")) {
    t.model = model_load_hf_dir(final_dir.string());
    t.weights = final_dir.string();
  } else if (present(fs::path(dir) / "config.json")) {
    t.model = model_load_hf_dir(dir);
    t.weights = dir;
  } else if (present(fs::path(dir) / "checkpoints")) {
    // A run that stopped before writing final/ (interrupted, failed, still running):
    // its latest complete checkpoint, said on stderr, never the initial weights.
    CheckpointModel cm = checkpoint_model_load(dir);
    for (const auto& why : cm.info.skipped) log_warn("skipped a damaged checkpoint: {}", why);
    log_warn("{} has no final/ model (the run did not finish): using its latest complete checkpoint {} (step {})", dir,
             cm.info.checkpoint_dir, cm.info.step);
    t.model = std::move(cm.model);
    t.weights = fmt::format("{} (step {})", cm.info.checkpoint_dir, cm.info.step);
    if (!t.cfg) t.cfg = std::move(cm.cfg);
  } else {
    DT_THROW(UsageError,
             "{}: no final/ model, no checkpoints/ and no config.json: pass a run directory, its final/ or a Hugging "
             "Face model directory{}",
             dir, t.cfg ? "; --init uses the config's initial weights instead" : "");
  }
  t.model->set_training(false);
  t.tokenizer = data::tokenizer_load(t.cfg ? t.cfg->data.tokenizer : "byte");
  DT_ENFORCE(t.tokenizer->vocab_size() <= t.model->config().vocab_size, ConfigError,
             "tokenizer {} has {} tokens but the model's vocab_size is {}", t.tokenizer->name(),
             t.tokenizer->vocab_size(), t.model->config().vocab_size);
  if (t.cfg) {
    t.template_name = t.cfg->data.template_name;
    t.valid = t.cfg->data.valid;
  }
  t.seq_len = std::min<int64_t>(t.cfg && t.cfg->data.seq_len ? *t.cfg->data.seq_len : t.model->config().max_seq_len,
                                t.model->config().max_seq_len);
  return t;
}

}  // namespace dtrain::train
