// Reading a numeric CSV file into a tensor, and splitting off a label column.
//
//   auto digits = grad::read_labeled_csv<float>("digits.csv.gz");   // last column: class id
//   digits.inputs   // Tensor<float> [rows, cols - 1]
//   digits.labels   // std::vector<std::int32_t>, one per row
//
// Fields are separated by commas (spaces around them are ignored); a first
// line that does not parse as numbers is taken as a header and skipped. A
// path ending in ".gz" is read through `gzip -dc` (gzip must be on PATH).
// Every row must have the same number of fields; a bad field or a ragged
// row throws std::runtime_error naming the file, line and field.
#pragma once

#include <cerrno>
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "grad/tensor.hpp"

namespace grad {

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
// popen's command for a gzip file: the path in single quotes, each ' escaped.
inline std::string gzip_command(const std::string& path) {
  std::string q = "gzip -dc -- '";
  for (char c : path) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}
}  // namespace csv_detail

template <class T>
Tensor<T> read_csv(const std::string& path) {
  const bool gz = path.size() > 3 && path.compare(path.size() - 3, 3, ".gz") == 0;
  std::FILE* f = nullptr;
  if (gz) {
    std::FILE* probe = std::fopen(path.c_str(), "rb");  // a clear error before gzip's own
    if (!probe) throw std::runtime_error("read_csv: cannot open '" + path + "': " + std::strerror(errno));
    std::fclose(probe);
    f = ::popen(csv_detail::gzip_command(path).c_str(), "r");
  } else {
    f = std::fopen(path.c_str(), "r");
  }
  if (!f) throw std::runtime_error("read_csv: cannot open '" + path + "': " + std::strerror(errno));
  std::vector<T> values;
  std::vector<double> row;
  std::size_t cols = 0, rows = 0, line_no = 0;
  std::string line, error;
  char buf[4096];
  while (error.empty() && std::fgets(buf, sizeof buf, f)) {
    line += buf;
    if (line.back() != '\n' && !std::feof(f)) continue;  // a line longer than the buffer
    ++line_no;
    while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.pop_back();
    if (!line.empty()) {
      std::size_t bad = 0;
      if (!csv_detail::parse_line(line, row, bad)) {
        if (line_no != 1)
          error = "line " + std::to_string(line_no) + ", field " + std::to_string(bad) + " is not a number";
      } else if (cols != 0 && row.size() != cols) {
        error = "line " + std::to_string(line_no) + " has " + std::to_string(row.size()) + " fields, expected " +
                std::to_string(cols);
      } else {
        cols = row.size();
        ++rows;
        for (double v : row) values.push_back(static_cast<T>(v));
      }
    }
    line.clear();
  }
  const int closed = gz ? ::pclose(f) : std::fclose(f);
  if (!error.empty()) throw std::runtime_error("read_csv: '" + path + "': " + error);
  if (gz && closed != 0) throw std::runtime_error("read_csv: '" + path + "': gzip -dc failed (is it gzip data?)");
  if (rows == 0) throw std::runtime_error("read_csv: '" + path + "' holds no rows of numbers");
  return Tensor<T>({rows, cols}, std::move(values));
}

template <class T>
struct LabeledData {
  Tensor<T> inputs;                  // [rows, features]
  std::vector<std::int32_t> labels;  // one class id per row
};

// Splits column `label_column` (negative: from the end) off as integer
// labels. A label that is not a whole number >= 0 throws, naming the row.
template <class T>
LabeledData<T> split_labels(const Tensor<T>& table, int label_column = -1) {
  if (table.rank() != 2 || table.shape()[1] < 2)
    throw std::invalid_argument("split_labels: table " + shape_string(table.shape()) +
                                ": expected [rows, cols] with at least 2 columns");
  const std::size_t rows = table.shape()[0], cols = table.shape()[1];
  const long c = label_column < 0 ? static_cast<long>(cols) + label_column : label_column;
  if (c < 0 || c >= static_cast<long>(cols))
    throw std::invalid_argument("split_labels: label column " + std::to_string(label_column) + " is out of range for " +
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
      if (!(v >= 0) || v != static_cast<T>(static_cast<std::int32_t>(v)))
        throw std::invalid_argument("split_labels: row " + std::to_string(r) + ": label " + std::to_string(v) +
                                    " is not a class id (a whole number >= 0)");
      d.labels[r] = static_cast<std::int32_t>(v);
    }
  }
  return d;
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

template <class T>
LabeledData<T> read_labeled_csv(const std::string& path, int label_column = -1) {
  return split_labels(read_csv<T>(path), label_column);
}

}  // namespace grad
