// One split scenario for every backend (Gloo, NCCL, device-local), run by each rank of a
// world on its own thread: two groups by color (one ranked in reverse by its keys) run an
// allreduce, a reduce-scatter and an all-gather at the same time, checked against values
// computed here; the world stays usable; a second split leaves the last rank out (nullptr).
#pragma once

#include "comm/buffer.h"
#include "comm/communicator.h"

#include <algorithm>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace dtrain::test {

// Exact in fp32 and distinct per world rank.
inline float split_value(int world_rank, size_t i) {
  return static_cast<float>(static_cast<int>((i * 5 + static_cast<size_t>(world_rank) * 3) % 9) - 4) +
         0.25f * static_cast<float>(world_rank);
}

// The world ranks of `color`'s group in group-rank order: by key, ties by world rank (the
// documented rule, written out here rather than taken from comm::split_place).
inline std::vector<int> split_members(const std::vector<int>& colors, const std::vector<int>& keys, int color) {
  std::vector<std::pair<int, int>> m;
  for (size_t r = 0; r < colors.size(); ++r)
    if (colors[r] == color) m.emplace_back(keys[r], static_cast<int>(r));
  std::sort(m.begin(), m.end());
  std::vector<int> out;
  for (const auto& x : m) out.push_back(x.second);
  return out;
}

inline void split_need(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error(what);
}

// group.synchronize(), then buf's first `count` floats from `at` (in floats) against want(i).
template <typename Want>
void split_expect(comm::Communicator& group, const comm::Buffer& buf, size_t at, size_t count, Want want,
                  const std::string& what) {
  group.synchronize();
  std::vector<float> host(count);
  buf.copy_to_host(host.data(), count * sizeof(float), at * sizeof(float));
  for (size_t i = 0; i < count; ++i)
    split_need(host[i] == want(i), what + " element " + std::to_string(i) + ": got " + std::to_string(host[i]) +
                                       " want " + std::to_string(want(i)));
}

// The group `g` of world rank `me` whose members are `members`: its place, then the three
// collectives the ZeRO engine uses.
inline void split_group_check(comm::Communicator& world, comm::Communicator& g, int me,
                              const std::vector<int>& members) {
  const int n = static_cast<int>(members.size());
  const int rank = static_cast<int>(std::find(members.begin(), members.end(), me) - members.begin());
  split_need(g.size() == n && g.rank() == rank, "world rank " + std::to_string(me) + " is group rank " +
                                                    std::to_string(g.rank()) + " of " + std::to_string(g.size()) +
                                                    ", want " + std::to_string(rank) + " of " + std::to_string(n));
  split_need(g.backend() == world.backend() && g.on_device() == world.on_device() && g.device() == world.device(),
             "the group is not on its world's backend and device");
  const size_t per = 333;
  const auto un = static_cast<size_t>(n);
  std::vector<float> mine(per * un);
  for (size_t i = 0; i < mine.size(); ++i) mine[i] = split_value(me, i);
  comm::Buffer send(g, mine.size() * sizeof(float)), recv(g, mine.size() * sizeof(float));
  send.copy_from_host(mine.data(), mine.size() * sizeof(float));
  auto sum = [&](size_t i) {
    float s = 0;
    for (int q : members) s += split_value(q, i);
    return s;
  };
  auto max = [&](size_t i) {
    float m = split_value(members[0], i);
    for (int q : members) m = std::max(m, split_value(q, i));
    return m;
  };
  g.allreduce(send.data(), recv.data(), per, DType::F32, comm::ReduceOp::SUM);
  split_expect(g, recv, 0, per, sum, "group allreduce");
  g.reduce_scatter(send.data(), recv.data(), per, DType::F32, comm::ReduceOp::MAX);
  split_expect(
      g, recv, 0, per, [&](size_t i) { return max(static_cast<size_t>(rank) * per + i); }, "group reduce_scatter");
  g.all_gather(send.data(), recv.data(), per, DType::F32);
  for (int q = 0; q < n; ++q)
    split_expect(
        g, recv, static_cast<size_t>(q) * per, per, [&](size_t i) { return split_value(members[q], i); },
        "group all_gather from group rank " + std::to_string(q));
}

// An allreduce over the whole world after its splits.
inline void split_world_check(comm::Communicator& world) {
  const float one = 1.0f;
  comm::Buffer b(world, sizeof(float));
  b.copy_from_host(&one, sizeof one);
  world.allreduce(b.data(), b.data(), 1, DType::F32, comm::ReduceOp::SUM);
  split_expect(
      world, b, 0, 1, [&](size_t) { return static_cast<float>(world.size()); }, "world allreduce after a split");
}

// The whole scenario on world rank world.rank() (any world size; two groups from 2 ranks).
inline void split_check(comm::Communicator& world) {
  const int n = world.size(), me = world.rank();
  // Even and odd world ranks; the odd ones ranked by descending world rank (key -rank).
  std::vector<int> colors, keys;
  for (int r = 0; r < n; ++r) {
    colors.push_back(r % 2);
    keys.push_back(r % 2 == 0 ? r : -r);
  }
  {
    std::unique_ptr<comm::Communicator> g = world.split(colors[static_cast<size_t>(me)], keys[static_cast<size_t>(me)]);
    split_need(g != nullptr, "no group for a colored rank");
    split_group_check(world, *g, me, split_members(colors, keys, colors[static_cast<size_t>(me)]));
    split_world_check(world);
  }
  // The last rank stays out (any negative color); the others share one color and key.
  std::vector<int> colors2(static_cast<size_t>(n), 7), keys2(static_cast<size_t>(n), 3);
  colors2.back() = -1;
  std::unique_ptr<comm::Communicator> h = world.split(colors2[static_cast<size_t>(me)], 3);
  if (me == n - 1) {
    split_need(h == nullptr, "a rank of negative color got a group");
  } else {
    split_need(h != nullptr, "no group in the second split");
    split_group_check(world, *h, me, split_members(colors2, keys2, 7));
  }
  h.reset();
  split_world_check(world);
}

}  // namespace dtrain::test
