// evaluate: validation loss as a token-weighted mean (and split over ranks), greedy
// generation (batched == one by one, stops at eos), answer scoring on an identity /
// corrupted case, an untrained model's low task accuracy, and which model / settings
// eval_target_load picks for a run directory or an HF directory.
#include "config/train_config.h"
#include "core/error.h"
#include "data/prepare.h"
#include "data/sft.h"
#include "model/model.h"
#include "train/evaluate.h"
#include "train/model_factory.h"

#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <unistd.h>
#include <vector>

using namespace dtrain;
using namespace dtrain::train;

namespace {

model::ModelConfig tiny_cfg() {
  model::ModelConfig c;
  c.arch = model::ModelConfig::Arch::LLAMA;
  c.vocab_size = 264;
  c.max_seq_len = 96;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_kv_head = 1;
  c.d_model = 32;
  c.d_ff = 64;
  c.tie_embeddings = false;
  return c;
}

data::TokenDataset valid_set(const data::Tokenizer& tok, int64_t seq_len) {
  auto td = data::data_tokenize("configs/data/tasks/valid.jsonl", data::DataFormat::ALPACA, tok);
  data::DatasetOptions o;
  o.seq_len = seq_len;
  return data::TokenDataset(std::move(td), o);
}

}  // namespace

TEST_CASE("eval_loss is the token-weighted mean and splits over ranks") {
  model::Model m(tiny_cfg());
  m.init_weights(3);
  auto tok = data::tokenizer_load("byte");
  auto ds = valid_set(*tok, 32);
  EvalLoss all = eval_loss(m, ds, 5, 23);
  CHECK(all.tokens > 0);
  CHECK(all.mean() == doctest::Approx(std::log(264.0)).epsilon(0.05));
  CHECK(all.ppl() == doctest::Approx(std::exp(all.mean())));
  // The same 23 samples one at a time.
  double sum = 0.0;
  int64_t n = 0;
  for (size_t i = 0; i < 23; ++i) {
    auto s = ds.sample(i);
    const float l = m.forward(s.inputs.data(), s.targets.data(), 1, 32);
    sum += static_cast<double>(l) * m.num_targets();
    n += m.num_targets();
  }
  CHECK(all.tokens == n);
  CHECK(all.loss_sum == doctest::Approx(sum).epsilon(1e-5));
  EvalLoss r0 = eval_loss(m, ds, 5, 23, 0, 2), r1 = eval_loss(m, ds, 5, 23, 1, 2);
  CHECK(r0.tokens + r1.tokens == all.tokens);
  CHECK(r0.loss_sum + r1.loss_sum == doctest::Approx(all.loss_sum).epsilon(1e-5));
  CHECK(m.training());  // restored

  // ZeRO-3's equal forward counts: 23 samples over 3 ranks in batches of 5 are 2 forwards
  // for the rank with 8 samples; the ranks with fewer pad with masked forwards that add
  // nothing (the model counts each forward it runs).
  CHECK(eval_forwards(ds, 5, 23, 3) == 2);
  CHECK(eval_forwards(ds, 5, 23, 1) == 5);
  CHECK(eval_forwards(ds, 4, 8, 2) == 1);
  const uint64_t before = m.forward_count();
  const EvalLoss padded = eval_loss(m, ds, 5, 23, 2, 3, 4);  // rank 2: samples 2, 5, ..., 20 (7): 2 real forwards
  CHECK(m.forward_count() - before == 4);
  const EvalLoss plain = eval_loss(m, ds, 5, 23, 2, 3);
  CHECK(padded.tokens == plain.tokens);
  CHECK(padded.loss_sum == plain.loss_sum);
}

TEST_CASE("greedy generation: batched equals one by one, deterministic, stops at stop ids") {
  model::Model m(tiny_cfg());
  m.init_weights(5);
  auto tok = data::tokenizer_load("byte");
  std::vector<std::vector<int32_t>> prompts{tok->encode("### Instruction:\nhi\n\n### Response:\n"), tok->encode("ab"),
                                            tok->encode("a longer prompt with more bytes in it")};
  auto batched = generate_greedy_batch(m, prompts, 6, {}, 3);
  for (size_t i = 0; i < prompts.size(); ++i) {
    auto one = generate_greedy_batch(m, {prompts[i]}, 6, {}, 1);
    CHECK(one[0] == batched[i]);
    CHECK(batched[i].size() == 6);
  }
  // Make the first generated token a stop id: generation ends right after it.
  const int32_t first = batched[0][0];
  auto stopped = generate_greedy_batch(m, {prompts[0]}, 6, {first}, 1);
  CHECK(stopped[0] == std::vector<int32_t>{first});
  // Context cut at max_seq_len: a 95-token prompt leaves room for one token.
  std::vector<int32_t> longp(200, 'x');
  auto cut = generate_greedy_batch(m, {longp}, 10, {}, 1);
  CHECK(cut[0].size() == 1);
  CHECK(generate_greedy(m, *tok, prompts[1], 4, false).size() <= 4 * 12);
}

TEST_CASE("score_answers counts an identity generator and a corrupted one correctly") {
  auto tok = data::tokenizer_load("byte");
  auto records = data::sft_load_jsonl("configs/data/tasks/valid.jsonl");
  records.resize(40);
  std::vector<std::string> gen;
  for (const auto& r : records) gen.push_back(r.messages.back().content + "<|eos|>junk after eos");
  TaskAccuracy ok = score_answers(records, gen, *tok, data::SftTemplate::PLAIN);
  CHECK(ok.correct == 40);
  CHECK(ok.total == 40);
  CHECK(ok.percent() == doctest::Approx(100.0));
  CHECK(ok.examples.size() == 5);
  CHECK(ok.examples[0].prompt.find("### Response:") != std::string::npos);
  for (size_t i = 0; i < gen.size(); i += 4) gen[i] = "  wrong  ";
  for (size_t i = 1; i < gen.size(); i += 4)
    gen[i] = "  " + records[i].messages.back().content + " \n";  // spacing only
  TaskAccuracy part = score_answers(records, gen, *tok, data::SftTemplate::PLAIN);
  CHECK(part.correct == 30);
  CHECK_FALSE(part.examples[0].correct);
}

TEST_CASE("an untrained model scores (almost) nothing on the held-out tasks") {
  model::Model m(tiny_cfg());
  m.init_weights(9);
  auto tok = data::tokenizer_load("byte");
  TaskAccuracy a = eval_tasks(m, *tok, "configs/data/tasks/valid.jsonl", "plain", 32);
  CHECK(a.total == 32);
  CHECK(a.correct <= 2);
}

TEST_CASE("eval_target_load: run dir without final/ (an error), with final/, bare HF dir, --init") {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("dtrain_eval_target_" + std::to_string(getpid()));
  fs::remove_all(dir);
  const char* yaml = R"(
train_micro_batch_size_per_gpu: 2
model: {architecture: llama, vocab_size: 264, n_layer: 1, n_head: 2, d_model: 16, max_seq_len: 32}
data: {train: configs/data/tasks/train.jsonl, valid: configs/data/tasks/valid.jsonl, format: alpaca, seq_len: 32}
training: {max_steps: 1, seed: 5}
)";
  // As if t.yaml were in the repository root: its relative data paths become absolute, as
  // in every config.yaml dtrain writes into a run directory.
  auto cfg = config::config_load_string(yaml, "t.yaml", {}, fs::current_path().string()).cfg;
  fs::create_directories(dir);
  {
    std::ofstream f(dir / "config.yaml");
    f << config::config_to_yaml(cfg);
  }
  // No final/ and no checkpoint: an error naming --init, never silently the initial
  // weights (issue 33, item 2); --init is the way to them.
  CHECK_THROWS_WITH_AS(eval_target_load(dir.string()), doctest::Contains("--init"), UsageError);
  EvalTarget init = eval_target_load(dir.string(), "", true);
  CHECK(init.weights.find("initial weights") == 0);
  CHECK(init.valid == (fs::current_path() / "configs/data/tasks/valid.jsonl").string());
  CHECK(init.seq_len == 32);
  CHECK_FALSE(init.model->training());
  // A "trained" model: different seed, exported into final/.
  model::Model m(init.model->config());
  m.init_weights(99);
  model_export_hf(m, (dir / "final").string());
  EvalTarget fin = eval_target_load(dir.string());
  CHECK(fin.weights == (dir / "final").string());
  CHECK(std::memcmp(fin.model->params()[1].data, m.params()[1].data, m.params()[1].size * 4) == 0);
  CHECK(eval_target_load(dir.string(), "", true).weights.find("initial weights") == 0);
  EvalTarget bare = eval_target_load((dir / "final").string());
  CHECK_FALSE(bare.cfg.has_value());
  CHECK(bare.tokenizer->name() == "byte");
  CHECK(bare.seq_len == 32);
  // The input rule names a directory that is not there (a ConfigError: exit 2, as before).
  CHECK_THROWS_WITH_AS(eval_target_load((dir / "nothing").string()), doctest::Contains("does not exist"), ConfigError);
  fs::remove_all(dir);
}
