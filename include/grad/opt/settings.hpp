// The ranges an optimizer's settings must lie in: invalid_setting and
// invalid_setting_as. Apart from the optimizers because they need no tape:
// schedules, checkpoints and the device optimizers check the same ranges.
#pragma once

#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <string_view>
#include <type_traits>

namespace grad {

// The ranges an optimizer's settings must lie in (what torch.optim refuses,
// plus NaN and infinities, which would only turn every weight into NaN).
// Constructors and setters throw std::invalid_argument with this message;
// load_checkpoint refuses a file whose settings fall outside them.
//   lr, eps, l2      finite and >= 0 (also a schedule's base_lr and min_lr)
//   beta1, beta2     0 <= beta < 1 (beta = 1 divides by 1 - beta^t = 0)
//   clip             >= 0; 0 turns clipping off, +inf never clips
//   beta1^t, beta2^t 0 <= power <= 1 (a checkpoint's running powers)
// Returns "" when `value` is fine for `setting`.
inline std::string invalid_setting(std::string_view setting, double value) {
  struct Rule {
    std::string_view name;
    bool (*ok)(double);
    std::string_view expected;
  };
  static constexpr Rule rules[] = {
      {"lr", [](double x) { return std::isfinite(x) && x >= 0; }, "a finite value >= 0"},
      {"base_lr", [](double x) { return std::isfinite(x) && x >= 0; }, "a finite value >= 0"},
      {"min_lr", [](double x) { return std::isfinite(x) && x >= 0; }, "a finite value >= 0"},
      {"eps", [](double x) { return std::isfinite(x) && x >= 0; }, "a finite value >= 0"},
      {"l2", [](double x) { return std::isfinite(x) && x >= 0; }, "a finite value >= 0"},
      {"beta1", [](double x) { return x >= 0 && x < 1; }, "0 <= beta1 < 1"},
      {"beta2", [](double x) { return x >= 0 && x < 1; }, "0 <= beta2 < 1"},
      {"clip", [](double x) { return x >= 0; }, "max_norm >= 0 (0 turns clipping off)"},
      {"beta1^t", [](double x) { return x >= 0 && x <= 1; }, "0 <= beta1^t <= 1"},
      {"beta2^t", [](double x) { return x >= 0 && x <= 1; }, "0 <= beta2^t <= 1"},
      {"momentum", [](double x) { return std::isfinite(x) && x >= 0; }, "a finite value >= 0"},
      {"dampening", [](double x) { return x >= 0 && x <= 1; }, "0 <= dampening <= 1"},
      {"weight_decay", [](double x) { return std::isfinite(x) && x >= 0; }, "a finite value >= 0"},
      {"gamma", [](double x) { return x > 0 && x <= 1; }, "0 < gamma <= 1 (a decay factor)"},
      {"factor", [](double x) { return x >= 0 && x < 1; }, "0 <= factor < 1"},
      {"threshold", [](double x) { return std::isfinite(x) && x >= 0; }, "a finite value >= 0"},
      {"div_factor", [](double x) { return std::isfinite(x) && x >= 1; }, "a finite value >= 1"},
      {"final_div_factor", [](double x) { return std::isfinite(x) && x >= 1; }, "a finite value >= 1"},
      {"pct_start", [](double x) { return x > 0 && x < 1; }, "0 < pct_start < 1"},
      {"schedule eps", [](double x) { return std::isfinite(x) && x >= 0; }, "a finite value >= 0"},
      {"metric", [](double x) { return std::isfinite(x); }, "a finite value"},
  };
  for (const Rule& r : rules) {
    if (r.name != setting) continue;
    if (r.ok(value)) return {};
    char number[32];
    std::snprintf(number, sizeof number, "%.17g", value);
    return std::string(setting) + " " + number + " is out of range: expected " + std::string(r.expected);
  }
  return "unknown setting '" + std::string(setting) + "'";
}

// invalid_setting for a value an optimizer holds as U (float or double):
// the value must be in range as given and as U. A float optimizer would
// otherwise accept base_lr 1e300 (finite as a double, an infinite rate as
// float) or beta2 0.999999999 (1 as float: a division by 1 - 1).
template <class U>
std::string invalid_setting_as(std::string_view setting, double value) {
  if (std::string why = invalid_setting(setting, value); !why.empty()) return why;
  // Tested before converting: an out-of-range conversion is undefined.
  const double as = std::abs(value) > static_cast<double>(std::numeric_limits<U>::max())
                        ? std::copysign(std::numeric_limits<double>::infinity(), value)
                        : static_cast<double>(static_cast<U>(value));
  std::string why = invalid_setting(setting, as);
  if (why.empty()) return why;
  char given[32], becomes[32];
  std::snprintf(given, sizeof given, "%.17g", value);
  std::snprintf(becomes, sizeof becomes, "%.9g", as);
  return std::string(setting) + " " + given + " is " + becomes + " as " +
         (std::is_same_v<U, float> ? "float32" : "float64") + ", " + why.substr(why.find("out of range"));
}

}  // namespace grad
