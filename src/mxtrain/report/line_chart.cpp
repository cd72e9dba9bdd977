#include "mxtrain/report/line_chart.hpp"

#include <algorithm>
#include <cmath>
#include <set>

#include "mxtrain/core/error.hpp"
#include "mxtrain/report/svg_chart.hpp"

namespace mxtrain {

namespace {

std::string default_tick(double value) { return strf("%g", value); }

std::string svg_open(double width, double height) {
  return strf("<svg xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 %.0f %.0f\" width=\"%.0f\" height=\"%.0f\" "
              "font-family=\"sans-serif\" role=\"img\">\n",
              width, height, width, height);
}

}  // namespace

std::vector<double> nice_ticks(double low, double high, int target_count) {
  if (!std::isfinite(low) || !std::isfinite(high)) return {0, 1};
  if (high < low) std::swap(low, high);
  if (high == low) {
    const double pad = low == 0 ? 1 : std::fabs(low) * 0.1;
    low -= pad;
    high += pad;
  }
  const double rough = (high - low) / std::max(target_count, 1);
  const double power = std::pow(10.0, std::floor(std::log10(rough)));
  double step = 10 * power;
  for (double factor : {1.0, 2.0, 5.0, 10.0})
    if (factor * power >= rough) {
      step = factor * power;
      break;
    }
  std::vector<double> ticks;
  const double first = std::floor(low / step + 1e-9) * step;
  for (double value = first; ticks.size() < 100; value += step) {
    ticks.push_back(std::fabs(value) < step * 1e-9 ? 0.0 : value);
    if (value >= high - step * 1e-9 && ticks.size() >= 2) break;
  }
  return ticks;
}

std::string render_line_chart_svg(const LineChartSpec& chart) {
  const auto tick_text = chart.y_tick ? chart.y_tick : default_tick;
  const double left = 78, right = chart.width - 20, top = 34, bottom = chart.height - 42;
  double x_low = INFINITY, x_high = -INFINITY, y_low = INFINITY, y_high = -INFINITY;
  for (const LineSeries& series : chart.series)
    for (const auto& [x, y] : series.points) {
      if (!std::isfinite(y)) continue;
      x_low = std::min(x_low, x);
      x_high = std::max(x_high, x);
      y_low = std::min(y_low, y);
      y_high = std::max(y_high, y);
    }
  std::string svg = svg_open(chart.width, chart.height);
  svg += strf("<text x=\"%.1f\" y=\"18\" font-size=\"14\" font-weight=\"bold\">%s</text>\n", left,
              svg_escape(chart.title).c_str());
  if (!std::isfinite(x_low)) {
    svg += strf("<text x=\"%.1f\" y=\"%.1f\" font-size=\"13\" fill=\"#666\">no data</text>\n</svg>\n", left,
                (top + bottom) / 2);
    return svg;
  }
  if (chart.y_from_zero) y_low = std::min(0.0, y_low);
  const std::vector<double> y_ticks = nice_ticks(y_low, y_high);
  const std::vector<double> x_ticks = nice_ticks(std::min(0.0, x_low), x_high, 8);
  const double y0 = y_ticks.front(), y1 = y_ticks.back(), x0 = x_ticks.front(), x1 = x_ticks.back();
  auto px = [&](double x) { return left + (right - left) * (x - x0) / (x1 - x0); };
  auto py = [&](double y) { return bottom - (bottom - top) * (y - y0) / (y1 - y0); };

  for (double value : y_ticks) {
    svg += strf("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#e3e3e3\"/>\n", left, py(value), right,
                py(value));
    svg += strf("<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\" fill=\"#444\" text-anchor=\"end\">%s</text>\n", left - 6,
                py(value) + 4, svg_escape(tick_text(value)).c_str());
  }
  for (double value : x_ticks)
    svg += strf("<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\" fill=\"#444\" text-anchor=\"middle\">%s</text>\n",
                px(value), bottom + 16, svg_escape(default_tick(value)).c_str());
  svg += strf("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#888\"/>\n", left, bottom, right, bottom);
  svg += strf("<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\" fill=\"#444\" text-anchor=\"middle\">%s</text>\n",
              (left + right) / 2, bottom + 34, svg_escape(chart.x_label).c_str());

  double legend_x = right;
  for (auto it = chart.series.rbegin(); it != chart.series.rend(); ++it) {
    const LineSeries& series = *it;
    const double text_width = 7.0 * static_cast<double>(series.name.size());
    legend_x -= text_width + 30;
    svg += strf("<rect x=\"%.1f\" y=\"10\" width=\"14\" height=\"4\" fill=\"%s\"/>\n", legend_x, series.color.c_str());
    svg += strf("<text x=\"%.1f\" y=\"16\" font-size=\"12\">%s</text>\n", legend_x + 18,
                svg_escape(series.name).c_str());
  }
  for (const LineSeries& series : chart.series) {
    std::string path;
    int count = 0;
    for (const auto& [x, y] : series.points) {
      if (!std::isfinite(y)) continue;  // a gap would hide where a non-finite value was: warnings list it
      path += strf("%s%.1f,%.1f", path.empty() ? "" : " ", px(x), py(y));
      ++count;
    }
    svg += strf("<polyline class=\"series\" data-name=\"%s\" data-points=\"%d\" fill=\"none\" stroke=\"%s\" "
                "stroke-width=\"1.6\" stroke-linejoin=\"round\" points=\"%s\"/>\n",
                svg_escape(series.name).c_str(), count, series.color.c_str(), path.c_str());
    if (series.markers)
      for (const auto& [x, y] : series.points)
        if (std::isfinite(y))
          svg += strf("<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"/>\n", px(x), py(y), series.color.c_str());
  }
  svg += "</svg>\n";
  return svg;
}

std::string render_bar_chart_svg(const BarChartSpec& chart) {
  const auto tick_text = chart.x_tick ? chart.x_tick : default_tick;
  const double left = 200, right = chart.width - 130, row_height = 30, top = 52;
  std::set<std::string> seen;
  std::vector<const BarSegment*> legend;
  double maximum = chart.marker;
  for (const BarRow& row : chart.rows) {
    double total = 0;
    for (const BarSegment& segment : row.segments) {
      total += segment.value;
      if (!segment.name.empty() && seen.insert(segment.name).second) legend.push_back(&segment);
    }
    maximum = std::max(maximum, total);
  }
  const std::vector<double> ticks = nice_ticks(0, maximum > 0 ? maximum : 1);
  const double x1 = ticks.back();
  auto px = [&](double x) { return left + (right - left) * x / x1; };
  const double bottom = top + row_height * static_cast<double>(chart.rows.size());
  const double height = bottom + 30;
  std::string svg = svg_open(chart.width, height);
  svg += strf("<text x=\"10\" y=\"18\" font-size=\"14\" font-weight=\"bold\">%s</text>\n",
              svg_escape(chart.title).c_str());
  double legend_x = 10;
  for (const BarSegment* segment : legend) {
    svg += strf("<rect x=\"%.1f\" y=\"28\" width=\"12\" height=\"12\" fill=\"%s\"/>\n", legend_x, segment->color.c_str());
    svg += strf("<text x=\"%.1f\" y=\"38\" font-size=\"12\">%s</text>\n", legend_x + 16,
                svg_escape(segment->name).c_str());
    legend_x += 16 + 7.0 * static_cast<double>(segment->name.size()) + 16;
  }
  for (double value : ticks) {
    svg += strf("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#e3e3e3\"/>\n", px(value), top - 4,
                px(value), bottom);
    svg += strf("<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\" fill=\"#444\" text-anchor=\"middle\">%s</text>\n",
                px(value), bottom + 16, svg_escape(tick_text(value)).c_str());
  }
  for (size_t i = 0; i < chart.rows.size(); ++i) {
    const BarRow& row = chart.rows[i];
    const double y = top + row_height * static_cast<double>(i);
    svg += strf("<text x=\"%.1f\" y=\"%.1f\" font-size=\"12\" text-anchor=\"end\">%s</text>\n", left - 8,
                y + row_height / 2 + 4, svg_escape(row.label).c_str());
    double x = 0;
    for (const BarSegment& segment : row.segments) {
      if (segment.value <= 0) continue;
      if (row.outline)
        svg += strf("<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" stroke=\"%s\" "
                    "stroke-width=\"2\" stroke-dasharray=\"5,3\"/>\n",
                    px(x), y + 5, px(x + segment.value) - px(x), row_height - 10, segment.color.c_str());
      else
        svg += strf("<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"%s\"/>\n", px(x), y + 5,
                    px(x + segment.value) - px(x), row_height - 10, segment.color.c_str());
      x += segment.value;
    }
    svg += strf("<text x=\"%.1f\" y=\"%.1f\" font-size=\"12\" fill=\"#222\">%s</text>\n", px(x) + 6,
                y + row_height / 2 + 4, svg_escape(row.value_text).c_str());
  }
  if (chart.marker > 0) {
    svg += strf("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#c0392b\" stroke-dasharray=\"6,4\" "
                "stroke-width=\"1.5\"/>\n",
                px(chart.marker), top - 8, px(chart.marker), bottom);
    svg += strf("<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\" fill=\"#c0392b\" text-anchor=\"middle\">%s</text>\n",
                px(chart.marker), top - 11, svg_escape(chart.marker_label).c_str());
  }
  svg += "</svg>\n";
  return svg;
}

}  // namespace mxtrain
