#pragma once
// What tests/ddp_trainer_check.cpp and tests/fsdp_trainer_check.cpp share: the worker (one
// Trainer run of a small MLP, alone or as one rank of a job), the launcher that starts workers
// as separate processes, and the comparisons of what they wrote. Each check executable plays
// every part; see ddp_trainer_check.cpp for the command line. The worker's program name on
// its command line is "trainer_check", whichever executable runs it.
//
// Worker options: --num_examples N (256), --hidden H (32), --dropout P (0), --model_dtype
// fp32|bf16 (fp32), --middle M (0: none; else a Float8Linear hidden -> M between the two
// layers, which --fp8 runs in FP8), --blocks K (0; else K residual blocks hidden -> hidden
// after the first layer, declared as blocks for --fsdp; --declare_blocks false leaves them
// undeclared), --eval N (0: no evaluation), --data FILE (data and initial
// weights from a safetensors file of tests/ddp/torch_ddp_reference.py), --die-on-rank R
// --die-at-step S (that rank kills itself with SIGKILL after step S).

#include <fcntl.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <torch/torch.h>

#include <mantissa/distributed.h>
#include <mantissa/fp8/float8_linear.h>
#include <mantissa/fp8/scaling_state.h>
#include <mantissa/io/safetensors.h>
#include <mantissa/nn/supports_gradient_checkpointing.h>
#include <mantissa/trainer.h>

#include "io/filesystem.h"
#include "multiprocess.h"

// Definitions, not only declarations: each check executable includes this from one file.
namespace trainer_check {

// The exit status of a skipped scenario: CTest's SKIP_RETURN_CODE (tests/CMakeLists.txt).
constexpr int kSkipped = 77;

namespace mt = mantissa::testing;
using mantissa::Batch;
using mantissa::TrainingArguments;

// ---- the worker -------------------------------------------------------------------------------

struct WorkerOptions {
  std::string results;
  std::int64_t num_examples = 256;
  std::int64_t hidden = 32;
  std::int64_t middle = 0;
  std::int64_t blocks = 0;
  bool declare_blocks = true;
  std::string freeze;  ///< a parameter's name: requires_grad false from the start
  double dropout = 0.0;
  std::string model_dtype = "fp32";
  std::int64_t eval = 0;
  std::string data;
  std::int64_t die_on_rank = -1;
  std::int64_t die_at_step = -1;
};

/// One residual block of the MLP: `fc` (hidden -> hidden), its output through relu. `fc` is a
/// Float8Linear (a plain linear layer unless --fp8 converts it).
struct ResidualBlockImpl : torch::nn::Module {
  explicit ResidualBlockImpl(std::int64_t hidden)
      : fc(register_module("fc", mantissa::fp8::Float8Linear(hidden, hidden))) {}
  mantissa::fp8::Float8Linear fc;
};
TORCH_MODULE(ResidualBlock);

/// 20 -> hidden -> 4, with parameters fc1.weight, fc1.bias, fc2.weight, fc2.bias (the names of
/// tests/ddp/torch_ddp_reference.py's model); with `middle` > 0, 20 -> hidden -> middle -> 4, the
/// middle layer `mid` a Float8Linear (the one --fp8 converts: the others are first and last).
/// With `blocks` > 0, that many residual blocks (blocks.<k>.fc, h + relu(fc(h))) after fc1, each
/// run through run_block and declared in no_split_modules (what --fsdp shards one at a time).
/// It supports `--gradient_checkpointing` (the first layer and the blocks recomputed in the
/// backward).
struct MlpImpl : torch::nn::Module, mantissa::nn::SupportsGradientCheckpointing {
  MlpImpl(std::int64_t hidden, double dropout, std::int64_t middle, std::int64_t num_blocks = 0)
      : fc1(register_module("fc1", torch::nn::Linear(20, hidden))),
        blocks(num_blocks > 0 ? register_module("blocks", torch::nn::ModuleList())
                              : torch::nn::ModuleList(nullptr)),
        mid(middle > 0 ? register_module("mid", mantissa::fp8::Float8Linear(hidden, middle))
                       : mantissa::fp8::Float8Linear(nullptr)),
        drop(register_module("drop", torch::nn::Dropout(dropout))),
        fc2(register_module("fc2", torch::nn::Linear(middle > 0 ? middle : hidden, 4))) {
    for (std::int64_t k = 0; k < num_blocks; ++k) blocks->push_back(ResidualBlock(hidden));
  }
  std::vector<std::string> no_split_modules() const override { return declared; }
  /// What no_split_modules() says (a worker may declare none, to disagree with its peers).
  std::vector<std::string> declared{"ResidualBlockImpl"};
  torch::Tensor forward(const torch::Tensor& x) {
    auto h = maybe_checkpoint(
        is_training(), [this](const torch::Tensor& in) { return torch::relu(fc1(in)); }, x);
    if (!blocks.is_empty()) {
      for (const auto& module : *blocks) {
        auto block = std::dynamic_pointer_cast<ResidualBlockImpl>(module);
        h = h + run_block(
                    *block, [block](const torch::Tensor& in) { return torch::relu(block->fc(in)); },
                    h);
      }
    }
    if (!mid.is_empty()) h = torch::relu(mid(h));
    return fc2(drop(h));
  }
  torch::nn::Linear fc1;
  torch::nn::ModuleList blocks;
  mantissa::fp8::Float8Linear mid;
  torch::nn::Dropout drop;
  torch::nn::Linear fc2;
};
TORCH_MODULE(Mlp);

mantissa::BatchSource source_of(torch::Tensor x, torch::Tensor y) {
  mantissa::BatchSource source;
  source.size = static_cast<std::size_t>(x.size(0));
  source.get_batch = [x, y](c10::ArrayRef<std::size_t> indices) {
    const auto index =
        torch::tensor(std::vector<std::int64_t>(indices.begin(), indices.end()), torch::kLong);
    Batch batch;
    batch.add("data", x.index_select(0, index));
    batch.add("labels", y.index_select(0, index));
    return batch;
  };
  return source;
}

/// Records the loss scale after every optimizer step, and kills the process when told to.
class StepRecorder : public mantissa::TrainerCallback {
 public:
  StepRecorder(std::vector<double>& scales, std::int64_t die_at_step)
      : scales_(scales), die_at_step_(die_at_step) {}
  void on_step_end(const TrainingArguments&, mantissa::TrainerState& state,
                   mantissa::TrainerControl&) override {
    scales_.push_back(context().loss_scale());
    if (state.global_step == die_at_step_) {
      std::cout << "worker: killing myself with SIGKILL after step " << state.global_step
                << std::endl;
      std::raise(SIGKILL);
    }
  }

 private:
  std::vector<double>& scales_;
  std::int64_t die_at_step_;
};

int run_worker(const WorkerOptions& o, const TrainingArguments& args) {
  const auto env = mantissa::distributed::DistributedEnvironment::from_env();
  torch::Tensor x, y;
  std::map<std::string, torch::Tensor> init;
  if (!o.data.empty()) {
    for (auto& [name, tensor] : mantissa::io::load_safetensors(o.data)) {
      if (name == "data.x") x = tensor;
      if (name == "data.y") y = tensor;
      if (name.rfind("init.", 0) == 0) init[name.substr(5)] = tensor;
    }
  } else {
    torch::manual_seed(0);
    x = torch::randn({o.num_examples, 20});
    y = torch::randint(0, 4, {o.num_examples}, torch::kLong);
  }
  // Each rank starts from other weights: the Trainer must copy rank 0's (seed 1, the lone
  // process's) to all.
  torch::manual_seed(1 + static_cast<std::uint64_t>(env.rank));
  Mlp model(o.hidden, o.dropout, o.middle, o.blocks);
  if (!o.declare_blocks) model->declared.clear();
  if (!o.freeze.empty()) {
    const auto found = model->named_parameters().find(o.freeze);
    if (found == nullptr) throw std::invalid_argument("--freeze: no parameter " + o.freeze);
    found->requires_grad_(false);
  }
  if (!init.empty()) {
    torch::NoGradGuard no_grad;
    for (auto& item : model->named_parameters()) item.value().copy_(init.at(item.key()));
  }
  if (o.model_dtype == "bf16") model->to(torch::kBFloat16);

  std::optional<mantissa::BatchSource> eval;
  if (o.eval > 0) {
    torch::manual_seed(2);
    auto ex = torch::randn({o.eval, 20});
    auto ey = torch::randint(0, 4, {o.eval}, torch::kLong);
    eval = source_of(ex, ey);
  }
  std::vector<double> scales;
  mantissa::Trainer trainer = eval ? mantissa::Trainer(model, args, source_of(x, y), *eval)
                                   : mantissa::Trainer(model, args, source_of(x, y));
  trainer.add_callback(std::make_shared<StepRecorder>(
      scales, env.rank == o.die_on_rank ? o.die_at_step : std::int64_t{-1}));
  trainer.train();

  std::vector<std::pair<std::string, at::Tensor>> out;
  if (args.fsdp_shards_parameters() && env.is_distributed()) {
    // Full sharding: the parameters are shards, empty outside a forward; the trained weights
    // are gathered for rank 0 (the other ranks write none).
    const auto params = model->named_parameters();
    for (const auto& [name, tensor] : trainer.model_state_dict()) {
      if (params.find(name) == nullptr) continue;  // a buffer
      out.emplace_back("final." + name, tensor.detach().to(torch::kFloat).clone());
    }
  } else {
    for (const auto& item : model->named_parameters()) {
      out.emplace_back("final." + item.key(), item.value().detach().to(torch::kFloat).clone());
    }
  }
  out.emplace_back("scales", torch::tensor(scales, torch::kDouble));
  std::vector<double> losses;
  std::vector<double> grad_norms;  // logged when clipping is on (max_grad_norm > 0)
  for (const auto& entry : trainer.state().log_history) {
    if (entry.count("loss") != 0) losses.push_back(entry.at("loss"));
    if (entry.count("grad_norm") != 0) grad_norms.push_back(entry.at("grad_norm"));
  }
  out.emplace_back("losses", torch::tensor(losses, torch::kDouble));
  if (!grad_norms.empty()) {
    out.emplace_back("grad_norms", torch::tensor(grad_norms, torch::kDouble));
  }
  if (const auto* fp8_state = trainer.fp8_scaling_state()) {
    out.emplace_back("fp8.amax_history", fp8_state->amax_history().cpu().clone());
    out.emplace_back("fp8.scale", fp8_state->scales().cpu().clone());
  }
  std::map<std::string, std::string> metadata;
  if (eval) {
    const auto metrics = trainer.evaluate();
    for (const auto& [key, value] : metrics) {
      if (key == "eval_loss" || key == "eval_accuracy") {
        out.emplace_back(key, torch::tensor({value}, torch::kDouble));
      }
    }
    const auto predicted = trainer.predict(*eval);
    out.emplace_back("predictions", predicted.predictions.contiguous());
    out.emplace_back("label_ids", predicted.label_ids.contiguous());
  }
  const auto path =
      env.is_distributed() ? o.results + ".rank" + std::to_string(env.rank) : o.results;
  mantissa::io::save_safetensors(path, out, metadata);
  std::cout << "worker: rank " << env.rank << " of " << env.world_size << " done, "
            << trainer.state().global_step << " steps" << std::endl;
  return 0;
}

// ---- the launcher -----------------------------------------------------------------------------

struct Launch {
  std::string self;  // this executable
  std::string dir;   // the scenario's scratch folder
  int deadline_s = 120;
  std::string torchrun;
  std::string python;
  std::string reference;
};

using Results = std::map<std::string, torch::Tensor>;

Results load_results(const std::string& path) {
  Results r;
  for (auto& [name, tensor] : mantissa::io::load_safetensors(path)) r[name] = tensor;
  return r;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

/// Runs `args` (after "worker") as a lone process; returns its exit status. Its output goes to
/// `log` and is echoed.
int run_alone(const Launch& l, std::vector<std::string> args, const std::string& log) {
  args.insert(args.begin(), {"trainer_check", "worker"});
  auto env = mt::environment_without_launcher_variables();
  env.push_back("OMP_NUM_THREADS=1");
  const auto pid = mt::start_process(l.self, args, env, log);
  const auto status = mt::wait_for({pid}, l.deadline_s);
  std::cout << "---- " << log << " (exit " << status[0] << ")\n" << read_text(log) << std::flush;
  return status[0];
}

/// Runs `world` ranks of `args` (after "worker"), rank r with `extra(r)` appended; returns
/// their exit statuses. Rank r's output goes to `<prefix>.rank<r>.log` and is echoed.
std::vector<int> run_ranks(const Launch& l, int world, std::vector<std::string> args,
                           const std::string& prefix,
                           const std::function<std::vector<std::string>(int)>& extra = {},
                           uint16_t port = 0) {
  if (port == 0) port = mt::free_port();
  const auto base = mt::environment_without_launcher_variables();
  std::vector<pid_t> pids;
  for (int rank = 0; rank < world; ++rank) {
    auto env = base;
    for (const auto& kv : mt::rank_variables(rank, world, port)) env.push_back(kv);
    std::vector<std::string> a = {"trainer_check", "worker"};
    a.insert(a.end(), args.begin(), args.end());
    if (extra) {
      const auto more = extra(rank);
      a.insert(a.end(), more.begin(), more.end());
    }
    pids.push_back(
        mt::start_process(l.self, a, env, prefix + ".rank" + std::to_string(rank) + ".log"));
  }
  const auto status = mt::wait_for(pids, l.deadline_s);
  for (int rank = 0; rank < world; ++rank) {
    const auto log = prefix + ".rank" + std::to_string(rank) + ".log";
    std::cout << "---- " << log << " (exit " << status[rank] << ")\n"
              << read_text(log) << std::flush;
  }
  return status;
}

bool all_zero(const std::vector<int>& status) {
  for (const int s : status) {
    if (s != 0) return false;
  }
  return true;
}

/// Whether `a` and `b` hold the same final weights (bitwise when `rtol` and `atol` are 0).
bool same_weights(const Results& a, const Results& b, double rtol, double atol,
                  const std::string& what) {
  bool ok = true;
  for (const auto& [name, t] : a) {
    if (name.rfind("final.", 0) != 0) continue;
    const auto other = b.find(name);
    if (other == b.end()) {
      std::cout << what << ": " << name << " missing" << std::endl;
      ok = false;
      continue;
    }
    const bool close = (rtol == 0 && atol == 0) ? torch::equal(t, other->second)
                                                : torch::allclose(t, other->second, rtol, atol);
    const double diff = (t - other->second).abs().max().item<double>();
    std::cout << what << ": " << name << " max |difference| " << diff
              << (close ? "" : "  <-- beyond tolerance") << std::endl;
    ok &= close;
  }
  return ok;
}

bool same_tensor(const Results& a, const Results& b, const std::string& name, double rtol,
                 double atol, const std::string& what) {
  if (a.count(name) == 0 || b.count(name) == 0) {
    std::cout << what << ": " << name << " missing" << std::endl;
    return false;
  }
  const auto& x = a.at(name);
  const auto& y = b.at(name);
  const bool ok = x.sizes() == y.sizes() &&
                  (rtol == 0 && atol == 0 ? torch::equal(x, y) : torch::allclose(x, y, rtol, atol));
  std::cout << what << ": " << name << (ok ? " agrees" : " DIFFERS") << " (" << x.sizes() << " vs "
            << y.sizes() << ")" << std::endl;
  if (!ok && x.numel() <= 16 && y.numel() <= 16) std::cout << x << "\n" << y << std::endl;
  return ok;
}

std::vector<std::string> common_flags(const std::string& output_dir) {
  return {"--output_dir",
          output_dir,
          "--overwrite_output_dir",
          "--use_cpu",
          "--disable_tqdm",
          "--learning_rate",
          "1e-2",
          "--logging_steps",
          "1",
          "--save_strategy",
          "no",
          "--max_steps",
          "8",
          "--lr_scheduler_type",
          "constant",
          "--seed",
          "42",
          "--ddp_timeout",
          "60"};
}

std::vector<std::string> operator+(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

/// One process at batch 2B against two ranks at batch B: the same examples per step, so the
/// same weights within `atol`, and both ranks bit-identical to each other.
bool check_equivalence(const Launch& l, const std::vector<std::string>& flags, std::int64_t batch,
                       double atol, bool compare_eval) {
  const auto one = l.dir + "/one.safetensors";
  const auto two = l.dir + "/two.safetensors";
  // The scenario's flags last: they override the common ones.
  if (run_alone(
          l,
          common_flags(l.dir + "/out-one") +
              std::vector<std::string>{"--eval", "101", "--results", one,
                                       "--per_device_train_batch_size", std::to_string(2 * batch)} +
              flags,
          l.dir + "/one.log") != 0) {
    return false;
  }
  const auto status = run_ranks(
      l, 2,
      common_flags(l.dir + "/out-two") +
          std::vector<std::string>{"--eval", "101", "--results", two,
                                   "--per_device_train_batch_size", std::to_string(batch)} +
          flags,
      l.dir + "/two");
  if (!all_zero(status)) return false;
  const auto reference = load_results(one);
  const auto rank0 = load_results(two + ".rank0");
  const auto rank1 = load_results(two + ".rank1");
  bool ok = same_weights(rank0, rank1, 0, 0, "rank 0 vs rank 1 (bitwise)");
  ok &= same_tensor(rank0, rank1, "scales", 0, 0, "rank 0 vs rank 1");
  ok &= same_weights(reference, rank0, 1e-4, atol, "1 process x 2B vs 2 ranks x B");
  ok &= same_tensor(reference, rank0, "losses", 1e-3, atol, "logged losses");
  if (compare_eval) {
    for (const char* name : {"eval_loss", "eval_accuracy", "predictions", "label_ids"}) {
      ok &= same_tensor(rank0, rank1, name, 0, 0, "rank 0 vs rank 1");
      ok &= same_tensor(reference, rank0, name, 1e-5, atol, "evaluation, 1 process vs 2 ranks");
    }
  }
  return ok;
}

bool contains(const std::string& text, const std::string& part, const std::string& what) {
  const bool ok = text.find(part) != std::string::npos;
  std::cout << what << (ok ? " says " : " does NOT say ") << "'" << part << "'" << std::endl;
  return ok;
}

/// PyTorch's run of tests/ddp/torch_ddp_reference.py (with `reference_args`) under torchrun on
/// 2 ranks, then mantissa's 2 ranks with `flags` on its data, initial weights, order and
/// options; compares the final weights and the logged losses, naming the runs `what` (such as
/// "PyTorch DDP vs mantissa"). Returns whether they agree, or nullopt when there is no torchrun
/// here (the scenario is skipped).
std::optional<bool> check_pytorch_parity(const Launch& l,
                                         const std::vector<std::string>& reference_args,
                                         const std::vector<std::string>& flags,
                                         const std::string& what) {
  if (l.torchrun.empty() || !mantissa::io::path_exists(l.torchrun) || l.reference.empty()) {
    std::cout << "check: SKIPPED, no torchrun at '" << l.torchrun << "'" << std::endl;
    return std::nullopt;
  }
  const auto golden = l.dir + "/torch_reference.safetensors";
  const auto port = std::to_string(mt::free_port());
  auto env = mt::environment_without_launcher_variables();
  env.push_back("GLOO_SOCKET_IFNAME=lo");
  const auto pid = mt::start_process(
      l.torchrun,
      std::vector<std::string>{"torchrun", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
                               "--master_port", port, l.reference, "--out", golden} +
          reference_args,
      env, l.dir + "/torch.log");
  const auto status = mt::wait_for({pid}, l.deadline_s);
  std::cout << "---- PyTorch (exit " << status[0] << ")\n"
            << read_text(l.dir + "/torch.log") << std::flush;
  if (status[0] != 0) return false;
  const auto meta = mantissa::io::load_safetensors_metadata(golden);
  const auto option = [&](const char* key) { return meta.at(key); };
  const auto ranks = run_ranks(
      l, 2,
      std::vector<std::string>{"--results", l.dir + "/mantissa.st", "--data", golden} +
          common_flags(l.dir + "/out") +
          std::vector<std::string>{
              "--per_device_train_batch_size", option("per_device_train_batch_size"),
              "--gradient_accumulation_steps", option("gradient_accumulation_steps"),
              "--max_steps", option("max_steps"), "--learning_rate", option("learning_rate"),
              "--seed", option("seed"), "--max_grad_norm", option("max_grad_norm")} +
          flags,
      l.dir + "/mantissa");
  if (!all_zero(ranks)) return false;
  const auto torch_results = load_results(golden);
  const auto ours = load_results(l.dir + "/mantissa.st.rank0");
  bool ok = same_weights(torch_results, ours, 1e-4, 1e-5, what);
  Results theirs_losses{{"losses", torch_results.at("step_loss").to(torch::kDouble)}};
  ok &= same_tensor(theirs_losses, ours, "losses", 1e-4, 1e-5, what);
  return ok;
}

std::string value_of(std::vector<std::string>& args, const std::string& name,
                     const std::string& fallback) {
  for (std::size_t i = 0; i + 1 < args.size(); ++i) {
    if (args[i] == name) {
      auto value = args[i + 1];
      args.erase(args.begin() + static_cast<std::ptrdiff_t>(i),
                 args.begin() + static_cast<std::ptrdiff_t>(i) + 2);
      return value;
    }
  }
  return fallback;
}


/// The whole `main` of a check executable whose scenarios `run_check` runs.
inline int trainer_check_main(int argc, char** argv,
                              const std::function<int(const std::string&, Launch)>& run_check) {
  std::vector<std::string> args(argv + 1, argv + argc);
  try {
    if (!args.empty() && args[0] == "worker") {
      auto [training_args, rest] =
          TrainingArguments::parse_known(std::vector<std::string>(args.begin() + 1, args.end()));
      WorkerOptions o;
      o.results = value_of(rest, "--results", "");
      o.num_examples = std::stoll(value_of(rest, "--num_examples", "256"));
      o.hidden = std::stoll(value_of(rest, "--hidden", "32"));
      o.middle = std::stoll(value_of(rest, "--middle", "0"));
      o.blocks = std::stoll(value_of(rest, "--blocks", "0"));
      o.declare_blocks = value_of(rest, "--declare_blocks", "true") == "true";
      o.freeze = value_of(rest, "--freeze", "");
      o.dropout = std::stod(value_of(rest, "--dropout", "0"));
      o.model_dtype = value_of(rest, "--model_dtype", "fp32");
      o.eval = std::stoll(value_of(rest, "--eval", "0"));
      o.data = value_of(rest, "--data", "");
      o.die_on_rank = std::stoll(value_of(rest, "--die-on-rank", "-1"));
      o.die_at_step = std::stoll(value_of(rest, "--die-at-step", "-1"));
      if (o.results.empty() || !rest.empty()) {
        std::cerr << "worker: --results is required; unknown arguments: " << rest.size()
                  << std::endl;
        return 2;
      }
      return run_worker(o, training_args);
    }
    if (args.size() >= 2 && args[0] == "check") {
      Launch l;
      l.self = "/proc/self/exe";
      char self[4096];
      const auto n = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
      if (n > 0) l.self.assign(self, static_cast<std::size_t>(n));
      const auto scenario = args[1];
      l.deadline_s = std::stoi(value_of(args, "--deadline-s", "120"));
      l.torchrun = value_of(args, "--torchrun", "");
      l.python = value_of(args, "--python", "");
      l.reference = value_of(args, "--reference", "");
      return run_check(scenario, l);
    }
    std::cerr << "usage: " << (argc > 0 ? argv[0] : "check") << " worker --results FILE [...] | check SCENARIO [...]"
              << std::endl;
    return 2;
  } catch (const c10::Error& e) {
    std::cerr << "error: " << e.what_without_backtrace() << std::endl;
    return 3;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << std::endl;
    return 3;
  }
}

}  // namespace trainer_check
