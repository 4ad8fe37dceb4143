// Data-parallel training whose result does not depend on the number of
// processes: grad::dist.
//
// The global minibatch is cut into a fixed number of shards S, chosen by the
// user and independent of how many processes run. Each shard's gradient comes
// from an ordinary backward on that shard alone, and the shards' gradients are
// combined in one documented order, so 1, 2, 3 or 8 ranks (and one process
// with no MPI at all) land on the same bits.
//
// The order (the contract; docs/ARCHITECTURE.md repeats it):
//   shard s            rows shard_rows(B, S, s): contiguous, ascending; the
//                      first B % S shards hold one row more than the others.
//   shard loss L_s     whatever loss_of(s) records on the tape (a mean over
//                      the shard's rows, a sum, ...), one backward each.
//   gradient g         per element i, a left fold in ascending shard order:
//                        acc = G_0[i]; acc = acc + G_s[i] for s = 1 .. S-1;
//                      then, Combine::mean (the default): g[i] = acc / T(S);
//                      Combine::sum: g[i] = acc.
//   step loss L        the same fold over the shard losses L_0 .. L_{S-1}.
// With Combine::mean and mean-over-rows shard losses, L is the mean of the
// shards' means: the batch mean when the shards are equal (B % S == 0). For
// the exact batch mean with unequal shards, record each shard's loss as its
// sum divided by B and use Combine::sum.
//
// Which rank computes a shard, and when, changes nothing: a shard's gradient
// does not depend on what else the tape recorded before (threads, vector
// width, mark/reset leave the bits alone: the determinism contract), and the
// fold sees the shards in ascending order whoever owns them. The optimizer
// step then runs on every rank on the same reduced gradient (the clip norm in
// the order opt.hpp documents), so the replicas stay equal.
//
// Without MPI (this header alone, no library): LocalShards runs the S shards
// one after the other in one process; it is the reference every rank count
// is tested against, and a single-process user gets the same bits:
//
//   grad::dist::LocalShards<grad::Adam<double>> shards(opt, {.shards = 8});   // takes the tape's mark
//   double loss = shards.step([&](std::size_t s) {      // records shard s after the mark
//     auto rows = grad::dist::shard_rows(batch, 8, s);
//     ...  return grad::mse(model(x_s), x_s);
//   });                                                 // = backward(loss_of) + opt.step()
//
// With MPI (link grad_dist_dep / grad-dist.pc; built when Open MPI is found),
// the same loop on every rank of `mpirun -np N`:
//
//   grad::dist::Communicator comm(&argc, &argv);        // MPI_Init; errors return; a timeout watches collectives
//   grad::dist::DataParallel<grad::Adam<double>> ddp(comm, opt, {.shards = 8, .check_every = 10});
//   double loss = ddp.step(loss_of);                    // this rank's shards, the ordered reduction, opt.step()
//   ddp.save_checkpoint("run.ckpt");                    // rank 0 writes, atomically; every rank waits for it
//
// DataParallel's constructor is its first collective: it compares every
// rank's parameter list (count, shapes, dtype, S) and throws dist::Error on
// every rank, naming the first difference, when they differ; then it copies
// rank 0's parameters to the others (as torch's DDP does). Each step gathers
// the S shard losses with a status: a rank whose shard failed (a poisoned
// tape, a parameter its loss does not reach) makes every rank throw. Every
// check_every steps (0: never) the ranks compare a checksum of their
// parameters: a replica that drifted makes every rank throw. A rank that dies
// makes the launcher stop the others; each says so on stderr (Communicator
// installs a SIGTERM handler), and a collective (or MPI_Finalize) that does not
// complete within the timeout stops its rank with a message and exit code
// watchdog_exit_code (75) instead of waiting forever (CommOptions: 60 s for
// the first collective, 30 s for the others by default).
//
// The reduction (DataParallel::backward): the P optimizer parameters,
// flattened in add order, are cut into one contiguous slice per rank
// (slice_of). Each rank sends, to the owner of each slice, its own shards'
// pieces of that slice (MPI_Alltoallv; its own pieces stay in place): rank r
// then holds shards 0 .. S-1's pieces of its slice, folds them in ascending
// shard order as above, and an MPI_Allgatherv hands every rank the whole
// reduced gradient. Bytes sent per rank and step: ceil(S/W) * P * (W-1)/W for
// the exchange plus P * (W-1)/W
// for the gather, against 2 * P * (W-1)/W for a ring all-reduce: a factor
// (ceil(S/W) + 1) / 2 (1 when S = W). S >= W: every rank owns a shard.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "grad/checkpoint.hpp"
#include "grad/dist/shards.hpp"
#include "grad/opt.hpp"
#include "grad/tape.hpp"

namespace grad::dist {

// ---- the flattened gradient of an optimizer's parameters (add order) ----

// Copies elements [r.begin, r.end) of the flattened gradient of opt's
// parameters into out. "" or why not (a parameter the latest backward did
// not reach: every shard's loss must reach every parameter).
template <class T>
std::string copy_flat_grads(const Optimizer<T>& opt, Range r, T* out) {
  const Tape<T>* tp = opt.tape();
  for (std::size_t k = 0; k < opt.params().size(); ++k) {
    const auto& e = opt.params()[k];
    const std::size_t lo = std::max(r.begin, e.offset), hi = std::min(r.end, e.offset + e.size);
    if (lo >= hi) continue;
    if (!tp->has_grad(e.var))
      return opt.parameter_name(k) + " (node " + std::to_string(e.var.index()) +
             ") was not reached by the shard's backward; every shard's loss must reach every optimizer parameter";
    const T* g = tp->grad(e.var).data.data();
    std::memcpy(out + (lo - r.begin), g + (lo - e.offset), (hi - lo) * sizeof(T));
  }
  return {};
}

// Writes a whole flattened gradient into the tape's gradient buffers of
// opt's parameters, which the latest backward must have reached (opt.step()
// then reads it like any gradient).
template <class T>
void write_flat_grads(const Optimizer<T>& opt, const T* flat) {
  const Tape<T>* tp = opt.tape();
  for (const auto& e : opt.params()) {
    // The node's gradient buffer: Node::grad points into the tape's arena
    // (a const Node still hands out a writable T*).
    T* g = tp->nodes()[e.var.index()].grad;
    std::memcpy(g, flat + e.offset, e.size * sizeof(T));
  }
}

// FNV-1a over the bytes of every parameter value, in add order: what the
// replicas compare to catch a drift.
template <class T>
std::uint64_t parameter_checksum(const Optimizer<T>& opt) {
  std::uint64_t h = grad::detail::fnv1a_offset;
  for (const auto& e : opt.params()) h = grad::detail::fnv1a(grad::detail::bytes_of(opt.tape()->value(e.var).data), h);
  return h;
}

// The element type of an optimizer (grad::Adam<double> -> double).
template <class Opt>
using value_type_of = std::remove_cvref_t<decltype(std::declval<const Opt&>().lr())>;

// The single-process reference: shards 0 .. S-1 in order on one tape, their
// gradients folded as documented. Needs no MPI. Construct it after the
// parameters and constants are recorded: it takes the tape's mark and
// rewinds to it before each shard.
template <class Opt>
class LocalShards {
 public:
  using T = value_type_of<Opt>;

  LocalShards(Opt& opt, ShardOptions options) : opt_(&opt), options_(options) {
    if (options.shards == 0) throw Error("grad::dist: shards must be at least 1");
    if (!opt.tape()) throw Error("grad::dist: the optimizer has no parameters (add them before)");
    mark_ = opt.tape()->mark();
    acc_.resize(opt.elements());
    losses_.resize(options.shards);
  }

  // Runs every shard (loss_of(s) records shard s's loss after the mark and
  // returns it), folds their gradients into the tape's gradient buffers of
  // the optimizer's parameters and returns the folded loss. Throws Error when
  // a shard fails. The tape keeps the last shard's episode.
  template <class LossOf>
  T backward(LossOf&& loss_of) {
    Tape<T>& tp = *opt_->tape();
    const Range all{0, opt_->elements()};
    for (std::size_t s = 0; s < options_.shards; ++s) {
      tp.reset_to(mark_, grad::drop_gradients);  // each shard starts afresh: no sum is lost
      const Var<T> loss = loss_of(s);
      if (!tp.backward(loss)) throw Error("grad::dist: shard " + std::to_string(s) + ": " + tp.error());
      losses_[s] = tp.scalar(loss);
      if (s == 0) {
        if (std::string why = copy_flat_grads(*opt_, all, acc_.data()); !why.empty())
          throw Error("grad::dist: shard 0: " + why);
      } else {
        for (const auto& e : opt_->params()) {
          if (!tp.has_grad(e.var))
            throw Error("grad::dist: shard " + std::to_string(s) + ": a parameter was not reached by the backward");
          fold_add(acc_.data() + e.offset, tp.grad(e.var).data.data(), e.size);
        }
      }
    }
    fold_finish(acc_.data(), acc_.size(), options_.shards, options_.combine);
    write_flat_grads(*opt_, acc_.data());
    return fold_losses<T>(losses_, options_.combine);
  }

  // backward(loss_of), then the optimizer's step. Throws Error when the step fails.
  template <class LossOf>
  T step(LossOf&& loss_of) {
    const T loss = backward(loss_of);
    if (!opt_->step()) throw Error("grad::dist: the optimizer step failed: " + opt_->tape()->error());
    return loss;
  }

  std::span<const T> shard_losses() const { return losses_; }
  const ShardOptions& options() const { return options_; }

 private:
  Opt* opt_;
  ShardOptions options_;
  typename Tape<T>::Mark mark_;
  std::vector<T> acc_;
  std::vector<T> losses_;
};

// ---- the collectives every data-parallel trainer shares ----

// The exchange of the reduction (above) over host buffers, on any Group:
// this rank's shards' gradients in, the reduced gradient (the same bits on
// every rank) out. DataParallel (tapes) and ProgramParallel (captured device
// programs, grad/dist/program.hpp) both reduce through it.
template <class T>
class ShardExchange {
 public:
  ShardExchange(Group& group, std::size_t elements, const ShardOptions& options)
      : group_(&group), p_(elements), options_(options), world_(group.size()), rank_(group.rank()) {
    if (options.shards < static_cast<std::size_t>(world_))
      throw Error("grad::dist: " + std::to_string(options.shards) + " shards for " + std::to_string(world_) +
                  " ranks: every rank needs at least one shard (use more shards or fewer ranks)");
    own_ = owned_shards(options.shards, world_, rank_);
    for (int q = 0; q < world_; ++q) {
      const Range slice = slice_of(p_, world_, q);
      send_counts_.push_back(q == rank_ ? 0 : own_.size() * slice.size());  // its own pieces stay where they are
      send_displs_.push_back(send_size_);
      send_size_ += own_.size() * slice.size();
      recv_counts_.push_back(q == rank_ ? 0 : owned_shards(options.shards, world_, q).size() * mine().size());
      recv_displs_.push_back(recv_size_);
      recv_size_ += recv_counts_.back();
      gather_counts_.push_back(slice.size());
      gather_displs_.push_back(slice.begin);
    }
    send_.resize(send_size_);
    recv_.resize(recv_size_);
    reduced_.resize(p_);
    pieces_.resize(options.shards);
  }

  Range owned() const { return own_; }
  std::size_t elements() const { return p_; }
  // Where shard owned().begin + k's piece of rank q's slice (slice_of(P, size, q)) goes.
  T* piece(std::size_t k, int q) { return send_.data() + send_displs_[q] + k * slice_of(p_, world_, q).size(); }
  // Shard owned().begin + k's whole flattened gradient (P values), cut into its pieces.
  void put(std::size_t k, const T* flat) {
    for (int q = 0; q < world_; ++q) {
      const Range slice = slice_of(p_, world_, q);
      std::memcpy(piece(k, q), flat + slice.begin, slice.size() * sizeof(T));
    }
  }

  // Exchange, fold in ascending shard order, gather: the reduced gradient,
  // P values, on every rank. Adds the fold's own time to fold_seconds.
  std::span<const T> reduce(double& fold_seconds) {
    group_->alltoallv(send_.data(), send_counts_.data(), send_displs_.data(), recv_.data(), recv_counts_.data(),
                      recv_displs_.data(), "the gradient exchange (alltoallv)");
    // Shard s's piece of this rank's slice: received (other ranks' shards,
    // ascending) or still in the send buffer (this rank's own: the exchange
    // does not copy them to itself).
    const auto t0 = std::chrono::steady_clock::now();
    for (std::size_t s = 0, received = 0; s < options_.shards; ++s)
      pieces_[s] =
          s >= own_.begin && s < own_.end ? piece(s - own_.begin, rank_) : recv_.data() + (received++) * mine().size();
    fold_pieces<T>(pieces_, reduced_.data() + mine().begin, mine().size(), options_.combine);
    fold_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    group_->allgatherv(reduced_.data() + mine().begin, mine().size(), reduced_.data(), gather_counts_.data(),
                       gather_displs_.data(), "the gradient gather (allgatherv)");
    return reduced_;
  }

 private:
  Range mine() const { return slice_of(p_, world_, rank_); }

  Group* group_;
  std::size_t p_;
  ShardOptions options_;
  int world_, rank_;
  Range own_;
  std::vector<std::size_t> send_counts_, send_displs_, recv_counts_, recv_displs_, gather_counts_, gather_displs_;
  std::size_t send_size_ = 0, recv_size_ = 0;
  std::vector<T> send_, recv_, reduced_;
  std::vector<const T*> pieces_;
};

namespace detail {

inline std::string where(const Group& g) {
  return "grad::dist: rank " + std::to_string(g.rank()) + " of " + std::to_string(g.size()) + ": ";
}

// What every rank's model must agree on, compared with rank 0's by the first collective.
struct ModelSummary {
  std::uint64_t dtype = 0, shards = 0, combine = 0, count = 0, elements = 0, shapes = 0;
};

// FNV-1a over a list of numbers (shapes), for ModelSummary::shapes.
inline std::uint64_t fingerprint(std::span<const std::uint64_t> xs) {
  return grad::detail::fnv1a(grad::detail::bytes_of(xs));
}

// Throws Error on every rank, naming the first difference, when a rank's
// summary is not rank 0's. `shapes`: this rank's parameter shapes, in words.
inline void check_same_model(Group& g, const ModelSummary& mine, const std::string& shapes) {
  std::vector<ModelSummary> all(g.size());
  g.allgather(&mine, sizeof mine, all.data(), "the model check (allgather), the first collective");
  for (int q = 1; q < g.size(); ++q) {
    const ModelSummary& a = all[0];
    const ModelSummary& b = all[q];
    auto differs = [&](const char* what, std::uint64_t x, std::uint64_t y) {
      return Error(where(g) + "the ranks' models differ: " + what + " " + std::to_string(x) + " on rank 0 but " +
                   std::to_string(y) + " on rank " + std::to_string(q) + "; every rank must build the same model");
    };
    if (a.dtype != b.dtype) throw differs("element size", a.dtype, b.dtype);
    if (a.shards != b.shards) throw differs("shards", a.shards, b.shards);
    if (a.combine != b.combine) throw differs("combine mode", a.combine, b.combine);
    if (a.count != b.count) throw differs("parameter count", a.count, b.count);
    if (a.elements != b.elements || a.shapes != b.shapes)
      throw Error(where(g) + "the ranks' models differ: the parameter shapes of rank " + std::to_string(q) +
                  " are not rank 0's (" + std::to_string(b.elements) + " elements against " +
                  std::to_string(a.elements) + "; this rank's are " + shapes +
                  "); every rank must build the same model");
  }
}

// Every rank learns every shard's loss (into `losses`, S values), and
// whether a rank failed (`failure`: this rank's reason, "" if none): then
// every rank throws. One allgather of a fixed-size record per rank.
template <class T>
void gather_shard_losses(Group& g, const ShardOptions& options, std::span<const T> own_losses,
                         const std::string& failure, std::uint64_t step, std::span<T> losses) {
  const int world = g.size();
  const std::size_t max_owned = owned_shards(options.shards, world, 0).size();  // the first blocks are largest
  std::vector<T> mine(1 + max_owned, T(0));
  mine[0] = failure.empty() ? T(0) : T(1);
  std::copy(own_losses.begin(), own_losses.end(), mine.begin() + 1);
  std::vector<T> all(mine.size() * world);
  g.allgather(mine.data(), mine.size() * sizeof(T), all.data(), "the shard losses (allgather)");
  std::string failed;
  for (int q = 0; q < world; ++q) {
    const T* row = all.data() + q * mine.size();
    if (row[0] != T(0)) failed += (failed.empty() ? "" : ", ") + std::to_string(q);
    const Range o = owned_shards(options.shards, world, q);
    for (std::size_t k = 0; k < o.size(); ++k) losses[o.begin + k] = row[1 + k];
  }
  if (!failed.empty())
    throw Error(where(g) + "step " + std::to_string(step) + " failed on rank(s) " + failed +
                (failure.empty() ? " (their own messages say why)" : ": " + failure));
}

// Compares every rank's parameter checksum with rank 0's; throws Error on
// every rank, naming the ranks that differ, when one does.
inline void compare_checksums(Group& g, std::uint64_t mine, std::uint64_t steps, std::uint64_t every) {
  std::vector<std::uint64_t> all(g.size());
  g.allgather(&mine, sizeof mine, all.data(), "the replica check (allgather)");
  std::string differ;
  for (int q = 1; q < g.size(); ++q)
    if (all[q] != all[0]) differ += (differ.empty() ? "" : ", ") + std::to_string(q);
  if (!differ.empty())
    throw Error(where(g) + "replicas drifted: after step " + std::to_string(steps) + " the parameters of rank(s) " +
                differ + " differ from rank 0's" +
                (every > 0 ? " (checksums compared every " + std::to_string(every) + " steps)" : std::string()));
}

// What a checkpoint records of the shard scheme, and a resumed run must match.
inline std::vector<CheckpointNote> shard_notes(const ShardOptions& o) {
  return {{"grad.dist.shards", o.shards}, {"grad.dist.combine", static_cast<std::uint64_t>(o.combine)}};
}

// Rank 0 runs save() ("" or why it failed); every rank returns when it is
// done, or throws Error with rank 0's reason.
template <class Save>
void save_on_rank0(Group& g, Save&& save) {
  std::string why;
  if (g.rank() == 0) why = save();
  std::uint32_t length = static_cast<std::uint32_t>(std::min<std::size_t>(why.size(), 1000));
  g.broadcast(&length, sizeof length, 0, "the checkpoint status");
  why.resize(length);
  if (length > 0) g.broadcast(why.data(), length, 0, "the checkpoint status");
  if (!why.empty()) throw Error(where(g) + "rank 0 could not write the checkpoint: " + why);
}

// Every rank runs load() ("" or why it failed); throws Error on every rank,
// naming the ranks that failed, when one did.
template <class Load>
void load_on_every_rank(Group& g, Load&& load) {
  const std::string why = load();
  const std::uint32_t failed = why.empty() ? 0 : 1;
  std::vector<std::uint32_t> all(g.size());
  g.allgather(&failed, sizeof failed, all.data(), "the checkpoint load status");
  std::string ranks;
  for (int q = 0; q < g.size(); ++q)
    if (all[q] != 0) ranks += (ranks.empty() ? "" : ", ") + std::to_string(q);
  if (!ranks.empty())
    throw Error(where(g) + "the checkpoint could not be loaded on rank(s) " + ranks +
                (why.empty() ? " (their own messages say why)" : ": " + why));
}

}  // namespace detail

// Data parallelism over a Group (a Communicator: MPI; SoloGroup: one
// process): every rank builds the same model and optimizer (same seed) and
// calls the same steps; rank r computes the shards owned_shards(S, size, r).
// Construct it after the parameters and constants are recorded (it takes the
// tape's mark, as LocalShards).
template <class Opt>
class DataParallel {
 public:
  using T = value_type_of<Opt>;

  DataParallel(Group& group, Opt& opt, ShardOptions options)
      : group_(&group), opt_(&opt), options_(options), rank_(group.rank()) {
    if (options.shards == 0) throw Error("grad::dist: shards must be at least 1");
    if (!opt.tape()) throw Error("grad::dist: the optimizer has no parameters (add them before)");
    exchange_.emplace(group, opt.elements(), options);
    mark_ = opt.tape()->mark();
    check_model();
    if (options.broadcast_initial) broadcast_parameters();
    own_losses_.resize(owned().size());
    losses_.resize(options.shards);
  }

  // This rank's shards (loss_of(s) records shard s's loss after the mark and
  // returns it), then the ordered reduction into the tape's gradient buffers
  // of the optimizer's parameters, on every rank; returns the folded loss,
  // the same on every rank. Throws Error on every rank when a shard failed
  // on any of them.
  template <class LossOf>
  T backward(LossOf&& loss_of) {
    using clock = std::chrono::steady_clock;
    const auto t0 = clock::now();
    group_->set_step(opt_->steps() + 1);
    Tape<T>& tp = *opt_->tape();
    const std::size_t p = opt_->elements();
    const int world = group_->size();
    std::string failure;
    for (std::size_t k = 0; k < owned().size() && failure.empty(); ++k) {
      const std::size_t s = owned().begin + k;
      tp.reset_to(mark_, grad::drop_gradients);  // each shard starts afresh: no sum is lost
      Var<T> loss;
      try {  // an exception on one rank must not leave the others waiting in the next collective
        loss = loss_of(s);
      } catch (const std::exception& e) {
        failure = "shard " + std::to_string(s) + ": loss_of threw: " + e.what();
        break;
      }
      if (!tp.backward(loss)) {
        failure = "shard " + std::to_string(s) + ": " + tp.error();
        break;
      }
      own_losses_[k] = tp.scalar(loss);
      // Shard s's pieces of every rank's slice, straight from the tape into the send buffer.
      for (int q = 0; q < world && failure.empty(); ++q) {
        failure = copy_flat_grads(*opt_, slice_of(p, world, q), exchange_->piece(k, q));
        if (!failure.empty()) failure = "shard " + std::to_string(s) + ": " + failure;
      }
    }
    compute_seconds_ += std::chrono::duration<double>(clock::now() - t0).count();
    detail::gather_shard_losses<T>(*group_, options_, own_losses_, failure, opt_->steps() + 1, losses_);
    write_flat_grads(*opt_, exchange_->reduce(fold_seconds_).data());
    return fold_losses<T>(losses_, options_.combine);
  }

  // backward(loss_of), then the optimizer's step on every rank; every
  // check_every steps the replicas compare parameter checksums.
  template <class LossOf>
  T step(LossOf&& loss_of) {
    const T loss = backward(loss_of);
    const auto t0 = std::chrono::steady_clock::now();
    if (!opt_->step()) throw Error(detail::where(*group_) + "the optimizer step failed: " + opt_->tape()->error());
    compute_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (options_.check_every > 0 && opt_->steps() % options_.check_every == 0) check_replicas();
    return loss;
  }

  // Compares every rank's parameter checksum with rank 0's; throws Error on
  // every rank, naming the ranks that differ, when one does.
  void check_replicas() {
    detail::compare_checksums(*group_, parameter_checksum(*opt_), opt_->steps(), options_.check_every);
  }

  // Copies rank 0's parameter values to every rank.
  void broadcast_parameters() {
    for (const auto& e : opt_->params()) {
      std::span<T> v = opt_->tape()->leaf_value(e.var);
      group_->broadcast(v.data(), v.size_bytes(), 0, "the initial parameter broadcast");
    }
  }

  // Rank 0 writes the checkpoint (grad::save_checkpoint: atomic, checksummed);
  // every rank returns when the file is in place. Throws Error on every rank
  // when the write failed.
  void save_checkpoint(const std::string& path) {
    detail::save_on_rank0(*group_, [&] {
      CheckpointResult r = grad::save_checkpoint(path, *opt_->tape(), *opt_, detail::shard_notes(options_));
      return r.error;
    });
  }
  // Every rank reads the same file (a shared file system, or a copy on every
  // host); the replicas are then compared. The rank count may differ from
  // the run that wrote it: nothing in the file depends on it. The shard
  // count and combine mode may not (the file records them: another S sums
  // in another order, so the run would not continue on the same bits); to
  // change them on purpose, load with grad::load_checkpoint on every rank
  // before constructing the DataParallel.
  void load_checkpoint(const std::string& path) {
    detail::load_on_every_rank(*group_, [&] {
      CheckpointResult r = grad::load_checkpoint(path, *opt_->tape(), *opt_, detail::shard_notes(options_));
      return r.error;
    });
    check_replicas();
  }

  Group& group() const { return *group_; }
  Range owned() const { return exchange_->owned(); }
  std::span<const T> shard_losses() const { return losses_; }
  const ShardOptions& options() const { return options_; }
  // Seconds this rank spent computing its shards and the update, and folding.
  double compute_seconds() const { return compute_seconds_; }
  double fold_seconds() const { return fold_seconds_; }
  void reset_timers() { compute_seconds_ = fold_seconds_ = 0; }

 private:
  // Every rank's parameter list against rank 0's: the first collective.
  void check_model() {
    std::vector<std::uint64_t> shapes;
    std::string words;
    for (const auto& e : opt_->params()) {
      const View<T> v = opt_->tape()->value(e.var);
      shapes.push_back(v.rank());
      for (std::size_t d : v.shape) shapes.push_back(d);
      if (!words.empty()) words += ' ';
      words += shape_string(v.shape);
    }
    detail::check_same_model(*group_,
                             {sizeof(T), options_.shards, static_cast<std::uint64_t>(options_.combine),
                              opt_->params().size(), opt_->elements(), detail::fingerprint(shapes)},
                             words);
  }

  Group* group_;
  Opt* opt_;
  ShardOptions options_;
  int rank_;
  std::optional<ShardExchange<T>> exchange_;
  typename Tape<T>::Mark mark_;
  std::vector<T> own_losses_, losses_;
  double compute_seconds_ = 0, fold_seconds_ = 0;
};

}  // namespace grad::dist
