// plan_cluster: the collectives of one step as dtrain's ZeRO engine issues them (the
// buckets of zero_buckets_plan, stage 3's per-layer gathers with the prefetch rule
// of zero_prefetch_window, the post-step gathers of ZeroGather::into_model), each timed by NCCL's ring
// model, and the step they give with one GPU's compute: what hides behind compute and what
// does not, tokens/s and scaling efficiency. Arithmetic only: plan_cluster_job.cpp builds
// the job from a config.
#include "plan/plan_cluster.h"

#include "config/train_config.h"
#include "core/check.h"
#include "train/zero_layout.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>

namespace dtrain::plan {

const char* coll_kind_name(CollKind k) {
  switch (k) {
    case CollKind::ALL_REDUCE: return "all-reduce";
    case CollKind::REDUCE_SCATTER: return "reduce-scatter";
    case CollKind::ALL_GATHER: return "all-gather";
  }
  return "?";
}

namespace {

// The ring's bus bandwidth, bytes/s: NVLink's inside one node. Across nodes every rank's
// ring traffic also crosses the network, and a node's share of it leaves through its W NICs
// (NCCL runs one ring per NIC): W x the per-GPU network rate, or NVLink's where that is lower.
// One GPU per node has no NVLink hop.
double bus_bytes_per_s(int nodes, int gpus_per_node, const ClusterLink& link, std::string* bound) {
  const double nvlink = link.intra_gbytes * 1e9, net = link.inter_gbits * 1e9 / 8.0;
  if (nodes == 1) {
    if (bound) *bound = "NVLink";
    return nvlink;
  }
  const double across = net * gpus_per_node;
  const bool nvlink_bound = gpus_per_node > 1 && nvlink < across;
  if (bound) *bound = nvlink_bound ? "NVLink" : "network";
  return nvlink_bound ? nvlink : across;
}

}  // namespace

double collective_seconds(CollKind kind, double bytes, int nodes, int gpus_per_node, const ClusterLink& link,
                          const ClusterLatency& lat) {
  const int64_t P = static_cast<int64_t>(nodes) * gpus_per_node;
  if (P <= 1) return 0.0;
  const bool ar = kind == CollKind::ALL_REDUCE;
  // nccl-tests' busbw factors: the bytes each rank sends over its ring link per byte of message.
  const double factor = (ar ? 2.0 : 1.0) * static_cast<double>(P - 1) / static_cast<double>(P);
  // NCCL's ring latency (tuning.cc): base + (steps - network steps) x NVLink hop + network steps x
  // network hop, steps 2(P-1) for all-reduce and P-1 otherwise, network steps 2(N-1) or N-1.
  const int64_t steps = (ar ? 2 : 1) * (P - 1), net_steps = (ar ? 2 : 1) * (nodes - 1);
  const double latency_us = lat.base_us + static_cast<double>(steps - net_steps) * lat.nvlink_hop_us +
                            static_cast<double>(net_steps) * lat.net_hop_us;
  return latency_us * 1e-6 + factor * bytes / bus_bytes_per_s(nodes, gpus_per_node, link, nullptr);
}

namespace {

// The job's collectives, each with its time, and how they may hide (filled by the helpers).
struct Schedule {
  std::vector<ClusterCollective> list;
  double fwd_hidden = 0;      ///< may hide behind the forward (prefetched stage-3 gathers)
  double bwd_hidden = 0;      ///< may hide behind the backward window
  double bwd_window_mbs = 0;  ///< micro-batches whose backward is that window
  double exposed = 0;         ///< never hidden
  std::vector<std::string> notes;
};

// The job, its links and its buffers as the engine lays them out on P ranks (rank 0's
// shards: the plan needs their lengths).
struct Ctx {
  const ClusterJob& job;
  const ClusterLink& link;
  const ClusterLatency& lat;
  int64_t P;
  train::ZeroLayout layout;
  double time(CollKind k, double bytes) const {
    return collective_seconds(k, bytes, job.nodes, job.gpus_per_node, link, lat);
  }
};

train::ZeroLayout layout_of(const ClusterJob& j, int64_t P) {
  train::ZeroLayout layout(
      train::ZeroPlacement{j.stage, 0, static_cast<int>(P), static_cast<size_t>(j.persistence_threshold)}, j.n_layer);
  for (const ClusterBuffer& b : j.buffers) layout.add(static_cast<size_t>(b.n), b.layer, b.trainable);
  return layout;
}

// Adds `count` collectives of the given sizes (bytes each) as one row.
ClusterCollective& row_add(Schedule& s, const Ctx& c, const std::string& what, CollKind kind,
                           const std::vector<double>& bytes, int64_t repeat, const std::string& hides) {
  ClusterCollective r;
  r.what = what;
  r.kind = kind;
  r.hides = hides;
  double sum_bytes = 0, sum_t = 0;
  for (double b : bytes) {
    sum_bytes += b;
    sum_t += c.time(kind, b);
  }
  r.count = static_cast<int64_t>(bytes.size()) * repeat;
  r.bytes = bytes.empty() ? 0.0 : sum_bytes / static_cast<double>(bytes.size());
  r.seconds = sum_t * static_cast<double>(repeat);
  s.list.push_back(r);
  return s.list.back();
}

// Gradient buckets in backward order (zero_buckets_plan): trainable buffers of layers
// n_layer .. -1, grouped while their full sizes stay within reduce_bucket_size; stage 0
// all-reduces each bucket (its elements), stages 1-3 reduce-scatter W x the shards' sum.
// Stages 2-3 reduce in every micro-batch's backward as the bucket fills (on NCCL's stream:
// always overlapped); stages 0-1 once per step, during the last backward with overlap_comm,
// else after it. The rule: the last bucket of the step (the embeddings', complete when the
// backward ends) is exposed; the others hide behind the backward window (all micro-batches'
// backward at stages 2-3, the last one's at 0-1) as long as they fit in it.
void gradient_rows(Schedule& s, Ctx& c) {
  const ClusterJob& j = c.job;
  std::vector<double> bytes;
  for (const train::ZeroBucketPlan& b : c.layout.buckets(static_cast<size_t>(j.reduce_bucket_size))) {
    const auto seg = static_cast<int64_t>(b.seg);
    bytes.push_back(static_cast<double>(j.stage == 0 ? seg : seg * c.P) * j.wire_bytes);
  }
  const bool every_mb = j.stage >= 2, overlapped = every_mb || j.overlap_comm;
  const int64_t repeat = every_mb ? j.grad_accum : 1;
  ClusterCollective& r = row_add(s, c, "gradients", j.stage == 0 ? CollKind::ALL_REDUCE : CollKind::REDUCE_SCATTER,
                                 bytes, repeat, overlapped ? "backward, but the last bucket" : "");
  if (!overlapped) {
    s.exposed += r.seconds;
    return;
  }
  const double tail = c.time(r.kind, bytes.back());
  s.exposed += tail;
  s.bwd_hidden += r.seconds - tail;
  s.bwd_window_mbs = every_mb ? j.grad_accum : 1;
}

// Stage 3's parameter gathers (ZeroGather::visit), replayed for one micro-batch by the
// engine's rule (train::ZeroGatherReplay over zero_prefetch_window): each sharded buffer (at
// least persistence_threshold elements) is all-gathered in the compute dtype before its
// layer runs in the forward (layers -1 .. n_layer) and again in the backward (n_layer ..
// -1), except what is still held from the forward (the head's layer; the embeddings too
// when tied). A layer gathered as the one about to run is waited for at once: exposed. The
// layers ahead that fit in prefetch_bucket_size (and max_live_parameters with those held)
// are issued early: they hide behind the compute of their pass. As in the engine, a visit
// waits at once for the embeddings whenever they are kept, also when only the window put
// them there (the backward of layer 0): that gather counts as exposed.
void gather_rows(Schedule& s, const Ctx& c) {
  const ClusterJob& j = c.job;
  if (j.stage != 3) return;
  const int L = j.n_layer;
  const std::vector<size_t> need = c.layout.layer_sharded();
  // Each layer's gathers: one per sharded buffer, W shards in the compute dtype.
  auto bytes = [&](int l) {
    std::vector<double> b;
    for (size_t i : c.layout.layer_slots[static_cast<size_t>(l + 1)]) {
      const train::ZeroShard& z = c.layout.shards[i];
      if (z.sharded) b.push_back(static_cast<double>(static_cast<int64_t>(z.s) * c.P) * j.compute_bytes);
    }
    return b;
  };
  train::ZeroGatherReplay replay(need, j.tied, static_cast<size_t>(j.prefetch_bucket_size),
                                 static_cast<size_t>(j.max_live_parameters));
  std::vector<double> lists[2][2];  // [backward][prefetched]
  auto visit = [&](int l, int dir) {
    for (const train::ZeroGatherReplay::Gather& g : replay.visit(l, dir).issued) {
      const std::vector<double> b = bytes(g.layer);
      auto& to = lists[dir < 0][g.early];
      to.insert(to.end(), b.begin(), b.end());
    }
  };
  for (int l = -1; l <= L; ++l) visit(l, +1);
  for (int l = L; l >= -1; --l) {
    visit(l, -1);
    replay.release(l);  // after_layer_backward releases it
  }
  // A layer larger than the window is never gathered ahead: its gather waits.
  const auto most = static_cast<int64_t>(*std::max_element(need.begin(), need.end()));
  if (most > j.prefetch_bucket_size) {
    s.notes.push_back(fmt::format(
        "stage 3: a layer of {} sharded elements is larger than zero_optimization.stage3_prefetch_bucket_size {}: "
        "it is never gathered ahead, and its gather is waited for (exposed); {} or more prefetches every layer",
        most, j.prefetch_bucket_size, most));
  }
  const char* pass[2] = {"parameters, forward", "parameters, backward"};
  for (int b = 0; b < 2; ++b)
    for (int early = 1; early >= 0; --early) {
      if (lists[b][early].empty()) continue;
      const std::string what = std::string(pass[b]) + (early ? " (prefetched)" : "");
      ClusterCollective& r = row_add(s, c, what, CollKind::ALL_GATHER, lists[b][early], j.grad_accum,
                                     early ? (b ? "backward" : "forward") : "");
      (early ? (b ? s.bwd_hidden : s.fwd_hidden) : s.exposed) += r.seconds;
    }
}

// After the update (stages 1-3, zero_post_update_gathers: ZeroGather::resident_refresh): the
// trainable buffers the model holds whole get their new values, all-gathered in the compute dtype in groups of at most
// allgather_bucket_size elements; the next forward reads them (exposed). Then the step's two
// scalar all-reduces (the unmasked-target count before the backward, the gradient norm with the
// loss): latency only, exposed.
void update_rows(Schedule& s, const Ctx& c) {
  const ClusterJob& j = c.job;
  std::vector<double> bytes;
  for (const train::ZeroGatherGroup& g :
       train::zero_post_update_gathers(c.layout.view(), j.stage, static_cast<size_t>(j.allgather_bucket_size)))
    bytes.push_back(static_cast<double>(static_cast<int64_t>(g.seg) * c.P) * j.compute_bytes);
  if (!bytes.empty())
    s.exposed += row_add(s, c, "parameters, after the update", CollKind::ALL_GATHER, bytes, 1, "").seconds;
  s.exposed +=
      row_add(s, c, "step scalars (target count; norm + loss)", CollKind::ALL_REDUCE, {4.0, 16.0}, 1, "").seconds;
}

void job_check(const ClusterJob& j, const ClusterLink& link) {
  DT_ENFORCE(j.nodes >= 1 && j.gpus_per_node >= 1, UsageError, "plan_cluster: {} nodes x {} GPUs: both must be >= 1",
             j.nodes, j.gpus_per_node);
  DT_ENFORCE(config::zero_stage_valid(j.stage), UsageError, "plan_cluster: ZeRO stage {} is not 0, 1, 2 or 3", j.stage);
  DT_ENFORCE(j.grad_accum >= 1, UsageError, "plan_cluster: gradient accumulation {} must be >= 1", j.grad_accum);
  DT_ENFORCE(j.compute_s.slow > 0 && j.compute_s.fast > 0, UsageError,
             "plan_cluster: the compute time per step ({} - {} s) must be positive", j.compute_s.fast,
             j.compute_s.slow);
  DT_ENFORCE(j.optimizer_s.slow >= 0 && j.optimizer_s.fast >= 0, UsageError,
             "plan_cluster: the update time ({} - {} s) must not be negative", j.optimizer_s.fast, j.optimizer_s.slow);
  DT_ENFORCE(j.backward_share > 0 && j.backward_share < 1, UsageError,
             "plan_cluster: backward_share {} must be in (0, 1)", j.backward_share);
  DT_ENFORCE(j.tokens_per_gpu > 0, UsageError, "plan_cluster: tokens per GPU per step {} must be positive",
             j.tokens_per_gpu);
  DT_ENFORCE(link.intra_gbytes > 0 && link.inter_gbits > 0, UsageError,
             "plan_cluster: link bandwidths must be positive (NVLink {} GB/s, network {} Gb/s per GPU)",
             link.intra_gbytes, link.inter_gbits);
  DT_ENFORCE((j.wire_bytes == 2 || j.wire_bytes == 4) && (j.compute_bytes == 2 || j.compute_bytes == 4), UsageError,
             "plan_cluster: wire {} and compute {} bytes per element must be 2 or 4", j.wire_bytes, j.compute_bytes);
  DT_ENFORCE(j.reduce_bucket_size > 0 && j.allgather_bucket_size > 0, UsageError,
             "plan_cluster: bucket sizes must be positive");
  DT_ENFORCE(j.prefetch_bucket_size >= 0 && j.persistence_threshold >= 0 && j.max_live_parameters > 0, UsageError,
             "plan_cluster: stage 3's prefetch bucket ({}) and persistence threshold ({}) must not be negative, its "
             "max live parameters ({}) must be positive",
             j.prefetch_bucket_size, j.persistence_threshold, j.max_live_parameters);
  bool trainable = false;
  for (const ClusterBuffer& b : j.buffers) trainable = trainable || b.trainable;
  DT_ENFORCE(trainable, UsageError, "plan_cluster: the job has no trainable buffer");
  for (const ClusterBuffer& b : j.buffers)
    DT_ENFORCE(b.layer >= -1 && b.layer <= j.n_layer && b.n > 0, UsageError,
               "plan_cluster: a buffer of {} elements at layer {} (the model has layers -1 .. {})", b.n, b.layer,
               j.n_layer);
}

// One end of the band. The rule: compute and the update never overlap communication; the
// hideable collectives of a pass cost only what exceeds that pass's compute (the backward's
// share of the step, or the part of it the window spans); the rest is exposed.
ClusterEnd end_of(const ClusterJob& j, const Schedule& s, double compute, double optimizer, int64_t P) {
  ClusterEnd e;
  e.compute_s = compute;
  e.optimizer_s = j.stage >= 1 ? optimizer / static_cast<double>(P) : optimizer;
  const double bwd = compute * j.backward_share, fwd = compute - bwd;
  const double window = bwd * s.bwd_window_mbs / static_cast<double>(j.grad_accum);
  e.exposed_s = s.exposed + std::max(0.0, s.fwd_hidden - fwd) + std::max(0.0, s.bwd_hidden - window);
  e.step_s = e.compute_s + e.optimizer_s + e.exposed_s;
  e.tokens_per_s_gpu = j.tokens_per_gpu / e.step_s;
  e.tokens_per_s = e.tokens_per_s_gpu * static_cast<double>(P);
  e.efficiency = (compute + optimizer) / e.step_s;
  return e;
}

}  // namespace

ClusterPlan plan_cluster(const ClusterJob& job, const ClusterLink& link, const ClusterLatency& lat) {
  job_check(job, link);
  const int64_t P = static_cast<int64_t>(job.nodes) * job.gpus_per_node;
  ClusterPlan p;
  p.nodes = job.nodes;
  p.gpus_per_node = job.gpus_per_node;
  p.world = static_cast<int>(P);
  p.stage = job.stage;
  p.link = link;
  Schedule s;
  if (P > 1) {
    p.bus_gbytes = bus_bytes_per_s(job.nodes, job.gpus_per_node, link, &p.bound) / 1e9;
    Ctx c{job, link, lat, P, layout_of(job, P)};
    gradient_rows(s, c);
    gather_rows(s, c);
    update_rows(s, c);
  }
  p.collectives = s.list;
  p.notes = s.notes;
  for (const ClusterCollective& r : s.list) p.comm_s += r.seconds;
  p.slow = end_of(job, s, job.compute_s.slow, job.optimizer_s.slow, P);
  p.fast = end_of(job, s, job.compute_s.fast, job.optimizer_s.fast, P);
  return p;
}

std::string plan_cluster_text(const ClusterPlan& p, const std::string& indent) {
  const ClusterLink& k = p.link;
  std::string out;
  out += fmt::format("{}cluster      {} node{} x {} GPU{} = {} rank{}, ZeRO stage {}\n", indent, p.nodes,
                     p.nodes == 1 ? "" : "s", p.gpus_per_node, p.gpus_per_node == 1 ? "" : "s", p.world,
                     p.world == 1 ? "" : "s", p.stage);
  out += fmt::format("{}links        NVLink {:g} GB/s bus, network {:g} Gb/s per GPU{}\n", indent, k.intra_gbytes,
                     k.inter_gbits, k.source.empty() ? "" : " (" + k.source + ")");
  if (p.world > 1) {
    out += fmt::format(
        "{}ring         {:.0f} GB/s bus bandwidth ({}-bound); time = latency + f x bytes / bus, f = "
        "2(P-1)/P all-reduce, (P-1)/P reduce-scatter and all-gather\n",
        indent, p.bus_gbytes, p.bound);
    size_t w = 10;
    for (const ClusterCollective& r : p.collectives) w = std::max(w, r.what.size());
    out += fmt::format("{}  {:<{}}  {:<14}  {:>10}  {:>8}  {:>9}  {}\n", indent, "collective", w, "kind", "MB each",
                       "per step", "ms/step", "hides behind");
    for (const ClusterCollective& r : p.collectives)
      out +=
          fmt::format("{}  {:<{}}  {:<14}  {:>10.3f}  {:>8}  {:>9.2f}  {}\n", indent, r.what, w, coll_kind_name(r.kind),
                      r.bytes / 1e6, r.count, r.seconds * 1e3, r.hides.empty() ? "nothing (exposed)" : r.hides);
  }
  const ClusterEnd &f = p.fast, &s = p.slow;
  out += fmt::format("{}compute      {:.1f} - {:.1f} ms per step (one GPU's forward + backward)\n", indent,
                     f.compute_s * 1e3, s.compute_s * 1e3);
  out += fmt::format("{}update       {:.1f} - {:.1f} ms ({})\n", indent, f.optimizer_s * 1e3, s.optimizer_s * 1e3,
                     p.stage >= 1 && p.world > 1 ? fmt::format("AdamW and norm over a 1/{} shard", p.world)
                                                 : std::string("AdamW and norm over every trainable element"));
  if (p.world > 1)
    out +=
        fmt::format("{}comm         {:.1f} ms of collectives per step, {:.1f} - {:.1f} ms of it exposed\n", indent,
                    p.comm_s * 1e3, std::min(f.exposed_s, s.exposed_s) * 1e3, std::max(f.exposed_s, s.exposed_s) * 1e3);
  out += fmt::format("{}step time    {:.1f} - {:.1f} ms (predicted band)\n", indent, f.step_s * 1e3, s.step_s * 1e3);
  out += fmt::format("{}tokens/s     {:.0f} - {:.0f} per GPU, {:.0f} - {:.0f} in all\n", indent, s.tokens_per_s_gpu,
                     f.tokens_per_s_gpu, s.tokens_per_s, f.tokens_per_s);
  out +=
      fmt::format("{}scaling      {:.1f} - {:.1f}% of one GPU's tokens/s alone (no collectives, the whole update)\n",
                  indent, 100.0 * std::min(f.efficiency, s.efficiency), 100.0 * std::max(f.efficiency, s.efficiency));
  for (const std::string& n : p.notes) out += fmt::format("{}note         {}\n", indent, n);
  return out;
}

std::string plan_cluster_summary(const std::vector<ClusterPlan>& plans) {
  if (plans.empty()) return "";
  const ClusterPlan& a = plans.front();
  std::string out =
      fmt::format("cluster plan, ZeRO stage {}, NVLink {:g} GB/s bus, network {:g} Gb/s per GPU (predicted bands)\n",
                  a.stage, a.link.intra_gbytes, a.link.inter_gbits);
  out += fmt::format("{:<12}  {:>17}  {:>17}  {:>13}  {:>11}\n", "nodes x GPUs", "step ms", "exposed comm ms",
                     "tokens/s/GPU", "scaling %");
  for (const ClusterPlan& p : plans) {
    const ClusterEnd &f = p.fast, &s = p.slow;
    out += fmt::format("{:<12}  {:>17}  {:>17}  {:>13}  {:>11}\n", fmt::format("{} x {}", p.nodes, p.gpus_per_node),
                       fmt::format("{:.1f}-{:.1f}", f.step_s * 1e3, s.step_s * 1e3),
                       fmt::format("{:.1f}-{:.1f}", std::min(f.exposed_s, s.exposed_s) * 1e3,
                                   std::max(f.exposed_s, s.exposed_s) * 1e3),
                       fmt::format("{:.0f}-{:.0f}", s.tokens_per_s_gpu, f.tokens_per_s_gpu),
                       fmt::format("{:.1f}-{:.1f}", 100.0 * std::min(f.efficiency, s.efficiency),
                                   100.0 * std::max(f.efficiency, s.efficiency)));
  }
  return out;
}

std::vector<std::pair<int, int>> cluster_specs_parse(const std::string& text) {
  constexpr const char* grammar = "give NODESxGPUS, comma-separated: 1x8,2x8,16x8";
  std::vector<std::pair<int, int>> out;
  size_t at = 0;
  while (at <= text.size()) {
    const size_t comma = std::min(text.find(',', at), text.size());
    const std::string one = text.substr(at, comma - at);
    const size_t x = one.find_first_of("xX");
    auto count = [&](const std::string& t) {
      DT_ENFORCE(!t.empty() && t.size() <= 5 && t.find_first_not_of("0123456789") == std::string::npos, UsageError,
                 "--cluster '{}': '{}' is not NODESxGPUS; {}", text, one, grammar);
      const int n = std::stoi(t);
      DT_ENFORCE(n >= 1, UsageError, "--cluster '{}': '{}' has a count of 0; {}", text, one, grammar);
      return n;
    };
    DT_ENFORCE(x != std::string::npos, UsageError, "--cluster '{}': '{}' is not NODESxGPUS; {}", text, one, grammar);
    out.emplace_back(count(one.substr(0, x)), count(one.substr(x + 1)));
    at = comma + 1;
  }
  return out;
}

}  // namespace dtrain::plan
