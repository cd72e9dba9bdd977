// docs/reliability.md is checked, not trusted: every test it names as proof of a guarantee exists
// (a TEST or TEST_F of that suite and name under tests/), and every config key it names is a real
// key.
#include <gtest/gtest.h>

#include <filesystem>
#include <regex>
#include <set>

#include "mxtrain/config/run_config.hpp"
#include "support/test_support.hpp"

namespace mxtrain {
namespace {

TEST(ReliabilityGuide, EveryNamedTestExists) {
  const std::string doc = test::read_file(test::source_dir() + "/docs/reliability.md");
  ASSERT_FALSE(doc.empty());
  std::string sources;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(test::source_dir() + "/tests"))
    if (entry.path().extension() == ".cpp") sources += test::read_file(entry.path().string());
  const std::regex named(R"(`([A-Z][A-Za-z]+)\.([A-Z][A-Za-z]+)`)");
  int checked = 0;
  for (auto it = std::sregex_iterator(doc.begin(), doc.end(), named); it != std::sregex_iterator(); ++it) {
    const std::string suite = (*it)[1], name = (*it)[2];
    const std::regex definition("TEST(_F)?\\(" + suite + ",\\s*" + name + "\\)");
    EXPECT_TRUE(std::regex_search(sources, definition)) << suite << "." << name << " is named in docs/reliability.md "
                                                        << "but no such test exists";
    ++checked;
  }
  EXPECT_GT(checked, 15);
}

TEST(ReliabilityGuide, EveryNamedConfigKeyExists) {
  const std::string doc = test::read_file(test::source_dir() + "/docs/reliability.md");
  RunConfig config;
  std::set<std::string> keys;
  for (const Field& field : fields(config)) keys.insert(field.key);
  const std::regex key(R"(\b(model|data|train|optimizer|schedule|eval|log|checkpoint|dist|precision)\.[a-z_]+\b)");
  int checked = 0;
  for (auto it = std::sregex_iterator(doc.begin(), doc.end(), key); it != std::sregex_iterator(); ++it) {
    if (it->position() > 0 && doc[static_cast<size_t>(it->position()) - 1] == '/') continue;  // a file path
    EXPECT_TRUE(keys.count(it->str())) << it->str() << " in docs/reliability.md is not a config key";
    ++checked;
  }
  EXPECT_GE(checked, 5);
}

}  // namespace
}  // namespace mxtrain
