#include "llama_config.h"

#include <cmath>
#include <string>

#include <torch/torch.h>

#include "io/atomic_file.h"
#include "io/json_reader.h"

namespace mantissa::examples::llama {
namespace {

using Json = nlohmann::ordered_json;

// Reads typed values out of a JSON object, naming the origin and the key in every error.
class Fields {
 public:
  Fields(const Json& object, std::string origin) : object_(object), origin_(std::move(origin)) {}

  bool has(const std::string& key) const {
    return object_.contains(key) && !object_.at(key).is_null();
  }

  std::int64_t integer(const std::string& key) const {
    TORCH_CHECK_VALUE(has(key), origin_, ": the key \"", key, "\" is missing (", what_, ")");
    const auto& value = object_.at(key);
    TORCH_CHECK_VALUE(value.is_number_integer(), origin_, ": \"", key,
                      "\" must be an integer, got ", io::describe_json(value));
    return value.get<std::int64_t>();
  }
  std::int64_t integer(const std::string& key, std::int64_t fallback) const {
    return has(key) ? integer(key) : fallback;
  }
  double number(const std::string& key) const {
    TORCH_CHECK_VALUE(has(key), origin_, ": the key \"", key, "\" is missing (", what_, ")");
    const auto& value = object_.at(key);
    TORCH_CHECK_VALUE(value.is_number(), origin_, ": \"", key, "\" must be a number, got ",
                      io::describe_json(value));
    return value.get<double>();
  }
  double number(const std::string& key, double fallback) const {
    return has(key) ? number(key) : fallback;
  }
  bool boolean(const std::string& key, bool fallback) const {
    if (!has(key)) return fallback;
    const auto& value = object_.at(key);
    TORCH_CHECK_VALUE(value.is_boolean(), origin_, ": \"", key, "\" must be true or false, got ",
                      io::describe_json(value));
    return value.get<bool>();
  }
  std::string string(const std::string& key, const std::string& fallback) const {
    if (!has(key)) return fallback;
    const auto& value = object_.at(key);
    TORCH_CHECK_VALUE(value.is_string(), origin_, ": \"", key, "\" must be a string, got ",
                      io::describe_json(value));
    return value.get<std::string>();
  }
  Fields& requiring(std::string what) {
    what_ = std::move(what);
    return *this;
  }

 private:
  const Json& object_;
  std::string origin_;
  std::string what_ = "LlamaConfig has no default for it";
};

RopeParameters read_rope(const Json& json, const std::string& origin) {
  // 5.x keeps everything in rope_parameters; 4.x had rope_theta at the top and the scaling in
  // rope_scaling (whose type key was once "type").
  const Json* settings = nullptr;
  std::string where;
  if (json.contains("rope_parameters") && !json.at("rope_parameters").is_null()) {
    settings = &json.at("rope_parameters");
    where = origin + ": rope_parameters";
  } else if (json.contains("rope_scaling") && !json.at("rope_scaling").is_null()) {
    settings = &json.at("rope_scaling");
    where = origin + ": rope_scaling";
  }
  RopeParameters rope;
  rope.rope_theta = Fields(json, origin).number("rope_theta", rope.rope_theta);
  if (settings == nullptr) return rope;
  TORCH_CHECK_VALUE(settings->is_object(), where, " must be an object, got ",
                    io::describe_json(*settings));
  Fields fields(*settings, where);
  rope.rope_theta = fields.number("rope_theta", rope.rope_theta);
  const auto type = fields.string("rope_type", fields.string("type", "default"));
  if (type == "default") {
    rope.rope_type = RopeType::kDefault;
  } else if (type == "llama3") {
    rope.rope_type = RopeType::kLlama3;
    fields.requiring("the llama3 rope type needs it");
    rope.factor = fields.number("factor");
    rope.low_freq_factor = fields.number("low_freq_factor");
    rope.high_freq_factor = fields.number("high_freq_factor");
    rope.original_max_position_embeddings = fields.integer("original_max_position_embeddings");
    TORCH_CHECK_VALUE(rope.factor > 0, where, ": factor must be positive, got ", rope.factor);
    TORCH_CHECK_VALUE(rope.high_freq_factor > rope.low_freq_factor && rope.low_freq_factor > 0,
                      where, ": llama3 needs 0 < low_freq_factor < high_freq_factor, got ",
                      rope.low_freq_factor, " and ", rope.high_freq_factor);
    TORCH_CHECK_VALUE(rope.original_max_position_embeddings > 0, where,
                      ": original_max_position_embeddings must be positive, got ",
                      rope.original_max_position_embeddings);
  } else {
    TORCH_CHECK_VALUE(false, where, ": rope_type \"", type,
                      "\" is not supported by this model (supported: \"default\", \"llama3\")");
  }
  const double partial = fields.number("partial_rotary_factor", 1.0);
  TORCH_CHECK_VALUE(partial == 1.0, where, ": partial_rotary_factor ", partial,
                    " is not supported (only 1.0, a rotation of the whole head)");
  TORCH_CHECK_VALUE(rope.rope_theta > 0, where, ": rope_theta must be positive, got ",
                    rope.rope_theta);
  return rope;
}

const char* dtype_name(c10::ScalarType dtype) {
  switch (dtype) {
    case c10::ScalarType::Float:
      return "float32";
    case c10::ScalarType::BFloat16:
      return "bfloat16";
    case c10::ScalarType::Half:
      return "float16";
    default:
      TORCH_CHECK_VALUE(false, "config.json: no dtype name for ", dtype);
  }
}

}  // namespace

const char* rope_type_name(RopeType type) {
  return type == RopeType::kLlama3 ? "llama3" : "default";
}

LlamaConfig LlamaConfig::from_json_file(const std::string& path) {
  const auto bytes = io::read_file(path, /*max_bytes=*/16u << 20);
  Json json;
  try {
    json = io::parse_json_text<Json>(std::string_view(bytes.data(), bytes.size()));
  } catch (const io::JsonTextError& e) {
    TORCH_CHECK_VALUE(false, path, ": not a JSON file: ", e.what());
  }
  return from_json(json, path);
}

LlamaConfig LlamaConfig::from_json(const Json& json, const std::string& origin) {
  TORCH_CHECK_VALUE(json.is_object(), origin, ": a config must be a JSON object, got ",
                    io::describe_json(json));
  Fields fields(json, origin);
  const auto model_type = fields.string("model_type", "llama");
  TORCH_CHECK_VALUE(model_type == "llama", origin, ": model_type \"", model_type,
                    "\" is not a Llama model (this example implements model_type \"llama\", "
                    "LlamaForCausalLM)");
  LlamaConfig c;
  c.source = json;
  c.vocab_size = fields.integer("vocab_size");
  c.hidden_size = fields.integer("hidden_size");
  c.intermediate_size = fields.integer("intermediate_size");
  c.num_hidden_layers = fields.integer("num_hidden_layers");
  c.num_attention_heads = fields.integer("num_attention_heads");
  c.num_key_value_heads = fields.integer("num_key_value_heads", c.num_attention_heads);
  TORCH_CHECK_VALUE(c.num_attention_heads > 0, origin,
                    ": num_attention_heads must be positive, got ", c.num_attention_heads);
  c.head_dim = fields.integer("head_dim", c.hidden_size / c.num_attention_heads);
  c.hidden_act = fields.string("hidden_act", c.hidden_act);
  TORCH_CHECK_VALUE(c.hidden_act == "silu", origin, ": hidden_act \"", c.hidden_act,
                    "\" is not supported (LlamaForCausalLM's SwiGLU MLP uses \"silu\")");
  c.max_position_embeddings = fields.integer("max_position_embeddings", c.max_position_embeddings);
  c.initializer_range = fields.number("initializer_range", c.initializer_range);
  c.rms_norm_eps = fields.number("rms_norm_eps", c.rms_norm_eps);
  c.tie_word_embeddings = fields.boolean("tie_word_embeddings", c.tie_word_embeddings);
  c.attention_bias = fields.boolean("attention_bias", c.attention_bias);
  c.mlp_bias = fields.boolean("mlp_bias", c.mlp_bias);
  c.attention_dropout = fields.number("attention_dropout", c.attention_dropout);
  if (fields.has("pad_token_id")) c.pad_token_id = fields.integer("pad_token_id");
  const auto tp = fields.integer("pretraining_tp", 1);
  TORCH_CHECK_VALUE(tp == 1, origin, ": pretraining_tp ", tp,
                    " is not supported (only 1; transformers 5.x ignores it as well)");
  c.rope = read_rope(json, origin);
  try {
    c.validate();
  } catch (const c10::ValueError& e) {
    TORCH_CHECK_VALUE(false, origin, ": ", e.what_without_backtrace());
  }
  return c;
}

void LlamaConfig::validate() const {
  TORCH_CHECK_VALUE(vocab_size > 0, "vocab_size must be positive, got ", vocab_size);
  TORCH_CHECK_VALUE(hidden_size > 0, "hidden_size must be positive, got ", hidden_size);
  TORCH_CHECK_VALUE(intermediate_size > 0, "intermediate_size must be positive, got ",
                    intermediate_size);
  TORCH_CHECK_VALUE(num_hidden_layers > 0, "num_hidden_layers must be positive, got ",
                    num_hidden_layers);
  TORCH_CHECK_VALUE(num_attention_heads > 0, "num_attention_heads must be positive, got ",
                    num_attention_heads);
  TORCH_CHECK_VALUE(num_key_value_heads > 0 && num_attention_heads % num_key_value_heads == 0,
                    "num_attention_heads (", num_attention_heads,
                    ") must be a positive multiple of num_key_value_heads (", num_key_value_heads,
                    ")");
  TORCH_CHECK_VALUE(head_dim > 0 && head_dim % 2 == 0,
                    "head_dim must be positive and even (rotary pairs), got ", head_dim);
  TORCH_CHECK_VALUE(max_position_embeddings > 0, "max_position_embeddings must be positive, got ",
                    max_position_embeddings);
  TORCH_CHECK_VALUE(rms_norm_eps > 0, "rms_norm_eps must be positive, got ", rms_norm_eps);
  TORCH_CHECK_VALUE(attention_dropout >= 0 && attention_dropout < 1,
                    "attention_dropout must be in [0, 1), got ", attention_dropout);
  TORCH_CHECK_VALUE(!pad_token_id || (*pad_token_id >= 0 && *pad_token_id < vocab_size),
                    "pad_token_id ", pad_token_id.value_or(0), " is outside the vocabulary [0, ",
                    vocab_size, ")");
}

Json LlamaConfig::to_json(c10::ScalarType dtype) const {
  Json json = source;
  json["architectures"] = Json::array({"LlamaForCausalLM"});
  json["model_type"] = "llama";
  json["vocab_size"] = vocab_size;
  json["hidden_size"] = hidden_size;
  json["intermediate_size"] = intermediate_size;
  json["num_hidden_layers"] = num_hidden_layers;
  json["num_attention_heads"] = num_attention_heads;
  json["num_key_value_heads"] = num_key_value_heads;
  json["head_dim"] = head_dim;
  json["hidden_act"] = hidden_act;
  json["max_position_embeddings"] = max_position_embeddings;
  json["initializer_range"] = initializer_range;
  json["rms_norm_eps"] = rms_norm_eps;
  json["tie_word_embeddings"] = tie_word_embeddings;
  json["attention_bias"] = attention_bias;
  json["mlp_bias"] = mlp_bias;
  json["attention_dropout"] = attention_dropout;
  json["pad_token_id"] = pad_token_id ? Json(*pad_token_id) : Json(nullptr);
  json.erase("rope_theta");
  json.erase("rope_scaling");
  Json rope_json = {{"rope_type", rope_type_name(rope.rope_type)}, {"rope_theta", rope.rope_theta}};
  if (rope.rope_type == RopeType::kLlama3) {
    rope_json["factor"] = rope.factor;
    rope_json["low_freq_factor"] = rope.low_freq_factor;
    rope_json["high_freq_factor"] = rope.high_freq_factor;
    rope_json["original_max_position_embeddings"] = rope.original_max_position_embeddings;
  }
  json["rope_parameters"] = rope_json;
  json["dtype"] = dtype_name(dtype);
  json.erase("torch_dtype");  // 4.x's name of dtype
  return json;
}

torch::Tensor rope_inverse_frequencies(const LlamaConfig& config) {
  torch::NoGradGuard no_grad;
  const auto dim = config.head_dim;
  // float32 throughout, operation for operation as the Python functions: a Python scalar
  // combined with a float32 tensor stays float32, and so do these.
  const auto exponents =
      torch::arange(0, dim, 2, torch::kLong).to(torch::kFloat) / static_cast<double>(dim);
  auto inv_freq = 1.0 / torch::pow(config.rope.rope_theta, exponents);
  if (config.rope.rope_type == RopeType::kDefault) return inv_freq;

  const auto& rope = config.rope;
  const double old_context = static_cast<double>(rope.original_max_position_embeddings);
  const double low_freq_wavelen = old_context / rope.low_freq_factor;
  const double high_freq_wavelen = old_context / rope.high_freq_factor;
  const auto wavelen = 2 * M_PI / inv_freq;
  auto scaled = torch::where(wavelen > low_freq_wavelen, inv_freq / rope.factor, inv_freq);
  const auto smooth = (old_context / wavelen - rope.low_freq_factor) /
                      (rope.high_freq_factor - rope.low_freq_factor);
  const auto smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled;
  const auto medium = (wavelen >= high_freq_wavelen).logical_and(wavelen <= low_freq_wavelen);
  return torch::where(medium, smoothed, scaled);
}

}  // namespace mantissa::examples::llama
