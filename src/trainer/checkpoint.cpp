#include "trainer/checkpoint.h"

namespace mantissa::detail {

std::string save_checkpoint(const std::string& output_dir, const CheckpointParts& parts,
                            const FileFaults& faults) {
  const auto step = parts.state->global_step;
  const std::string folder = begin_checkpoint(output_dir, step, /*shared_name=*/false);
  try {
    write_checkpoint_files(folder, parts, faults);
    write_rng_state(folder, parts.process_index, parts.num_processes, faults);
    return publish_checkpoint(output_dir, folder, step);
  } catch (...) {
    abandon_checkpoint(folder);
    throw;
  }
}

}  // namespace mantissa::detail
