#include "mxtrain/report/svg_chart.hpp"

#include <algorithm>
#include <cmath>
#include <functional>

#include "mxtrain/core/error.hpp"
#include "mxtrain/core/log.hpp"

namespace mxtrain {

std::string svg_escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default: out += c;
    }
  }
  return out;
}

namespace {

// A "nice" axis maximum: 1, 2 or 5 times a power of ten, at least `value`.
double nice_ceiling(double value) {
  if (value <= 0) return 1;
  const double power = std::pow(10.0, std::floor(std::log10(value)));
  for (double step : {1.0, 2.0, 5.0, 10.0})
    if (step * power >= value) return step * power;
  return 10 * power;
}

struct Panel {
  double top, height;  // pixels
  double maximum;      // axis maximum
  double y(double value) const { return top + height - height * std::min(value, maximum) / maximum; }
};

void axis(std::string& svg, const Panel& panel, double left, double right, const std::string& title,
          const std::function<std::string(double)>& tick_text) {
  for (int i = 0; i <= 4; ++i) {
    const double value = panel.maximum * i / 4;
    const double y = panel.y(value);
    svg += strf("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", left, y, right, y);
    svg += strf("<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\" text-anchor=\"end\">%s</text>\n", left - 6, y + 4,
                svg_escape(tick_text(value)).c_str());
  }
  svg += strf("<text x=\"%.1f\" y=\"%.1f\" font-size=\"12\" font-weight=\"bold\">%s</text>\n", left,
              panel.top - 10, svg_escape(title).c_str());
}

}  // namespace

std::string render_chart_svg(const ChartSpec& chart) {
  const double slot = 84, left = 90, right_margin = 70;
  const double width = left + slot * static_cast<double>(std::max<size_t>(chart.bars.size(), 1)) + right_margin;
  const Panel speed{60, 260, 0};
  const Panel memory_panel{380, 160, 0};
  const double label_top = memory_panel.top + memory_panel.height + 12;
  const double height = label_top + 150;

  double max_speed = 0, max_memory = chart.capacity_gib;
  for (const ChartBar& bar : chart.bars) {
    max_speed = std::max({max_speed, bar.measured_tokens_per_s, bar.predicted_tokens_per_s});
    max_memory = std::max({max_memory, bar.peak_gib, bar.predicted_peak_gib});
  }
  Panel throughput = speed;
  throughput.maximum = nice_ceiling(max_speed * 1.05);
  Panel memory = memory_panel;
  memory.maximum = nice_ceiling(max_memory * 1.05);

  std::string svg = strf("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
                         "font-family=\"sans-serif\">\n",
                         width, height);
  svg += strf("<rect width=\"%.0f\" height=\"%.0f\" fill=\"white\"/>\n", width, height);
  svg += strf("<text x=\"%.1f\" y=\"24\" font-size=\"15\" font-weight=\"bold\">%s</text>\n", left,
              svg_escape(chart.title).c_str());
  const double right = width - right_margin + 40;
  axis(svg, throughput, left, right, "throughput (tokens/s): measured (filled), predicted (outline); best in green",
       [](double v) { return log::with_commas(v); });
  axis(svg, memory, left, right, "peak memory (GiB): measured (filled), predicted (outline)",
       [](double v) { return strf("%.0f", v); });
  if (chart.capacity_gib > 0) {
    const double y = memory.y(chart.capacity_gib);
    svg += strf("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#c00\" stroke-dasharray=\"6,4\"/>\n",
                left, y, right, y);
    svg += strf("<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\" fill=\"#c00\" text-anchor=\"end\">capacity %.0f GiB</text>\n",
                right, y - 4, chart.capacity_gib);
  }

  for (size_t i = 0; i < chart.bars.size(); ++i) {
    const ChartBar& bar = chart.bars[i];
    const double x = left + slot * static_cast<double>(i) + 12;
    const double bar_width = slot - 24;
    const char* fill = bar.best ? "#2a9d4a" : "#4a78c2";
    auto bars = [&](const Panel& panel, double measured, double predicted) {
      if (measured >= 0) {
        const double y = panel.y(measured);
        svg += strf("<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"%s\"/>\n", x, y, bar_width,
                    panel.top + panel.height - y, fill);
      }
      if (predicted > 0) {
        const double y = panel.y(predicted);
        svg += strf("<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" stroke=\"#222\" "
                    "stroke-dasharray=\"3,2\"/>\n",
                    x + 4, y, bar_width - 8, panel.top + panel.height - y);
      }
    };
    bars(throughput, bar.measured_tokens_per_s, bar.predicted_tokens_per_s);
    bars(memory, bar.peak_gib, bar.predicted_peak_gib);
    if (!bar.note.empty())
      svg += strf("<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\" fill=\"#c00\" text-anchor=\"middle\">%s</text>\n",
                  x + bar_width / 2, throughput.top + throughput.height - 6, svg_escape(bar.note).c_str());
    svg += strf("<text transform=\"translate(%.1f,%.1f) rotate(40)\" font-size=\"11\">%s</text>\n", x + bar_width / 2,
                label_top, svg_escape(bar.label).c_str());
  }
  svg += "</svg>\n";
  return svg;
}

}  // namespace mxtrain
