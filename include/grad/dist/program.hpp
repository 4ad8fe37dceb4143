// grad::dist for captured device programs (grad/device/device.hpp): ProgramParallel.
//
// Each shard is one replay of the same captured Program: the caller's
// set_shard(s) writes shard s's inputs (Program::set_input), the program runs
// forward and backward on its backend, and the shard's gradient (the device
// optimizer's parameters, flattened in add order) joins the reduction of
// grad/dist.hpp in the same order. The reduced gradient goes back into the
// program's gradient buffer (Engine::write_grads, or in place on the GPU)
// and the device optimizer steps on it, on every rank. A program replays the
// tape's bits, so on the CPU backend, in every mode, on any number of ranks,
// ProgramParallel lands on the bits of LocalShards / DataParallel over the
// same shards on the tape (test_dist and dist_mpi check it).
//
//   auto program = grad::device::capture(tape, shard_loss, {.backend = grad::device::Backend::cuda});
//   grad::device::Adam<float> opt(program, 1e-3f);  opt.add(w);  ...
//   grad::dist::Communicator comm(&argc, &argv);      // or grad::dist::SoloGroup: one process
//   grad::dist::ProgramParallel<float> ddp(comm, opt, {.shards = 8});
//   float loss = ddp.step([&](std::size_t s) { program.set_input(x, rows_of_shard(s)); });
//
// The gradient moves through a GradientReduction: HostReduction (the
// default) copies each shard's gradient to the host and reduces it with
// ShardExchange over the Group; grad::dist::nccl::ShardReducer
// (grad/dist_nccl.hpp) keeps it on the GPU and reduces over NCCL.
//
// Shards share one program and so its shapes: cut the batch into S equal
// shards (B % S == 0). Every parameter added to the optimizer must be
// reached by the captured loss. The program's element type is the
// optimizer's (capture a Tape<float> to train in float32).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "grad/device/capture.hpp"
#include "grad/device/optimizers.hpp"
#include "grad/dist.hpp"

namespace grad::dist {

// Where one parameter's gradient lies: at `engine` in the program's gradient
// buffer, at `flat` in the flattened gradient (add order), `size` values.
struct GradRun {
  std::size_t engine = 0, flat = 0, size = 0;
};

// How a ProgramParallel moves and reduces its shards' gradients.
template <class T>
class GradientReduction {
 public:
  virtual ~GradientReduction() = default;
  // The shards this rank computes.
  virtual Range owned() const = 0;
  // Takes shard owned().begin + k's gradient from the engine's gradient buffer.
  virtual void load(std::size_t k, device::Engine<T>& engine, std::span<const GradRun> runs) = 0;
  // The ordered reduction of every rank's shards (a collective).
  virtual void reduce() = 0;
  // Writes the reduced gradient into the engine's gradient buffer.
  virtual void store(device::Engine<T>& engine, std::span<const GradRun> runs) = 0;
  // Seconds spent folding so far (0 where the fold runs asynchronously).
  virtual double fold_seconds() const { return 0; }
};

// Through the host: Engine::read_grads, ShardExchange over the Group, Engine::write_grads.
template <class T>
class HostReduction final : public GradientReduction<T> {
 public:
  HostReduction(Group& group, std::size_t elements, const ShardOptions& options)
      : exchange_(group, elements, options), flat_(elements) {}
  Range owned() const override { return exchange_.owned(); }
  void load(std::size_t k, device::Engine<T>& engine, std::span<const GradRun> runs) override {
    for (const GradRun& r : runs) engine.read_grads(r.engine, std::span<T>(flat_.data() + r.flat, r.size));
    exchange_.put(k, flat_.data());
  }
  void reduce() override { reduced_ = exchange_.reduce(fold_seconds_); }
  void store(device::Engine<T>& engine, std::span<const GradRun> runs) override {
    for (const GradRun& r : runs) engine.write_grads(r.engine, reduced_.subspan(r.flat, r.size));
  }
  double fold_seconds() const override { return fold_seconds_; }

 private:
  ShardExchange<T> exchange_;
  std::vector<T> flat_;
  std::span<const T> reduced_;
  double fold_seconds_ = 0;
};

template <class T>
class ProgramParallel {
 public:
  // With the host reduction over `group`.
  ProgramParallel(Group& group, device::Optimizer<T>& opt, ShardOptions options)
      : ProgramParallel(group, opt, options, nullptr) {}
  // With another reduction (grad::dist::nccl::ShardReducer), made for the same
  // group, elements(opt) values and options; it must outlive this object.
  ProgramParallel(Group& group, device::Optimizer<T>& opt, ShardOptions options, GradientReduction<T>& reduction)
      : ProgramParallel(group, opt, options, &reduction) {}

  // P: the flattened gradient's length (the reached parameters' elements).
  static std::size_t elements(const device::Optimizer<T>& opt) {
    std::size_t p = 0;
    for (const device::ParamSlot& s : opt.slots()) p += s.size;
    return p;
  }

  // This rank's shards (set_shard(s) writes shard s's inputs into the
  // program), then the ordered reduction into the program's gradient
  // buffer on every rank; returns the folded loss, the same on every rank.
  // Throws Error on every rank when a shard failed on any of them.
  template <class SetShard>
  T backward(SetShard&& set_shard) {
    using clock = std::chrono::steady_clock;
    const auto t0 = clock::now();
    const std::uint64_t step = opt_->steps() + 1;
    group_->set_step(step);
    std::string failure;
    for (std::size_t k = 0; k < owned().size(); ++k) {
      const std::size_t s = owned().begin + k;
      try {  // a failure on one rank must not leave the others waiting in the next collective
        set_shard(s);
        program_->forward();
        program_->backward();
        own_losses_[k] = program_->loss();
        reduction_->load(k, *engine_, runs_);
      } catch (const std::exception& e) {
        failure = "shard " + std::to_string(s) + ": " + e.what();
        break;
      }
    }
    compute_seconds_ += std::chrono::duration<double>(clock::now() - t0).count();
    detail::gather_shard_losses<T>(*group_, options_, own_losses_, failure, step, losses_);
    reduction_->reduce();
    reduction_->store(*engine_, runs_);
    return fold_losses<T>(losses_, options_.combine);
  }

  // backward(set_shard), then the device optimizer's step on every rank;
  // every check_every steps the replicas compare parameter checksums.
  template <class SetShard>
  T step(SetShard&& set_shard) {
    const T loss = backward(set_shard);
    opt_->step();
    if (options_.check_every > 0 && opt_->steps() % options_.check_every == 0) check_replicas();
    return loss;
  }

  // Compares every rank's parameter checksum (FNV-1a over the values, add
  // order) with rank 0's; throws Error on every rank when one differs.
  void check_replicas() {
    std::uint64_t h = grad::detail::fnv1a_offset;
    for (const device::ParamSlot& slot : opt_->slots()) {
      scratch_.resize(slot.size);
      engine_->read_values(slot.value, scratch_);
      h = grad::detail::fnv1a(grad::detail::bytes_of(std::span<const T>(scratch_)), h);
    }
    detail::compare_checksums(*group_, h, opt_->steps(), options_.check_every);
  }

  // Copies rank 0's parameter values into every rank's program.
  void broadcast_parameters() {
    for (const device::ParamSlot& slot : opt_->slots()) {
      scratch_.resize(slot.size);
      engine_->read_values(slot.value, scratch_);
      group_->broadcast(scratch_.data(), slot.size * sizeof(T), 0, "the initial parameter broadcast");
      engine_->write_values(slot.value, scratch_);
    }
  }

  // Checkpoints through a host optimizer of the same kind with the same
  // parameters in add order (device::Optimizer::copy_to / copy_from):
  // rank 0 writes (atomically, with S and the combine mode as notes); every
  // rank reads the same file and the replicas are compared. A file written by
  // DataParallel or LocalShards on the tape loads here too, and the other way.
  template <class HostOpt>
  void save_checkpoint(const std::string& path, Tape<T>& tape, HostOpt& host) {
    detail::save_on_rank0(*group_, [&]() -> std::string {
      try {
        opt_->copy_to(tape, host);
      } catch (const std::exception& e) {
        return e.what();
      }
      return grad::save_checkpoint(path, tape, host, detail::shard_notes(options_)).error;
    });
  }
  template <class HostOpt>
  void load_checkpoint(const std::string& path, Tape<T>& tape, HostOpt& host) {
    detail::load_on_every_rank(*group_, [&]() -> std::string {
      if (CheckpointResult r = grad::load_checkpoint(path, tape, host, detail::shard_notes(options_)); !r)
        return r.error;
      try {
        opt_->copy_from(tape, host);
      } catch (const std::exception& e) {
        return e.what();
      }
      return {};
    });
    check_replicas();
  }

  Range owned() const { return reduction_->owned(); }
  std::span<const T> shard_losses() const { return losses_; }
  const ShardOptions& options() const { return options_; }
  double compute_seconds() const { return compute_seconds_; }
  double fold_seconds() const { return reduction_->fold_seconds(); }

 private:
  ProgramParallel(Group& group, device::Optimizer<T>& opt, ShardOptions options, GradientReduction<T>* reduction)
      : group_(&group), opt_(&opt), program_(&opt.program()), options_(options) {
    const std::string who = detail::where(group) + "ProgramParallel: ";
    if (options.shards == 0) throw Error("grad::dist: shards must be at least 1");
    opt.program().with_engine([&](auto& e, auto zero) {
      if constexpr (std::is_same_v<decltype(zero), T>) engine_ = &e;
    });
    if (!engine_)
      throw Error(who +
                  "the program computes in float32 but the optimizer is double; capture a Tape<float> "
                  "to train in float32");
    if (opt.slots().size() != opt.added())
      throw Error(who + std::to_string(opt.added() - opt.slots().size()) + " of the optimizer's " +
                  std::to_string(opt.added()) +
                  " parameters are not reached by the captured loss; every parameter must be");
    if (opt.slots().empty()) throw Error(who + "the optimizer has no parameters (add them before)");
    std::vector<std::uint64_t> sizes;
    std::string words;
    std::size_t flat = 0;
    for (const device::ParamSlot& slot : opt.slots()) {
      runs_.push_back({slot.grad, flat, slot.size});
      flat += slot.size;
      sizes.push_back(slot.size);
      if (!words.empty()) words += ' ';
      words += std::to_string(slot.size);
    }
    sizes.push_back(program_->nodes());
    if (reduction) {
      reduction_ = reduction;
    } else {
      own_reduction_.emplace(group, flat, options);
      reduction_ = &*own_reduction_;
    }
    if (reduction_->owned().size() != owned_shards(options.shards, group.size(), group.rank()).size())
      throw Error(who + "the reduction was made for other shard options or another group");
    detail::check_same_model(group,
                             {sizeof(T), options.shards, static_cast<std::uint64_t>(options.combine),
                              opt.slots().size(), flat, detail::fingerprint(sizes)},
                             "parameter sizes " + words);
    if (options.broadcast_initial) broadcast_parameters();
    own_losses_.resize(owned().size());
    losses_.resize(options.shards);
  }

  Group* group_;
  device::Optimizer<T>* opt_;
  device::Program<T>* program_;
  device::Engine<T>* engine_ = nullptr;
  ShardOptions options_;
  std::vector<GradRun> runs_;
  std::optional<HostReduction<T>> own_reduction_;
  GradientReduction<T>* reduction_ = nullptr;
  std::vector<T> own_losses_, losses_, scratch_;
  double compute_seconds_ = 0;
};

}  // namespace grad::dist
