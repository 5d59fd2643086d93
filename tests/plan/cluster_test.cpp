// The cluster plan's arithmetic against hand-computed cases: NCCL's ring factors and latency
// on NVLink and across nodes (the network or NVLink as the bound), the gradient buckets,
// stage 3's gathers with and without prefetch, the post-step gathers, the overlap rule, the
// sharded update and the scaling efficiency; one GPU has no collectives; bad input is refused
// naming the field. Nothing executes; no timing of the test itself is asserted.
#include "plan/plan_cluster.h"
#include "core/error.h"

#include <doctest/doctest.h>

#include <string>
#include <vector>

using namespace dtrain;
using plan::ClusterJob;
using plan::ClusterLink;
using plan::CollKind;

namespace {

ClusterLink link_of(double intra_gbytes, double inter_gbits) {
  ClusterLink k;
  k.intra_gbytes = intra_gbytes;
  k.inter_gbits = inter_gbits;
  return k;
}

// One trainable buffer of n elements at layer 0 of a one-layer model: one bucket.
ClusterJob one_buffer_job(int nodes, int gpus, int64_t n) {
  ClusterJob j;
  j.nodes = nodes;
  j.gpus_per_node = gpus;
  j.n_layer = 1;
  j.buffers = {{0, n, true}};
  j.reduce_bucket_size = n;
  j.allgather_bucket_size = n;
  j.compute_s = {1.0, 1.0};
  j.optimizer_s = {0.08, 0.08};
  j.tokens_per_gpu = 4096;
  return j;
}

const plan::ClusterCollective* row(const plan::ClusterPlan& p, const std::string& what) {
  for (const auto& r : p.collectives)
    if (r.what == what) return &r;
  return nullptr;
}

// The step's two scalar all-reduces (4 and 16 bytes): latency plus their few bytes.
double scalars_s(int nodes, int gpus, const ClusterLink& k) {
  return plan::collective_seconds(CollKind::ALL_REDUCE, 4, nodes, gpus, k) +
         plan::collective_seconds(CollKind::ALL_REDUCE, 16, nodes, gpus, k);
}

}  // namespace

TEST_CASE("2 nodes x 8 GPUs: the all-reduce of 8e9 bf16 gradients by hand, 400 and 100 Gb/s") {
  // P = 16 ranks, S = 8e9 x 2 bytes = 16e9 bytes, ring factor 2(P-1)/P = 1.875.
  // 400 Gb/s per GPU = 50 GB/s; a node's 8 NICs carry 400 GB/s > NVLink's 360: NVLink-bound,
  //   1.875 x 16e9 / 360e9 = 0.0833333 s.
  // 100 Gb/s = 12.5 GB/s per GPU, 100 GB/s a node: network-bound, 1.875 x 16e9 / 100e9 = 0.3 s.
  // Latency (NCCL ring, Simple): 8.4 + (2(P-1) - 2(N-1)) x 3.4 + 2(N-1) x 14 = 8.4 + 28 x 3.4 + 2 x 14
  //   = 131.6 us.
  const double lat = 131.6e-6;
  CHECK(plan::collective_seconds(CollKind::ALL_REDUCE, 16e9, 2, 8, link_of(360, 400)) ==
        doctest::Approx(16e9 * 1.875 / 360e9 + lat).epsilon(1e-9));
  CHECK(plan::collective_seconds(CollKind::ALL_REDUCE, 16e9, 2, 8, link_of(360, 100)) ==
        doctest::Approx(0.3 + lat).epsilon(1e-9));

  // The same through the plan: ZeRO 0, a 16-bit wire, one bucket, no overlap_comm: exposed.
  ClusterJob j = one_buffer_job(2, 8, 8000000000);
  j.wire_bytes = 2;
  const ClusterLink k = link_of(360, 400);
  const plan::ClusterPlan p = plan::plan_cluster(j, k);
  CHECK(p.world == 16);
  CHECK(p.bound == "NVLink");
  CHECK(p.bus_gbytes == doctest::Approx(360));
  const auto* g = row(p, "gradients");
  REQUIRE(g != nullptr);
  CHECK(g->kind == CollKind::ALL_REDUCE);
  CHECK(g->count == 1);
  CHECK(g->bytes == doctest::Approx(16e9));
  CHECK(g->seconds == doctest::Approx(16e9 * 1.875 / 360e9 + lat).epsilon(1e-9));
  CHECK(g->hides.empty());
  // Stage 0 updates every element on every rank; step = compute + update + exposed.
  const double exposed = g->seconds + scalars_s(2, 8, k);
  CHECK(p.slow.exposed_s == doctest::Approx(exposed));
  CHECK(p.slow.optimizer_s == doctest::Approx(0.08));
  CHECK(p.slow.step_s == doctest::Approx(1.0 + 0.08 + exposed));
  CHECK(p.slow.tokens_per_s_gpu == doctest::Approx(4096 / (1.08 + exposed)));
  CHECK(p.slow.tokens_per_s == doctest::Approx(16 * 4096 / (1.08 + exposed)));
  CHECK(p.slow.efficiency == doctest::Approx(1.08 / (1.08 + exposed)));
  // fp32 on the wire (the default) doubles the bytes.
  j.wire_bytes = 4;
  CHECK(row(plan::plan_cluster(j, k), "gradients")->bytes == doctest::Approx(32e9));

  const plan::ClusterPlan slow_net = plan::plan_cluster(one_buffer_job(2, 8, 8000000000), link_of(360, 100));
  CHECK(slow_net.bound == "network");
  CHECK(slow_net.bus_gbytes == doctest::Approx(100));
}

TEST_CASE("one node uses NVLink only; one GPU per node only the network; one GPU has no collectives") {
  // 1 x 8, reduce-scatter of 1e9 bytes: (P-1)/P = 7/8 at 360 GB/s whatever the network;
  // latency 8.4 + 7 x 3.4 = 32.2 us.
  for (double net : {1.0, 400.0})
    CHECK(plan::collective_seconds(CollKind::REDUCE_SCATTER, 1e9, 1, 8, link_of(360, net)) ==
          doctest::Approx(0.875 * 1e9 / 360e9 + 32.2e-6).epsilon(1e-9));
  // 4 x 1, all-reduce of 1e9 bytes at 100 Gb/s = 12.5 GB/s: 2 x 3/4 x 1e9 / 12.5e9 = 0.12 s;
  // every one of the 6 ring steps crosses the network: 8.4 + 6 x 14 = 92.4 us.
  CHECK(plan::collective_seconds(CollKind::ALL_REDUCE, 1e9, 4, 1, link_of(360, 100)) ==
        doctest::Approx(0.12 + 92.4e-6).epsilon(1e-9));
  CHECK(plan::collective_seconds(CollKind::ALL_GATHER, 1e9, 1, 1, link_of(360, 100)) == 0.0);

  const plan::ClusterPlan one = plan::plan_cluster(one_buffer_job(1, 1, 1000000), link_of(360, 400));
  CHECK(one.world == 1);
  CHECK(one.collectives.empty());
  CHECK(one.comm_s == 0.0);
  CHECK(one.slow.exposed_s == 0.0);
  CHECK(one.slow.step_s == doctest::Approx(1.08));
  CHECK(one.slow.efficiency == doctest::Approx(1.0));
}

TEST_CASE("stage 2: buckets in backward order, reduce-scattered every micro-batch, all but the last hidden") {
  // Layers -1 (embeddings, 4e8), 0 (3e8), 1 (3e8, the head); buckets of at most 5e8 elements:
  // backward order 1, 0, -1 gives [3e8], [3e8], [4e8] (3e8 + 3e8 > 5e8). On 1 x 4 each bucket
  // reduce-scatters W x its shards = its elements x 4 bytes, in each of 2 micro-batches.
  ClusterJob j;
  j.nodes = 1;
  j.gpus_per_node = 4;
  j.stage = 2;
  j.grad_accum = 2;
  j.n_layer = 1;
  j.buffers = {{-1, 400000000, true}, {0, 300000000, true}, {1, 300000000, true}};
  j.compute_s = {3.0, 3.0};
  j.optimizer_s = {0.04, 0.04};
  j.tokens_per_gpu = 8192;
  const ClusterLink k = link_of(360, 400);
  auto rs = [&](double elems) { return plan::collective_seconds(CollKind::REDUCE_SCATTER, elems * 4, 1, 4, k); };
  plan::ClusterPlan p = plan::plan_cluster(j, k);
  const auto* g = row(p, "gradients");
  REQUIRE(g != nullptr);
  CHECK(g->kind == CollKind::REDUCE_SCATTER);
  CHECK(g->count == 6);
  CHECK(g->bytes == doctest::Approx((3e8 + 3e8 + 4e8) / 3 * 4));
  const double all = 2 * (rs(3e8) + rs(3e8) + rs(4e8)), tail = rs(4e8);
  CHECK(g->seconds == doctest::Approx(all));
  CHECK(g->hides == "backward, but the last bucket");
  // The post-step all-gather of every trainable buffer in bf16, grouped within 5e8 elements in
  // the model's order: [4e8], [3e8], [3e8].
  const auto* a = row(p, "parameters, after the update");
  REQUIRE(a != nullptr);
  CHECK(a->count == 3);
  auto ag = [&](double elems) { return plan::collective_seconds(CollKind::ALL_GATHER, elems * 2, 1, 4, k); };
  CHECK(a->seconds == doctest::Approx(ag(4e8) + ag(3e8) + ag(3e8)));
  // The backward (2/3 of 3 s) hides everything but the embeddings' last bucket.
  const double fixed = a->seconds + scalars_s(1, 4, k);
  CHECK(p.slow.exposed_s == doctest::Approx(tail + fixed));
  CHECK(p.slow.optimizer_s == doctest::Approx(0.01));  // the update of a 1/4 shard
  CHECK(p.slow.efficiency == doctest::Approx(3.04 / (3.0 + 0.01 + tail + fixed)));
  // A backward too short to hide them: what does not fit is exposed.
  j.compute_s = {0.003, 0.003};
  p = plan::plan_cluster(j, k);
  CHECK(p.slow.exposed_s == doctest::Approx(tail + fixed + (all - tail - 0.002)));
}

TEST_CASE("stages 0-1 reduce once per step: after the backward, or during the last one with overlap_comm") {
  ClusterJob j = one_buffer_job(1, 8, 100000000);
  j.buffers = {{-1, 100000000, true}, {0, 100000000, true}, {1, 100000000, true}};
  j.reduce_bucket_size = 100000000;  // one bucket per buffer
  j.stage = 1;
  j.grad_accum = 4;
  const ClusterLink k = link_of(360, 400);
  const double rs = plan::collective_seconds(CollKind::REDUCE_SCATTER, 4e8, 1, 8, k);
  plan::ClusterPlan p = plan::plan_cluster(j, k);
  const auto* g = row(p, "gradients");
  REQUIRE(g != nullptr);
  CHECK(g->count == 3);  // once per step, not per micro-batch
  CHECK(g->hides.empty());
  const double after = row(p, "parameters, after the update")->seconds + scalars_s(1, 8, k);
  CHECK(p.slow.exposed_s == doctest::Approx(3 * rs + after));
  j.overlap_comm = true;
  p = plan::plan_cluster(j, k);
  CHECK(row(p, "gradients")->hides == "backward, but the last bucket");
  CHECK(p.slow.exposed_s == doctest::Approx(rs + after));  // the last bucket only
  // The window is the last micro-batch's backward: 1 s x 2/3 / 4 accumulation steps.
  j.compute_s = {0.0012, 0.0012};
  p = plan::plan_cluster(j, k);
  CHECK(p.slow.exposed_s == doctest::Approx(rs + after + (2 * rs - 0.0012 * 2.0 / 3.0 / 4.0)));
}

TEST_CASE("stage 3 gathers each layer forward and backward; prefetched when the window holds a layer") {
  // Layers -1 (1e8), 0, 1 (2e8 each), 2 (the head, 1e8); 2 x 4 ranks, bf16 gathers of P x shard.
  ClusterJob j;
  j.nodes = 2;
  j.gpus_per_node = 4;
  j.stage = 3;
  j.grad_accum = 2;
  j.n_layer = 2;
  j.buffers = {{-1, 100000000, true}, {0, 200000000, true}, {1, 200000000, true}, {2, 100000000, true}};
  j.compute_s = {10.0, 10.0};
  j.optimizer_s = {0.0, 0.0};
  j.tokens_per_gpu = 1000;
  j.prefetch_bucket_size = 50000000;  // below every layer: nothing ahead
  const ClusterLink k = link_of(360, 100);
  auto ag = [&](double elems) { return plan::collective_seconds(CollKind::ALL_GATHER, elems * 2, 2, 4, k); };
  plan::ClusterPlan p = plan::plan_cluster(j, k);
  const auto* f = row(p, "parameters, forward");
  const auto* b = row(p, "parameters, backward");
  REQUIRE(f != nullptr);
  REQUIRE(b != nullptr);
  CHECK(f->count == 4 * 2);  // every layer, each micro-batch
  CHECK(b->count == 3 * 2);  // the head stays gathered from the forward
  CHECK(f->seconds == doctest::Approx(2 * (ag(1e8) + ag(2e8) + ag(2e8) + ag(1e8))));
  CHECK(b->seconds == doctest::Approx(2 * (ag(2e8) + ag(2e8) + ag(1e8))));
  CHECK(f->hides.empty());
  CHECK(row(p, "parameters, after the update") == nullptr);  // every buffer is sharded
  REQUIRE(!p.notes.empty());
  CHECK(p.notes.front().find("a layer of 200000000 sharded elements is larger than "
                             "zero_optimization.stage3_prefetch_bucket_size 50000000") != std::string::npos);
  const double tail = plan::collective_seconds(CollKind::REDUCE_SCATTER, 1e8 * 4, 2, 4, k);
  CHECK(p.slow.exposed_s == doctest::Approx(f->seconds + b->seconds + tail + scalars_s(2, 4, k)));
  // A window of one layer: the forward gathers the embeddings and waits, then each next layer
  // ahead; the backward gathers layers 1 and 0 ahead, and the embeddings ahead of layer 0, which
  // the engine then waits for at once (ZeroGather::visit counts a kept embeddings layer as current).
  j.prefetch_bucket_size = 200000000;
  p = plan::plan_cluster(j, k);
  CHECK(p.notes.empty());
  const auto* fe = row(p, "parameters, forward");
  const auto* fp = row(p, "parameters, forward (prefetched)");
  const auto* be = row(p, "parameters, backward");
  const auto* bp = row(p, "parameters, backward (prefetched)");
  REQUIRE(fe != nullptr);
  REQUIRE(fp != nullptr);
  REQUIRE(be != nullptr);
  REQUIRE(bp != nullptr);
  CHECK(fe->count == 2);
  CHECK(fp->count == 6);
  CHECK(be->count == 2);
  CHECK(bp->count == 4);
  CHECK(fe->seconds == doctest::Approx(2 * ag(1e8)));
  CHECK(be->seconds == doctest::Approx(2 * ag(1e8)));
  CHECK(bp->seconds == doctest::Approx(2 * (ag(2e8) + ag(2e8))));
  CHECK(fp->hides == "forward");
  CHECK(bp->hides == "backward");
  CHECK(p.slow.exposed_s == doctest::Approx(fe->seconds + be->seconds + tail + scalars_s(2, 4, k)));
}

TEST_CASE("bad input is refused naming the field") {
  const ClusterLink k = link_of(360, 400);
  auto refused = [&](ClusterJob j, const char* says) {
    try {
      plan::plan_cluster(j, k);
      FAIL("accepted");
    } catch (const UsageError& e) {
      INFO(e.what());
      CHECK(std::string(e.what()).find(says) != std::string::npos);
    }
  };
  ClusterJob j = one_buffer_job(2, 8, 1000);
  j.nodes = 0;
  refused(j, "0 nodes x 8 GPUs");
  j = one_buffer_job(2, 8, 1000);
  j.stage = 4;
  refused(j, "ZeRO stage 4");
  j = one_buffer_job(2, 8, 1000);
  j.compute_s = {0.0, 1.0};
  refused(j, "compute time");
  j = one_buffer_job(2, 8, 1000);
  j.buffers = {{0, 1000, false}};
  refused(j, "no trainable buffer");
  j = one_buffer_job(2, 8, 1000);
  j.buffers = {{5, 1000, true}};
  refused(j, "at layer 5");
  j = one_buffer_job(2, 8, 1000);
  j.prefetch_bucket_size = -1;
  refused(j, "prefetch bucket (-1)");
  j = one_buffer_job(2, 8, 1000);
  j.max_live_parameters = 0;
  refused(j, "max live parameters (0)");
  CHECK_THROWS_AS(plan::plan_cluster(one_buffer_job(2, 8, 1000), link_of(0, 400)), UsageError);

  const auto specs = plan::cluster_specs_parse("1x8,2X8,16x8");
  REQUIRE(specs.size() == 3);
  CHECK(specs[1] == std::pair<int, int>{2, 8});
  CHECK(specs[2] == std::pair<int, int>{16, 8});
  for (const char* bad : {"", "2x", "x8", "2x8,", "0x8", "2y8"}) {
    INFO(bad);
    CHECK_THROWS_AS(plan::cluster_specs_parse(bad), UsageError);
  }
}

TEST_CASE("a config's job: the model's buffers, its ZeRO settings and the plan's compute") {
  const train::StepSetup s = train::step_setup_from(
      "configs/llama-1b.yaml", {"zero_optimization.stage=3", "gradient_accumulation_steps=2"}, true);
  const plan::ClusterCompute c = plan::cluster_compute_plan(s);
  CHECK(c.step_s.fast > 0);
  CHECK(c.step_s.fast <= c.step_s.slow);
  CHECK(c.optimizer_s.fast > 0);
  const plan::ClusterJob j = plan::cluster_job_from(s, train::zero_options_from(s.cfg), c, 2, 8);
  CHECK(j.stage == 3);
  CHECK(j.grad_accum == 2);
  CHECK(j.compute_bytes == 2);
  CHECK(j.wire_bytes == 4);
  CHECK(j.reduce_bucket_size == 200000000);
  CHECK(j.buffers.size() == static_cast<size_t>(s.model.n_layer + 2));  // embeddings, layers, head
  int64_t n = 0;
  for (const auto& b : j.buffers) n += b.n;
  CHECK(n > 500000000);
  CHECK(j.backward_share == doctest::Approx(0.75));  // every layer recomputes
  const plan::ClusterPlan p = plan::plan_cluster(j, plan::cluster_link_from(s.cfg));
  CHECK(p.world == 16);
  CHECK(p.fast.step_s <= p.slow.step_s);
  const std::string text = plan::plan_cluster_text(p);
  CHECK(text.find("2 nodes x 8 GPUs = 16 ranks, ZeRO stage 3") != std::string::npos);
  CHECK(text.find("gradients") != std::string::npos);
  CHECK(text.find("tokens/s") != std::string::npos);
}
