// sampling: greedy is the first argmax; temperature, top-k and top-p give transformers'
// distributions (top-k then top-p over the scaled softmax, ties at the k-th kept, the
// most likely id always kept); draws follow the distribution and repeat for a seed;
// generate_batch at temperature 0 is greedy generation, and a prompt's sampled tokens do
// not depend on the batch; ChatSession renders the history and drops its oldest
// exchanges when the prompt would leave no room for an answer.
#include "core/error.h"
#include "data/chat_template.h"
#include "data/tokenizer.h"
#include "model/model.h"
#include "train/chat.h"
#include "train/evaluate.h"
#include "train/sampling.h"

#include <doctest/doctest.h>

#include <cmath>
#include <vector>

using namespace dtrain;
using namespace dtrain::train;

namespace {

// log of probabilities 0.5, 0.3, 0.15, 0.05 (ids 0..3), shuffled to ids 2, 0, 3, 1.
std::vector<float> logits4() { return {std::log(0.3f), std::log(0.05f), std::log(0.5f), std::log(0.15f)}; }

std::vector<double> probs(const SamplingOptions& o, const std::vector<float>& l) {
  TokenSampler s(o);
  return s.probabilities(l.data(), static_cast<int>(l.size()));
}

void check_probs(const std::vector<double>& got, const std::vector<double>& want) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) CHECK(got[i] == doctest::Approx(want[i]).epsilon(1e-6));
}

model::ModelConfig tiny_cfg(int max_seq_len) {
  model::ModelConfig c;
  c.arch = model::ModelConfig::Arch::LLAMA;
  c.vocab_size = 264;
  c.max_seq_len = max_seq_len;
  c.n_layer = 1;
  c.n_head = 2;
  c.n_kv_head = 1;
  c.d_model = 32;
  c.d_ff = 64;
  c.tie_embeddings = false;
  return c;
}

}  // namespace

TEST_CASE("greedy picks the first most likely id") {
  const std::vector<float> l{1.0f, 3.0f, -2.0f, 3.0f};
  TokenSampler s(SamplingOptions{});
  CHECK(s.next(l.data(), 4) == 1);
  check_probs(probs({}, l), {0, 1, 0, 0});
  // top-k 1 at any temperature, and top-p 0, leave only the most likely id.
  const auto l4 = logits4();
  check_probs(probs({.temperature = 1.7, .top_k = 1}, l4), {0, 0, 1, 0});
  check_probs(probs({.temperature = 1.7, .top_p = 0.0}, l4), {0, 0, 1, 0});
}

TEST_CASE("temperature, top-k and top-p filter as transformers does") {
  const auto l = logits4();
  check_probs(probs({.temperature = 1.0}, l), {0.3, 0.05, 0.5, 0.15});
  // Temperature 2: softmax(log p / 2) is proportional to sqrt(p).
  const double z = std::sqrt(0.3) + std::sqrt(0.05) + std::sqrt(0.5) + std::sqrt(0.15);
  check_probs(probs({.temperature = 2.0}, l),
              {std::sqrt(0.3) / z, std::sqrt(0.05) / z, std::sqrt(0.5) / z, std::sqrt(0.15) / z});
  // top-p 0.8: 0.5 + 0.3 reach it (ascending, 0.05 and 0.15 sum to 0.2 <= 1 - 0.8: dropped).
  check_probs(probs({.temperature = 1.0, .top_p = 0.8}, l), {0.375, 0, 0.625, 0});
  // top-p 0.81: 0.2 > 0.19, so 0.15 stays.
  check_probs(probs({.temperature = 1.0, .top_p = 0.81}, l), {0.3 / 0.95, 0, 0.5 / 0.95, 0.15 / 0.95});
  // top-k 2, then top-p 0.5 over the renormalised two (0.625, 0.375): 0.375 <= 0.5 goes.
  check_probs(probs({.temperature = 1.0, .top_k = 2}, l), {0.375, 0, 0.625, 0});
  check_probs(probs({.temperature = 1.0, .top_k = 2, .top_p = 0.5}, l), {0, 0, 1, 0});
  // Ties at the k-th largest stay.
  check_probs(probs({.temperature = 1.0, .top_k = 2}, {2.0f, 1.0f, 2.0f, 2.0f}), {1 / 3.0, 0, 1 / 3.0, 1 / 3.0});
}

TEST_CASE("draws follow the distribution and repeat for a seed") {
  const auto l = logits4();
  const SamplingOptions o{.temperature = 1.0, .seed = 11};
  TokenSampler a(o), b(o), c({.temperature = 1.0, .seed = 12});
  std::vector<int> counts(4, 0);
  std::vector<int32_t> da, db, dc;
  const int n = 20000;
  for (int i = 0; i < n; ++i) {
    da.push_back(a.next(l.data(), 4));
    db.push_back(b.next(l.data(), 4));
    dc.push_back(c.next(l.data(), 4));
    ++counts[static_cast<size_t>(da.back())];
  }
  CHECK(da == db);
  CHECK(da != dc);
  const std::vector<double> p{0.3, 0.05, 0.5, 0.15};
  for (size_t i = 0; i < 4; ++i) CHECK(static_cast<double>(counts[i]) / n == doctest::Approx(p[i]).epsilon(0.05));
  // top-k 2 never draws a filtered id.
  TokenSampler k2({.temperature = 1.0, .top_k = 2, .seed = 3});
  for (int i = 0; i < 2000; ++i) {
    const int32_t id = k2.next(l.data(), 4);
    CHECK((id == 0 || id == 2));
  }
}

TEST_CASE("bad sampling options are usage errors") {
  CHECK_THROWS_AS(TokenSampler({.temperature = -1.0}), UsageError);
  CHECK_THROWS_AS(TokenSampler({.temperature = NAN}), UsageError);
  CHECK_THROWS_AS(TokenSampler({.temperature = 1.0, .top_k = -1}), UsageError);
  CHECK_THROWS_AS(TokenSampler({.temperature = 1.0, .top_p = 1.5}), UsageError);
}

TEST_CASE("generate_batch: temperature 0 is greedy; sampled tokens repeat per seed, whatever the batch") {
  model::Model m(tiny_cfg(64));
  m.init_weights(5);
  auto tok = data::tokenizer_load("byte");
  const std::vector<std::vector<int32_t>> prompts{tok->encode("### Instruction:\nhi\n\n### Response:\n"),
                                                  tok->encode("ab"), tok->encode("a longer prompt")};
  CHECK(generate_batch(m, prompts, 8, {}, SamplingOptions{}, 3, 259) ==
        generate_greedy_batch(m, prompts, 8, {}, 3, 259));
  CHECK(generate_batch(m, prompts, 8, {}, {.temperature = 0.9, .top_k = 1, .seed = 4}, 3, 259) ==
        generate_greedy_batch(m, prompts, 8, {}, 3, 259));
  const SamplingOptions s{.temperature = 1.5, .top_p = 0.95, .seed = 21};
  const auto all = generate_batch(m, prompts, 8, {}, s, 3, 259);
  CHECK(all == generate_batch(m, prompts, 8, {}, s, 3, 259));
  CHECK(all != generate_greedy_batch(m, prompts, 8, {}, 3, 259));
  for (size_t i = 0; i < prompts.size(); ++i) {
    SamplingOptions si = s;
    si.seed = s.seed + i;
    CHECK(generate_batch(m, {prompts[i]}, 8, {}, si, 1, 259)[0] == all[i]);
    for (int32_t id : all[i]) CHECK(id < 259);
  }
}

TEST_CASE("ChatSession: the history goes through the template and its oldest exchanges drop to fit") {
  model::Model m(tiny_cfg(96));
  m.init_weights(7);
  auto tok = data::tokenizer_load("byte");
  const data::SftTemplate tmpl = data::SftTemplate::PLAIN;
  ChatOptions eight;
  eight.max_new_tokens = 8;
  ChatSession chat(m, *tok, tmpl, eight);
  // The first answer is greedy generation of the one-turn prompt, as `dtrain generate` renders it.
  data::SftRecord one;
  one.messages = {{data::SftRole::USER, "hi", ""}, {data::SftRole::ASSISTANT, "", ""}};
  const std::vector<int32_t> p1 = data::sft_render_prompt(one, *tok, tmpl);
  std::vector<int32_t> want = generate_greedy_batch(m, {p1}, 8, data::sft_stop_ids(*tok), 1, tok->vocab_size())[0];
  const ChatReply r1 = chat.reply("hi");
  CHECK(r1.prompt_tokens == static_cast<int>(p1.size()));
  CHECK(r1.dropped_exchanges == 0);
  if (r1.ended) want.pop_back();
  CHECK(r1.text == tok->decode(want));
  CHECK(chat.exchanges() == 1);
  // The second prompt holds the first exchange.
  const ChatReply r2 = chat.reply("ok");
  CHECK(r2.dropped_exchanges == 0);
  CHECK(r2.prompt_tokens > r1.prompt_tokens);
  CHECK(chat.exchanges() == 2);
  // A long message leaves no room for the earlier exchanges: both go, oldest first.
  const ChatReply r3 = chat.reply(std::string(40, 'x'));
  CHECK(r3.dropped_exchanges == 2);
  CHECK(r3.prompt_tokens + 8 <= 96);
  CHECK_FALSE(r3.prompt_cut);
  CHECK(chat.exchanges() == 1);
  // Alone over max_seq_len: cut to its last tokens, said in the reply.
  const ChatReply r4 = chat.reply(std::string(200, 'y'));
  CHECK(r4.dropped_exchanges == 1);
  CHECK(r4.prompt_cut);
  CHECK(r4.new_tokens == 1);
  chat.reset();
  CHECK(chat.exchanges() == 0);
  ChatOptions none;
  none.max_new_tokens = 0;
  CHECK_THROWS_AS(ChatSession(m, *tok, tmpl, none), UsageError);
}
