// main() of the tests that run inside every rank of `mpirun -np N`: MPI up before GoogleTest,
// the full report from rank 0 only (other ranks print their failures), and one verdict for the
// job — a failure on any rank fails every rank's exit status.
#include <gtest/gtest.h>

#include <cstdio>

#include "mpi/mpi_support.hpp"
#include "mxtrain/core/log.hpp"

namespace {

class FailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit FailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::fprintf(stderr, "[rank %d] %s:%d: failure\n%s\n", rank_, result.file_name() ? result.file_name() : "?",
                 result.line_number(), result.summary());
  }

 private:
  int rank_;
};

}  // namespace

int main(int argc, char** argv) {
  mxtrain::ensure_mpi_initialized();
  ::testing::InitGoogleTest(&argc, argv);
  const int rank = mxtrain::mpi_world_rank();
  if (rank != 0) {
    ::testing::TestEventListeners& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new FailurePrinter(rank));
  }
  mxtrain::log::set_level(mxtrain::log::Level::warn);
  int result = RUN_ALL_TESTS();
  const double worst = mxtrain::test::mpi_world().all_reduce_scalar(result, mxtrain::ReduceOp::max);
  mxtrain::finalize_mpi();
  return worst > 0 ? 1 : 0;
}
