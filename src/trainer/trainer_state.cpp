// trainer_state.json, the callback context and the early-stopping callback.
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <utility>

#include <c10/util/Exception.h>
#include <nlohmann/json.hpp>

#include <mantissa/amp/grad_scaler.h>
#include <mantissa/lr_scheduler.h>
#include <mantissa/trainer_callback.h>

#include "io/json_number.h"
#include "io/json_reader.h"

namespace mantissa {
namespace {

using nlohmann::json;

double to_double(const json& value, const std::string& key) {
  if (value.is_number()) return value.get<double>();
  if (value.is_string()) {
    const auto text = value.get<std::string>();
    if (text == "NaN") return std::nan("");
    if (text == "Infinity") return INFINITY;
    if (text == "-Infinity") return -INFINITY;
  }
  TORCH_CHECK(false, "trainer_state.json: log_history value of '", key,
              "' is not a number: ", io::describe_json(value));
}

// An integer field of `object`, or `fallback` when it is absent (an absent field without a
// fallback is an error). A float, a string or a value beyond int64 is an error naming the key.
std::int64_t integer(const json& object, const char* key, std::optional<std::int64_t> fallback,
                     const char* prefix = "") {
  TORCH_CHECK_VALUE(object.is_object(), "trainer_state.json: '",
                    std::string(prefix).substr(0, std::strlen(prefix) - 1),
                    "' must be a JSON object");
  const auto it = object.find(key);
  if (it == object.end()) {
    TORCH_CHECK_VALUE(fallback.has_value(), "trainer_state.json has no '", prefix, key, "'");
    return *fallback;
  }
  const bool fits = it->is_number_integer() &&
                    (!it->is_number_unsigned() ||
                     it->get<std::uint64_t>() <=
                         static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()));
  TORCH_CHECK_VALUE(fits, "trainer_state.json: '", prefix, key,
                    "' must be an integer that fits in 64 bits, not ",
                    it->is_number() ? "the number " + std::to_string(it->get<double>())
                                    : std::string(it->type_name()));
  return it->get<std::int64_t>();
}

// Values no run can produce: each would send the resumed loop out of its bounds (a negative
// position in the epoch reads before the shuffled order). How the values fit the run being
// resumed (the dataset, the batch size) is checked by the Trainer.
void check_ranges(const TrainerState& state) {
  auto non_negative = [](const char* key, std::int64_t value) {
    TORCH_CHECK_VALUE(value >= 0, "trainer_state.json: '", key, "' is ", value,
                      ", but it counts something and cannot be negative");
  };
  non_negative("global_step", state.global_step);
  non_negative("max_steps", state.max_steps);
  non_negative("train_batch_size", state.train_batch_size);
  non_negative("num_train_epochs", state.num_train_epochs);
  non_negative("num_input_tokens_seen", state.num_input_tokens_seen);
  if (state.best_global_step) non_negative("best_global_step", *state.best_global_step);
  non_negative("mantissa.steps_in_epoch", state.steps_in_epoch);
  non_negative("mantissa.skipped_steps", state.skipped_steps);
  for (const auto& [key, value] :
       {std::pair<const char*, std::int64_t>{"logging_steps", state.logging_steps},
        {"eval_steps", state.eval_steps},
        {"save_steps", state.save_steps}}) {
    TORCH_CHECK_VALUE(value >= 0, "trainer_state.json: '", key, "' is ", value,
                      ", but an interval cannot be negative");
  }
  TORCH_CHECK_VALUE(std::isfinite(state.epoch) && state.epoch >= 0,
                    "trainer_state.json: 'epoch' is ", state.epoch,
                    ", but it must be a finite number >= 0");
  TORCH_CHECK_VALUE(state.skipped_steps <= state.global_step,
                    "trainer_state.json: 'mantissa.skipped_steps' is ", state.skipped_steps,
                    ", more than the ", state.global_step, " steps taken ('global_step')");
  TORCH_CHECK_VALUE(!state.best_metric || !std::isnan(*state.best_metric),
                    "trainer_state.json: 'best_metric' is NaN, which cannot rank checkpoints");
}

}  // namespace

std::string TrainerState::to_json() const {
  json history = json::array();
  for (const auto& entry : log_history) {
    json item = json::object();
    for (const auto& [key, value] : entry) item[key] = io::json_log_value(value);
    history.push_back(std::move(item));
  }
  json doc = {
      {"best_global_step", best_global_step ? json(*best_global_step) : json(nullptr)},
      {"best_metric", best_metric ? json(*best_metric) : json(nullptr)},
      {"best_model_checkpoint",
       best_model_checkpoint ? json(*best_model_checkpoint) : json(nullptr)},
      {"epoch", epoch},
      {"eval_steps", eval_steps},
      {"global_step", global_step},
      {"is_hyper_param_search", false},
      {"is_local_process_zero", is_local_process_zero},
      {"is_world_process_zero", is_world_process_zero},
      {"log_history", history},
      {"logging_steps", logging_steps},
      {"max_steps", max_steps},
      {"num_input_tokens_seen", num_input_tokens_seen},
      {"num_train_epochs", num_train_epochs},
      {"save_steps", save_steps},
      {"stateful_callbacks", json::object()},
      {"total_flos", 0},
      {"train_batch_size", train_batch_size},
      {"trial_name", nullptr},
      {"trial_params", nullptr},
      {"mantissa", {{"steps_in_epoch", steps_in_epoch}, {"skipped_steps", skipped_steps}}},
  };
  return doc.dump(2) + "\n";
}

TrainerState TrainerState::from_json(const std::string& text) {
  json doc;
  try {
    doc = io::parse_json_text<json>(text);
  } catch (const io::JsonTextError& e) {
    TORCH_CHECK(false, "trainer_state.json is not valid JSON: ", e.what());
  }
  TORCH_CHECK(doc.is_object(), "trainer_state.json must hold a JSON object");
  TrainerState state;
  try {
    state.epoch = doc.at("epoch").get<double>();
    state.global_step = integer(doc, "global_step", std::nullopt);
    state.max_steps = integer(doc, "max_steps", 0);
    state.logging_steps = integer(doc, "logging_steps", 500);
    state.eval_steps = integer(doc, "eval_steps", 500);
    state.save_steps = integer(doc, "save_steps", 500);
    state.train_batch_size = integer(doc, "train_batch_size", 0);
    state.num_train_epochs = integer(doc, "num_train_epochs", 0);
    state.num_input_tokens_seen = integer(doc, "num_input_tokens_seen", 0);
    if (doc.contains("best_global_step") && !doc["best_global_step"].is_null()) {
      state.best_global_step = integer(doc, "best_global_step", std::nullopt);
    }
    if (doc.contains("best_metric") && !doc["best_metric"].is_null()) {
      state.best_metric = doc["best_metric"].get<double>();
    }
    if (doc.contains("best_model_checkpoint") && !doc["best_model_checkpoint"].is_null()) {
      state.best_model_checkpoint = doc["best_model_checkpoint"].get<std::string>();
    }
    for (const auto& item : doc.value("log_history", json::array())) {
      LogEntry entry;
      for (const auto& [key, value] : item.items()) entry[key] = to_double(value, key);
      state.log_history.push_back(std::move(entry));
    }
    if (doc.contains("mantissa")) {
      state.steps_in_epoch = integer(doc["mantissa"], "steps_in_epoch", 0, "mantissa.");
      state.skipped_steps = integer(doc["mantissa"], "skipped_steps", 0, "mantissa.");
    }
  } catch (const json::exception& e) {
    TORCH_CHECK(false, "trainer_state.json has a missing or mistyped field: ", e.what());
  }
  check_ranges(state);
  return state;
}

double TrainerCallbackContext::learning_rate() const {
  if (lr_scheduler == nullptr) return 0.0;
  const auto lrs = lr_scheduler->get_last_lr();
  return lrs.empty() ? 0.0 : lrs.front();
}

double TrainerCallbackContext::loss_scale() const {
  return scaler != nullptr && scaler->is_enabled() ? scaler->get_scale() : 1.0;
}

const TrainerCallbackContext& TrainerCallback::context() const {
  TORCH_CHECK(context_ != nullptr,
              "TrainerCallback::context() is only available inside an event a Trainer fires");
  return *context_;
}

EarlyStoppingCallback::EarlyStoppingCallback(std::int64_t patience, double threshold,
                                             std::optional<std::string> metric,
                                             std::optional<bool> greater_is_better)
    : patience_(patience),
      threshold_(threshold),
      metric_(std::move(metric)),
      greater_is_better_(greater_is_better) {
  TORCH_CHECK_VALUE(patience >= 1, "early_stopping_patience must be >= 1, got ", patience);
  TORCH_CHECK_VALUE(threshold >= 0, "early_stopping_threshold must be >= 0, got ", threshold);
}

void EarlyStoppingCallback::on_evaluate(const TrainingArguments& args, TrainerState&,
                                        TrainerControl& control, const LogEntry& metrics) {
  std::string metric = metric_.value_or(args.resolved_metric_for_best_model());
  if (metric.rfind("eval_", 0) != 0) metric = "eval_" + metric;
  const bool greater = greater_is_better_.value_or(args.resolved_greater_is_better());
  const auto it = metrics.find(metric);
  TORCH_CHECK_VALUE(it != metrics.end(), "EarlyStoppingCallback: the evaluation did not report '",
                    metric, "' (metric_for_best_model)");
  const double value = it->second;
  // HF's check_metric_value: improvement must beat the best by more than the threshold.
  const bool improved =
      !best_.has_value() || (greater ? value > *best_ && std::fabs(value - *best_) > threshold_
                                     : value < *best_ && std::fabs(value - *best_) > threshold_);
  if (improved) {
    best_ = value;
    patience_counter_ = 0;
  } else {
    ++patience_counter_;
  }
  if (patience_counter_ >= patience_) control.should_training_stop = true;
}

}  // namespace mantissa
