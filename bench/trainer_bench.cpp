// One training run on Fashion-MNIST, timed in its steady state, through mantissa's Trainer or
// through a hand-written LibTorch loop doing the same math; prints one JSON line.
//
//   build/bench/trainer_bench --impl trainer --model mlp --precision bf16 --steps 600 --warmup 50
//   build/bench/trainer_bench --impl hand    --model cnn --precision fp32 --steps 150 --warmup 20
//
// bench/anchors runs this program and the Python anchors (bench/python/) in separate
// processes, interleaved, and compares them; see BENCHMARKS.md.
//
// Under a launcher (torchrun --no-python, WORLD_SIZE > 1) the Trainer trains data parallel by
// itself, each rank on its shard of the epoch; bench/ddp_scaling runs it that way beside
// bench/python/torch_ddp.py. Only rank 0 prints the JSON line (every rank with --every_rank, as
// bench/sharded_memory asks), with the world size; its speeds are those of rank 0
// (samples_per_second counts this rank's samples). The JSON line also counts the optimizer state
// the process holds (optimizer_state_bytes), so --fsdp shard_grad_op shows its shard.
// --ddp_bucket_cap_mb sets the Trainer's gradient bucket size; unused parameters are not
// searched for, as in PyTorch's DDP by default. The hand-written loop has no gradient sync, so it only runs alone.
//
// What both implementations do, step for step (the Trainer's defaults, with the optimizer and
// precision given on the command line):
//   - batches of --batch_size in the Trainer's order for epoch 0 (randperm of the 60000 train
//     images with a CPU generator seeded with --seed), gathered with one index_select;
//   - forward and cross-entropy under bf16 autocast (bf16, bf16_masters) or in fp32;
//   - backward; with bf16_masters, the bf16 grads copied into fp32 masters;
//   - clip_grad_norm_ to 1.0 (HF's max_grad_norm default), AdamW (lr --lr, weight decay 0,
//     HF's defaults otherwise), linear LR decay to 0 over the run, zero_grad.
// Timed: wall time from the end of step --warmup to the end of step --warmup + --steps. On the
// CPU every op has finished when it returns, so no sync is needed at either end.

#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <torch/torch.h>
#include <torch/version.h>
#include <CLI/CLI.hpp>

#include <mantissa/amp/autocast.h>
#include <mantissa/amp/master_weights.h>
#include <mantissa/clip_grad.h>
#include <mantissa/distributed.h>
#include <mantissa/lr_scheduler.h>
#include <mantissa/optim/fused_adamw.h>
#include <mantissa/optim/optimizer_registry.h>
#include <mantissa/trainer.h>
#include <mantissa/training_arguments.h>
#include "io/filesystem.h"
#include "trainer/optimizer_state_table.h"

#include "fashion_models.h"
#include "median.h"
#include "idx_dataset.h"

namespace {

using Clock = std::chrono::steady_clock;
using mantissa::examples::FashionMnist;

struct Config {
  std::string impl = "trainer";  // trainer | hand
  std::string model = "mlp";     // mlp | cnn
  std::string precision =
      "bf16";  // fp32 | bf16 (autocast) | bf16_masters (bf16 model + fp32 masters)
  std::string optim =
      "adamw_torch_fused";  // the Trainer's --optim: adamw_torch | adamw_torch_fused
  std::int64_t steps = 200;
  std::int64_t warmup = 20;
  std::int64_t batch_size = 64;
  int threads = 2;
  double lr = 1e-3;
  std::int64_t seed = 42;
  std::string data_dir = mantissa::examples::kFashionMnistDir;
  bool count_ops = false;
  bool every_rank = false;
  std::optional<std::int64_t> ddp_bucket_cap_mb;  // unset: the Trainer's default
  std::string fsdp;                               // the Trainer's --fsdp (shard_grad_op)
  std::optional<std::string> fsdp_config;         // the Trainer's --fsdp_config
  std::int64_t save_steps = 0;                    // checkpoint every N steps; 0: never
  std::int64_t width = 2048;                      // wide_blocks: the blocks' width
  std::int64_t num_blocks = 12;                   // wide_blocks: how many

  std::int64_t total_steps() const { return warmup + steps; }
  bool bf16() const { return precision != "fp32"; }
  bool masters() const { return precision == "bf16_masters"; }
  bool fused() const { return optim == "adamw_torch_fused"; }
};

struct Measurement {
  double seconds = 0.0;      // wall time of the timed steps
  double cpu_seconds = 0.0;  // the process's CPU time over the same steps
  double median_step_seconds = 0.0;
  double mean_loss = 0.0;  // over every step of the run, warmup included
  std::int64_t optimizer_state_bytes = 0;  // optimizer_state_bytes() at the end of the run
  double median_save_seconds = 0.0;        // per checkpoint save (--save_steps), 0 without
  double checkpoint_mib = 0.0;             // the last checkpoint folder's files, 0 without
};

/// A line of /proc/self/status in MiB ("VmRSS", "VmHWM").
double status_mib(const std::string& key) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind(key + ":", 0) == 0)
      return std::stod(line.substr(key.size() + 1)) / 1024.0;  // kB
  }
  return -1.0;
}

/// Counts the ATen ops dispatched (top-level and nested: every RecordFunction of scope
/// FUNCTION) while `counting` is set, by name. Only with --count_ops: the callback slows
/// every op down, so timed runs go without it.
struct OpCounter {
  static OpCounter& instance() {
    static OpCounter counter;
    return counter;
  }
  void install() {
    at::addGlobalCallback(at::RecordFunctionCallback([](const at::RecordFunction& fn)
                                                         -> std::unique_ptr<at::ObserverContext> {
                            auto& self = instance();
                            if (self.counting) ++self.by_name[fn.name()];
                            return nullptr;
                          }).scopes({at::RecordScope::FUNCTION}));
  }
  std::int64_t total() const {
    std::int64_t n = 0;
    for (const auto& [name, count] : by_name) n += count;
    return n;
  }
  bool counting = false;
  std::map<std::string, std::int64_t> by_name;
};

/// CPU time of the whole process (all threads), in seconds.
double process_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

/// Records the wall time and the process's CPU time when the warmup ends and when the last
/// timed step ends, and the wall time of each timed step. On a machine shared with other work
/// the median step is the steadier figure: a step that waited for a core is an outlier there.
struct StepClock {
  std::int64_t warmup;
  std::int64_t total;
  Clock::time_point start, end, last;
  double cpu_start = 0.0, cpu_end = 0.0;
  std::vector<double> step_seconds;
  void step_ended(std::int64_t completed) {
    const auto now = Clock::now();
    if (completed > warmup && completed <= total)
      step_seconds.push_back(std::chrono::duration<double>(now - last).count());
    last = now;
    if (completed == warmup) {
      start = now;
      cpu_start = process_cpu_seconds();
      OpCounter::instance().counting = true;
    }
    if (completed == total) {
      end = now;
      cpu_end = process_cpu_seconds();
      OpCounter::instance().counting = false;
    }
  }
  double seconds() const { return std::chrono::duration<double>(end - start).count(); }
  double cpu_seconds() const { return cpu_end - cpu_start; }
  double median_step_seconds() const {
    auto v = step_seconds;
    std::sort(v.begin(), v.end());
    return v.empty()      ? 0.0
           : v.size() % 2 ? v[v.size() / 2]
                          : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
  }
};

struct StepClockCallback : mantissa::TrainerCallback {
  explicit StepClockCallback(StepClock& clock) : clock(clock) {}
  void on_step_end(const mantissa::TrainingArguments&, mantissa::TrainerState& state,
                   mantissa::TrainerControl&) override {
    clock.step_ended(state.global_step);
  }
  StepClock& clock;
};

/// The wall time of each checkpoint save: from the end of the step that triggers it (the save
/// follows on_step_end) to on_save.
struct SaveClockCallback : mantissa::TrainerCallback {
  explicit SaveClockCallback(std::vector<double>& seconds) : seconds(seconds) {}
  void on_step_end(const mantissa::TrainingArguments&, mantissa::TrainerState&,
                   mantissa::TrainerControl&) override {
    step_end = Clock::now();
  }
  void on_save(const mantissa::TrainingArguments&, mantissa::TrainerState&,
               mantissa::TrainerControl&) override {
    seconds.push_back(std::chrono::duration<double>(Clock::now() - step_end).count());
  }
  Clock::time_point step_end;
  std::vector<double>& seconds;
};

/// The bytes of the files under `dir`, in MiB.
double folder_mib(const std::string& dir) {
  std::int64_t bytes = 0;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(dir)) {
    if (entry.is_regular_file()) bytes += static_cast<std::int64_t>(entry.file_size());
  }
  return static_cast<double>(bytes) / (1024.0 * 1024.0);
}

std::int64_t bytes_of(const torch::Tensor& t) {
  return t.defined() ? t.numel() * static_cast<std::int64_t>(t.element_size()) : 0;
}

/// The bytes of optimizer state this process holds, counted from its tensors: the moments, step
/// counters and Kahan buffers of what `optimizer` updates, plus, when those are fp32 masters of
/// a bf16 model, each master and its gradient. Under fsdp shard_grad_op `optimizer` updates this
/// rank's shard only.
std::int64_t optimizer_state_bytes(torch::optim::Optimizer& optimizer, bool masters) {
  // The state tensors the checkpoint code knows per optimizer class, and FusedAdamW's step
  // counter (a tensor there; an integer in torch::optim::AdamW).
  const auto& kind = mantissa::detail::optimizer_state_kind(optimizer);
  std::int64_t total = 0;
  for (const auto& group : optimizer.param_groups()) {
    for (const auto& param : group.params()) {
      if (masters) total += 2 * bytes_of(param);
      const auto found = optimizer.state().find(param.unsafeGetTensorImpl());
      if (found == optimizer.state().end()) continue;
      for (const auto& entry : kind.state_tensors(*found->second)) total += bytes_of(entry.value);
      if (const auto* fused =
              dynamic_cast<const mantissa::optim::FusedAdamWParamState*>(found->second.get())) {
        total += bytes_of(fused->step());
      }
    }
  }
  return total;
}

/// Counts the optimizer state when training ends (the callback sees the optimizer the
/// Trainer's strategy built).
struct StateBytesCallback : mantissa::TrainerCallback {
  StateBytesCallback(bool masters, std::int64_t& bytes) : masters(masters), bytes(bytes) {}
  void on_train_end(const mantissa::TrainingArguments&, mantissa::TrainerState&,
                    mantissa::TrainerControl&) override {
    if (context().optimizer != nullptr) bytes = optimizer_state_bytes(*context().optimizer, masters);
  }
  bool masters;
  std::int64_t& bytes;
};

template <typename Model>
Measurement run_trainer(const Config& c, Model model, FashionMnist data) {
  const auto output_dir = mantissa::io::make_temp_directory("/tmp", "trainer-bench-");
  auto args = mantissa::TrainingArguments()
                  .output_dir(output_dir)
                  .overwrite_output_dir(true)
                  .use_cpu(true)
                  .max_steps(c.total_steps())
                  .per_device_train_batch_size(c.batch_size)
                  .learning_rate(c.lr)
                  .optim(c.optim)
                  .bf16(c.bf16())
                  .master_weights(c.masters() ? "on" : "auto")
                  .logging_strategy("no")
                  .save_strategy(c.save_steps > 0 ? "steps" : "no")
                  .save_steps(static_cast<double>(std::max<std::int64_t>(c.save_steps, 1)))
                  .fsdp_config(c.fsdp_config)
                  .disable_tqdm(true)
                  .seed(c.seed)
                  .ddp_bucket_cap_mb(c.ddp_bucket_cap_mb)
                  .fsdp(c.fsdp)
                  // DistributedDataParallel's own default, which bench/python/torch_ddp.py
                  // runs with (HF, and so the Trainer, would walk the graph for unused ones).
                  .ddp_find_unused_parameters(false);
  StepClock clock{c.warmup, c.total_steps(), {}, {}};
  mantissa::Trainer trainer(model, args, std::move(data));
  trainer.add_callback(std::make_shared<StepClockCallback>(clock));
  std::int64_t state_bytes = 0;
  trainer.add_callback(std::make_shared<StateBytesCallback>(c.masters(), state_bytes));
  std::vector<double> save_seconds;
  trainer.add_callback(std::make_shared<SaveClockCallback>(save_seconds));
  const auto result = trainer.train();
  double checkpoint_mib = 0.0;
  const auto last = mantissa::io::join_path(
      output_dir, "checkpoint-" + std::to_string(c.total_steps() / std::max<std::int64_t>(c.save_steps, 1) *
                                                 c.save_steps));
  if (c.save_steps > 0 && mantissa::io::is_directory(last)) checkpoint_mib = folder_mib(last);
  mantissa::io::remove_all(output_dir);
  return {clock.seconds(),      clock.cpu_seconds(),  clock.median_step_seconds(),
          result.training_loss, state_bytes,          save_seconds.empty() ? 0.0 : mantissa_bench::median(save_seconds),
          checkpoint_mib};
}

/// What a LibTorch user writes by hand for the same run, with the same building blocks.
template <typename Model>
Measurement run_hand(const Config& c, Model model, const FashionMnist& data) {
  std::unique_ptr<mantissa::amp::MasterWeights> masters;
  if (c.masters()) {
    model->to(torch::kBFloat16);
    masters = std::make_unique<mantissa::amp::MasterWeights>(model->parameters());
  }
  const auto params = masters ? masters->master_params() : model->parameters();
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  if (c.fused()) {
    const auto options = mantissa::optim::FusedAdamWOptions(c.lr).weight_decay(0.0);
    optimizer = masters ? std::make_unique<mantissa::optim::FusedAdamW>(
                              *masters, options)  // writes the bf16 model too
                        : std::make_unique<mantissa::optim::FusedAdamW>(params, options);
  } else {
    optimizer = std::make_unique<torch::optim::AdamW>(
        params, torch::optim::AdamWOptions(c.lr).weight_decay(0.0));
  }
  mantissa::LrScheduler scheduler(*optimizer, "linear", /*num_warmup_steps=*/0, c.total_steps());

  torch::manual_seed(
      static_cast<std::uint64_t>(c.seed));  // dropout, as the Trainer seeds at train()
  model->train();
  const auto order = torch::randperm(
      data.images().size(0), at::detail::createCPUGenerator(static_cast<std::uint64_t>(c.seed)),
      torch::kLong);
  auto loss_sum = torch::zeros({}, torch::kFloat);
  StepClock clock{c.warmup, c.total_steps(), {}, {}};
  for (std::int64_t step = 0; step < c.total_steps(); ++step) {
    const auto index = order.slice(0, step * c.batch_size, (step + 1) * c.batch_size);
    const auto images = data.images().index_select(0, index);
    const auto targets = data.targets().index_select(0, index);
    torch::Tensor loss;
    {
      mantissa::amp::Autocast autocast(torch::kCPU, torch::kBFloat16, c.bf16());
      loss = torch::nn::functional::cross_entropy(model->forward(images), targets);
    }
    loss.backward();
    loss_sum += loss.detach().to(torch::kFloat);
    if (masters) masters->copy_grads_to_masters();
    mantissa::clip_grad_norm_(params, 1.0);
    optimizer->step();
    if (masters && !c.fused()) masters->copy_masters_to_model();
    scheduler.step();
    optimizer->zero_grad();
    if (masters) masters->zero_grad();
    clock.step_ended(step + 1);
  }
  return {clock.seconds(), clock.cpu_seconds(), clock.median_step_seconds(),
          loss_sum.item<double>() / static_cast<double>(c.total_steps()),
          optimizer_state_bytes(*optimizer, c.masters())};
}

template <typename Model>
Model make_model(const Config& /*c*/) {
  return Model();
}

template <>
mantissa::examples::FashionWideBlocks make_model(const Config& c) {
  return mantissa::examples::FashionWideBlocks(c.width, c.num_blocks);
}

template <>
mantissa::examples::FashionMlp make_model(const Config& c) {
  return c.model == "wide_mlp" ? mantissa::examples::FashionWideMlp()
                               : mantissa::examples::FashionMlp();
}

template <typename Model>
Measurement run(const Config& c, FashionMnist data, double& setup_rss_mib) {
  torch::manual_seed(static_cast<std::uint64_t>(c.seed));
  auto model = make_model<Model>(c);
  setup_rss_mib = status_mib("VmRSS");
  TORCH_CHECK_VALUE(c.impl == "trainer" || c.optim == "adamw_torch" || c.optim == "adamw_torch_fused",
                    "--impl hand runs adamw_torch or adamw_torch_fused, not --optim ", c.optim);
  return c.impl == "trainer" ? run_trainer(c, model, std::move(data)) : run_hand(c, model, data);
}

}  // namespace

int main(int argc, char** argv) try {
  Config c;
  CLI::App app{
      "One Fashion-MNIST training run through mantissa's Trainer or a hand-written LibTorch loop; "
      "prints one JSON line."};
  app.add_option("--impl", c.impl, "trainer or hand")->check(CLI::IsMember({"trainer", "hand"}));
  app.add_option("--model", c.model,
                 "mlp (784-256-256-10), cnn (examples/fashion_mnist), wide_mlp "
                 "(784-4096-4096-10, ~20M parameters) or wide_blocks (784-W, K residual W-W "
                 "blocks, W-10; declared for full sharding)")
      ->check(CLI::IsMember({"mlp", "cnn", "wide_mlp", "wide_blocks"}));
  app.add_option("--width", c.width, "wide_blocks: W (2048)")->check(CLI::PositiveNumber);
  app.add_option("--num_blocks", c.num_blocks, "wide_blocks: K (12)")->check(CLI::PositiveNumber);
  app.add_option("--precision", c.precision, "fp32, bf16 (autocast, fp32 weights) or bf16_masters")
      ->check(CLI::IsMember({"fp32", "bf16", "bf16_masters"}));
  app.add_option("--optim", c.optim,
                 "the Trainer's --optim (any registered name); --impl hand: adamw_torch "
                 "(torch::optim::AdamW) or adamw_torch_fused (mantissa FusedAdamW)")
      ->check(CLI::IsMember(mantissa::optim::optimizer_names()));
  app.add_option("--steps", c.steps, "timed optimizer steps")->check(CLI::PositiveNumber);
  app.add_option("--warmup", c.warmup, "untimed steps before them")->check(CLI::PositiveNumber);
  app.add_option("--batch_size", c.batch_size)->check(CLI::PositiveNumber);
  app.add_option("--threads", c.threads, "at::set_num_threads")->check(CLI::PositiveNumber);
  app.add_option("--lr", c.lr);
  app.add_option("--seed", c.seed);
  app.add_option("--data_dir", c.data_dir);
  app.add_option("--ddp_bucket_cap_mb", c.ddp_bucket_cap_mb,
                 "gradient bucket size in MiB under several processes (default: the Trainer's)")
      ->check(CLI::PositiveNumber);
  app.add_option("--fsdp", c.fsdp,
                 "the Trainer's fsdp: shard_grad_op shards gradients and optimizer state across "
                 "the processes, full_shard (or true) the parameters too (--impl trainer)");
  app.add_option("--fsdp_config", c.fsdp_config,
                 "the Trainer's --fsdp_config, e.g. '{\"state_dict_type\": \"SHARDED_STATE_DICT\"}'");
  app.add_option("--save_steps", c.save_steps,
                 "checkpoint every N steps and report the median save time and the last "
                 "checkpoint's size (0: no checkpoints)")
      ->check(CLI::NonNegativeNumber);
  app.add_flag("--every_rank", c.every_rank,
               "every rank prints its JSON line (with its rank and its own peak RSS), not only "
               "rank 0");
  app.add_flag("--count_ops", c.count_ops,
               "count the ATen ops of the timed steps (ops_per_step in the JSON line, the ops by "
               "name on stderr); "
               "slows the run down, so its times are not comparable");
  CLI11_PARSE(app, argc, argv);

  const auto env = mantissa::distributed::DistributedEnvironment::from_env();
  TORCH_CHECK_VALUE(c.impl == "trainer" || !env.is_distributed(),
                    "--impl hand has no gradient sync; run it as one process, not under a "
                    "launcher with WORLD_SIZE ",
                    env.world_size);
  const int default_threads = at::get_num_threads();
  at::set_num_threads(c.threads);
  FashionMnist data(c.data_dir, FashionMnist::Split::kTrain);
  // Each rank's epoch is its shard: the train set split over the ranks.
  const auto shard_size = data.images().size(0) / env.world_size;
  TORCH_CHECK_VALUE(c.total_steps() * c.batch_size <= shard_size,
                    "warmup + steps must fit in one epoch (", shard_size / c.batch_size,
                    " batches of ", c.batch_size, " per rank)");

  if (c.count_ops) OpCounter::instance().install();
  double setup_rss_mib = 0.0;
  const auto m =
      c.model == "cnn"           ? run<mantissa::examples::FashionCnn>(c, std::move(data), setup_rss_mib)
      : c.model == "wide_blocks" ? run<mantissa::examples::FashionWideBlocks>(c, std::move(data),
                                                                           setup_rss_mib)
                                 : run<mantissa::examples::FashionMlp>(c, std::move(data), setup_rss_mib);
  if (!env.is_main_process() && !c.every_rank) return 0;
  std::string ops_json;
  if (c.count_ops) {
    const auto& counter = OpCounter::instance();
    ops_json = ",\"ops_per_step\":" +
               std::to_string(static_cast<double>(counter.total()) / static_cast<double>(c.steps));
    for (const auto& [name, count] : counter.by_name) {
      std::fprintf(stderr, "%10.2f %s\n", static_cast<double>(count) / static_cast<double>(c.steps),
                   name.c_str());
    }
  }
  std::printf(
      "{\"bench\":\"trainer_anchor\",\"impl\":\"%s\",\"model\":\"%s\",\"precision\":\"%s\","
      "\"optim\":\"%s\","
      "\"batch_size\":%lld,\"warmup\":%lld,\"steps\":%lld,\"threads\":%d,\"default_threads\":%d,"
      "\"seconds\":%.6f,\"cpu_seconds\":%.6f,\"median_step_ms\":%.4f,\"steps_per_second\":%.3f,"
      "\"samples_per_second\":%.1f,\"mean_loss\":%.5f,"
      "\"setup_rss_mib\":%.1f,\"peak_rss_mib\":%.1f,\"torch\":\"%s\",\"world_size\":%lld,"
      "\"rank\":%lld,\"fsdp\":\"%s\",\"optimizer_state_bytes\":%lld,\"save_steps\":%lld,"
      "\"median_save_ms\":%.1f,\"checkpoint_mib\":%.2f%s}\n",
      c.impl.c_str(), c.model.c_str(), c.precision.c_str(), c.optim.c_str(),
      static_cast<long long>(c.batch_size), static_cast<long long>(c.warmup),
      static_cast<long long>(c.steps), at::get_num_threads(), default_threads, m.seconds,
      m.cpu_seconds, 1e3 * m.median_step_seconds, static_cast<double>(c.steps) / m.seconds,
      static_cast<double>(c.steps * c.batch_size) / m.seconds, m.mean_loss, setup_rss_mib,
      status_mib("VmHWM"), TORCH_VERSION, static_cast<long long>(env.world_size),
      static_cast<long long>(env.rank), c.fsdp.c_str(),
      static_cast<long long>(m.optimizer_state_bytes), static_cast<long long>(c.save_steps),
      1e3 * m.median_save_seconds, m.checkpoint_mib, ops_json.c_str());
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "trainer_bench: error: %s\n", e.what());
  return 1;
}
