// The device-local communicator (comm/local_comm.h): 2, 3 and 4 ranks as threads on one
// CUDA device. Every collective in fp32, bf16 and fp16, in and out of place, at uneven
// sizes, equals Gloo's on the same inputs; on random inputs it equals a host reduction in
// rank order with fp32 accumulation bit for bit, twice; a rank that never arrives or calls
// another collective is a CommError naming it. Under the CPU execution engine, the
// mutation check: leaving out one entry wait is caught (wrong sums) by the engine's
// adversarial stream scheduler, while the full ordering passes. Split: 4 ranks into two
// groups of their own at once (the scenario every backend runs), and a rank that runs a
// collective while the others split.
#include "comm/gloo_comm.h"
#include "comm/local_comm.h"
#include "comm/split_check.h"
#include "core/dtype.h"
#include "core/error.h"
#include "gpu/gpu_skip.h"
#include "rank_threads.h"

#include <cuda_runtime.h>
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

using namespace dtrain;
using namespace dtrain::comm;

namespace {

using Bytes = std::vector<char>;

void need(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error(what);
}
void cuda(cudaError_t e, const char* what) { need(e == cudaSuccess, std::string(what) + ": " + cudaGetErrorString(e)); }

void require_all_passed(const std::vector<std::string>& errors) {
  for (size_t r = 0; r < errors.size(); ++r) {
    INFO("rank " << r);
    CHECK(errors[r] == "");
  }
}

// One device allocation of the calling thread's current device (the engine poisons it).
struct DevMem {
  char* p = nullptr;
  explicit DevMem(size_t bytes) {
    void* v = nullptr;
    cuda(cudaMalloc(&v, std::max<size_t>(bytes, 64)), "cudaMalloc");
    p = static_cast<char*>(v);
  }
  ~DevMem() { (void)cudaFree(p); }
  DevMem(const DevMem&) = delete;
  DevMem& operator=(const DevMem&) = delete;
};

// Runs body(comm) on n ranks (threads) of one group on device 0.
std::vector<std::string> run_local(int n, const std::function<void(Communicator&)>& body,
                                   const std::function<void(LocalGroup&)>& setup = nullptr,
                                   LocalOptions opts = LocalOptions{}) {
  auto group = local_group_create(n, 0, opts);
  if (setup) setup(*group);
  return test::run_threads(n, [&](int r) { body(*comm_create_local(group, r)); });
}

// ---------------------------------------------------------------------------
// Collectives as data: one rank's input in, its output out, on any backend.

enum class Kind { ALLREDUCE, REDUCE_SCATTER, ALL_GATHER, BROADCAST };

struct Case {
  Kind kind;
  DType dtype;
  ReduceOp op;
  size_t count;  // the call's count argument
  bool in_place;
  int root = 0;
};

std::string describe(const Case& k) {
  static const char* names[] = {"allreduce", "reduce_scatter", "all_gather", "broadcast"};
  return std::string(names[static_cast<int>(k.kind)]) + " " + dtype_name(k.dtype) + " " + reduce_op_name(k.op) +
         " count " + std::to_string(k.count) + (k.in_place ? " in place" : "") + " root " + std::to_string(k.root);
}

size_t in_elems(const Case& k, int n) { return k.kind == Kind::REDUCE_SCATTER ? k.count * n : k.count; }
size_t out_elems(const Case& k, int n) { return k.kind == Kind::ALL_GATHER ? k.count * n : k.count; }

// Integers in [-4, 4]: every sum is exact in every dtype and order (Gloo's ring, ours).
float int_value(int rank, size_t i) { return static_cast<float>(static_cast<int>((i * 5 + rank * 3) % 9) - 4); }
// Non-integers whose sums round: the order of the reduction shows in the bits.
float odd_value(int rank, size_t i) {
  const uint32_t h = static_cast<uint32_t>(i * 2654435761u) ^ static_cast<uint32_t>(rank * 40503 + 17);
  return static_cast<float>(h % 20011u) / 1337.0f - 7.3f;
}

Bytes input_of(const Case& k, int n, int rank, float (*value)(int, size_t)) {
  const size_t e = in_elems(k, n);
  Bytes v(e * dtype_size(k.dtype));
  for (size_t i = 0; i < e; ++i) dtype_store(v.data(), i, k.dtype, value(rank, i));
  return v;
}

// The case on c with `in` as this rank's input; returns this rank's output bytes. Device
// buffers are filled and read on the communicator's stream (ordered with the collective).
Bytes run_case(Communicator& c, const Case& k, const Bytes& in) {
  const int n = c.size(), r = c.rank();
  const size_t es = dtype_size(k.dtype), ib = in_elems(k, n) * es, ob = out_elems(k, n) * es;
  const size_t chunk = k.count * es;
  Bytes out(ob);
  if (!c.on_device()) {
    Bytes a(std::max(ib, ob) + 64), b(ob + 64);
    std::memcpy(k.kind == Kind::ALL_GATHER && k.in_place ? a.data() + r * chunk : a.data(), in.data(), ib);
    char* send = k.kind == Kind::ALL_GATHER && k.in_place ? a.data() + r * chunk : a.data();
    char* recv = !k.in_place ? b.data() : k.kind == Kind::REDUCE_SCATTER ? a.data() + r * chunk : a.data();
    switch (k.kind) {
      case Kind::ALLREDUCE: c.allreduce(send, recv, k.count, k.dtype, k.op); break;
      case Kind::REDUCE_SCATTER: c.reduce_scatter(send, recv, k.count, k.dtype, k.op); break;
      case Kind::ALL_GATHER: c.all_gather(send, recv, k.count, k.dtype); break;
      case Kind::BROADCAST: c.broadcast(send, recv, k.count, k.dtype, k.root); break;
    }
    std::memcpy(out.data(), recv, ob);
    return out;
  }
  auto s = static_cast<cudaStream_t>(c.collective_stream());
  DevMem a(std::max(ib, ob)), b(ob);
  char* send = k.kind == Kind::ALL_GATHER && k.in_place ? a.p + r * chunk : a.p;
  char* recv = !k.in_place ? b.p : k.kind == Kind::REDUCE_SCATTER ? a.p + r * chunk : a.p;
  cuda(cudaMemcpyAsync(send, in.data(), ib, cudaMemcpyHostToDevice, s), "upload");
  switch (k.kind) {
    case Kind::ALLREDUCE: c.allreduce(send, recv, k.count, k.dtype, k.op); break;
    case Kind::REDUCE_SCATTER: c.reduce_scatter(send, recv, k.count, k.dtype, k.op); break;
    case Kind::ALL_GATHER: c.all_gather(send, recv, k.count, k.dtype); break;
    case Kind::BROADCAST: c.broadcast(send, recv, k.count, k.dtype, k.root); break;
  }
  cuda(cudaMemcpyAsync(out.data(), recv, ob, cudaMemcpyDeviceToHost, s), "download");
  c.synchronize();
  return out;
}

// The ranks' outputs [rank][case] of `cases` run in order on every rank of `n`.
using Outputs = std::vector<std::vector<Bytes>>;
Outputs run_cases(int n, const std::vector<Case>& cases, float (*value)(int, size_t), bool gloo) {
  Outputs out(static_cast<size_t>(n));
  auto body = [&](Communicator& c) {
    auto& mine = out[static_cast<size_t>(c.rank())];
    for (const Case& k : cases) mine.push_back(run_case(c, k, input_of(k, n, c.rank(), value)));
  };
  require_all_passed(gloo ? test::run_gloo_ranks(n, body) : run_local(n, body));
  return out;
}

// Rank r's output computed on the host: rank order, fp32 accumulation, one rounding.
Bytes host_reference(const Case& k, int n, int rank, float (*value)(int, size_t)) {
  std::vector<Bytes> ins;
  for (int q = 0; q < n; ++q) ins.push_back(input_of(k, n, q, value));
  const size_t es = dtype_size(k.dtype);
  Bytes out(out_elems(k, n) * es);
  auto reduce_at = [&](size_t i) {
    float acc = dtype_load(ins[0].data(), i, k.dtype);
    for (int q = 1; q < n; ++q) {
      const float v = dtype_load(ins[static_cast<size_t>(q)].data(), i, k.dtype);
      acc = k.op == ReduceOp::MAX ? (v > acc ? v : acc) : acc + v;
    }
    return k.op == ReduceOp::AVG ? acc / static_cast<float>(n) : acc;
  };
  for (size_t i = 0; i < out_elems(k, n); ++i) {
    switch (k.kind) {
      case Kind::ALLREDUCE: dtype_store(out.data(), i, k.dtype, reduce_at(i)); break;
      case Kind::REDUCE_SCATTER: dtype_store(out.data(), i, k.dtype, reduce_at(rank * k.count + i)); break;
      case Kind::ALL_GATHER: std::memcpy(&out[i * es], &ins[i / k.count][(i % k.count) * es], es); break;
      case Kind::BROADCAST: std::memcpy(&out[i * es], &ins[static_cast<size_t>(k.root)][i * es], es); break;
    }
  }
  return out;
}

std::vector<Case> every_case(int n) {
  std::vector<Case> cases;
  for (DType t : {DType::F32, DType::BF16, DType::F16}) {
    for (bool in_place : {false, true}) {
      for (ReduceOp op : {ReduceOp::SUM, ReduceOp::AVG, ReduceOp::MAX})
        for (size_t count : {size_t{1}, size_t{1000}, size_t{4099}})
          cases.push_back({Kind::ALLREDUCE, t, op, count, in_place});
      for (ReduceOp op : {ReduceOp::SUM, ReduceOp::AVG}) cases.push_back({Kind::REDUCE_SCATTER, t, op, 333, in_place});
      cases.push_back({Kind::ALL_GATHER, t, ReduceOp::SUM, 257, in_place});
      cases.push_back({Kind::BROADCAST, t, ReduceOp::SUM, 1001, in_place, n - 1});
      cases.push_back({Kind::BROADCAST, t, ReduceOp::SUM, 7, in_place, 0});
    }
  }
  return cases;
}

size_t first_difference(const Bytes& a, const Bytes& b) {
  if (a.size() != b.size()) return 0;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i] != b[i]) return i;
  return a.size();
}

void check_equal(const Outputs& got, const Outputs& want, const std::vector<Case>& cases, const char* against) {
  for (size_t r = 0; r < got.size(); ++r)
    for (size_t i = 0; i < cases.size(); ++i) {
      const size_t at = first_difference(got[r][i], want[r][i]);
      INFO("rank " << r << ", " << describe(cases[i]) << ", against " << against << ", first differing byte " << at);
      CHECK(at == want[r][i].size());
    }
}

}  // namespace

// ---------------------------------------------------------------------------

TEST_CASE("local comm: every collective at 2, 3 and 4 ranks equals Gloo's (fp32/bf16/fp16, in and out of place)") {
  SKIP_WITHOUT_GPU();
  for (int n : {2, 3, 4}) {
    CAPTURE(n);
    const auto cases = every_case(n);
    const Outputs gloo = run_cases(n, cases, int_value, true);
    const Outputs local = run_cases(n, cases, int_value, false);
    check_equal(local, gloo, cases, "gloo");
  }
}

TEST_CASE("local comm: random inputs reduce in rank order with fp32 accumulation, the same bits every run") {
  SKIP_WITHOUT_GPU();
  for (int n : {2, 3, 4}) {
    CAPTURE(n);
    std::vector<Case> cases;
    for (DType t : {DType::F32, DType::BF16}) {
      for (ReduceOp op : {ReduceOp::SUM, ReduceOp::AVG, ReduceOp::MAX}) {
        cases.push_back({Kind::ALLREDUCE, t, op, 3001, false});
        cases.push_back({Kind::ALLREDUCE, t, op, 515, true});
      }
      cases.push_back({Kind::REDUCE_SCATTER, t, ReduceOp::SUM, 211, false});
      cases.push_back({Kind::REDUCE_SCATTER, t, ReduceOp::AVG, 211, true});
    }
    Outputs want(static_cast<size_t>(n));
    for (int r = 0; r < n; ++r)
      for (const Case& k : cases) want[static_cast<size_t>(r)].push_back(host_reference(k, n, r, odd_value));
    const Outputs first = run_cases(n, cases, odd_value, false);
    const Outputs second = run_cases(n, cases, odd_value, false);
    check_equal(first, want, cases, "the host reduction");
    check_equal(second, first, cases, "the first run");
  }
}

TEST_CASE("local comm: host collectives, barrier, zero counts, stream and byte count") {
  SKIP_WITHOUT_GPU();
  require_all_passed(run_local(3, [](Communicator& c) {
    need(c.on_device() && c.device() == 0 && c.size() == 3 && c.collective_stream() != nullptr, "identity");
    std::vector<float> v = {1.0f + c.rank(), 0.5f};
    c.allreduce_host(v.data(), v.size(), DType::F32, ReduceOp::SUM);
    need(v[0] == 6.0f && v[1] == 1.5f, "allreduce_host");
    std::vector<double> d = {static_cast<double>(c.rank())};
    allreduce_sum_host(&c, d);
    need(d[0] == 3.0, "allreduce_sum_host");
    const float mine[2] = {static_cast<float>(c.rank()), -1.0f};
    float all[6] = {};
    c.all_gather_host(mine, all, 2, DType::F32);
    for (int q = 0; q < 3; ++q) need(all[2 * q] == q && all[2 * q + 1] == -1.0f, "all_gather_host");
    c.allreduce(nullptr, nullptr, 0, DType::BF16, ReduceOp::SUM);  // count 0: nothing to move
    c.barrier();
    need(c.bytes_sent() > 0, "bytes_sent");
  }));
}

TEST_CASE("local comm: a rank that never arrives is a CommError naming it on every rank, not a hang") {
  SKIP_WITHOUT_GPU();
  LocalOptions opts;
  opts.timeout = std::chrono::milliseconds(300);
  std::atomic<int> failed{0};
  std::vector<std::string> seen(3);
  require_all_passed(run_local(
      3,
      [&](Communicator& c) {
        DevMem buf(64 * sizeof(float));
        if (c.rank() == 2) {
          // Stays away (its communicator alive) until the others have given up on it.
          while (failed.load() < 2) std::this_thread::sleep_for(std::chrono::milliseconds(5));
        } else {
          try {
            c.allreduce(buf.p, buf.p, 64, DType::F32, ReduceOp::SUM);
          } catch (const CommError& e) {
            seen[static_cast<size_t>(c.rank())] = e.what();
          }
          ++failed;
        }
        try {  // the group has failed: every later collective fails at once
          c.allreduce(buf.p, buf.p, 64, DType::F32, ReduceOp::SUM);
          seen[static_cast<size_t>(c.rank())] += " | no error afterwards";
        } catch (const CommError& e) {
          if (c.rank() == 2) seen[2] = e.what();
        }
      },
      nullptr, opts));
  for (int r = 0; r < 3; ++r) {
    INFO("rank " << r << ": " << seen[static_cast<size_t>(r)]);
    CHECK(seen[static_cast<size_t>(r)].find("rank(s) 2, which did not arrive") != std::string::npos);
    CHECK(seen[static_cast<size_t>(r)].find("no error afterwards") == std::string::npos);
  }
}

TEST_CASE("local comm: ranks calling different collectives, or a rank gone, is a CommError naming them") {
  SKIP_WITHOUT_GPU();
  std::vector<std::string> seen(2);
  require_all_passed(run_local(2, [&](Communicator& c) {
    DevMem buf(256 * sizeof(float));
    try {
      if (c.rank() == 0) c.allreduce(buf.p, buf.p, 256, DType::F32, ReduceOp::SUM);
      else c.all_gather(buf.p, buf.p, 128, DType::F32);
    } catch (const CommError& e) {
      seen[static_cast<size_t>(c.rank())] = e.what();
    }
  }));
  for (const auto& s : seen) {
    INFO(s);
    CHECK(s.find("allreduce of 256 float32 (sum)") != std::string::npos);
    CHECK(s.find("all_gather of 128 float32") != std::string::npos);
  }
  std::string gone;
  require_all_passed(run_local(2, [&](Communicator& c) {
    if (c.rank() == 1) return;  // its communicator is destroyed at once
    DevMem buf(64);
    try {
      c.allreduce(buf.p, buf.p, 16, DType::F32, ReduceOp::SUM);
    } catch (const CommError& e) {
      gone = e.what();
    }
  }));
  INFO(gone);
  CHECK(gone.find("rank 1 left the group") != std::string::npos);
}

TEST_CASE("local comm: abort() from another thread ends a rank's wait with a CommError; a rank joins once") {
  SKIP_WITHOUT_GPU();
  auto group = local_group_create(2, 0);  // the default timeout (60 s): only abort() ends the wait in time
  auto c0 = comm_create_local(group, 0);
  CHECK_THROWS_AS(comm_create_local(group, 0), UsageError);
  std::string seen;
  std::thread waiter([&] {
    seen = test::error_of([&] {
      DevMem b(64);
      c0->allreduce(b.p, b.p, 16, DType::F32, ReduceOp::SUM);  // rank 1 never comes
    });
  });
  c0->abort();
  waiter.join();
  INFO(seen);
  CHECK(seen.find("rank 0 called abort()") != std::string::npos);
}

TEST_CASE("local comm split: two groups at once (one ranked in reverse), the world usable after, a rank left out") {
  SKIP_WITHOUT_GPU();
  for (int n : {4, 3}) {
    CAPTURE(n);
    require_all_passed(run_local(n, [](Communicator& world) { test::split_check(world); }));
  }
  // The groups take the world's test switches: with the delay switch on (every collective
  // starting late, at staggered times), every result is still right.
  require_all_passed(run_local(
      4, [](Communicator& world) { test::split_check(world); }, [](LocalGroup& g) { local_group_delay(g, 200); }));
}

TEST_CASE("local comm split: a rank that runs a collective instead is a CommError naming both calls") {
  SKIP_WITHOUT_GPU();
  std::vector<std::string> seen(2);
  require_all_passed(run_local(2, [&](Communicator& c) {
    DevMem buf(64 * sizeof(float));
    try {
      if (c.rank() == 0) (void)c.split(0, 0);
      else c.allreduce(buf.p, buf.p, 64, DType::F32, ReduceOp::SUM);
    } catch (const CommError& e) {
      seen[static_cast<size_t>(c.rank())] = e.what();
    }
  }));
  for (const auto& s : seen) {
    INFO(s);
    CHECK(s.find("split") != std::string::npos);
    CHECK(s.find("allreduce of 64 float32 (sum)") != std::string::npos);
  }
}

// ---------------------------------------------------------------------------
// The mutation check. Each rank writes its input on a compute stream of its own and hands
// it to the collective through an event (as the ZeRO engine does). Rank 1 writes it as the
// last of a long chain of writes (NaN first), so rank 0, whose reduction does not wait for
// rank 1's entry in the mutant, reads rank 1's input before it exists: the engine runs work
// only when something waits for it, in a seeded random order among what the stream rules
// allow, so rank 0's short chain reaches its reduction long before rank 1's ends.

namespace {

constexpr int kChain = 64;

// The sums the ranks got wrong (0: all right) over `rounds` allreduces of n ranks.
int wrong_sums(int n, LocalFault fault, int rounds) {
  const size_t count = 4096, bytes = count * sizeof(float);
  std::atomic<int> wrong{0};
  require_all_passed(run_local(
      n,
      [&](Communicator& c) {
        std::vector<float> in(count), want(count), got(count);
        for (size_t i = 0; i < count; ++i) {
          in[i] = int_value(c.rank(), i);
          want[i] = 0.0f;
          for (int q = 0; q < n; ++q) want[i] += int_value(q, i);
        }
        auto comm_s = static_cast<cudaStream_t>(c.collective_stream());
        cudaStream_t compute = nullptr;
        cudaEvent_t ready = nullptr;
        cuda(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking), "stream");
        cuda(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), "event");
        DevMem stage(bytes), x(bytes), y(bytes);
        cuda(cudaMemcpyAsync(stage.p, in.data(), bytes, cudaMemcpyHostToDevice, compute), "upload");
        cuda(cudaStreamSynchronize(compute), "sync");
        c.barrier();  // nothing of the setup left to run
        for (int round = 0; round < rounds; ++round) {
          if (c.rank() == 1)
            for (int k = 0; k < kChain; ++k) cuda(cudaMemsetAsync(x.p, 0xff, bytes, compute), "memset");
          cuda(cudaMemcpyAsync(x.p, stage.p, bytes, cudaMemcpyDeviceToDevice, compute), "copy");
          cuda(cudaEventRecord(ready, compute), "record");
          cuda(cudaStreamWaitEvent(comm_s, ready, 0), "wait");
          c.allreduce(x.p, y.p, count, DType::F32, ReduceOp::SUM);
          cuda(cudaMemcpyAsync(got.data(), y.p, bytes, cudaMemcpyDeviceToHost, comm_s), "download");
          c.synchronize();
          if (std::memcmp(got.data(), want.data(), bytes) != 0) ++wrong;
          c.barrier();
        }
        cuda(cudaStreamSynchronize(compute), "sync");
        (void)cudaEventDestroy(ready);
        (void)cudaStreamDestroy(compute);
      },
      [&](LocalGroup& g) { local_group_inject(g, fault); }));
  return wrong.load();
}

}  // namespace

TEST_CASE("local comm mutation: every entry wait in place gives the right sums; one left out is caught") {
  SKIP_WITHOUT_GPU();
  for (int n : {2, 3}) {
    CAPTURE(n);
    CHECK(wrong_sums(n, LocalFault::NONE, 4) == 0);
#ifdef DTRAIN_CUDA_EMU
    // A GPU may or may not run the racing reads early; the engine's default scheduler always
    // can, and does (CUDA_EMU_SCHEDULE=fifo runs everything in issue order: nothing to see).
    const char* fifo = std::getenv("CUDA_EMU_SCHEDULE");
    if (fifo != nullptr && std::string(fifo) == "fifo") continue;
    const int wrong = wrong_sums(n, LocalFault::SKIP_ENTRY_WAIT, 4);
    MESSAGE(n << " ranks, one entry wait left out: " << wrong << " of " << 4 * n << " sums wrong");
    CHECK(wrong > 0);
#endif
  }
}
