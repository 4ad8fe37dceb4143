// What the example programs show while they train: a progress bar with a
// smoothed step rate, and an SVG line plot. Not part of the library.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

namespace report {

// On a terminal: one line redrawn in place (at most every 100 ms), and a
// permanent line per epoch. Otherwise: the permanent lines only.
//
// The step rate is smoothed: an exponentially weighted average of steps over
// time with a 1 s time constant, so that epochs of a few milliseconds (the
// autoencoder's 10 steps) do not make it jump; the first epoch's rate
// includes the first pass's allocations.
class Progress {
 public:
  // A permanent line every `every` epochs (and for the first and the last).
  explicit Progress(int epochs, int every = 1) : epochs_(epochs), every_(every < 1 ? 1 : every) {}

  // After every step: its loss (drawn on the live line only).
  void step(int epoch, double loss) {
    const auto now = clock::now();
    const double dt = std::chrono::duration<double>(now - last_).count();
    last_ = now;
    const double keep = std::exp(-dt / 1.0);
    steps_ = steps_ * keep + 1.0;
    seconds_ = seconds_ * keep + dt;
    if (tty_ && now - drawn_ > std::chrono::milliseconds(100)) {
      drawn_ = now;
      constexpr int width = 30;
      const int filled = epochs_ > 0 ? std::min(width, width * (epoch - 1) / epochs_) : width;
      std::printf("\r epoch %4d/%d [%.*s%.*s] loss %.3e  %7.0f steps/s\033[K", epoch, epochs_, filled,
                  "##############################", width - filled, "------------------------------", loss, rate());
      std::fflush(stdout);
    }
  }
  // A permanent line for a finished epoch: "epoch k/N <text> <rate> steps/s".
  void epoch_done(int epoch, const std::string& text) {
    if (epoch != 1 && epoch != epochs_ && epoch % every_ != 0) return;
    std::printf("%sepoch %3d/%d %s  %.0f steps/s\n", tty_ ? "\r\033[K" : "", epoch, epochs_, text.c_str(), rate());
    std::fflush(stdout);
  }
  // Steps per second, smoothed as the header says.
  double rate() const { return seconds_ > 0 ? steps_ / seconds_ : 0.0; }
  // Call before each epoch's first step so the time between epochs (evaluation) is not counted.
  void resume() { last_ = clock::now(); }

 private:
  using clock = std::chrono::steady_clock;
  bool tty_ = isatty(fileno(stdout)) == 1;
  int epochs_, every_;
  double steps_ = 0, seconds_ = 0;
  clock::time_point last_ = clock::now(), drawn_ = clock::now();
};

struct Series {
  std::string name, color;
  std::vector<double> x, y;
};
struct Reference {  // a dashed horizontal line
  double y;
  std::string label;
};
struct Plot {
  std::string title, x_label, y_label;
  bool log_y = false;  // one grid line per decade
  std::vector<Series> series;
  std::vector<Reference> references;
};

// Writes `plot` as a 760 x 440 SVG file; false when the file cannot be written.
inline bool write_svg(const std::string& path, const Plot& plot) {
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (!f) return false;
  const double W = 760, H = 440, left = 86, right = 24, top = 48, bottom = 56;
  auto ty = [&](double v) { return plot.log_y ? std::log10(v) : v; };
  double lo = INFINITY, hi = -INFINITY, xmax = 1;
  auto extend = [&](double v) {
    if (plot.log_y && !(v > 0)) return;
    lo = std::min(lo, ty(v));
    hi = std::max(hi, ty(v));
  };
  for (const Series& s : plot.series) {
    for (double v : s.y) extend(v);
    for (double x : s.x) xmax = std::max(xmax, x);
  }
  for (const Reference& r : plot.references) extend(r.y);
  if (!(lo <= hi)) lo = 0, hi = 1;
  if (plot.log_y) lo = std::floor(lo), hi = std::ceil(hi);
  if (hi - lo < 1e-12) hi = lo + 1;
  auto px = [&](double x) { return left + (W - left - right) * x / xmax; };
  auto py = [&](double v) { return top + (H - top - bottom) * (hi - ty(v)) / (hi - lo); };
  std::fprintf(
      f, "<svg xmlns='http://www.w3.org/2000/svg' width='%g' height='%g' font-family='sans-serif' font-size='12'>\n", W,
      H);
  std::fprintf(f, "<rect width='100%%' height='100%%' fill='white'/>\n");
  std::fprintf(f, "<text x='%g' y='24' font-size='15'>%s</text>\n", left, plot.title.c_str());
  const int ticks = plot.log_y ? static_cast<int>(hi - lo) : 5;
  for (int k = 0; k <= ticks; ++k) {
    const double t = lo + (hi - lo) * k / ticks, y = top + (H - top - bottom) * (hi - t) / (hi - lo);
    std::fprintf(f, "<line x1='%g' y1='%g' x2='%g' y2='%g' stroke='#ddd'/>\n", left, y, W - right, y);
    if (plot.log_y)
      std::fprintf(f, "<text x='%g' y='%g' text-anchor='end'>1e%d</text>\n", left - 6, y + 4,
                   static_cast<int>(std::lround(t)));
    else
      std::fprintf(f, "<text x='%g' y='%g' text-anchor='end'>%.3g</text>\n", left - 6, y + 4, t);
  }
  for (int k = 0; k <= 5; ++k) {
    const double e = xmax * k / 5.0, x = px(e);
    std::fprintf(f, "<line x1='%g' y1='%g' x2='%g' y2='%g' stroke='#eee'/>\n", x, top, x, H - bottom);
    std::fprintf(f, "<text x='%g' y='%g' text-anchor='middle'>%g</text>\n", x, H - bottom + 18, std::round(e));
  }
  std::fprintf(f, "<text x='%g' y='%g' text-anchor='middle'>%s</text>\n", (left + W - right) / 2, H - 14,
               plot.x_label.c_str());
  std::fprintf(f, "<text transform='translate(18 %g) rotate(-90)' text-anchor='middle'>%s</text>\n",
               (top + H - bottom) / 2, plot.y_label.c_str());
  std::fprintf(f, "<rect x='%g' y='%g' width='%g' height='%g' fill='none' stroke='#888'/>\n", left, top,
               W - left - right, H - top - bottom);
  for (const Reference& r : plot.references) {
    const double y = py(r.y);
    std::fprintf(f, "<line x1='%g' y1='%g' x2='%g' y2='%g' stroke='#2ca02c' stroke-dasharray='6 4'/>\n", left, y,
                 W - right, y);
    std::fprintf(f, "<text x='%g' y='%g' fill='#2ca02c'>%s</text>\n", left + 8, y - 5, r.label.c_str());
  }
  // Legend top right for falling curves (log scale: losses), bottom right for rising ones.
  double legend = plot.log_y ? top + 18 : H - bottom - 12 - 16.0 * static_cast<double>(plot.series.size() - 1);
  for (const Series& s : plot.series) {
    std::fprintf(f, "<polyline fill='none' stroke='%s' stroke-width='2' points='", s.color.c_str());
    for (std::size_t i = 0; i < s.x.size() && i < s.y.size(); ++i)
      if (!plot.log_y || s.y[i] > 0) std::fprintf(f, "%.2f,%.2f ", px(s.x[i]), py(s.y[i]));
    std::fprintf(f, "'/>\n");
    std::fprintf(f, "<text x='%g' y='%g' fill='%s'>%s</text>\n", W - right - 300, legend, s.color.c_str(),
                 s.name.c_str());
    legend += 16;
  }
  std::fprintf(f, "</svg>\n");
  return std::fclose(f) == 0;
}

}  // namespace report
