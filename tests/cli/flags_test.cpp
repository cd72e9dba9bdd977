// The command-line tables: no duplicate flag names, every flag maps to a real config key, and
// the set of flags equals the committed list (a new flag is a reviewed change of that file).
#include <gtest/gtest.h>

#include <fstream>
#include <set>
#include <sstream>

#include "mxtrain/cli/flags.hpp"
#include "mxtrain/config/run_config.hpp"
#include "support/test_support.hpp"

namespace mxtrain {
namespace {

TEST(Flags, UniqueNamesAndRealKeys) {
  RunConfig config;
  std::set<std::string> keys;
  for (const Field& field : fields(config)) EXPECT_TRUE(keys.insert(field.key).second) << "duplicate " << field.key;
  std::set<std::string> names;
  for (const cli::FlagSpec& flag : cli::train_flags()) {
    EXPECT_TRUE(keys.count(flag.key)) << flag.names << " -> " << flag.key;
    std::stringstream parts(flag.names);
    std::string name;
    while (std::getline(parts, name, ',')) EXPECT_TRUE(names.insert(name).second) << "duplicate flag " << name;
  }
}

TEST(Flags, MatchTheCommittedList) {
  std::ifstream in(test::source_dir() + "/tests/cli/train_flags.txt");
  ASSERT_TRUE(in) << "tests/cli/train_flags.txt missing";
  std::set<std::string> committed;
  std::string line;
  while (std::getline(in, line))
    if (!line.empty() && line[0] != '#') committed.insert(line);
  std::set<std::string> actual;
  for (const cli::FlagSpec& flag : cli::train_flags()) actual.insert(flag.names + " " + flag.key);
  EXPECT_EQ(committed, actual) << "update tests/cli/train_flags.txt in the same commit as the flag change";
}

TEST(Flags, HelpConfigListsEveryKey) {
  std::string reference = cli::config_reference();
  RunConfig config;
  for (const Field& field : fields(config)) EXPECT_NE(reference.find(field.key), std::string::npos) << field.key;
}

TEST(Flags, CommandLineErrorsExitNonZeroWithTheOptionNamed) {
  std::string output;
  EXPECT_NE(test::run_command(test::binary_path() + " train --stepz 3", &output), 0);
  EXPECT_NE(output.find("--stepz"), std::string::npos) << output;
  EXPECT_NE(test::run_command(test::binary_path() + " train --set train.precision=fp7 --print-config", &output), 0);
  EXPECT_NE(output.find("train.precision"), std::string::npos) << output;
  EXPECT_NE(output.find("fix:"), std::string::npos) << output;
  EXPECT_EQ(test::run_command(test::binary_path() + " train -m llama-1b -b 2 --print-config", &output), 0);
  EXPECT_NE(output.find("preset = \"llama-1b\""), std::string::npos) << output;
  EXPECT_NE(output.find("micro_batch_size = 2"), std::string::npos) << output;
}

}  // namespace
}  // namespace mxtrain
