#pragma once
// Fires the Trainer's events on its callbacks, in the order they were added.

#include <memory>
#include <utility>
#include <vector>

#include <mantissa/trainer_callback.h>
#include <mantissa/training_arguments.h>

#include "scoped_value.h"

namespace mantissa::detail {

/// The callbacks of one Trainer, bound to its arguments, state and control flags (which
/// outlive it: all are members of the same Trainer). Python: `transformers.CallbackHandler`
/// (`call_event`). Callbacks run on the host; firing an event never syncs with the device.
class CallbackHandler {
 public:
  /// A handler without callbacks, bound to the Trainer's arguments, state, control flags and
  /// the context its events expose (whose pointers the Trainer fills in as it creates things).
  CallbackHandler(const TrainingArguments& args, TrainerState& state, TrainerControl& control,
                  const TrainerCallbackContext& context)
      : args_(&args), state_(&state), control_(&control), context_(&context) {}

  /// Appends `callback` (not null).
  void add(std::shared_ptr<TrainerCallback> callback) { callbacks_.push_back(std::move(callback)); }

  /// Calls `event` on every callback: `fire(&TrainerCallback::on_step_end)`, or with the
  /// event's extra argument, `fire(&TrainerCallback::on_log, logs)`.
  template <typename... Extra, typename... Given>
  void fire(void (TrainerCallback::*event)(const TrainingArguments&, TrainerState&, TrainerControl&,
                                           Extra...),
            const Given&... extra) const {
    for (const auto& callback : callbacks_) {
      // Set for the event only: one callback object may serve several Trainers.
      const ScopedValue<const TrainerCallbackContext*> scope(callback->context_, context_);
      ((*callback).*event)(*args_, *state_, *control_, extra...);
    }
  }

 private:
  const TrainingArguments* args_;
  TrainerState* state_;
  TrainerControl* control_;
  const TrainerCallbackContext* context_;
  std::vector<std::shared_ptr<TrainerCallback>> callbacks_;
};

}  // namespace mantissa::detail
