// The registry of model converters: each entry makes its converter when the plan asks for it.
#include "trainer/model_converter.h"

#include "fp8/trainer_fp8.h"

namespace mantissa::detail {

std::vector<std::unique_ptr<ModelConverter>> make_model_converters(const PrecisionPlan& plan) {
  std::vector<std::unique_ptr<ModelConverter>> converters;
  if (plan.fp8) converters.push_back(std::make_unique<fp8::TrainerFloat8Converter>(*plan.fp8));
  return converters;
}

}  // namespace mantissa::detail
