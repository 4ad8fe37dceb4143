// Minibatches over an in-memory data set, and running a model over a data
// set without training (predict).
//
//   grad::Batches<double> batches(x, labels, {.batch = 64, .last = grad::LastBatch::keep, .seed = 1});
//   auto m = tp.mark();                                  // after the parameters
//   for (int epoch = 0; epoch < epochs; ++epoch)
//     for (const auto& b : batches.epoch()) {            // reshuffled each epoch, from the seed
//       tp.reset_to(m);
//       auto loss = grad::cross_entropy(model(tp.constant(b.inputs)), b.labels);
//       ...
//     }
//
// The data set is rows of inputs ([rows, ...], any rank) with either integer
// labels (one per row) or target rows ([rows, ...]); Batches keeps a
// reference to them, so they must outlive it (temporaries are refused at
// compile time). Each epoch() draws a fresh permutation (Fisher-Yates on
// grad::SplitMix64 seeded with seed + epoch number, so an epoch's order is a
// function of the seed and its index alone, also after a resume) unless
// shuffle is off. The short last batch is dropped or kept (LastBatch); a
// kept one has fewer rows, and a loss that is a mean over the batch (mse,
// cross_entropy) is then the mean over those rows; weigh each batch by
// b.rows when averaging over an epoch (EpochMean does).
//
// A batch's inputs, labels and targets live in buffers Batches allocates
// once (one set for full batches, one for the short one), so recording
// tp.constant(b.inputs) after a mark makes no heap allocation after the
// first epoch. b.feed(tp, x) copies the inputs into an existing constant of
// the same shape instead.
#pragma once

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "grad/classify.hpp"
#include "grad/random.hpp"
#include "grad/tape.hpp"

namespace grad {

enum class LastBatch { drop, keep };

struct BatchOptions {
  std::size_t batch = 32;
  LastBatch last = LastBatch::keep;
  std::uint64_t seed = 0;
  bool shuffle = true;
};

// Where a loop over Batches stands: the next batch to be read is batch
// `batch` (0-based) of epoch `epoch` (0-based: the count of epochs started
// before it). Batches::position() after a step, Batches::resume() in a fresh
// run: the resumed run reads the same batches, in the same shuffled order.
struct BatchPosition {
  std::uint64_t epoch = 0, batch = 0;
  friend bool operator==(const BatchPosition&, const BatchPosition&) = default;
};

template <class T>
struct Batch {
  Tensor<T> inputs;                  // [rows, ...]
  std::vector<std::int32_t> labels;  // rows ids (label data sets)
  Tensor<T> targets;                 // [rows, ...] (target data sets)
  std::size_t rows = 0;
  std::size_t index = 0;  // position in the epoch

  // Copies the inputs into `x`, a tp.constant of the same shape; poisons the
  // tape (naming both shapes) otherwise.
  bool feed(Tape<T>& tp, Var<T> x) const {
    const std::span<T> dst = tp.leaf_value(x);
    const View<T> have = tp.value(x);
    if (dst.size() != inputs.size() ||
        !std::equal(have.shape.begin(), have.shape.end(), inputs.shape().begin(), inputs.shape().end())) {
      tp.poison("Batch::feed: the batch is " + shape_string(inputs.shape()) + " but the input node is " +
                shape_string(have.shape) + (dst.empty() ? " (or not a live constant)" : ""));
      return false;
    }
    std::copy(inputs.data().begin(), inputs.data().end(), dst.begin());
    return true;
  }
};

template <class T>
class Batches {
 public:
  Batches(const Tensor<T>& inputs, std::span<const std::int32_t> labels, BatchOptions o)
      : inputs_(&inputs), labels_(labels), options_(o) {
    check(labels.size(), "labels");
    prepare();
  }
  Batches(const Tensor<T>& inputs, const std::vector<std::int32_t>& labels, BatchOptions o)
      : Batches(inputs, std::span<const std::int32_t>(labels), o) {}
  // Labels of another integral type (int64 as torch.long, uint8, ...) are
  // copied once into int32 class ids; one that does not fit is refused,
  // naming its row. The copy is Batches' own, so a temporary is fine here.
  template <std::integral Label>
  requires(!std::is_same_v<Label, std::int32_t>)
      Batches(const Tensor<T>& inputs, std::span<const Label> labels, BatchOptions o)
      : Batches(inputs, converted(labels), o, Owned{}) {}
  template <std::integral Label>
  requires(!std::is_same_v<Label, std::int32_t>)
      Batches(const Tensor<T>& inputs, const std::vector<Label>& labels, BatchOptions o)
      : Batches(inputs, std::span<const Label>(labels), o) {}
  Batches(const Tensor<T>& inputs, const Tensor<T>& targets, BatchOptions o)
      : inputs_(&inputs), targets_(&targets), options_(o) {
    check(targets.rank() == 0 ? 0 : targets.shape()[0], "target rows");
    prepare();
  }
  // The data set is kept by reference: a temporary would dangle.
  Batches(Tensor<T>&&, std::span<const std::int32_t>, BatchOptions) = delete;
  Batches(const Tensor<T>&, std::vector<std::int32_t>&&, BatchOptions) = delete;
  Batches(Tensor<T>&&, const Tensor<T>&, BatchOptions) = delete;
  Batches(const Tensor<T>&, Tensor<T>&&, BatchOptions) = delete;

  std::size_t rows() const { return rows_; }
  std::size_t batch_size() const { return options_.batch; }
  // Batches per epoch (the short last one counted when kept).
  std::size_t size() const { return full_ + (short_rows_ > 0 ? 1 : 0); }
  std::size_t epochs_started() const { return epoch_; }

  class Iterator {
   public:
    const Batch<T>& operator*() const { return owner_->fill(k_); }
    const Batch<T>* operator->() const { return &owner_->fill(k_); }
    Iterator& operator++() {
      ++k_;
      return *this;
    }
    bool operator!=(const Iterator& o) const { return k_ != o.k_; }
    bool operator==(const Iterator& o) const { return k_ == o.k_; }

   private:
    friend class Batches;
    Iterator(Batches* owner, std::size_t k) : owner_(owner), k_(k) {}
    Batches* owner_;
    std::size_t k_;
  };
  struct Epoch {
    Batches* owner;
    std::size_t first = 0;  // a resumed epoch starts at its next unread batch
    Iterator begin() const { return Iterator(owner, first); }
    Iterator end() const { return Iterator(owner, owner->size()); }
  };

  // Starts the next epoch (a new permutation when shuffling) and returns its
  // batches for a range-for. A batch stays valid until the next one is read.
  // After resume(), the epoch it names, from the batch it names.
  Epoch epoch() {
    std::iota(order_.begin(), order_.end(), std::size_t{0});
    if (options_.shuffle) {
      SplitMix64 gen(options_.seed + epoch_);
      for (std::size_t i = rows_; i > 1; --i) std::swap(order_[i - 1], order_[gen.next() % i]);
    }
    const std::size_t first = first_batch_;
    position_ = {epoch_, first};
    ++epoch_;
    first_batch_ = 0;
    return Epoch{this, first};
  }

  // The batch after the last one read (the start of the next epoch after an
  // epoch's last batch): what a checkpoint keeps to resume from.
  BatchPosition position() const { return position_; }
  // Makes the next epoch() call continue at `p`: epoch p.epoch's permutation
  // (the same seed + p.epoch), from batch p.batch. Throws for a batch past
  // the epoch's end.
  void resume(BatchPosition p) {
    if (p.batch >= size())
      throw std::invalid_argument("Batches::resume: batch " + std::to_string(p.batch) + " of epoch " +
                                  std::to_string(p.epoch) + " does not exist: an epoch has " + std::to_string(size()) +
                                  " batches (0 to " + std::to_string(size() - 1) + ")");
    epoch_ = static_cast<std::size_t>(p.epoch);
    first_batch_ = static_cast<std::size_t>(p.batch);
    position_ = p;
  }

 private:
  struct Owned {};
  Batches(const Tensor<T>& inputs, std::vector<std::int32_t>&& ids, BatchOptions o, Owned)
      : inputs_(&inputs), owned_labels_(std::move(ids)), options_(o) {
    check(class_ids().size(), "labels");
    prepare();
  }
  template <class Label>
  static std::vector<std::int32_t> converted(std::span<const Label> labels) {
    std::vector<std::int32_t> ids(labels.size());
    for (std::size_t r = 0; r < labels.size(); ++r) {
      bool fits = static_cast<std::uint64_t>(labels[r]) <= 2147483647u;  // any integral type, char and bool too
      if constexpr (std::is_signed_v<Label>)
        fits = labels[r] < 0 ? static_cast<std::int64_t>(labels[r]) >= -2147483647 - 1 : fits;
      if (!fits)
        throw std::invalid_argument("Batches: label " + std::to_string(+labels[r]) + " in row " + std::to_string(r) +
                                    " does not fit a class id: expected 0 <= id <= 2147483647");
      ids[r] = static_cast<std::int32_t>(labels[r]);
    }
    return ids;
  }

  // The borrowed labels, or the converted copy (read through here, so a copied Batches reads its own).
  std::span<const std::int32_t> class_ids() const {
    return owned_labels_.empty() ? labels_ : std::span<const std::int32_t>(owned_labels_);
  }

  void check(std::size_t target_rows, const char* what) {
    if (inputs_->rank() == 0 || inputs_->size() == 0)
      throw std::invalid_argument("Batches: the inputs " + shape_string(inputs_->shape()) +
                                  " hold no rows: expected [rows, ...]");
    rows_ = inputs_->shape()[0];
    if (target_rows != rows_)
      throw std::invalid_argument("Batches: the inputs have " + std::to_string(rows_) + " rows but there are " +
                                  std::to_string(target_rows) + " " + what);
    if (options_.batch == 0) throw std::invalid_argument("Batches: batch size 0; expected at least 1 row");
    if (options_.batch > rows_)
      throw std::invalid_argument("Batches: batch size " + std::to_string(options_.batch) +
                                  " is larger than the data set (" + std::to_string(rows_) +
                                  " rows); use a batch of at most " + std::to_string(rows_));
    for (std::size_t r = 0; r < class_ids().size(); ++r)
      if (class_ids()[r] < 0)
        throw std::invalid_argument("Batches: label " + std::to_string(class_ids()[r]) + " in row " +
                                    std::to_string(r) + " is negative; expected class ids >= 0");
  }
  void prepare() {
    full_ = rows_ / options_.batch;
    const std::size_t rest = rows_ % options_.batch;
    short_rows_ = options_.last == LastBatch::keep ? rest : 0;
    order_.resize(rows_);
    make(full_batch_, options_.batch);
    if (short_rows_ > 0) make(short_batch_, short_rows_);
  }
  void make(Batch<T>& b, std::size_t n) {
    b.rows = n;
    Shape s = inputs_->shape();
    s[0] = n;
    b.inputs = Tensor<T>(s);
    if (!class_ids().empty()) b.labels.resize(n);
    if (targets_) {
      Shape t = targets_->shape();
      t[0] = n;
      b.targets = Tensor<T>(t);
    }
  }
  // Gathers the rows of batch k into the kept buffers.
  const Batch<T>& fill(std::size_t k) {
    Batch<T>& b = k < full_ ? full_batch_ : short_batch_;
    b.index = k;
    position_ = k + 1 < size() ? BatchPosition{epoch_ - 1, k + 1} : BatchPosition{epoch_, 0};
    const std::size_t first = k * options_.batch;
    const std::size_t in_row = inputs_->size() / rows_;
    const std::size_t t_row = targets_ ? targets_->size() / rows_ : 0;
    for (std::size_t i = 0; i < b.rows; ++i) {
      const std::size_t r = order_[first + i];
      std::copy_n(inputs_->data().begin() + static_cast<std::ptrdiff_t>(r * in_row), in_row,
                  b.inputs.data().begin() + static_cast<std::ptrdiff_t>(i * in_row));
      if (!class_ids().empty()) b.labels[i] = class_ids()[r];
      if (targets_)
        std::copy_n(targets_->data().begin() + static_cast<std::ptrdiff_t>(r * t_row), t_row,
                    b.targets.data().begin() + static_cast<std::ptrdiff_t>(i * t_row));
    }
    return b;
  }

  const Tensor<T>* inputs_;
  std::vector<std::int32_t> owned_labels_;  // labels of another type, converted
  std::span<const std::int32_t> labels_;
  const Tensor<T>* targets_ = nullptr;
  BatchOptions options_;
  std::size_t rows_ = 0, full_ = 0, short_rows_ = 0, epoch_ = 0, first_batch_ = 0;
  BatchPosition position_;
  std::vector<std::size_t> order_;
  Batch<T> full_batch_, short_batch_;
};

// The mean of per-batch means, each weighted by its rows: the mean over
// every row seen, also when the last batch is short.
struct EpochMean {
  double sum = 0;
  std::size_t rows = 0;
  void add(double batch_mean, std::size_t batch_rows) {
    sum += batch_mean * static_cast<double>(batch_rows);
    rows += batch_rows;
  }
  double value() const { return rows ? sum / static_cast<double>(rows) : 0.0; }
};

// Runs `model` over every row of `inputs` ([rows, features]) in batches of
// `batch` rows, in order, under an InferenceGuard, rewinding the tape after
// each batch (it does not grow; the parameters' gradients a backward left
// for the next step stay), and returns each row's argmax class.
// Throws TapeError with the tape's message when the tape is (or becomes)
// poisoned.
template <class T, class Model>
std::vector<std::int32_t> predict(Tape<T>& tp, const Model& model, const Tensor<T>& inputs, std::size_t batch = 256) {
  if (inputs.rank() != 2 || batch == 0)
    throw std::invalid_argument("predict: inputs " + shape_string(inputs.shape()) + ", batch " + std::to_string(batch) +
                                ": expected [rows, features] and batch > 0");
  if (!tp.ok()) throw TapeError("predict: the tape is poisoned: " + tp.error());
  const std::size_t rows = inputs.shape()[0], cols = inputs.shape()[1];
  std::vector<std::int32_t> out;
  out.reserve(rows);
  const auto m = tp.mark();
  InferenceGuard<T> guard(tp);
  for (std::size_t first = 0; first < rows; first += batch) {
    const std::size_t n = std::min(batch, rows - first);
    Tensor<T> x({n, cols});
    std::copy_n(inputs.data().begin() + static_cast<std::ptrdiff_t>(first * cols), n * cols, x.data().begin());
    const Var<T> y = model(tp.constant(x));
    if (!tp.ok()) throw TapeError("predict: " + tp.error());
    const std::vector<std::int32_t> p = argmax(tp.value(y), -1);
    out.insert(out.end(), p.begin(), p.end());
    tp.reset_to(m, keep_gradients);
  }
  return out;
}

}  // namespace grad

// With GRAD_COMPILED_KERNELS, Batches for float and double is the compiled
// library's (src/extras_*.cpp; core.hpp's GRAD_WALK_INSTANCES says why).
#define GRAD_DATA_INSTANCES(E, T) E template class grad::Batches<T>;
#if defined(GRAD_COMPILED_KERNELS) && GRAD_SIMD
GRAD_DATA_INSTANCES(extern, float)
GRAD_DATA_INSTANCES(extern, double)
#endif
