#pragma once
// ZeRO-3's parameter side: the parameters of a fully sharded run live as this rank's shards, and
// each sharding unit (a block of the model, or the root: every parameter outside the blocks)
// is all-gathered into its whole buffers just before it runs and freed right after, in the
// forward and again in the backward, with the next unit's gather started early so that it
// overlaps the current unit's compute. Python: FSDP2's `FSDPParamGroup` unshard / reshard and
// its pre-forward, post-forward, pre-backward and post-backward hooks.

#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include "trainer/sharded/flat_parameters.h"

namespace mantissa::detail::sharded {

/// The units of a `FlatParameters` with `FlatStorage::kShardsOnly`, gathered and freed. Unit 0 is
/// the root; units 1.. are the blocks, each run through `run_block`.
///
/// Every collective goes out in an order that depends only on the model's sequence of block
/// calls, so it is the same on every rank. Not thread-safe: one training thread (and autograd's
/// engine on it, as on the CPU and for one device) drives it.
class ParameterUnits {
 public:
  /// `names[u]` names unit `u` in errors and the log ("the root", "layers.3"); the layout's
  /// bucket units index it. `flat` must outlive this object.
  ParameterUnits(FlatParameters& flat, c10::intrusive_ptr<c10d::ProcessGroup> group,
                 std::vector<std::string> names);
  ~ParameterUnits();
  ParameterUnits(const ParameterUnits&) = delete;
  ParameterUnits& operator=(const ParameterUnits&) = delete;

  /// The number of units, the root included.
  std::size_t size() const noexcept { return names_.size(); }
  /// Unit `u`'s name.
  const std::string& name(std::size_t u) const { return names_.at(u); }
  /// Elements of unit `u`'s whole buffers (padding included): what gathering it adds.
  std::int64_t gathered_numel(std::size_t u) const;
  /// Bytes of unit `u`'s whole buffers.
  std::int64_t gathered_bytes(std::size_t u) const;
  /// Unit `u`'s parameters.
  std::vector<at::Tensor> params(std::size_t u) const;

  /// Starts gathering unit `u` unless it is gathered or on its way. A collective.
  void start_gather(std::size_t u);
  /// Unit `u` gathered: its parameters hold the whole values on return. A collective; waits.
  void gather(std::size_t u);
  /// Frees unit `u`'s whole buffers (after waiting for a gather in flight), unless every unit is
  /// pinned. No collective.
  void release(std::size_t u);
  /// Every unit gathered. A collective; waits.
  void gather_all();
  /// Every unit freed, unless pinned. No collective.
  void release_all();
  /// Whether unit `u` is gathered or on its way.
  bool is_gathered(std::size_t u) const { return state_.at(u) != State::kFree; }

  /// While alive, every unit stays gathered: `release` and `release_all` do nothing. For the
  /// whole-model work of saving and loading. A collective when made; frees on destruction.
  class Pin {
   public:
    explicit Pin(ParameterUnits& units);
    ~Pin();
    Pin(const Pin&) = delete;
    Pin& operator=(const Pin&) = delete;

   private:
    ParameterUnits& units_;
  };

  /// Begins a forward pass: the root gathered, the order of block calls recorded afresh. A
  /// collective.
  void begin_forward();
  /// After an evaluation pass: every unit freed. After a training pass: nothing (the root stays
  /// gathered for the backward). Never throws (it runs when a forward scope ends): a failure of
  /// a gather it waits for is raised by the next `begin_forward` or `finish`.
  void end_forward(bool training) noexcept;
  /// After the backward of an update: every unit freed; raises a failure `end_forward` kept.
  void finish();
  /// Throws `c10::ValueError` naming the first block unit no forward has run through
  /// `run_block` since construction, once a forward has ended; nothing before. (A block used
  /// outside `run_block` mostly fails in that forward already: its parameters are empty.)
  void check_blocks_ran() const;
  /// Whether a forward has ended since construction.
  bool forward_ended() const noexcept { return forward_ended_; }

  /// Runs block unit `u`'s `fn(x)`: gathers the unit (and starts gathering the next block of the
  /// last forward's order), runs `fn`, and frees the unit again. When autograd records the
  /// call, the block's output carries a node that gathers the unit again before the block's
  /// backward (and starts gathering the block before it), and the input one that frees it
  /// after. A collective.
  at::Tensor run_block(std::size_t u, const std::function<at::Tensor(const at::Tensor&)>& fn,
                       const at::Tensor& x);

  /// Autograd's side of `run_block` (called from its nodes).
  void before_block_backward(std::size_t u);
  void after_block_backward(std::size_t u);

 private:
  enum class State { kFree, kGathering, kGathered };
  void wait(std::size_t u);
  // The unit after (`step` +1) or before (-1) `u` in `order`, or nothing.
  static std::optional<std::size_t> neighbour(const std::vector<std::size_t>& order, std::size_t u,
                                              int step);

  FlatParameters& flat_;
  c10::intrusive_ptr<c10d::ProcessGroup> group_;
  std::vector<std::string> names_;
  std::vector<std::vector<std::size_t>> buckets_;  // per unit
  std::vector<State> state_;
  std::vector<std::vector<c10::intrusive_ptr<c10d::Work>>> works_;  // per unit, in flight
  std::vector<bool> ran_;  // per unit: run through run_block since construction
  std::vector<std::size_t> order_;       // block units in the current forward's call order
  std::vector<std::size_t> last_order_;  // the previous forward's
  std::exception_ptr deferred_;  // a failure end_forward could not raise
  int pins_ = 0;
  bool forward_ended_ = false;
};

}  // namespace mantissa::detail::sharded
