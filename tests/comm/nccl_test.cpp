// NCCL backend: with a GPU, 2 ranks (one per GPU) or 1 rank run every collective
// against known results and abort(), and up to 4 ranks split into groups; without a GPU
// (or without CUDA) the GPU cases skip at run time and only the factory's error is checked.
#include "comm/buffer.h"
#include "comm/nccl_comm.h"
#include "comm/split_check.h"
#include "core/error.h"
#include "rank_threads.h"

#include <doctest/doctest.h>
#include <gloo/rendezvous/hash_store.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#ifdef DTRAIN_HAVE_CUDA
#include "kernels/device.cuh"
#endif

using namespace dtrain;
using namespace dtrain::comm;

namespace {

int visible_gpus() {
#ifdef DTRAIN_HAVE_CUDA
  return kernels::device_count();
#else
  return 0;
#endif
}

// Runs body on min(max_ranks, GPUs) ranks, rank r on device r. Returns per-rank failures.
std::vector<std::string> run_nccl(const std::function<void(Communicator&)>& body, int max_ranks = 2) {
  // Ranks talk over loopback only (NCCL, and the CPU execution engine's NCCL, would
  // otherwise pick the first non-loopback interface).
  ::setenv("NCCL_SOCKET_IFNAME", "lo", 0);
  const int n = std::min(max_ranks, visible_gpus());
  gloo::rendezvous::HashStore store;
  return test::run_threads(n, [&](int r) {
    NcclOptions o;
    o.timeout = std::chrono::milliseconds(60000);
    body(*comm_create_nccl(store, r, n, r, o));
  });
}

float value(int rank, size_t i) { return static_cast<float>(static_cast<int>((i * 5 + rank * 3) % 9) - 4); }

std::vector<char> host_input(DType t, int rank, size_t count, size_t offset = 0) {
  std::vector<char> v(count * dtype_size(t));
  for (size_t i = 0; i < count; ++i) dtype_store(v.data(), i, t, value(rank, offset + i));
  return v;
}

// First mismatch between the device buffer's first `count` elements and want(i).
std::string check_buffer(Communicator& c, const Buffer& b, DType t, size_t count,
                         const std::function<float(size_t)>& want, const char* what, size_t offset = 0) {
  c.synchronize();
  std::vector<char> host(count * dtype_size(t));
  b.copy_to_host(host.data(), host.size(), offset);
  for (size_t i = 0; i < count; ++i)
    if (dtype_load(host.data(), i, t) != want(i))
      return std::string(what) + " element " + std::to_string(i) + ": got " +
             std::to_string(dtype_load(host.data(), i, t)) + " want " + std::to_string(want(i));
  return "";
}

void require_all_passed(const std::vector<std::string>& errors) {
  for (size_t r = 0; r < errors.size(); ++r) {
    INFO("rank " << r);
    CHECK(errors[r] == "");
  }
}

// No device: exit code 77, which ctest reports as SKIPPED (never as passed).
bool skip_without_gpu() {
  if (visible_gpus() > 0) return false;
  std::printf("no CUDA device visible: the NCCL collective tests are skipped\n");
  std::fflush(stdout);
  std::exit(77);
}

}  // namespace

TEST_CASE("nccl factory without a usable device is an error, not a crash") {
  gloo::rendezvous::HashStore store;
#ifdef DTRAIN_HAVE_CUDA
  // An out-of-range device is a usage error whether or not GPUs exist.
  CHECK_THROWS_AS(comm_create_nccl(store, 0, 1, 4096, NcclOptions{}), UsageError);
#else
  CHECK_THROWS_AS(comm_create_nccl(store, 0, 1, 0, NcclOptions{}), DeviceError);
#endif
}

TEST_CASE("nccl allreduce sum/avg/max on fp32/bf16/fp16, in and out of place") {
  if (skip_without_gpu()) return;
  require_all_passed(run_nccl([](Communicator& c) {
    const int n = c.size();
    CHECK(c.on_device());
    const size_t count = 1000;
    for (DType t : {DType::F32, DType::BF16, DType::F16}) {
      for (ReduceOp op : {ReduceOp::SUM, ReduceOp::MAX, ReduceOp::AVG}) {
        auto want = [&](size_t i) {
          float sum = 0, mx = -1e30f;
          for (int r = 0; r < n; ++r) sum += value(r, i), mx = std::max(mx, value(r, i));
          // n <= 2: an integer sum halved is exact in every dtype, whichever way NCCL
          // orders the AVG division.
          char tmp[4];
          dtype_store(tmp, 0, t, op == ReduceOp::SUM ? sum : op == ReduceOp::MAX ? mx : sum / n);
          return dtype_load(tmp, 0, t);
        };
        Buffer send(c, count * dtype_size(t)), recv(c, count * dtype_size(t));
        auto in = host_input(t, c.rank(), count);
        send.copy_from_host(in.data(), in.size());
        c.allreduce(send.data(), recv.data(), count, t, op);
        auto err = check_buffer(c, recv, t, count, want, "out-of-place allreduce");
        if (!err.empty()) throw std::runtime_error(err);
        c.allreduce(send.data(), send.data(), count, t, op);
        err = check_buffer(c, send, t, count, want, "in-place allreduce");
        if (!err.empty()) throw std::runtime_error(err);
      }
    }
  }));
}

TEST_CASE("nccl reduce_scatter, all_gather, broadcast and barrier") {
  if (skip_without_gpu()) return;
  require_all_passed(run_nccl([](Communicator& c) {
    const int n = c.size();
    const DType t = DType::F32;
    const size_t per = 777;
    std::string err;
    // reduce_scatter (sum) out of place and in place.
    {
      Buffer send(c, per * n * 4), recv(c, per * 4);
      auto in = host_input(t, c.rank(), per * n);
      send.copy_from_host(in.data(), in.size());
      auto want = [&](size_t i) {
        float s = 0;
        for (int r = 0; r < n; ++r) s += value(r, c.rank() * per + i);
        return s;
      };
      c.reduce_scatter(send.data(), recv.data(), per, t, ReduceOp::SUM);
      err = check_buffer(c, recv, t, per, want, "reduce_scatter");
      if (err.empty()) {
        c.reduce_scatter(send.data(), send.at(c.rank() * per * 4), per, t, ReduceOp::SUM);
        err = check_buffer(c, send, t, per, want, "in-place reduce_scatter", c.rank() * per * 4);
      }
    }
    // all_gather out of place and in place.
    if (err.empty()) {
      Buffer send(c, per * 4), recv(c, per * n * 4);
      auto in = host_input(t, c.rank(), per, c.rank() * per);
      send.copy_from_host(in.data(), in.size());
      auto want = [&](size_t j) { return value(static_cast<int>(j / per), j); };
      c.all_gather(send.data(), recv.data(), per, t);
      err = check_buffer(c, recv, t, per * n, want, "all_gather");
      if (err.empty()) {
        recv.fill_bytes(0);
        recv.copy_from_host(in.data(), in.size(), c.rank() * per * 4);
        c.all_gather(recv.at(c.rank() * per * 4), recv.data(), per, t);
        err = check_buffer(c, recv, t, per * n, want, "in-place all_gather");
      }
    }
    // broadcast from every root.
    for (int root = 0; root < n && err.empty(); ++root) {
      Buffer buf(c, per * 2);
      auto in = host_input(DType::BF16, c.rank(), per);
      buf.copy_from_host(in.data(), in.size());
      c.broadcast(buf.data(), buf.data(), per, DType::BF16, root);
      err = check_buffer(
          c, buf, DType::BF16, per, [&](size_t i) { return value(root, i); }, "broadcast");
    }
    if (err.empty()) c.barrier();
    if (!err.empty()) throw std::runtime_error(err);
  }));
}

TEST_CASE("nccl bytes_sent counts what the ring algorithms send, per collective and dtype") {
  if (skip_without_gpu()) return;
  require_all_passed(run_nccl([](Communicator& c) {
    const uint64_t n = static_cast<uint64_t>(c.size());
    const size_t per = 1000;
    Buffer buf(c, per * n * 4);
    buf.fill_bytes(0);
    // Each ring pass sends (n-1)/n of its elements; an allreduce is two passes.
    const uint64_t before = c.bytes_sent();
    c.allreduce(buf.data(), buf.data(), per, DType::F32, ReduceOp::SUM);
    const uint64_t allreduce = c.bytes_sent() - before;
    c.reduce_scatter(buf.data(), buf.at(c.rank() * per * 2), per, DType::BF16, ReduceOp::SUM);
    const uint64_t scatter = c.bytes_sent() - before - allreduce;
    c.synchronize();
    std::string err;
    if (allreduce != 2 * per * 4 * (n - 1) / n) err = "allreduce counted " + std::to_string(allreduce) + " bytes";
    else if (scatter != per * n * 2 * (n - 1) / n)
      err = "bf16 reduce_scatter counted " + std::to_string(scatter) + " bytes";
    if (!err.empty()) throw std::runtime_error(err);
  }));
}

TEST_CASE("nccl abort: later collectives throw CommError") {
  if (skip_without_gpu()) return;
  require_all_passed(run_nccl([](Communicator& c) {
    c.barrier();
    c.abort();
    c.abort();  // idempotent
    Buffer b(c, 64);
    bool threw = false;
    try {
      c.allreduce(b.data(), b.data(), 16, DType::F32, ReduceOp::SUM);
      c.synchronize();
    } catch (const CommError&) {
      threw = true;
    }
    if (!threw) throw std::runtime_error("collective after abort() did not throw CommError");
  }));
}

TEST_CASE("nccl split: two groups at once (one ranked in reverse), the world usable after, a rank left out") {
  if (skip_without_gpu()) return;
  // 4 ranks where 4 devices are visible (the CPU execution engine has 8); fewer GPUs run the
  // same scenario on fewer ranks.
  require_all_passed(run_nccl([](Communicator& world) { test::split_check(world); }, 4));
}
