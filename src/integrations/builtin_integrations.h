#pragma once
// The integrations mantissa ships, one file each; registry.cpp registers them first. Internal.

#include <mantissa/integrations.h>

namespace mantissa::detail {

/// One registry entry: the name, its one-line description and the factory of its callback.
struct IntegrationEntry {
  IntegrationInfo info;
  IntegrationFactory factory;
};

/// `tensorboard`: a `TensorBoardCallback` (tensorboard_integration.cpp).
IntegrationEntry tensorboard_integration();

}  // namespace mantissa::detail
