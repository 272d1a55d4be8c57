// trainer_state.json and the early-stopping callback.
#include <cmath>

#include <c10/util/Exception.h>
#include <nlohmann/json.hpp>

#include <mantissa/trainer_callback.h>

#include "io/json_reader.h"

namespace mantissa {
namespace {

using nlohmann::json;

// HF writes integral values (step, total_flos) as JSON integers; keep that so Python tools
// that read trainer_state.json see the same types.
json number(double value) {
  if (std::isfinite(value) && std::floor(value) == value && std::fabs(value) < 9007199254740992.0) {
    return static_cast<std::int64_t>(value);
  }
  if (!std::isfinite(value)) return std::isnan(value) ? json("NaN") : json(value > 0 ? "Infinity" : "-Infinity");
  return value;
}

double to_double(const json& value, const std::string& key) {
  if (value.is_number()) return value.get<double>();
  if (value.is_string()) {
    const auto text = value.get<std::string>();
    if (text == "NaN") return std::nan("");
    if (text == "Infinity") return INFINITY;
    if (text == "-Infinity") return -INFINITY;
  }
  TORCH_CHECK(false, "trainer_state.json: log_history value of '", key, "' is not a number: ", io::describe_json(value));
}

}  // namespace

std::string TrainerState::to_json() const {
  json history = json::array();
  for (const auto& entry : log_history) {
    json item = json::object();
    for (const auto& [key, value] : entry) item[key] = number(value);
    history.push_back(std::move(item));
  }
  json doc = {
      {"best_metric", best_metric ? json(*best_metric) : json(nullptr)},
      {"best_model_checkpoint", best_model_checkpoint ? json(*best_model_checkpoint) : json(nullptr)},
      {"epoch", epoch},
      {"eval_steps", eval_steps},
      {"global_step", global_step},
      {"is_hyper_param_search", false},
      {"is_local_process_zero", true},
      {"is_world_process_zero", true},
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
    state.global_step = doc.at("global_step").get<std::int64_t>();
    state.max_steps = doc.value("max_steps", std::int64_t{0});
    state.logging_steps = doc.value("logging_steps", std::int64_t{500});
    state.eval_steps = doc.value("eval_steps", std::int64_t{500});
    state.save_steps = doc.value("save_steps", std::int64_t{500});
    state.train_batch_size = doc.value("train_batch_size", std::int64_t{0});
    state.num_train_epochs = doc.value("num_train_epochs", std::int64_t{0});
    state.num_input_tokens_seen = doc.value("num_input_tokens_seen", std::int64_t{0});
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
      state.steps_in_epoch = doc["mantissa"].value("steps_in_epoch", std::int64_t{0});
      state.skipped_steps = doc["mantissa"].value("skipped_steps", std::int64_t{0});
    }
  } catch (const json::exception& e) {
    TORCH_CHECK(false, "trainer_state.json has a missing or mistyped field: ", e.what());
  }
  return state;
}

EarlyStoppingCallback::EarlyStoppingCallback(std::int64_t patience, double threshold, std::string metric,
                                             bool greater_is_better)
    : patience_(patience), threshold_(threshold), metric_(std::move(metric)), greater_is_better_(greater_is_better) {
  TORCH_CHECK_VALUE(patience >= 1, "early_stopping_patience must be >= 1, got ", patience);
  TORCH_CHECK_VALUE(threshold >= 0, "early_stopping_threshold must be >= 0, got ", threshold);
}

void EarlyStoppingCallback::on_evaluate(const TrainingArguments&, TrainerState&, TrainerControl& control,
                                        const LogEntry& metrics) {
  const auto it = metrics.find(metric_);
  TORCH_CHECK_VALUE(it != metrics.end(), "EarlyStoppingCallback: the evaluation did not report '", metric_,
                    "' (metric_for_best_model)");
  const double value = it->second;
  // HF's check_metric_value: improvement must beat the best by more than the threshold.
  const bool improved = !best_.has_value() ||
                        (greater_is_better_ ? value > *best_ && std::fabs(value - *best_) > threshold_
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
