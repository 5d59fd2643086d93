// The engine's NCCL subset: 2 and 3 ranks as threads (rank r on device r) over
// loopback: every collective x dtype x op against values computed here, in-place forms,
// blocking and non-blocking init, argument and init errors, dying and aborted ranks;
// ncclCommSplit of 4 ranks into groups that run at once, blocking and not, and its misuses.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include <doctest/doctest.h>

#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <type_traits>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

// Tests may only talk over loopback; bounded waits keep a broken build from hanging.
struct LoopbackOnly {
  LoopbackOnly() {
    setenv("NCCL_SOCKET_IFNAME", "lo", 1);
    setenv("NCCL_EMU_TIMEOUT_MS", "30000", 0);
  }
} loopback_only;

// Sets an environment variable for one test; only while no rank thread runs.
struct EnvSet {
  std::string name, old;
  bool had;
  EnvSet(const char* n, const std::string& v) : name(n) {
    const char* o = std::getenv(n);
    had = o != nullptr;
    if (had) old = o;
    setenv(n, v.c_str(), 1);
  }
  ~EnvSet() {
    if (had) setenv(name.c_str(), old.c_str(), 1);
    else unsetenv(name.c_str());
  }
};

void need(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error(what);
}
void need_nccl(ncclResult_t r, const std::string& what) { need(r == ncclSuccess, what + ": " + ncclGetErrorString(r)); }
void need_cuda(cudaError_t e, const std::string& what) { need(e == cudaSuccess, what + ": " + cudaGetErrorString(e)); }

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Polls until the communicator leaves ncclInProgress.
ncclResult_t wait_async(ncclComm_t comm, double limit_s = 20) {
  const auto t0 = Clock::now();
  ncclResult_t s = ncclInProgress;
  while (s == ncclInProgress && seconds_since(t0) < limit_s) {
    if (ncclCommGetAsyncError(comm, &s) != ncclSuccess) return ncclInternalError;
    if (s == ncclInProgress) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return s;
}

// Polls until the communicator reports an error (or limit_s passes: ncclSuccess).
ncclResult_t wait_error(ncclComm_t comm, double limit_s = 10) {
  const auto t0 = Clock::now();
  ncclResult_t s = ncclSuccess;
  while ((s == ncclSuccess || s == ncclInProgress) && seconds_since(t0) < limit_s) {
    if (ncclCommGetAsyncError(comm, &s) != ncclSuccess) return ncclInternalError;
    if (s == ncclSuccess || s == ncclInProgress) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return s;
}

struct Rank {
  int rank, n;
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
};

// Runs body on n rank threads (rank r on device r, one communicator each, on a stream
// of its own) and returns each rank's failure, "" when it passed. body owns nothing:
// the harness finalizes and destroys, unless body already aborted (comm == nullptr).
std::vector<std::string> run_ranks(int n, const std::function<void(Rank&)>& body, bool blocking = true) {
  ncclUniqueId id;
  if (ncclGetUniqueId(&id) != ncclSuccess) return std::vector<std::string>(n, "ncclGetUniqueId failed");
  std::vector<std::string> errors(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      Rank k{r, n};
      try {
        need_cuda(cudaSetDevice(r), "cudaSetDevice");
        need_cuda(cudaStreamCreate(&k.stream), "cudaStreamCreate");
        if (blocking) {
          need_nccl(ncclCommInitRank(&k.comm, n, id, r), "ncclCommInitRank");
        } else {
          ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
          cfg.blocking = 0;
          const ncclResult_t r0 = ncclCommInitRankConfig(&k.comm, n, id, r, &cfg);
          need(r0 == ncclInProgress || r0 == ncclSuccess, "non-blocking init returned " + std::to_string(r0));
          need_nccl(wait_async(k.comm), "non-blocking init");
        }
        body(k);
        need_cuda(cudaStreamSynchronize(k.stream), "cudaStreamSynchronize");
        if (k.comm) {
          ncclResult_t s;
          need_nccl(ncclCommGetAsyncError(k.comm, &s), "ncclCommGetAsyncError");
          need_nccl(s, std::string("async error (") + ncclGetLastError(k.comm) + ")");
          need_nccl(ncclCommFinalize(k.comm), "ncclCommFinalize");
          need_nccl(ncclCommDestroy(std::exchange(k.comm, nullptr)), "ncclCommDestroy");
        }
      } catch (const std::exception& e) {
        errors[r] = e.what();
        if (k.comm) ncclCommAbort(k.comm);
      }
      if (k.stream) cudaStreamDestroy(k.stream);
    });
  for (auto& t : threads) t.join();
  return errors;
}

void require_passed(const std::vector<std::string>& errors) {
  for (size_t r = 0; r < errors.size(); ++r) {
    INFO("rank " << r << ": " << errors[r]);
    CHECK(errors[r].empty());
  }
}

// ----------------------------------------------------------------------------
// Element types: conversions, and the reference result computed the way NCCL's
// contract reads (16-bit floats in fp32, rank order, one rounding; ncclAvg = sum / n).
template <typename T>
float to_f(T v) {
  if constexpr (std::is_same_v<T, __half>) return __half2float(v);
  else if constexpr (std::is_same_v<T, __nv_bfloat16>) return __bfloat162float(v);
  else return static_cast<float>(v);
}
template <typename T>
T from_f(double v) {
  if constexpr (std::is_same_v<T, __half>) return __float2half_rn(static_cast<float>(v));
  else if constexpr (std::is_same_v<T, __nv_bfloat16>) return __float2bfloat16_rn(static_cast<float>(v));
  else return static_cast<T>(v);
}
template <typename T>
bool same_bits(T a, T b) {
  return std::memcmp(&a, &b, sizeof(T)) == 0;
}

// Small values (exact in every dtype, no integer overflow); quarters on odd ranks for
// the float types.
template <typename T>
T input(int rank, size_t i) {
  const double v = static_cast<double>((i * 7 + rank * 5) % 11) - (std::is_unsigned_v<T> ? 0 : 5);
  return from_f<T>(std::is_integral_v<T> ? v : v + 0.25 * (rank % 2));
}

template <typename T>
T reference(ncclRedOp_t op, int n, size_t i, const std::function<T(int, size_t)>& in) {
  using A = std::conditional_t<std::is_same_v<T, double>, double,
                               std::conditional_t<std::is_integral_v<T>, long long, float>>;
  auto load = [&](int r) {
    if constexpr (std::is_integral_v<T> || std::is_same_v<T, double>) return static_cast<A>(in(r, i));
    else return to_f(in(r, i));
  };
  A acc = load(0);
  for (int r = 1; r < n; ++r) {
    const A v = load(r);
    if (op == ncclProd) acc *= v;
    else if (op == ncclMax) acc = std::max(acc, v);
    else if (op == ncclMin) acc = std::min(acc, v);
    else acc += v;
  }
  if (op == ncclAvg) acc = static_cast<A>(acc / static_cast<A>(n));
  if constexpr (std::is_same_v<T, double> || std::is_integral_v<T>) return static_cast<T>(acc);
  else return from_f<T>(acc);
}

template <typename T>
struct DevBuf {
  T* p = nullptr;
  size_t n;
  explicit DevBuf(size_t count) : n(count) {
    need_cuda(cudaMalloc(reinterpret_cast<void**>(&p), std::max<size_t>(count, 1) * sizeof(T)), "cudaMalloc");
  }
  ~DevBuf() { cudaFree(p); }
  void put(const std::vector<T>& h, size_t at = 0) {
    need_cuda(cudaMemcpy(p + at, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice), "upload");
  }
  std::vector<T> get(cudaStream_t s) {
    need_cuda(cudaStreamSynchronize(s), "sync");
    std::vector<T> h(n);
    need_cuda(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), "download");
    return h;
  }
};

template <typename T>
void expect_equal(const std::vector<T>& got, size_t from, size_t count, const std::function<T(size_t)>& want,
                  const std::string& what) {
  for (size_t i = 0; i < count; ++i)
    if (!same_bits(got[from + i], want(i)))
      throw std::runtime_error(what + ": element " + std::to_string(i) + " is " + std::to_string(to_f(got[from + i])) +
                               ", want " + std::to_string(to_f(want(i))));
}

ncclDataType_t dtype_of(float) { return ncclFloat32; }
ncclDataType_t dtype_of(double) { return ncclFloat64; }
ncclDataType_t dtype_of(__half) { return ncclFloat16; }
ncclDataType_t dtype_of(__nv_bfloat16) { return ncclBfloat16; }
ncclDataType_t dtype_of(int32_t) { return ncclInt32; }
ncclDataType_t dtype_of(uint8_t) { return ncclUint8; }
ncclDataType_t dtype_of(int64_t) { return ncclInt64; }

const ncclRedOp_t ALL_OPS[] = {ncclSum, ncclProd, ncclMax, ncclMin, ncclAvg};

// Every reducing collective for one dtype and op, out of place and in place.
template <typename T>
void reductions_check(Rank& k, ncclRedOp_t op, size_t count) {
  const int n = k.n, me = k.rank;
  const ncclDataType_t dt = dtype_of(T{});
  const std::string tag =
      "dtype " + std::to_string(dt) + " op " + std::to_string(op) + " count " + std::to_string(count);
  std::function<T(int, size_t)> in = input<T>;
  std::vector<T> mine(count * n);
  for (size_t i = 0; i < mine.size(); ++i) mine[i] = in(me, i);
  auto want = [&](size_t i) { return reference<T>(op, n, i, in); };

  DevBuf<T> send(count * n), recv(count * n);
  send.put(mine);
  need_nccl(ncclAllReduce(send.p, recv.p, count, dt, op, k.comm, k.stream), "ncclAllReduce");
  expect_equal<T>(recv.get(k.stream), 0, count, want, "allreduce " + tag);
  need_nccl(ncclAllReduce(send.p, send.p, count, dt, op, k.comm, k.stream), "in-place ncclAllReduce");
  expect_equal<T>(send.get(k.stream), 0, count, want, "in-place allreduce " + tag);

  send.put(mine);
  need_nccl(ncclReduceScatter(send.p, recv.p, count, dt, op, k.comm, k.stream), "ncclReduceScatter");
  auto want_rs = [&](size_t i) { return want(me * count + i); };
  expect_equal<T>(recv.get(k.stream), 0, count, want_rs, "reducescatter " + tag);
  need_nccl(ncclReduceScatter(send.p, send.p + me * count, count, dt, op, k.comm, k.stream),
            "in-place ncclReduceScatter");
  expect_equal<T>(send.get(k.stream), me * count, count, want_rs, "in-place reducescatter " + tag);

  const int root = n - 1;
  send.put(mine);
  need_nccl(ncclReduce(send.p, recv.p, count, dt, op, root, k.comm, k.stream), "ncclReduce");
  auto got = recv.get(k.stream);
  if (me == root) expect_equal<T>(got, 0, count, want, "reduce " + tag);
}

template <typename T>
void reductions_all_ops(Rank& k) {
  for (ncclRedOp_t op : ALL_OPS)
    for (size_t count : {size_t{1}, size_t{7}, size_t{1000}}) reductions_check<T>(k, op, count);
}

// Allgather and broadcast (no arithmetic: any dtype moves bits).
template <typename T>
void movement_check(Rank& k, size_t count) {
  const int n = k.n, me = k.rank;
  const ncclDataType_t dt = dtype_of(T{});
  std::vector<T> mine(count);
  for (size_t i = 0; i < count; ++i) mine[i] = input<T>(me, i);
  DevBuf<T> send(count), recv(count * n);
  send.put(mine);
  need_nccl(ncclAllGather(send.p, recv.p, count, dt, k.comm, k.stream), "ncclAllGather");
  auto got = recv.get(k.stream);
  for (int r = 0; r < n; ++r)
    expect_equal<T>(
        got, r * count, count, [&](size_t i) { return input<T>(r, i); }, "allgather from " + std::to_string(r));

  need_cuda(cudaMemset(recv.p, 0, count * n * sizeof(T)), "memset");
  recv.put(mine, me * count);
  need_nccl(ncclAllGather(recv.p + me * count, recv.p, count, dt, k.comm, k.stream), "in-place ncclAllGather");
  got = recv.get(k.stream);
  for (int r = 0; r < n; ++r)
    expect_equal<T>(
        got, r * count, count, [&](size_t i) { return input<T>(r, i); },
        "in-place allgather from " + std::to_string(r));

  for (int root = 0; root < n; ++root) {
    send.put(mine);
    need_nccl(ncclBroadcast(send.p, recv.p, count, dt, root, k.comm, k.stream), "ncclBroadcast");
    expect_equal<T>(
        recv.get(k.stream), 0, count, [&](size_t i) { return input<T>(root, i); }, "broadcast");
    need_nccl(ncclBroadcast(send.p, send.p, count, dt, root, k.comm, k.stream), "in-place ncclBroadcast");
    expect_equal<T>(
        send.get(k.stream), 0, count, [&](size_t i) { return input<T>(root, i); }, "in-place broadcast");
  }
}

int open_fds() {
  int n = 0;
  if (DIR* d = opendir("/proc/self/fd")) {
    while (readdir(d)) ++n;
    closedir(d);
  }
  return n;
}

uint16_t free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa);
  socklen_t len = sizeof sa;
  getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len);
  close(fd);
  return ntohs(sa.sin_port);
}

// ----------------------------------------------------------------------------
// Split: who lands where, computed here from every rank's (color, key) as NCCL documents it.

// The parent ranks of `color`'s new communicator in new-rank order: by key, ties by parent rank.
std::vector<int> split_members(const std::vector<int>& colors, const std::vector<int>& keys, int color) {
  std::vector<std::pair<int, int>> m;
  for (size_t q = 0; q < colors.size(); ++q)
    if (colors[q] == color) m.emplace_back(keys[q], static_cast<int>(q));
  std::sort(m.begin(), m.end());
  std::vector<int> out;
  for (const auto& x : m) out.push_back(x.second);
  return out;
}

// The new communicator g of parent rank `me` (on device `me`), whose members are `members`:
// its attributes, then an allreduce, a reduce-scatter and an all-gather of inputs that
// depend on the parent rank, against values computed here.
void split_group_check(ncclComm_t g, cudaStream_t stream, int me, const std::vector<int>& members) {
  const int n = static_cast<int>(members.size());
  const int rank = static_cast<int>(std::find(members.begin(), members.end(), me) - members.begin());
  int count = 0, user_rank = -1, dev = -1;
  need_nccl(ncclCommCount(g, &count), "ncclCommCount");
  need_nccl(ncclCommUserRank(g, &user_rank), "ncclCommUserRank");
  need_nccl(ncclCommCuDevice(g, &dev), "ncclCommCuDevice");
  need(count == n, "group size " + std::to_string(count) + ", want " + std::to_string(n));
  need(user_rank == rank, "group rank " + std::to_string(user_rank) + ", want " + std::to_string(rank));
  need(dev == me, "the group is on device " + std::to_string(dev) + ", its parent on " + std::to_string(me));
  const size_t per = 257;
  std::function<float(int, size_t)> in = [&](int q, size_t i) { return input<float>(members[q], i); };
  std::vector<float> mine(per * n);
  for (size_t i = 0; i < mine.size(); ++i) mine[i] = input<float>(me, i);
  DevBuf<float> send(per * n), recv(per * n);
  send.put(mine);
  need_nccl(ncclAllReduce(send.p, recv.p, per, ncclFloat32, ncclSum, g, stream), "group ncclAllReduce");
  expect_equal<float>(
      recv.get(stream), 0, per, [&](size_t i) { return reference<float>(ncclSum, n, i, in); }, "group allreduce");
  need_nccl(ncclReduceScatter(send.p, recv.p, per, ncclFloat32, ncclMax, g, stream), "group ncclReduceScatter");
  expect_equal<float>(
      recv.get(stream), 0, per, [&](size_t i) { return reference<float>(ncclMax, n, rank * per + i, in); },
      "group reducescatter");
  need_nccl(ncclAllGather(send.p, recv.p, per, ncclFloat32, g, stream), "group ncclAllGather");
  const auto got = recv.get(stream);
  for (int q = 0; q < n; ++q)
    expect_equal<float>(
        got, q * per, per, [&](size_t i) { return input<float>(members[q], i); },
        "group allgather from group rank " + std::to_string(q));
}

// The parent's allreduce over all its ranks, after its splits.
void parent_check(Rank& k) {
  DevBuf<int32_t> b(3);
  b.put({k.rank, 1, -k.rank});
  need_nccl(ncclAllReduce(b.p, b.p, 3, ncclInt32, ncclSum, k.comm, k.stream), "parent ncclAllReduce");
  const auto got = b.get(k.stream);
  need(got[0] == k.n * (k.n - 1) / 2 && got[1] == k.n && got[2] == -got[0], "parent allreduce after the split");
}

}  // namespace

// ----------------------------------------------------------------------------
TEST_CASE("nccl_emu: version, error strings and the config initializer") {
  int v = 0;
  CHECK(ncclGetVersion(&v) == ncclSuccess);
  CHECK(v == NCCL_VERSION_CODE);
  CHECK(NCCL_VERSION_CODE == 21903);
  CHECK(ncclFloat16 == 6);
  CHECK(ncclFloat32 == 7);
  CHECK(ncclBfloat16 == 9);
  CHECK(ncclInProgress == 7);
  CHECK(NCCL_SPLIT_NOCOLOR == -1);
  CHECK(std::string(ncclGetErrorString(ncclRemoteError)) == "remote process exited or there was a network error");
  CHECK(std::string(ncclGetErrorString(ncclSystemError)).rfind("unhandled system error", 0) == 0);
  ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
  CHECK(c.blocking == NCCL_CONFIG_UNDEF_INT);
  c.blocking = 0;
  CHECK(c.size == sizeof(ncclConfig_t));
  CHECK(ncclGroupStart() == ncclSuccess);
  CHECK(ncclGroupStart() == ncclSuccess);
  CHECK(ncclGroupEnd() == ncclSuccess);
  CHECK(ncclGroupEnd() == ncclSuccess);
  CHECK(ncclGroupEnd() == ncclInvalidUsage);
}

TEST_CASE("nccl_emu: reducing collectives, every dtype and op, 2 and 3 ranks") {
  for (int n : {2, 3}) {
    INFO("ranks " << n);
    require_passed(run_ranks(n, [](Rank& k) {
      int count = 0, dev = -1, rank = -1;
      need_nccl(ncclCommCount(k.comm, &count), "ncclCommCount");
      need_nccl(ncclCommCuDevice(k.comm, &dev), "ncclCommCuDevice");
      need_nccl(ncclCommUserRank(k.comm, &rank), "ncclCommUserRank");
      need(count == k.n && dev == k.rank && rank == k.rank, "communicator attributes");
      reductions_all_ops<float>(k);
      reductions_all_ops<__nv_bfloat16>(k);
      reductions_all_ops<__half>(k);
      reductions_all_ops<double>(k);
      reductions_all_ops<int32_t>(k);
      reductions_all_ops<int64_t>(k);
      reductions_all_ops<uint8_t>(k);
    }));
  }
}

TEST_CASE("nccl_emu: allgather and broadcast, out of place and in place") {
  for (int n : {1, 2, 3}) {
    INFO("ranks " << n);
    require_passed(run_ranks(n, [](Rank& k) {
      for (size_t count : {size_t{1}, size_t{333}, size_t{100000}}) {
        movement_check<float>(k, count);
        movement_check<__nv_bfloat16>(k, count);
      }
      movement_check<uint8_t>(k, 5);
    }));
  }
}

TEST_CASE("nccl_emu: 16-bit allreduce is bit-identical on every rank and rounds once") {
  const int n = 3;
  const size_t count = 4099;
  std::vector<std::vector<__nv_bfloat16>> results(n);
  auto in = [](int r, size_t i) {
    std::mt19937 rng(static_cast<unsigned>(r * 100003 + i));
    return __float2bfloat16_rn(std::uniform_real_distribution<float>(-3, 3)(rng));
  };
  require_passed(run_ranks(n, [&](Rank& k) {
    std::vector<__nv_bfloat16> mine(count);
    for (size_t i = 0; i < count; ++i) mine[i] = in(k.rank, i);
    DevBuf<__nv_bfloat16> b(count);
    b.put(mine);
    need_nccl(ncclAllReduce(b.p, b.p, count, ncclBfloat16, ncclAvg, k.comm, k.stream), "ncclAllReduce");
    results[k.rank] = b.get(k.stream);
  }));
  for (int r = 1; r < n; ++r) CHECK(std::memcmp(results[r].data(), results[0].data(), count * 2) == 0);
  std::function<__nv_bfloat16(int, size_t)> f = in;
  size_t bad = 0;
  for (size_t i = 0; i < count; ++i) bad += !same_bits(results[0][i], reference<__nv_bfloat16>(ncclAvg, n, i, f));
  CHECK(bad == 0);
}

TEST_CASE("nccl_emu: a collective reads its input in stream order") {
  require_passed(run_ranks(2, [](Rank& k) {
    const size_t count = 1 << 16;
    DevBuf<float> buf(count);
    need_cuda(cudaMemset(buf.p, 0, count * sizeof(float)), "memset");
    need_cuda(cudaDeviceSynchronize(), "sync");
    std::vector<float> host(count, static_cast<float>(k.rank + 1)), back(count, -1);
    // Nothing waits for the copy before the collective: only stream order makes the
    // collective see it (the engine's scheduler holds lazy work back otherwise).
    need_cuda(cudaMemcpyAsync(buf.p, host.data(), count * sizeof(float), cudaMemcpyHostToDevice, k.stream), "HtoD");
    need_nccl(ncclAllReduce(buf.p, buf.p, count, ncclFloat32, ncclSum, k.comm, k.stream), "ncclAllReduce");
    need_cuda(cudaMemcpyAsync(back.data(), buf.p, count * sizeof(float), cudaMemcpyDeviceToHost, k.stream), "DtoH");
    need_cuda(cudaStreamSynchronize(k.stream), "sync");
    for (size_t i = 0; i < count; ++i) need(back[i] == 3.0f, "element " + std::to_string(i));
  }));
}

TEST_CASE("nccl_emu: non-blocking init, non-blocking finalize") {
  require_passed(run_ranks(
      2,
      [](Rank& k) {
        DevBuf<float> b(64);
        b.put(std::vector<float>(64, 1.0f));
        need_nccl(ncclAllReduce(b.p, b.p, 64, ncclFloat32, ncclSum, k.comm, k.stream), "ncclAllReduce");
        const ncclResult_t r = ncclCommFinalize(k.comm);
        need(r == ncclInProgress || r == ncclSuccess, "non-blocking finalize returned " + std::to_string(r));
        need_nccl(wait_async(k.comm), "finalize");
        need(b.get(k.stream)[63] == 2.0f, "allreduce before finalize");
        need(ncclAllReduce(b.p, b.p, 64, ncclFloat32, ncclSum, k.comm, k.stream) == ncclInvalidUsage,
             "collective after finalize");
        need_nccl(ncclCommDestroy(std::exchange(k.comm, nullptr)), "destroy");
      },
      /*blocking=*/false));
}

TEST_CASE("nccl_emu: bad arguments are rejected at call time and enqueue nothing") {
  require_passed(run_ranks(2, [](Rank& k) {
    const size_t count = 16;
    DevBuf<float> a(count), big(count * 2);
    std::vector<float> host(count);
    float* pinned = nullptr;
    need_cuda(cudaMallocHost(reinterpret_cast<void**>(&pinned), count * sizeof(float)), "cudaMallocHost");
    auto bad = [&](ncclResult_t r, const char* what) {
      need(r == ncclInvalidArgument, std::string(what) + " accepted");
    };
    bad(ncclAllReduce(host.data(), a.p, count, ncclFloat32, ncclSum, k.comm, k.stream), "host sendbuff");
    bad(ncclAllReduce(a.p, pinned, count, ncclFloat32, ncclSum, k.comm, k.stream), "pinned recvbuff");
    bad(ncclAllReduce(a.p, a.p, count + 1, ncclFloat32, ncclSum, k.comm, k.stream), "count past the buffer");
    bad(ncclAllReduce(a.p + 1, a.p + 1, count, ncclFloat32, ncclSum, k.comm, k.stream), "buffer shifted past its end");
    bad(ncclAllReduce(a.p, a.p, count, static_cast<ncclDataType_t>(15), ncclSum, k.comm, k.stream), "bad dtype");
    bad(ncclAllReduce(a.p, a.p, count, ncclFloat32, static_cast<ncclRedOp_t>(9), k.comm, k.stream), "bad op");
    bad(ncclAllGather(a.p, a.p, count, ncclFloat32, k.comm, k.stream), "allgather recvbuff too small");
    bad(ncclReduceScatter(a.p, big.p, count, ncclFloat32, ncclSum, k.comm, k.stream),
        "reducescatter sendbuff too small");
    bad(ncclBroadcast(a.p, a.p, count, ncclFloat32, 2, k.comm, k.stream), "root == nranks");
    bad(ncclBroadcast(a.p, a.p, count, ncclFloat32, -1, k.comm, k.stream), "root -1");
    bad(ncclAllReduce(a.p, a.p, count, ncclFloat32, ncclSum, nullptr, k.stream), "NULL comm");
    // A stream and a buffer of the other device.
    const int other = 1 - k.rank;
    cudaStream_t foreign = nullptr;
    float* foreign_buf = nullptr;
    need_cuda(cudaSetDevice(other), "set device");
    need_cuda(cudaStreamCreate(&foreign), "stream");
    need_cuda(cudaMalloc(reinterpret_cast<void**>(&foreign_buf), count * sizeof(float)), "malloc");
    need_cuda(cudaSetDevice(k.rank), "set device");
    bad(ncclAllReduce(a.p, a.p, count, ncclFloat32, ncclSum, k.comm, foreign), "stream of another device");
    bad(ncclAllReduce(a.p, foreign_buf, count, ncclFloat32, ncclSum, k.comm, k.stream), "buffer of another device");
    // count 0 is a no-op, even with null buffers.
    need_nccl(ncclAllReduce(nullptr, nullptr, 0, ncclFloat32, ncclSum, k.comm, k.stream), "count 0");
    // Nothing was enqueued: the next real collective still pairs up with the peer's.
    a.put(std::vector<float>(count, 2.0f));
    need_nccl(ncclAllReduce(a.p, a.p, count, ncclFloat32, ncclSum, k.comm, k.stream), "ncclAllReduce");
    need(a.get(k.stream)[count - 1] == 4.0f, "allreduce after rejected calls");
    // Only now: cudaFree synchronises the other device, whose rank may still be waiting
    // for this rank's collective.
    need_cuda(cudaStreamDestroy(foreign), "stream destroy");
    need_cuda(cudaFree(foreign_buf), "free");
    cudaFreeHost(pinned);
  }));
}

TEST_CASE("nccl_emu: init argument errors") {
  ncclUniqueId id;
  REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
  ncclComm_t c = nullptr;
  CHECK(ncclCommInitRank(&c, 0, id, 0) == ncclInvalidArgument);
  CHECK(ncclCommInitRank(&c, 2, id, 2) == ncclInvalidArgument);
  CHECK(ncclCommInitRank(&c, 2, id, -1) == ncclInvalidArgument);
  CHECK(c == nullptr);
  ncclUniqueId junk{};
  CHECK(ncclCommInitRank(&c, 1, junk, 0) == ncclInvalidArgument);
  ncclConfig_t cfg{};  // not from NCCL_CONFIG_INITIALIZER
  CHECK(ncclCommInitRankConfig(&c, 1, id, 0, &cfg) == ncclInvalidArgument);
  // The id still works for a real (single-rank) communicator.
  REQUIRE(ncclCommInitRank(&c, 1, id, 0) == ncclSuccess);
  CHECK(ncclCommDestroy(c) == ncclSuccess);
  CHECK(ncclCommDestroy(nullptr) == ncclSuccess);
  CHECK(ncclCommAbort(nullptr) == ncclSuccess);
}

TEST_CASE("nccl_emu: inconsistent ranks fail every init instead of hanging") {
  auto init_pair = [](int n0, int r0, int d0, int n1, int r1, int d1) {
    ncclUniqueId id;
    REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
    ncclResult_t res[2];
    auto go = [&](int i, int n, int r, int d) {
      cudaSetDevice(d);
      ncclComm_t c = nullptr;
      res[i] = ncclCommInitRank(&c, n, id, r);
      if (c) ncclCommAbort(c);
    };
    std::thread t0(go, 0, n0, r0, d0), t1(go, 1, n1, r1, d1);
    t0.join();
    t1.join();
    return std::make_pair(res[0], res[1]);
  };
  auto [a, b] = init_pair(2, 0, 0, 3, 1, 1);  // nranks disagree
  CHECK(a == ncclInvalidUsage);
  CHECK(b == ncclInvalidUsage);
  std::tie(a, b) = init_pair(2, 1, 0, 2, 1, 1);  // rank 1 twice
  CHECK(a == ncclInvalidUsage);
  CHECK(b == ncclInvalidUsage);
  std::tie(a, b) = init_pair(2, 0, 0, 2, 1, 0);  // two ranks of one process on one device
  CHECK(a == ncclInvalidUsage);
  CHECK(b == ncclInvalidUsage);
}

TEST_CASE("nccl_emu: NCCL_COMM_ID and NCCL_SOCKET_IFNAME") {
  {
    EnvSet env("NCCL_COMM_ID", "127.0.0.1:" + std::to_string(free_port()));
    std::vector<std::string> errors(2);
    std::vector<std::thread> ts;
    for (int r = 0; r < 2; ++r)
      ts.emplace_back([&, r] {
        try {
          need_cuda(cudaSetDevice(r), "set device");
          ncclUniqueId id;  // every process derives the same id from the variable
          need_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
          ncclComm_t c = nullptr;
          need_nccl(ncclCommInitRank(&c, 2, id, r), "init");
          DevBuf<int32_t> b(3);
          b.put({r, r, r});
          need_nccl(ncclAllReduce(b.p, b.p, 3, ncclInt32, ncclSum, c, nullptr), "allreduce");
          need(b.get(nullptr)[2] == 1, "sum");
          need_nccl(ncclCommDestroy(c), "destroy");
        } catch (const std::exception& e) {
          errors[r] = e.what();
        }
      });
    for (auto& t : ts) t.join();
    require_passed(errors);
  }
  {
    EnvSet env("NCCL_SOCKET_IFNAME", "=lo");
    require_passed(run_ranks(2, [](Rank&) {}));
  }
  {
    EnvSet env("NCCL_SOCKET_IFNAME", "=no_such_if0");
    ncclUniqueId id;
    CHECK(ncclGetUniqueId(&id) == ncclSystemError);
  }
}

TEST_CASE("nccl_emu: a rank that aborts mid-collective fails its peer promptly") {
  for (int n : {2, 3}) {
    INFO("ranks " << n);
    std::atomic<bool> peer_waiting{false};
    require_passed(run_ranks(n, [&](Rank& k) {
      const size_t count = 1 << 20;
      DevBuf<float> b(count);
      b.put(std::vector<float>(count, 5.0f));
      if (k.rank == n - 1) {
        // Never joins the collective; aborts once the others are blocked in it.
        while (!peer_waiting.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        need_nccl(ncclCommAbort(std::exchange(k.comm, nullptr)), "abort");
        return;
      }
      need_nccl(ncclAllReduce(b.p, b.p, count, ncclFloat32, ncclSum, k.comm, k.stream), "ncclAllReduce");
      peer_waiting.store(true);
      const auto t0 = Clock::now();
      const ncclResult_t s = wait_error(k.comm);
      need(s == ncclRemoteError, std::string("async error ") + ncclGetErrorString(s));
      need(seconds_since(t0) < 10, "error took too long");
      need_cuda(cudaStreamSynchronize(k.stream), "the stream goes on after the failed collective");
      need(b.get(k.stream)[count - 1] == 5.0f, "output left as it was");
      // Later collectives report the error and change nothing.
      need(ncclAllReduce(b.p, b.p, count, ncclFloat32, ncclSum, k.comm, k.stream) == ncclRemoteError,
           "collective on a failed communicator");
      const auto t1 = Clock::now();
      need_nccl(ncclCommAbort(std::exchange(k.comm, nullptr)), "abort");
      need(seconds_since(t1) < 2, "abort took too long");
    }));
  }
}

TEST_CASE("nccl_emu: ncclCommAbort from the host unblocks a collective the executor is stuck in") {
  std::atomic<bool> aborted{false};
  require_passed(run_ranks(2, [&](Rank& k) {
    DevBuf<float> b(1024);
    b.put(std::vector<float>(1024, 1.0f));
    if (k.rank == 1) {
      // Stays alive and idle; learns about the peer's abort on its next collective.
      while (!aborted.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      need_nccl(ncclAllReduce(b.p, b.p, 1024, ncclFloat32, ncclSum, k.comm, k.stream), "ncclAllReduce");
      const ncclResult_t s = wait_error(k.comm);
      need(s == ncclRemoteError, std::string("async error ") + ncclGetErrorString(s));
      need_nccl(ncclCommAbort(std::exchange(k.comm, nullptr)), "abort");
      return;
    }
    need_nccl(ncclAllReduce(b.p, b.p, 1024, ncclFloat32, ncclSum, k.comm, k.stream), "ncclAllReduce");
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    need(cudaStreamQuery(k.stream) == cudaErrorNotReady, "collective should still be waiting for its peer");
    const auto t0 = Clock::now();
    need_nccl(ncclCommAbort(std::exchange(k.comm, nullptr)), "abort");
    need(seconds_since(t0) < 2, "abort took too long");
    need_cuda(cudaStreamSynchronize(k.stream), "stream after abort");
    aborted.store(true);
  }));
}

TEST_CASE("nccl_emu: a peer that stops taking part times out, bounded by NCCL_EMU_TIMEOUT_MS") {
  EnvSet env("NCCL_EMU_TIMEOUT_MS", "300");
  std::atomic<bool> done{false};
  require_passed(run_ranks(2, [&](Rank& k) {
    if (k.rank == 1) {
      while (!done.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      need_nccl(ncclCommAbort(std::exchange(k.comm, nullptr)), "abort");
      return;
    }
    DevBuf<float> b(8);
    const auto t0 = Clock::now();
    need_nccl(ncclAllReduce(b.p, b.p, 8, ncclFloat32, ncclSum, k.comm, k.stream), "ncclAllReduce");
    const ncclResult_t s = wait_error(k.comm);
    done.store(true);
    need(s == ncclSystemError, std::string("async error ") + ncclGetErrorString(s));
    need(seconds_since(t0) < 5, "timeout not honoured");
    need_nccl(ncclCommAbort(std::exchange(k.comm, nullptr)), "abort");
  }));
}

// Two ranks that issued different operations: both saw an error, at least one of them
// ncclInvalidUsage (the mismatch itself; the other may see the abort that follows).
static void check_mismatch_seen(const std::vector<ncclResult_t>& seen) {
  CHECK((seen[0] == ncclInvalidUsage || seen[1] == ncclInvalidUsage));
  CHECK(seen[0] != ncclSuccess);
  CHECK(seen[1] != ncclSuccess);
}

TEST_CASE("nccl_emu: ranks issuing different collectives get an error, not mixed data") {
  std::vector<ncclResult_t> seen(2, ncclSuccess);
  require_passed(run_ranks(2, [&](Rank& k) {
    DevBuf<float> a(8), b(16);
    if (k.rank == 0) need_nccl(ncclAllReduce(a.p, a.p, 8, ncclFloat32, ncclSum, k.comm, k.stream), "allreduce");
    else need_nccl(ncclAllGather(a.p, b.p, 8, ncclFloat32, k.comm, k.stream), "allgather");
    need_cuda(cudaStreamSynchronize(k.stream), "sync");
    seen[k.rank] = wait_error(k.comm);
    ncclCommAbort(std::exchange(k.comm, nullptr));
  }));
  check_mismatch_seen(seen);
}

TEST_CASE("nccl_emu: ncclCommInitAll and no leaked descriptors") {
  require_passed(run_ranks(2, [](Rank&) {}));  // warm up the devices' executors
  // A bootstrap root may still be closing its sockets after the last rank's reply.
  int fds_before = open_fds();
  for (int quiet = 0; quiet < 5;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    const int now = open_fds();
    quiet = now == fds_before ? quiet + 1 : 0;
    fds_before = now;
  }
  ncclComm_t comms[2] = {};
  REQUIRE(ncclCommInitAll(comms, 2, nullptr) == ncclSuccess);
  int dev = -1;
  CHECK(ncclCommCuDevice(comms[1], &dev) == ncclSuccess);
  CHECK(dev == 1);
  // One thread drives both ranks, as a single-process NCCL program would with a group.
  std::vector<float*> bufs(2);
  for (int d = 0; d < 2; ++d) {
    REQUIRE(cudaSetDevice(d) == cudaSuccess);
    REQUIRE(cudaMalloc(reinterpret_cast<void**>(&bufs[d]), 4 * sizeof(float)) == cudaSuccess);
    const float v[4] = {1, 2, 3, static_cast<float>(d)};
    REQUIRE(cudaMemcpy(bufs[d], v, sizeof v, cudaMemcpyHostToDevice) == cudaSuccess);
  }
  CHECK(ncclGroupStart() == ncclSuccess);
  for (int d = 0; d < 2; ++d) {
    REQUIRE(cudaSetDevice(d) == cudaSuccess);
    CHECK(ncclAllReduce(bufs[d], bufs[d], 4, ncclFloat32, ncclMax, comms[d], nullptr) == ncclSuccess);
  }
  CHECK(ncclGroupEnd() == ncclSuccess);
  for (int d = 0; d < 2; ++d) {
    REQUIRE(cudaSetDevice(d) == cudaSuccess);
    float v[4];
    REQUIRE(cudaMemcpy(v, bufs[d], sizeof v, cudaMemcpyDeviceToHost) == cudaSuccess);
    CHECK(v[3] == 1.0f);
    CHECK(v[2] == 3.0f);
    cudaFree(bufs[d]);
  }
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
  for (auto& c : comms) CHECK(ncclCommDestroy(c) == ncclSuccess);
  // The bootstrap root exits once every rank joined; give its thread a moment.
  const auto t0 = Clock::now();
  while (open_fds() > fds_before && seconds_since(t0) < 5) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  CHECK(open_fds() == fds_before);
}

TEST_CASE("nccl_emu: ncclCommSplit of 4 ranks: two groups (one ranked in reverse) at once, NOCOLOR gets NULL") {
  require_passed(run_ranks(4, [](Rank& k) {
    // Even and odd ranks; the odd ones ranked by descending parent rank (key -rank).
    const std::vector<int> colors = {0, 1, 0, 1}, keys = {0, -1, 2, -3};
    ncclComm_t g = nullptr;
    need_nccl(ncclCommSplit(k.comm, colors[k.rank], keys[k.rank], &g, nullptr), "ncclCommSplit");
    need(g != nullptr, "no communicator for a colored rank");
    const std::vector<int> members = split_members(colors, keys, colors[k.rank]);
    need(members == (k.rank % 2 == 0 ? std::vector<int>{0, 2} : std::vector<int>{3, 1}), "members");
    // Both groups run their collectives at the same time (the rank threads), on the
    // parent's stream: each communicator orders its own work.
    split_group_check(g, k.stream, k.rank, members);
    parent_check(k);
    need_nccl(ncclCommDestroy(g), "destroy the group");
    // Rank 3 stays out; the others share one color and one key (ties: parent order).
    const std::vector<int> colors2 = {7, 7, 7, NCCL_SPLIT_NOCOLOR}, keys2 = {5, 5, 5, 5};
    ncclComm_t h = reinterpret_cast<ncclComm_t>(&k);  // must come back overwritten
    need_nccl(ncclCommSplit(k.comm, colors2[k.rank], keys2[k.rank], &h, nullptr), "second ncclCommSplit");
    if (k.rank == 3) {
      need(h == nullptr, "NCCL_SPLIT_NOCOLOR got a communicator");
    } else {
      need(h != nullptr, "no communicator in the second split");
      split_group_check(h, k.stream, k.rank, split_members(colors2, keys2, 7));
      need_nccl(ncclCommDestroy(h), "destroy the second group");
    }
    parent_check(k);
  }));
}

TEST_CASE(
    "nccl_emu: non-blocking ncclCommSplit: newcomm only once every member has joined, the parent busy till then") {
  std::atomic<bool> checked{false};
  require_passed(run_ranks(
      4,
      [&](Rank& k) {
        // Rank 0 splits first and alone: the others wait until it has looked.
        if (k.rank != 0)
          while (!checked.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        ncclComm_t g = reinterpret_cast<ncclComm_t>(&k);
        const ncclResult_t r0 = ncclCommSplit(k.comm, k.rank / 2, 0, &g, nullptr);  // inherits non-blocking
        need(r0 == ncclInProgress, "non-blocking split returned " + std::to_string(r0));
        if (k.rank == 0) {
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
          ncclResult_t s = ncclSuccess;
          need_nccl(ncclCommGetAsyncError(k.comm, &s), "ncclCommGetAsyncError");
          need(s == ncclInProgress, "the parent is ready before its peers joined the split");
          need(g == nullptr, "newcomm set before the split completed");
          DevBuf<float> b(4);
          need(ncclAllReduce(b.p, b.p, 4, ncclFloat32, ncclSum, k.comm, k.stream) == ncclInvalidUsage,
               "a collective on the parent during its split");
          ncclComm_t g2 = nullptr;
          need(ncclCommSplit(k.comm, 0, 0, &g2, nullptr) == ncclInvalidUsage, "a second split during the first");
          checked.store(true);
        }
        need_nccl(wait_async(k.comm), "the split");
        need(g != nullptr, "no communicator after the split");
        need(wait_async(g) == ncclSuccess, "the new communicator is not ready once the split completed");
        split_group_check(g, k.stream, k.rank, k.rank < 2 ? std::vector<int>{0, 1} : std::vector<int>{2, 3});
        need_nccl(ncclCommDestroy(g), "destroy the group");
        parent_check(k);
        need_nccl(ncclCommDestroy(std::exchange(k.comm, nullptr)), "destroy");
      },
      /*blocking=*/false));
}

TEST_CASE("nccl_emu: ncclCommSplit blocks as its parent does; config sets the new communicator's mode") {
  for (bool parent_blocking : {true, false}) {
    CAPTURE(parent_blocking);
    require_passed(run_ranks(
        2,
        [&](Rank& k) {
          ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
          cfg.blocking = parent_blocking ? 0 : 1;  // the other mode for the new communicator
          ncclComm_t g = nullptr;
          const ncclResult_t r = ncclCommSplit(k.comm, 0, k.rank, &g, &cfg);
          if (parent_blocking) {
            need(r == ncclSuccess && g != nullptr, "a blocking parent's split returned " + std::to_string(r));
          } else {
            need(r == ncclInProgress, "a non-blocking parent's split returned " + std::to_string(r));
            need_nccl(wait_async(k.comm), "the split");
            need(g != nullptr, "no communicator after the split");
          }
          split_group_check(g, k.stream, k.rank, {0, 1});
          // A non-blocking communicator's finalize is in progress until polled; a blocking
          // one's is done on return.
          const ncclResult_t f = ncclCommFinalize(g);
          need(f == (parent_blocking ? ncclInProgress : ncclSuccess), "finalize returned " + std::to_string(f));
          need_nccl(wait_async(g), "finalize");
          need_nccl(ncclCommDestroy(g), "destroy the group");
          if (!parent_blocking) need_nccl(ncclCommDestroy(std::exchange(k.comm, nullptr)), "destroy");
        },
        parent_blocking));
  }
}

TEST_CASE("nccl_emu: ncclCommSplit misuse is refused at call time and consumes nothing") {
  std::atomic<bool> refused{false};
  require_passed(run_ranks(2, [&](Rank& k) {
    ncclComm_t g = nullptr;
    ncclConfig_t junk{};  // not from NCCL_CONFIG_INITIALIZER
    need(ncclCommSplit(k.comm, -2, 0, &g, nullptr) == ncclInvalidArgument, "color -2 accepted");
    need(ncclCommSplit(k.comm, 0, 0, nullptr, nullptr) == ncclInvalidArgument, "NULL newcomm accepted");
    need(ncclCommSplit(nullptr, 0, 0, &g, nullptr) == ncclInvalidArgument, "NULL comm accepted");
    need(ncclCommSplit(k.comm, 0, 0, &g, &junk) == ncclInvalidArgument, "a config without the initializer accepted");
    need_nccl(ncclGroupStart(), "ncclGroupStart");
    const ncclResult_t in_group = ncclCommSplit(k.comm, 0, 0, &g, nullptr);
    need_nccl(ncclGroupEnd(), "ncclGroupEnd");
    need(in_group == ncclInvalidUsage, "a split inside a group accepted");
    // Rank 0 splits with its allreduce outstanding (rank 1 has not issued its own yet).
    DevBuf<float> b(8);
    b.put(std::vector<float>(8, 1.0f));
    if (k.rank == 1)
      while (!refused.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    need_nccl(ncclAllReduce(b.p, b.p, 8, ncclFloat32, ncclSum, k.comm, k.stream), "ncclAllReduce");
    if (k.rank == 0) {
      need(ncclCommSplit(k.comm, 0, 0, &g, nullptr) == ncclInvalidUsage, "a split with a collective outstanding");
      refused.store(true);
    }
    need(b.get(k.stream)[7] == 2.0f, "the allreduce around the refused split");
    need(g == nullptr, "a refused split set newcomm");
    // The refused calls took no sequence number: the real split pairs up.
    need_nccl(ncclCommSplit(k.comm, 0, -k.rank, &g, nullptr), "ncclCommSplit");
    split_group_check(g, k.stream, k.rank, {1, 0});
    need_nccl(ncclCommDestroy(g), "destroy the group");
  }));
}

TEST_CASE("nccl_emu: a rank that runs a collective instead of the split fails both, not mixed data") {
  std::vector<ncclResult_t> seen(2, ncclSuccess);
  require_passed(run_ranks(2, [&](Rank& k) {
    DevBuf<float> b(8);
    if (k.rank == 0) {
      ncclComm_t g = nullptr;
      const ncclResult_t r = ncclCommSplit(k.comm, 0, 0, &g, nullptr);
      need(r != ncclSuccess && g == nullptr, "the split succeeded against a peer's allreduce");
    } else {
      need_nccl(ncclAllReduce(b.p, b.p, 8, ncclFloat32, ncclSum, k.comm, k.stream), "ncclAllReduce");
      need_cuda(cudaStreamSynchronize(k.stream), "sync");
    }
    seen[k.rank] = wait_error(k.comm);
    ncclCommAbort(std::exchange(k.comm, nullptr));
  }));
  check_mismatch_seen(seen);
}

TEST_CASE("nccl_emu: a split a peer never joins: aborted promptly, or timed out by NCCL_EMU_TIMEOUT_MS") {
  std::atomic<bool> done{false};
  auto peer_idle = [&](Rank& k) {
    while (!done.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    need_nccl(ncclCommAbort(std::exchange(k.comm, nullptr)), "abort");
  };
  require_passed(run_ranks(
      2,
      [&](Rank& k) {
        if (k.rank == 1) return peer_idle(k);
        ncclComm_t g = nullptr;
        need(ncclCommSplit(k.comm, 0, 0, &g, nullptr) == ncclInProgress, "non-blocking split");
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        ncclResult_t s = ncclSuccess;
        need_nccl(ncclCommGetAsyncError(k.comm, &s), "ncclCommGetAsyncError");
        need(s == ncclInProgress, "the split completed without its peer");
        const auto t0 = Clock::now();
        need_nccl(ncclCommAbort(std::exchange(k.comm, nullptr)), "abort");
        need(seconds_since(t0) < 2, "abort took too long");
        need(g == nullptr, "an aborted split set newcomm");
        done.store(true);
      },
      /*blocking=*/false));
  done.store(false);
  EnvSet env("NCCL_EMU_TIMEOUT_MS", "300");
  require_passed(run_ranks(2, [&](Rank& k) {
    if (k.rank == 1) return peer_idle(k);
    ncclComm_t g = nullptr;
    const auto t0 = Clock::now();
    const ncclResult_t r = ncclCommSplit(k.comm, 0, 0, &g, nullptr);
    done.store(true);
    need(r == ncclSystemError, std::string("blocking split without its peer: ") + ncclGetErrorString(r));
    need(seconds_since(t0) < 5, "timeout not honoured");
    need(g == nullptr, "a failed split set newcomm");
    ncclResult_t s = ncclSuccess;
    need_nccl(ncclCommGetAsyncError(k.comm, &s), "ncclCommGetAsyncError");
    need(s == ncclSystemError, "a failed split leaves its parent usable");
    need_nccl(ncclCommAbort(std::exchange(k.comm, nullptr)), "abort");
  }));
}
