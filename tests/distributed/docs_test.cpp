// docs/distributed.md is checked, not run (docs/conventions.md #15): every config key it names is
// a real key, every `--set key=value` in its commands is accepted, and every flag its `mxtrain
// launch` and `mxtrain train` commands use is in that subcommand's --help. The commands
// themselves need several GPUs or nodes, a scheduler, or the reader's own run.toml, so none is
// executed here.
#include <gtest/gtest.h>

#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include "mxtrain/config/run_config.hpp"
#include "mxtrain/core/error.hpp"
#include "support/test_support.hpp"

namespace mxtrain {
namespace {

std::string read_doc() {
  std::ifstream in(test::source_dir() + "/docs/distributed.md");
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// Lines of the ```sh blocks, without comments.
std::vector<std::string> shell_lines(const std::string& doc) {
  std::vector<std::string> lines;
  std::istringstream in(doc);
  bool inside = false;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("```", 0) == 0) {
      inside = !inside && line == "```sh";
      continue;
    }
    if (inside && !line.empty() && line[0] != '#') lines.push_back(line);
  }
  return lines;
}

std::string help_of(const std::string& subcommand) {
  std::string output;
  test::run_command(test::binary_path() + " " + subcommand + " --help", &output);
  return output;
}

TEST(DistributedGuide, ConfigKeysExist) {
  const std::string doc = read_doc();
  ASSERT_FALSE(doc.empty());
  RunConfig config;
  std::set<std::string> keys;
  for (const Field& field : fields(config)) keys.insert(field.key);
  std::regex key_pattern(R"(\b(model|data|train|optimizer|schedule|eval|log|checkpoint|dist)\.[a-z_]+\b)");
  int checked = 0;
  for (auto it = std::sregex_iterator(doc.begin(), doc.end(), key_pattern); it != std::sregex_iterator(); ++it) {
    EXPECT_TRUE(keys.count(it->str())) << it->str() << " in docs/distributed.md is not a config key";
    ++checked;
  }
  EXPECT_GT(checked, 8);
}

TEST(DistributedGuide, CommandsUseRealFlagsAndValues) {
  const std::vector<std::string> lines = shell_lines(read_doc());
  ASSERT_GT(lines.size(), 8u);
  const std::string launch_help = help_of("launch"), train_help = help_of("train");
  int commands = 0;
  for (const std::string& line : lines) {
    std::istringstream words_in(line);
    std::vector<std::string> words{std::istream_iterator<std::string>(words_in), std::istream_iterator<std::string>()};
    std::string subcommand;  // the mxtrain subcommand the current words belong to
    for (size_t i = 0; i < words.size(); ++i) {
      const std::string& word = words[i];
      if ((word == "launch" || word == "train") && i > 0 && (words[i - 1] == "mxtrain" || words[i - 1] == "--")) {
        subcommand = word;
        ++commands;
        continue;
      }
      if (word == "--" && subcommand == "launch") {
        subcommand.clear();  // the launched command follows
        continue;
      }
      if (subcommand.empty() || word.size() < 2 || word[0] != '-') continue;
      const std::string flag = word.substr(0, word.find('='));
      const std::string& help = subcommand == "launch" ? launch_help : train_help;
      EXPECT_NE(help.find(flag), std::string::npos) << "`mxtrain " << subcommand << "` has no " << flag << ": " << line;
      if (flag == "--set" && i + 1 < words.size()) {
        const std::string assignment = words[i + 1];
        RunConfig config;
        bool found = false;
        for (Field& field : fields(config)) {
          if (field.key != assignment.substr(0, assignment.find('='))) continue;
          found = true;
          EXPECT_NO_THROW(field.set(assignment.substr(assignment.find('=') + 1))) << assignment;
        }
        EXPECT_TRUE(found) << assignment << ": " << line;
      }
      if (flag == "--strategy" && i + 1 < words.size()) {
        RunConfig config;
        for (Field& field : fields(config))
          if (field.key == "dist.strategy") EXPECT_NO_THROW(field.set(words[i + 1])) << line;
      }
    }
  }
  EXPECT_GT(commands, 8);
}

}  // namespace
}  // namespace mxtrain
