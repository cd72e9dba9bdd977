#include "mxtrain/train/trainer.hpp"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <optional>

#include <nlohmann/json.hpp>

#include "mxtrain/backend/backend.hpp"
#include "mxtrain/build_info.hpp"
#include "mxtrain/config/loader.hpp"
#include "mxtrain/core/error.hpp"
#include "mxtrain/core/files.hpp"
#include "mxtrain/core/log.hpp"
#include "mxtrain/data/corpus_meta.hpp"
#include "mxtrain/data/loader.hpp"
#include "mxtrain/data/tokenizer.hpp"
#include "mxtrain/distributed/communicator.hpp"
#include "mxtrain/distributed/communicator_factory.hpp"
#include "mxtrain/hw/gpu_catalog.hpp"
#include "mxtrain/report/run_report.hpp"
#include "mxtrain/report/tensorboard.hpp"
#include "mxtrain/train/checkpoint.hpp"
#include "mxtrain/train/checkpoint_policy.hpp"
#include "mxtrain/train/generate.hpp"
#include "mxtrain/train/metrics.hpp"
#include "mxtrain/train/rank_group.hpp"
#include "mxtrain/train/resume.hpp"
#include "mxtrain/train/run_lock.hpp"
#include "mxtrain/train/schedule.hpp"
#include "mxtrain/train/session.hpp"
#include "mxtrain/train/stop_signal.hpp"

namespace fs = std::filesystem;

namespace mxtrain {

std::string run_directory(const RunConfig& config) {
  return config.checkpoint.dir.empty() ? "runs/" + config.model.preset : config.checkpoint.dir;
}

Trainer::Trainer(RunConfig config, TrainerContext context) : config_(std::move(config)), context_(std::move(context)) {}

namespace {

using Clock = std::chrono::steady_clock;

// The precision state a checkpoint's manifest keeps (CheckpointMeta::extra), and back: fp16's
// loss scale, NVFP4's stochastic-rounding streams. Keys a checkpoint lacks keep the fresh values.
nlohmann::json resume_values_to_json(const PrecisionResumeValues& values) {
  nlohmann::json extra = nlohmann::json::object();
  if (values.loss_scale > 0) {
    extra["loss_scale"] = values.loss_scale;
    extra["loss_scale_clean_steps"] = values.loss_scale_clean_steps;
  }
  if (values.rounding_streams > 0) extra["rounding_streams"] = values.rounding_streams;
  return extra;
}

PrecisionResumeValues resume_values_from(const nlohmann::json& extra) {
  PrecisionResumeValues values;
  // (Integers as integers: a float out of int64's range would not convert.)
  const auto number = [&](const char* key) { return extra.contains(key) && extra[key].is_number(); };
  const auto integer = [&](const char* key) { return extra.contains(key) && extra[key].is_number_integer(); };
  if (number("loss_scale") && integer("loss_scale_clean_steps")) {
    values.loss_scale = extra["loss_scale"].get<double>();
    values.loss_scale_clean_steps = extra["loss_scale_clean_steps"].get<int64_t>();
  }
  if (extra.contains("rounding_streams") && extra["rounding_streams"].is_number_unsigned())
    values.rounding_streams = extra["rounding_streams"].get<uint64_t>();
  return values;
}

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Who this rank is: the environment, unless a given communicator says otherwise.
runtime::RankEnvironment rank_environment(const TrainerContext& context) {
  runtime::RankEnvironment environment = context.environment;
  if (context.communicator) {
    environment.rank = context.communicator->rank();
    environment.world_size = context.communicator->size();
    if (environment.source == runtime::EnvironmentSource::single) {  // one node: local = global
      environment.local_rank = environment.rank;
      environment.local_world_size = environment.world_size;
    }
  }
  return environment;
}

// Printed by every rank (the logger keeps info lines to rank 0): who is who in a multi-rank run.
void announce_rank(const runtime::RankEnvironment& environment, const std::string& device, int device_index) {
  std::printf("[rank %d] %s; device %s%s\n", environment.rank, environment.describe().c_str(), device.c_str(),
              device == "cuda" ? strf(":%d", device_index).c_str() : "");
  std::fflush(stdout);
}

// How the global batch splits: `accumulation` micro-batches of `micro` sequences a step on each
// of the ranks.
struct BatchGeometry {
  int64_t micro = 0, global = 0, accumulation = 0, global_tokens = 0;
};

BatchGeometry batch_geometry(const RunConfig& config, int world) {
  BatchGeometry batch;
  batch.micro = config.train.micro_batch_size;
  batch.global = config.train.global_batch(world);
  if (batch.global % (batch.micro * world) != 0)
    throw Error(ErrorKind::config,
                strf("train.global_batch_size = %lld is not a multiple of micro_batch_size x ranks = %lld x %d",
                     static_cast<long long>(batch.global), static_cast<long long>(batch.micro), world),
                "choose a global batch that every rank can split into whole micro-batches");
  batch.accumulation = batch.global / (batch.micro * world);
  batch.global_tokens = batch.global * config.train.seq_len;
  return batch;
}

// The start-up lines: build, device, model, precision, batch.
void log_start(const RunConfig& c, const std::string& device, const DeviceProperties& props,
               const PrecisionPlan& precision, const BatchGeometry& batch, int world) {
  log::info(strf("mxtrain %s (commit %s) | %s | %s", MXTRAIN_VERSION, MXTRAIN_GIT_COMMIT, device.c_str(),
                 props.name.c_str()));
  log::info(strf("model %s: %s family, %s parameters, hidden %lld, %lld layers, %lld heads (%lld KV), FFN %lld, vocab %lld",
                 c.model.preset.c_str(), family_name(c.model.family),
                 log::with_commas(static_cast<double>(c.model.parameter_count())).c_str(),
                 static_cast<long long>(c.model.hidden), static_cast<long long>(c.model.layers),
                 static_cast<long long>(c.model.heads), static_cast<long long>(c.model.kv_heads),
                 static_cast<long long>(c.model.ffn_hidden), static_cast<long long>(c.model.vocab_size)));
  log::info(precision.startup_line);
  if (device == "cuda") log::info(kernels_startup_line(c, props.compute_capability));
  log::info(strf("batch: %lld sequences x %lld tokens = %s tokens per step (micro-batch %lld, %lld accumulation "
                 "steps, %d ranks); recompute %s",
                 static_cast<long long>(batch.global), static_cast<long long>(c.train.seq_len),
                 log::with_commas(static_cast<double>(batch.global_tokens)).c_str(), static_cast<long long>(batch.micro),
                 static_cast<long long>(batch.accumulation), world, c.train.recompute.c_str()));
}

// TrainerContext::prepare_data on local rank 0 of each node, the others waiting in the
// reduction that also tells every rank whether it worked (the data may be local to each node).
void prepare_data_on_each_node(const std::function<void()>& prepare, const runtime::RankEnvironment& environment,
                               const RankGroup& ranks) {
  std::optional<Error> failure;
  if (environment.local_rank == 0) {
    try {
      prepare();
    } catch (const Error& error) {
      failure = error;
    }
  }
  if (ranks.all(!failure.has_value())) return;
  if (failure) throw *failure;
  throw Error(ErrorKind::data, "preparing the training data failed on another node's local rank 0",
              "read that rank's log (its error says what was wrong with the data)");
}

std::string create_run_directory(const RunConfig& config) {
  const std::string run_dir = run_directory(config);
  std::error_code fs_error;
  fs::create_directories(run_dir, fs_error);
  if (fs_error)
    throw Error(ErrorKind::system, "cannot create run directory " + run_dir + ": " + fs_error.message(),
                "set checkpoint.dir (-o) to a writable directory");
  return run_dir;
}

// One rank's run: what it trains with (device, world, data, session, checkpoints, metrics) and
// the parts of the loop that use them. Trainer::run is the loop that calls them in order.
class TrainingRun {
 public:
  TrainingRun(RunConfig& config, const TrainerContext& context, const runtime::RankEnvironment& environment);

  const RankGroup& ranks() const { return ranks_; }
  // Resumes from the run directory's checkpoint (or not) and opens the run's outputs; returns
  // the last step done.
  int64_t start();
  // One optimizer step on the next global batch, with its metrics line and record.
  void train_step(int64_t step);
  // The held-out loss (logged, and recorded unless `record` is false); -1 without a validation set.
  double evaluate(int64_t step, bool record = true);
  void save(int64_t step);
  // Text the model generates from log.sample_prompt (every rank computes it, as FSDP needs;
  // rank 0 prints it and records it in metrics.jsonl).
  void sample(int64_t step);
  // A stop signal reached some rank, or a rank could not write its outputs: save and report
  // (collective); after an output failure, throws it once the checkpoint is saved.
  TrainerSummary stop(int64_t step);
  // This rank could not write its metrics or TensorBoard file (a full disk): the loop stops at
  // the end of this step with a checkpoint.
  bool output_failed() const { return output_failure_.has_value(); }
  // After the last step: the held-out loss, the final checkpoint and the summary.
  TrainerSummary finish(int64_t step);
  // The run ends with an error at `step`: recorded and reported (rank 0) before it propagates.
  void fail(int64_t step, const std::string& message);

 private:
  void open_data(const std::string& source_dir);
  // Loads data.tokenizer (samples decode with it, the export copies it) and checks it against the
  // shards' meta.json and the model's vocabulary, so a wrong one fails at start-up, not hours in.
  void open_tokenizer();
  void lock_run_directory();
  // Runs a write of the run's outputs; a failure is kept for stop() instead of ending the step.
  template <typename Write>
  void checked_output(Write&& write);
  void write_plan(const TrainerContext& context);
  void record_start();
  // RUN_DIR/report.html (rank 0); a failure is logged, never thrown: the checkpoint is what counts.
  void write_report();
  void report(int64_t step, const StepResult& result, double lr, double seconds);
  void open_tensorboard();
  void write_tensorboard(const StepMetrics& metrics);
  TrainerSummary summary(int64_t step) const;

  RunConfig& config_;  // not const: config_to_toml and config_to_json walk non-const field tables
  int rank_ = 0, world_ = 1;
  std::string device_;
  DeviceProperties properties_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Communicator> owned_world_;  // outlives the session's store, which uses it
  RankGroup ranks_{nullptr};
  PrecisionPlan precision_;
  BatchGeometry batch_;
  std::string run_dir_, effective_config_;
  RunDirectoryLock lock_;  // rank 0: held until the run object dies
  std::optional<Error> output_failure_;
  std::optional<data::TrainLoader> loader_;
  std::optional<data::ValidationReader> validation_;
  std::unique_ptr<data::Tokenizer> tokenizer_;
  std::unique_ptr<TrainingSession> session_;
  std::optional<CheckpointStore> checkpoints_;
  MetricsFile metrics_;
  TensorBoardWriter tensorboard_;  // open on rank 0 with log.tensorboard
  double peak_flops_ = 0, flops_per_token_ = 0;
  int64_t start_step_ = 0, tokens_seen_ = 0;
  bool final_val_loss_recorded_ = false;  // rank 0: metrics.jsonl has a held-out loss at start_step_
  double timed_seconds_ = 0;  // steps after the first of this process, for the mean throughput
  std::optional<Clock::time_point> first_step_started_;  // this process's first step: elapsed time
  int64_t timed_steps_ = 0;
  double final_loss_ = 0;
  std::string last_checkpoint_;
};

TrainingRun::TrainingRun(RunConfig& config, const TrainerContext& context,
                         const runtime::RankEnvironment& environment)
    : config_(config), rank_(environment.rank), world_(environment.world_size) {
  device_ = resolve_device(config_.train.device);
  BackendOptions options = backend_options(config_);
  if (device_ == "cuda") options.device_index = runtime::local_device_index(environment, visible_gpu_count());
  if (world_ > 1) announce_rank(environment, device_, options.device_index);
  backend_ = create_backend(device_, options);
  Communicator* world = context.communicator;
  if (!world) {
    const std::string kind = resolve_communicator_kind(config_.dist.backend, device_, world_);
    if (kind != "single") {
      owned_world_ = create_world_communicator(kind, environment, *backend_);
      world = owned_world_.get();
    }
  }
  ranks_ = RankGroup(world);
  precision_ = resolve_precision(config_, *backend_);
  batch_ = batch_geometry(config_, world_);
  properties_ = backend_->properties();
  const DeviceProperties& props = properties_;
  log_start(config_, device_, props, precision_, batch_, world_);
  run_dir_ = create_run_directory(config_);
  lock_run_directory();
  effective_config_ = config_to_toml(config_);
  log::info("effective config:\n" + effective_config_);
  if (context.prepare_data) prepare_data_on_each_node(context.prepare_data, environment, ranks_);
  open_data(context.source_dir);
  open_tokenizer();

  session_ = std::make_unique<TrainingSession>(
      config_, *backend_, precision_,
      make_parameter_store(*backend_, config_, precision_, world, environment.local_world_size));
  session_->all_reduce_sum = [this](double value) { return ranks_.sum(value); };
  const std::string description = session_->params().describe();
  if (!description.empty()) log::info(description);
  checkpoints_.emplace(run_dir_, rank_, world_, ranks_.barrier());
  checkpoints_->set_ranks(ranks_);
  checkpoints_->check_writable();
  if (validation_ && config_.eval.batches == 0) log::info("eval.batches = 0: no held-out evaluation");
  const GpuSpec* gpu = device_ == "cuda" ? find_gpu(props.name) : nullptr;
  peak_flops_ = gpu ? peak_flops(*gpu, mfu_dtype(precision_)) : 0.0;
  flops_per_token_ = config_.model.training_flops_per_token(config_.train.seq_len);
  if (rank_ == 0) write_plan(context);
}

void TrainingRun::write_plan(const TrainerContext& context) {
  if (!context.predict) return;
  const GpuSpec* gpu = device_ == "cuda" ? find_gpu(properties_.name) : nullptr;
  RunConfig planned = config_;
  planned.train.precision = precision_.name;
  nlohmann::json plan;
  try {
    plan = context.predict(planned, gpu ? gpu->key : "", world_);
  } catch (const std::exception& error) {
    const Error* known = dynamic_cast<const Error*>(&error);
    const std::string reason = known ? known->full_message() : error.what();
    log::warn("no plan for the run report: " + reason);
    plan = {{"error", reason}};
  }
  plan["run_device"] = properties_.name;
  plan["comparable"] = gpu != nullptr && plan.value("gpu", std::string()) == gpu->key;
  try {
    write_file_atomically(run_dir_ + "/plan.json", plan.dump(1) + "\n",
                          "set checkpoint.dir (-o) to a writable directory with free space");
  } catch (const Error& error) {
    log::warn("cannot write the plan for the run report: " + error.full_message());
  }
}

void TrainingRun::record_start() {
  const std::time_t now = std::time(nullptr);
  char started[32];
  std::strftime(started, sizeof started, "%Y-%m-%d %H:%M:%S", std::gmtime(&now));
  metrics_.write({{"step", start_step_},
                  {"event", "start"},
                  {"started_utc", started},
                  {"device", device_},
                  {"device_name", properties_.name},
                  {"device_memory_bytes", properties_.memory_bytes},
                  {"world_size", world_},
                  {"precision", precision_.name},
                  {"precision_detail", precision_.startup_line},
                  {"recompute", config_.train.recompute},
                  {"strategy", session_->params().strategy_name()},
                  {"model", config_.model.preset},
                  {"parameters", log::with_commas(static_cast<double>(config_.model.parameter_count()))},
                  {"batch", strf("%lld sequences x %lld tokens (micro-batch %lld, %lld accumulation steps)",
                                 static_cast<long long>(batch_.global), static_cast<long long>(config_.train.seq_len),
                                 static_cast<long long>(batch_.micro), static_cast<long long>(batch_.accumulation))},
                  {"commit", MXTRAIN_GIT_COMMIT},
                  {"mxtrain_version", MXTRAIN_VERSION},
                  {"resumed_from", start_step_ > 0 ? strf("the checkpoint of step %lld", static_cast<long long>(start_step_))
                                                   : std::string()}});
}

void TrainingRun::write_report() {
  if (rank_ != 0) return;
  try {
    RunReportInputs inputs;
    inputs.run_dir = run_dir_;
    inputs.metrics_path = metrics_.path();
    log::info("report:     " + write_run_report(inputs));
  } catch (const std::exception& error) {
    const Error* known = dynamic_cast<const Error*>(&error);
    log::warn("could not write the run report (the run and its checkpoint are unaffected; `mxtrain report " +
              run_dir_ + "` retries): " + (known ? known->full_message() : std::string(error.what())));
  }
}

// One run per directory: rank 0 holds the lock for the run's life; every rank learns whether it
// got it before anything is written.
void TrainingRun::lock_run_directory() {
  std::optional<Error> refused;
  if (rank_ == 0) {
    try {
      lock_ = RunDirectoryLock(run_dir_);
    } catch (const Error& error) {
      refused = error;
    }
  }
  if (!ranks_.all(!refused)) {
    if (refused) throw *refused;
    throw Error(ErrorKind::system, "rank 0 could not lock the run directory " + run_dir_,
                "see rank 0's message: another run probably uses this directory");
  }
  if (!lock_.stale_holder().empty())
    log::info("took over the stale lock of " + run_dir_ + ", left by a run that has ended (" + lock_.stale_holder() +
              ")");
}

template <typename Write>
void TrainingRun::checked_output(Write&& write) {
  if (output_failure_) return;
  try {
    write();
  } catch (const Error& error) {
    if (error.kind() != ErrorKind::system) throw;
    log::error(std::string(error.what()) + ": stopping with a checkpoint at the end of this step");
    output_failure_ = error;
  }
}

void TrainingRun::open_data(const std::string& source_dir) {
  const RunConfig& c = config_;
  auto train_set =
      data::open_dataset("train", c.data.train, source_dir, "data.train", c.train.seq_len, c.model.vocab_size);
  loader_.emplace(train_set, batch_.micro, static_cast<uint64_t>(c.train.seed), rank_, world_);
  if (!c.data.val.empty())
    validation_.emplace(
        data::open_dataset("validation", c.data.val, source_dir, "data.val", c.train.seq_len, c.model.vocab_size),
        batch_.micro, rank_, world_);
}

void TrainingRun::open_tokenizer() {
  const RunConfig& c = config_;
  try {
    tokenizer_ = data::make_tokenizer(c.data.tokenizer);
  } catch (const Error& error) {
    throw Error(error.kind(), "data.tokenizer: " + std::string(error.what()), error.advice());
  }
  const bool byte = tokenizer_->name() == "byte";
  const int64_t vocab = tokenizer_->vocab_size();
  // The shards say which tokenizer made them (mxtrain prepare's meta.json beside them).
  std::vector<std::string> shard_dirs = {fs::path(loader_->dataset().shard(0).path()).parent_path().string()};
  if (validation_) shard_dirs.push_back(fs::path(validation_->dataset().shard(0).path()).parent_path().string());
  for (const std::string& shard_dir : shard_dirs) {
    const std::optional<data::CorpusMeta> meta = data::find_corpus_meta(shard_dir);
    if (!meta || ((meta->tokenizer == "byte") == byte && meta->vocab_size == vocab)) continue;
    throw Error(ErrorKind::config,
                strf("data.tokenizer is '%s' (%lld tokens), but the shards in %s were made by '%s' (%lld tokens, "
                     "per its meta.json): samples would be decoded and the exported model would ship with the "
                     "wrong tokenizer",
                     c.data.tokenizer.c_str(), static_cast<long long>(vocab),
                     shard_dir.empty() ? "." : shard_dir.c_str(), meta->tokenizer.c_str(),
                     static_cast<long long>(meta->vocab_size)),
                strf("set data.tokenizer = '%s' (the tokenizer mxtrain prepare used), or a copy of it",
                     meta->tokenizer.c_str()));
  }
  // A Hugging Face model that comes with its tokenizer reads that tokenizer's ids (nothing to
  // compare when data.tokenizer is that very directory).
  if (!c.model.init_from.empty() && c.model.init_from != c.data.tokenizer) {
    std::unique_ptr<data::Tokenizer> own;
    try {
      own = data::make_tokenizer(c.model.init_from);
    } catch (const Error&) {
      // no tokenizer beside the weights (an export of a byte-level run has none): nothing to compare
    }
    if (own && byte)
      throw Error(ErrorKind::config,
                  strf("model.init_from's model comes with its tokenizer (%s, %lld tokens), but data.tokenizer is "
                       "'byte': the model would read bytes as its own token ids",
                       own->name().c_str(), static_cast<long long>(own->vocab_size())),
                  strf("prepare the data with the model's tokenizer (mxtrain prepare --tokenizer %s ...) and set "
                       "data.tokenizer = '%s'",
                       c.model.init_from.c_str(), c.model.init_from.c_str()));
    if (own && own->vocab_size() != vocab)
      log::warn(strf("data.tokenizer '%s' has %lld tokens, model.init_from's own tokenizer %s has %lld: check that "
                     "the shards were made with the model's tokenizer",
                     c.data.tokenizer.c_str(), static_cast<long long>(vocab), own->name().c_str(),
                     static_cast<long long>(own->vocab_size())));
  }
  if (c.log.sample_every > 0 && vocab > c.model.vocab_size)
    throw Error(ErrorKind::config,
                strf("data.tokenizer '%s' has %lld tokens, more than model.vocab_size = %lld: the samples' prompt "
                     "could hold ids the model has no embedding for",
                     c.data.tokenizer.c_str(), static_cast<long long>(vocab),
                     static_cast<long long>(c.model.vocab_size)),
                strf("set model.vocab_size to at least %lld, or log.sample_every = 0 (no samples)",
                     static_cast<long long>(vocab)));
}

int64_t TrainingRun::start() {
  const ResumePoint resumed = resume_run(config_, world_, *checkpoints_, session_->params(),
                                        session_->resume_buffers(), *backend_, *loader_, ranks_);
  start_step_ = resumed.step;
  tokens_seen_ = resumed.tokens;
  if (start_step_ > 0) session_->restore_resume_values(resume_values_from(resumed.extra));
  if (rank_ == 0) {
    write_file_atomically(run_dir_ + "/config.toml", effective_config_,
                          "set checkpoint.dir (-o) to a writable directory with free space");
    // Records a crashed run wrote after the checkpoint resumed from would appear twice.
    const std::string metrics_path = run_dir_ + "/" + config_.log.metrics;
    const MetricsFile::Kept kept = MetricsFile::keep_through_step(metrics_path, start_step_);
    if (kept.dropped > 0)
      log::info(strf("removed %lld record%s after step %lld from %s (written after the checkpoint resumed from)",
                     static_cast<long long>(kept.dropped), kept.dropped == 1 ? "" : "s", static_cast<long long>(start_step_),
                     metrics_path.c_str()));
    final_val_loss_recorded_ = start_step_ > 0 && kept.keys_at_step.count("val_loss") > 0;
    metrics_ = MetricsFile(metrics_path);
    if (config_.log.tensorboard) open_tensorboard();
    record_start();
  }
  return start_step_;
}

void TrainingRun::train_step(int64_t step) {
  std::vector<data::Batch> host;
  for (int64_t i = 0; i < batch_.accumulation; ++i) host.push_back(loader_->next());
  const double lr = learning_rate(config_.optimizer, config_.schedule, step, config_.train.steps);
  const Clock::time_point started = Clock::now();
  if (!first_step_started_) first_step_started_ = started;
  const StepResult result = session_->step(token_batch_views(host), batch_.global_tokens, lr, step);
  const double seconds = seconds_since(started);
  tokens_seen_ += batch_.global_tokens;
  if (step > start_step_ + 1) {  // the first step pays for warm-up
    timed_seconds_ += seconds;
    ++timed_steps_;
  }
  report(step, result, lr, seconds);
  final_loss_ = result.loss;
  if (step == start_step_ + 2 && seconds > 0.5 * config_.checkpoint.stop_deadline_s)
    log::warn(strf("a step takes %.1f s: after SIGTERM the run finishes its step and saves, which may not fit in "
                   "checkpoint.stop_deadline_s = %.0f s",
                   seconds, config_.checkpoint.stop_deadline_s));
}

void TrainingRun::report(int64_t step, const StepResult& result, double lr, double seconds) {
  StepMetrics m;
  m.step = step;
  m.steps = config_.train.steps;
  m.loss = result.loss;
  m.lr = lr;
  m.grad_norm = result.grad_norm;
  m.skipped = result.skipped;
  m.nonfinite = result.nonfinite;
  m.nonfinite_skips = result.nonfinite_skips;
  m.loss_scale = result.loss_scale;
  m.step_ms = 1e3 * seconds;
  m.tokens_per_s = static_cast<double>(batch_.global_tokens) / seconds;
  m.tokens_per_s_per_gpu = m.tokens_per_s / world_;
  m.tflops = m.tokens_per_s * flops_per_token_ / 1e12;
  if (peak_flops_ > 0) m.mfu = m.tokens_per_s_per_gpu * flops_per_token_ / peak_flops_;
  const MemoryStats memory = backend_->memory_stats();
  m.peak_bytes = static_cast<uint64_t>(ranks_.max(static_cast<double>(memory.peak_live_bytes)));
  m.reserved_bytes = static_cast<uint64_t>(ranks_.max(static_cast<double>(memory.peak_reserved_bytes)));
  m.tokens = tokens_seen_;
  // Elapsed since this process's first step; the ETA at the mean of its timed steps (the first
  // pays for warm-up), the evaluations and checkpoints between them excluded.
  m.elapsed_s = seconds_since(*first_step_started_);
  const double mean_step = timed_steps_ > 0 ? timed_seconds_ / static_cast<double>(timed_steps_) : seconds;
  m.eta_s = mean_step * static_cast<double>(config_.train.steps - step);
  if (step % config_.log.every == 0 || step == config_.train.steps || step == start_step_ + 1) {
    std::string line = format_step_line(m);
    if (world_ > 1) line += " | " + log::with_commas(m.tokens_per_s_per_gpu) + " tok/s per rank";
    log::info(line);
  }
  checked_output([&] {
    metrics_.write(step_json(m));
    write_tensorboard(m);
  });
}

// A new event file whose first point is a SessionLog START at the first step this process writes:
// TensorBoard then drops what a crashed run wrote after the checkpoint resumed from (as
// keep_through_step does for metrics.jsonl), and the resumed run's points are each step's only one.
void TrainingRun::open_tensorboard() {
  tensorboard_ = TensorBoardWriter(run_dir_ + "/tensorboard");
  tensorboard_.add_session_start(start_step_ + 1);
}

void TrainingRun::write_tensorboard(const StepMetrics& m) {
  if (!tensorboard_.is_open()) return;
  tensorboard_.add_scalar("train/loss", m.step, m.loss);
  tensorboard_.add_scalar("train/lr", m.step, m.lr);
  tensorboard_.add_scalar("train/grad_norm", m.step, m.grad_norm);
  if (m.loss_scale > 0) tensorboard_.add_scalar("train/loss_scale", m.step, m.loss_scale);
  if (m.nonfinite_skips > 0)
    tensorboard_.add_scalar("train/nonfinite_skips", m.step, static_cast<double>(m.nonfinite_skips));
  tensorboard_.add_scalar("perf/tokens_per_s", m.step, m.tokens_per_s);
  tensorboard_.add_scalar("perf/tflops", m.step, m.tflops);
  if (m.mfu >= 0) tensorboard_.add_scalar("perf/mfu", m.step, m.mfu);
  tensorboard_.add_scalar("perf/step_ms", m.step, m.step_ms);
  tensorboard_.add_scalar("memory/peak_gib", m.step, static_cast<double>(m.peak_bytes) / (1u << 30));
  tensorboard_.add_scalar("memory/reserved_gib", m.step, static_cast<double>(m.reserved_bytes) / (1u << 30));
}

double TrainingRun::evaluate(int64_t step, bool record) {
  if (!validation_ || config_.eval.batches == 0) return -1;
  validation_->start(config_.eval.batches);
  std::vector<data::Batch> host;
  while (auto batch = validation_->next()) host.push_back(std::move(*batch));
  const double val_loss = session_->evaluate(token_batch_views(host));
  log::info(strf("step %lld/%lld | val_loss %.4f", static_cast<long long>(step),
                 static_cast<long long>(config_.train.steps), val_loss));
  if (!record) return val_loss;
  checked_output([&] {
    metrics_.write({{"step", step}, {"val_loss", val_loss}});
    if (tensorboard_.is_open()) tensorboard_.add_scalar("eval/val_loss", step, val_loss);
  });
  return val_loss;
}

void TrainingRun::sample(int64_t step) {
  const data::Tokenizer* tokenizer = tokenizer_.get();
  std::vector<int32_t> prompt = tokenizer->encode(config_.log.sample_prompt);
  if (prompt.empty() && tokenizer->bos_id()) prompt.push_back(*tokenizer->bos_id());
  if (prompt.empty()) return;
  SamplingOptions options;
  options.max_tokens = config_.log.sample_tokens;
  options.seed = static_cast<uint64_t>(config_.train.seed) + static_cast<uint64_t>(step);
  options.stop_token = tokenizer->eos_id().value_or(-1);
  const std::vector<int32_t> produced =
      generate_tokens(session_->model(), *backend_, prompt, std::min(config_.train.seq_len, config_.model.max_seq_len),
                      options);
  const std::string text = config_.log.sample_prompt + tokenizer->decode(produced);
  log::info(strf("step %lld/%lld | sample: %s", static_cast<long long>(step),
                 static_cast<long long>(config_.train.steps), data::printable_text(text).c_str()));
  checked_output([&] { metrics_.write({{"step", step}, {"sample", text}}); });
}

void TrainingRun::save(int64_t step) {
  CheckpointMeta meta;
  meta.step = step;
  meta.tokens = tokens_seen_;
  meta.seed = static_cast<uint64_t>(config_.train.seed);
  meta.data_state = loader_->state();
  meta.config = config_to_json(config_);
  meta.world_size = world_;
  ParameterStore& params = session_->params();
  meta.strategy = params.strategy_name();
  // Replicas (no_shard, hybrid_shard) hold the same slices: only the first one writes them.
  const std::vector<ParamShard> shards = params.writes_checkpoint_shards() ? params.shards() : std::vector<ParamShard>{};
  const Clock::time_point started = Clock::now();
  meta.extra = resume_values_to_json(session_->resume_values());
  last_checkpoint_ = checkpoints_->save(meta, shards, *backend_, session_->resume_buffers());
  const double seconds = seconds_since(started);
  if (rank_ == 0) {
    uint64_t bytes = 0;
    std::error_code error;
    for (const auto& entry : fs::directory_iterator(last_checkpoint_, error))
      if (entry.is_regular_file(error)) bytes += entry.file_size(error);
    checked_output([&] {
      metrics_.write({{"step", step}, {"event", "checkpoint"}, {"path", last_checkpoint_}, {"seconds", seconds},
                      {"bytes", bytes}});
    });
  }
  checkpoints_->prune(config_.checkpoint.keep, last_checkpoint_);
  log::info("saved checkpoint " + last_checkpoint_);
}

TrainerSummary TrainingRun::stop(int64_t step) {
  const Clock::time_point stop_started = Clock::now();
  if (output_failure_)
    log::info(strf("saving a checkpoint at step %lld and stopping (the run's outputs cannot be written)",
                   static_cast<long long>(step)));
  else
    log::info(stop_requested()
                  ? strf("signal %d received: saving a checkpoint at step %lld and stopping", stop_signal_number(),
                         static_cast<long long>(step))
                  : strf("another rank received a stop signal or cannot write its outputs: saving a "
                         "checkpoint at step %lld and stopping",
                         static_cast<long long>(step)));
  if (output_failure_) {
    try {
      save(step);
    } catch (const Error& error) {
      throw Error(error.kind(),
                  std::string(output_failure_->what()) + "; the checkpoint on the way out failed too: " + error.what(),
                  error.advice());
    }
    log::info("saved checkpoint " + last_checkpoint_ + "; re-run the same command to resume once there is space");
    throw *output_failure_;
  }
  save(step);
  const double save_seconds = seconds_since(stop_started);
  if (save_seconds > config_.checkpoint.stop_deadline_s)
    log::warn(strf("saving took %.1f s, longer than checkpoint.stop_deadline_s = %.0f s", save_seconds,
                   config_.checkpoint.stop_deadline_s));
  log::info("stopped; re-run the same command to resume from " + last_checkpoint_);
  checked_output([&] {
    metrics_.write({{"step", step}, {"event", "stop"}, {"signal", stop_requested() ? stop_signal_number() : 0}});
  });
  write_report();
  TrainerSummary stopped = summary(step);
  stopped.stopped_by_signal = true;
  return stopped;
}

TrainerSummary TrainingRun::finish(int64_t step) {
  // A re-run of a finished run resumes at its last step, whose held-out loss the first run recorded
  // before its final checkpoint: computed again for the summary line, not recorded twice.
  const bool recorded_before = step == start_step_ && final_val_loss_recorded_;
  const double val_loss = evaluate(step, !recorded_before);
  save(step);
  if (output_failure_) throw *output_failure_;
  TrainerSummary done = summary(step);
  done.final_val_loss = val_loss;
  done.tokens_per_s =
      timed_steps_ > 0 ? static_cast<double>(batch_.global_tokens * timed_steps_) / timed_seconds_ : 0;
  const std::string held_out =
      val_loss >= 0 ? strf(" | held-out loss %.4f (ln(vocab) = %.4f)", val_loss,
                           std::log(static_cast<double>(config_.model.vocab_size)))
                    : std::string();
  log::info(strf("done: %lld steps | final loss %.4f%s | %s tok/s", static_cast<long long>(step), done.final_loss,
                 held_out.c_str(), log::with_commas(done.tokens_per_s).c_str()));
  log::info("checkpoint: " + last_checkpoint_);
  log::info("metrics:    " + done.metrics_path);
  write_report();
  return done;
}

void TrainingRun::fail(int64_t step, const std::string& message) {
  if (rank_ != 0 || !metrics_.is_open()) return;
  try {
    metrics_.write({{"step", step}, {"event", "failure"}, {"message", message}});
  } catch (const std::exception&) {
    // The original error is what the user needs; the report below says what it can.
  }
  write_report();
}

TrainerSummary TrainingRun::summary(int64_t step) const {
  TrainerSummary result;
  result.steps_done = step;
  result.final_loss = final_loss_;
  result.run_dir = run_dir_;
  result.checkpoint = last_checkpoint_;
  result.metrics_path = metrics_.path();
  return result;
}

}  // namespace

// The loop, as it reads: set up, resume, then for each step train, evaluate when due and save
// when the checkpoint policy says so (stopping on a signal); at the end evaluate and save.
TrainerSummary Trainer::run() {
  const runtime::RankEnvironment environment = rank_environment(context_);
  log::set_rank(environment.rank);
  log::set_all_ranks(config_.log.all_ranks);
  install_stop_handlers();
  TrainingRun run(config_, context_, environment);
  int64_t step = run.start();
  try {
    CheckpointPolicy checkpoints(config_.checkpoint, config_.train.steps, run.ranks());
    while (step < config_.train.steps) {
      ++step;
      run.train_step(step);
      if (config_.eval.every > 0 && step % config_.eval.every == 0 && step < config_.train.steps) run.evaluate(step);
      if (config_.log.sample_every > 0 && step % config_.log.sample_every == 0) run.sample(step);
      const CheckpointAction action = checkpoints.after_step(step, run.output_failed());
      if (action == CheckpointAction::save_and_stop) return run.stop(step);
      if (action == CheckpointAction::save) {
        run.save(step);
        checkpoints.saved();
      }
    }
    // The closing checkpoint is written even when no step ran (a finished run resumed), as the
    // run's summary names it.
    return run.finish(step);
  } catch (const Error& error) {
    run.fail(step, error.full_message());
    throw;
  } catch (const std::exception& error) {
    run.fail(step, error.what());
    throw;
  }
}

}  // namespace mxtrain
