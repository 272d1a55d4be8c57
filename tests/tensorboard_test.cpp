// TensorBoard event files: the CRC and protobuf encoders, the event file writer, report_to,
// and TensorBoardCallback in real Trainer runs read back by the `tensorboard` package.
#include <signal.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <regex>
#include <string>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <mantissa/tensorboard_callback.h>
#include <mantissa/trainer.h>
#include "io/filesystem.h"

#include "io/event_file.h"
#include "io/protobuf_wire.h"
#include "io/tensorboard_event.h"
#include "io/tfrecord.h"
#include "io_test_util.h"
#include "toy_training.h"
#include "trainer/reporting.h"

namespace {

using mantissa::LogEntry;
using mantissa::TensorBoardCallback;
using mantissa::Trainer;
using mantissa::TrainerControl;
using mantissa::TrainerState;
using mantissa::TrainingArguments;
using mantissa_test::TempDir;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
namespace io = mantissa::io;
namespace tb = mantissa::io::detail;

/// Sets (or unsets) an environment variable for the guard's lifetime.
class ScopedEnv {
 public:
  ScopedEnv(std::string name, std::optional<std::string> value) : name_(std::move(name)) {
    if (const char* old = std::getenv(name_.c_str())) saved_ = old;
    set(value);
  }
  ~ScopedEnv() { set(saved_); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  void set(const std::optional<std::string>& value) {
    if (value) {
      ::setenv(name_.c_str(), value->c_str(), 1);
    } else {
      ::unsetenv(name_.c_str());
    }
  }
  std::string name_;
  std::optional<std::string> saved_;
};

// ---- TFRecord framing and the protobuf encoder ---------------------------------------------

TEST(TfRecordTest, Crc32cMatchesPublishedCheckValues) {
  EXPECT_EQ(tb::crc32c("123456789"), 0xE3069283u);  // the CRC catalogue's check value
  EXPECT_EQ(tb::crc32c(""), 0u);
  EXPECT_EQ(tb::crc32c(std::string(32, '\0')), 0x8A9136AAu);  // RFC 3720, B.4
  EXPECT_EQ(tb::crc32c(std::string(32, '\xff')), 0x62A8AB43u);
}

TEST(TfRecordTest, FrameHoldsLengthDataAndMaskedCrcs) {
  const std::string data = "hello";
  const auto framed = tb::frame_record(data);
  ASSERT_EQ(framed.size(), data.size() + 16);
  EXPECT_EQ(framed.substr(0, 8), std::string("\x05\0\0\0\0\0\0\0", 8));
  const auto le32 = [&](std::size_t at) {
    std::uint32_t v = 0;
    for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(framed[at + i]);
    return v;
  };
  const auto mask = [](std::uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; };
  EXPECT_EQ(le32(8), mask(tb::crc32c(framed.substr(0, 8))));
  EXPECT_EQ(framed.substr(12, 5), data);
  EXPECT_EQ(le32(17), mask(tb::crc32c(data)));
  EXPECT_EQ(tb::masked_crc32c(data), mask(tb::crc32c(data)));
}

TEST(ProtoWriterTest, WireFormatOfEachFieldKind) {
  tb::ProtoWriter w;
  w.varint_field(1, 150);  // the protobuf documentation's example: 08 96 01
  EXPECT_EQ(w.bytes(), std::string("\x08\x96\x01"));
  tb::ProtoWriter negative;
  negative.varint_field(2, static_cast<std::uint64_t>(std::int64_t{-1}));
  EXPECT_EQ(negative.bytes().size(), 11u);  // key + ten bytes, as protobuf encodes int64 -1
  tb::ProtoWriter text;
  text.bytes_field(2, "testing");
  EXPECT_EQ(text.bytes(), std::string("\x12\x07testing"));
  tb::ProtoWriter numbers;
  numbers.float_field(2, 1.0f).double_field(1, 1.0);
  EXPECT_EQ(numbers.bytes(), std::string("\x15\x00\x00\x80\x3f\x09\0\0\0\0\0\0\xf0\x3f", 14));
}

// ---- the event file ----------------------------------------------------------------------------

TEST(EventFileTest, NameFollowsTensorBoardsPattern) {
  const auto name = tb::event_file_name(1700000000.75);
  EXPECT_TRUE(
      std::regex_match(name, std::regex(R"(events\.out\.tfevents\.1700000000\..+\.\d+\.\d+)")))
      << name;
  EXPECT_NE(tb::event_file_name(1700000000.75), name) << "two files of one second collide";
}

TEST(EventFileTest, RefusesToReplaceAFile) {
  TempDir dir;
  const auto path = dir.file("events.out.tfevents.taken");
  mantissa_test::write_raw_file(path, "keep me");
  EXPECT_THAT([&] { tb::EventFileWriter(path, 0.0); },
              ::testing::ThrowsMessage<c10::Error>(HasSubstr(path)));
}

TEST(EventFileTest, AFailedWriteIsReportedAndLaterWritesRefused) {
  TempDir dir;
  const auto path = dir.file("events.out.tfevents.small");
  tb::EventFileWriter writer(path, 0.0);
  // A file-size limit makes write(2) fail with EFBIG once the file would pass it.
  rlimit saved{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &saved), 0);
  auto* old_handler = ::signal(SIGXFSZ, SIG_IGN);
  rlimit small = saved;
  small.rlim_cur = 256;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  std::string message;
  try {
    writer.write({tb::encode_text_event(0.0, 1, "big", std::string(1000, 'x'))});
  } catch (const c10::Error& e) {
    message = e.what_without_backtrace();
  }
  ::setrlimit(RLIMIT_FSIZE, &saved);
  ::signal(SIGXFSZ, old_handler);
  EXPECT_THAT(message, HasSubstr("cannot write the event file '" + path + "'"));
  EXPECT_THAT([&] { writer.write({tb::encode_session_start_event(0.0, 2)}); },
              ::testing::ThrowsMessage<c10::Error>(HasSubstr("an earlier write to it failed")));
}

// ---- report_to, run_name, tags, folders ---------------------------------------------------

TEST(ReportToTest, TensorboardMakesATensorBoardCallback) {
  const auto callbacks =
      mantissa::detail::make_reporting_callbacks(TrainingArguments().report_to("tensorboard"));
  ASSERT_EQ(callbacks.size(), 1u);
  EXPECT_NE(std::dynamic_pointer_cast<TensorBoardCallback>(callbacks[0]), nullptr);
  EXPECT_THAT(mantissa::detail::make_reporting_callbacks(TrainingArguments()), IsEmpty());
  EXPECT_NO_THROW(TrainingArguments().report_to("tensorboard").run_name("run-1").validate());
  EXPECT_NO_THROW(TrainingArguments().report_to("all").validate());
}

TEST(ReportToTest, BadRunNamesAreNamed) {
  const auto error = [](const TrainingArguments& args) {
    try {
      args.validate();
    } catch (const c10::ValueError& e) {
      return std::string(e.what_without_backtrace());
    }
    return std::string("<no exception>");
  };
  EXPECT_THAT(error(TrainingArguments().run_name("a/b")), HasSubstr("got 'a/b'"));
  EXPECT_THAT(error(TrainingArguments().run_name("..")), HasSubstr("got '..'"));
  EXPECT_THAT(error(TrainingArguments().run_name("")), HasSubstr("run_name must name one folder"));
}

TEST(RewriteLogsTest, PrefixesBecomeTagGroups) {
  const LogEntry logs{{"loss", 1.0},     {"learning_rate", 2.0}, {"eval_loss", 3.0},
                      {"test_acc", 4.0}, {"train_runtime", 5.0}, {"evaluation", 6.0}};
  const std::map<std::string, double> tags = [&] {
    const auto list = mantissa::rewrite_logs(logs);
    return std::map<std::string, double>(list.begin(), list.end());
  }();
  EXPECT_EQ(tags, (std::map<std::string, double>{{"train/loss", 1.0},
                                                 {"train/learning_rate", 2.0},
                                                 {"eval/loss", 3.0},
                                                 {"test/acc", 4.0},
                                                 {"train/train_runtime", 5.0},
                                                 {"train/evaluation", 6.0}}));
}

TEST(RewriteLogsTest, DefaultLogdirIsDateAndHost) {
  const auto dir = mantissa::default_logdir();
  EXPECT_TRUE(std::regex_match(
      dir,
      std::regex(R"(runs/(Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)\d\d_\d\d-\d\d-\d\d_)" +
                 tb::host_name())))
      << dir;
}

// ---- the callback in Trainer runs, read back by tensorboard's EventAccumulator ---------------

/// What tensorboard's EventAccumulator reads from a folder of event files: scalars per tag as
/// (step, value) in file order, text tensors per tag, and each text tag's plugin.
struct Events {
  std::map<std::string, std::vector<std::pair<std::int64_t, double>>> scalars;
  std::map<std::string, std::vector<std::pair<std::int64_t, std::string>>> texts;
  std::map<std::string, std::string> plugins;
};

constexpr const char* kReadEvents = R"PY(
import json, sys
from tensorboard.backend.event_processing import event_accumulator as ea
acc = ea.EventAccumulator(sys.argv[1], size_guidance={ea.SCALARS: 0, ea.TENSORS: 0})
acc.Reload()
tags = acc.Tags()
out = {"scalars": {}, "texts": {}, "plugins": {}}
for tag in tags["scalars"]:
    out["scalars"][tag] = [[e.step, e.value] for e in acc.Scalars(tag)]
for tag in tags["tensors"]:
    out["plugins"][tag] = acc.SummaryMetadata(tag).plugin_data.plugin_name
    out["texts"][tag] = [[e.step, s.decode("utf-8")] for e in acc.Tensors(tag)
                         for s in e.tensor_proto.string_val]
print("EVENTS " + json.dumps(out))
)PY";

#define MANTISSA_READ_EVENTS(events, logdir)                                                       \
  do {                                                                                             \
    TempDir scratch_;                                                                              \
    std::string python_;                                                                           \
    MANTISSA_SKIP_WITHOUT_PYTHON_MODULES(                                                          \
        python_, "tensorboard.backend.event_processing.event_accumulator", scratch_.path());       \
    const auto result_ = mantissa_test::run_python(python_, kReadEvents, logdir, scratch_.path()); \
    ASSERT_EQ(result_.exit_code, 0) << result_.output;                                             \
    const auto at_ = result_.output.find("EVENTS ");                                               \
    ASSERT_NE(at_, std::string::npos) << result_.output;                                           \
    const auto json_ = nlohmann::json::parse(                                                      \
        result_.output.substr(at_ + 7, result_.output.find('\n', at_) - at_ - 7));                 \
    for (const auto& [tag, points] : json_["scalars"].items()) {                                   \
      for (const auto& p : points) {                                                               \
        events.scalars[tag].emplace_back(p[0].get<std::int64_t>(), p[1].get<double>());            \
      }                                                                                            \
    }                                                                                              \
    for (const auto& [tag, points] : json_["texts"].items()) {                                     \
      for (const auto& p : points) {                                                               \
        events.texts[tag].emplace_back(p[0].get<std::int64_t>(), p[1].get<std::string>());         \
      }                                                                                            \
    }                                                                                              \
    for (const auto& [tag, plugin] : json_["plugins"].items())                                     \
      events.plugins[tag] = plugin.get<std::string>();                                             \
  } while (0)

/// trainer_log.jsonl's entries.
std::vector<LogEntry> read_jsonl(const std::string& path) {
  std::vector<LogEntry> entries;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    LogEntry entry;
    const auto json = nlohmann::json::parse(line);
    for (const auto& [key, value] : json.items()) entry[key] = value.get<double>();
    entries.push_back(entry);
  }
  return entries;
}

/// The curves `entries` should give: per tag, (step, value as float32) in log order.
std::map<std::string, std::vector<std::pair<std::int64_t, double>>> expected_curves(
    const std::vector<LogEntry>& entries) {
  std::map<std::string, std::vector<std::pair<std::int64_t, double>>> curves;
  for (auto entry : entries) {
    const auto step = static_cast<std::int64_t>(entry.at("step"));
    entry.erase("step");
    for (const auto& [tag, value] : mantissa::rewrite_logs(entry)) {
      curves[tag].emplace_back(step, static_cast<double>(static_cast<float>(value)));
    }
  }
  return curves;
}

std::vector<std::string> subfolders(const std::string& dir) {
  std::vector<std::string> found;
  if (!io::is_directory(dir)) return found;
  for (const auto& name : io::list_directory(dir)) {
    if (io::is_directory(io::join_path(dir, name))) found.push_back(name);
  }
  return found;
}

TEST(TensorBoardCallbackTest, ScalarsEqualTheTrainingLog) {
  const ScopedEnv no_env_dir("TENSORBOARD_LOGGING_DIR", std::nullopt);
  const ScopedEnv no_rank("RANK", std::nullopt);
  const auto dir = mantissa_test::toy_output_dir();
  auto args = mantissa_test::toy_args(dir)
                  .max_steps(12)
                  .logging_steps(4)
                  .eval_strategy("steps")
                  .eval_steps(6)
                  .report_to("tensorboard");
  Trainer trainer(mantissa_test::make_toy_model(), args, mantissa_test::ToyDataset(100),
                  mantissa_test::ToyDataset(40, 3));
  trainer.train();
  trainer.evaluate();  // after on_train_end: a second file in the same folder

  // HF's folder: output_dir/runs/<Mon DD_HH-MM-SS>_<host>, one of them.
  const auto runs = subfolders(io::join_path(dir, "runs"));
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_TRUE(std::regex_match(runs[0], std::regex(R"([A-Z][a-z]{2}\d\d_\d\d-\d\d-\d\d_.+)")))
      << runs[0];
  const auto logdir = io::join_path(io::join_path(dir, "runs"), runs[0]);

  Events events;
  MANTISSA_READ_EVENTS(events, logdir);
  const auto entries = read_jsonl(io::join_path(dir, "trainer_log.jsonl"));
  // Logs at 4, 8, 12; evaluations at 6 and 12; the run's summary; the evaluation after it.
  ASSERT_EQ(entries.size(), 7u);
  EXPECT_EQ(io::list_directory(logdir).size(), 2u);
  EXPECT_EQ(events.scalars, expected_curves(entries));
  for (const char* tag : {"train/loss", "train/learning_rate", "train/grad_norm", "train/epoch",
                          "eval/loss", "eval/accuracy"}) {
    EXPECT_EQ(events.scalars.count(tag), 1u) << tag;
  }
  const std::vector<std::pair<std::int64_t, std::string>> args_text{{0, trainer.args().to_json()}};
  EXPECT_EQ(events.texts["args/text_summary"], args_text);
  EXPECT_EQ(events.plugins["args/text_summary"], "text");
}

TEST(TensorBoardCallbackTest, LossScaleOfAnFp16Run) {
  const ScopedEnv no_rank("RANK", std::nullopt);
  const auto dir = mantissa_test::toy_output_dir();
  const auto logdir = io::join_path(dir, "tb");
  const ScopedEnv env_dir("TENSORBOARD_LOGGING_DIR", logdir);
  auto args =
      mantissa_test::toy_args(dir).max_steps(6).logging_steps(3).fp16(true).report_to("all");
  Trainer trainer(mantissa_test::make_toy_model(), args, mantissa_test::ToyDataset(100));
  trainer.train();

  Events events;
  MANTISSA_READ_EVENTS(events, logdir);
  const auto curves = expected_curves(read_jsonl(io::join_path(dir, "trainer_log.jsonl")));
  ASSERT_EQ(curves.count("train/loss_scale"), 1u);
  EXPECT_EQ(events.scalars["train/loss_scale"], curves.at("train/loss_scale"));
  EXPECT_EQ(events.scalars, curves);
  EXPECT_FALSE(io::path_exists(io::join_path(dir, "runs"))) << "TENSORBOARD_LOGGING_DIR ignored";
}

TEST(TensorBoardCallbackTest, ResumedRunShowsOneCurve) {
  const ScopedEnv no_rank("RANK", std::nullopt);
  const auto dir = mantissa_test::toy_output_dir();
  const auto logdir = io::join_path(dir, "tensorboard");
  const auto args =
      mantissa_test::toy_args(dir).max_steps(12).logging_steps(2).save_strategy("steps").save_steps(
          6);
  {
    // The first run goes on to step 12 past its checkpoint at step 6, as if it were then lost.
    Trainer first(mantissa_test::make_toy_model(), args, mantissa_test::ToyDataset(100));
    first.add_callback(std::make_shared<TensorBoardCallback>(logdir));
    first.train();
  }
  const auto first_entries = read_jsonl(io::join_path(dir, "trainer_log.jsonl"));
  Trainer second(mantissa_test::make_toy_model(), args, mantissa_test::ToyDataset(100));
  second.add_callback(std::make_shared<TensorBoardCallback>(logdir));
  second.train(io::join_path(dir, "checkpoint-6"));

  // The log file keeps the first session up to step 6, then the second: one curve, as the
  // event files show it.
  const auto one_curve = read_jsonl(io::join_path(dir, "trainer_log.jsonl"));
  std::vector<LogEntry> kept;
  for (const auto& e : first_entries) {
    if (e.at("step") <= 6) kept.push_back(e);
  }
  ASSERT_GT(one_curve.size(), kept.size());
  EXPECT_TRUE(std::equal(kept.begin(), kept.end(), one_curve.begin()));

  Events events;
  MANTISSA_READ_EVENTS(events, logdir);
  std::vector<std::int64_t> loss_steps;
  for (const auto& [step, value] : events.scalars["train/loss"]) loss_steps.push_back(step);
  EXPECT_THAT(loss_steps, ElementsAre(2, 4, 6, 8, 10, 12));
  EXPECT_EQ(events.scalars, expected_curves(one_curve));
  EXPECT_EQ(events.scalars["train/train_runtime"].size(), 1u);
}

TEST(TensorBoardCallbackTest, UnwritableLoggingDirWarnsAndTrainingGoesOn) {
  const ScopedEnv no_rank("RANK", std::nullopt);
  const auto dir = mantissa_test::toy_output_dir();
  // A folder below a regular file cannot be made, by root either.
  TempDir elsewhere;
  const auto blocker = elsewhere.file("not-a-folder");
  mantissa_test::write_raw_file(blocker, "x");
  const auto logdir = io::join_path(blocker, "runs");
  const ScopedEnv env_dir("TENSORBOARD_LOGGING_DIR", logdir);
  auto args = mantissa_test::toy_args(dir).max_steps(10).logging_steps(2).report_to("tensorboard");
  Trainer trainer(mantissa_test::make_toy_model(), args, mantissa_test::ToyDataset(100));
  mantissa_test::WarningCapture warnings;
  const auto output = trainer.train();

  EXPECT_EQ(output.global_step, 10);
  EXPECT_EQ(read_jsonl(io::join_path(dir, "trainer_log.jsonl")).size(), 6u);
  std::vector<std::string> ours;
  for (const auto& m : warnings.messages) {
    if (m.find("TensorBoard") != std::string::npos) ours.push_back(m);
  }
  ASSERT_EQ(ours.size(), 1u) << "reported once per train()";
  EXPECT_THAT(ours[0], HasSubstr("'" + logdir + "'"));
  EXPECT_THAT(ours[0], HasSubstr("Training goes on"));
}

/// Makes `dir` read-only for the guard's lifetime: its mode, and where the process ignores modes
/// (root), a read-only tmpfs mounted over it. `reason` says why neither worked.
class ReadOnlyFolder {
 public:
  explicit ReadOnlyFolder(const std::string& dir) : dir_(dir) {
    ::chmod(dir_.c_str(), 0555);
    if (::access(dir_.c_str(), W_OK) != 0) return;
    if (::mount("tmpfs", dir_.c_str(), "tmpfs", MS_RDONLY, "size=64k") == 0) {
      mounted_ = true;
      return;
    }
    reason = std::string("the process writes through folder modes and cannot mount: ") +
             std::strerror(errno);
  }
  ~ReadOnlyFolder() {
    if (mounted_) ::umount2(dir_.c_str(), MNT_DETACH);
    ::chmod(dir_.c_str(), 0755);
  }
  ReadOnlyFolder(const ReadOnlyFolder&) = delete;
  ReadOnlyFolder& operator=(const ReadOnlyFolder&) = delete;

  std::string reason;  // empty when `dir` is read-only now

 private:
  std::string dir_;
  bool mounted_ = false;
};

TEST(TensorBoardCallbackTest, ReadOnlyLoggingDirWarnsAndTrainingGoesOn) {
  const ScopedEnv no_rank("RANK", std::nullopt);
  const auto dir = mantissa_test::toy_output_dir();
  TempDir elsewhere;
  const auto logdir = elsewhere.file("read-only");
  io::create_directories(logdir);
  const ReadOnlyFolder read_only(logdir);
  if (!read_only.reason.empty()) GTEST_SKIP() << read_only.reason;
  auto args = mantissa_test::toy_args(dir).max_steps(4).logging_steps(2);
  Trainer trainer(mantissa_test::make_toy_model(), args, mantissa_test::ToyDataset(100));
  trainer.add_callback(std::make_shared<TensorBoardCallback>(logdir));
  mantissa_test::WarningCapture warnings;
  const auto output = trainer.train();
  EXPECT_EQ(output.global_step, 4);
  EXPECT_EQ(read_jsonl(io::join_path(dir, "trainer_log.jsonl")).size(), 3u);
  ASSERT_EQ(warnings.messages.size(), 1u);
  EXPECT_THAT(warnings.messages[0], HasSubstr("TensorBoard logging into '" + logdir + "' failed"));
  EXPECT_THAT(warnings.messages[0],
              ::testing::AnyOf(HasSubstr("Permission denied"), HasSubstr("Read-only file system")));
}

TEST(TensorBoardCallbackTest, OnlyWhenAskedAndOnlyOnRankZero) {
  const ScopedEnv no_env_dir("TENSORBOARD_LOGGING_DIR", std::nullopt);
  const auto run = [](const TrainingArguments& args) {
    Trainer trainer(mantissa_test::make_toy_model(), args, mantissa_test::ToyDataset(100));
    trainer.train();
  };
  {
    const ScopedEnv no_rank("RANK", std::nullopt);
    const auto dir = mantissa_test::toy_output_dir();
    run(mantissa_test::toy_args(dir).max_steps(2));  // report_to "none", the default
    EXPECT_FALSE(io::path_exists(io::join_path(dir, "runs")));
    const auto named = mantissa_test::toy_output_dir();
    run(mantissa_test::toy_args(named).max_steps(2).report_to("tensorboard").run_name("base"));
    EXPECT_EQ(subfolders(io::join_path(named, "runs")), std::vector<std::string>{"base"});
    EXPECT_FALSE(io::list_directory(io::join_path(named, "runs/base")).empty());
  }
  // A process other than rank 0 of a data-parallel run (the Trainer marks it in the state, as
  // HF's TrainerState.is_world_process_zero) writes nothing.
  const auto dir = mantissa_test::toy_output_dir();
  const auto args = mantissa_test::toy_args(dir).report_to("tensorboard");
  TensorBoardCallback callback;
  TrainerState state;
  state.is_world_process_zero = false;
  TrainerControl control;
  callback.on_train_begin(args, state, control);
  callback.on_log(args, state, control, {{"loss", 1.0}});
  callback.on_train_end(args, state, control);
  EXPECT_FALSE(io::path_exists(io::join_path(dir, "runs")));
  state.is_world_process_zero = true;  // the same calls on rank 0 write the file
  callback.on_train_begin(args, state, control);
  callback.on_log(args, state, control, {{"loss", 1.0}});
  callback.on_train_end(args, state, control);
  EXPECT_TRUE(io::path_exists(io::join_path(dir, "runs")));
}

}  // namespace
