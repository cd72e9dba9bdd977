// docs/planning.md tells the truth (docs/conventions.md #15): every `mxtrain plan` and `mxtrain tune` example
// in its shell blocks runs (tune as --dry-run: the trials need a GPU), and its preset table is what
// bench/planning_table.sh generates now. Also the command line's own error paths.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "support/test_support.hpp"

namespace mxtrain {
namespace {

std::string read_doc() {
  std::ifstream in(test::source_dir() + "/docs/planning.md");
  EXPECT_TRUE(in) << "docs/planning.md missing";
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::vector<std::string> shell_examples(const std::string& doc) {
  std::vector<std::string> commands;
  std::stringstream lines(doc);
  std::string line;
  bool in_block = false;
  while (std::getline(lines, line)) {
    if (line.rfind("```", 0) == 0) {
      in_block = !in_block && line == "```sh";
      continue;
    }
    if (in_block && line.rfind("mxtrain ", 0) == 0) commands.push_back(line.substr(8));
  }
  return commands;
}

TEST(PlanningDocs, EveryPlanAndTuneExampleRuns) {
  const std::vector<std::string> examples = shell_examples(read_doc());
  int plans = 0, tunes = 0;
  for (std::string example : examples) {
    SCOPED_TRACE(example);
    if (example.rfind("tune ", 0) == 0) {
      example += " --dry-run --gpu h200";
      ++tunes;
    } else {
      ASSERT_EQ(example.rfind("plan ", 0), 0u) << "only plan and tune examples are expected here";
      ++plans;
    }
    std::string output;  // from the repository root, as the page's paths are written
    EXPECT_EQ(test::run_command("cd '" + test::source_dir() + "' && " + test::binary_path() + " " + example, &output), 0)
        << output;
  }
  EXPECT_GE(plans, 5);
  EXPECT_GE(tunes, 2);
}

TEST(PlanningDocs, PresetTableIsCurrent) {
  const std::string doc = read_doc();
  const std::string begin = "<!-- planning-table:begin -->\n", end = "<!-- planning-table:end -->";
  const size_t from = doc.find(begin), to = doc.find(end);
  ASSERT_TRUE(from != std::string::npos && to != std::string::npos) << "the table markers are missing";
  const std::string committed = doc.substr(from + begin.size(), to - from - begin.size());
  std::string generated;
  ASSERT_EQ(test::run_command(test::source_dir() + "/bench/planning_table.sh " + test::binary_path(), &generated), 0)
      << generated;
  EXPECT_EQ(committed, generated) << "the table in docs/planning.md is stale: run bench/planning_table.sh --update "
                                     "build/cpu/mxtrain and commit the result";
}

TEST(PlanCommand, JsonOutputAndErrorsWithTheFix) {
  std::string output;
  ASSERT_EQ(test::run_command(test::binary_path() + " plan -m tiny -b 2 -s 64 --gpu h200 --json 2>/dev/null", &output), 0)
      << output;
  const nlohmann::json plan = nlohmann::json::parse(output);
  EXPECT_EQ(plan["kind"], "plan");
  EXPECT_EQ(plan["model"], "tiny");
  EXPECT_TRUE(plan["fits_with_headroom"].get<bool>());
  EXPECT_GT(plan["memory"]["peak_live_bytes"].get<double>(), 0);
  EXPECT_GT(plan["tokens_per_s"].get<double>(), 0);

  EXPECT_NE(test::run_command(test::binary_path() + " plan -m tiny --gpu a100", &output), 0);
  EXPECT_NE(output.find("unknown GPU 'a100'"), std::string::npos) << output;
  EXPECT_NE(output.find("fix:"), std::string::npos) << output;
  EXPECT_NE(test::run_command(test::binary_path() + " plan -m tiny --summary", &output), 0);
  EXPECT_NE(output.find("--recommend"), std::string::npos) << output;
  EXPECT_NE(test::run_command(test::binary_path() + " plan -m tiny --gpus 12 --nodes 5", &output), 0);
  EXPECT_NE(output.find("fix:"), std::string::npos) << output;
  EXPECT_NE(test::run_command(test::binary_path() + " plan -m tiny --recommend --objective gpus", &output), 0);
  EXPECT_NE(output.find("--target-tokens-per-s"), std::string::npos) << output;
}

}  // namespace
}  // namespace mxtrain
