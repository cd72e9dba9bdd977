// The example configs under configs/ stay valid: each loads (unknown keys and bad values are
// errors) and plans on the GPUs its header comment names.
#include <gtest/gtest.h>

#include <filesystem>

#include "mxtrain/config/loader.hpp"
#include "mxtrain/plan/planner.hpp"
#include "support/test_support.hpp"

namespace mxtrain {
namespace {

TEST(ExampleConfigs, EveryConfigLoadsAndFitsItsIntendedGpus) {
  const std::map<std::string, PlanTarget> targets = {{"llama-8b.toml", {"h200", 8, 0}},
                                                     {"gpt2-124m.toml", {"h200", 1, 0}}};
  int checked = 0;
  for (const auto& entry : std::filesystem::directory_iterator(test::source_dir() + "/configs")) {
    if (entry.path().extension() != ".toml") continue;
    const std::string name = entry.path().filename().string();
    SCOPED_TRACE(name);
    ConfigSources sources;
    sources.toml_path = entry.path().string();
    sources.read_environment = false;
    const RunConfig config = load_config(sources);
    ASSERT_TRUE(targets.count(name)) << "add " << name << " and the GPUs it is meant for to this test";
    PlanOptions options;
    options.detailed = false;
    const Plan plan = make_plan(config, targets.at(name), Calibration::load(), options);
    EXPECT_TRUE(plan.fits_with_headroom) << format_plan(plan);
    ++checked;
  }
  EXPECT_EQ(checked, static_cast<int>(targets.size()));
}

}  // namespace
}  // namespace mxtrain
