#include <mantissa/fp8/convert.h>

#include <sstream>
#include <utility>

#include <c10/util/Exception.h>
#include <torch/nn/modules/linear.h>

#include <mantissa/fp8/float8_linear.h>

namespace mantissa::fp8 {

namespace {

void append_names(std::ostringstream& out, const std::vector<std::string>& names) {
  for (size_t i = 0; i < names.size(); ++i) out << (i ? ", " : "") << names[i];
}

}  // namespace

bool default_float8_filter(const LinearLayerInfo& layer) {
  return layer.in_features % 16 == 0 && layer.out_features % 16 == 0 && layer.index != 0 &&
         layer.index != layer.count - 1;
}

std::string Float8Conversion::describe() const {
  std::ostringstream out;
  out << "fp8 " << to_string(recipe.recipe()) << " (" << to_string(recipe.fp8_format());
  if (recipe.recipe() == ScalingRecipe::kDelayed) {
    out << ", amax history " << recipe.amax_history_len() << ", "
        << to_string(recipe.amax_compute_algo()) << ", margin " << recipe.margin();
  }
  const size_t total = float8_layers.size() + filtered_out.size() + not_convertible.size();
  out << "): " << float8_layers.size() << " of " << total << " linear layers";
  if (!float8_layers.empty()) {
    out << " (";
    append_names(out, float8_layers);
    out << ")";
  }
  if (!filtered_out.empty()) {
    out << "; high precision: ";
    append_names(out, filtered_out);
  }
  if (!not_convertible.empty()) {
    out << "; torch::nn::Linear, not convertible (declare as Float8Linear): ";
    append_names(out, not_convertible);
  }
  return out.str();
}

Float8Conversion convert_to_float8_training(torch::nn::Module& module, const Float8Recipe& recipe,
                                            const Float8Filter& filter) {
  recipe.validate();
  TORCH_CHECK_VALUE(static_cast<bool>(filter), "convert_to_float8_training needs a filter");
  struct Found {
    std::string name;
    std::shared_ptr<Float8LinearImpl> float8;  // null for a plain torch::nn::Linear
    int64_t in_features, out_features;
  };
  std::vector<Found> found;
  for (const auto& item : module.named_modules()) {
    if (auto layer = std::dynamic_pointer_cast<Float8LinearImpl>(item.value())) {
      found.push_back(
          {item.key(), layer, layer->options.in_features(), layer->options.out_features()});
    } else if (auto plain = std::dynamic_pointer_cast<torch::nn::LinearImpl>(item.value())) {
      found.push_back(
          {item.key(), nullptr, plain->options.in_features(), plain->options.out_features()});
    }
  }

  Float8Conversion conversion;
  conversion.recipe = recipe;
  if (recipe.recipe() == ScalingRecipe::kDelayed) {
    const auto parameters = module.parameters();
    const c10::Device device = parameters.empty() ? c10::Device(c10::kCPU) : parameters[0].device();
    conversion.state = std::make_shared<Float8ScalingState>(recipe, device);
  }
  const auto count = static_cast<int64_t>(found.size());
  for (int64_t index = 0; index < count; ++index) {
    const Found& layer = found[index];
    const LinearLayerInfo info{layer.name, layer.in_features, layer.out_features, index, count};
    if (!filter(info)) {
      conversion.filtered_out.push_back(layer.name);
      continue;
    }
    if (!layer.float8) {
      conversion.not_convertible.push_back(layer.name);
      continue;
    }
    if (conversion.state) {
      layer.float8->enable_delayed_scaling(conversion.state,
                                           conversion.state->add_layer(layer.name));
    } else {
      layer.float8->enable_current_scaling(recipe.fp8_format());
    }
    conversion.float8_layers.push_back(layer.name);
  }
  return conversion;
}

}  // namespace mantissa::fp8
