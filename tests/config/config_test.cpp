// Config: one field list for TOML, environment, --set and the printed config; errors name the
// key and the allowed values.
#include <gtest/gtest.h>

#include <cstdlib>
#include <nlohmann/json.hpp>

#include "mxtrain/config/loader.hpp"
#include "mxtrain/core/error.hpp"

namespace mxtrain {
namespace {

RunConfig load(const std::string& toml, std::vector<std::pair<std::string, std::string>> overrides = {}) {
  ConfigSources sources;
  sources.toml_text = toml;
  sources.overrides = std::move(overrides);
  sources.read_environment = false;
  return load_config(sources);
}

std::string error_of(const std::function<void()>& action) {
  try {
    action();
  } catch (const Error& error) {
    return error.full_message();
  }
  return "";
}

TEST(Config, DefaultsAreTheEmbeddedTinyRun) {
  RunConfig config = load("");
  EXPECT_EQ(config.model.preset, "tiny");
  EXPECT_EQ(config.model.vocab_size, 256);
  EXPECT_EQ(config.train.seq_len, 256);
  EXPECT_EQ(config.data.train, "data/fortunes/train_*.bin");
}

TEST(Config, TomlSetsKeysAndPresetAppliesFirst) {
  // model.hidden appears before model.preset in the file: the preset must not undo it.
  RunConfig config = load("[model]\nhidden = 1536\npreset = \"gpt2-124m\"\n[train]\nmicro_batch_size = 4\nseq_len = 64\n"
                          "tf32 = true\n[optimizer]\nlr = 3e-4\n");
  EXPECT_EQ(config.model.family, ModelFamily::gpt2);
  EXPECT_EQ(config.model.hidden, 1536);
  EXPECT_EQ(config.model.layers, 12);
  EXPECT_EQ(config.train.micro_batch_size, 4);
  EXPECT_TRUE(config.train.tf32);
  EXPECT_DOUBLE_EQ(config.optimizer.lr, 3e-4);
}

// A vocabulary size alone brings its padded rows (rounded up to 64); an explicit padded_vocab,
// from any source, is kept (and a too-small one is still an error).
TEST(Config, AVocabularySizeAloneBringsItsPaddedRows) {
  EXPECT_EQ(load("", {{"model.vocab_size", "300"}}).model.padded_vocab, 320);
  EXPECT_EQ(load("[model]\npreset = \"llama-1b\"\n", {{"model.vocab_size", "128256"}}).model.padded_vocab, 128256);
  EXPECT_EQ(load("[model]\npadded_vocab = 512\n", {{"model.vocab_size", "300"}}).model.padded_vocab, 512);
  EXPECT_EQ(load("").model.padded_vocab, 256);  // the preset's own rows
  EXPECT_NE(error_of([] { load("", {{"model.vocab_size", "300"}, {"model.padded_vocab", "256"}}); })
                .find("model.padded_vocab = 256 is smaller than model.vocab_size = 300"),
            std::string::npos);
}

TEST(Config, CommandLineOverridesFileAndEnvironmentOverridesFile) {
  ::setenv("MXTRAIN_TRAIN_STEPS", "77", 1);
  ConfigSources sources;
  sources.toml_text = "[train]\nsteps = 10\nseq_len = 32\n";
  sources.overrides = {{"train.seq_len", "48"}};
  RunConfig config = load_config(sources);
  ::unsetenv("MXTRAIN_TRAIN_STEPS");
  EXPECT_EQ(config.train.steps, 77);   // environment beats the file
  EXPECT_EQ(config.train.seq_len, 48); // command line beats the file
  sources.overrides = {{"train.steps", "5"}};
  ::setenv("MXTRAIN_TRAIN_STEPS", "77", 1);
  config = load_config(sources);
  ::unsetenv("MXTRAIN_TRAIN_STEPS");
  EXPECT_EQ(config.train.steps, 5);    // command line beats the environment
}

TEST(Config, UnknownKeyNamesTheKeyAndTheKnownOnes) {
  std::string message = error_of([] { load("[train]\nbatch = 4\n"); });
  EXPECT_NE(message.find("unknown config key 'train.batch'"), std::string::npos) << message;
  EXPECT_NE(message.find("train.micro_batch_size"), std::string::npos) << message;
  message = error_of([] { load("", {{"modle.hidden", "3"}}); });
  EXPECT_NE(message.find("'modle.hidden'"), std::string::npos) << message;
  // A misspelt section or field: the nearest known key is offered; a key like none is not.
  EXPECT_NE(message.find("did you mean 'model.hidden'?"), std::string::npos) << message;
  message = error_of([] { load("[trian]\nsteps = 3\n"); });
  EXPECT_NE(message.find("did you mean 'train.steps'?"), std::string::npos) << message;
  message = error_of([] { load("", {{"train.precison", "bf16"}}); });
  EXPECT_NE(message.find("did you mean 'train.precision'?"), std::string::npos) << message;
  message = error_of([] { load("", {{"train.micro_batch", "4"}}); });  // cut short: the one key it begins
  EXPECT_NE(message.find("did you mean 'train.micro_batch_size'?"), std::string::npos) << message;
  message = error_of([] { load("", {{"train.batch", "4"}}); });
  EXPECT_EQ(message.find("did you mean"), std::string::npos) << message;
  message = error_of([] { load("", {{"data.path", "x"}}); });  // three edits from data.val: no guess
  EXPECT_EQ(message.find("did you mean"), std::string::npos) << message;
  message = error_of([] { load("", {{"x.y", "1"}}); });
  EXPECT_EQ(message.find("did you mean"), std::string::npos) << message;
}

TEST(Config, BadValuesNameTheKeyAndTheAllowedValues) {
  std::string message = error_of([] { load("", {{"train.precision", "fp7"}}); });
  EXPECT_NE(message.find("train.precision"), std::string::npos) << message;
  EXPECT_NE(message.find("bf16"), std::string::npos) << message;
  message = error_of([] { load("", {{"train.steps", "ten"}}); });
  EXPECT_NE(message.find("train.steps expects an integer"), std::string::npos) << message;
  message = error_of([] { load("", {{"train.steps", "0"}}); });
  EXPECT_NE(message.find("train.steps"), std::string::npos) << message;
  message = error_of([] { load("", {{"train.recompute", "most"}}); });
  EXPECT_NE(message.find("none, selective, full"), std::string::npos) << message;
  message = error_of([] { load("", {{"model.preset", "llama-2b"}}); });
  EXPECT_NE(message.find("llama-1b"), std::string::npos) << message;
  message = error_of([] { load("[model]\nheads = 5\n"); });
  EXPECT_NE(message.find("model.heads"), std::string::npos) << message;
  message = error_of([] { load("[train]\nsteps = \"many\"\n"); });
  EXPECT_NE(message.find("train.steps"), std::string::npos) << message;
}

TEST(Config, TomlSyntaxErrorNamesTheLine) {
  std::string message = error_of([] { load("[train]\nsteps = = 3\n"); });
  EXPECT_NE(message.find(":2:"), std::string::npos) << message;
}

TEST(Config, UnknownEnvironmentVariableIsAnError) {
  ::setenv("MXTRAIN_TRAIN_STEPZ", "3", 1);
  ConfigSources sources;
  std::string message = error_of([&] { load_config(sources); });
  ::unsetenv("MXTRAIN_TRAIN_STEPZ");
  EXPECT_NE(message.find("MXTRAIN_TRAIN_STEPZ"), std::string::npos) << message;
}

TEST(Config, CrossFieldRulesNameBothKeys) {
  std::string message = error_of([] { load("", {{"train.micro_batch_size", "3"}, {"train.global_batch_size", "8"}}); });
  EXPECT_NE(message.find("train.global_batch_size"), std::string::npos) << message;
  EXPECT_NE(message.find("train.micro_batch_size"), std::string::npos) << message;
  message = error_of([] { load("", {{"model.preset", "tiny-gpt2"}, {"train.seq_len", "4096"}}); });
  EXPECT_NE(message.find("model.max_seq_len"), std::string::npos) << message;
}

TEST(Config, PrintedTomlLoadsBackToTheSameConfig) {
  RunConfig original = load("", {{"model.preset", "llama-1b"}, {"train.recompute", "3"}, {"optimizer.lr", "0.00025"},
                                 {"data.val", ""}, {"checkpoint.dir", "runs/x \"quoted\""}});
  std::string toml = config_to_toml(original);
  RunConfig reloaded = load(toml);
  EXPECT_TRUE(config_differences(original, reloaded).empty()) << toml;
  RunConfig from_json = config_from_json(config_to_json(original));
  EXPECT_TRUE(config_differences(original, from_json).empty());
}

TEST(Config, EnvironmentNames) {
  EXPECT_EQ(environment_name("train.micro_batch_size"), "MXTRAIN_TRAIN_MICRO_BATCH_SIZE");
  EXPECT_EQ(parse_assignment("a.b=c=d").second, "c=d");
  EXPECT_THROW(parse_assignment("nothing"), Error);
}

}  // namespace
}  // namespace mxtrain
