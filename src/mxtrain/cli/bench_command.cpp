#include <CLI/CLI.hpp>
#include <cstdio>
#include <fstream>
#include <memory>

#include "mxtrain/cli/bounds.hpp"
#include "mxtrain/cli/commands.hpp"
#include "mxtrain/cli/flags.hpp"
#include "mxtrain/config/loader.hpp"
#include "mxtrain/core/error.hpp"
#include "mxtrain/core/host_memory.hpp"
#include "mxtrain/core/log.hpp"
#include "mxtrain/plan/memory_check.hpp"
#include "mxtrain/train/benchmark.hpp"
#include "mxtrain/train/metrics.hpp"
#include "mxtrain/train/session.hpp"

namespace mxtrain::cli {

void add_bench_command(CLI::App& app) {
  CLI::App* command = app.add_subcommand(
      "bench", "measure training throughput of a config on random tokens: warm-up, then timed steps; prints and "
               "writes JSON (tokens/s, step ms, TFLOP/s, MFU, peak and reserved memory, GPU, commit)");
  auto arguments = std::make_shared<ConfigArguments>();
  auto options = std::make_shared<BenchmarkOptions>();
  auto json_path = std::make_shared<std::string>();
  add_config_arguments(*command, *arguments, train_flags());
  command->add_option("--warmup", options->warmup_steps, "untimed steps first")->capture_default_str()->check(integer_range(0, 1000000));
  command->add_option("--timed", options->timed_steps, "timed steps")->capture_default_str()->check(integer_range(1, 1000000));
  command->add_option("--json", *json_path, "append the result as one JSON line to this file");
  command->callback([arguments, options, json_path] {
    ConfigSources sources;
    sources.toml_path = arguments->config_path;
    sources.overrides = overrides(*arguments);
    RunConfig config = load_run_config(sources);
    // As train: a CPU benchmark that the host cannot hold stops before allocating.
    if (resolve_device(config.train.device) == "cpu") check_cpu_training_memory(config, 1, 1, host_available_bytes());
    BenchmarkResult result = run_benchmark(config, *options);
    nlohmann::json json = benchmark_json(config, *options, result);
    std::printf("%s\n", json.dump().c_str());
    if (!json_path->empty()) {
      std::ofstream out(*json_path, std::ios::app);
      if (!out) throw Error(ErrorKind::system, "cannot write " + *json_path, "check the path");
      out << json.dump() << '\n';
    }
    if (!result.fits) throw Error(ErrorKind::out_of_memory, result.error.substr(result.error.find(": ") + 2),
                                  "see the advice above; `mxtrain plan` shows what fits");
    std::string mfu = result.mfu >= 0 ? strf(" | MFU %.1f%%", 100 * result.mfu) : "";
    log::info(strf("bench %s %lldx%lld %s: %.1f ms/step | %s tok/s | %.1f TFLOP/s%s | peak %s | reserved %s",
                   config.model.preset.c_str(), static_cast<long long>(config.train.micro_batch_size),
                   static_cast<long long>(config.train.seq_len), result.precision.c_str(), result.step_ms,
                   log::with_commas(result.tokens_per_s).c_str(), result.tflops, mfu.c_str(),
                   format_bytes(result.peak_bytes).c_str(), format_bytes(result.reserved_bytes).c_str()));
  });
}

}  // namespace mxtrain::cli
