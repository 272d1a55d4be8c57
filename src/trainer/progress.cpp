#include "trainer/progress.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>

#include <fmt/format.h>

namespace mantissa::detail {

std::string format_log(const LogEntry& logs) {
  std::string out = "{";
  bool first = true;
  for (const auto& [key, value] : logs) {
    if (!first) out += ", ";
    first = false;
    if (std::isfinite(value) && std::floor(value) == value && std::fabs(value) < 1e15 &&
        (key == "step" || key == "skipped_steps" || key == "num_input_tokens_seen")) {
      out += fmt::format("'{}': {}", key, static_cast<long long>(value));
    } else {
      out += fmt::format("'{}': {:.6g}", key, value);
    }
  }
  return out + "}";
}

bool Progress::wanted(bool disable_tqdm) {
  const char* ci = std::getenv("CI");
  const bool under_ci =
      ci != nullptr && *ci != '\0' && std::string(ci) != "false" && std::string(ci) != "0";
  return !disable_tqdm && !under_ci && ::isatty(STDOUT_FILENO) == 1;
}

Progress::Progress(std::int64_t total_steps, bool enabled, bool prints)
    : total_(total_steps),
      enabled_(enabled && prints),
      prints_(prints),
      start_(std::chrono::steady_clock::now()),
      last_draw_(start_) {}

void Progress::update(std::int64_t step) {
  if (first_step_ < 0) {
    first_step_ = step > 0 ? step - 1 : 0;
    start_ = std::chrono::steady_clock::now();
  }
  last_step_ = step;
  if (!enabled_) return;
  const auto now = std::chrono::steady_clock::now();
  if (step < total_ && drawn_ && now - last_draw_ < std::chrono::milliseconds(100)) return;
  last_draw_ = now;
  draw(step);
}

void Progress::draw(std::int64_t step) {
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const double done = static_cast<double>(step - std::max<std::int64_t>(first_step_, 0));
  const double rate = elapsed > 0 ? done / elapsed : 0.0;
  const double eta = rate > 0 ? static_cast<double>(total_ - step) / rate : 0.0;
  const double fraction =
      total_ > 0 ? static_cast<double>(step) / static_cast<double>(total_) : 1.0;
  constexpr int kWidth = 30;
  const int filled = static_cast<int>(fraction * kWidth);
  auto clock = [](double seconds) {
    // An estimate for a run near 2^63 steps can exceed what a long long holds.
    const auto s = seconds < 0x1p62 ? static_cast<long long>(seconds) : (1LL << 62);
    return fmt::format("{:02}:{:02}", s / 60, s % 60);
  };
  std::fprintf(
      stdout, "\r%3d%%|%s%s| %lld/%lld [%s<%s, %.2fit/s]", static_cast<int>(fraction * 100),
      std::string(static_cast<size_t>(filled), '#').c_str(),
      std::string(static_cast<size_t>(kWidth - filled), ' ').c_str(), static_cast<long long>(step),
      static_cast<long long>(total_), clock(elapsed).c_str(), clock(eta).c_str(), rate);
  std::fflush(stdout);
  drawn_ = true;
}

void Progress::print(const std::string& line) {
  if (!prints_) return;
  if (enabled_ && drawn_) std::fputs("\r\033[K", stdout);
  std::fputs(line.c_str(), stdout);
  std::fputc('\n', stdout);
  if (enabled_ && drawn_) draw(last_step_);
  std::fflush(stdout);
}

void Progress::close() {
  if (enabled_ && drawn_) {
    draw(last_step_);
    std::fputc('\n', stdout);
    std::fflush(stdout);
  }
  drawn_ = false;
}

}  // namespace mantissa::detail
