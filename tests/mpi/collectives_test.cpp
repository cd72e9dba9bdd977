// The MPI communicator between the ranks of this job, against values every rank can compute:
// all-gather, reduce-scatter (sum, average; f32 and bf16), all-reduce, broadcast, split into
// shard and replica groups, host scalars, and the ordering of several collectives in flight.
#include <gtest/gtest.h>

#include "mpi/mpi_support.hpp"
#include "mxtrain/backend/backend.hpp"
#include "support/test_support.hpp"

namespace mxtrain {
namespace {

// Rank r's value of element i.
float value(int rank, int64_t i) { return static_cast<float>(rank * 100 + i) * 0.25f; }

TEST(MpiCollectives, AllGatherReduceScatterAllReduceBroadcast) {
  Communicator& world = test::mpi_world();
  const int n = world.size(), r = world.rank();
  std::unique_ptr<Backend> cpu = create_backend("cpu", BackendOptions{1});
  const int64_t slice = 3;
  std::vector<float> mine(slice), full(static_cast<size_t>(slice * n));
  for (int64_t i = 0; i < slice; ++i) mine[i] = value(r, i);
  for (int64_t i = 0; i < slice * n; ++i) full[i] = value(r, i);
  Buffer shard = test::upload(*cpu, mine, Shape{slice});
  Buffer gathered = test::upload(*cpu, std::vector<float>(slice * n, -1), Shape{slice * n});
  Buffer unreduced = test::upload(*cpu, full, Shape{slice * n});
  Buffer reduced = test::upload(*cpu, std::vector<float>(slice, -1), Shape{slice});
  // Two collectives in flight at once; waiting for the second covers the first.
  const WorkId gather = world.all_gather(shard, gathered);
  const WorkId scatter = world.reduce_scatter(unreduced, reduced, ReduceOp::sum);
  world.wait(scatter);
  (void)gather;
  std::vector<float> got = test::download(*cpu, gathered);
  for (int q = 0; q < n; ++q)
    for (int64_t i = 0; i < slice; ++i) EXPECT_EQ(got[q * slice + i], value(q, i));
  got = test::download(*cpu, reduced);
  for (int64_t i = 0; i < slice; ++i) {
    float expected = 0;
    for (int q = 0; q < n; ++q) expected += value(q, r * slice + i);
    EXPECT_EQ(got[i], expected);
  }
  world.wait(world.reduce_scatter(unreduced, reduced, ReduceOp::average));
  got = test::download(*cpu, reduced);
  for (int64_t i = 0; i < slice; ++i) {
    float expected = 0;
    for (int q = 0; q < n; ++q) expected += value(q, r * slice + i);
    EXPECT_FLOAT_EQ(got[i], expected / n);
  }
  world.wait(world.all_reduce(shard, ReduceOp::max));
  EXPECT_EQ(test::download(*cpu, shard)[2], value(n - 1, 2));
  Buffer message = test::upload(*cpu, {static_cast<float>(r), 7.0f}, Shape{2});
  world.wait(world.broadcast(message, n - 1));
  EXPECT_EQ(test::download(*cpu, message), (std::vector<float>{static_cast<float>(n - 1), 7.0f}));
  EXPECT_EQ(world.all_reduce_scalar(r + 1, ReduceOp::sum), n * (n + 1) / 2.0);
  EXPECT_EQ(world.all_reduce_scalar(r, ReduceOp::max), n - 1);
}

TEST(MpiCollectives, BfloatSumsRoundLikeBfloat) {
  Communicator& world = test::mpi_world();
  const int n = world.size();
  std::unique_ptr<Backend> cpu = create_backend("cpu", BackendOptions{1});
  // 1 + 2^-7 per rank (exact in bf16): from three ranks on, the sums need rounding.
  std::vector<float> ones(static_cast<size_t>(n), 1.0078125f);
  Buffer full = test::upload(*cpu, ones, Shape{n}, DType::bf16);
  Buffer mine = test::upload(*cpu, {0.0f}, Shape{1}, DType::bf16);
  world.wait(world.reduce_scatter(full, mine, ReduceOp::sum));
  const float got = test::download(*cpu, mine)[0];
  EXPECT_NEAR(got, n * 1.0078125f, n * 0.01f);
  EXPECT_EQ(got, round_to_bf16(got)) << "the result is a bf16 value";
}

TEST(MpiCollectives, SplitIntoShardAndReplicaGroups) {
  Communicator& world = test::mpi_world();
  const int n = world.size(), r = world.rank();
  if (n % 2 != 0) GTEST_SKIP() << "needs an even number of ranks";
  const int shard_size = 2;
  std::unique_ptr<Communicator> shard = world.split(r / shard_size, r % shard_size, "shard");
  std::unique_ptr<Communicator> replicas = world.split(r % shard_size, r / shard_size, "replicate");
  EXPECT_EQ(shard->size(), shard_size);
  EXPECT_EQ(shard->rank(), r % shard_size);
  EXPECT_EQ(replicas->size(), n / shard_size);
  EXPECT_EQ(replicas->rank(), r / shard_size);
  EXPECT_EQ(shard->group(), "shard");
  // Sum of the world ranks in my shard group, and in my replica group.
  EXPECT_EQ(shard->all_reduce_scalar(r, ReduceOp::sum), (r / shard_size) * 4 + 1);
  double expected = 0;
  for (int q = r % shard_size; q < n; q += shard_size) expected += q;
  EXPECT_EQ(replicas->all_reduce_scalar(r, ReduceOp::sum), expected);
}

}  // namespace
}  // namespace mxtrain
