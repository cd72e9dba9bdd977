// metrics.jsonl writes are checked: a full disk (/dev/full answers every write with ENOSPC) is an
// Error(system) naming the file at the record that failed, not silence; a resumed run keeps only
// the records up to the step it resumed from, and drops a line a kill cut short.
#include <gtest/gtest.h>

#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include "mxtrain/core/error.hpp"
#include "mxtrain/train/metrics.hpp"
#include "support/test_support.hpp"

namespace mxtrain {
namespace {

TEST(MetricsFile, AFullDiskIsAnErrorAtTheFailingRecord) {
  MetricsFile full("/dev/full");
  try {
    full.write({{"step", 1}, {"loss", 2.5}});
    FAIL() << "a write to a full disk was accepted";
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::system);
    EXPECT_NE(error.full_message().find("cannot write the metrics file /dev/full"), std::string::npos)
        << error.full_message();
    EXPECT_NE(error.full_message().find("No space left on device"), std::string::npos) << error.full_message();
  }
}

TEST(MetricsFile, AResumedRunKeepsTheRecordsThroughItsStep) {
  test::TempDir dir;
  const std::string path = dir.file("metrics.jsonl");
  {
    MetricsFile file(path);
    for (int step = 1; step <= 6; ++step) file.write({{"step", step}, {"loss", 1.0 / step}});
    file.write({{"step", 4}, {"val_loss", 0.5}});
  }
  std::ofstream(path, std::ios::app) << R"({"step":7,"lo)";  // cut short by SIGKILL
  const MetricsFile::Kept kept = MetricsFile::keep_through_step(path, 4);
  EXPECT_EQ(kept.dropped, 3);  // steps 5, 6 and the cut line; step 4's val_loss stays
  EXPECT_EQ(kept.keys_at_step, (std::set<std::string>{"step", "loss", "val_loss"}));
  std::ifstream in(path);
  std::vector<int64_t> steps;
  for (std::string line; std::getline(in, line);) steps.push_back(nlohmann::json::parse(line)["step"].get<int64_t>());
  EXPECT_EQ(steps, (std::vector<int64_t>{1, 2, 3, 4, 4}));
  EXPECT_EQ(MetricsFile::keep_through_step(path, 4).dropped, 0);  // nothing more to drop
}

}  // namespace
}  // namespace mxtrain
