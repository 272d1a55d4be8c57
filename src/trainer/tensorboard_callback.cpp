// TensorBoardCallback: the Trainer's logs as TensorBoard event files (io/event_file.h).
#include <mantissa/tensorboard_callback.h>

#include <chrono>
#include <cstdlib>
#include <ctime>

#include <c10/util/Exception.h>

#include "io/filesystem.h"

#include "io/event_file.h"
#include "io/tensorboard_event.h"

namespace mantissa {
namespace {

double wall_time_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// A leading "~" or "~/" means $HOME, as Python's os.path.expanduser reads it.
std::string expand_user(const std::string& path) {
  const char* home = std::getenv("HOME");
  if (home == nullptr || path.empty() || path[0] != '~') return path;
  if (path.size() == 1) return home;
  if (path[1] != '/') return path;  // "~user/..." is left alone
  return std::string(home) + path.substr(1);
}

std::optional<std::string> logging_dir_from_environment() {
  const char* dir = std::getenv("TENSORBOARD_LOGGING_DIR");
  if (dir == nullptr || *dir == '\0') return std::nullopt;
  return expand_user(dir);
}

}  // namespace

std::vector<std::pair<std::string, double>> rewrite_logs(const LogEntry& logs) {
  std::vector<std::pair<std::string, double>> tagged;
  tagged.reserve(logs.size());
  for (const auto& [key, value] : logs) {
    if (key.rfind("eval_", 0) == 0) {
      tagged.emplace_back("eval/" + key.substr(5), value);
    } else if (key.rfind("test_", 0) == 0) {
      tagged.emplace_back("test/" + key.substr(5), value);
    } else {
      tagged.emplace_back("train/" + key, value);
    }
  }
  return tagged;
}

std::string default_logdir() {
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  char stamp[32];
  // strftime's %b follows the C locale a C++ program starts in: "Jan" ... "Dec", as Python.
  std::strftime(stamp, sizeof(stamp), "%b%d_%H-%M-%S", &local);
  return io::join_path("runs", std::string(stamp) + "_" + io::detail::host_name());
}

TensorBoardCallback::TensorBoardCallback(std::optional<std::string> logging_dir)
    : logging_dir_(logging_dir ? std::move(logging_dir) : logging_dir_from_environment()) {}

TensorBoardCallback::~TensorBoardCallback() = default;

std::string TensorBoardCallback::event_file() const { return writer_ ? writer_->path() : ""; }

io::detail::EventFileWriter* TensorBoardCallback::writer(const TrainingArguments& args) {
  if (writer_ || failed_) return writer_.get();
  try {
    if (!logging_dir_) {
      logging_dir_ =
          io::join_path(args.output_dir(), args.run_name() ? io::join_path("runs", *args.run_name())
                                                           : default_logdir());
    }
    io::create_directories(*logging_dir_);
    const double now = wall_time_now();
    writer_ = std::make_unique<io::detail::EventFileWriter>(
        io::join_path(*logging_dir_, io::detail::event_file_name(now)), now);
  } catch (const std::exception& error) {
    report_failure(error);
  }
  return writer_.get();
}

void TensorBoardCallback::write(const TrainingArguments& args,
                                const std::vector<std::string>& events) {
  auto* file = writer(args);
  if (file == nullptr) return;
  try {
    file->write(events);
  } catch (const std::exception& error) {
    report_failure(error);
  }
}

void TensorBoardCallback::report_failure(const std::exception& error) {
  writer_.reset();
  failed_ = true;
  const auto* c10_error = dynamic_cast<const c10::Error*>(&error);
  TORCH_WARN("TensorBoard logging into '", logging_dir_.value_or("?"),
             "' failed: ", c10_error ? c10_error->what_without_backtrace() : error.what(),
             ". Training goes on without TensorBoard events until the next train(); "
             "trainer_log.jsonl and trainer_state.json keep every log entry.");
}

void TensorBoardCallback::on_train_begin(const TrainingArguments& args, TrainerState& state,
                                         TrainerControl&) {
  if (!state.is_world_process_zero) return;  // only rank 0 writes event files, as HF
  failed_ = false;
  writer_.reset();  // each train() writes its own file, as HF opens a new SummaryWriter
  const double now = wall_time_now();
  std::vector<std::string> events;
  if (state.global_step > 0) {
    // A resumed run: points of an earlier session from the first step this one trains on are
    // stale (the interrupted run went past its checkpoint), and this one writes them anew.
    events.push_back(io::detail::encode_session_start_event(now, state.global_step + 1));
  }
  events.push_back(io::detail::encode_text_event(now, 0, "args", args.to_json()));
  write(args, events);
}

void TensorBoardCallback::on_log(const TrainingArguments& args, TrainerState& state,
                                 TrainerControl&, const LogEntry& logs) {
  if (!state.is_world_process_zero) return;  // only rank 0 writes event files, as HF
  std::vector<std::pair<std::string, float>> scalars;
  for (const auto& [tag, value] : rewrite_logs(logs)) {
    scalars.emplace_back(tag, static_cast<float>(value));
  }
  write(args, {io::detail::encode_scalars_event(wall_time_now(), state.global_step, scalars)});
}

void TensorBoardCallback::on_train_end(const TrainingArguments&, TrainerState&, TrainerControl&) {
  if (!writer_) return;
  try {
    writer_->close();
  } catch (const std::exception& error) {
    report_failure(error);
  }
  writer_.reset();
}

}  // namespace mantissa
