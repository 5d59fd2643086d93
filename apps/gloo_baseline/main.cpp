// gloo_baseline: gloo::allreduce (gloo/allreduce.h) driven exactly like
// `dtrain bench allreduce` (same sizes, warmup, iterations, out-of-place then in-place,
// times averaged per rank and max-reduced across ranks) and printed in the same
// nccl-tests columns, so scripts/bench_gloo_overhead.sh can put both side by side.
// One process per rank; they meet through a gloo FileStore in a shared directory.
//
//   gloo_baseline --rank R --size N --store DIR [--address A] [-b 1K] [-e 4M] [-f 2]
//                 [-n 20] [-w 5]
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <unistd.h>

namespace {

struct Options {
  int rank = -1, size = -1;
  std::string store, address;
  size_t min_bytes = 32, max_bytes = 32 << 20;
  double factor = 2;
  int iters = 20, warmup = 5;
};

// "8", "1K", "4M", "1G" (powers of 1024, like nccl-tests and dtrain bench).
size_t parse_size(const std::string& s) {
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  if (end == s.c_str() || v < 0) throw std::runtime_error("bad size '" + s + "'");
  switch (*end) {
    case 'k':
    case 'K':
      v *= 1024;
      ++end;
      break;
    case 'm':
    case 'M':
      v *= 1024 * 1024;
      ++end;
      break;
    case 'g':
    case 'G':
      v *= 1024.0 * 1024 * 1024;
      ++end;
      break;
    default: break;
  }
  if (*end == 'B' || *end == 'b') ++end;
  if (*end) throw std::runtime_error("bad size '" + s + "'");
  return static_cast<size_t>(v);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::runtime_error(a + " needs a value");
      return argv[++i];
    };
    if (a == "--rank") o.rank = std::stoi(value());
    else if (a == "--size") o.size = std::stoi(value());
    else if (a == "--store") o.store = value();
    else if (a == "--address") o.address = value();
    else if (a == "-b") o.min_bytes = parse_size(value());
    else if (a == "-e") o.max_bytes = parse_size(value());
    else if (a == "-f") o.factor = std::stod(value());
    else if (a == "-n") o.iters = std::stoi(value());
    else if (a == "-w") o.warmup = std::stoi(value());
    else throw std::runtime_error("unknown argument '" + a + "'");
  }
  if (o.size < 1 || o.rank < 0 || o.rank >= o.size || o.store.empty())
    throw std::runtime_error("--rank R --size N --store DIR are required (0 <= R < N)");
  if (o.factor <= 1 || o.iters < 1 || o.warmup < 0 || o.min_bytes > o.max_bytes)
    throw std::runtime_error("bad -f/-n/-w/-b/-e");
  return o;
}

// Input of rank r at element i: small integers, so every sum is exact in fp32.
float value(int r, size_t i) { return static_cast<float>((r + 1) * static_cast<int>(i % 7 + 1)); }

class Bench {
 public:
  Bench(std::shared_ptr<gloo::Context> ctx) : ctx_(std::move(ctx)) {}

  void allreduce(const float* in, float* out, size_t count) {
    gloo::AllreduceOptions opts(ctx_);
    if (in != out) opts.setInput(const_cast<float*>(in), count);
    opts.setOutput(out, count);
    opts.setReduceFunction(static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
    opts.setTag(tag_++);
    gloo::allreduce(opts);
  }

  void barrier() {
    gloo::BarrierOptions opts(ctx_);
    opts.setTag(tag_++);
    gloo::barrier(opts);
  }

  double max_across(double v) {
    gloo::AllreduceOptions opts(ctx_);
    opts.setOutput(&v, 1);
    opts.setReduceFunction(static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::max<double>));
    opts.setTag(tag_++);
    gloo::allreduce(opts);
    return v;
  }

  double sum_across(double v) {
    gloo::AllreduceOptions opts(ctx_);
    opts.setOutput(&v, 1);
    opts.setReduceFunction(static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<double>));
    opts.setTag(tag_++);
    gloo::allreduce(opts);
    return v;
  }

 private:
  std::shared_ptr<gloo::Context> ctx_;
  uint32_t tag_ = 1;
};

}  // namespace

int main(int argc, char** argv) {
  Options o;
  try {
    o = parse(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gloo_baseline: %s\n", e.what());
    return 2;
  }
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = o.address.empty() ? std::string("127.0.0.1") : o.address;
    auto device = gloo::transport::tcp::CreateDevice(attr);
    gloo::rendezvous::FileStore store(o.store);
    auto ctx = std::make_shared<gloo::rendezvous::Context>(o.rank, o.size);
    ctx->setTimeout(std::chrono::seconds(120));
    ctx->connectFullMesh(store, device);
    Bench b(ctx);
    const int n = o.size;
    const double bus = n > 1 ? 2.0 * (n - 1) / n : 1.0;

    std::vector<float> send(o.max_bytes / 4 + 1), recv(o.max_bytes / 4 + 1);
    if (o.rank == 0) {
      std::printf(
          "# gloo_baseline: gloo::allreduce (ring), %d rank(s), minBytes %zu maxBytes %zu factor %g "
          "warmup iters: %d iters: %d\n#\n",
          n, o.min_bytes, o.max_bytes, o.factor, o.warmup, o.iters);
      std::printf("#%58s%s%30s%s\n", "", "out-of-place", "", "in-place");
      std::printf(
          "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   "
          "algbw   busbw #wrong\n");
      std::printf(
          "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  "
          "(GB/s)  (GB/s)       \n");
      std::fflush(stdout);
    }
    for (size_t bytes = o.min_bytes; bytes <= o.max_bytes;
         bytes = std::max(bytes + 1, static_cast<size_t>(bytes * o.factor))) {
      const size_t count = bytes / 4;
      if (count == 0) continue;
      double t[2], wrong[2];
      for (int i = 0; i < o.warmup; ++i) b.allreduce(send.data(), recv.data(), count);
      for (int ip = 0; ip < 2; ++ip) {
        float* in = ip ? recv.data() : send.data();
        b.barrier();
        auto start = std::chrono::steady_clock::now();
        for (int it = 0; it < o.iters; ++it) b.allreduce(in, recv.data(), count);
        double us =
            std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count() / o.iters;
        t[ip] = b.max_across(us);
        for (size_t i = 0; i < count; ++i) in[i] = value(o.rank, i);
        b.allreduce(in, recv.data(), count);
        double w = 0;
        for (size_t i = 0; i < count; ++i) {
          float want = static_cast<float>(n * (n + 1) / 2 * static_cast<int>(i % 7 + 1));
          if (recv[i] != want) ++w;
        }
        wrong[ip] = b.sum_across(w);
      }
      if (o.rank == 0) {
        auto col = [&](int ip) {
          double algbw = static_cast<double>(bytes) / 1e3 / t[ip];  // GB/s
          char time[32];
          if (t[ip] >= 10000.0) std::snprintf(time, sizeof time, "%7.0f", t[ip]);
          else if (t[ip] >= 100.0) std::snprintf(time, sizeof time, "%7.1f", t[ip]);
          else std::snprintf(time, sizeof time, "%7.2f", t[ip]);
          std::printf("  %7s  %6.2f  %6.2f  %6.0f", time, algbw, algbw * bus, wrong[ip]);
        };
        std::printf("%12zu  %12zu  %8s  %6s  %6d", bytes, count, "float", "sum", -1);
        col(0);
        col(1);
        std::printf("\n");
        std::fflush(stdout);
      }
    }
    b.barrier();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gloo_baseline: rank %d: %s\n", o.rank, e.what());
    return 5;
  }
  return 0;
}
