// The pairwise form of TokenDataset (preference data): (chosen, rejected) documents in
// pairs, from memory and through a shard (its pairwise flag); batch() row order (the
// chosen rows, then the rejected ones); a pair skipped whole when either side has no
// trained target within seq_len; refusals: PACK, sample() on a pair, shards of both kinds.
#include "data/dataset.h"
#include "data/shard.h"
#include "data/shard_writer.h"

#include "core/error.h"
#include "temp_dir.h"

#include <doctest/doctest.h>

#include <algorithm>

using namespace dtrain;
using namespace dtrain::data;
using dtrain::test::TempDir;

namespace {

// Pair k: a prompt of 2 + k % 3 tokens (untrained) shared by both sides, then the chosen
// answer (2 tokens) or the rejected one (3 tokens), trained. Every token names its pair
// and side, so a row read back says where it came from.
struct PairSpec {
  std::vector<int32_t> prompt, chosen, rejected;
};

PairSpec pair_spec(size_t k) {
  PairSpec p;
  const int32_t base = static_cast<int32_t>(k) * 10;
  for (size_t i = 0; i < 2 + k % 3; ++i) p.prompt.push_back(1000 + base + static_cast<int32_t>(i));
  p.chosen = {2000 + base, 2001 + base};
  p.rejected = {3000 + base, 3001 + base, 3002 + base};
  return p;
}

void append_side(TokenData& d, const std::vector<int32_t>& prompt, const std::vector<int32_t>& answer) {
  std::vector<int32_t> t = prompt;
  t.insert(t.end(), answer.begin(), answer.end());
  std::vector<uint8_t> m(prompt.size(), 0);
  m.resize(t.size(), 1);
  d.append(t, m);
}

TokenData pairs_data(size_t n) {
  TokenData d;
  d.vocab_size = 4000;
  d.eos_id = 1;
  d.pad_id = 0;
  d.pairwise = true;
  for (size_t k = 0; k < n; ++k) {
    const PairSpec p = pair_spec(k);
    append_side(d, p.prompt, p.chosen);
    append_side(d, p.prompt, p.rejected);
  }
  return d;
}

DatasetOptions pad(int64_t seq_len) {
  DatasetOptions o;
  o.seq_len = seq_len;
  o.mode = SampleMode::PAD;
  return o;
}

// What the row of `prompt + answer` must hold at seq_len L: inputs the tokens then pad,
// targets the next token where it is an answer token.
void check_row(const int32_t* in, const int32_t* tg, int64_t L, const std::vector<int32_t>& prompt,
               const std::vector<int32_t>& answer, int32_t pad_id) {
  std::vector<int32_t> t = prompt;
  t.insert(t.end(), answer.begin(), answer.end());
  for (int64_t j = 0; j < L; ++j) {
    const size_t u = static_cast<size_t>(j);
    CHECK(in[j] == (u < t.size() ? t[u] : pad_id));
    const bool trained = u + 1 < t.size() && u + 1 >= prompt.size();
    CHECK(tg[j] == (trained ? t[u + 1] : IGNORE_INDEX));
  }
}

}  // namespace

TEST_CASE("pairwise TokenDataset: one sample per pair, pair() gives both sides, prompt masked") {
  const TokenDataset ds(pairs_data(7), pad(8));
  CHECK(ds.pairwise());
  CHECK(ds.rows_per_sample() == 2);
  REQUIRE(ds.size() == 7);
  for (size_t k = 0; k < ds.size(); ++k) {
    CAPTURE(k);
    const PairSpec s = pair_spec(k);
    const Pair p = ds.pair(k);
    check_row(p.chosen.inputs.data(), p.chosen.targets.data(), 8, s.prompt, s.chosen, 0);
    check_row(p.rejected.inputs.data(), p.rejected.targets.data(), 8, s.prompt, s.rejected, 0);
    // Both sides start with the same prompt tokens, none of them trained.
    CHECK(std::equal(s.prompt.begin(), s.prompt.end(), p.chosen.inputs.begin()));
    CHECK(std::equal(s.prompt.begin(), s.prompt.end(), p.rejected.inputs.begin()));
  }
  // A pair is never read as one row.
  CHECK_THROWS_AS(ds.sample(0), InternalError);
  CHECK_THROWS_AS(ds.pair(7), InternalError);
  TokenData text;
  text.vocab_size = 8;
  text.append({1, 2, 3});
  const TokenDataset plain(std::move(text), pad(4));
  CHECK_FALSE(plain.pairwise());
  CHECK(plain.rows_per_sample() == 1);
  CHECK_THROWS_AS(plain.pair(0), InternalError);
}

TEST_CASE("pairwise batch(): rows 0..n-1 the chosen of indices, rows n..2n-1 their rejected, same order") {
  const TokenDataset ds(pairs_data(9), pad(8));
  const std::vector<size_t> idx = {5, 0, 8, 5};
  const size_t n = idx.size(), L = 8;
  std::vector<int32_t> in(2 * n * L, -7), tg(2 * n * L, -7);
  ds.batch(idx, in.data(), tg.data());
  for (size_t r = 0; r < n; ++r) {
    CAPTURE(r);
    const PairSpec s = pair_spec(idx[r]);
    check_row(in.data() + r * L, tg.data() + r * L, 8, s.prompt, s.chosen, 0);
    check_row(in.data() + (n + r) * L, tg.data() + (n + r) * L, 8, s.prompt, s.rejected, 0);
  }
  CHECK(std::find(in.begin(), in.end(), -7) == in.end());  // every row written
}

TEST_CASE("pairwise: a pair with no trained target left on either side is skipped whole") {
  // seq_len 3 keeps 4 tokens a side: a prompt of 2 or 3 tokens leaves an answer token in
  // the window, one of 4 leaves none (on both sides here).
  TokenData d = pairs_data(6);  // prompts of 2, 3, 4, 2, 3, 4 tokens
  const TokenDataset ds(std::move(d), pad(3));
  CHECK(ds.size() == 4);  // pairs 2 and 5 (4-token prompts) keep no answer token
  CHECK(ds.skipped_documents() == 2);
  const std::vector<size_t> kept = {0, 1, 3, 4};
  for (size_t i = 0; i < ds.size(); ++i) {
    const Pair p = ds.pair(i);
    CHECK(p.chosen.inputs[0] == pair_spec(kept[i]).prompt[0]);
    CHECK(p.rejected.inputs[0] == pair_spec(kept[i]).prompt[0]);
  }

  // Only the rejected side loses its answer: the whole pair goes.
  TokenData one;
  one.vocab_size = 100;
  one.pairwise = true;
  append_side(one, {1, 2}, {3});
  append_side(one, {1, 2, 4, 5}, {6});
  append_side(one, {1, 2}, {7});
  append_side(one, {1, 2}, {8});
  const TokenDataset ds1(std::move(one), pad(3));
  REQUIRE(ds1.size() == 1);
  CHECK(ds1.skipped_documents() == 1);
  CHECK(ds1.pair(0).chosen.inputs[2] == 7);
  CHECK(ds1.pair(0).rejected.inputs[2] == 8);

  TokenData none;
  none.vocab_size = 100;
  none.pairwise = true;
  append_side(none, {1, 2, 3, 4}, {5});
  append_side(none, {1, 2}, {6});
  CHECK_THROWS_WITH_AS(TokenDataset(std::move(none), pad(3)), doctest::Contains("yields no samples"), ConfigError);
}

TEST_CASE("pairwise data through a shard: the flag round-trips; PACK and mixed shards are refused") {
  TempDir dir("pair-dataset");
  const std::string a = (dir.path / "a.bin").string(), b = (dir.path / "b.bin").string(),
                    c = (dir.path / "c.bin").string();
  const TokenData d = pairs_data(5);
  shard_write(a, d);
  {
    // The streaming writer gives the same bytes.
    ShardWriter w(b, d.vocab_size, d.eos_id, d.pad_id, true, true);
    for (size_t k = 0; k < d.doc_starts.size(); ++k) {
      const size_t s = d.doc_starts[k], e = k + 1 < d.doc_starts.size() ? d.doc_starts[k + 1] : d.tokens.size();
      w.append(d.tokens.data() + s, d.mask.data() + s, e - s);
    }
    w.finish();
  }
  const ShardReader ra(a), rb(b);
  CHECK(ra.pairwise());
  CHECK(rb.pairwise());
  CHECK(ra.to_data().pairwise);
  CHECK(ra.to_data().tokens == rb.to_data().tokens);
  CHECK(ra.to_data().doc_starts == rb.to_data().doc_starts);

  const TokenDataset mem(pairs_data(5), pad(8)), shard({a, b}, pad(8));
  REQUIRE(shard.pairwise());
  REQUIRE(shard.size() == 2 * mem.size());
  for (size_t k = 0; k < shard.size(); ++k) {
    const Pair x = shard.pair(k), y = mem.pair(k % mem.size());
    CHECK(x.chosen.inputs == y.chosen.inputs);
    CHECK(x.chosen.targets == y.chosen.targets);
    CHECK(x.rejected.inputs == y.rejected.inputs);
    CHECK(x.rejected.targets == y.rejected.targets);
  }

  DatasetOptions pack = pad(8);
  pack.mode = SampleMode::PACK;
  CHECK_THROWS_WITH_AS(TokenDataset({a}, pack), doctest::Contains("never packed: set data.pack: false"), ConfigError);

  TokenData sft = pairs_data(2);
  sft.pairwise = false;
  shard_write(c, sft);
  CHECK_FALSE(ShardReader(c).pairwise());
  CHECK_THROWS_WITH_AS(TokenDataset({a, c}, pad(8)), doctest::Contains("one dataset is all preference pairs or none"),
                       ConfigError);

  // An odd document count is not pairs.
  TokenData odd = pairs_data(2);
  odd.append({5, 6}, {0, 1});
  CHECK_THROWS_WITH_AS(shard_write(c, odd), doctest::Contains("not (chosen, rejected) pairs"), ConfigError);
  ShardWriter w(c, 4000, -1, -1, true, true);
  const int32_t t[2] = {5, 6};
  const uint8_t m[2] = {0, 1};
  w.append(t, m, 2);
  CHECK_THROWS_AS(w.finish(), InternalError);
}
