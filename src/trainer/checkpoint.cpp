#include "trainer/checkpoint.h"

#include "io/filesystem.h"

#include "trainer/checkpoint_io.h"

namespace mantissa::detail {

std::string save_checkpoint(const std::string& output_dir, const CheckpointParts& parts,
                            const FileFaults& faults) {
  const auto step = parts.state->global_step;
  LocalCheckpointIO(faults).save(output_dir, step, [&](const std::string& folder) {
    write_checkpoint_files(folder, parts, io::module_state_dict(*parts.model), faults);
  });
  return io::join_path(output_dir, checkpoint_name(step));
}

}  // namespace mantissa::detail
