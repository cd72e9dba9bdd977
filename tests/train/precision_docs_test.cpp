// docs/precision.md is checked against the binary (docs/conventions.md #15): every config key and
// precision name it uses is real; every command in its ```sh blocks uses flags its subcommand has
// and --set values the keys accept; and every `mxtrain train` and `mxtrain bench` example runs as
// `mxtrain plan` of the same config on an H200 (the config loads, validates and its step runs on
// the dryrun backend, in well under a second). The examples themselves need a GPU and minutes,
// so they are not run here; nor are the compare-precision examples (hundreds of training steps),
// whose flags and values the second test checks.
#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <regex>
#include <set>
#include <sstream>

#include "mxtrain/config/run_config.hpp"
#include "mxtrain/core/error.hpp"
#include "mxtrain/train/precision.hpp"
#include "support/test_support.hpp"

namespace mxtrain {
namespace {

std::string read_doc() {
  std::ifstream in(test::source_dir() + "/docs/precision.md");
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

TEST(PrecisionGuide, KeysAndNamesExist) {
  const std::string doc = read_doc();
  ASSERT_FALSE(doc.empty());
  RunConfig config;
  std::set<std::string> keys;
  for (const Field& field : fields(config)) keys.insert(field.key);
  const std::regex key_pattern(R"(\b(train|precision)\.[a-z_0-9]+\b)");
  int checked = 0;
  for (auto it = std::sregex_iterator(doc.begin(), doc.end(), key_pattern); it != std::sregex_iterator(); ++it) {
    if (it->str() == "train.seed" || it->str() == "train.tf32") continue;
    EXPECT_TRUE(keys.count(it->str())) << it->str() << " in docs/precision.md is not a config key";
    ++checked;
  }
  EXPECT_GT(checked, 15);
  // Every precision name is documented in the table.
  for (const std::string& name : precision_names()) EXPECT_NE(doc.find("| `" + name + "` |"), std::string::npos) << name;
}

TEST(PrecisionGuide, CommandsUseRealFlagsAndValues) {
  std::istringstream in(read_doc());
  bool inside = false;
  int commands = 0;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("```", 0) == 0) {
      inside = !inside && line == "```sh";
      continue;
    }
    if (!inside || line.rfind("mxtrain ", 0) != 0) continue;
    std::istringstream words_in(line);
    const std::vector<std::string> words{std::istream_iterator<std::string>(words_in),
                                         std::istream_iterator<std::string>()};
    std::string help;
    test::run_command(test::binary_path() + " " + words[1] + " --help", &help);
    ASSERT_NE(help.find("--help-config"), std::string::npos) << "no subcommand " << words[1];
    ++commands;
    for (size_t i = 2; i < words.size(); ++i) {
      if (words[i][0] != '-') continue;
      EXPECT_NE(help.find(words[i]), std::string::npos) << words[1] << " has no " << words[i];
      const std::string value = i + 1 < words.size() ? words[i + 1] : "";
      RunConfig config;
      for (Field& field : fields(config)) {
        if (words[i] == "--set" && field.key == value.substr(0, value.find('=')))
          EXPECT_NO_THROW(field.set(value.substr(value.find('=') + 1))) << line;
        if (words[i] == "-p" && field.key == "train.precision") EXPECT_NO_THROW(field.set(value)) << line;
      }
    }
  }
  EXPECT_GE(commands, 7);
}

TEST(PrecisionGuide, TrainAndBenchExamplesPlan) {
  std::istringstream in(read_doc());
  bool inside = false;
  int planned = 0;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("```", 0) == 0) {
      inside = !inside && line == "```sh";
      continue;
    }
    if (!inside) continue;
    std::string rest;
    if (line.rfind("mxtrain train ", 0) == 0) rest = line.substr(14);
    else if (line.rfind("mxtrain bench ", 0) == 0) rest = line.substr(14);
    else continue;
    std::string output;  // from the repository root, as the page's paths are written
    EXPECT_EQ(test::run_command("cd '" + test::source_dir() + "' && " + test::binary_path() + " plan " + rest +
                                    " --gpu h200",
                                &output),
              0)
        << line << "\n" << output;
    ++planned;
  }
  EXPECT_GE(planned, 5);
}

}  // namespace
}  // namespace mxtrain
