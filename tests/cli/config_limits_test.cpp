// Limits through the real binary: integer config values that do not fit the width they are
// stored in, configs that are devices, and CLI numbers out of range all exit 2 with a
// message naming the key or option, the value and what is allowed (finding 4, finding 12);
// a model too large for the host is a config error, not bad_alloc (finding 12).
#include "run_binary.h"

#include <doctest/doctest.h>

#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <string>

using dtrain::test::has;
using dtrain::test::have_bin;
using dtrain::test::run_dtrain;

namespace {}  // namespace

TEST_CASE("--dry-run rejects integers that would wrap, naming the key, the value and the range") {
  if (!have_bin()) return;
  auto r = run_dtrain("launch --dry-run --set model.n_layer=4294967297");
  INFO(r.out);
  CHECK(r.code == 2);
  CHECK(has(r.out, "model.n_layer"));
  CHECK(has(r.out, "'4294967297'"));
  CHECK(has(r.out, "valid range: 1 to 2147483647"));
  CHECK(!has(r.out, "world size"));  // no placement was printed

  r = run_dtrain("launch --dry-run --set train_micro_batch_size_per_gpu=2147483648");
  INFO(r.out);
  CHECK(r.code == 2);
  CHECK(has(r.out, "train_micro_batch_size_per_gpu"));
  CHECK(has(r.out, "'2147483648'"));
  CHECK(has(r.out, "valid range: 1 to 2147483647"));
  CHECK(!has(r.out, "= -1"));  // the old, wrapped message

  for (const char* set : {"model.d_model=4294967360", "model.vocab_size=-9223372036854775808"}) {
    r = run_dtrain(std::string("launch --dry-run --set ") + set);
    INFO(r.out);
    CHECK(r.code == 2);
    CHECK(has(r.out, std::string(set).substr(0, std::string(set).find('='))));
    CHECK(has(r.out, "valid range:"));
  }

  // From an env override the same check applies, and the message names the variable.
  r = run_dtrain("launch --dry-run", 60, "DTRAIN_MAX_STEPS=4294967297");
  INFO(r.out);
  CHECK(r.code == 2);
  CHECK(has(r.out, "env DTRAIN_MAX_STEPS=4294967297: training.max_steps"));
  CHECK(has(r.out, "valid range: 1 to 2147483647"));

  // The limit itself is accepted by the conversion (the dry run goes on past it).
  r = run_dtrain("launch --dry-run --set training.max_steps=2147483647");
  INFO(r.out);
  CHECK(r.code == 0);
}

TEST_CASE("--config /dev/zero exits 2 quickly, naming the file") {
  if (!have_bin()) return;
  auto t0 = std::chrono::steady_clock::now();
  auto r = run_dtrain("launch --dry-run --config /dev/zero", 30);
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  INFO(r.out);
  CHECK(r.code == 2);
  CHECK(has(r.out, "config file '/dev/zero' is not a regular file (a character device)"));
  CHECK(!has(r.out, "bad_alloc"));
  (void)s;  // the 30 s kill would give exit 124 above: no timing is asserted
}

TEST_CASE("a model larger than this host's memory is a config error naming its size, not bad_alloc retried") {
  if (!have_bin()) return;
  const std::string dir = "/tmp/dtrain-cli-bigmodel-" + std::to_string(::getpid());
  auto r =
      run_dtrain("launch --set model.d_model=65536 --set model.n_head=512 --master-port 0 --output-dir " + dir, 120);
  std::filesystem::remove_all(dir);
  INFO(r.out);
  CHECK(r.code == 2);
  // The launcher's memory plan refuses it before any rank starts (it used to be the rank's
  // own check, then "not restarting").
  CHECK(has(r.out, "GiB of host memory on this machine"));
  CHECK(has(r.out, "choose a smaller model"));
  CHECK(!has(r.out, "starting"));
  CHECK(!has(r.out, "bad_alloc"));
}

TEST_CASE("CLI numbers out of range say what is allowed in words") {
  if (!have_bin()) return;
  struct Case {
    const char* args;
    const char* message;
  } cases[] = {
      {"launch --dry-run --num-nodes 0", "--num-nodes must be at least 1 (got 0)"},
      {"launch --dry-run --num-gpus -3", "--num-gpus must be at least 1 (got -3)"},
      {"launch --dry-run --nproc-per-node 0", "--nproc-per-node must be at least 1 (got 0)"},
      {"launch --dry-run --nproc-per-node 4294967297", "--nproc-per-node must be at least 1, at most 2147483647"},
      {"launch --dry-run --num-nodes two", "--num-nodes must be a whole number and must be at least 1 (got 'two')"},
      {"launch --dry-run --master-port 70000",
       "--master-port must be from 0 to 65535 (0 = pick a free port) (got 70000)"},
      {"bench allreduce --dry-run -n 0", "-n/--iters must be at least 1 (got 0)"},
      {"bench allreduce --dry-run -w -1", "-w/--warmup_iters must be at least 0 (got -1)"},
      {"bench allreduce --dry-run -c 2", "-c/--check must be from 0 to 1"},
  };
  for (const Case& c : cases) {
    auto r = run_dtrain(c.args);
    INFO(c.args);
    INFO(r.out);
    CHECK(r.code == 2);
    CHECK(has(r.out, c.message));
    CHECK(!has(r.out, "not in range"));
    CHECK(!has(r.out, "1.79"));
  }
  // In range still works.
  auto ok = run_dtrain("launch --dry-run --nproc-per-node 2 --master-port 0");
  INFO(ok.out);
  CHECK(ok.code == 0);
}
