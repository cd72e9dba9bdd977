#include "mxtrain/train/trainer.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>

#include <nlohmann/json.hpp>

#include "mxtrain/backend/backend.hpp"
#include "mxtrain/build_info.hpp"
#include "mxtrain/config/loader.hpp"
#include "mxtrain/core/error.hpp"
#include "mxtrain/core/log.hpp"
#include "mxtrain/data/loader.hpp"
#include "mxtrain/distributed/communicator.hpp"
#include "mxtrain/distributed/communicator_factory.hpp"
#include "mxtrain/hw/gpu_catalog.hpp"
#include "mxtrain/train/checkpoint.hpp"
#include "mxtrain/train/metrics.hpp"
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

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::vector<TokenBatch> views(const std::vector<data::Batch>& batches) {
  std::vector<TokenBatch> result;
  for (const data::Batch& batch : batches)
    result.push_back(TokenBatch{batch.tokens.data(), batch.targets.data(), batch.batch, batch.seq});
  return result;
}

// Host values reduced over the ranks of the run (identities for one process). Every decision
// that ends or forks the loop goes through here, so all ranks take it at the same step.
class RankGroup {
 public:
  explicit RankGroup(Communicator* world) : world_(world) {}
  double sum(double value) const { return world_ ? world_->all_reduce_scalar(value, ReduceOp::sum) : value; }
  double max(double value) const { return world_ ? world_->all_reduce_scalar(value, ReduceOp::max) : value; }
  bool all(bool value) const { return max(value ? 0.0 : 1.0) == 0.0; }
  std::function<void()> barrier() const {
    if (!world_) return {};
    Communicator* world = world_;
    return [world] { world->barrier(); };
  }

 private:
  Communicator* world_;
};

// The newest checkpoint every rank could load (a damaged segment may be read by one rank only,
// so the ranks agree on each candidate before using it). Returns "" when none loads.
std::string load_agreed_checkpoint(CheckpointStore& checkpoints, const std::vector<std::string>& candidates,
                                   ParameterStore& params, Backend& backend, const RankGroup& ranks,
                                   CheckpointMeta* meta) {
  const int64_t count = static_cast<int64_t>(ranks.max(static_cast<double>(candidates.size())));
  for (int64_t i = 0; i < count; ++i) {
    const std::string path = i < static_cast<int64_t>(candidates.size()) ? candidates[static_cast<size_t>(i)] : "";
    bool loaded = false;
    if (!path.empty()) {
      try {
        *meta = checkpoints.load(path, params.shards(), backend);
        loaded = true;
      } catch (const Error& error) {
        if (error.kind() != ErrorKind::checkpoint) throw;
        log::warn("skipping checkpoint " + path + ": " + error.what() + "; trying the previous one");
      }
    }
    if (!ranks.all(loaded)) {
      if (loaded) log::warn("another rank could not load " + path + "; trying the previous one");
      continue;
    }
    const double step = static_cast<double>(meta->step);
    if (ranks.max(step) != -ranks.max(-step))
      throw Error(ErrorKind::checkpoint, "the ranks found different newest checkpoints in " + checkpoints.directory(),
                  "all ranks must see the same checkpoint.dir (a shared filesystem across nodes)");
    return path;
  }
  return "";
}

// Printed by every rank (the logger keeps info lines to rank 0): who is who in a multi-rank run.
void announce_rank(const runtime::RankEnvironment& environment, const std::string& device, int device_index) {
  std::printf("[rank %d] %s; device %s%s\n", environment.rank, environment.describe().c_str(), device.c_str(),
              device == "cuda" ? strf(":%d", device_index).c_str() : "");
  std::fflush(stdout);
}

}  // namespace

TrainerSummary Trainer::run() {
  RunConfig& c = config_;
  runtime::RankEnvironment environment = context_.environment;
  if (context_.communicator) {
    environment.rank = context_.communicator->rank();
    environment.world_size = context_.communicator->size();
    if (environment.source == runtime::EnvironmentSource::single) {  // one node: local = global
      environment.local_rank = environment.rank;
      environment.local_world_size = environment.world_size;
    }
  }
  const int rank = environment.rank;
  const int world = environment.world_size;
  log::set_rank(rank);
  log::set_all_ranks(c.log.all_ranks);
  install_stop_handlers();

  // ---- device, communicator, precision, batch geometry ---------------------------------------
  const std::string device = resolve_device(c.train.device);
  BackendOptions options = backend_options(c);
  if (device == "cuda") options.device_index = runtime::local_device_index(environment, visible_gpu_count());
  if (world > 1) announce_rank(environment, device, options.device_index);
  std::unique_ptr<Backend> backend = create_backend(device, options);
  std::unique_ptr<Communicator> owned_world;
  Communicator* world_communicator = context_.communicator;
  if (!world_communicator) {
    const std::string kind = resolve_communicator_kind(c.dist.backend, device, world);
    if (kind != "single") {
      owned_world = create_world_communicator(kind, environment, *backend);
      world_communicator = owned_world.get();
    }
  }
  const RankGroup ranks(world_communicator);
  const PrecisionPlan precision = resolve_precision(c, *backend);
  const int64_t micro = c.train.micro_batch_size;
  const int64_t global = c.train.global_batch(world);
  if (global % (micro * world) != 0)
    throw Error(ErrorKind::config,
                strf("train.global_batch_size = %lld is not a multiple of micro_batch_size x ranks = %lld x %d",
                     static_cast<long long>(global), static_cast<long long>(micro), world),
                "choose a global batch that every rank can split into whole micro-batches");
  const int64_t accumulation = global / (micro * world);
  const int64_t global_tokens = global * c.train.seq_len;

  const DeviceProperties props = backend->properties();
  log::info(strf("mxtrain %s (commit %s) | %s | %s", MXTRAIN_VERSION, MXTRAIN_GIT_COMMIT, device.c_str(),
                 props.name.c_str()));
  log::info(strf("model %s: %s family, %s parameters, hidden %lld, %lld layers, %lld heads (%lld KV), FFN %lld, vocab %lld",
                 c.model.preset.c_str(), family_name(c.model.family),
                 log::with_commas(static_cast<double>(c.model.parameter_count())).c_str(),
                 static_cast<long long>(c.model.hidden), static_cast<long long>(c.model.layers),
                 static_cast<long long>(c.model.heads), static_cast<long long>(c.model.kv_heads),
                 static_cast<long long>(c.model.ffn_hidden), static_cast<long long>(c.model.vocab_size)));
  log::info(precision.startup_line);
  log::info(strf("batch: %lld sequences x %lld tokens = %s tokens per step (micro-batch %lld, %lld accumulation "
                 "steps, %d ranks); recompute %s",
                 static_cast<long long>(global), static_cast<long long>(c.train.seq_len),
                 log::with_commas(static_cast<double>(global_tokens)).c_str(), static_cast<long long>(micro),
                 static_cast<long long>(accumulation), world, c.train.recompute.c_str()));

  // ---- run directory and effective config ---------------------------------------------------
  const std::string run_dir = run_directory(c);
  std::error_code fs_error;
  fs::create_directories(run_dir, fs_error);
  if (fs_error)
    throw Error(ErrorKind::system, "cannot create run directory " + run_dir + ": " + fs_error.message(),
                "set checkpoint.dir (-o) to a writable directory");
  const std::string effective = config_to_toml(c);
  log::info("effective config:\n" + effective);

  // ---- data ---------------------------------------------------------------------------------
  auto train_set = data::open_dataset("train", c.data.train, context_.source_dir, "data.train", c.train.seq_len,
                                      c.model.vocab_size);
  data::TrainLoader loader(train_set, micro, static_cast<uint64_t>(c.train.seed), rank, world);
  std::optional<data::ValidationReader> validation;
  if (!c.data.val.empty())
    validation.emplace(data::open_dataset("validation", c.data.val, context_.source_dir, "data.val", c.train.seq_len,
                                          c.model.vocab_size),
                       micro, rank, world);

  // ---- model, optimizer state, checkpoint ---------------------------------------------------
  TrainingSession session(c, *backend, precision,
                          make_parameter_store(*backend, c, precision, world_communicator, environment.local_world_size));
  session.all_reduce_sum = [&ranks](double value) { return ranks.sum(value); };
  const std::string description = session.params().describe();
  if (!description.empty()) log::info(description);
  const std::string strategy = session.params().strategy_name();
  CheckpointStore checkpoints(run_dir, rank, world, ranks.barrier());

  int64_t start_step = 0;
  int64_t tokens_seen = 0;
  const std::vector<std::string> existing = checkpoints.list();
  if (!ranks.all(existing.empty() || c.checkpoint.resume != "never"))
    throw Error(ErrorKind::checkpoint,
                "run directory " + run_dir + " already has checkpoints and checkpoint.resume = never",
                "resume it (drop --no-resume), or start the new run elsewhere with -o DIR");
  if (c.checkpoint.resume != "never" && !ranks.all(existing.empty())) {
    CheckpointMeta meta;
    std::string loaded = load_agreed_checkpoint(checkpoints, existing, session.params(), *backend, ranks, &meta);
    if (loaded.empty())
      throw Error(ErrorKind::checkpoint, "no checkpoint in " + run_dir + " could be loaded",
                  "all are damaged; move the directory away to start fresh, or point -o elsewhere");
    RunConfig saved = config_from_json(meta.config);
    std::vector<std::string> differing = config_differences(saved, c, {"model."});
    if (!differing.empty()) {
      std::string keys;
      for (const std::string& key : differing) keys += (keys.empty() ? "" : ", ") + key;
      throw Error(ErrorKind::checkpoint, "the checkpoint in " + loaded + " has a different model: " + keys + " differ",
                  "resume with the model settings of that run (see its config.toml), or train in another directory");
    }
    // Another split of the same global batch (other ranks, micro-batches or threads) trains alike.
    const int64_t saved_global = saved.train.global_batch(meta.world_size);
    for (const std::string& key : config_differences(saved, c, {"train.", "optimizer.", "schedule.", "data."})) {
      if (key == "train.threads" || (saved_global == global && (key == "train.micro_batch_size" ||
                                                                key == "train.global_batch_size")))
        continue;
      log::warn("resuming with a changed " + key + " (the continuation will differ from the original run)");
    }
    loader.restore_state(meta.data_state);
    start_step = meta.step;
    tokens_seen = meta.tokens;
    log::info(strf("resumed from %s at step %lld", loaded.c_str(), static_cast<long long>(start_step)));
    if (meta.world_size != world || meta.strategy != strategy)
      log::info(strf("resharded: saved by %d rank%s with %s, loaded by %d with %s", meta.world_size,
                     meta.world_size == 1 ? "" : "s", meta.strategy.c_str(), world, strategy.c_str()));
  } else if (c.checkpoint.resume == "always") {
    throw Error(ErrorKind::checkpoint, "--resume given but " + run_dir + " has no checkpoint",
                "check -o/checkpoint.dir, or drop --resume to start a new run");
  }
  if (rank == 0) {
    std::ofstream(run_dir + "/config.toml") << effective;
  }
  MetricsFile metrics;
  if (rank == 0) metrics = MetricsFile(run_dir + "/" + c.log.metrics);

  // ---- the loop -----------------------------------------------------------------------------
  const GpuSpec* gpu = device == "cuda" ? find_gpu(props.name) : nullptr;
  const double peak = gpu ? peak_flops(*gpu, mfu_dtype(precision)) : 0.0;
  const double flops_per_token = c.model.training_flops_per_token(c.train.seq_len);
  auto evaluate = [&](int64_t step) -> double {
    if (!validation) return -1;
    int64_t batches = validation->start(c.eval.batches);
    std::vector<data::Batch> host;
    while (auto batch = validation->next()) host.push_back(std::move(*batch));
    (void)batches;
    double val_loss = session.evaluate(views(host));
    log::info(strf("step %lld/%lld | val_loss %.4f", static_cast<long long>(step), static_cast<long long>(c.train.steps),
                   val_loss));
    metrics.write({{"step", step}, {"val_loss", val_loss}});
    return val_loss;
  };
  std::string last_checkpoint;
  auto save = [&](int64_t step) {
    CheckpointMeta meta;
    meta.step = step;
    meta.tokens = tokens_seen;
    meta.seed = static_cast<uint64_t>(c.train.seed);
    meta.data_state = loader.state();
    meta.config = config_to_json(c);
    meta.world_size = world;
    meta.strategy = strategy;
    // Replicas (no_shard, hybrid_shard) hold the same slices: only the first one writes them.
    const bool writes = session.params().writes_checkpoint_shards();
    last_checkpoint = checkpoints.save(meta, writes ? session.params().shards() : std::vector<ParamShard>{}, *backend);
    checkpoints.prune(c.checkpoint.keep);
    log::info("saved checkpoint " + last_checkpoint);
  };

  TrainerSummary summary;
  summary.run_dir = run_dir;
  summary.metrics_path = metrics.path();
  double timed_seconds = 0;
  int64_t timed_steps = 0;
  Clock::time_point last_save_time = Clock::now();
  int64_t step = start_step;
  double val_loss = -1;
  bool saved_at_step = false;
  while (step < c.train.steps) {
    ++step;
    saved_at_step = false;
    std::vector<data::Batch> host;
    for (int64_t i = 0; i < accumulation; ++i) host.push_back(loader.next());
    const double lr = learning_rate(c.optimizer, c.schedule, step, c.train.steps);
    Clock::time_point started = Clock::now();
    StepResult result = session.step(views(host), global_tokens, lr, step);
    const double seconds = seconds_since(started);
    tokens_seen += global_tokens;
    if (step > start_step + 1) {
      timed_seconds += seconds;
      ++timed_steps;
    }

    StepMetrics m;
    m.step = step;
    m.steps = c.train.steps;
    m.loss = result.loss;
    m.lr = lr;
    m.grad_norm = result.grad_norm;
    m.skipped = result.skipped;
    m.loss_scale = result.loss_scale;
    m.step_ms = 1e3 * seconds;
    m.tokens_per_s = static_cast<double>(global_tokens) / seconds;
    m.tokens_per_s_per_gpu = m.tokens_per_s / world;
    m.tflops = m.tokens_per_s * flops_per_token / 1e12;
    if (peak > 0) m.mfu = m.tokens_per_s_per_gpu * flops_per_token / peak;
    const MemoryStats memory = backend->memory_stats();
    m.peak_bytes = static_cast<uint64_t>(ranks.max(static_cast<double>(memory.peak_live_bytes)));
    m.reserved_bytes = static_cast<uint64_t>(ranks.max(static_cast<double>(memory.peak_reserved_bytes)));
    m.tokens = tokens_seen;
    if (step % c.log.every == 0 || step == c.train.steps || step == start_step + 1) {
      std::string line = format_step_line(m);
      if (world > 1) line += " | " + log::with_commas(m.tokens_per_s_per_gpu) + " tok/s per rank";
      log::info(line);
    }
    metrics.write(step_json(m));
    summary.final_loss = result.loss;
    if (step == start_step + 2 && seconds > 0.5 * c.checkpoint.stop_deadline_s)
      log::warn(strf("a step takes %.1f s: after SIGTERM the run finishes its step and saves, which may not fit in "
                     "checkpoint.stop_deadline_s = %.0f s",
                     seconds, c.checkpoint.stop_deadline_s));

    if (c.eval.every > 0 && step % c.eval.every == 0 && step < c.train.steps) val_loss = evaluate(step);
    const bool periodic = c.checkpoint.every > 0 && step % c.checkpoint.every == 0;
    const bool timed = c.checkpoint.every_minutes > 0 && seconds_since(last_save_time) >= 60 * c.checkpoint.every_minutes;
    // All ranks stop (2) or take a timed checkpoint (1) at the same step, whichever rank saw it.
    const double agreed = ranks.max(stop_requested() ? 2.0 : (timed ? 1.0 : 0.0));
    if (agreed >= 2.0) {
      const Clock::time_point stop_started = Clock::now();
      log::info(stop_requested()
                    ? strf("signal %d received: saving a checkpoint at step %lld and stopping", stop_signal_number(),
                           static_cast<long long>(step))
                    : strf("another rank received a stop signal: saving a checkpoint at step %lld and stopping",
                           static_cast<long long>(step)));
      save(step);
      summary.stopped_by_signal = true;
      summary.steps_done = step;
      summary.checkpoint = last_checkpoint;
      const double save_seconds = seconds_since(stop_started);
      if (save_seconds > c.checkpoint.stop_deadline_s)
        log::warn(strf("saving took %.1f s, longer than checkpoint.stop_deadline_s = %.0f s", save_seconds,
                       c.checkpoint.stop_deadline_s));
      log::info("stopped; re-run the same command to resume from " + last_checkpoint);
      return summary;
    }
    if ((periodic || agreed >= 1.0) && step < c.train.steps) {
      save(step);
      last_save_time = Clock::now();
      saved_at_step = true;
    }
  }
  if (step > start_step || validation) val_loss = evaluate(step);
  if (!saved_at_step && (step > start_step || last_checkpoint.empty())) save(step);
  summary.steps_done = step;
  summary.final_val_loss = val_loss;
  summary.checkpoint = last_checkpoint;
  summary.tokens_per_s = timed_steps > 0 ? static_cast<double>(global_tokens * timed_steps) / timed_seconds : 0;
  log::info(strf("done: %lld steps | final loss %.4f | held-out loss %.4f (ln(vocab) = %.4f) | %s tok/s",
                 static_cast<long long>(step), summary.final_loss, val_loss,
                 std::log(static_cast<double>(c.model.vocab_size)), log::with_commas(summary.tokens_per_s).c_str()));
  log::info("checkpoint: " + last_checkpoint);
  log::info("metrics:    " + summary.metrics_path);
  return summary;
}

}  // namespace mxtrain
