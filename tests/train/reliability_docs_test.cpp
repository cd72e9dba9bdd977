// docs/reliability.md is checked, not trusted: every test it names as proof of a guarantee exists
// (a TEST or TEST_F of that suite and name under tests/, or an add_test of a CMakeLists.txt under
// tests/ for a name written "ctest `NAME`"), and every config key it names is a real key.
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

// Whether CMake text holds add_test(NAME name ...) for exactly this name.
bool adds_test(const std::string& lists, const std::string& name) {
  const std::string call = "add_test(NAME " + name;
  for (size_t at = lists.find(call); at != std::string::npos; at = lists.find(call, at + 1)) {
    const char next = at + call.size() < lists.size() ? lists[at + call.size()] : ')';
    if (next == ' ' || next == '\n' || next == ')') return true;
  }
  return false;
}

TEST(ReliabilityGuide, EveryNamedCtestExists) {
  const std::string doc = test::read_file(test::source_dir() + "/docs/reliability.md");
  std::string lists;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(test::source_dir() + "/tests"))
    if (entry.path().filename() == "CMakeLists.txt") lists += test::read_file(entry.path().string());
  const std::regex named(R"(ctest `([A-Za-z0-9_.]+)`)");
  int checked = 0;
  for (auto it = std::sregex_iterator(doc.begin(), doc.end(), named); it != std::sregex_iterator(); ++it) {
    const std::string name = (*it)[1];
    EXPECT_TRUE(adds_test(lists, name))
        << "ctest " << name << " is named in docs/reliability.md but no CMakeLists.txt under tests/ adds it";
    ++checked;
  }
  EXPECT_GE(checked, 1);
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
