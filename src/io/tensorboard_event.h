#pragma once
// The `tensorboard.Event` messages mantissa writes into event files, encoded by hand
// (tensorboard/compat/proto/event.proto and summary.proto define them). Internal.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace mantissa::io::detail {

/// The first event of every file: `file_version: "brain.Event:2"`, which tells TensorBoard to
/// honour `SessionLog` START events when it purges data of an interrupted run.
std::string encode_file_version_event(double wall_time);

/// One `Summary` of `simple_value` scalars at `step`, one `Summary.Value` per (tag, value).
/// Python: `SummaryWriter.add_scalar` once per tag (which writes an event each).
std::string encode_scalars_event(double wall_time, std::int64_t step,
                                 const std::vector<std::pair<std::string, float>>& values);

/// A text summary for TensorBoard's text plugin: a `DT_STRING` tensor of shape [1] under
/// `<tag>/text_summary`, with plugin "text". Python: `SummaryWriter.add_text(tag, text, step)`.
std::string encode_text_event(double wall_time, std::int64_t step, const std::string& tag,
                              const std::string& text);

/// `SessionLog{status: START}` at `step`: readers drop every point of an earlier session whose
/// step is `step` or later. Python: what `SummaryWriter(purge_step=step)` writes.
std::string encode_session_start_event(double wall_time, std::int64_t step);

}  // namespace mantissa::io::detail
