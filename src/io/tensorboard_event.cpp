#include "io/tensorboard_event.h"

#include "io/protobuf_wire.h"

namespace mantissa::io::detail {
namespace {

// Field numbers of the messages below (tensorboard/compat/proto/*.proto).
namespace event {
constexpr int kWallTime = 1;     // double
constexpr int kStep = 2;         // int64
constexpr int kFileVersion = 3;  // string, in the `what` oneof
constexpr int kSummary = 5;      // Summary, in the `what` oneof
constexpr int kSessionLog = 7;   // SessionLog, in the `what` oneof
constexpr int kSourceMetadata = 10;
}  // namespace event
constexpr int kSourceMetadataWriter = 1;  // SourceMetadata.writer
constexpr int kSessionLogStatus = 1;      // SessionLog.status
constexpr int kSessionLogStart = 1;       // SessionLog.SessionStatus.START
constexpr int kSummaryValue = 1;          // Summary.value, repeated
namespace value {
constexpr int kTag = 1;
constexpr int kSimpleValue = 2;  // float, in the `value` oneof
constexpr int kTensor = 8;       // TensorProto, in the `value` oneof
constexpr int kMetadata = 9;     // SummaryMetadata
}  // namespace value
constexpr int kMetadataPluginData = 1;  // SummaryMetadata.plugin_data
constexpr int kPluginName = 1;          // PluginData.plugin_name
namespace tensor {
constexpr int kDtype = 1;      // DataType
constexpr int kShape = 2;      // TensorShapeProto
constexpr int kStringVal = 8;  // repeated bytes
constexpr int kDtString = 7;   // DataType.DT_STRING
constexpr int kShapeDim = 2;   // TensorShapeProto.dim, repeated
constexpr int kDimSize = 1;    // TensorShapeProto.Dim.size
}  // namespace tensor

ProtoWriter event_header(double wall_time, std::int64_t step) {
  ProtoWriter out;
  out.double_field(event::kWallTime, wall_time);
  out.varint_field(event::kStep, static_cast<std::uint64_t>(step));
  return out;
}

std::string summary_event(double wall_time, std::int64_t step, const ProtoWriter& summary) {
  return event_header(wall_time, step).bytes_field(event::kSummary, summary.bytes()).take();
}

}  // namespace

std::string encode_file_version_event(double wall_time) {
  ProtoWriter source;
  source.bytes_field(kSourceMetadataWriter, "mantissa");
  return event_header(wall_time, 0)
      .bytes_field(event::kFileVersion, "brain.Event:2")
      .bytes_field(event::kSourceMetadata, source.bytes())
      .take();
}

std::string encode_scalars_event(double wall_time, std::int64_t step,
                                 const std::vector<std::pair<std::string, float>>& values) {
  ProtoWriter summary;
  for (const auto& [tag, number] : values) {
    ProtoWriter one;
    one.bytes_field(value::kTag, tag).float_field(value::kSimpleValue, number);
    summary.bytes_field(kSummaryValue, one.bytes());
  }
  return summary_event(wall_time, step, summary);
}

std::string encode_text_event(double wall_time, std::int64_t step, const std::string& tag,
                              const std::string& text) {
  ProtoWriter plugin;
  plugin.bytes_field(kPluginName, "text");  // content: TextPluginData{version: 0}, all defaults
  ProtoWriter metadata;
  metadata.bytes_field(kMetadataPluginData, plugin.bytes());
  ProtoWriter dim;
  dim.varint_field(tensor::kDimSize, 1);
  ProtoWriter shape;
  shape.bytes_field(tensor::kShapeDim, dim.bytes());
  ProtoWriter strings;
  strings.varint_field(tensor::kDtype, tensor::kDtString)
      .bytes_field(tensor::kShape, shape.bytes())
      .bytes_field(tensor::kStringVal, text);
  ProtoWriter one;
  one.bytes_field(value::kTag, tag + "/text_summary")
      .bytes_field(value::kMetadata, metadata.bytes())
      .bytes_field(value::kTensor, strings.bytes());
  ProtoWriter summary;
  summary.bytes_field(kSummaryValue, one.bytes());
  return summary_event(wall_time, step, summary);
}

std::string encode_session_start_event(double wall_time, std::int64_t step) {
  ProtoWriter session;
  session.varint_field(kSessionLogStatus, kSessionLogStart);
  return event_header(wall_time, step).bytes_field(event::kSessionLog, session.bytes()).take();
}

}  // namespace mantissa::io::detail
