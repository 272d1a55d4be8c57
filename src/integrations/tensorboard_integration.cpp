// The registry entry of `report_to tensorboard`.
#include <memory>

#include <mantissa/tensorboard_callback.h>

#include "integrations/builtin_integrations.h"

namespace mantissa::detail {

IntegrationEntry tensorboard_integration() {
  return {{"tensorboard", "event files under output_dir/runs/ for tensorboard --logdir"},
          [] { return std::make_shared<TensorBoardCallback>(); }};
}

}  // namespace mantissa::detail
