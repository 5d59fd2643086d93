// Gloo backend: every collective against exactly known results for 1-4 in-process
// ranks over 127.0.0.1 (fp32/bf16/fp16, in and out of place), plus abort, peer loss and
// timeouts surfacing as CommError instead of hangs, and split into groups.
#include "comm/buffer.h"
#include "comm/gloo_comm.h"
#include "comm/split_check.h"
#include "core/error.h"
#include "rank_threads.h"

#include <doctest/doctest.h>
#include <gloo/rendezvous/hash_store.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

using namespace dtrain;
using namespace dtrain::comm;
using dtrain::test::loopback_gloo;
using dtrain::test::run_gloo_ranks;

namespace {

using Clock = std::chrono::steady_clock;

void check_all_passed(const std::vector<std::string>& errors) {
  for (size_t r = 0; r < errors.size(); ++r) {
    INFO("rank " << r);
    CHECK(errors[r] == "");
  }
}

// Small integers: exact in bf16/fp16 and in every partial sum of up to 4 ranks.
float input_value(int rank, size_t i) { return static_cast<float>(static_cast<int>((i * 5 + rank * 3) % 9) - 4); }

std::vector<char> make_input(DType t, int rank, size_t count, size_t offset = 0) {
  std::vector<char> v(count * dtype_size(t));
  for (size_t i = 0; i < count; ++i) dtype_store(v.data(), i, t, input_value(rank, offset + i));
  return v;
}

float expected_reduce(int n, size_t i, ReduceOp op, DType t) {
  float sum = 0, mx = -1e30f;
  for (int r = 0; r < n; ++r) {
    sum += input_value(r, i);
    mx = std::max(mx, input_value(r, i));
  }
  float v = op == ReduceOp::MAX ? mx : op == ReduceOp::SUM ? sum : sum / static_cast<float>(n);
  // Round to the dtype the way the backend does (one rounding of the fp32 value).
  char tmp[4];
  dtype_store(tmp, 0, t, v);
  return dtype_load(tmp, 0, t);
}

// First mismatch as text, "" if all equal.
std::string compare(const char* what, const std::vector<char>& got, DType t, size_t count,
                    const std::function<float(size_t)>& want) {
  for (size_t i = 0; i < count; ++i) {
    const float g = dtype_load(got.data(), i, t), w = want(i);
    if (!(g == w))
      return std::string(what) + " " + dtype_name(t) + " element " + std::to_string(i) + ": got " + std::to_string(g) +
             " want " + std::to_string(w);
  }
  return "";
}

const DType kDtypes[] = {DType::F32, DType::BF16, DType::F16};
const ReduceOp kOps[] = {ReduceOp::SUM, ReduceOp::AVG, ReduceOp::MAX};

}  // namespace

// ---------------------------------------------------------------------------

TEST_CASE("gloo allreduce: sum/avg/max on fp32/bf16/fp16, in and out of place, 1-4 ranks") {
  for (int n = 1; n <= 4; ++n) {
    CAPTURE(n);
    auto errors = run_gloo_ranks(n, [n](Communicator& c) {
      CHECK(c.rank() >= 0);
      std::string err;
      for (size_t count : {size_t{1}, size_t{2}, size_t{37}, size_t{4099}}) {
        for (DType t : kDtypes) {
          for (ReduceOp op : kOps) {
            auto want = [&](size_t i) { return expected_reduce(n, i, op, t); };
            auto send = make_input(t, c.rank(), count);
            std::vector<char> recv(send.size(), 0x7f);
            c.allreduce(send.data(), recv.data(), count, t, op);
            if (err.empty()) err = compare("out-of-place allreduce", recv, t, count, want);
            if (err.empty() && send != make_input(t, c.rank(), count)) err = "allreduce wrote its input";
            auto inplace = make_input(t, c.rank(), count);
            c.allreduce(inplace.data(), inplace.data(), count, t, op);
            if (err.empty()) err = compare("in-place allreduce", inplace, t, count, want);
          }
        }
      }
      if (!err.empty()) throw std::runtime_error(err);
    });
    check_all_passed(errors);
  }
}

// Small buffers go through the direct all-to-all exchange; these sizes are past its
// threshold ((n-1) x bytes > 128 KiB), so the ring path sees every dtype and op too,
// including chunk sizes that do not divide evenly.
TEST_CASE("gloo allreduce: ring-sized buffers, sum/avg/max on fp32/bf16/fp16, 2-3 ranks") {
  for (int n = 2; n <= 3; ++n) {
    CAPTURE(n);
    auto errors = run_gloo_ranks(n, [n](Communicator& c) {
      std::string err;
      for (DType t : kDtypes) {
        const size_t count = (size_t{300} << 10) / dtype_size(t) + 7;
        for (ReduceOp op : kOps) {
          auto want = [&](size_t i) { return expected_reduce(n, i, op, t); };
          auto send = make_input(t, c.rank(), count);
          std::vector<char> recv(send.size(), 0x7f);
          c.allreduce(send.data(), recv.data(), count, t, op);
          if (err.empty()) err = compare("ring out-of-place allreduce", recv, t, count, want);
          if (err.empty() && send != make_input(t, c.rank(), count)) err = "ring allreduce wrote its input";
          c.allreduce(send.data(), send.data(), count, t, op);
          if (err.empty()) err = compare("ring in-place allreduce", send, t, count, want);
        }
      }
      if (!err.empty()) throw std::runtime_error(err);
    });
    check_all_passed(errors);
  }
}

TEST_CASE("gloo allreduce: a large fp32 buffer (several MiB) over 3 ranks") {
  const size_t count = (size_t{1} << 20) + 3;
  auto errors = run_gloo_ranks(3, [&](Communicator& c) {
    auto buf = make_input(DType::F32, c.rank(), count);
    c.allreduce(buf.data(), buf.data(), count, DType::F32, ReduceOp::SUM);
    auto err = compare("large allreduce", buf, DType::F32, count,
                       [](size_t i) { return expected_reduce(3, i, ReduceOp::SUM, DType::F32); });
    if (!err.empty()) throw std::runtime_error(err);
  });
  check_all_passed(errors);
}

TEST_CASE("gloo reduce_scatter: counts not powers of two, in and out of place, 1-4 ranks") {
  for (int n = 1; n <= 4; ++n) {
    CAPTURE(n);
    auto errors = run_gloo_ranks(n, [n](Communicator& c) {
      std::string err;
      for (size_t rc : {size_t{1}, size_t{5}, size_t{7}, size_t{1001}}) {
        for (DType t : kDtypes) {
          for (ReduceOp op : kOps) {
            const size_t es = dtype_size(t);
            auto want = [&](size_t i) { return expected_reduce(n, c.rank() * rc + i, op, t); };
            auto send = make_input(t, c.rank(), rc * n);
            std::vector<char> recv(rc * es, 0x7f);
            c.reduce_scatter(send.data(), recv.data(), rc, t, op);
            if (err.empty()) err = compare("out-of-place reduce_scatter", recv, t, rc, want);
            // In place: the result lands in this rank's slice of the send buffer.
            auto inplace = make_input(t, c.rank(), rc * n);
            char* slice = inplace.data() + c.rank() * rc * es;
            c.reduce_scatter(inplace.data(), slice, rc, t, op);
            std::vector<char> got(slice, slice + rc * es);
            if (err.empty()) err = compare("in-place reduce_scatter", got, t, rc, want);
          }
        }
      }
      if (!err.empty()) throw std::runtime_error(err);
    });
    check_all_passed(errors);
  }
}

// The reduce-scatter ring moves each chunk 8 MiB at a time (two pieces of scratch, not a
// copy of the buffer): chunks of one piece and a bit, uneven ones, 16-bit ones.
TEST_CASE("gloo reduce_scatter and allreduce: chunks longer than the ring's 8 MiB piece, 3 ranks") {
  const size_t piece_f32 = size_t{2} << 20;  // 8 MiB of fp32
  auto errors = run_gloo_ranks(3, [&](Communicator& c) {
    std::string err;
    for (DType t : {DType::F32, DType::BF16}) {
      const size_t es = dtype_size(t), rc = piece_f32 * 4 / es + 7;
      for (ReduceOp op : {ReduceOp::SUM, ReduceOp::AVG}) {
        auto want = [&](size_t i) { return expected_reduce(3, c.rank() * rc + i, op, t); };
        auto send = make_input(t, c.rank(), rc * 3);
        char* slice = send.data() + c.rank() * rc * es;
        c.reduce_scatter(send.data(), slice, rc, t, op);
        std::vector<char> got(slice, slice + rc * es);
        if (err.empty()) err = compare("in-place reduce_scatter", got, t, rc, want);
      }
    }
    // Three uneven chunks of about 1.3 pieces each, out of place.
    const size_t count = 3 * (piece_f32 + piece_f32 / 3) + 2;
    auto send = make_input(DType::F32, c.rank(), count);
    std::vector<char> recv(count * 4, 0x7f);
    c.allreduce(send.data(), recv.data(), count, DType::F32, ReduceOp::SUM);
    if (err.empty())
      err = compare("allreduce", recv, DType::F32, count,
                    [](size_t i) { return expected_reduce(3, i, ReduceOp::SUM, DType::F32); });
    if (!err.empty()) throw std::runtime_error(err);
  });
  check_all_passed(errors);
}

TEST_CASE("gloo all_gather: every rank's contribution in rank order, in and out of place") {
  for (int n = 1; n <= 4; ++n) {
    CAPTURE(n);
    auto errors = run_gloo_ranks(n, [n](Communicator& c) {
      std::string err;
      for (size_t sc : {size_t{1}, size_t{5}, size_t{3001}}) {
        for (DType t : kDtypes) {
          const size_t es = dtype_size(t);
          // Rank r contributes input_value(r, r*sc + i) so every slot is distinct.
          auto want = [&](size_t j) { return input_value(static_cast<int>(j / sc), j); };
          auto send = make_input(t, c.rank(), sc, c.rank() * sc);
          std::vector<char> recv(sc * n * es, 0x7f);
          c.all_gather(send.data(), recv.data(), sc, t);
          if (err.empty()) err = compare("out-of-place all_gather", recv, t, sc * n, want);
          std::vector<char> inplace(sc * n * es, 0x7f);
          std::copy(send.begin(), send.end(), inplace.begin() + c.rank() * sc * es);
          c.all_gather(inplace.data() + c.rank() * sc * es, inplace.data(), sc, t);
          if (err.empty()) err = compare("in-place all_gather", inplace, t, sc * n, want);
        }
      }
      if (!err.empty()) throw std::runtime_error(err);
    });
    check_all_passed(errors);
  }
}

TEST_CASE("gloo broadcast: from every root, in and out of place, including multi-segment") {
  for (int n = 1; n <= 4; ++n) {
    CAPTURE(n);
    auto errors = run_gloo_ranks(n, [n](Communicator& c) {
      std::string err;
      for (size_t count : {size_t{3}, size_t{300000}}) {  // 300000 fp32 = 3 pipeline segments
        for (int root = 0; root < n; ++root) {
          const DType t = count == 3 ? DType::BF16 : DType::F32;
          auto want = [&](size_t i) { return input_value(root, i); };
          auto send = make_input(t, c.rank(), count);  // only root's matters
          std::vector<char> recv(send.size(), 0x7f);
          c.broadcast(send.data(), recv.data(), count, t, root);
          if (err.empty()) err = compare("out-of-place broadcast", recv, t, count, want);
          auto inplace = make_input(t, c.rank(), count);
          c.broadcast(inplace.data(), inplace.data(), count, t, root);
          if (err.empty()) err = compare("in-place broadcast", inplace, t, count, want);
        }
      }
      if (!err.empty()) throw std::runtime_error(err);
    });
    check_all_passed(errors);
  }
}

TEST_CASE("gloo barrier: nobody leaves before everyone arrived") {
  const int n = 4, rounds = 5;
  std::atomic<int> arrived{0};
  auto errors = run_gloo_ranks(n, [&](Communicator& c) {
    for (int k = 0; k < rounds; ++k) {
      // The last rank is late every round: a barrier that does not wait lets the others
      // see fewer arrivals than n*(k+1).
      if (c.rank() == n - 1) std::this_thread::sleep_for(std::chrono::milliseconds(30));
      arrived.fetch_add(1);
      c.barrier();
      if (arrived.load() < n * (k + 1)) throw std::runtime_error("left barrier round " + std::to_string(k) + " early");
      c.barrier();  // nobody starts round k+1 before everyone checked round k
    }
  });
  check_all_passed(errors);
}

TEST_CASE("gloo Buffer is host memory and round-trips bytes") {
  auto errors = run_gloo_ranks(1, [](Communicator& c) {
    CHECK_FALSE(c.on_device());
    CHECK(c.device() == -1);
    CHECK(c.backend() == Backend::GLOO);
    CHECK(c.device_name().rfind("cpu", 0) == 0);
    Buffer b(c, 16);
    CHECK(b.bytes() == 16);
    const char src[5] = "abcd";
    b.fill_bytes(0);
    b.copy_from_host(src, 4, 8);
    char dst[16];
    b.copy_to_host(dst, 16);
    CHECK(dst[0] == 0);
    CHECK(std::string(dst + 8, 4) == "abcd");
    CHECK_THROWS_AS(b.copy_from_host(src, 5, 12), InternalError);
  });
  check_all_passed(errors);
}

// ---------------------------------------------------------------------------
// Failures: abort, a vanished peer and a silent peer all end in CommError, bounded.

TEST_CASE("gloo abort: a collective blocked on a rank that never joins throws CommError") {
  const int n = 3;
  const auto timeout = std::chrono::milliseconds(30000);
  std::atomic<int> done{0};
  std::vector<double> elapsed(n, 0);
  std::vector<std::string> outcome(n);
  auto errors = run_gloo_ranks(
      n,
      [&](Communicator& c) {
        if (c.rank() == n - 1) {
          // Never joins; stays alive until the others gave up (bounded wait).
          auto until = Clock::now() + std::chrono::seconds(20);
          while (done.load() < n - 1 && Clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(5));
          return;
        }
        std::thread timer([&c] {
          std::this_thread::sleep_for(std::chrono::milliseconds(300));
          c.abort();
        });
        std::vector<float> buf(1000, 1.0f);
        const auto start = Clock::now();
        try {
          c.allreduce(buf.data(), buf.data(), buf.size(), DType::F32, ReduceOp::SUM);
          outcome[c.rank()] = "returned";
        } catch (const CommError& e) {
          outcome[c.rank()] = "CommError";
        }
        elapsed[c.rank()] = std::chrono::duration<double>(Clock::now() - start).count();
        timer.join();
        // Later collectives fail fast too.
        try {
          c.barrier();
          outcome[c.rank()] += "+returned";
        } catch (const CommError&) {
          outcome[c.rank()] += "+CommError";
        }
        c.abort();  // idempotent
        done.fetch_add(1);
      },
      loopback_gloo(timeout));
  check_all_passed(errors);
  for (int r = 0; r < n - 1; ++r) {
    CAPTURE(r);
    CHECK(outcome[r] == "CommError+CommError");
    // Behaviour, not speed: it must not have waited out the 30 s collective timeout.
    CHECK(elapsed[r] < 15.0);
  }
}

TEST_CASE("gloo peer loss: a rank that destroys its communicator fails the others' collective") {
  std::atomic<bool> gone{false};
  std::atomic<int> connected{0};
  std::string outcome;
  auto errors = run_gloo_ranks(
      2,
      [&](Communicator& c) {
        // Rank 1 leaves only once rank 0 has its mesh too: leaving earlier fails rank 0's
        // connect, not its collective (bounded wait: 15 s).
        ++connected;
        for (int i = 0; i < 15000 && connected.load() < 2; ++i)
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        if (c.rank() == 1) {
          gone = true;
          return;  // the communicator is destroyed: its sockets close
        }
        while (!gone.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        std::vector<float> buf(64, 1.0f);
        try {
          c.allreduce(buf.data(), buf.data(), buf.size(), DType::F32, ReduceOp::SUM);
          outcome = "returned";
        } catch (const CommError& e) {
          outcome = "CommError";
        }
      },
      loopback_gloo(std::chrono::milliseconds(15000)));
  check_all_passed(errors);
  CHECK(outcome == "CommError");
}

TEST_CASE("gloo timeout: a peer that stays connected but silent surfaces as CommError") {
  std::atomic<bool> finished{false};
  std::string outcome, message;
  auto errors = run_gloo_ranks(
      2,
      [&](Communicator& c) {
        if (c.rank() == 1) {
          auto until = Clock::now() + std::chrono::seconds(20);
          while (!finished.load() && Clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(5));
          return;
        }
        std::vector<float> buf(64, 1.0f);
        try {
          c.allreduce(buf.data(), buf.data(), buf.size(), DType::F32, ReduceOp::SUM);
          outcome = "returned";
        } catch (const CommError& e) {
          outcome = "CommError";
          message = e.what();
        }
        finished = true;
      },
      loopback_gloo(std::chrono::milliseconds(500)));
  check_all_passed(errors);
  CHECK(outcome == "CommError");
  CHECK(message.find("allreduce") != std::string::npos);
}

TEST_CASE("gloo options: bad combinations and unknown interfaces are reported") {
  auto store = std::make_shared<gloo::rendezvous::HashStore>();
  GlooOptions both = loopback_gloo();
  both.interface = "lo";
  CHECK_THROWS_AS(comm_create_gloo(store, 0, 1, both), UsageError);
  CHECK_THROWS_AS(comm_create_gloo(store, 2, 2, loopback_gloo()), UsageError);
  CHECK_THROWS_AS(comm_create_gloo(nullptr, 0, 1, loopback_gloo()), UsageError);
  GlooOptions bad_iface;
  bad_iface.interface = "dtrain-no-such-if0";
  CHECK_THROWS_AS(comm_create_gloo(store, 0, 1, bad_iface), CommError);
  // A world of 2 where the peer never shows up: bounded by the timeout.
  CHECK_THROWS_AS(comm_create_gloo(store, 0, 2, loopback_gloo(std::chrono::milliseconds(300))), CommError);
}

TEST_CASE("reduce op and backend names parse back") {
  for (ReduceOp op : kOps) {
    ReduceOp back{};
    CHECK(reduce_op_parse(reduce_op_name(op), &back));
    CHECK(back == op);
  }
  ReduceOp op{};
  CHECK_FALSE(reduce_op_parse("prod", &op));
  Backend b{};
  CHECK(backend_parse("NCCL", &b));
  CHECK(b == Backend::NCCL);
  CHECK(backend_parse(backend_name(Backend::GLOO), &b));
  CHECK(b == Backend::GLOO);
  CHECK_FALSE(backend_parse("mpi", &b));
}

TEST_CASE("gloo: creating a communicator ignores SIGPIPE so a dead peer is a CommError, not a signal") {
  struct sigaction saved {};
  REQUIRE(::sigaction(SIGPIPE, nullptr, &saved) == 0);
  ::signal(SIGPIPE, SIG_DFL);
  auto errors = run_gloo_ranks(1, [](Communicator&) {});
  check_all_passed(errors);
  struct sigaction now {};
  REQUIRE(::sigaction(SIGPIPE, nullptr, &now) == 0);
  CHECK((now.sa_handler == SIG_IGN));
  ::sigaction(SIGPIPE, &saved, nullptr);
}

// ---------------------------------------------------------------------------

TEST_CASE("split_place: ranks by key within a color, ties by rank, a negative color in no group") {
  const std::vector<std::pair<int, int>> ck = {{0, 5}, {1, 0}, {0, 1}, {1, 0}, {-1, 0}};
  CHECK(split_place(ck, 0).rank == 1);
  CHECK(split_place(ck, 0).size == 2);
  CHECK(split_place(ck, 2).rank == 0);
  CHECK(split_place(ck, 1).rank == 0);  // equal keys: the lower rank first
  CHECK(split_place(ck, 3).rank == 1);
  CHECK(split_place(ck, 4).size == 0);
  CHECK(split_place(ck, 4).rank == -1);
}

TEST_CASE("gloo split: each group's collectives run among its members only, the world stays usable") {
  auto errors = run_gloo_ranks(4, [](Communicator& world) {
    const int r = world.rank();
    // Two groups, the even and the odd ranks, each ranked in reverse (key -rank); both
    // run their collectives at once.
    std::unique_ptr<Communicator> g = world.split(r % 2, -r);
    if (g == nullptr) throw std::runtime_error("no group");
    if (g->size() != 2 || g->rank() != (r < 2 ? 1 : 0))
      throw std::runtime_error("rank " + std::to_string(g->rank()) + " of " + std::to_string(g->size()));
    float v = static_cast<float>(r + 1);
    g->allreduce(&v, &v, 1, DType::F32, ReduceOp::SUM);
    const float want = r % 2 == 0 ? 1.0f + 3.0f : 2.0f + 4.0f;
    if (v != want) throw std::runtime_error("group sum " + std::to_string(v));
    const float mine = static_cast<float>(r);
    float all[2] = {-1, -1};
    g->all_gather(&mine, all, 1, DType::F32);
    const int hi = r % 2 == 0 ? 2 : 3;  // the group's rank 0 (the larger world rank)
    if (all[0] != static_cast<float>(hi) || all[1] != static_cast<float>(hi - 2))
      throw std::runtime_error("group gather " + std::to_string(all[0]) + " " + std::to_string(all[1]));
    float w = 1.0f;
    world.allreduce(&w, &w, 1, DType::F32, ReduceOp::SUM);
    if (w != 4.0f) throw std::runtime_error("world sum " + std::to_string(w));
    // A second split: rank 3 stays out, the others form one group of 3.
    std::unique_ptr<Communicator> h = world.split(r == 3 ? -1 : 7, 0);
    if (r == 3) {
      if (h != nullptr) throw std::runtime_error("rank 3 got a group");
      return;
    }
    if (h == nullptr || h->size() != 3 || h->rank() != r) throw std::runtime_error("second split");
    float x = static_cast<float>(r + 1);
    h->allreduce(&x, &x, 1, DType::F32, ReduceOp::SUM);
    if (x != 6.0f) throw std::runtime_error("second group sum " + std::to_string(x));
  });
  check_all_passed(errors);
}

TEST_CASE("gloo split: the scenario every backend runs, at 4 ranks and at 3 (groups of 2 and 1)") {
  for (int n : {4, 3}) {
    CAPTURE(n);
    check_all_passed(run_gloo_ranks(n, [](Communicator& world) { dtrain::test::split_check(world); }));
  }
}
