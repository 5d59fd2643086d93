// Connectivity check and pairwise bandwidth over Gloo communicators built on the store.
#include "doctor/net_probe.h"

#include "comm/gloo_comm.h"
#include "core/check.h"
#include "rendezvous/gloo_store.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>

namespace dtrain::doctor {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// One direction of a pair: root broadcasts `count` floats N times, N chosen from a
// warm-up message so that the timed part lasts about link_seconds (both ends agree on
// N through an allreduce MAX); a 1-element allreduce closes it, so the root's clock stops
// only once the receiver has everything. Returns bytes per second as the root saw it.
double measure_direction(comm::Communicator& pair, int root, std::vector<float>& buf, const NetProbeOptions& o) {
  const size_t count = buf.size();
  float done = 0;
  pair.barrier();
  auto t0 = Clock::now();
  pair.broadcast(buf.data(), buf.data(), count, DType::F32, root);
  pair.allreduce_host(&done, 1, DType::F32, comm::ReduceOp::SUM);
  const double warm = std::max(seconds_since(t0), 1e-6);
  float n = static_cast<float>(std::clamp(std::ceil(o.link_seconds / warm), 1.0, 4096.0));
  pair.allreduce_host(&n, 1, DType::F32, comm::ReduceOp::MAX);
  const int reps = static_cast<int>(n);
  pair.barrier();
  t0 = Clock::now();
  for (int i = 0; i < reps; ++i) pair.broadcast(buf.data(), buf.data(), count, DType::F32, root);
  pair.allreduce_host(&done, 1, DType::F32, comm::ReduceOp::SUM);
  const double t = std::max(seconds_since(t0), 1e-9);
  return static_cast<double>(reps) * static_cast<double>(count * sizeof(float)) / t;
}

comm::GlooOptions gloo_options(const NetProbeOptions& o) {
  comm::GlooOptions g;
  g.interface = o.interface;
  if (g.interface.empty()) g.address = o.address;
  g.timeout = o.timeout;
  return g;
}

}  // namespace

NetProbeResult net_probe_run(rendezvous::StoreClient& client, const std::string& prefix, int rank, int world,
                             const NetProbeOptions& o) {
  DT_ENFORCE(world >= 1 && rank >= 0 && rank < world, UsageError, "net probe: rank {} of {}", rank, world);
  DT_ENFORCE(o.link_seconds > 0 && o.message_bytes >= sizeof(float), UsageError,
             "net probe: link_seconds {} and message_bytes {} must be positive", o.link_seconds, o.message_bytes);
  NetProbeResult r;
  const auto g = gloo_options(o);
  auto all_store = std::make_shared<rendezvous::GlooStore>(client, prefix + "all/", o.timeout);
  auto all = comm::comm_create_gloo(all_store, rank, world, g);

  // Connectivity: every rank contributes rank + 1; the sum is known.
  all->barrier();
  float v = static_cast<float>(rank + 1);
  all->allreduce_host(&v, 1, DType::F32, comm::ReduceOp::SUM);
  r.allreduce_ok = v == static_cast<float>(world) * static_cast<float>(world + 1) / 2.0f;
  // Every rank must agree before the pairs start (one bad sum fails them all alike).
  float ok = r.allreduce_ok ? 1.0f : 0.0f;
  all->allreduce_host(&ok, 1, DType::F32, comm::ReduceOp::SUM);
  if (ok != static_cast<float>(world)) return r;

  std::vector<float> buf(o.message_bytes / sizeof(float), 1.0f);
  for (int a = 0; a < world; ++a)
    for (int b = a + 1; b < world; ++b) {
      all->barrier();  // one link at a time: no other traffic shares the NICs
      if (rank != a && rank != b) continue;
      auto store =
          std::make_shared<rendezvous::GlooStore>(client, fmt::format("{}pair{}-{}/", prefix, a, b), o.timeout);
      auto pair = comm::comm_create_gloo(store, rank == a ? 0 : 1, 2, g);
      LinkSample s{a, b, 0, 0};
      const double ab = measure_direction(*pair, 0, buf, o);
      const double ba = measure_direction(*pair, 1, buf, o);
      if (rank == a) s.ab = ab;
      else s.ba = ba;
      r.links.push_back(s);
    }
  all->barrier();
  return r;
}

std::vector<LinkSample> link_merge(const std::vector<LinkSample>& parts) {
  std::map<std::pair<int, int>, LinkSample> m;
  for (const LinkSample& p : parts) {
    auto key = std::minmax(p.a, p.b);
    LinkSample& s = m.try_emplace(key, LinkSample{key.first, key.second, 0, 0}).first->second;
    const double ab = p.a <= p.b ? p.ab : p.ba, ba = p.a <= p.b ? p.ba : p.ab;
    s.ab = std::max(s.ab, ab);
    s.ba = std::max(s.ba, ba);
  }
  std::vector<LinkSample> out;
  for (auto& [k, s] : m) out.push_back(s);
  return out;
}

}  // namespace dtrain::doctor
