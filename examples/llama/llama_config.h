#pragma once
// The shape of a Llama-family model as a Hugging Face `config.json` gives it, read and written
// with the keys of `transformers.LlamaConfig` (5.x), including its `rope_parameters`.

#include <cstdint>
#include <optional>
#include <string>

#include <torch/types.h>
#include <nlohmann/json.hpp>

namespace mantissa::examples::llama {

/// How the rotary embedding's frequencies are derived. Python: `config.rope_parameters
/// ["rope_type"]`, the keys of `transformers.modeling_rope_utils.ROPE_INIT_FUNCTIONS` plus
/// "default". Only the two types below are implemented; any other is refused by name.
enum class RopeType {
  kDefault,  ///< "default": theta^(-2i/d), as in the original RoPE
  kLlama3,   ///< "llama3": Llama 3.1's frequency-dependent rescaling of long wavelengths
};

/// The rotary embedding's settings. Python: a `RopeParameters` dict.
struct RopeParameters {
  RopeType rope_type = RopeType::kDefault;
  double rope_theta = 10000.0;
  /// "llama3" only: the scaling factor and the band of wavelengths that is interpolated.
  double factor = 8.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  std::int64_t original_max_position_embeddings = 8192;
};

/// A Llama model's configuration. Python: `transformers.LlamaConfig`; field names, meanings and
/// defaults are its own. Host object only.
struct LlamaConfig {
  std::int64_t vocab_size = 32000;
  std::int64_t hidden_size = 4096;
  std::int64_t intermediate_size = 11008;
  std::int64_t num_hidden_layers = 32;
  std::int64_t num_attention_heads = 32;
  /// Key/value heads shared by groups of query heads (grouped-query attention); Python's None
  /// (num_attention_heads) is resolved when reading.
  std::int64_t num_key_value_heads = 32;
  /// Per-head width; Python's None (hidden_size / num_attention_heads) is resolved when reading.
  std::int64_t head_dim = 128;
  std::string hidden_act = "silu";
  std::int64_t max_position_embeddings = 2048;
  double initializer_range = 0.02;
  double rms_norm_eps = 1e-6;
  bool tie_word_embeddings = false;
  bool attention_bias = false;
  bool mlp_bias = false;
  double attention_dropout = 0.0;
  std::optional<std::int64_t> pad_token_id;
  RopeParameters rope;
  /// The JSON the config was read from, kept so that `to_json` writes back the keys this
  /// program does not use (bos_token_id, eos_token_id, ...) unchanged.
  nlohmann::ordered_json source = nlohmann::ordered_json::object();

  /// Reads a `config.json` (a model folder's, or any JSON file of LlamaConfig's keys). Python:
  /// `LlamaConfig.from_pretrained(folder)` / `LlamaConfig.from_json_file(path)`. Accepts both
  /// 5.x's `rope_parameters` and 4.x's `rope_theta` + `rope_scaling`. Raises c10::ValueError
  /// naming the file and the key for a missing size (vocab_size, hidden_size,
  /// intermediate_size, num_hidden_layers, num_attention_heads), a value of the wrong type, a
  /// model_type other than "llama", a rope_type other than "default" and "llama3", a
  /// hidden_act other than "silu", or sizes that do not fit together (`validate`).
  static LlamaConfig from_json_file(const std::string& path);
  /// The same from parsed JSON; `origin` names where it came from in error messages.
  static LlamaConfig from_json(const nlohmann::ordered_json& json,
                               const std::string& origin = "config");
  /// The config as `save_pretrained` writes it: the source's keys updated with this config's
  /// values, `model_type` "llama", `architectures` ["LlamaForCausalLM"], 5.x's
  /// `rope_parameters` (4.x's `rope_theta`/`rope_scaling` removed) and `dtype` set to
  /// `dtype`'s name ("float32", "bfloat16", "float16").
  nlohmann::ordered_json to_json(c10::ScalarType dtype) const;
  /// Raises c10::ValueError naming the field when a size is not positive, num_attention_heads
  /// is not a multiple of num_key_value_heads, head_dim is odd (rotary pairs), or pad_token_id
  /// is outside the vocabulary.
  void validate() const;
};

/// The rotary embedding's inverse frequencies, float32 [head_dim / 2], computed with the same
/// float32 tensor operations as transformers' rope init functions for `config.rope`. Python:
/// `ROPE_INIT_FUNCTIONS[rope_type](config)[0]` (or `compute_default_rope_parameters`). CPU.
torch::Tensor rope_inverse_frequencies(const LlamaConfig& config);

/// The name of a RopeType as config.json spells it.
const char* rope_type_name(RopeType type);

}  // namespace mantissa::examples::llama
