// SageMaker hyperparameters → config overrides (sagemaker/hyperparameters.hpp): the three ways
// they arrive, every config key in its dotted and dashed spellings, the seed's names, the names
// that choose inputs, and the errors for unknown names and bad values.
#include <gtest/gtest.h>

#include <regex>
#include <set>
#include <sstream>

#include "mxtrain/config/loader.hpp"
#include "mxtrain/config/run_config.hpp"
#include "mxtrain/core/error.hpp"
#include "mxtrain/sagemaker/hyperparameters.hpp"
#include "support/test_support.hpp"

namespace mxtrain::sagemaker {
namespace {

std::string value_of(const HyperparameterSettings& settings, const std::string& key) {
  std::string value = "<unset>";
  for (const auto& [set_key, set_value] : settings.overrides)
    if (set_key == key) value = set_value;
  return value;
}

std::string error_of(const std::function<void()>& call) {
  try {
    call();
  } catch (const Error& error) {
    return error.full_message();
  }
  return "";
}

TEST(Hyperparameters, TheSeedsNamesMapOntoConfigKeys) {
  const HyperparameterSettings settings = parse_hyperparameters(
      R"({"model": "llama-1b", "precision": "bf16", "num-layers": "4", "batch-size": "8", "seq-length": "2048",
          "steps": "100", "lr": "3e-4", "global-batch-size": "64"})");
  EXPECT_EQ(value_of(settings, "model.preset"), "llama-1b");
  EXPECT_EQ(value_of(settings, "train.precision"), "bf16");
  EXPECT_EQ(value_of(settings, "model.layers"), "4");
  EXPECT_EQ(value_of(settings, "train.micro_batch_size"), "8");
  EXPECT_EQ(value_of(settings, "train.seq_len"), "2048");
  EXPECT_EQ(value_of(settings, "train.steps"), "100");
  EXPECT_EQ(value_of(settings, "optimizer.lr"), "3e-4");
  EXPECT_EQ(value_of(settings, "train.global_batch_size"), "64");
  // The overrides load: the preset first, so num-layers changes llama-1b's depth.
  ConfigSources sources;
  sources.read_environment = false;
  sources.overrides = settings.overrides;
  const RunConfig config = load_config(sources);
  EXPECT_EQ(config.model.layers, 4);
  EXPECT_EQ(config.model.hidden, 2048);
  EXPECT_EQ(config.train.micro_batch_size, 8);
}

TEST(Hyperparameters, EveryConfigKeyIsAcceptedDottedDashedAndUpperCase) {
  RunConfig defaults;
  for (const Field& field : fields(defaults)) {
    std::string dashed = field.key, upper;
    for (char& c : dashed) c = c == '.' || c == '_' ? '-' : c;
    for (char c : field.key) upper += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    for (const std::string& name : {field.key, dashed, upper}) {
      const HyperparameterSettings settings = map_hyperparameters({{name, field.get(), "test"}});
      ASSERT_EQ(settings.overrides.size(), 1u) << name;
      EXPECT_EQ(settings.overrides[0].first, field.key) << name;
    }
  }
}

TEST(Hyperparameters, NoTwoNamesCollide) {
  // A seed name must not be the spelling of a config key (it would shadow it), and two aliases
  // must not normalise to the same name.
  RunConfig defaults;
  std::set<std::string> names;
  auto normal = [](std::string name) {
    for (char& c : name) c = c == '-' || c == '.' ? '_' : static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return name;
  };
  for (const Field& field : fields(defaults)) EXPECT_TRUE(names.insert(normal(field.key)).second) << field.key;
  for (const HyperparameterAlias& alias : hyperparameter_aliases()) {
    EXPECT_TRUE(names.insert(normal(alias.name)).second) << alias.name;
    bool real_key = false;
    for (const Field& field : fields(defaults)) real_key = real_key || field.key == alias.key;
    EXPECT_TRUE(real_key) << alias.name << " -> " << alias.key;
  }
}

TEST(Hyperparameters, JsonEncodedStringsAndPythonBooleansAreDecoded) {
  // Framework estimators json.dumps every value; generic ones str() it (Python's True).
  const HyperparameterSettings settings =
      parse_hyperparameters(R"({"precision": "\"bf16\"", "log.tensorboard": "False", "steps": 12, "train.tf32": true})");
  EXPECT_EQ(value_of(settings, "train.precision"), "bf16");
  EXPECT_EQ(value_of(settings, "log.tensorboard"), "False");
  EXPECT_EQ(value_of(settings, "train.steps"), "12");
  EXPECT_EQ(value_of(settings, "train.tf32"), "true");
}

TEST(Hyperparameters, InputNamesAndSageMakersOwnNames) {
  const HyperparameterSettings settings = parse_hyperparameters(
      R"({"config": "/opt/ml/input/data/config/run.toml", "train-channel": "corpus", "validation_channel": "heldout",
          "sagemaker_region": "\"us-west-2\"", "sagemaker_job_name": "\"j\""})");
  EXPECT_EQ(settings.config_file, "/opt/ml/input/data/config/run.toml");
  EXPECT_EQ(settings.train_channel, "corpus");
  EXPECT_EQ(settings.validation_channel, "heldout");
  EXPECT_EQ(settings.ignored, (std::vector<std::string>{"sagemaker_job_name", "sagemaker_region"}));  // name order
  EXPECT_TRUE(settings.overrides.empty());
  EXPECT_NE(error_of([] { parse_hyperparameters(R"({"train-channel": "../etc"})"); }).find("not a channel name"),
            std::string::npos);
  // How a documents channel is prepared: the .jsonl text field (TRL's name too) and the held-out share.
  EXPECT_EQ(settings.text_field, "text");
  EXPECT_EQ(settings.val_fraction, 0.05);
  HyperparameterSettings preparation = parse_hyperparameters(R"({"text-field": "content", "val_fraction": "0.1"})");
  EXPECT_EQ(preparation.text_field, "content");
  EXPECT_EQ(preparation.val_fraction, 0.1);
  EXPECT_TRUE(preparation.overrides.empty());
  EXPECT_EQ(parse_hyperparameters(R"({"dataset_text_field": "body"})").text_field, "body");
  for (const char* bad : {"0", "0.51", "-0.1", "nan", "0.1x", ""})
    EXPECT_NE(error_of([&] { parse_hyperparameters(std::string(R"({"val-fraction": ")") + bad + "\"}"); })
                  .find("is not a fraction in (0, 0.5]"),
              std::string::npos)
        << bad;
  EXPECT_NE(error_of([] { parse_hyperparameters(R"({"text-field": ""})"); }).find("is empty"), std::string::npos);
}

TEST(Hyperparameters, UnknownNamesListTheAcceptedOnes) {
  const std::string message = error_of([] { parse_hyperparameters(R"({"num-layer": "4"})"); });
  EXPECT_NE(message.find("unknown hyperparameter 'num-layer' (from hyperparameters.json)"), std::string::npos)
      << message;
  for (const std::string& name : {"num-layers", "batch-size", "seq-length", "precision", "train-channel", "train.steps"})
    EXPECT_NE(message.find(name), std::string::npos) << name << " missing from: " << message;
  // The likely name first, written as the docs write it: an alias, a config key, an input name.
  EXPECT_NE(message.find("did you mean 'num-layers'?"), std::string::npos) << message;
  std::string other = error_of([] { parse_hyperparameters(R"({"train-stpes": "4"})"); });
  EXPECT_NE(other.find("did you mean 'train.steps'?"), std::string::npos) << other;
  other = error_of([] { parse_hyperparameters(R"({"train-chanel": "x"})"); });
  EXPECT_NE(other.find("did you mean 'train-channel'?"), std::string::npos) << other;
  other = error_of([] { parse_hyperparameters(R"({"wandb-project": "x"})"); });
  EXPECT_EQ(other.find("did you mean"), std::string::npos) << other;
}

TEST(Hyperparameters, BadValuesNameTheHyperparameterAndTheKey) {
  const std::string message = error_of([] { parse_hyperparameters(R"({"batch-size": "eight"})"); });
  EXPECT_NE(message.find("hyperparameter batch-size (from hyperparameters.json)"), std::string::npos) << message;
  EXPECT_NE(message.find("train.micro_batch_size"), std::string::npos) << message;
  EXPECT_NE(message.find("fix:"), std::string::npos) << message;
  EXPECT_NE(error_of([] { parse_hyperparameters(R"({"precision": "fp7"})"); }).find("one of: auto, fp32"),
            std::string::npos);
  // The preset is applied before the model keys, whatever the order in the file.
  EXPECT_EQ(error_of([] { parse_hyperparameters(R"({"num-layers": "3", "model": "gpt2-124m"})"); }), "");
}

TEST(Hyperparameters, MalformedFilesAreConfigErrors) {
  for (const char* text : {"", "[1, 2]", "{\"steps\": ", "{\"steps\": [1]}", "{\"steps\": null}", "\"text\""}) {
    const std::string message = error_of([&] { parse_hyperparameters(text); });
    EXPECT_NE(message, "") << text;
    EXPECT_NE(message.find("fix:"), std::string::npos) << text << ": " << message;
  }
}

TEST(Hyperparameters, EnvironmentAndArguments) {
  const std::vector<Hyperparameter> environment = hyperparameters_from_environment(
      {"PATH=/usr/bin", "SM_HP_NUM-LAYERS=6", "SM_HPS={\"num-layers\":\"6\"}", "SM_HP_PRECISION=fp8", "SM_HP_=x"});
  ASSERT_EQ(environment.size(), 2u);
  EXPECT_EQ(environment[0].name, "num-layers");
  EXPECT_EQ(environment[0].origin, "SM_HP_NUM-LAYERS");
  EXPECT_EQ(value_of(map_hyperparameters(environment), "train.precision"), "fp8");

  const std::vector<Hyperparameter> arguments =
      hyperparameters_from_arguments({"--num-layers", "6", "--seq-length=512", "--train.steps", "9"});
  const HyperparameterSettings settings = map_hyperparameters(arguments);
  EXPECT_EQ(value_of(settings, "model.layers"), "6");
  EXPECT_EQ(value_of(settings, "train.seq_len"), "512");
  EXPECT_EQ(value_of(settings, "train.steps"), "9");
  EXPECT_NE(error_of([] { hyperparameters_from_arguments({"--steps"}); }).find("has no value"), std::string::npos);
  EXPECT_NE(error_of([] { hyperparameters_from_arguments({"run.toml"}); }).find("unexpected argument"),
            std::string::npos);
}

TEST(Hyperparameters, LaterSourcesWin) {
  std::vector<Hyperparameter> all = parse_hyperparameters_json(R"({"steps": "10"})", "hyperparameters.json");
  for (const Hyperparameter& h : hyperparameters_from_arguments({"--steps", "20"})) all.push_back(h);
  ConfigSources sources;
  sources.read_environment = false;
  sources.overrides = map_hyperparameters(all).overrides;
  EXPECT_EQ(load_config(sources).train.steps, 20);
}

TEST(Hyperparameters, DamagedInputGivesConfigErrorsOnly) {
  // What a fuzzer of parse_hyperparameters() checks, as a fixed sample: byte flips, cuts and
  // insertions of a real file end in settings or in an Error, never another exception.
  const std::string valid =
      R"({"model": "llama-1b", "precision": "bf16", "num-layers": "4", "batch-size": "8", "recompute": "2",)"
      R"( "lr": "3e-4", "log.tensorboard": "True", "train-channel": "corpus", "config": "run.toml"})";
  uint64_t state = 0x9E3779B97F4A7C15ull;
  auto next = [&state] {
    state ^= state << 13, state ^= state >> 7, state ^= state << 17;
    return state;
  };
  int parsed = 0, refused = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    std::string text = valid;
    for (int edit = 0, edits = 1 + static_cast<int>(next() % 4); edit < edits && !text.empty(); ++edit) {
      const size_t at = next() % text.size();
      switch (next() % 3) {
        case 0: text[at] = static_cast<char>(next() & 0xff); break;
        case 1: text.erase(at, 1 + next() % 8); break;
        default: text.insert(at, std::string(1, "\"{}[],:0123456789e.-\\u"[next() % 22])); break;
      }
    }
    try {
      parse_hyperparameters(text);
      ++parsed;
    } catch (const Error&) {
      ++refused;
    } catch (const std::exception& other) {
      FAIL() << "not an mxtrain::Error for input " << text << ": " << other.what();
    }
  }
  EXPECT_GT(parsed, 0);
  EXPECT_GT(refused, 0);
}

TEST(Hyperparameters, TheDocsTableIsTheAliasTable) {
  // docs/sagemaker.md prints the seed's names as a table: the same rows, in the same order.
  std::istringstream docs(test::read_file(test::source_dir() + "/docs/sagemaker.md"));
  const std::regex row(R"(^\| `([a-z-]+)` \| `([a-z_.]+)` \|)");
  std::vector<std::pair<std::string, std::string>> documented, actual;
  std::string line;
  std::smatch match;
  while (std::getline(docs, line))
    if (std::regex_search(line, match, row)) documented.emplace_back(match[1], match[2]);
  for (const HyperparameterAlias& alias : hyperparameter_aliases()) actual.emplace_back(alias.name, alias.key);
  EXPECT_EQ(documented, actual) << "update the table in docs/sagemaker.md with hyperparameter_aliases()";
}

}  // namespace
}  // namespace mxtrain::sagemaker
