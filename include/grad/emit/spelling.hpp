// How the emitter spells C++ tokens: exact literals of T values, identifiers, the names it must
// suffix (keywords, macros, its own), shapes, a tag's type name. Apart: pure text, no tape.
#pragma once

#include <cctype>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <string_view>

#include "grad/tensor.hpp"

namespace grad {

namespace emit_detail {

// "grad::Add" from the compiler's own spelling of the type.
template <class Op>
std::string type_name() {
  const std::string_view f = __PRETTY_FUNCTION__;
  const std::size_t at = f.find("Op = ");
  std::string_view rest = f.substr(at + 5);
  rest = rest.substr(0, rest.find_first_of(";]"));
  return std::string(rest);
}

// An exact literal of a T value: a hex float, an infinity, or a NaN as its
// bits (grad::emitted::from_bits: sign and payload kept), so the emitted code
// starts from the tape's very bits.
template <class T>
std::string literal(T v) {
  if (v != v) {
    char buf[64];
    if constexpr (sizeof(T) == 8) {
      std::uint64_t bits;
      std::memcpy(&bits, &v, sizeof bits);
      std::snprintf(buf, sizeof buf, "grad::emitted::from_bits<T>(0x%016llxull)", static_cast<unsigned long long>(bits));
    } else {
      std::uint32_t bits;
      std::memcpy(&bits, &v, sizeof bits);
      std::snprintf(buf, sizeof buf, "grad::emitted::from_bits<T>(0x%08xu)", static_cast<unsigned>(bits));
    }
    return buf;
  }
  if (std::isinf(v)) return v > 0 ? "std::numeric_limits<T>::infinity()" : "-std::numeric_limits<T>::infinity()";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%a", static_cast<double>(v));
  return buf;
}

inline bool identifier(std::string_view s) {
  if (s.empty() || !(std::isalpha(static_cast<unsigned char>(s[0])) || s[0] == '_')) return false;
  for (char c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_')) return false;
  return true;
}

// A name C++ keeps to the implementation (a double underscore anywhere, or an
// underscore and a capital letter first): it cannot be an identifier in the
// emitted code, with or without the trailing underscore.
inline bool implementation_reserved(std::string_view s) {
  return s.find("__") != std::string_view::npos ||
         (s.size() >= 2 && s[0] == '_' && std::isupper(static_cast<unsigned char>(s[1])));
}

// Names that are written with a trailing underscore (`int` -> `int_`): C++'s
// keywords and alternative tokens, macros the standard or GNU mode defines (a
// member `errno` would be a macro call), grad's macros, and the few names the
// emitted code needs in the scopes user names live in (the element type T,
// the namespaces std and grad, ParamStore's load and view). Every other
// identifier is written as given: user names only name members (Inputs,
// Params, ParamStore), forward()'s output arguments (as out_<name>) and the
// entries of fixed sub-namespaces (size::, init::, ...), so no generated name
// can collide with them.
inline bool needs_suffix(std::string_view s) {
  static constexpr std::string_view words[] = {
      // keywords (C++20) and alternative tokens
      "alignas", "alignof", "and", "and_eq", "asm", "auto", "bitand", "bitor", "bool", "break", "case", "catch",
      "char", "char8_t", "char16_t", "char32_t", "class", "compl", "concept", "const", "consteval", "constexpr",
      "constinit", "const_cast", "continue", "co_await", "co_return", "co_yield", "decltype", "default", "delete",
      "do", "double", "dynamic_cast", "else", "enum", "explicit", "export", "extern", "false", "float", "for",
      "friend", "goto", "if", "inline", "int", "long", "mutable", "namespace", "new", "noexcept", "not", "not_eq",
      "nullptr", "operator", "or", "or_eq", "private", "protected", "public", "register", "reinterpret_cast",
      "requires", "return", "short", "signed", "sizeof", "static", "static_assert", "static_cast", "struct",
      "switch", "template", "this", "thread_local", "throw", "true", "try", "typedef", "typeid", "typename", "union",
      "unsigned", "using", "virtual", "void", "volatile", "wchar_t", "while", "xor", "xor_eq", "import", "module",
      // macros of the C and C++ library, GNU mode and the CUDA runtime
      "NULL", "errno", "INFINITY", "NAN", "HUGE_VAL", "HUGE_VALF", "HUGE_VALL", "EOF", "BUFSIZ", "FILENAME_MAX",
      "assert", "offsetof", "stdin", "stdout", "stderr", "SIZE_MAX", "CHAR_BIT", "MB_LEN_MAX", "RAND_MAX",
      "EXIT_SUCCESS", "EXIT_FAILURE", "math_errhandling", "MATH_ERRNO", "MATH_ERREXCEPT", "FP_NAN", "FP_INFINITE",
      "FP_ZERO", "FP_NORMAL", "FP_SUBNORMAL", "FP_FAST_FMA", "FP_FAST_FMAF", "FP_ILOGB0", "FP_ILOGBNAN",
      "INT_MAX", "INT_MIN", "UINT_MAX", "LONG_MAX", "LONG_MIN", "ULONG_MAX", "FLT_MAX", "FLT_MIN", "FLT_EPSILON",
      "DBL_MAX", "DBL_MIN", "DBL_EPSILON", "linux", "unix", "i386", "major", "minor", "makedev",
      // the emitted code's own names in the scopes user names share
      "T", "std", "grad", "load", "view", "Inputs", "Params", "ParamStore"};
  for (std::string_view w : words)
    if (s == w) return true;
  return s.starts_with("GRAD_") || s.starts_with("__");
}

// How a name is spelt in the emitted code.
inline std::string spelling(const std::string& name) { return needs_suffix(name) ? name + "_" : name; }

inline std::string dims_text(const Dims& d) {
  std::string s = "grad::emitted::dims(";
  for (std::size_t i = 0; i < d.rank; ++i) s += (i ? ", " : "") + std::to_string(d.d[i]);
  return s + ")";
}

}  // namespace emit_detail

}  // namespace grad
