// `dtrain data prepare` of preference data through the real binary: the shipped LLaMA-Factory
// ranking datasets (--dataset, alpaca and sharegpt) and a pairwise JSONL (--format pairwise)
// become pairwise shards whose (chosen, rejected) rows equal the ones tokenized on the fly
// (what data.format pairwise / data.dataset give at training time); a malformed record is
// exit 2 naming its file and line.
#include "cli_harness.h"
#include "skip.h"

#include "data/dataset.h"
#include "data/llamafactory.h"
#include "data/pairwise.h"
#include "data/prepare.h"

using namespace dtrain::cli_test;
namespace fs = std::filesystem;
namespace data = dtrain::data;

namespace {

constexpr int kUsage = 2;

fs::path preference_dir() { return fs::absolute(source_root()) / "configs" / "data" / "preference"; }

data::DatasetOptions pad(int64_t seq_len) {
  data::DatasetOptions o;
  o.seq_len = seq_len;
  o.mode = data::SampleMode::PAD;
  return o;
}

// Every pair of the two datasets has the same rows (and they skipped the same pairs).
void check_same_pairs(const data::TokenDataset& shard, const data::TokenDataset& fly) {
  REQUIRE(shard.pairwise());
  REQUIRE(fly.pairwise());
  REQUIRE(shard.size() == fly.size());
  CHECK(shard.skipped_documents() == fly.skipped_documents());
  size_t differ = 0;
  for (size_t k = 0; k < shard.size(); ++k) {
    const data::Pair a = shard.pair(k), b = fly.pair(k);
    differ += a.chosen.inputs != b.chosen.inputs || a.chosen.targets != b.chosen.targets ||
              a.rejected.inputs != b.rejected.inputs || a.rejected.targets != b.rejected.targets;
  }
  CHECK(differ == 0);
}

}  // namespace

TEST_CASE("data prepare of preference data: pairwise shards equal to the pairs tokenized on the fly") {
  const std::string bin = dtrain_bin();
  if (bin.empty()) return ::dtrain::test::skip_test("DTRAIN_BIN not set: skipping");
  TempDir tmp{"dtrain-prepare-pairwise"};
  const fs::path dir = preference_dir();
  const std::string names = "basics_pref_alpaca,basics_pref_sharegpt";
  const std::string lf = tmp.path() + "/lf.bin";
  RunResult r = run({bin, "data", "prepare", dir.string(), lf, "--dataset", names, "--template", "chatml", "--threads",
                     "2", "--chunk-mb", "0.01"},
                    {}, 120s);
  INFO(r.out);
  REQUIRE(!r.timed_out);
  CHECK(r.rc == 0);
  CHECK(contains(r.out, "4000 documents (2000 chosen/rejected pairs)"));

  data::ByteTokenizer tok;
  data::DataPrepareOptions o;
  o.sft_template = "chatml";
  {
    const data::ShardReader reader(lf);
    CHECK(reader.pairwise());
    CHECK(reader.num_docs() == 4000);
  }
  for (int64_t seq_len : {160, 56}) {  // 56 cuts some answers off: the same pairs are skipped
    CAPTURE(seq_len);
    const data::TokenDataset shard({lf}, pad(seq_len));
    const data::TokenDataset fly(
        data::data_tokenize_pairs(data::llamafactory_load_pairs(dir.string(), names), names, tok, o), pad(seq_len));
    check_same_pairs(shard, fly);
    CHECK((seq_len == 160) == (shard.skipped_documents() == 0));
  }

  // A plain pairwise JSONL.
  const std::string valid = (dir / "valid.jsonl").string(), out = tmp.path() + "/valid.bin";
  r = run({bin, "data", "prepare", valid, out, "--format", "pairwise", "--template", "plain"}, {}, 60s);
  INFO(r.out);
  CHECK(r.rc == 0);
  o.sft_template = "plain";
  check_same_pairs(data::TokenDataset({out}, pad(96)),
                   data::TokenDataset(data::data_tokenize(valid, data::DataFormat::PAIRWISE, tok, o), pad(96)));

  // A malformed record: exit 2 naming the file and line; no output.
  const std::string bad = tmp.path() + "/bad.jsonl";
  std::ofstream(bad) << read_text(valid).substr(0, read_text(valid).find('\n') + 1)
                     << R"({"instruction": "x", "input": "", "chosen": "a"})"
                     << "\n";
  r = run({bin, "data", "prepare", bad, tmp.path() + "/bad.bin", "--format", "pairwise"}, {}, 60s);
  INFO(r.out);
  CHECK(r.rc == kUsage);
  CHECK(contains(r.out, bad + ":2: missing \"rejected\" (the rejected column, a string)"));
  CHECK(!fs::exists(tmp.path() + "/bad.bin"));
}
