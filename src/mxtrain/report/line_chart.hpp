// Hand-written SVG for the run report (no dependencies, no scripts): a line chart of series over
// training steps, and a horizontal bar chart whose rows may be stacked segments (the planner's
// step-time split) with an optional vertical marker (a GPU's capacity). Axes use "nice" ticks
// (1, 2 or 5 times a power of ten) over the data's own range, so a loss that falls from 5.5 to
// 2.0 fills the panel instead of hugging its top.
#pragma once
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace mxtrain {

struct LineSeries {
  std::string name;
  std::string color;                              // CSS color
  std::vector<std::pair<double, double>> points;  // (step, value), in step order
  bool markers = false;                           // a dot at each point (sparse series: held-out loss)
};

struct LineChartSpec {
  std::string title;
  std::string x_label = "step";
  std::vector<LineSeries> series;
  std::function<std::string(double)> y_tick;  // tick text; "%g" when empty
  bool y_from_zero = false;                   // the axis starts at 0 (throughput) or at the data (loss)
  double width = 880, height = 300;
};

std::string render_line_chart_svg(const LineChartSpec& chart);

struct BarSegment {
  double value = 0;
  std::string color;
  std::string name;  // in the legend (segments of the same name share an entry)
};

struct BarRow {
  std::string label;
  std::vector<BarSegment> segments;  // stacked left to right
  std::string value_text;            // written after the bar
  bool outline = false;              // drawn as a dashed outline (a prediction) rather than filled
};

struct BarChartSpec {
  std::string title;
  std::vector<BarRow> rows;
  std::function<std::string(double)> x_tick;
  double marker = 0;  // a dashed vertical line at this value (0: none)
  std::string marker_label;
  double width = 880;
};

std::string render_bar_chart_svg(const BarChartSpec& chart);

// Ticks covering [low, high]: a "nice" step and the values from the first multiple at or below
// `low` to the first at or above `high` (at least two).
std::vector<double> nice_ticks(double low, double high, int target_count = 5);

}  // namespace mxtrain
