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

// Python's `str_to_bool` over `str(value).lower()`, as HF reads reshard_after_forward and the
// loading flags: a JSON bool, or a string spelling one.
bool config_bool(const Json& value, const std::string& shown_key) {
  if (value.is_boolean()) return value.get<bool>();
  if (value.is_string()) {
    std::string text = value.get<std::string>();
    for (char& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    static const std::set<std::string> kTrue = {"y", "yes", "t", "true", "on", "1"};
    static const std::set<std::string> kFalse = {"n", "no", "f", "false", "off", "0"};
    if (kTrue.count(text) != 0) return true;
    if (kFalse.count(text) != 0) return false;
  }
  TORCH_CHECK_VALUE(false, "fsdp_config: '", shown_key,
                    "' takes true or false (or a string such as \"yes\" / \"no\"), got ",
                    io::describe_json(value));
  return false;
}

// The keys of `fsdp_config`, each into `settings` (or checked and left: FSDP1's keys, which
// FSDP2 ignores). `explicit_reshard` tells the caller that the config chose it.
void read_config(const Json& object, FsdpSettings& settings, bool& explicit_reshard) {
  // FSDP1's keys: HF reads them for version 1 only; under version 2 they change nothing.
  static const std::set<std::string> kFsdp1Bools = {"sync_module_states", "use_orig_params",
                                                    "limit_all_gathers"};
  static const std::set<std::string> kRefusedWhenTrue = {"offload_params", "cpu_offload", "xla",
                                                         "xla_fsdp_grad_ckpt", "xla_fsdp_v2"};
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
    if (kFsdp1Bools.count(key) != 0) {
      is_bool();
    } else if (kRefusedWhenTrue.count(key) != 0) {
      TORCH_CHECK_VALUE(!config_bool(value, shown_key), "fsdp_config: '", shown_key,
                        "' true is not supported: mantissa keeps the parameters and the "
                        "optimizer state on the training device (no CPU offload is built) and "
                        "runs no XLA");
    } else if (key == "cpu_ram_efficient_loading") {
      config_bool(value, shown_key);  // every rank loads the model, then it is sharded
    } else if (key == "forward_prefetch") {
      TORCH_CHECK_VALUE(!is_bool(), "fsdp_config: 'forward_prefetch' true is an FSDP1 setting; "
                                    "under FSDP2 (version 2) the next block's gather always "
                                    "starts early: leave it out");
    } else if (key == "reshard_after_forward") {
      settings.reshard_after_forward = config_bool(value, shown_key);
      explicit_reshard = true;
    } else if (key == "activation_checkpointing") {
      settings.activation_checkpointing = config_bool(value, shown_key);
    } else if (key == "state_dict_type") {
      TORCH_CHECK_VALUE(value.is_string(), "fsdp_config: state_dict_type takes a string, got ",
                        io::describe_json(value));
      const auto& type = value.get_ref<const std::string&>();
      TORCH_CHECK_VALUE(type == "FULL_STATE_DICT" || type == "SHARDED_STATE_DICT",
                        "fsdp_config: state_dict_type ", io::describe_json(value),
                        " is not a state dict type: FULL_STATE_DICT (the default: rank 0 writes "
                        "one model.safetensors and one optimizer.pt) or SHARDED_STATE_DICT (each "
                        "process writes its own shard files)");
      settings.sharded_state_dict = type == "SHARDED_STATE_DICT";
    } else if (key == "version") {
      TORCH_CHECK_VALUE(value.is_number_integer() &&
                            (value.get<std::int64_t>() == 1 || value.get<std::int64_t>() == 2),
                        "fsdp_config: 'version' is 1 or 2, got ", io::describe_json(value));
      TORCH_CHECK_VALUE(value.get<std::int64_t>() == 2,
                        "fsdp_config: version 1 (FSDP1, deprecated in HF Transformers 5) is not "
                        "supported: mantissa shards as FSDP2 does; set version 2 or leave it out");
    } else if (key == "backward_prefetch") {
      // FSDP1's; checked all the same.
      TORCH_CHECK_VALUE(
          value.is_null() || (value.is_string() && is_backward_prefetch(value.get<std::string>())),
          "fsdp_config: '", shown_key,
          "' takes backward_pre, backward_post or no_prefetch (in any case) or "
          "null, got ",
          io::describe_json(value));
    } else if (key == "auto_wrap_policy") {
      const std::string policy = value.is_string() ? value.get<std::string>() : std::string();
      if (policy == "TRANSFORMER_BASED_WRAP") {
        settings.auto_wrap_policy = FsdpAutoWrap::kTransformerBased;
      } else if (policy == "SIZE_BASED_WRAP") {
        settings.auto_wrap_policy = FsdpAutoWrap::kSizeBased;
      } else if (policy == "NO_WRAP") {
        settings.auto_wrap_policy = FsdpAutoWrap::kNoWrap;
      } else {
        TORCH_CHECK_VALUE(false, "fsdp_config: 'auto_wrap_policy' takes TRANSFORMER_BASED_WRAP, "
                                 "SIZE_BASED_WRAP or NO_WRAP, got ",
                          io::describe_json(value));
      }
    } else if (key == "min_num_params") {
      TORCH_CHECK_VALUE(value.is_number_integer() && value.get<std::int64_t>() >= 0,
                        "fsdp_config: 'min_num_params' takes a count of parameters, got ",
                        io::describe_json(value));
      settings.min_num_params = value.get<std::int64_t>();
    } else if (key == "transformer_layer_cls_to_wrap") {
      TORCH_CHECK_VALUE(value.is_string() || value.is_array(), "fsdp_config: '", shown_key,
                        "' takes a class name or a list of them, got ", io::describe_json(value));
      std::vector<std::string> names;
      if (value.is_string()) {
        names = split_options(value.get<std::string>());
      } else {
        for (std::size_t i = 0; i < value.size(); ++i) {
          TORCH_CHECK_VALUE(value[i].is_string(), "fsdp_config: '", shown_key,
                            "' takes a list of class names, but entry ", i, " is ",
                            io::describe_json(value[i]), ", not a string");
          names.push_back(value[i].get<std::string>());
        }
      }
      TORCH_CHECK_VALUE(!names.empty(), "fsdp_config: '", shown_key,
                        "' names no class; leave it out to shard the blocks the model declares");
      settings.transformer_layer_cls_to_wrap = std::move(names);
    } else {
      TORCH_CHECK_VALUE(false, "fsdp_config: unknown key '", shown_key,
                        "'; mantissa reads version, reshard_after_forward, auto_wrap_policy, "
                        "transformer_layer_cls_to_wrap, min_num_params, state_dict_type, "
                        "activation_checkpointing, cpu_ram_efficient_loading, cpu_offload, "
                        "offload_params, forward_prefetch, backward_prefetch, "
                        "sync_module_states, use_orig_params, limit_all_gathers and xla (with "
                        "or without HF's 'fsdp_' prefix)");
    }
  }
}

}  // namespace

FsdpSettings read_fsdp_settings(const std::string& fsdp,
                                const std::optional<std::string>& fsdp_config) {
  FsdpSettings settings;
  const auto options = split_options(fsdp);
  const std::string shown_fsdp = shorten(fsdp);
  std::optional<bool> legacy_reshard;  // what full_shard / shard_grad_op imply
  bool legacy = false;
  for (const auto& option : options) {
    if (option == "true" || option == "True") {
      settings.enabled = true;
    } else if (option == "false" || option == "False") {
    } else if (option == "full_shard" || option == "shard_grad_op") {
      const bool reshard = option == "full_shard";
      TORCH_CHECK_VALUE(!legacy_reshard || *legacy_reshard == reshard,
                        "fsdp: 'full_shard' and 'shard_grad_op' contradict each other (the first "
                        "reshards the parameters after forward, the second keeps them), got '",
                        shown_fsdp, "'");
      legacy_reshard = reshard;
      settings.enabled = true;
      legacy = true;
    } else if (option == "auto_wrap") {
      settings.enabled = true;  // HF: any legacy string turns FSDP on
      legacy = true;            // the wrapping is fsdp_config's auto_wrap_policy
    } else if (option == "offload") {
      TORCH_CHECK_VALUE(false, "fsdp: 'offload' is not supported: mantissa keeps the "
                               "parameters and the optimizer state on the training device (no "
                               "CPU offload is built); drop it");
    } else if (option == "no_shard" || option == "hybrid_shard" ||
               option == "hybrid_shard_zero2") {
      TORCH_CHECK_VALUE(false, "fsdp: '", shorten(option),
                        "' is an FSDP1 option, which HF Transformers 5 no longer runs either; "
                        "use --fsdp (full sharding) or --fsdp shard_grad_op, or no fsdp for "
                        "plain data parallel");
    } else {
      TORCH_CHECK_VALUE(false, "fsdp: '", shorten(option),
                        "' is not an FSDP option; mantissa takes a bare --fsdp (or true), or "
                        "HF's full_shard, shard_grad_op and auto_wrap, got '",
                        shown_fsdp, "'");
    }
  }
  bool explicit_reshard = false;
  if (fsdp_config) read_config(config_object(*fsdp_config), settings, explicit_reshard);
  if (!explicit_reshard && legacy_reshard) settings.reshard_after_forward = *legacy_reshard;
  if (legacy && settings.enabled) {
    TORCH_WARN_ONCE("fsdp: the option strings ('", shown_fsdp,
                    "') are HF's deprecated spelling; they mean fsdp_config's "
                    "reshard_after_forward ",
                    settings.reshard_after_forward ? "true" : "false",
                    " under FSDP2, which a bare --fsdp with that fsdp_config key says directly");
  }
  if (fsdp_config && !settings.enabled) {
    // HF warns too: the settings are read, and unused without sharding.
    TORCH_WARN_ONCE("fsdp_config is set but fsdp does not shard (it is '", shown_fsdp,
                    "'), so it changes nothing; add --fsdp or drop fsdp_config");
  }
  return settings;
}

}  // namespace mantissa::detail
