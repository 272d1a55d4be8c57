#pragma once
// Fires the Trainer's events on its callbacks, in the order they were added.

#include <memory>
#include <utility>
#include <vector>

#include <mantissa/trainer_callback.h>
#include <mantissa/training_arguments.h>

namespace mantissa::detail {

/// The callbacks of one Trainer, bound to its arguments, state and control flags (which
/// outlive it: all are members of the same Trainer). Python: `transformers.CallbackHandler`
/// (`call_event`). Callbacks run on the host; firing an event never syncs with the device.
class CallbackHandler {
 public:
  /// A handler without callbacks, bound to the Trainer's arguments, state and control flags.
  CallbackHandler(const TrainingArguments& args, TrainerState& state, TrainerControl& control)
      : args_(&args), state_(&state), control_(&control) {}

  /// Appends `callback` (not null).
  void add(std::shared_ptr<TrainerCallback> callback) { callbacks_.push_back(std::move(callback)); }

  /// Calls `event` on every callback: `fire(&TrainerCallback::on_step_end)`, or with the
  /// event's extra argument, `fire(&TrainerCallback::on_log, logs)`.
  template <typename... Extra, typename... Given>
  void fire(void (TrainerCallback::*event)(const TrainingArguments&, TrainerState&, TrainerControl&,
                                           Extra...),
            const Given&... extra) const {
    for (const auto& callback : callbacks_) {
      ((*callback).*event)(*args_, *state_, *control_, extra...);
    }
  }

 private:
  const TrainingArguments* args_;
  TrainerState* state_;
  TrainerControl* control_;
  std::vector<std::shared_ptr<TrainerCallback>> callbacks_;
};

}  // namespace mantissa::detail
