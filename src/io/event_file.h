#pragma once
// One TensorBoard event file, written append-only. Internal: the TensorBoard callback owns it.

#include <string>
#include <vector>

namespace mantissa::io::detail {

/// An event file being written: TFRecord records of encoded `tensorboard.Event` messages
/// (io/tensorboard_event.h), the first of which is the file_version event. Every `write` goes
/// to the file with write(2) before it returns, so a reader (or a crash) sees whole logs; nothing
/// is buffered in the process. Python:
/// `tensorboard.summary.writer.event_file_writer.EventFileWriter` with a flush after each call. Not
/// copyable or movable.
class EventFileWriter {
 public:
  /// Creates `path` (refusing to replace a file that exists) and writes the file_version event
  /// stamped `wall_time`. Throws c10::Error naming the path and the system's reason.
  EventFileWriter(std::string path, double wall_time);
  EventFileWriter(const EventFileWriter&) = delete;
  EventFileWriter& operator=(const EventFileWriter&) = delete;
  /// Closes the file if `close()` was not called; never throws.
  ~EventFileWriter();

  /// Frames each encoded event as a record and writes them all. Throws c10::Error naming the
  /// path and the reason when the system refuses; the file may then end in a partial record,
  /// and every later call throws too.
  void write(const std::vector<std::string>& events);

  /// Closes the file; throws c10::Error when close(2) reports a failure (some file systems
  /// report failed writes only then). Further writes throw.
  void close();

  /// The file's path.
  const std::string& path() const noexcept { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
  bool broken_ = false;
};

/// `events.out.tfevents.<seconds since the epoch, 10 digits>.<host>.<pid>.<n>`: the name
/// TensorBoard's writer gives a file (readers pick up files with "tfevents" in the name), `n`
/// counting the files this process named, so two files of one second do not collide.
std::string event_file_name(double wall_time);

/// This machine's host name (`socket.gethostname()`), "localhost" when the system has none.
std::string host_name();

}  // namespace mantissa::io::detail
