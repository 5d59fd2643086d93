// ActivityCommunicator: in_collective() is true exactly while a call is inside the wrapped
// communicator (on any thread), the observer sees each 0 <-> 1 change, a throwing
// collective leaves the count right, and every call reaches the inner communicator; a group
// split from it is watched with the same count, clock and observer.
#include "comm/activity.h"

#include "core/error.h"

#include <doctest/doctest.h>

#include <atomic>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

using namespace dtrain;
using namespace dtrain::comm;

namespace {

// Runs `inside` in every collective and counts the calls; throws CommError when told to.
class FakeComm : public Communicator {
 public:
  std::function<void()> inside = [] {};
  bool fail = false;
  std::vector<std::string> calls;
  bool aborted = false;

  int rank() const override { return 1; }
  int size() const override { return 2; }
  Backend backend() const override { return Backend::GLOO; }
  bool on_device() const override { return false; }
  std::string device_name() const override { return "fake"; }
  void allreduce(const void*, void*, size_t, DType, ReduceOp) override { call("allreduce"); }
  void reduce_scatter(const void*, void*, size_t, DType, ReduceOp) override { call("reduce_scatter"); }
  void all_gather(const void*, void*, size_t, DType) override { call("all_gather"); }
  void broadcast(const void*, void*, size_t, DType, int) override { call("broadcast"); }
  void barrier() override { call("barrier"); }
  void synchronize() override { call("synchronize"); }
  void abort() override { aborted = true; }
  // The group: a FakeComm of its own (kept in `groups`), none for a negative color.
  std::unique_ptr<Communicator> split(int color, int) override {
    call("split");
    if (color < 0) return nullptr;
    auto g = std::make_unique<FakeComm>();
    groups.push_back(g.get());
    return g;
  }
  std::vector<FakeComm*> groups;

 private:
  void call(const char* name) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      calls.push_back(name);
    }
    inside();
    if (fail) throw CommError("peer lost");
  }
  std::mutex mu_;
};

}  // namespace

TEST_CASE("in_collective and the observer follow every call, also one that throws") {
  auto fake = std::make_unique<FakeComm>();
  FakeComm* f = fake.get();
  std::vector<bool> seen;  // in_collective() at each observer call
  ActivityCommunicator* self = nullptr;
  ActivityCommunicator c(std::move(fake), [&] { seen.push_back(self->in_collective()); });
  self = &c;
  CHECK(c.rank() == 1);
  CHECK(c.size() == 2);
  CHECK(c.device_name() == "fake");
  CHECK(!c.in_collective());

  std::vector<bool> inside;
  f->inside = [&] { inside.push_back(c.in_collective()); };
  float x = 0;
  c.allreduce(&x, &x, 1, DType::F32, ReduceOp::SUM);
  c.reduce_scatter(&x, &x, 1, DType::F32, ReduceOp::SUM);
  c.all_gather(&x, &x, 1, DType::F32);
  c.broadcast(&x, &x, 1, DType::F32, 0);
  c.barrier();
  c.synchronize();
  CHECK(f->calls ==
        std::vector<std::string>{"allreduce", "reduce_scatter", "all_gather", "broadcast", "barrier", "synchronize"});
  CHECK(inside == std::vector<bool>(6, true));
  CHECK(!c.in_collective());
  CHECK(seen.size() == 12);  // in and out of each
  for (size_t i = 0; i < seen.size(); ++i) CHECK(seen[i] == (i % 2 == 0));

  f->fail = true;
  CHECK_THROWS_AS(c.allreduce(&x, &x, 1, DType::F32, ReduceOp::SUM), CommError);
  CHECK(!c.in_collective());
  CHECK(seen.size() == 14);
  c.abort();
  CHECK(f->aborted);
}

TEST_CASE("two threads in collectives: in_collective until the last one leaves, one observer call each way") {
  auto fake = std::make_unique<FakeComm>();
  FakeComm* f = fake.get();
  std::atomic<int> observed{0};
  ActivityCommunicator c(std::move(fake), [&] { ++observed; });

  // Each call waits inside until released, so both threads are inside at once.
  std::mutex mu;
  std::condition_variable cv;
  int entered = 0;
  int released = 0;  // how many calls may leave
  f->inside = [&] {
    std::unique_lock<std::mutex> lock(mu);
    const int me = entered++;
    cv.notify_all();
    cv.wait_for(lock, std::chrono::seconds(10), [&] { return released > me; });
  };
  auto wait_entered = [&](int n) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, std::chrono::seconds(10), [&] { return entered >= n; });
  };
  auto release_one = [&] {
    std::lock_guard<std::mutex> lock(mu);
    ++released;
    cv.notify_all();
  };
  float x = 0;
  std::thread a([&] { c.allreduce(&x, &x, 1, DType::F32, ReduceOp::SUM); });
  REQUIRE(wait_entered(1));
  std::thread b([&] { c.barrier(); });
  REQUIRE(wait_entered(2));
  CHECK(c.in_collective());
  CHECK(observed == 1);  // 0 -> 1 only
  release_one();         // the first call leaves; the second is still inside
  a.join();
  CHECK(c.in_collective());
  CHECK(observed == 1);
  release_one();
  b.join();
  CHECK(!c.in_collective());
  CHECK(observed == 2);  // 1 -> 0
}

TEST_CASE("collective_seconds counts the time inside collectives, the open stretch included, and nothing outside") {
  auto fake = std::make_unique<FakeComm>();
  FakeComm* f = fake.get();
  ActivityCommunicator c(std::move(fake), nullptr);
  CHECK(c.collective_seconds() == 0.0);
  double during = -1;
  f->inside = [&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    during = c.collective_seconds();  // the open stretch: at least the sleep so far
  };
  float x = 0;
  c.allreduce(&x, &x, 1, DType::F32, ReduceOp::SUM);
  CHECK(during >= 0.03);
  const double after = c.collective_seconds();
  CHECK(after >= during);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  CHECK(c.collective_seconds() == after);  // outside: no growth
  f->fail = true;
  CHECK_THROWS_AS(c.barrier(), CommError);
  CHECK(c.collective_seconds() >= after + 0.03);  // a call that throws is counted too
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const double end = c.collective_seconds();
  CHECK(c.collective_seconds() == end);
}

TEST_CASE("a group split from a watched communicator is watched with its count, clock and observer") {
  auto fake = std::make_unique<FakeComm>();
  FakeComm* f = fake.get();
  int observed = 0;
  ActivityCommunicator c(std::move(fake), [&] { ++observed; });
  CHECK(c.split(-1, 0) == nullptr);
  CHECK(observed == 2);  // the split's own exchange is watched
  std::unique_ptr<Communicator> g = c.split(0, 0);
  REQUIRE(g != nullptr);
  REQUIRE(f->groups.size() == 1);
  FakeComm* inner = f->groups[0];
  CHECK(f->calls == std::vector<std::string>{"split", "split"});
  bool inside = false;
  double during = -1;
  inner->inside = [&] {
    inside = c.in_collective();  // the world's view of a group's collective
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    during = c.collective_seconds();
  };
  const double before = c.collective_seconds();
  float x = 0;
  g->allreduce(&x, &x, 1, DType::F32, ReduceOp::SUM);
  CHECK(inner->calls == std::vector<std::string>{"allreduce"});
  CHECK(inside);
  CHECK(observed == 6);
  CHECK(!c.in_collective());
  CHECK(during >= before + 0.03);
  // A group's call made while a call of the world is open is part of one stretch.
  f->inside = [&] { g->barrier(); };
  inner->inside = [] {};
  c.barrier();
  CHECK(observed == 8);  // one stretch: 0 -> 1 -> 0
  CHECK(!c.in_collective());
  inner->fail = true;
  CHECK_THROWS_AS(g->synchronize(), CommError);
  CHECK(!c.in_collective());
  CHECK(observed == 10);
}
