// The cluster plan: one training step of a job on N nodes x W GPUs, predicted from one
// GPU's compute time and the collectives dtrain's ZeRO engine issues for the model's
// buffers (gradient buckets, stage-3 gathers, the post-step gathers), each timed by NCCL's
// ring model over the link it is bound by (NVLink inside a node, the network across), with
// the rule for what hides behind compute. `dtrain launch --dry-run` and `bench train --plan
// --cluster` print it. A model, not a measurement: see docs/cluster.md.
#pragma once

#include "plan/bench_plan.h"
#include "train/step_setup.h"
#include "train/zero_engine.h"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace dtrain::plan {

/// The links, per GPU. intra_gbytes: NCCL bus bandwidth inside a node (NVLink/NVSwitch), GB/s
/// (10^9 bytes); inter_gbits: network bandwidth per GPU (InfiniBand/RoCE, one NIC per GPU),
/// Gb/s. Both are what a collective can get: nccl-tests' busbw, or the line rate for an
/// optimistic plan.
struct ClusterLink {
  double intra_gbytes = 360;  ///< H100 SXM ring all-reduce busbw in one node (NVLink 4: 450 GB/s a way)
  double inter_gbits = 400;   ///< NDR InfiniBand, one 400 Gb/s NIC per GPU
  std::string source;         ///< where the figures come from, as the report says it
};

/// NCCL's ring latency model for the Simple protocol (src/graph/tuning.cc: baseLat, hwLat), us.
struct ClusterLatency {
  double base_us = 8.4;        ///< per collective
  double nvlink_hop_us = 3.4;  ///< per ring step inside a node
  double net_hop_us = 14.0;    ///< per ring step that crosses the network
};

enum class CollKind { ALL_REDUCE, REDUCE_SCATTER, ALL_GATHER };
const char* coll_kind_name(CollKind k);

/// One parameter buffer of the model as the engine sees it (base buffers in the model's
/// order, then the LoRA adapters): its layer (-1 embeddings .. n_layer head) and elements.
struct ClusterBuffer {
  int layer = 0;
  int64_t n = 0;
  bool trainable = true;
};

/// What one step of the job is: the cluster, the engine's settings and the model's buffers,
/// and one GPU's compute for the step (a band: the slow and fast ends).
struct ClusterJob {
  int nodes = 1, gpus_per_node = 1;
  int stage = 0;
  int grad_accum = 1;
  bool overlap_comm = false;  ///< stages 0-1: buckets reduced during the last backward
  int compute_bytes = 2;      ///< the compute dtype: stage-3 and post-step parameter gathers
  int wire_bytes = 4;         ///< the gradients' wire: 4 (fp32), 2 (communication.compression bf16/fp16)
  int64_t reduce_bucket_size = 500000000, allgather_bucket_size = 500000000;  ///< elements
  int64_t prefetch_bucket_size = 50000000, persistence_threshold = 100000, max_live_parameters = 1000000000;
  int n_layer = 0;
  bool tied = false;  ///< the head reads the embeddings (they stay gathered through the backward)
  std::vector<ClusterBuffer> buffers;
  PlanBand compute_s;                 ///< one GPU: forward + backward of the step's micro-batches, seconds
  PlanBand optimizer_s;               ///< one GPU: the update of every trainable element (norm, AdamW), seconds
  double backward_share = 2.0 / 3.0;  ///< of compute_s that is backward (recompute adds a forward)
  double tokens_per_gpu = 0;          ///< per step
};

/// One kind of collective of the step: `count` of them, `bytes` each on average (the message
/// size as nccl-tests counts it: the buffer for all-reduce, the whole input of a
/// reduce-scatter, the whole output of an all-gather), `seconds` all of them together.
struct ClusterCollective {
  std::string what;  ///< "gradients", "parameters (forward)", ...
  CollKind kind = CollKind::ALL_REDUCE;
  int64_t count = 0;
  double bytes = 0, seconds = 0;
  std::string hides;  ///< what it overlaps ("backward", "forward") or "" (exposed)
};

/// One end of the band.
struct ClusterEnd {
  double compute_s = 0, optimizer_s = 0, exposed_s = 0, step_s = 0;
  double tokens_per_s_gpu = 0, tokens_per_s = 0;
  double efficiency = 0;  ///< tokens/s per GPU against one GPU alone (no collectives, the whole update)
};

struct ClusterPlan {
  int nodes = 1, gpus_per_node = 1, world = 1, stage = 0;
  double bus_gbytes = 0;  ///< the bus bandwidth the ring gets (GB/s), 0 for one GPU
  std::string bound;      ///< "NVLink", "network" or "" (one GPU)
  std::vector<ClusterCollective> collectives;
  double comm_s = 0;  ///< every collective of the step, overlapped or not
  ClusterEnd slow, fast;
  ClusterLink link;
  std::vector<std::string> notes;
};

/// Seconds of one collective of `bytes` (as above) on nodes x gpus_per_node ranks: NCCL's ring,
/// algbw = busbw / f with f = 2(P-1)/P for all-reduce and (P-1)/P for reduce-scatter and
/// all-gather (nccl-tests' doc/PERFORMANCE.md), busbw the bottleneck of the ring (NVLink's
/// within one node; across nodes min(NVLink, W x the network per GPU): each node's ring
/// traffic leaves through its W NICs), plus the latency of its ring steps. 0 for one rank.
double collective_seconds(CollKind kind, double bytes, int nodes, int gpus_per_node, const ClusterLink& link,
                          const ClusterLatency& lat = {});

/// The plan of `job` over `link`. UsageError naming the field for a count below 1, a
/// negative or zero time, a stage outside 0-3 or a job without trainable buffers.
ClusterPlan plan_cluster(const ClusterJob& job, const ClusterLink& link, const ClusterLatency& lat = {});

/// One line per plan (nodes x GPUs, step time, exposed communication, tokens/s per GPU and
/// scaling, each as its band), under a header naming the stage and links of the first.
std::string plan_cluster_summary(const std::vector<ClusterPlan>& plans);

/// "NODESxGPUS[,NODESxGPUS...]" (e.g. "1x8,2x8,16x8"): the clusters of `bench train --plan
/// --cluster`. UsageError naming the flag and the grammar otherwise.
std::vector<std::pair<int, int>> cluster_specs_parse(const std::string& text);

/// The report: per collective kind, bytes, count and time, then the step (compute, update,
/// exposed communication, step time, tokens/s per GPU and in all, scaling efficiency) at both
/// ends of the band; `indent` starts each line.
std::string plan_cluster_text(const ClusterPlan& p, const std::string& indent = "");

// ----------------------------------------------------------------------------
// From a training config.

/// One GPU's compute for the step of `s` on `gpu` (a --plan profile): the PlanDevice trace of
/// the trainer's step, priced at both ends of the budget's bands, split into the update
/// (AdamW and the gradient norm, which ZeRO shards) and the rest. `source` says so.
struct ClusterCompute {
  PlanBand step_s, optimizer_s;
  std::string source;
};
ClusterCompute cluster_compute_plan(const train::StepSetup& s, const std::string& gpu = "h100");
/// The same split of a --plan result already made (its kernel rows).
ClusterCompute cluster_compute_of(const BenchPlanResult& r);
/// Without a trace (a shape the plan refuses): 6N + 12 L T d FLOPs per token (model_flops_per_token)
/// at an MFU band of 35 to 50 % of the profile's tensor peak, the update at HBM speed.
ClusterCompute cluster_compute_flops(const train::StepSetup& s, int64_t params, int64_t trainable,
                                     const std::string& gpu = "h100");

/// The job of the setup's model (its buffers from the model built on a PlanDevice), the
/// config's ZeRO settings `z` (stage, buckets, overlap, wire) and `compute`, on nodes x
/// gpus_per_node.
ClusterJob cluster_job_from(const train::StepSetup& s, const train::ZeroOptions& z, const ClusterCompute& compute,
                            int nodes, int gpus_per_node);

/// The link of a config: cluster.link.intra_node_gbytes and cluster.link.inter_node_gbits.
ClusterLink cluster_link_from(const config::TrainConfig& cfg);

/// The plan of the config `s` was read from (its ZeRO settings and links) with `compute`, on
/// nodes x gpus_per_node, with notes on where the compute came from and the batch.
ClusterPlan cluster_plan_of(const train::StepSetup& s, const ClusterCompute& compute, int nodes, int gpus_per_node);

/// The dry run's section for cfg (its batch resolved) on nodes x gpus_per_node GPUs of the
/// `gpu` profile: the one-GPU plan of the config's step, then plan_cluster_text.
std::string cluster_plan_report(const config::TrainConfig& cfg, int nodes, int gpus_per_node,
                                const std::string& gpu = "h100");

}  // namespace dtrain::plan
