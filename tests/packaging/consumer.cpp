// A user's program: one overflowing step through GradScaler must halve the scale and leave
// the weights alone.
#include <cmath>
#include <iostream>
#include <limits>

#include <torch/torch.h>

#include <mantissa/mantissa.h>

int main() {
  torch::nn::Linear model(4, 2);
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.1));
  mantissa::amp::GradScaler scaler;
  auto args = mantissa::TrainingArguments().bf16(true).learning_rate(3e-4);
  args.validate();

  const auto before = model->weight.clone();
  auto loss = model->forward(torch::ones({3, 4})).sum();
  scaler.scale(loss).backward();
  model->weight.mutable_grad()[0][0].fill_(std::numeric_limits<float>::infinity());
  scaler.step(optimizer);
  scaler.update();
  const bool unchanged = torch::equal(before, model->weight);
  std::cout << "consumer: scale " << scaler.get_scale() << " after an overflow, weights "
            << (unchanged ? "unchanged" : "CHANGED") << ", mantissa " << MANTISSA_VERSION << "\n";
  return unchanged && scaler.get_scale() == 32768.0 ? 0 : 1;
}
