// Communicators that need no second process: the single-process one (collectives over one rank
// are copies), the fake one (records, group sizes by name, wait bookkeeping), the choice of
// communicator per device, and the TCP start-up handshake between threads on this machine.
#include <gtest/gtest.h>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <future>
#include <thread>

#include "mxtrain/core/error.hpp"
#include "mxtrain/distributed/communicator_factory.hpp"
#include "mxtrain/distributed/fake_communicator.hpp"
#include "mxtrain/distributed/single_communicator.hpp"
#include "mxtrain/runtime/tcp_rendezvous.hpp"
#include "support/test_support.hpp"

namespace mxtrain {
namespace {

struct Recorder : CollectiveObserver {
  std::vector<CollectiveRecord> records;
  void on_collective(const CollectiveRecord& record) override { records.push_back(record); }
};

TEST(SingleProcessCommunicator, CollectivesOverOneRankAreCopies) {
  std::unique_ptr<Backend> backend = create_backend("cpu");
  SingleProcessCommunicator world(*backend);
  Recorder recorder;
  world.set_observer(&recorder);
  Buffer shard = test::upload(*backend, {1, 2, 3}, Shape{3});
  Buffer gathered = test::upload(*backend, {0, 0, 0}, Shape{3});
  world.wait(world.all_gather(shard, gathered));
  EXPECT_EQ(test::download(*backend, gathered), (std::vector<float>{1, 2, 3}));
  Buffer full = test::upload(*backend, {4, 5, 6}, Shape{3});
  world.wait(world.reduce_scatter(full, shard, ReduceOp::average));
  EXPECT_EQ(test::download(*backend, shard), (std::vector<float>{4, 5, 6}));
  world.wait(world.all_reduce(full, ReduceOp::sum));
  EXPECT_EQ(test::download(*backend, full), (std::vector<float>{4, 5, 6}));
  EXPECT_EQ(world.all_reduce_scalar(2.5, ReduceOp::sum), 2.5);
  std::unique_ptr<Communicator> child = world.split(0, 0, "shard");
  EXPECT_EQ(child->size(), 1);
  EXPECT_EQ(child->group(), "shard");
  child->wait(child->all_reduce(full, ReduceOp::sum));
  ASSERT_EQ(recorder.records.size(), 4u);  // the child reports to the parent's observer
  EXPECT_EQ(recorder.records[0].kind, CollectiveKind::all_gather);
  EXPECT_EQ(recorder.records[0].bytes, 12u);
  EXPECT_EQ(recorder.records[3].group, "shard");
}

TEST(FakeCommunicator, RecordsWithGroupSizesAndTracksWaits) {
  FakeCommunicator world(8, 5, {{"shard", 4}, {"replicate", 2}});
  Recorder recorder;
  world.set_observer(&recorder);
  Tensor shard(reinterpret_cast<void*>(0x1000), Shape{10}, DType::bf16, Device::none);
  Tensor full(reinterpret_cast<void*>(0x2000), Shape{80}, DType::bf16, Device::none);
  const WorkId first = world.all_gather(shard, full);
  const WorkId second = world.reduce_scatter(full, shard, ReduceOp::sum);
  EXPECT_EQ(world.outstanding(), 2u);
  world.wait(first);
  EXPECT_EQ(world.outstanding(), 1u);
  world.wait(second);
  EXPECT_EQ(world.outstanding(), 0u);
  EXPECT_EQ(recorder.records[0].bytes, 160u);
  EXPECT_EQ(recorder.records[0].group_size, 8);
  std::unique_ptr<Communicator> shard_group = world.split(1, 1, "shard");
  EXPECT_EQ(shard_group->size(), 4);
  EXPECT_EQ(shard_group->rank(), 1);
  Tensor quarter(reinterpret_cast<void*>(0x3000), Shape{20}, DType::f32, Device::none);
  Tensor whole(reinterpret_cast<void*>(0x4000), Shape{80}, DType::f32, Device::none);
  shard_group->reduce_scatter(whole, quarter, ReduceOp::sum);
  EXPECT_EQ(recorder.records.back().group, "shard");
  EXPECT_EQ(recorder.records.back().group_size, 4);
  EXPECT_EQ(recorder.records.back().bytes, 320u);
  EXPECT_EQ(world.split(0, 1, "replicate")->size(), 2);
  EXPECT_EQ(world.all_reduce_scalar(3, ReduceOp::sum), 24);
  EXPECT_EQ(world.all_reduce_scalar(3, ReduceOp::max), 3);
}

TEST(CommunicatorKind, AutoPicksNcclOnGpusAndMpiOnCpus) {
  EXPECT_EQ(resolve_communicator_kind("auto", "cpu", 1), "single");
  EXPECT_EQ(resolve_communicator_kind("auto", "cuda", 1), "single");
  EXPECT_EQ(resolve_communicator_kind("auto", "cuda", 4), "nccl");
  EXPECT_EQ(resolve_communicator_kind("auto", "cpu", 4), "mpi");
  EXPECT_EQ(resolve_communicator_kind("nccl", "cuda", 1), "nccl");
  EXPECT_THROW(resolve_communicator_kind("nccl", "cpu", 2), Error);
  EXPECT_THROW(resolve_communicator_kind("mpi", "cuda", 2), Error);
}

TEST(CommunicatorKind, CpuRanksStartedWithoutMpirunAreRefusedWithTheFix) {
  std::unique_ptr<Backend> backend = create_backend("cpu");
  runtime::RankEnvironment environment;
  environment.source = runtime::EnvironmentSource::torchrun;
  environment.world_size = 2;
  environment.local_world_size = 2;
  try {
    create_world_communicator("mpi", environment, *backend);
    FAIL() << "expected an error";
  } catch (const Error& error) {
    EXPECT_NE(error.full_message().find("mpirun -np 2"), std::string::npos) << error.full_message();
  }
}

int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address);
  socklen_t length = sizeof address;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  ::close(fd);
  return ntohs(address.sin_port);
}

runtime::RankEnvironment rank_of(int rank, int world, int port) {
  runtime::RankEnvironment e;
  e.source = runtime::EnvironmentSource::torchrun;
  e.rank = rank;
  e.world_size = world;
  e.local_world_size = world;
  e.master_addr = "127.0.0.1";
  e.master_port = port;
  return e;
}

TEST(TcpRendezvous, EveryRankReceivesRankZerosBytes) {
  const int port = free_port();
  const std::string payload("\x01\x00unique id bytes\xff", 18);
  std::vector<std::future<std::string>> ranks;
  for (int rank = 3; rank >= 0; --rank)  // peers start before rank 0 listens: they retry
    ranks.push_back(std::async(std::launch::async, [=] {
      return runtime::tcp_broadcast_from_rank0(rank_of(rank, 4, port), rank == 0 ? payload : "", 30);
    }));
  for (auto& rank : ranks) EXPECT_EQ(rank.get(), payload);
}

TEST(TcpRendezvous, MissingRanksAreNamedAtTheTimeout) {
  const int port = free_port();
  auto peer = std::async(std::launch::async, [=] { return runtime::tcp_broadcast_from_rank0(rank_of(1, 3, port), "", 3); });
  try {
    runtime::tcp_broadcast_from_rank0(rank_of(0, 3, port), "id", 1.5);
    FAIL() << "expected a timeout";
  } catch (const Error& error) {
    EXPECT_NE(error.full_message().find("ranks 2 did not reach rank 0"), std::string::npos) << error.full_message();
  }
  EXPECT_THROW(peer.get(), Error);  // rank 0 hung up on it
}

TEST(TcpRendezvous, AWorldSizeMismatchIsRefused) {
  const int port = free_port();
  auto peer = std::async(std::launch::async, [=] { return runtime::tcp_broadcast_from_rank0(rank_of(1, 4, port), "", 2); });
  try {
    runtime::tcp_broadcast_from_rank0(rank_of(0, 2, port), "id", 5);
    FAIL() << "expected an error";
  } catch (const Error& error) {
    EXPECT_NE(error.full_message().find("world size of 4, rank 0 has 2"), std::string::npos) << error.full_message();
  }
  EXPECT_THROW(peer.get(), Error);
}

}  // namespace
}  // namespace mxtrain
