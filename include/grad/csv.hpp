// Reading a numeric CSV file into a tensor, and splitting off a label column.
//
//   auto digits = grad::read_labeled_csv<float>("digits.csv.gz");   // last column: class id
//   digits.inputs   // Tensor<float> [rows, cols - 1]
//   digits.labels   // std::vector<std::int32_t>, one per row
//
// Fields are separated by commas (spaces around them are ignored); a first
// line that does not parse as numbers is taken as a header and skipped. A
// path ending in ".gz" is read through `gzip -dc` (gzip must be on PATH).
// Every row must have the same number of fields; a bad field, a ragged row,
// a NUL byte or a number the element type cannot hold throws
// std::runtime_error naming the file, line and field (or column).
//
// Limits: a path that is not a regular file (a FIFO, a device: /dev/zero
// would never end) is refused; the text read, a .gz file's decompressed
// text included, is at most max_csv_bytes.
#pragma once

#include <sys/stat.h>

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "grad/tensor.hpp"

namespace grad {

// The most bytes of text read_csv reads (4 GiB): a decompressing gzip
// stream is otherwise unbounded.
inline constexpr std::uint64_t max_csv_bytes = std::uint64_t{1} << 32;

namespace csv_detail {
// Parses one line into `out`; false when a field is not a number (then `bad`
// is the field's 1-based position).
inline bool parse_line(std::string_view line, std::vector<double>& out, std::size_t& bad) {
  out.clear();
  std::size_t field = 0;
  while (true) {
    ++field;
    const std::size_t comma = line.find(',');
    std::string_view f = line.substr(0, comma);
    while (!f.empty() && (f.front() == ' ' || f.front() == '\t')) f.remove_prefix(1);
    while (!f.empty() && (f.back() == ' ' || f.back() == '\t' || f.back() == '\r')) f.remove_suffix(1);
    double v = 0;
    const auto [end, ec] = std::from_chars(f.data(), f.data() + f.size(), v);
    if (f.empty() || ec != std::errc() || end != f.data() + f.size()) {
      bad = field;
      return false;
    }
    out.push_back(v);
    if (comma == std::string_view::npos) return true;
    line.remove_prefix(comma + 1);
  }
}
inline std::string number_string(double v) {
  char text[32];
  std::snprintf(text, sizeof text, "%.17g", v);
  return text;
}
// popen's command for a gzip file: the path in single quotes, each ' escaped.
inline std::string gzip_command(const std::string& path) {
  std::string q = "gzip -dc -- '";
  for (char c : path) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// The table in `path`; row_lines (when given) gets each row's line number.
template <class T>
Tensor<T> read_table(const std::string& path, std::vector<std::size_t>* row_lines) {
  const bool gz = path.size() > 3 && path.compare(path.size() - 3, 3, ".gz") == 0;
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    throw std::runtime_error("read_csv: cannot open '" + path + "': " + std::strerror(errno));
  if (!S_ISREG(st.st_mode))
    throw std::runtime_error("read_csv: '" + path + "' is not a regular file (a directory, FIFO or device is refused)");
  std::FILE* f = gz ? ::popen(gzip_command(path).c_str(), "r") : std::fopen(path.c_str(), "rb");
  if (!f) throw std::runtime_error("read_csv: cannot open '" + path + "': " + std::strerror(errno));
  std::vector<T> values;
  std::vector<double> row;
  std::size_t cols = 0, rows = 0, line_no = 0;
  std::uint64_t total = 0;
  std::string line, error;
  // One line: "" or what is wrong with it.
  auto take_line = [&]() -> std::string {
    ++line_no;
    while (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) return {};
    std::size_t bad = 0;
    if (!parse_line(line, row, bad)) {
      if (line_no == 1) return {};  // a header
      return "line " + std::to_string(line_no) + ", field " + std::to_string(bad) + " is not a number";
    }
    if (cols != 0 && row.size() != cols)
      return "line " + std::to_string(line_no) + " has " + std::to_string(row.size()) + " fields, expected " +
             std::to_string(cols);
    for (std::size_t k = 0; k < row.size(); ++k)
      if (std::abs(row[k]) > static_cast<double>(std::numeric_limits<T>::max()) && std::isfinite(row[k]))
        return "line " + std::to_string(line_no) + ", field " + std::to_string(k + 1) + ": " + number_string(row[k]) +
               " is out of range for " + (sizeof(T) == 4 ? "float" : "double");
    cols = row.size();
    ++rows;
    if (row_lines) row_lines->push_back(line_no);
    for (double v : row) values.push_back(static_cast<T>(v));
    return {};
  };
  char buf[65536];
  bool ended = false;
  while (error.empty() && !ended) {
    const std::size_t n = std::fread(buf, 1, sizeof buf, f);
    if (n == 0) {
      ended = true;
      if (std::ferror(f))
        error = std::string("read error: ") + std::strerror(errno);
      else if (!line.empty())
        error = take_line();  // the last line, without a newline
      break;
    }
    total += n;
    if (total > max_csv_bytes) {
      error = "more than " + std::to_string(max_csv_bytes) + " bytes of text (read_csv's limit, max_csv_bytes)";
      break;
    }
    for (std::size_t i = 0; i < n && error.empty(); ++i) {
      const char c = buf[i];
      if (c == '\n') {
        error = take_line();
        line.clear();
      } else if (c == '\0') {
        // A CSV file is text; a line reader built on C strings (fgets) stops
        // at a NUL and splices what follows onto the next line.
        error = "line " + std::to_string(line_no + 1) + ", column " + std::to_string(line.size() + 1) +
                ": a NUL byte (a CSV file is text)";
      } else {
        line += c;
      }
    }
  }
  const int closed = gz ? ::pclose(f) : std::fclose(f);
  if (!error.empty()) throw std::runtime_error("read_csv: '" + path + "': " + error);
  if (gz && closed != 0) throw std::runtime_error("read_csv: '" + path + "': gzip -dc failed (is it gzip data?)");
  if (rows == 0) throw std::runtime_error("read_csv: '" + path + "' holds no rows of numbers");
  return Tensor<T>({rows, cols}, std::move(values));
}

// A label as a class id, or nothing: a whole number in 0 .. 2^31 - 1 (checked
// before the conversion, which is undefined outside that range).
template <class T>
std::optional<std::int32_t> class_id(T v) {
  const double d = static_cast<double>(v);
  if (!(d >= 0 && d <= 2147483647.0 && d == std::floor(d))) return std::nullopt;
  return static_cast<std::int32_t>(d);
}

}  // namespace csv_detail

template <class T>
Tensor<T> read_csv(const std::string& path) {
  return csv_detail::read_table<T>(path, nullptr);
}

template <class T>
struct LabeledData {
  Tensor<T> inputs;                  // [rows, features]
  std::vector<std::int32_t> labels;  // one class id per row
};

namespace csv_detail {
// split_labels, naming a row as where(r) says ("row 3", "'a.csv': line 5").
template <class T>
LabeledData<T> split_labels(const Tensor<T>& table, int label_column, const std::string& who,
                            const std::function<std::string(std::size_t)>& where) {
  if (table.rank() != 2 || table.shape()[1] < 2)
    throw std::invalid_argument(who + ": table " + shape_string(table.shape()) +
                                ": expected [rows, cols] with at least 2 columns");
  const std::size_t rows = table.shape()[0], cols = table.shape()[1];
  const long c = label_column < 0 ? static_cast<long>(cols) + label_column : label_column;
  if (c < 0 || c >= static_cast<long>(cols))
    throw std::invalid_argument(who + ": label column " + std::to_string(label_column) + " is out of range for " +
                                std::to_string(cols) + " columns");
  LabeledData<T> d{Tensor<T>({rows, cols - 1}), std::vector<std::int32_t>(rows)};
  for (std::size_t r = 0; r < rows; ++r) {
    std::size_t k = 0;
    for (std::size_t j = 0; j < cols; ++j) {
      const T v = table[r * cols + j];
      if (static_cast<long>(j) != c) {
        d.inputs[r * (cols - 1) + k++] = v;
        continue;
      }
      const std::optional<std::int32_t> id = class_id(v);
      if (!id)
        throw std::invalid_argument(who + ": " + where(r) + ": label " + number_string(static_cast<double>(v)) +
                                    " is not a class id (a whole number in 0 .. 2147483647)");
      d.labels[r] = *id;
    }
  }
  return d;
}
}  // namespace csv_detail

// Splits column `label_column` (negative: from the end) off as integer
// labels. A label that is not a whole number in 0 .. 2^31 - 1 throws
// std::invalid_argument, naming the row.
template <class T>
LabeledData<T> split_labels(const Tensor<T>& table, int label_column = -1) {
  return csv_detail::split_labels(table, label_column, "split_labels",
                                  [](std::size_t r) { return "row " + std::to_string(r); });
}

// The rows r of `d` for which keep(r) is true, in order (a train/test split:
// keep = [](std::size_t r) { return r % 5 != 0; }).
template <class T, class Keep>
LabeledData<T> select_rows(const LabeledData<T>& d, Keep keep) {
  const std::size_t rows = d.labels.size(), cols = rows ? d.inputs.size() / rows : 0;
  std::vector<T> values;
  LabeledData<T> out;
  for (std::size_t r = 0; r < rows; ++r)
    if (keep(r)) {
      values.insert(values.end(), d.inputs.data().begin() + static_cast<std::ptrdiff_t>(r * cols),
                    d.inputs.data().begin() + static_cast<std::ptrdiff_t>((r + 1) * cols));
      out.labels.push_back(d.labels[r]);
    }
  if (out.labels.empty()) throw std::invalid_argument("select_rows: no row was selected");
  Shape shape = d.inputs.shape();
  shape[0] = out.labels.size();
  out.inputs = Tensor<T>(std::move(shape), std::move(values));
  return out;
}

// read_csv, then split_labels; a bad label is named by its line in the file.
template <class T>
LabeledData<T> read_labeled_csv(const std::string& path, int label_column = -1) {
  std::vector<std::size_t> lines;
  const Tensor<T> table = csv_detail::read_table<T>(path, &lines);
  return csv_detail::split_labels(table, label_column, "read_labeled_csv: '" + path + "'",
                                  [&](std::size_t r) { return "line " + std::to_string(lines[r]); });
}

}  // namespace grad

// With GRAD_COMPILED_KERNELS the readers for float and double are the compiled
// library's (src/extras_*.cpp; core.hpp's GRAD_WALK_INSTANCES says why).
#define GRAD_CSV_INSTANCES(E, T)                                                                              \
  E template grad::Tensor<T> grad::csv_detail::read_table<T>(const std::string&, std::vector<std::size_t>*); \
  E template grad::Tensor<T> grad::read_csv<T>(const std::string&);                                          \
  E template grad::LabeledData<T> grad::read_labeled_csv<T>(const std::string&, int);
#if defined(GRAD_COMPILED_KERNELS) && GRAD_SIMD
GRAD_CSV_INSTANCES(extern, float)
GRAD_CSV_INSTANCES(extern, double)
#endif
