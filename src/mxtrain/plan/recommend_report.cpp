// The recommendation in words and tables: the sentences explaining the winner against the
// alternatives the search evaluated, the ranked table, JSON, and the one-row Markdown summary.
#include <algorithm>
#include <cmath>
#include <functional>

#include "mxtrain/core/error.hpp"
#include "mxtrain/core/log.hpp"
#include "mxtrain/plan/recommend.hpp"

namespace mxtrain {
namespace {

std::string tokens_text(double tokens_per_s) { return log::with_commas(tokens_per_s); }
std::string gib(uint64_t bytes) { return gib_text(static_cast<double>(bytes)); }

const Candidate* best_where(const std::vector<Candidate>& candidates, const std::function<bool(const Candidate&)>& pred) {
  const Candidate* best = nullptr;
  for (const Candidate& c : candidates)
    if (c.fits_with_headroom && pred(c) && (!best || better_throughput(c, *best))) best = &c;
  return best;
}

double percent_faster(const Candidate& a, const Candidate& b) { return 100.0 * (a.tokens_per_s / b.tokens_per_s - 1.0); }

// "12%", or "0.4%" under 10%: small differences keep their digit.
std::string percent_text(double percent) {
  return std::fabs(percent) < 10 ? strf("%.1f%%", percent) : strf("%.0f%%", percent);
}

}  // namespace

std::vector<std::string> explain_choice(const Candidate& best, const std::vector<Candidate>& evaluated,
                                        const GpuSpec& gpu, double headroom) {
  std::vector<std::string> sentences;
  auto same_setup = [&](const Candidate& c) {
    return c.precision == best.precision && c.strategy == best.strategy && c.shard_group_size == best.shard_group_size &&
           c.seq_len == best.seq_len && c.gpus == best.gpus;
  };
  sentences.push_back(strf("Best: %s at %s tokens/s%s, using %s of %s per GPU (%.0f%% free).", best.label().c_str(),
                           tokens_text(best.tokens_per_s).c_str(),
                           best.mfu >= 0 ? strf(" (MFU %.1f%%)", 100 * best.mfu).c_str() : "",
                           gib(best.total_bytes).c_str(), gib(best.capacity_bytes).c_str(),
                           100.0 * (1.0 - static_cast<double>(best.total_bytes) / static_cast<double>(best.capacity_bytes))));

  // Activation checkpointing.
  const double recompute_share = best.step_s > 0 ? 100.0 * best.time.recompute_s / best.time.total_s : 0;
  if (best.recompute == "none") {
    sentences.push_back(strf("Activation checkpointing is off: every activation of micro-batch %lld fits, so no forward "
                             "work is repeated.",
                             static_cast<long long>(best.micro_batch)));
  } else {
    const Candidate* without = best_where(evaluated, [&](const Candidate& c) { return same_setup(c) && c.recompute == "none"; });
    if (!without) {
      const Candidate* smallest = nullptr;
      for (const Candidate& c : evaluated)
        if (same_setup(c) && c.recompute == "none" && (!smallest || c.micro_batch < smallest->micro_batch)) smallest = &c;
      if (smallest)
        sentences.push_back(strf("Checkpointing (%s) is on because without it not even micro-batch %lld fits: it would "
                                 "need %s of %s.",
                                 best.recompute.c_str(), static_cast<long long>(smallest->micro_batch),
                                 gib(smallest->total_bytes).c_str(), gib(smallest->capacity_bytes).c_str()));
    } else {
      sentences.push_back(strf("Checkpointing (%s) is on because it lets micro-batch %lld fit, where at most micro-batch "
                               "%lld fits without it; that is %s faster (%s vs %s tokens/s) although recomputing "
                               "takes %.0f%% of the step.",
                               best.recompute.c_str(), static_cast<long long>(best.micro_batch),
                               static_cast<long long>(without->micro_batch),
                               percent_text(percent_faster(best, *without)).c_str(),
                               tokens_text(best.tokens_per_s).c_str(), tokens_text(without->tokens_per_s).c_str(),
                               recompute_share));
    }
    if (best.recompute != "full") {
      const Candidate* full = best_where(evaluated, [&](const Candidate& c) {
        return same_setup(c) && c.recompute == "full" && c.micro_batch == best.micro_batch;
      });
      if (full)
        sentences.push_back(strf("It recomputes less than full checkpointing, which would also fit but is %s slower.",
                                 percent_text(percent_faster(best, *full)).c_str()));
    } else {
      for (const Candidate& c : evaluated)
        if (same_setup(c) && c.recompute == "selective" && c.micro_batch == best.micro_batch && !c.fits_with_headroom) {
          sentences.push_back(strf("Selective recompute is not enough at this micro-batch: it would need %s.",
                                   gib(c.total_bytes).c_str()));
          break;
        }
    }
  }

  // Micro-batch and accumulation.
  const Candidate* larger_fitting = nullptr;
  const Candidate* larger_failing = nullptr;
  for (const Candidate& c : evaluated) {
    if (!same_setup(c) || c.recompute != best.recompute || c.micro_batch <= best.micro_batch) continue;
    if (c.fits_with_headroom && (!larger_fitting || c.micro_batch < larger_fitting->micro_batch)) larger_fitting = &c;
    if (!c.fits_with_headroom && (!larger_failing || c.micro_batch < larger_failing->micro_batch)) larger_failing = &c;
  }
  if (larger_fitting)
    sentences.push_back(strf("Micro-batch %lld also fits but is not faster (%s tokens/s).",
                             static_cast<long long>(larger_fitting->micro_batch),
                             tokens_text(larger_fitting->tokens_per_s).c_str()));
  else if (larger_failing)
    sentences.push_back(strf("Micro-batch %lld is the largest that fits with %.0f%% headroom: %lld would need %s.",
                             static_cast<long long>(best.micro_batch), 100 * headroom,
                             static_cast<long long>(larger_failing->micro_batch), gib(larger_failing->total_bytes).c_str()));
  if (best.micro_batches > 1)
    sentences.push_back(strf("%lld micro-batches per step (gradient accumulation) keep the global batch at %lld sequences.",
                             static_cast<long long>(best.micro_batches), static_cast<long long>(best.global_batch)));

  // Sharding.
  if (best.gpus > 1) {
    auto with_strategy = [&](const char* strategy) {
      return best_where(evaluated, [&](const Candidate& c) {
        return c.strategy == strategy && c.precision == best.precision && c.seq_len == best.seq_len && c.gpus == best.gpus;
      });
    };
    const Candidate* unsharded = with_strategy("no_shard");
    if (best.strategy == "no_shard") {
      const Candidate* sharded = with_strategy("full_shard");
      sentences.push_back(strf("Sharding is not needed: unsharded model states take %s per GPU, which the %s's %s holds; "
                               "no_shard never re-gathers weights%s.",
                               gib(best.model_state_bytes).c_str(), gpu.key.c_str(), gib(best.capacity_bytes).c_str(),
                               sharded ? strf(" and is %s faster than full_shard",
                                              percent_text(percent_faster(best, *sharded)).c_str())
                                             .c_str()
                                       : ""));
    } else if (!unsharded) {
      sentences.push_back(strf("%s is needed: without sharding the model states alone do not leave room for a micro-batch "
                               "on the %s's %s.",
                               best.strategy.c_str(), gpu.key.c_str(), gib(best.capacity_bytes).c_str()));
    } else {
      sentences.push_back(strf("%s beats no_shard by %s: sharding frees memory for a larger micro-batch or less "
                               "recomputation.",
                               best.strategy.c_str(), percent_text(percent_faster(best, *unsharded)).c_str()));
    }
    if (best.strategy == "hybrid_shard")
      sentences.push_back(strf("hybrid_shard with groups of %lld gathers weights inside a group and only reduces gradients "
                               "across groups.",
                               static_cast<long long>(best.shard_group_size)));
  }

  // Precision: the best config of every other precision tried.
  std::vector<std::string> others;
  for (const Candidate& c : evaluated) {
    if (c.precision == best.precision || std::find(others.begin(), others.end(), c.precision) != others.end()) continue;
    others.push_back(c.precision);
  }
  std::string faster, tied, unfit;
  for (const std::string& precision : others) {
    const Candidate* other = best_where(evaluated, [&](const Candidate& x) { return x.precision == precision; });
    std::string& list = !other ? unfit : percent_faster(best, *other) < 0.1 ? tied : faster;
    if (!list.empty()) list += ", ";
    list += precision;
    if (other && &list == &faster) list += " by " + percent_text(percent_faster(best, *other));
  }
  if (!faster.empty()) sentences.push_back(strf("%s is faster here than %s.", best.precision.c_str(), faster.c_str()));
  if (!tied.empty())
    sentences.push_back(strf("%s is as fast (within 0.1%%; the smaller footprint wins the tie).", tied.c_str()));
  if (!unfit.empty()) sentences.push_back(strf("Nothing in %s fits with the headroom.", unfit.c_str()));

  const double total = best.time.total_s;
  if (total > 0)
    sentences.push_back(strf("Predicted step: GEMMs %.0f%%, attention %.0f%%, memory-bound ops %.0f%%, recompute %.0f%%, "
                             "optimizer %.0f%%, exposed communication %.0f%%.",
                             100 * best.time.gemm_s / total, 100 * best.time.attention_s / total,
                             100 * best.time.memory_bound_s / total, 100 * best.time.recompute_s / total,
                             100 * best.time.optimizer_s / total, 100 * best.time.communication_exposed_s / total));
  return sentences;
}
std::string recommendation_summary_header() {
  return "| model | GPUs | fits | recommended config | memory per GPU | predicted tokens/s | MFU |\n"
         "|---|---|---|---|---|---|---|\n";
}

std::string recommendation_summary_row(const Recommendation& r) {
  const GpuSpec& gpu = require_gpu(r.target.gpu);
  const std::string gpus = strf("%d x %s", r.found ? r.best.gpus : r.target.gpus, gpu.key.c_str());
  if (!r.found) {
    const Candidate* smallest = nullptr;
    for (const Candidate& c : r.evaluated)
      if (!smallest || c.total_bytes < smallest->total_bytes) smallest = &c;
    const std::string need = smallest ? strf("needs %.1f of %.1f GiB", static_cast<double>(smallest->total_bytes) / (1u << 30),
                                             static_cast<double>(smallest->capacity_bytes) / (1u << 30))
                                      : std::string("-");
    return strf("| %s | %s | no | - | %s | - | - |\n", r.base.model.preset.c_str(), gpus.c_str(), need.c_str());
  }
  const Candidate& b = r.best;
  std::string config = strf("micro-batch %lld x %lld, seq %lld, recompute %s, %s", static_cast<long long>(b.micro_batch),
                            static_cast<long long>(b.micro_batches), static_cast<long long>(b.seq_len),
                            b.recompute.c_str(), b.precision.c_str());
  if (b.gpus > 1) {
    config += ", " + b.strategy;
    if (b.strategy == "hybrid_shard") config += strf(" (groups of %lld)", static_cast<long long>(b.shard_group_size));
  }
  return strf("| %s | %s | yes | %s | %.1f of %.1f GiB | %s | %.1f%% |\n", r.base.model.preset.c_str(), gpus.c_str(),
              config.c_str(), static_cast<double>(b.total_bytes) / (1u << 30),
              static_cast<double>(b.capacity_bytes) / (1u << 30), tokens_text(b.tokens_per_s).c_str(), 100 * b.mfu);
}

nlohmann::json candidate_json(const Candidate& c) {
  return {{"micro_batch", c.micro_batch},
          {"micro_batches", c.micro_batches},
          {"global_batch", c.global_batch},
          {"seq_len", c.seq_len},
          {"recompute", c.recompute},
          {"precision", c.precision},
          {"strategy", c.strategy},
          {"shard_group_size", c.shard_group_size},
          {"gpus", c.gpus},
          {"nodes", c.nodes},
          {"fits", c.fits},
          {"fits_with_headroom", c.fits_with_headroom},
          {"total_bytes", c.total_bytes},
          {"capacity_bytes", c.capacity_bytes},
          {"tokens_per_s", c.tokens_per_s},
          {"tokens_per_s_per_gpu", c.tokens_per_s_per_gpu},
          {"mfu", c.mfu},
          {"step_s", c.step_s}};
}

nlohmann::json recommendation_json(const Recommendation& r) {
  nlohmann::json ranked = nlohmann::json::array();
  for (const Candidate& c : r.ranked) ranked.push_back(candidate_json(c));
  nlohmann::json json = {{"kind", "recommendation"},
                         {"objective", r.objective},
                         {"model", r.base.model.preset},
                         {"gpu", r.target.gpu},
                         {"found", r.found},
                         {"ranked", ranked},
                         {"explanation", r.explanation},
                         {"candidates_evaluated", r.evaluated.size()},
                         {"dryruns", r.dryruns},
                         {"seconds", r.seconds}};
  if (r.found) {
    json["best"] = candidate_json(r.best);
    json["best_plan"] = plan_json(r.best_plan);
  }
  return json;
}

std::string format_recommendation(const Recommendation& r) {
  std::string out = strf("mxtrain plan --recommend (%s): %s on %d x %s\n\n", r.objective.c_str(),
                         r.base.model.preset.c_str(), r.found ? r.best.gpus : r.target.gpus, r.target.gpu.c_str());
  if (!r.ranked.empty()) {
    out += strf("  %-4s %-6s %-6s %-8s %-10s %-6s %-22s %-20s %14s %7s %9s\n", "rank", "micro", "accum", "seq",
                "recompute", "prec", "sharding", "memory / capacity", "tokens/s", "MFU", "step ms");
    int rank = 1;
    for (const Candidate& c : r.ranked) {
      std::string sharding = c.gpus == 1 ? "-" : c.strategy;
      if (c.strategy == "hybrid_shard") sharding += strf("/%lld", static_cast<long long>(c.shard_group_size));
      out += strf("  %-4d %-6lld %-6lld %-8lld %-10s %-6s %-22s %-20s %14s %6.1f%% %9.1f\n", rank++,
                  static_cast<long long>(c.micro_batch), static_cast<long long>(c.micro_batches),
                  static_cast<long long>(c.seq_len), c.recompute.c_str(), c.precision.c_str(), sharding.c_str(),
                  (gib(c.total_bytes) + " / " + strf("%.0f", static_cast<double>(c.capacity_bytes) / (1u << 30))).c_str(),
                  tokens_text(c.tokens_per_s).c_str(), 100 * c.mfu, 1e3 * c.step_s);
    }
    out += "\n";
  }
  for (const std::string& sentence : r.explanation) {
    out += "  ";
    out += sentence;
    out += "\n";
  }
  out += strf("\n  %zu configs evaluated in %.2f s\n", r.evaluated.size(), r.seconds);
  if (r.found) {
    out += "\n";
    out += format_plan(r.best_plan);
  }
  return out;
}

}  // namespace mxtrain
