#include "mxtrain/plan/recommend.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>

#include "mxtrain/core/error.hpp"
#include "mxtrain/core/log.hpp"
#include "mxtrain/model/recompute.hpp"
#include "mxtrain/train/precision.hpp"

namespace mxtrain {

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> items;
  std::string item;
  auto flush = [&] {
    const size_t begin = item.find_first_not_of(' ');
    const size_t end = item.find_last_not_of(' ');
    if (begin != std::string::npos) items.push_back(item.substr(begin, end - begin + 1));
    item.clear();
  };
  for (char c : text) {
    if (c == ',') flush();
    else item += c;
  }
  flush();
  return items;
}

std::vector<std::string> precision_list(const std::string& text, const RunConfig& config) {
  if (!text.empty()) return split_list(text);
  return {config.train.precision == "auto" ? std::string("bf16") : config.train.precision};
}

std::string Candidate::label() const {
  std::string text = strf("mb %lld x %lld | %s | %s", static_cast<long long>(micro_batch),
                          static_cast<long long>(micro_batches), recompute.c_str(), precision.c_str());
  if (gpus > 1) {
    text += " | " + strategy;
    if (strategy == "hybrid_shard") text += strf(" (groups of %lld)", static_cast<long long>(shard_group_size));
  }
  return text;
}

bool better_throughput(const Candidate& a, const Candidate& b) {
  if (a.tokens_per_s != b.tokens_per_s) return a.tokens_per_s > b.tokens_per_s;
  if (a.total_bytes != b.total_bytes) return a.total_bytes < b.total_bytes;
  return a.label() < b.label();
}

std::vector<Candidate> rank_candidates(std::vector<Candidate> candidates) {
  candidates.erase(std::remove_if(candidates.begin(), candidates.end(),
                                  [](const Candidate& c) { return !c.fits_with_headroom; }),
                   candidates.end());
  std::sort(candidates.begin(), candidates.end(), better_throughput);
  if (candidates.empty()) return candidates;
  // Within 0.1% of the fastest the throughputs are a tie (the model is not that precise): the
  // tied config with the smallest footprint leads.
  const double tie = candidates.front().tokens_per_s * (1 - 1e-3);
  size_t lead = 0;
  for (size_t i = 1; i < candidates.size() && candidates[i].tokens_per_s >= tie; ++i)
    if (candidates[i].total_bytes < candidates[lead].total_bytes) lead = i;
  std::rotate(candidates.begin(), candidates.begin() + static_cast<std::ptrdiff_t>(lead),
              candidates.begin() + static_cast<std::ptrdiff_t>(lead) + 1);
  return candidates;
}

RunConfig apply_candidate(const RunConfig& base, const Candidate& candidate) {
  RunConfig config = base;
  config.train.micro_batch_size = candidate.micro_batch;
  config.train.global_batch_size = candidate.global_batch;
  config.train.seq_len = candidate.seq_len;
  config.train.recompute = candidate.recompute;
  config.train.precision = candidate.precision;
  config.dist.strategy = candidate.strategy;
  config.dist.shard_group_size = candidate.shard_group_size;
  return config;
}

std::vector<int64_t> micro_batch_choices(int64_t per_gpu_batch) {
  std::vector<int64_t> result;
  for (int64_t m = 1; m <= per_gpu_batch && m <= 4096; ++m)
    if (per_gpu_batch % m == 0) result.push_back(m);
  return result;
}

Candidate candidate_from_plan(const Plan& plan, const Candidate& knobs) {
  Candidate result = knobs;
  result.micro_batches = plan.micro_batches;
  result.fits = plan.fits;
  result.fits_with_headroom = plan.fits_with_headroom;
  result.total_bytes = plan.memory.total;
  result.capacity_bytes = plan.memory.capacity;
  result.model_state_bytes =
      plan.memory.weights + plan.memory.master_weights + plan.memory.gradients + plan.memory.optimizer_states;
  result.activation_bytes = plan.memory.layer_activations + plan.memory.other_activations + plan.memory.logits +
                            plan.memory.scratch;
  result.tokens_per_s = plan.tokens_per_s;
  result.tokens_per_s_per_gpu = plan.tokens_per_s_per_gpu;
  result.mfu = plan.mfu;
  result.step_s = plan.time.total_s;
  result.time = plan.time;
  return result;
}

namespace {

std::string tokens_text(double tokens_per_s) { return log::with_commas(tokens_per_s); }
std::string gib(uint64_t bytes) { return gib_text(static_cast<double>(bytes)); }

class Search {
 public:
  Search(const RunConfig& base, const GpuSpec& gpu, const Calibration& calibration, const RecommendOptions& options)
      : base_(base), gpu_(gpu), calibration_(calibration), options_(options) {}

  Candidate evaluate(const Candidate& knobs) {
    const std::string key = knobs.label() + strf("|%lld|%lld|%d|%d", static_cast<long long>(knobs.seq_len),
                                                 static_cast<long long>(knobs.global_batch), knobs.gpus, knobs.nodes);
    auto found = memo_.find(key);
    if (found != memo_.end()) return found->second;
    PlanOptions plan_options;
    plan_options.steps = options_.search_steps;
    plan_options.detailed = false;
    plan_options.headroom = options_.headroom;
    const Plan plan = make_plan(apply_candidate(base_, knobs), PlanTarget{gpu_.key, knobs.gpus, knobs.nodes},
                                calibration_, plan_options);
    ++dryruns_;
    Candidate result = candidate_from_plan(plan, knobs);
    memo_.emplace(key, result);
    evaluated_.push_back(result);
    return result;
  }

  // Every config at one (GPU count, length, global batch) worth ranking: per precision and
  // sharding, the largest micro-batches that fit under each checkpointing mode, and the fewest
  // recomputed layers that let a larger micro-batch fit.
  std::vector<Candidate> at(int gpus, int nodes, int64_t seq, int64_t global, const std::vector<std::string>& precisions) {
    std::vector<Candidate> fitting;
    const std::vector<int64_t> micros = micro_batch_choices(global / gpus);
    for (const std::string& precision : precisions) {
      for (const auto& [strategy, group] : strategies(gpus, nodes)) {
        Candidate knobs;
        knobs.precision = precision;
        knobs.strategy = strategy;
        knobs.shard_group_size = group;
        knobs.seq_len = seq;
        knobs.global_batch = global;
        knobs.gpus = gpus;
        knobs.nodes = nodes;
        int largest[3] = {-1, -1, -1};
        const char* modes[3] = {"none", "selective", "full"};
        for (int mode = 0; mode < 3; ++mode) {
          knobs.recompute = modes[mode];
          largest[mode] = largest_fitting(knobs, micros);
          // The largest fitting micro-batch is usually fastest, but tile quantisation can make
          // a smaller one win: price the next two as well.
          for (int i = largest[mode]; i >= 0 && i > largest[mode] - 3; --i) fitting.push_back(with_micro(knobs, micros, i));
        }
        // First-K checkpointing: the fewest recomputed layers that let micro-batches fit that
        // do not fit without checkpointing.
        const int64_t layers = base_.model.layers;
        for (int i = largest[2]; i > largest[0] && i > largest[2] - 2; --i) {
          knobs.recompute = "full";
          knobs.micro_batch = micros[static_cast<size_t>(i)];
          int64_t lo = 0, hi = layers;  // K = 0 does not fit, K = layers (full) does
          while (hi - lo > 1) {
            const int64_t mid = (lo + hi) / 2;
            knobs.recompute = std::to_string(mid);
            (evaluate(knobs).fits_with_headroom ? hi : lo) = mid;
          }
          if (hi < layers) {
            knobs.recompute = std::to_string(hi);
            fitting.push_back(evaluate(knobs));
          }
        }
      }
    }
    return rank_candidates(fitting);
  }

  const std::vector<Candidate>& evaluated() const { return evaluated_; }
  int64_t dryruns() const { return dryruns_; }

 private:
  Candidate with_micro(Candidate knobs, const std::vector<int64_t>& micros, int index) {
    knobs.micro_batch = micros[static_cast<size_t>(index)];
    return evaluate(knobs);
  }

  // Memory grows with the micro-batch: bisection for the largest index that fits (-1 if none).
  int largest_fitting(const Candidate& knobs, const std::vector<int64_t>& micros) {
    int lo = -1, hi = static_cast<int>(micros.size());
    while (hi - lo > 1) {
      const int mid = (lo + hi) / 2;
      (with_micro(knobs, micros, mid).fits_with_headroom ? lo : hi) = mid;
    }
    return lo;
  }

  std::vector<std::pair<std::string, int64_t>> strategies(int gpus, int nodes) const {
    if (gpus == 1) return {{base_.dist.strategy, base_.dist.shard_group_size}};
    std::vector<std::pair<std::string, int64_t>> result = {{"no_shard", 0}, {"shard_grad_op", 0}, {"full_shard", 0}};
    for (int64_t group = 2; group < gpus; group *= 2)
      if (gpus % group == 0 && (nodes == 1 || group <= gpus / nodes)) result.emplace_back("hybrid_shard", group);
    return result;
  }

  const RunConfig& base_;
  const GpuSpec& gpu_;
  const Calibration& calibration_;
  const RecommendOptions& options_;
  std::map<std::string, Candidate> memo_;
  std::vector<Candidate> evaluated_;
  int64_t dryruns_ = 0;
};

int nodes_for(int gpus, const GpuSpec& gpu) { return (gpus + gpu.gpus_per_node - 1) / gpu.gpus_per_node; }

std::vector<std::string> available_precisions(const RecommendOptions& options, bool tf32,
                                              std::vector<std::string>* unavailable) {
  std::vector<std::string> available;
  for (const std::string& precision : options.precisions) {
    try {
      resolve_precision(precision, "cuda", tf32);
      available.push_back(precision);
    } catch (const Error& error) {
      if (error.kind() != ErrorKind::config) throw;
      unavailable->push_back(precision);
    }
  }
  if (available.empty())
    throw Error(ErrorKind::config, "none of the precisions in --precisions is available in this build",
                "use --precisions bf16 (fp8 arrives with the precision recipes)");
  return available;
}

}  // namespace

Recommendation recommend(const RunConfig& config, const PlanTarget& target, const Calibration& calibration,
                         const RecommendOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  {
    // The micro-batch is searched: only the rest of the config must be valid.
    RunConfig checked = config;
    checked.train.micro_batch_size = 1;
    validate(checked);
  }
  const GpuSpec& gpu = require_gpu(target.gpu);
  Recommendation result;
  result.objective = options.objective;
  result.base = config;
  result.target = target;
  const std::vector<std::string> precisions =
      available_precisions(options, config.train.tf32, &result.unavailable_precisions);
  Search search(config, gpu, calibration, options);
  const int64_t seq = config.train.seq_len;
  const int64_t global = config.train.global_batch(target.gpus);
  const int nodes = target.nodes > 0 ? target.nodes : nodes_for(target.gpus, gpu);

  if (options.objective == "throughput") {
    if (global % target.gpus != 0)
      throw Error(ErrorKind::config,
                  strf("the global batch of %lld sequences does not split over %d GPUs", static_cast<long long>(global),
                       target.gpus),
                  "set train.global_batch_size (--global-batch) to a multiple of --gpus");
    result.ranked = search.at(target.gpus, nodes, seq, global, precisions);
  } else if (options.objective == "context") {
    const std::vector<Candidate> base = search.at(target.gpus, nodes, seq, global, precisions);
    if (!base.empty()) {
      const double threshold = options.useful_mfu_fraction * base.front().mfu;
      const double tokens_per_step = static_cast<double>(global) * static_cast<double>(seq);
      int64_t limit = options.max_seq_len;
      std::string limit_reason = "--max-seq";
      if (config.model.family == ModelFamily::gpt2 && config.model.max_seq_len < limit) {
        limit = config.model.max_seq_len;
        limit_reason = "model.max_seq_len, the learned position table";
      }
      if (config.model.sliding_window > 0 && config.model.sliding_window < limit) {  // validate(RunConfig)
        limit = config.model.sliding_window;
        limit_reason = "model.sliding_window: longer sequences would not be the checkpoint's attention";
      }
      auto at_length = [&](int64_t length) {
        int64_t sequences = static_cast<int64_t>(tokens_per_step / static_cast<double>(length));
        sequences = std::max<int64_t>(target.gpus, sequences / target.gpus * target.gpus);
        std::vector<Candidate> ranked = search.at(target.gpus, nodes, length, sequences, precisions);
        const bool useful = !ranked.empty() && ranked.front().mfu >= threshold;
        return std::make_pair(useful, ranked);
      };
      int64_t good = seq;
      std::vector<Candidate> good_ranked = base;
      int64_t bad = 0;
      for (int64_t length = seq * 2; length <= limit; length *= 2) {
        auto [useful, ranked] = at_length(length);
        if (!useful) {
          bad = length;
          break;
        }
        good = length;
        good_ranked = ranked;
      }
      // Between the last useful power of two and the first that is not: bisection on a grid of
      // 1/8 of the shorter length.
      const int64_t grain = std::max<int64_t>(64, good / 8);
      while (bad > 0 && bad - good > grain) {
        const int64_t mid = (good + bad) / 2 / grain * grain;
        if (mid <= good) break;
        auto [useful, ranked] = at_length(mid);
        if (useful) {
          good = mid;
          good_ranked = ranked;
        } else {
          bad = mid;
        }
      }
      result.ranked = good_ranked;
      result.explanation.push_back(strf("The longest sequence that fits at a useful throughput (MFU at least %.0f%% of "
                                        "the best at %lld tokens, i.e. %.1f%%) is %lld tokens%s.",
                                        100 * options.useful_mfu_fraction, static_cast<long long>(seq), 100 * threshold,
                                        static_cast<long long>(good),
                                        bad > 0 ? strf("; %lld tokens does not", static_cast<long long>(bad)).c_str()
                                                : strf(" (the search stops at %lld: %s)", static_cast<long long>(limit),
                                                       limit_reason.c_str())
                                                      .c_str()));
    }
  } else if (options.objective == "gpus") {
    if (options.target_tokens_per_s <= 0)
      throw Error(ErrorKind::config, "--objective gpus needs a throughput to reach",
                  "pass --target-tokens-per-s N (global tokens per second)");
    for (int gpus = 1; gpus <= options.max_gpus; gpus *= 2) {
      if (global % gpus != 0) continue;
      std::vector<Candidate> ranked = search.at(gpus, nodes_for(gpus, gpu), seq, global, precisions);
      if (!ranked.empty() && ranked.front().tokens_per_s >= options.target_tokens_per_s) {
        result.ranked = ranked;
        result.explanation.push_back(strf("%d GPU%s reach %s tokens/s, at least the target %s; %s.", gpus,
                                          gpus == 1 ? "" : "s", tokens_text(ranked.front().tokens_per_s).c_str(),
                                          tokens_text(options.target_tokens_per_s).c_str(),
                                          gpus == 1 ? "one GPU is the fewest possible"
                                                    : strf("%d do not", gpus / 2).c_str()));
        break;
      }
    }
    if (result.ranked.empty())
      result.explanation.push_back(strf("No GPU count up to %d (powers of two dividing the global batch of %lld) "
                                        "reaches %s tokens/s.",
                                        options.max_gpus, static_cast<long long>(global),
                                        tokens_text(options.target_tokens_per_s).c_str()));
  } else {
    throw Error(ErrorKind::config, "unknown objective '" + options.objective + "'", "use throughput, context or gpus");
  }

  result.evaluated = search.evaluated();
  result.dryruns = search.dryruns();
  if (!result.ranked.empty()) {
    result.found = true;
    result.best = result.ranked.front();
    if (static_cast<int>(result.ranked.size()) > options.top) result.ranked.resize(static_cast<size_t>(options.top));
    for (const std::string& sentence : explain_choice(result.best, result.evaluated, gpu, options.headroom))
      result.explanation.push_back(sentence);
    PlanOptions full;
    full.headroom = options.headroom;
    result.best_plan = make_plan(apply_candidate(config, result.best),
                                 PlanTarget{gpu.key, result.best.gpus, result.best.nodes}, calibration, full);
  } else if (options.objective != "gpus") {
    result.explanation.push_back(strf("Nothing fits with %.0f%% headroom on %d x %s, even micro-batch 1 with full "
                                      "checkpointing%s.",
                                      100 * options.headroom, target.gpus, gpu.key.c_str(),
                                      target.gpus > 1 ? " and full sharding" : ""));
    const Candidate* smallest = nullptr;
    for (const Candidate& c : result.evaluated)
      if (!smallest || c.total_bytes < smallest->total_bytes) smallest = &c;
    if (smallest)
      result.explanation.push_back(strf("The smallest footprint tried (%s) needs %s of %s: use more GPUs, a GPU with "
                                        "more memory, or a shorter sequence.",
                                        smallest->label().c_str(), gib(smallest->total_bytes).c_str(),
                                        gib(smallest->capacity_bytes).c_str()));
  }
  for (const std::string& precision : result.unavailable_precisions)
    result.explanation.push_back("Precision " + precision + " is not available in this build, so it was not searched.");
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

}  // namespace mxtrain
