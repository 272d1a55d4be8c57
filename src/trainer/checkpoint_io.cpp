#include "trainer/checkpoint_io.h"

#include <exception>

#include <c10/util/Exception.h>

#include "io/filesystem.h"

#include "trainer/checkpoint_files.h"
#include "trainer/checkpoint_folder.h"
#include "trainer/collectives.h"

namespace mantissa::detail {

void LocalCheckpointIO::save(const std::string& output_dir, std::int64_t step,
                             const CheckpointWriter& write_files,
                             const CheckpointWriter& write_own) {
  const std::string folder = begin_checkpoint(output_dir, step, /*shared_name=*/false);
  try {
    write_files(folder);
    if (write_own) write_own(folder);
    write_rng_state(folder, /*process_index=*/0, /*num_processes=*/1, faults_);
    publish_checkpoint(output_dir, folder, step);
  } catch (...) {
    abandon_checkpoint(folder);
    throw;
  }
}

void LocalCheckpointIO::load(const std::string& /*dir*/, const std::function<void()>& load,
                             const char* /*whose_error*/) {
  load();
}

void CollectiveCheckpointIO::save(const std::string& output_dir, std::int64_t step,
                                  const CheckpointWriter& write_files,
                                  const CheckpointWriter& write_own) {
  const auto& dp = collectives_;
  const auto folder = shared_checkpoint_folder(output_dir, step);
  // Where a process without a writer of its own adds its random state: rank 0's folder (its
  // output_dir may differ from this process's; on a shared file system it is visible here).
  const auto rank0_folder = dp.broadcast_bytes(folder);
  std::string error;
  const auto attempt = [&error](const auto& body) {
    if (!error.empty()) return;
    try {
      body();
    } catch (const std::exception& e) {
      error = e.what();
    }
  };
  const auto agreed = [&](const char* stage) {
    if (dp.all_ok(error.empty())) return;
    if (writer_) abandon_checkpoint(folder);
    TORCH_CHECK(false, "rank ", dp.rank(), ": saving ", checkpoint_name(step), " failed while ",
                stage,
                error.empty() ? std::string(" on another process (see its error)") : ": " + error);
  };
  if (writer_) {
    attempt([&] {
      begin_checkpoint(output_dir, step, /*shared_name=*/true);
      write_files(folder);
    });
  }
  agreed("writing the model, optimizer and state");
  attempt([&] {
    const auto& target = io::is_directory(folder) ? folder : rank0_folder;
    if (io::is_directory(target)) {
      if (write_own) write_own(target);
      write_rng_state(target, dp.rank(), dp.world_size());
    } else {
      TORCH_CHECK(!write_own, "no checkpoint folder is visible to this process ('", folder,
                  "' nor rank 0's '", rank0_folder,
                  "'), so it cannot write its shard files: a sharded checkpoint needs a file "
                  "system every process shares");
      // A node that has no writer and does not share rank 0's file system.
      TORCH_WARN_ONCE("rank ", dp.rank(), ": no checkpoint folder is visible to this process ('",
                      folder, "' nor rank 0's '", rank0_folder,
                      "'), so its random state is not saved; a resume starts it afresh");
    }
  });
  agreed(write_own ? "writing each process's shards and random state"
                   : "writing each process's random state");
  if (writer_) attempt([&] { publish_checkpoint(output_dir, folder, step); });
  agreed("moving the checkpoint into place");
}

void CollectiveCheckpointIO::load(const std::string& dir, const std::function<void()>& load,
                                  const char* whose_error) {
  const bool loaded = collectives_.passed_everywhere(load);
  TORCH_CHECK_VALUE(loaded, "rank ", collectives_.rank(), ": cannot resume from '", dir,
                    "': another process could not load it (see ", whose_error, " error)");
}

}  // namespace mantissa::detail
