// Bounded inputs: every number a config takes has a range (one place: the field table), values
// outside it are refused naming the key and the range, the documented config reference equals
// the table, and the parameter count of huge (but in-range) shapes is exact or an error, never
// a wrapped number.
#include <gtest/gtest.h>

#include <cstdlib>
#include <limits>

#include "mxtrain/cli/flags.hpp"
#include "mxtrain/config/loader.hpp"
#include "mxtrain/config/run_config.hpp"
#include "mxtrain/core/error.hpp"
#include "mxtrain/core/files.hpp"
#include "mxtrain/plan/memory_check.hpp"
#include "support/test_support.hpp"

namespace mxtrain {
namespace {

RunConfig load_with(const std::string& key, const std::string& value) {
  ConfigSources sources;
  sources.read_environment = false;
  sources.overrides.emplace_back(key, value);
  return load_config(sources);
}

std::string error_of(const std::string& key, const std::string& value) {
  try {
    load_with(key, value);
  } catch (const Error& error) {
    return error.full_message();
  }
  return "";
}

TEST(ConfigBounds, EveryNumberHasARange) {
  RunConfig config;
  for (const Field& field : fields(config)) {
    const bool number = field.type == FieldType::integer || field.type == FieldType::real;
    if (number) EXPECT_FALSE(field.range.empty()) << field.key;
    if (field.type == FieldType::boolean || field.type == FieldType::choice) EXPECT_TRUE(field.range.empty()) << field.key;
  }
}

TEST(ConfigBounds, ValuesAboveTheRangeAreRefusedNamingKeyAndRange) {
  for (const auto& [key, value] : std::vector<std::pair<std::string, std::string>>{
           {"model.layers", "100000000"},
           {"model.ffn_hidden", "4000000000000000"},
           {"model.vocab_size", "9223372036854775807"},
           {"model.hidden", "1000000000"},
           {"train.global_batch_size", "4000000000000000"},
           {"train.micro_batch_size", "100000000"},
           {"train.seq_len", "1000000000"},
           {"train.steps", "9223372036854775807"}}) {
    const std::string message = error_of(key, value);
    EXPECT_NE(message.find("bad value '" + value + "' for " + key), std::string::npos) << key << ": " << message;
    EXPECT_NE(message.find(" to "), std::string::npos) << message;
  }
  EXPECT_NE(error_of("model.layers", "1025").find("an integer from 1 to 1,024"), std::string::npos);
  EXPECT_EQ(load_with("model.layers", "1024").model.layers, 1024);
  EXPECT_NE(error_of("optimizer.grad_clip", "1e300").find("optimizer.grad_clip"), std::string::npos);
  EXPECT_NE(error_of("precision.bf16_first_layers", "5000").find("auto, or 0 to 1,024"), std::string::npos);
}

TEST(ConfigBounds, ParameterCountOfTheLargestShapeIsExact) {
  // Every size key at its maximum: the count fits in 64 bits, and is the closed form.
  RunConfig config;
  for (Field& field : fields(config)) {
    if (field.key == "model.hidden") field.set("131072");
    if (field.key == "model.ffn_hidden") field.set("1048576");
    if (field.key == "model.layers") field.set("1024");
    if (field.key == "model.vocab_size" || field.key == "model.padded_vocab") field.set("16777216");
  }
  const ModelConfig& m = config.model;  // tiny: llama, untied, 4 heads, 2 KV heads
  const __int128 hidden = m.hidden, ffn = m.ffn_hidden, qkv = (m.heads + 2 * m.kv_heads) * (m.hidden / m.heads);
  const __int128 expected = 1024 * (hidden * qkv + hidden * hidden + hidden * 2 * ffn + ffn * hidden + 2 * hidden) +
                            2 * __int128{16777216} * hidden + hidden;
  EXPECT_EQ(static_cast<__int128>(m.parameter_count()), expected);
}

TEST(ConfigBounds, OverflowingShapeIsAConfigErrorNotAWrongCount) {
  // A shape beyond the table's ranges (as a Hugging Face config.json could give): the count would
  // wrap int64; it must be an error naming the overflow, not a number.
  ModelConfig m;
  m.hidden = int64_t{1} << 20;
  m.heads = m.kv_heads = 1 << 10;
  m.ffn_hidden = int64_t{1} << 40;
  try {
    const int64_t count = m.parameter_count();
    FAIL() << "no error; count " << count;
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::config);
    EXPECT_NE(std::string(error.what()).find("parameter count overflows"), std::string::npos) << error.what();
  }
  EXPECT_THROW(m.validate(), Error);
}

TEST(ConfigBounds, DocumentedReferenceEqualsTheFieldTable) {
  // docs/config-reference.md holds the table between two markers; regenerate it with
  // MXTRAIN_UPDATE_DOCS=1 build/cpu/mxtrain_tests --gtest_filter=ConfigBounds.DocumentedReference*
  const std::string path = test::source_dir() + "/docs/config-reference.md";
  std::string doc = test::read_file(path);
  ASSERT_FALSE(doc.empty()) << path;
  const std::string begin = "<!-- config-table -->\n", end = "<!-- /config-table -->";
  const size_t from = doc.find(begin), to = doc.find(end);
  ASSERT_TRUE(from != std::string::npos && to != std::string::npos && from < to) << "markers missing in " << path;
  const std::string expected = cli::config_reference_markdown();
  const std::string actual = doc.substr(from + begin.size(), to - from - begin.size());
  if (actual != expected && std::getenv("MXTRAIN_UPDATE_DOCS")) {
    doc.replace(from + begin.size(), to - from - begin.size(), expected);
    write_file_atomically(path, doc);
    return;
  }
  EXPECT_EQ(actual, expected) << "docs/config-reference.md is out of date: run the test with MXTRAIN_UPDATE_DOCS=1";
}

TEST(MemoryCheck, RefusesARunTheHostCannotHold) {
  RunConfig config = load_with("train.precision", "fp32");
  const HostMemoryNeed need = cpu_training_memory_need(config, 1, 1);
  // tiny: ~3.1M parameters, masters + gradients + two Adam states alone are ~50 MB.
  EXPECT_GT(need.per_rank_bytes, uint64_t{40} << 20);
  EXPECT_EQ(cpu_training_memory_need(config, 2, 2).total_bytes, 2 * cpu_training_memory_need(config, 2, 2).per_rank_bytes);
  EXPECT_NO_THROW(check_cpu_training_memory(config, 1, 1, need.per_rank_bytes));
  try {
    check_cpu_training_memory(config, 1, 1, need.per_rank_bytes - 1);
    FAIL() << "no error";
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::out_of_memory);
    EXPECT_NE(std::string(error.what()).find("of host memory"), std::string::npos) << error.what();
    EXPECT_NE(error.advice().find("mxtrain plan"), std::string::npos);
  }
}

}  // namespace
}  // namespace mxtrain
