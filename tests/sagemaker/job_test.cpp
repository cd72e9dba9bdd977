// `mxtrain train` as a SageMaker container runs it, in a temporary directory laid out like
// /opt/ml (MXTRAIN_SAGEMAKER_ROOT): hyperparameters.json with the seed's names, a train channel
// of raw text. A spot interruption (SIGTERM) saves a checkpoint in the job's checkpoint
// directory and exits 0 without an export; the restarted job resumes there, and its losses equal
// an uninterrupted job's bit for bit; at the end the model directory holds the Hugging Face
// export and the output data directory the metrics. A bad hyperparameter writes the failure file
// and exits non-zero.
#include <gtest/gtest.h>

#include <csignal>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "distributed/process_helpers.hpp"
#include "support/test_support.hpp"

namespace mxtrain {
namespace {

namespace fs = std::filesystem;

// The seed's hyperparameter names for a model small enough for CI, as SageMaker writes them
// (every value a string).
nlohmann::json small_job_hyperparameters(int steps) {
  return {{"model", "tiny"},         {"precision", "fp32"},        {"device", "cpu"},
          {"num-layers", "2"},       {"hidden-size", "64"},        {"num-heads", "2"},
          {"num-kv-heads", "1"},     {"ffn-hidden-size", "128"},   {"batch-size", "4"},
          {"global-batch-size", "8"}, {"seq-length", "32"},        {"steps", std::to_string(steps)},
          {"warmup-steps", "2"},     {"schedule.decay", "constant"}, {"train-threads", "1"},
          {"eval.every", "0"},       {"eval-batches", "1"},        {"checkpoint.every", "2"},
          {"sagemaker_region", "\"us-west-2\""}};
}

class SageMakerJob : public ::testing::Test {
 protected:
  void SetUp() override { corpus_ = test::make_test_corpus(dir_.file("corpus")); }

  // A fresh /opt/ml: the config folder with `hyperparameters`, a train channel of two documents
  // files (text and JSON lines), empty model and output folders as SageMaker makes them.
  std::string make_root(const std::string& name, const nlohmann::json& hyperparameters) const {
    const std::string root = dir_.file(name);
    fs::create_directories(root + "/input/config");
    fs::create_directories(root + "/input/data/train");
    fs::create_directories(root + "/model");
    fs::create_directories(root + "/output");
    std::ofstream(root + "/input/config/hyperparameters.json") << hyperparameters.dump();
    fs::copy_file(corpus_ + "/corpus.txt", root + "/input/data/train/part-0.txt");
    std::ofstream lines(root + "/input/data/train/part-1.jsonl");
    std::ifstream text(corpus_ + "/corpus.txt");
    std::string line;
    for (int i = 0; i < 200 && std::getline(text, line); ++i) lines << nlohmann::json{{"text", line}}.dump() << "\n";
    return root;
  }
  static std::string train(const std::string& root, const std::string& arguments = "") {
    return "MXTRAIN_SAGEMAKER_ROOT=" + root + " " + test::binary_path() + " train" + arguments;
  }

  test::TempDir dir_;
  std::string corpus_;
};

TEST_F(SageMakerJob, SpotInterruptionResumesExactlyAndTheEndExportsTheModel) {
  const int steps = 8;
  const std::string job = make_root("job", small_job_hyperparameters(steps));
  const std::string run = job + "/checkpoints";
  // Interrupted while the step-2 checkpoint is written: the job finishes it, trains one more
  // step, saves again and exits 0, as within SageMaker's two minutes.
  test::BackgroundProcess interrupted(test::binary_path() + " train", dir_.file("interrupted.txt"),
                                      {{"MXTRAIN_SAGEMAKER_ROOT", job}, {"MXT_TEST_CHECKPOINT_PAUSE", "2:3"}});
  ASSERT_TRUE(test::wait_until([&] { return interrupted.output().find("pausing") != std::string::npos ||
                                            interrupted.wait(0).has_value(); }, 120))
      << interrupted.output();
  ASSERT_FALSE(interrupted.wait(0).has_value()) << interrupted.output();
  interrupted.signal(SIGTERM);
  const std::optional<int> status = interrupted.wait(100);
  ASSERT_TRUE(status.has_value()) << interrupted.output();
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << interrupted.output();
  EXPECT_NE(interrupted.output().find("signal 15 received: saving a checkpoint at step 3"), std::string::npos)
      << interrupted.output();
  EXPECT_NE(interrupted.output().find("stopped at step 3 of 8: no model export"), std::string::npos)
      << interrupted.output();
  EXPECT_NE(interrupted.output().find("SageMaker's own hyperparameters, not used by mxtrain: sagemaker_region"),
            std::string::npos) << interrupted.output();
  EXPECT_TRUE(fs::is_empty(job + "/model"));
  EXPECT_FALSE(fs::exists(job + "/output/failure"));
  ASSERT_EQ(test::step_losses(run).size(), 3u);
  EXPECT_TRUE(fs::exists(job + "/prepared/train/train_000000.bin"));

  // What an export cut short would leave in the model directory: the next attempt removes it.
  fs::create_directories(job + "/model/mxtrain-export");
  std::ofstream(job + "/model/mxtrain-export/config.json") << "{";
  std::string output;
  ASSERT_EQ(test::run_command(train(job), &output), 0) << output;  // the restarted job
  EXPECT_NE(output.find("resumed from " + run + "/checkpoints/step_00000003 at step 3"), std::string::npos) << output;
  const std::string reference = make_root("reference", small_job_hyperparameters(steps));
  ASSERT_EQ(test::run_command(train(reference), &output), 0) << output;
  test::expect_same_losses(run, reference + "/checkpoints", steps);

  // The job's outputs: the export, and the metrics as the run directory has them.
  for (const char* file : {"config.json", "generation_config.json", "model.safetensors"})
    EXPECT_TRUE(fs::is_regular_file(job + "/model/" + file)) << file;
  EXPECT_FALSE(fs::exists(job + "/model/mxtrain-export"));
  const nlohmann::json config = nlohmann::json::parse(test::read_file(job + "/model/config.json"));
  EXPECT_EQ(config["num_hidden_layers"], 2);
  EXPECT_EQ(config["hidden_size"], 64);
  EXPECT_EQ(test::read_file(job + "/output/data/metrics.jsonl"), test::read_file(run + "/metrics.jsonl"));
  EXPECT_EQ(test::read_file(job + "/output/data/config.toml"), test::read_file(run + "/config.toml"));
  EXPECT_FALSE(fs::is_empty(job + "/output/data/tensorboard"));
  EXPECT_FALSE(fs::exists(job + "/output/failure"));
}

TEST_F(SageMakerJob, ABadHyperparameterWritesTheFailureFileAndExitsNonZero) {
  nlohmann::json hyperparameters = small_job_hyperparameters(4);
  hyperparameters["num-layer"] = "2";
  const std::string job = make_root("bad-name", hyperparameters);
  std::string output;
  EXPECT_EQ(test::run_command(train(job), &output), 2) << output;
  const std::string failure = test::read_file(job + "/output/failure");
  EXPECT_NE(failure.find("unknown hyperparameter 'num-layer'"), std::string::npos) << failure;
  EXPECT_NE(failure.find("num-layers"), std::string::npos) << failure;  // the accepted names
  EXPECT_NE(output.find("unknown hyperparameter 'num-layer'"), std::string::npos) << output;
  EXPECT_FALSE(fs::exists(job + "/checkpoints"));

  hyperparameters = small_job_hyperparameters(4);
  hyperparameters["precision"] = "fp7";
  const std::string bad_value = make_root("bad-value", hyperparameters);
  EXPECT_NE(test::run_command(train(bad_value), &output), 0) << output;
  EXPECT_NE(test::read_file(bad_value + "/output/failure").find("hyperparameter precision"), std::string::npos);
}

TEST_F(SageMakerJob, ArgumentsEnvironmentAndChannelsOfShards) {
  // Script mode's `--name value`, SM_HP_* and a train channel of shards with their held-out part.
  const std::string job = make_root("shards", small_job_hyperparameters(4));
  fs::remove_all(job + "/input/data/train");
  fs::create_directories(job + "/input/data/train");
  for (const char* shard : {"train_000000.bin", "val_000000.bin"})
    fs::copy_file(corpus_ + "/" + shard, job + "/input/data/train/" + shard);
  std::string output;
  ASSERT_EQ(test::run_command("env SM_HP_SEQ-LENGTH=48 " + train(job, " --print-config --num-layers 3 --steps=5"), &output),
            0)
      << output;
  EXPECT_NE(output.find("layers = 3\n"), std::string::npos) << output;
  EXPECT_NE(output.find("steps = 5\n"), std::string::npos) << output;
  EXPECT_NE(output.find("seq_len = 48\n"), std::string::npos) << output;
  EXPECT_NE(output.find("train = \"" + job + "/input/data/train/train_*.bin\""), std::string::npos) << output;
  EXPECT_NE(output.find("val = \"" + job + "/input/data/train/val_*.bin\""), std::string::npos) << output;
  EXPECT_NE(output.find("dir = \"" + job + "/checkpoints\""), std::string::npos) << output;

  // A validation channel of documents is prepared whole as the held-out set.
  fs::create_directories(job + "/input/data/validation");
  fs::copy_file(corpus_ + "/corpus.txt", job + "/input/data/validation/heldout.txt");
  ASSERT_EQ(test::run_command(train(job, " --print-config"), &output), 0) << output;
  EXPECT_NE(output.find("val = \"" + job + "/prepared/validation/*.bin\""), std::string::npos) << output;

  // Outside a job, `--name value` is an unknown option; --sagemaker without a job layout fails.
  EXPECT_NE(test::run_command(test::binary_path() + " train --num-layers 3 --print-config", &output), 0);
  EXPECT_NE(output.find("'--num-layers'"), std::string::npos) << output;
  EXPECT_NE(test::run_command("SM_INPUT_CONFIG_DIR=" + dir_.file("nowhere") + " " + test::binary_path() +
                                  " train --sagemaker --print-config",
                              &output),
            0);
  EXPECT_NE(output.find("no SageMaker input config directory"), std::string::npos) << output;
}

// Continued training of a Hugging Face model whose directory carries its tokenizer, on a train
// channel of documents without one: the documents are tokenized with the model's tokenizer (the
// byte tokenizer would feed the model bytes as its ids); a channel's own tokenizer or the
// `tokenizer` hyperparameter still wins.
TEST_F(SageMakerJob, AnInitFromModelsTokenizerIsTheDefault) {
  const std::string model = dir_.file("model");
  fs::copy(test::source_dir() + "/tests/reference/hf/llama_gqa_tied", model);
  nlohmann::json hyperparameters = {{"init-from", model}, {"device", "cpu"}, {"steps", "1"}, {"seq-length", "32"},
                                    {"batch-size", "2"},  {"global-batch-size", "2"}};
  const std::string job = make_root("init-from", hyperparameters);
  std::string output;
  ASSERT_EQ(test::run_command(train(job, " --print-config"), &output), 0) << output;
  EXPECT_NE(output.find("tokenizer = \"byte\""), std::string::npos) << output;  // the model has no tokenizer
  fs::copy_file(test::source_dir() + "/tests/fuzz/corpus/tokenizer/bpe300.json", model + "/tokenizer.json");
  ASSERT_EQ(test::run_command(train(job, " --print-config"), &output), 0) << output;
  EXPECT_NE(output.find("tokenizer = \"" + model + "\""), std::string::npos) << output;
  ASSERT_EQ(test::run_command(train(job, " --print-config --tokenizer byte"), &output), 0) << output;
  EXPECT_NE(output.find("tokenizer = \"byte\""), std::string::npos) << output;
  // The channel's own tokenizer wins over the model's; of a tokenizer.model and a tokenizer.json
  // beside it, the JSON, whichever the directory listing gives first.
  const std::string channel = job + "/input/data/train/";
  std::ofstream(channel + "tokenizer.model") << "a sentencepiece model";
  fs::copy_file(model + "/tokenizer.json", channel + "tokenizer.json");
  ASSERT_EQ(test::run_command(train(job, " --print-config"), &output), 0) << output;
  EXPECT_NE(output.find("tokenizer = \"" + channel + "tokenizer.json\""), std::string::npos) << output;
}

// JSON lines whose text is in another field than "text" (a code corpus's "content"): the job
// stops naming the line's string fields and the text-field hyperparameter; with it (or TRL's
// dataset_text_field) and val-fraction, the channel is prepared and trains.
TEST_F(SageMakerJob, TheTextFieldAndValFractionHyperparametersPrepareTheChannel) {
  nlohmann::json hyperparameters = small_job_hyperparameters(2);
  const std::string job = make_root("content", hyperparameters);
  const std::string channel = job + "/input/data/train/";
  fs::remove(channel + "part-0.txt");
  fs::remove(channel + "part-1.jsonl");
  {
    std::ofstream lines(channel + "code.jsonl");
    std::ifstream text(corpus_ + "/corpus.txt");
    std::string line;
    for (int i = 0; std::getline(text, line); ++i) lines << nlohmann::json{{"content", line}, {"id", i}}.dump() << "\n";
  }
  std::string output;
  EXPECT_NE(test::run_command(train(job), &output), 0) << output;
  const std::string failure = test::read_file(job + "/output/failure");
  EXPECT_NE(failure.find("has no field \"text\"; its string fields: \"content\""), std::string::npos) << failure;
  EXPECT_NE(failure.find("text-field hyperparameter"), std::string::npos) << failure;

  for (const char* name : {"text-field", "dataset_text_field"}) {
    hyperparameters = small_job_hyperparameters(2);
    hyperparameters[name] = "content";
    hyperparameters["val-fraction"] = "0.25";
    std::ofstream(job + "/input/config/hyperparameters.json") << hyperparameters.dump();
    fs::remove(job + "/output/failure");
    for (const char* folder : {"/checkpoints", "/model", "/output/data"}) fs::remove_all(job + folder);
    fs::create_directories(job + "/model");
    ASSERT_EQ(test::run_command(train(job), &output), 0) << name << ":\n" << output;
    EXPECT_NE(output.find("(.jsonl field 'content'; 1 block in 4 held out)"), std::string::npos) << output;
    EXPECT_TRUE(fs::exists(job + "/prepared/train/val_000000.bin")) << output;
  }
  hyperparameters["val-fraction"] = "0.6";
  std::ofstream(job + "/input/config/hyperparameters.json") << hyperparameters.dump();
  EXPECT_NE(test::run_command(train(job), &output), 0) << output;
  const std::string bad = test::read_file(job + "/output/failure");
  EXPECT_NE(bad.find("hyperparameter val-fraction='0.6' (from " + job + "/input/config/hyperparameters.json) is not "
                     "a fraction in (0, 0.5]"),
            std::string::npos)
      << bad;
}

// inputdataconfig.json says how SageMaker delivers each channel: a Pipe channel (a stream, no
// files) is refused, and so is a ShardedByS3Key one on several hosts (each host would hold other
// files); FullyReplicated, or ShardedByS3Key on one host, trains.
TEST_F(SageMakerJob, APipeOrShardedChannelIsRefusedWithTheFix) {
  const std::string job = make_root("modes", small_job_hyperparameters(2));
  const std::string config = job + "/input/config/";
  auto write_modes = [&](const std::string& mode, const std::string& distribution) {
    std::ofstream(config + "inputdataconfig.json")
        << nlohmann::json{{"train", {{"TrainingInputMode", mode}, {"S3DistributionType", distribution},
                                     {"RecordWrapperType", "None"}}}}
               .dump();
  };
  std::string output;
  write_modes("Pipe", "FullyReplicated");
  EXPECT_NE(test::run_command(train(job, " --print-config"), &output), 0) << output;
  std::string failure = test::read_file(job + "/output/failure");
  EXPECT_NE(failure.find("channel 'train' is in Pipe input mode"), std::string::npos) << failure;
  EXPECT_NE(failure.find("input_mode='File'"), std::string::npos) << failure;

  write_modes("File", "ShardedByS3Key");  // one host: every file is here
  ASSERT_EQ(test::run_command(train(job, " --print-config"), &output), 0) << output;
  std::ofstream(config + "resourceconfig.json")
      << R"({"current_host": "algo-1", "hosts": ["algo-1", "algo-2"], "network_interface_name": "eth0"})";
  fs::remove(job + "/output/failure");
  EXPECT_NE(test::run_command(train(job, " --print-config"), &output), 0) << output;
  failure = test::read_file(job + "/output/failure");
  EXPECT_NE(failure.find("channel 'train' is ShardedByS3Key over 2 hosts"), std::string::npos) << failure;
  EXPECT_NE(failure.find("distribution='FullyReplicated'"), std::string::npos) << failure;

  write_modes("File", "FullyReplicated");
  ASSERT_EQ(test::run_command(train(job, " --print-config"), &output), 0) << output;
  std::ofstream(config + "inputdataconfig.json") << "{damaged";
  ASSERT_EQ(test::run_command(train(job, " --print-config"), &output), 0) << output;
  EXPECT_NE(output.find("inputdataconfig.json (SageMaker's channel configuration)"), std::string::npos) << output;
}

TEST_F(SageMakerJob, AMissingTrainChannelIsReportedWithTheFix) {
  const std::string job = make_root("no-train", small_job_hyperparameters(4));
  fs::remove_all(job + "/input/data/train");
  std::string output;
  EXPECT_NE(test::run_command(train(job), &output), 0);
  const std::string failure = test::read_file(job + "/output/failure");
  EXPECT_NE(failure.find("the job has no 'train' channel"), std::string::npos) << failure;
  EXPECT_NE(failure.find("fix:"), std::string::npos) << failure;
}

}  // namespace
}  // namespace mxtrain
