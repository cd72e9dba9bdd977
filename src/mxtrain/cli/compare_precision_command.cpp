#include <CLI/CLI.hpp>
#include <cstdio>
#include <memory>

#include "mxtrain/build_info.hpp"
#include "mxtrain/cli/commands.hpp"
#include "mxtrain/cli/flags.hpp"
#include "mxtrain/config/loader.hpp"
#include "mxtrain/core/error.hpp"
#include "mxtrain/core/log.hpp"
#include "mxtrain/plan/precision_comparison.hpp"

namespace mxtrain::cli {

void add_compare_precision_command(CLI::App& app) {
  CLI::App* command = app.add_subcommand(
      "compare-precision",
      "train one config once per precision format (same data, seed and schedule) and write the loss curves as CSV, "
      "JSON and an SVG plot, with each format's final-loss gap to bf16 (or fp32, or the first format)");
  auto arguments = std::make_shared<ConfigArguments>();
  auto formats = std::make_shared<std::string>("bf16,fp8,mxfp8,nvfp4");
  add_config_arguments(*command, *arguments, train_flags());
  command->add_option("--formats", *formats, "comma-separated train.precision names")->capture_default_str();
  command->callback([arguments, formats] {
    ConfigSources sources;
    sources.toml_path = arguments->config_path;
    sources.overrides = overrides(*arguments);
    RunConfig config = load_run_config(sources);
    PrecisionComparisonOptions options;
    options.formats = parse_precision_list(*formats);
    options.source_dir = MXTRAIN_SOURCE_DIR;
    options.output_dir = config.checkpoint.dir.empty() ? "runs/compare-precision-" + config.model.preset
                                                       : config.checkpoint.dir;
    options.log_every = config.log.every > 1 ? config.log.every : 50;
    const PrecisionComparison comparison = compare_precisions(config, options);
    for (const FormatCurve& curve : comparison.curves) {
      const std::string gap = curve.format == comparison.baseline ? std::string("baseline")
                                                                  : strf("%+.2f%% vs %s", 100 * curve.gap,
                                                                         comparison.baseline.c_str());
      const std::string held_out =
          curve.val_loss < 0 ? std::string()
          : curve.format == comparison.baseline
              ? strf(" | held-out %.4f", curve.val_loss)
              : strf(" | held-out %.4f (%+.2f%%)", curve.val_loss, 100 * curve.val_gap);
      log::info(strf("%-12s final loss %.4f (mean of the last %lld steps) | %s%s | %s tok/s%s", curve.format.c_str(),
                     curve.final_loss, static_cast<long long>(comparison.final_window), gap.c_str(), held_out.c_str(),
                     log::with_commas(curve.tokens_per_s).c_str(),
                     curve.skipped_steps ? strf(" | %lld steps skipped", static_cast<long long>(curve.skipped_steps)).c_str()
                                         : ""));
    }
    log::info("loss curves: " + comparison.csv_path + ", " + comparison.json_path + ", " + comparison.svg_path);
  });
}

}  // namespace mxtrain::cli
