#include "plan/svg_plot.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace sy::plan {

// SVG is plain text: a hand-written emitter is shorter than binding a plotting library.
std::string PlotParetoSvg(const Plan& plan, const HardwareSpec& hw, const std::string& title) {
  const double width = 800, height = 520, left = 80, right = 150, top = 40, bottom = 60;
  double max_speed = 1, min_tp = 1e30, max_tp = 1;
  for (const auto& f : plan.pareto)
    for (const auto* p : f.points) {
      const double machine = p->throughput_tok_s_per_gpu * hw.devices_per_node;
      max_speed = std::max(max_speed, p->output_tok_s);
      min_tp = std::min(min_tp, machine);
      max_tp = std::max(max_tp, machine);
    }
  if (min_tp > max_tp) min_tp = 1;
  const double y_low = std::pow(10, std::floor(std::log10(std::max(min_tp, 1e-3))));
  const double y_high = std::pow(10, std::ceil(std::log10(max_tp)));
  const double x_high = std::ceil(max_speed / 20) * 20;
  auto X = [&](double s) { return left + s / x_high * (width - left - right); };
  auto Y = [&](double t) {
    return top +
           (1 - (std::log10(t) - std::log10(y_low)) / (std::log10(y_high) - std::log10(y_low))) *
               (height - top - bottom);
  };
  std::string svg = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" "
      "font-family=\"sans-serif\" "
      "font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      "<text x=\"{}\" y=\"24\" font-size=\"15\">{}</text>\n",
      width, height, left, title);
  // Axes, ticks and grid.
  svg += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\" stroke=\"black\"/>\n", left,
                     height - bottom, width - right);
  svg += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\" stroke=\"black\"/>\n", left,
                     top, height - bottom);
  for (double s = 0; s <= x_high + 1e-9; s += x_high / 10) {
    svg += fmt::format(
        "<line x1=\"{0:.1f}\" y1=\"{1}\" x2=\"{0:.1f}\" y2=\"{2}\" stroke=\"#ddd\"/>"
        "<text x=\"{0:.1f}\" y=\"{3}\" text-anchor=\"middle\">{4:.0f}</text>\n",
        X(s), top, height - bottom, height - bottom + 16, s);
  }
  for (double t = y_low; t <= y_high * 1.0001; t *= 10) {
    svg += fmt::format(
        "<line x1=\"{0}\" y1=\"{1:.1f}\" x2=\"{2}\" y2=\"{1:.1f}\" stroke=\"#ddd\"/>"
        "<text x=\"{3}\" y=\"{4:.1f}\" text-anchor=\"end\">{5:g}</text>\n",
        left, Y(t), width - right, left - 6, Y(t) + 4, t);
  }
  svg += fmt::format(
      "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">output speed per request (tok/s)</text>\n",
      (left + width - right) / 2, height - 18);
  svg += fmt::format(
      "<text transform=\"translate(18,{}) rotate(-90)\" text-anchor=\"middle\">throughput per "
      "machine of {} (tok/s, log)</text>\n",
      (top + height - bottom) / 2, hw.devices_per_node);
  static const char* kColors[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728",
                                  "#9467bd", "#8c564b", "#e377c2"};
  int index = 0;
  for (const auto& f : plan.pareto) {
    const char* color = kColors[index % 7];
    std::string points;
    for (const auto* p : f.points)
      points += fmt::format("{:.1f},{:.1f} ", X(p->output_tok_s),
                            Y(p->throughput_tok_s_per_gpu * hw.devices_per_node));
    if (!points.empty()) {
      svg +=
          fmt::format("<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"2\" points=\"{}\"/>\n",
                      color, points);
      for (const auto* p : f.points)
        svg += fmt::format(
            "<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3\" fill=\"{}\"><title>EP{} TP{} batch {} {}: "
            "{:.1f} tok/s, {:.0f} tok/s/machine</title></circle>\n",
            X(p->output_tok_s), Y(p->throughput_tok_s_per_gpu * hw.devices_per_node), color, f.ep,
            p->deployment.tp, p->deployment.batch, OverlapName(p->deployment.overlap),
            p->output_tok_s, p->throughput_tok_s_per_gpu * hw.devices_per_node);
    }
    const double ly = top + 20 + 20 * index;
    svg += fmt::format(
        "<line x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\" stroke=\"{3}\" stroke-width=\"2\"/>"
        "<text x=\"{4}\" y=\"{5}\">EP{6}{7}</text>\n",
        width - right + 15, ly, width - right + 40, color, width - right + 46, ly + 4, f.ep,
        f.points.empty() ? " (no fit)" : "");
    ++index;
  }
  svg += "</svg>\n";
  return svg;
}

}  // namespace sy::plan
