// The collective benchmark sweep (`dtrain bench`): every rank runs it over a
// Communicator; rank 0 prints an nccl-tests compatible table (same header, columns,
// units and footer) and the rows can be exported as JSON.
#pragma once

#include "comm/communicator.h"
#include "core/dtype.h"

#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

namespace dtrain::bench {

using comm::ReduceOp;

enum class Collective { ALLREDUCE, REDUCE_SCATTER, ALL_GATHER, BROADCAST };

/// "allreduce", "reduce_scatter", "all_gather", "broadcast".
const char* collective_name(Collective c);
/// Accepts the names above and the nccl-tests spellings (all_reduce, reducescatter,
/// allgather, bcast; any case). Returns false when unknown.
bool collective_parse(std::string_view s, Collective* out);
/// busbw / algbw for world size n: 2(n-1)/n allreduce, (n-1)/n reduce_scatter and
/// all_gather, 1 broadcast (nccl-tests PERFORMANCE.md).
double bus_factor(Collective c, int n);

struct BenchOptions {
  std::vector<Collective> collectives;          ///< run in this order; empty = all four
  size_t min_bytes = 32, max_bytes = 32 << 20;  ///< -b / -e
  double step_factor = 2;                       ///< -f: next size = size * factor (when step_bytes == 0)
  size_t step_bytes = 0;                        ///< -i: next size = size + step_bytes when non-zero
  int iters = 20, warmup = 5;                   ///< -n / -w
  bool check = true;                            ///< -c: count elements that differ from the exact result
  ReduceOp op = ReduceOp::SUM;                  ///< -o
  DType dtype = DType::F32;                     ///< -d
  int root = 0;                                 ///< -r (broadcast)
  int agg_iters = 1;                            ///< -m: collectives issued per timed iteration
  bool blocking = false;                        ///< -z: wait for each collective before issuing the next
};

/// "8", "1K", "4M", "1G" (powers of 1024 like nccl-tests; k/m/g, an optional trailing
/// B, e.g. "64KB"). Throws UsageError naming the text on anything else or overflow.
size_t parse_size(const std::string& text);

struct BenchRow {
  Collective coll;
  size_t bytes;  ///< whole buffer: allreduce/broadcast data, reduce_scatter input, all_gather output
  size_t
      count;  ///< elements per rank argument: allreduce/broadcast count, reduce_scatter recv_count, all_gather send_count
  DType dtype;
  ReduceOp op;
  int root;  ///< broadcast root, -1 otherwise
  double oop_time_us, oop_algbw, oop_busbw;
  int64_t oop_wrong;  ///< summed over ranks; -1 when not checked
  double ip_time_us, ip_algbw, ip_busbw;
  int64_t ip_wrong;
};

/// Runs the sweep collectively (every rank calls it with the same options). Times are
/// averaged over iters*agg_iters and max-reduced across ranks, so every rank returns
/// the same rows. Rank 0 passes a stream and the table is printed as it goes; other
/// ranks pass nullptr. Sizes whose per-rank count rounds down to 0 are skipped. Throws
/// UsageError for inconsistent options, CommError when a collective fails.
std::vector<BenchRow> bench_run(comm::Communicator& comm, const BenchOptions& opts, std::FILE* out);

/// Sum of #wrong over all rows (unchecked rows count 0).
int64_t bench_wrong_total(const std::vector<BenchRow>& rows);
/// Average of the out-of-place and in-place bus bandwidths over all rows (GB/s).
double bench_avg_busbw(const std::vector<BenchRow>& rows);

/// The rows as a JSON document: {"world_size", "backend", "options": {...},
/// "rows": [{"collective", "bytes", "count", "type", "redop", "root",
/// "out_of_place": {"time_us", "algbw_gbps", "busbw_gbps", "wrong"}, "in_place": {...}}],
/// "wrong_total", "avg_busbw_gbps"}.
std::string bench_json(const std::vector<BenchRow>& rows, int world_size, comm::Backend backend,
                       const BenchOptions& opts);

}  // namespace dtrain::bench
