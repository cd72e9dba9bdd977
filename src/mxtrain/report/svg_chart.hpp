// A hand-written SVG bar chart (no dependencies): one group of bars per config — measured
// throughput (filled), predicted throughput (outlined) — and a second panel with peak memory
// against the GPU's capacity. `mxtrain tune` writes it next to its JSON and CSV.
#pragma once
#include <string>
#include <vector>

namespace mxtrain {

struct ChartBar {
  std::string label;               // config, e.g. "mb 8 | selective"
  double measured_tokens_per_s = -1;  // < 0: not measured (did not fit, or not run)
  double predicted_tokens_per_s = 0;
  double peak_gib = -1;            // measured peak (< 0: not measured)
  double predicted_peak_gib = 0;
  bool best = false;
  std::string note;                // "does not fit"
};

struct ChartSpec {
  std::string title;
  double capacity_gib = 0;  // a line in the memory panel (0 = none)
  std::vector<ChartBar> bars;
};

std::string render_chart_svg(const ChartSpec& chart);
// Escapes &, <, > and quotes for SVG text and attributes.
std::string svg_escape(const std::string& text);

}  // namespace mxtrain
