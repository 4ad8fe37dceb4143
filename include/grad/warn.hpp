// Warnings: what grad says about a program that runs but is probably not
// doing what its author meant (a tape that grows without reset_to, gradients
// replaced where PyTorch would sum them). Each is said once per tape, through
// one process-wide handler: by default a line on stderr,
//
//   grad: warning: <message>
//
// set_warning_handler replaces it (a logger, a test that collects them, or
// one that throws to turn warnings into errors); set_warning_handler({})
// silences them. Set it before tapes start warning: it is not synchronised.
#pragma once

#include <cstdio>
#include <functional>
#include <string>
#include <string_view>
#include <utility>

namespace grad {

using WarningHandler = std::function<void(std::string_view message)>;

namespace warn_detail {
inline void print(std::string_view message) {
  std::fprintf(stderr, "grad: warning: %.*s\n", static_cast<int>(message.size()), message.data());
}
inline WarningHandler& handler() {
  static WarningHandler h = print;
  return h;
}
}  // namespace warn_detail

// Replaces the handler every warning goes to and returns the previous one
// (to restore it); an empty handler silences warnings.
inline WarningHandler set_warning_handler(WarningHandler h) {
  return std::exchange(warn_detail::handler(), std::move(h));
}

inline void warn(std::string_view message) {
  if (const WarningHandler& h = warn_detail::handler()) h(message);
}

}  // namespace grad
