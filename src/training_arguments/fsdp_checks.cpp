#include "training_arguments/fsdp_checks.h"

#include <cctype>
#include <set>
#include <vector>

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>
#include <nlohmann/json.hpp>

#include "io/atomic_file.h"
#include "io/filesystem.h"
#include "io/json_reader.h"
#include "shorten.h"

namespace mantissa::detail {
namespace {

using Json = nlohmann::json;

std::vector<std::string> split_options(const std::string& text) {
  std::vector<std::string> words;
  std::string word;
  for (const char c : text) {
    if (std::isspace(static_cast<unsigned char>(c)) != 0 || c == ',') {
      if (!word.empty()) words.push_back(word);
      word.clear();
    } else {
      word += c;
    }
  }
  if (!word.empty()) words.push_back(word);
  return words;
}

// The object `fsdp_config` holds: its own text when it starts with '{', else the file it names.
Json config_object(const std::string& config) {
  const auto first = config.find_first_not_of(" \t\r\n");
  std::string text = config;
  std::string where = "fsdp_config";
  if (first == std::string::npos || config[first] != '{') {
    TORCH_CHECK_VALUE(io::path_exists(config) && !io::is_directory(config), "fsdp_config: '",
                      shorten_path(config),
                      "' is neither a JSON object nor a JSON file that exists");
    const auto bytes = io::read_file(config);
    text.assign(bytes.begin(), bytes.end());
    where = "fsdp_config '" + shorten_path(config) + "'";
  }
  Json object;
  try {
    object = io::parse_json_text<Json>(text);
  } catch (const io::JsonTextError& error) {
    TORCH_CHECK_VALUE(false, where, " is not valid JSON: ", error.what());
  }
  TORCH_CHECK_VALUE(object.is_object(), where, " must hold a JSON object, not ",
                    object.type_name());
  return object;
}

// accelerate's FSDP_BACKWARD_PREFETCH, compared after upper-casing as accelerate does.
bool is_backward_prefetch(const std::string& text) {
  std::string upper = text;
  for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return upper == "BACKWARD_PRE" || upper == "BACKWARD_POST" || upper == "NO_PREFETCH";
}

void check_config(const Json& object) {
  // Keys that change nothing here: the buckets are ddp_bucket_cap_mb's, every process keeps
  // the original parameters, and rank 0's weights are always copied to every process.
  static const std::set<std::string> kBoolNoEffect = {"sync_module_states", "use_orig_params",
                                                      "forward_prefetch", "limit_all_gathers",
                                                      "cpu_ram_efficient_loading"};
  static const std::set<std::string> kBoolRefusedWhenTrue = {
      "offload_params", "cpu_offload", "activation_checkpointing", "xla", "xla_fsdp_grad_ckpt"};
  for (const auto& item : object.items()) {
    // Named copies: a lambda below uses them, and C++17 lambdas cannot capture bindings.
    const std::string raw_key = item.key();
    const std::string shown_key = shorten(raw_key);
    const Json& value = item.value();
    const std::string key = raw_key.rfind("fsdp_", 0) == 0 ? raw_key.substr(5) : raw_key;
    const auto is_bool = [&] {
      TORCH_CHECK_VALUE(value.is_boolean(), "fsdp_config: '", shown_key,
                        "' takes true or false, got ", io::describe_json(value));
      return value.get<bool>();
    };
    if (kBoolNoEffect.count(key) != 0) {
      is_bool();
    } else if (kBoolRefusedWhenTrue.count(key) != 0) {
      TORCH_CHECK_VALUE(!is_bool(), "fsdp_config: '", shown_key,
                        "' true is not supported: mantissa keeps the parameters and the "
                        "optimizer state on the device and runs no activation checkpointing "
                        "or XLA through fsdp");
    } else if (key == "reshard_after_forward") {
      TORCH_CHECK_VALUE(!is_bool(),
                        "fsdp_config: 'reshard_after_forward' true shards the "
                        "parameters too (full_shard); mantissa runs shard_grad_op, "
                        "which keeps them whole between forward and backward: set "
                        "it false or leave it out");
    } else if (key == "state_dict_type") {
      TORCH_CHECK_VALUE(
          value.is_string() && value.get_ref<const std::string&>() == "FULL_STATE_DICT",
          "fsdp_config: state_dict_type ", io::describe_json(value),
          " is not supported; FULL_STATE_DICT (the default) writes one "
          "optimizer.pt on rank 0 that a run of any size resumes");
    } else if (key == "version") {
      TORCH_CHECK_VALUE(value.is_number_integer() &&
                            (value.get<std::int64_t>() == 1 || value.get<std::int64_t>() == 2),
                        "fsdp_config: 'version' is 1 or 2, got ", io::describe_json(value));
    } else if (key == "backward_prefetch") {
      // Accepted and unused, as forward_prefetch is; its value is checked all the same.
      TORCH_CHECK_VALUE(
          value.is_null() || (value.is_string() && is_backward_prefetch(value.get<std::string>())),
          "fsdp_config: '", shown_key,
          "' takes backward_pre, backward_post or no_prefetch (in any case) or "
          "null, got ",
          io::describe_json(value));
    } else if (key == "min_num_params") {
      TORCH_CHECK_VALUE(value.is_number_integer() && value.get<std::int64_t>() >= 0,
                        "fsdp_config: 'min_num_params' takes a count of parameters, got ",
                        io::describe_json(value));
    } else if (key == "transformer_layer_cls_to_wrap") {
      TORCH_CHECK_VALUE(value.is_string() || value.is_array(), "fsdp_config: '", shown_key,
                        "' takes a class name or a list of them, got ", io::describe_json(value));
      if (value.is_array()) {
        for (std::size_t i = 0; i < value.size(); ++i) {
          TORCH_CHECK_VALUE(value[i].is_string(), "fsdp_config: '", shown_key,
                            "' takes a list of class names, but entry ", i, " is ",
                            io::describe_json(value[i]), ", not a string");
        }
      }
    } else {
      TORCH_CHECK_VALUE(false, "fsdp_config: unknown key '", shown_key,
                        "'; mantissa reads state_dict_type, reshard_after_forward, version, "
                        "sync_module_states, use_orig_params, forward_prefetch, "
                        "backward_prefetch, limit_all_gathers, cpu_ram_efficient_loading, "
                        "min_num_params, transformer_layer_cls_to_wrap, offload_params, "
                        "activation_checkpointing and xla (with or without HF's 'fsdp_' prefix)");
    }
  }
}

}  // namespace

FsdpSettings read_fsdp_settings(const std::string& fsdp,
                                const std::optional<std::string>& fsdp_config) {
  FsdpSettings settings;
  const auto options = split_options(fsdp);
  const std::string shown_fsdp = shorten(fsdp);
  bool no_shard = false;
  for (const auto& option : options) {
    if (option == "shard_grad_op") {
      settings.shard_grad_op = true;
    } else if (option == "no_shard") {
      no_shard = true;
    } else if (option == "auto_wrap") {
      // Wrapping decides FSDP's units; here the buckets are ddp_bucket_cap_mb's.
    } else if (option == "full_shard" || option == "hybrid_shard" ||
               option == "hybrid_shard_zero2" || option == "offload") {
      TORCH_CHECK_VALUE(false, "fsdp: '", shorten(option),
                        "' is not supported: mantissa shards the gradients and the optimizer "
                        "state (shard_grad_op, ZeRO-2) and keeps the parameters whole on every "
                        "device; use --fsdp shard_grad_op, or no fsdp for plain data parallel");
    } else {
      TORCH_CHECK_VALUE(false, "fsdp: '", shorten(option),
                        "' is not an FSDP option; mantissa takes shard_grad_op (with auto_wrap "
                        "accepted) or no_shard, got '",
                        shown_fsdp, "'");
    }
  }
  TORCH_CHECK_VALUE(!(no_shard && options.size() > 1), "fsdp: 'no_shard' cannot be combined with ",
                    "other options, got '", shown_fsdp, "'");
  if (fsdp_config) {
    check_config(config_object(*fsdp_config));
    // HF warns too: the settings are read, and unused without sharding.
    if (!settings.shard_grad_op) {
      TORCH_WARN_ONCE("fsdp_config is set but fsdp does not shard (it is '", shown_fsdp,
                      "'), so it changes nothing; add --fsdp shard_grad_op or drop fsdp_config");
    }
  }
  return settings;
}

}  // namespace mantissa::detail
