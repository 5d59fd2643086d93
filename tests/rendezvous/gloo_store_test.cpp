// GlooStore against real Gloo: 4 rank threads connect a full mesh of TCP pairs through the
// rendezvous store and allreduce known values; plus the adapter's own semantics.
#include "rendezvous/gloo_store.h"

#include "core/error.h"

#include <doctest/doctest.h>
#include <gloo/allreduce.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>

#include <thread>

using namespace dtrain;
using namespace dtrain::rendezvous;
using namespace std::chrono_literals;

TEST_CASE("GlooStore set/get/wait with prefix, binary data and timeouts") {
  const std::string token = token_generate();
  StoreServer server("127.0.0.1", 0, token);
  StoreClient client("127.0.0.1", server.port(), token, 5s);
  GlooStore store(client, store_prefix("job", 3) + "gloo/", 300ms);
  const std::vector<char> data = {'a', '\0', char(0xff), 'z'};
  store.set("0", data);
  CHECK(client.get("job/job/r3/gloo/0", 1s) == std::string("a\0\xffz", 4));
  CHECK(store.get("0") == data);
  store.wait({"0"});
  store.wait({"0"}, 100ms);
  CHECK_THROWS_AS(store.get("1"), CommError);
  try {
    store.wait({"0", "1"}, 100ms);
    FAIL("wait must time out");
  } catch (const CommError& e) {
    CHECK(std::string(e.what()).find("job/job/r3/gloo/1") != std::string::npos);
  }
  CHECK_THROWS_AS(store.wait({"2"}, 0ms), CommError);  // Gloo's "no timeout" stays bounded
}

TEST_CASE("Gloo full mesh over the rendezvous store: allreduce with 4 ranks") {
  constexpr int kRanks = 4;
  constexpr size_t kCount = 1000;
  const std::string token = token_generate();
  StoreServer server("127.0.0.1", 0, token);
  std::vector<std::vector<float>> results(kRanks);
  std::vector<std::string> errors(kRanks);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < kRanks; ++rank)
    threads.emplace_back([&, rank] {
      try {
        StoreClient client("127.0.0.1", server.port(), token, 5s);
        GlooStore store(client, store_prefix("gloojob", 0) + "gloo/", 15s);
        gloo::transport::tcp::attr attr;
        attr.hostname = "127.0.0.1";
        auto dev = gloo::transport::tcp::CreateDevice(attr);
        auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, kRanks);
        ctx->setTimeout(15s);
        ctx->connectFullMesh(store, dev);

        std::vector<float> in(kCount), out(kCount, -1.f);
        for (size_t i = 0; i < kCount; ++i) in[i] = float(rank + 1) * 0.5f + float(i);
        gloo::AllreduceOptions opts(ctx);
        opts.setInput(in.data(), kCount);
        opts.setOutput(out.data(), kCount);
        opts.setReduceFunction(static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
        opts.setTimeout(15s);
        gloo::allreduce(opts);
        results[rank] = std::move(out);
      } catch (const std::exception& e) {
        errors[rank] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  for (int rank = 0; rank < kRanks; ++rank) {
    CAPTURE(rank);
    CHECK(errors[rank].empty());
    REQUIRE(results[rank].size() == kCount);
    // sum over ranks of (r+1)*0.5 + i = 5 + 4i (exact in fp32 for these magnitudes)
    bool all_ok = true;
    for (size_t i = 0; i < kCount; ++i) all_ok = all_ok && results[rank][i] == 5.f + 4.f * float(i);
    CHECK(all_ok);
  }
  // Every rank published its addresses under the scoped prefix.
  StoreClient c("127.0.0.1", server.port(), token, 5s);
  CHECK(c.check({"job/gloojob/r0/gloo/0", "job/gloojob/r0/gloo/3"}));
}
