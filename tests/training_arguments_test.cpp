#include <mantissa/training_arguments.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include <c10/util/Exception.h>
#include <torch/cuda.h>

#include "device_info.h"
#include "test_paths.h"

namespace mantissa {
// GoogleTest prints a TrainingArguments as its JSON when an EXPECT_EQ fails.
void PrintTo(const TrainingArguments& args, std::ostream* os) {
  try {
    *os << args.to_json();
  } catch (const std::exception& e) {
    *os << "<TrainingArguments: " << e.what() << ">";
  }
}
}  // namespace mantissa

namespace {

using mantissa::LrSchedulerKwargs;
using mantissa::TrainingArguments;
using mantissa::detail::check_precision_support;
using mantissa::detail::DeviceInfo;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

// The message of the c10::ValueError `f` throws; a marker when it throws something else or
// nothing, so that a HasSubstr on the result fails.
std::string value_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const c10::ValueError& e) {
    return e.what_without_backtrace();
  } catch (const std::exception& e) {
    return std::string("<not a c10::ValueError: ") + e.what() + ">";
  }
  return "<no exception>";
}

std::string validate_error(const TrainingArguments& args) {
  return value_error([&] { args.validate(); });
}

std::string parse_error(const std::vector<std::string>& argv) {
  return value_error([&] { TrainingArguments::parse(argv); });
}

std::vector<std::string> field_names() {
  std::vector<std::string> names;
#define MANTISSA_TEST_NAME_(type, name, default_value, help) names.push_back(#name);
  MANTISSA_TRAINING_ARGUMENTS_FIELDS(MANTISSA_TEST_NAME_)
#undef MANTISSA_TEST_NAME_
  return names;
}

// A scratch folder, removed at the end of the test. POSIX calls rather than std::filesystem:
// the PyPI libtorch.so exports its own copies of some std::filesystem symbols (remove_all
// among them) that crash when called from code built with this machine's libstdc++.
class TempDir {
 public:
  TempDir() {
    std::string templ = "/tmp/mantissa_targs_XXXXXX";
    const char* made = ::mkdtemp(templ.data());
    if (made == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = made;
  }
  ~TempDir() { remove_tree(path_); }
  std::string file(const std::string& name) const { return path_ + "/" + name; }
  std::vector<std::string> entries() const {
    std::vector<std::string> out;
    if (DIR* d = ::opendir(path_.c_str())) {
      while (const dirent* e = ::readdir(d)) {
        const std::string n = e->d_name;
        if (n != "." && n != "..") out.push_back(n);
      }
      ::closedir(d);
    }
    std::sort(out.begin(), out.end());
    return out;
  }

 private:
  static void remove_tree(const std::string& path) {
    if (DIR* d = ::opendir(path.c_str())) {
      while (const dirent* e = ::readdir(d)) {
        const std::string n = e->d_name;
        if (n == "." || n == "..") continue;
        const std::string child = path + "/" + n;
        struct stat st {};
        if (::lstat(child.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
          remove_tree(child);
        } else {
          ::unlink(child.c_str());
        }
      }
      ::closedir(d);
    }
    ::rmdir(path.c_str());
  }

  std::string path_;
};

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

// ---- defaults and setters ---------------------------------------------------------------------

TEST(TrainingArgumentsTest, DefaultsMatchHuggingFace) {
  const TrainingArguments a;
  EXPECT_EQ(a.output_dir(), "trainer_output");
  EXPECT_FALSE(a.overwrite_output_dir());
  EXPECT_EQ(a.num_train_epochs(), 3.0);
  EXPECT_EQ(a.max_steps(), -1);
  EXPECT_EQ(a.per_device_train_batch_size(), 8);
  EXPECT_EQ(a.per_device_eval_batch_size(), 8);
  EXPECT_EQ(a.gradient_accumulation_steps(), 1);
  // HF's default with torch >= 2.8.
  EXPECT_EQ(a.optim(), mantissa::OptimizerNames::kAdamWTorchFused);
  EXPECT_EQ(a.learning_rate(), 5e-5);
  EXPECT_EQ(a.weight_decay(), 0.0);
  EXPECT_EQ(a.adam_beta1(), 0.9);
  EXPECT_EQ(a.adam_beta2(), 0.999);
  EXPECT_EQ(a.adam_epsilon(), 1e-8);
  EXPECT_EQ(a.max_grad_norm(), 1.0);
  EXPECT_EQ(a.lr_scheduler_type(), mantissa::SchedulerType::kLinear);
  EXPECT_EQ(a.warmup_steps(), 0);
  EXPECT_EQ(a.warmup_ratio(), 0.0);
  EXPECT_EQ(a.eval_strategy(), mantissa::IntervalStrategy::kNo);
  EXPECT_FALSE(a.eval_steps().has_value());
  EXPECT_EQ(a.logging_strategy(), mantissa::IntervalStrategy::kSteps);
  EXPECT_EQ(a.logging_steps(), 500.0);
  EXPECT_FALSE(a.logging_first_step());
  EXPECT_TRUE(a.logging_nan_inf_filter());
  EXPECT_TRUE(a.report_to().empty());
  EXPECT_EQ(a.low_precision_update(), mantissa::LowPrecisionUpdateMode::kAuto);
  EXPECT_FALSE(a.run_name().has_value());
  EXPECT_EQ(a.save_strategy(), mantissa::SaveStrategy::kSteps);
  EXPECT_EQ(a.save_steps(), 500.0);
  EXPECT_FALSE(a.save_total_limit().has_value());
  EXPECT_FALSE(a.resume_from_checkpoint().has_value());
  EXPECT_EQ(a.seed(), 42);
  EXPECT_FALSE(a.data_seed().has_value());
  EXPECT_FALSE(a.bf16());
  EXPECT_FALSE(a.fp16());
  EXPECT_FALSE(a.tf32().has_value());
  EXPECT_FALSE(a.bf16_full_eval());
  EXPECT_FALSE(a.fp16_full_eval());
  EXPECT_EQ(a.master_weights(), mantissa::MasterWeightsMode::kAuto);
  EXPECT_EQ(a.loss_scale(), 0.0);
  EXPECT_EQ(a.initial_scale_power(), 16);
  EXPECT_EQ(a.loss_scale_window(), 2000);
  EXPECT_EQ(a.hysteresis(), 1);
  EXPECT_FALSE(a.consecutive_hysteresis());
  EXPECT_EQ(a.min_loss_scale(), 0.0);
  EXPECT_FALSE(a.max_loss_scale().has_value());
  EXPECT_EQ(a.max_consecutive_nonfinite(), 100);
  EXPECT_FALSE(a.use_cpu());
  EXPECT_EQ(a.dataloader_num_workers(), 0);
  EXPECT_FALSE(a.dataloader_drop_last());
  EXPECT_FALSE(a.disable_tqdm());
  EXPECT_TRUE(a.dataloader_pin_memory());
  EXPECT_FALSE(a.cuda_graph());
  EXPECT_EQ(a.cuda_graph_warmup_steps(), 3);
  EXPECT_TRUE(a.lr_scheduler_kwargs().empty());
  EXPECT_FALSE(a.label_names().has_value());
  EXPECT_FALSE(a.load_best_model_at_end());
  EXPECT_FALSE(a.metric_for_best_model().has_value());
  EXPECT_FALSE(a.greater_is_better().has_value());
  EXPECT_FALSE(a.ddp_backend().has_value());
  EXPECT_EQ(a.ddp_timeout(), 1800);
  EXPECT_FALSE(a.ddp_find_unused_parameters().has_value());
  EXPECT_FALSE(a.ddp_bucket_cap_mb().has_value());
  EXPECT_FALSE(a.ddp_broadcast_buffers().has_value());
  EXPECT_FALSE(a.save_on_each_node());
  EXPECT_TRUE(a.log_on_each_node());
  EXPECT_EQ(a.ddp_comm_hook(), mantissa::DdpCommHook::kNone);
  EXPECT_EQ(a.fsdp(), "");
  EXPECT_FALSE(a.fsdp_config().has_value());
  EXPECT_FALSE(a.fp8());
  EXPECT_EQ(a.fp8_recipe(), mantissa::fp8::ScalingRecipe::kDelayed);
  EXPECT_EQ(a.fp8_amax_history_len(), 1024);
  EXPECT_EQ(a.fp8_amax_compute_algo(), mantissa::fp8::AmaxComputeAlgo::kMax);
  EXPECT_EQ(a.fp8_margin(), 0);
  EXPECT_EQ(a.fp8_format(), mantissa::fp8::Float8Format::kHybrid);
  EXPECT_FALSE(a.gradient_checkpointing());
  EXPECT_FALSE(a.gradient_checkpointing_kwargs().has_value());
  EXPECT_TRUE(a.cpu_caching_allocator());
  EXPECT_FALSE(a.optim_args().has_value());
  EXPECT_EQ(field_names().size(), 78u) << "a field was added or removed: update this test, "
                                          "EveryFlagSetsItsField and docs/training_arguments.md";
}

TEST(TrainingArgumentsTest, DefaultsValidate) {
  EXPECT_EQ(validate_error(TrainingArguments()), "<no exception>");
}

TEST(TrainingArgumentsTest, ChainedSettersAndMutableGetters) {
  TrainingArguments a = TrainingArguments()
                            .bf16(true)
                            .learning_rate(3e-4)
                            .tf32(false)
                            .save_total_limit(3)
                            .output_dir("runs/a")
                            .max_steps(10);
  EXPECT_TRUE(a.bf16());
  EXPECT_EQ(a.learning_rate(), 3e-4);
  EXPECT_EQ(a.tf32(), std::optional<bool>(false));
  EXPECT_EQ(a.save_total_limit(), std::optional<int64_t>(3));
  EXPECT_EQ(a.output_dir(), "runs/a");
  EXPECT_EQ(a.max_steps(), 10);
  a.learning_rate() = 1e-3;
  a.tf32() = std::nullopt;
  EXPECT_EQ(a.learning_rate(), 1e-3);
  EXPECT_FALSE(a.tf32().has_value());
}

TEST(TrainingArgumentsTest, EqualityComparesEveryField) {
  EXPECT_EQ(TrainingArguments(), TrainingArguments());
  EXPECT_NE(TrainingArguments(), TrainingArguments().disable_tqdm(true));
  EXPECT_NE(TrainingArguments(), TrainingArguments().tf32(false));
  EXPECT_NE(TrainingArguments().tf32(false), TrainingArguments().tf32(true));
  EXPECT_NE(TrainingArguments(), TrainingArguments().learning_rate(5e-5 + 1e-20));
}

// ---- command line -----------------------------------------------------------------------------

TEST(TrainingArgumentsTest, NoArgumentsGiveDefaults) {
  EXPECT_EQ(TrainingArguments::parse(std::vector<std::string>{}), TrainingArguments());
  const char* argv[] = {"prog"};
  EXPECT_EQ(TrainingArguments::parse(1, argv), TrainingArguments());
}

TEST(TrainingArgumentsTest, EveryFlagSetsItsField) {
  const std::vector<std::string> argv1 = {"--output_dir",
                                          "out/run1",
                                          "--overwrite_output_dir",
                                          "--num_train_epochs",
                                          "2.5",
                                          "--max_steps",
                                          "100",
                                          "--per_device_train_batch_size",
                                          "16",
                                          "--per_device_eval_batch_size",
                                          "32",
                                          "--gradient_accumulation_steps",
                                          "4",
                                          "--optim",
                                          "adamw_mantissa_fused",
                                          "--learning_rate",
                                          "3e-4",
                                          "--weight_decay",
                                          "0.01",
                                          "--adam_beta1",
                                          "0.8",
                                          "--adam_beta2",
                                          "0.98",
                                          "--adam_epsilon",
                                          "1e-6",
                                          "--max_grad_norm",
                                          "0.5",
                                          "--lr_scheduler_type",
                                          "cosine",
                                          "--lr_scheduler_kwargs",
                                          R"({"num_cycles": 2})",
                                          "--warmup_steps",
                                          "10",
                                          "--warmup_ratio",
                                          "0.1",
                                          "--eval_strategy",
                                          "steps",
                                          "--eval_steps",
                                          "50",
                                          "--logging_strategy",
                                          "epoch",
                                          "--logging_steps",
                                          "10",
                                          "--logging_first_step",
                                          "true",
                                          "--logging_nan_inf_filter",
                                          "false",
                                          "--save_strategy",
                                          "epoch",
                                          "--save_steps",
                                          "0.25",
                                          "--save_total_limit",
                                          "3",
                                          "--resume_from_checkpoint",
                                          "latest",
                                          "--seed",
                                          "7",
                                          "--data_seed",
                                          "11",
                                          "--bf16",
                                          "--tf32",
                                          "false",
                                          "--bf16_full_eval",
                                          "--master_weights",
                                          "on",
                                          "--loss_scale",
                                          "128",
                                          "--initial_scale_power",
                                          "10",
                                          "--loss_scale_window",
                                          "500",
                                          "--hysteresis",
                                          "2",
                                          "--consecutive_hysteresis",
                                          "--min_loss_scale",
                                          "1",
                                          "--max_loss_scale",
                                          "1e6",
                                          "--max_consecutive_nonfinite",
                                          "5",
                                          "--use_cpu",
                                          "--dataloader_num_workers",
                                          "2",
                                          "--dataloader_drop_last",
                                          "--disable_tqdm",
                                          "--fp8",
                                          "--fp8_recipe",
                                          "current",
                                          "--fp8_amax_history_len",
                                          "16",
                                          "--fp8_amax_compute_algo",
                                          "most_recent",
                                          "--fp8_margin",
                                          "2",
                                          "--fp8_format",
                                          "E4M3"};
  // clang-format off
  const std::vector<std::string> argv2 = {
      "--fp16", "--fp16_full_eval", "true", "--use_cpu", "--cuda_graph",
      "--cuda_graph_warmup_steps", "5", "--dataloader_pin_memory", "false",
      "--report_to", "tensorboard", "--run_name", "baseline", "--optim_args", "beta1=0.9, eps=1e-8",
      "--low_precision_update", "stochastic_rounding", "--label_names", "start", "end",
      "--load_best_model_at_end", "--metric_for_best_model", "accuracy",
      "--greater_is_better", "false", "--eval_strategy", "steps", "--save_steps", "10",
      "--eval_steps", "5", "--ddp_backend", "gloo", "--ddp_timeout", "60",
      "--ddp_find_unused_parameters", "false", "--ddp_bucket_cap_mb", "50",
      "--ddp_broadcast_buffers", "false", "--ddp_comm_hook", "bf16_compress", "--save_on_each_node", "--log_on_each_node", "false",
      "--fsdp", "false", "--fsdp_config", "{\"version\": 2}",
      // Both lines hold a flag (cuda_graph, fp8) that refuses checkpointing: the true value is
      // tested in GradientCheckpointingFlags.
      "--gradient_checkpointing", "false",
      "--gradient_checkpointing_kwargs", "{\"use_reentrant\": false}",
      "--cpu_caching_allocator", "false"};
  // clang-format on

  // Every field of the table is exercised by one of the two command lines.
  std::set<std::string> seen(argv1.begin(), argv1.end());
  seen.insert(argv2.begin(), argv2.end());
  for (const auto& name : field_names()) {
    EXPECT_TRUE(seen.count("--" + name)) << "no flag test for " << name;
  }

  const TrainingArguments a = TrainingArguments::parse(argv1);
  EXPECT_EQ(a.output_dir(), "out/run1");
  EXPECT_TRUE(a.overwrite_output_dir());
  EXPECT_EQ(a.num_train_epochs(), 2.5);
  EXPECT_EQ(a.max_steps(), 100);
  EXPECT_EQ(a.per_device_train_batch_size(), 16);
  EXPECT_EQ(a.per_device_eval_batch_size(), 32);
  EXPECT_EQ(a.gradient_accumulation_steps(), 4);
  EXPECT_EQ(a.optim(), mantissa::OptimizerNames::kAdamWMantissaFused);
  EXPECT_EQ(a.learning_rate(), 3e-4);
  EXPECT_EQ(a.weight_decay(), 0.01);
  EXPECT_EQ(a.adam_beta1(), 0.8);
  EXPECT_EQ(a.adam_beta2(), 0.98);
  EXPECT_EQ(a.adam_epsilon(), 1e-6);
  EXPECT_EQ(a.max_grad_norm(), 0.5);
  EXPECT_EQ(a.lr_scheduler_type(), mantissa::SchedulerType::kCosine);
  EXPECT_EQ(a.lr_scheduler_kwargs(), (LrSchedulerKwargs{{"num_cycles", int64_t{2}}}));
  EXPECT_EQ(a.warmup_steps(), 10);
  EXPECT_EQ(a.warmup_ratio(), 0.1);
  EXPECT_EQ(a.eval_strategy(), mantissa::IntervalStrategy::kSteps);
  EXPECT_EQ(a.eval_steps(), std::optional<double>(50.0));
  EXPECT_EQ(a.logging_strategy(), mantissa::IntervalStrategy::kEpoch);
  EXPECT_EQ(a.logging_steps(), 10.0);
  EXPECT_TRUE(a.logging_first_step());
  EXPECT_FALSE(a.logging_nan_inf_filter());
  EXPECT_EQ(a.save_strategy(), mantissa::SaveStrategy::kEpoch);
  EXPECT_EQ(a.save_steps(), 0.25);
  EXPECT_EQ(a.save_total_limit(), std::optional<int64_t>(3));
  EXPECT_EQ(a.resume_from_checkpoint(), std::optional<std::string>("latest"));
  EXPECT_EQ(a.seed(), 7);
  EXPECT_EQ(a.data_seed(), std::optional<int64_t>(11));
  EXPECT_TRUE(a.bf16());
  EXPECT_FALSE(a.fp16());
  EXPECT_EQ(a.tf32(), std::optional<bool>(false));
  EXPECT_TRUE(a.bf16_full_eval());
  EXPECT_EQ(a.master_weights(), mantissa::MasterWeightsMode::kOn);
  EXPECT_EQ(a.loss_scale(), 128.0);
  EXPECT_EQ(a.initial_scale_power(), 10);
  EXPECT_EQ(a.loss_scale_window(), 500);
  EXPECT_EQ(a.hysteresis(), 2);
  EXPECT_TRUE(a.consecutive_hysteresis());
  EXPECT_EQ(a.min_loss_scale(), 1.0);
  EXPECT_EQ(a.max_loss_scale(), std::optional<double>(1e6));
  EXPECT_EQ(a.max_consecutive_nonfinite(), 5);
  EXPECT_TRUE(a.use_cpu());
  EXPECT_EQ(a.dataloader_num_workers(), 2);
  EXPECT_TRUE(a.dataloader_drop_last());
  EXPECT_TRUE(a.disable_tqdm());
  EXPECT_TRUE(a.fp8());
  EXPECT_EQ(a.fp8_recipe(), mantissa::fp8::ScalingRecipe::kCurrent);
  EXPECT_EQ(a.fp8_amax_history_len(), 16);
  EXPECT_EQ(a.fp8_amax_compute_algo(), mantissa::fp8::AmaxComputeAlgo::kMostRecent);
  EXPECT_EQ(a.fp8_margin(), 2);
  EXPECT_EQ(a.fp8_format(), mantissa::fp8::Float8Format::kE4M3);

  const TrainingArguments b = TrainingArguments::parse(argv2);
  EXPECT_TRUE(b.fp16());
  EXPECT_TRUE(b.fp16_full_eval());
  EXPECT_FALSE(b.bf16());
  EXPECT_FALSE(b.dataloader_pin_memory());
  EXPECT_TRUE(b.cuda_graph());
  EXPECT_EQ(b.cuda_graph_warmup_steps(), 5);
  EXPECT_EQ(b.report_to(), mantissa::ReportTo("tensorboard"));
  EXPECT_EQ(b.run_name(), std::optional<std::string>("baseline"));
  EXPECT_EQ(b.optim_args(), std::optional<std::string>("beta1=0.9, eps=1e-8"));
  EXPECT_EQ(b.low_precision_update(), mantissa::LowPrecisionUpdateMode::kStochasticRounding);
  EXPECT_EQ(b.label_names(), (std::optional<std::vector<std::string>>({"start", "end"})));
  EXPECT_TRUE(b.load_best_model_at_end());
  EXPECT_EQ(b.metric_for_best_model(), std::optional<std::string>("accuracy"));
  EXPECT_EQ(b.greater_is_better(), std::optional<bool>(false));
  EXPECT_EQ(b.ddp_backend(), std::optional<std::string>("gloo"));
  EXPECT_EQ(b.ddp_timeout(), 60);
  EXPECT_EQ(b.ddp_find_unused_parameters(), std::optional<bool>(false));
  EXPECT_EQ(b.ddp_bucket_cap_mb(), std::optional<int64_t>(50));
  EXPECT_EQ(b.ddp_broadcast_buffers(), std::optional<bool>(false));
  EXPECT_EQ(b.ddp_comm_hook(), mantissa::DdpCommHook::kBf16Compress);
  EXPECT_TRUE(b.save_on_each_node());
  EXPECT_FALSE(b.log_on_each_node());
  EXPECT_EQ(b.fsdp(), "false");
  EXPECT_EQ(b.fsdp_config(), std::optional<std::string>("{\"version\": 2}"));
  EXPECT_FALSE(b.gradient_checkpointing());
  EXPECT_FALSE(b.cpu_caching_allocator());
  EXPECT_EQ(b.gradient_checkpointing_kwargs(),
            mantissa::GradientCheckpointingKwargs{/*use_reentrant=*/false});
}

TEST(TrainingArgumentsTest, DistributedFieldsAreCheckedAndResolved) {
  EXPECT_EQ(validate_error(TrainingArguments().ddp_backend("mpi")),
            "ddp_backend: 'mpi' is a backend mantissa does not build; choose gloo (CPU) or nccl "
            "(CUDA), or leave it unset");
  EXPECT_EQ(validate_error(TrainingArguments().ddp_backend("tcp")),
            "ddp_backend: 'tcp' is not a collective backend; choose gloo (CPU) or nccl (CUDA), "
            "or leave it unset");
  EXPECT_EQ(validate_error(TrainingArguments().ddp_timeout(0)),
            "ddp_timeout must be a positive number of seconds, got 0");
  // 9e9 s would overflow the collectives' deadline (every rank hangs): refused here.
  EXPECT_EQ(validate_error(TrainingArguments().ddp_timeout(9000000000)),
            "ddp_timeout is 9000000000 s, more than the largest the collectives can wait, "
            "2147483647 s (about 68 years); to wait as good as forever, pass that value");
  EXPECT_EQ(validate_error(TrainingArguments().ddp_timeout(2147483647)), "<no exception>");
  EXPECT_EQ(validate_error(TrainingArguments().ddp_bucket_cap_mb(0)),
            "ddp_bucket_cap_mb must be a positive number of MiB (at most 2^43) or None, got 0");
  EXPECT_EQ(validate_error(TrainingArguments().ddp_comm_hook("powersgd")),
            "ddp_comm_hook: 'powersgd' is not one of none, fp16_compress, bf16_compress");
  EXPECT_EQ(validate_error(TrainingArguments().ddp_backend("nccl").ddp_bucket_cap_mb(1)),
            "<no exception>");

  const TrainingArguments defaults;
  using mantissa::distributed::Backend;
  EXPECT_EQ(defaults.resolved_ddp_backend(c10::Device(c10::kCPU)), Backend::kGloo);
  EXPECT_EQ(defaults.resolved_ddp_backend(c10::Device(c10::kCUDA, 1)), Backend::kNccl);
  EXPECT_EQ(TrainingArguments().ddp_backend("gloo").resolved_ddp_backend(c10::Device(c10::kCUDA)),
            Backend::kGloo);
  EXPECT_EQ(TrainingArguments().ddp_backend("nccl").resolved_ddp_backend(c10::Device(c10::kCPU)),
            Backend::kNccl)
      << "a backend that is set is taken as it is; the Trainer refuses nccl on the CPU";
  EXPECT_THAT([] { (void)TrainingArguments().ddp_backend("mpi").resolved_ddp_backend(c10::kCPU); },
              ::testing::ThrowsMessage<c10::ValueError>(
                  HasSubstr("mpi is not a valid Backend, please select one of ['gloo', 'nccl']")));
  EXPECT_TRUE(defaults.resolved_ddp_find_unused_parameters());
  EXPECT_FALSE(
      TrainingArguments().ddp_find_unused_parameters(false).resolved_ddp_find_unused_parameters());
  EXPECT_EQ(defaults.resolved_ddp_bucket_cap_mb(), 25);
  EXPECT_EQ(TrainingArguments().ddp_bucket_cap_mb(4).resolved_ddp_bucket_cap_mb(), 4);
  EXPECT_TRUE(defaults.resolved_ddp_broadcast_buffers());
  EXPECT_FALSE(TrainingArguments().ddp_broadcast_buffers(false).resolved_ddp_broadcast_buffers());
}

// ddp_comm_hook holds an enum inside and spellings outside: each spelling comes in by flag and
// by JSON as its own enumerator and goes out as the same text. (report_to, a list of names:
// integrations_test.cpp.)
TEST(TrainingArgumentsTest, CommHookRoundTripsThroughCliAndJson) {
  const auto round_trip = [](const std::string& field, const std::string& spelling) {
    const auto parsed = TrainingArguments::parse({"--" + field, spelling});
    const std::string json = parsed.to_json();
    EXPECT_THAT(json, HasSubstr("\"" + field + "\": \"" + spelling + "\""));
    const auto read = TrainingArguments::from_json(json);
    EXPECT_EQ(read, parsed);
    EXPECT_EQ(read.to_json(), json);
    return read;
  };
  using mantissa::Choice;
  using mantissa::DdpCommHook;
  for (std::size_t i = 0; i < Choice<DdpCommHook>::size(); ++i) {
    const std::string spelling = Choice<DdpCommHook>::name_at(i);
    EXPECT_EQ(round_trip("ddp_comm_hook", spelling).ddp_comm_hook(), static_cast<DdpCommHook>(i))
        << spelling;
  }
  EXPECT_EQ(Choice<DdpCommHook>::names_text(), "none, fp16_compress, bf16_compress");
  // Set by enum, written by spelling.
  EXPECT_THAT(TrainingArguments().ddp_comm_hook(DdpCommHook::kFp16Compress).to_json(),
              HasSubstr("\"ddp_comm_hook\": \"fp16_compress\""));
  // An unknown spelling read without validation is kept as written, and refused by validate().
  const auto kept = TrainingArguments::from_json(R"({"ddp_comm_hook": "powersgd"})", false);
  EXPECT_THAT(kept.to_json(), HasSubstr("\"ddp_comm_hook\": \"powersgd\""));
  EXPECT_EQ(validate_error(kept),
            "ddp_comm_hook: 'powersgd' is not one of none, fp16_compress, bf16_compress");
  // TEXT in --help: its help names each choice with what it does.
  EXPECT_THAT(TrainingArguments::help_text(), HasSubstr("--ddp_comm_hook TEXT"));
}

TEST(TrainingArgumentsTest, BoolFlagSpellings) {
  // The brief's examples, as HF writes them.
  EXPECT_TRUE(TrainingArguments::parse({"--bf16", "--use_cpu"}).bf16());
  EXPECT_TRUE(TrainingArguments::parse({"--use_cpu", "--bf16"}).bf16());  // bare, at the end
  EXPECT_TRUE(TrainingArguments::parse({"--bf16", "true", "--use_cpu"}).bf16());
  EXPECT_FALSE(TrainingArguments::parse({"--bf16", "false", "--use_cpu"}).bf16());
  EXPECT_FALSE(TrainingArguments::parse({"--bf16=false", "--use_cpu"}).bf16());
  EXPECT_TRUE(TrainingArguments::parse({"--bf16=true", "--use_cpu"}).bf16());

  // string_to_bool's spellings, case-insensitive, separate and with '='.
  for (const std::string v : {"yes", "true", "t", "y", "1", "YES", "True", "T"}) {
    EXPECT_TRUE(TrainingArguments::parse({"--dataloader_drop_last", v}).dataloader_drop_last())
        << v;
    EXPECT_TRUE(TrainingArguments::parse({"--dataloader_drop_last=" + v}).dataloader_drop_last())
        << v;
  }
  for (const std::string v : {"no", "false", "f", "n", "0", "NO", "False", "F"}) {
    EXPECT_FALSE(TrainingArguments::parse({"--logging_nan_inf_filter", v}).logging_nan_inf_filter())
        << v;
    EXPECT_FALSE(
        TrainingArguments::parse({"--logging_nan_inf_filter=" + v}).logging_nan_inf_filter())
        << v;
  }

  // A bare bool flag does not swallow the next flag.
  const auto a = TrainingArguments::parse({"--dataloader_drop_last", "--seed", "3"});
  EXPECT_TRUE(a.dataloader_drop_last());
  EXPECT_EQ(a.seed(), 3);
}

TEST(TrainingArgumentsTest, OptionalBoolTf32) {
  EXPECT_FALSE(TrainingArguments::parse(std::vector<std::string>{}).tf32().has_value());
  EXPECT_EQ(TrainingArguments::parse({"--tf32", "false"}).tf32(), std::optional<bool>(false));
  EXPECT_EQ(TrainingArguments::parse({"--tf32=false"}).tf32(), std::optional<bool>(false));
  EXPECT_FALSE(TrainingArguments::parse({"--tf32", "false", "--tf32", "None"}).tf32().has_value());
}

TEST(TrainingArgumentsTest, Tf32TrueNeedsAnAmpereGpu) {
  // This is the CPU machine's answer; on an Ampere+ GPU `--tf32 true` is accepted.
  const DeviceInfo& info = mantissa::detail::query_device_info();
  if (!info.cuda_available) {
    EXPECT_THAT(parse_error({"--tf32", "true"}),
                HasSubstr("--tf32 requires Ampere or a newer GPU arch, cuda>=11 and torch>=1.7"));
    EXPECT_THAT(parse_error({"--tf32"}), HasSubstr("--tf32 requires Ampere"));
  } else if (info.cuda_capability_major >= 8) {
    EXPECT_EQ(TrainingArguments::parse({"--tf32", "true"}).tf32(), std::optional<bool>(true));
  }
  // --use_cpu never has tf32, whatever the machine.
  EXPECT_THAT(parse_error({"--tf32", "true", "--use_cpu"}), HasSubstr("--tf32 requires Ampere"));
}

TEST(TrainingArgumentsTest, NoFlagsForBoolsThatDefaultToTrue) {
  EXPECT_FALSE(TrainingArguments::parse({"--no_logging_nan_inf_filter"}).logging_nan_inf_filter());
  EXPECT_FALSE(TrainingArguments::parse({"--no-logging-nan-inf-filter"}).logging_nan_inf_filter());
  // argparse: the last one wins.
  EXPECT_TRUE(TrainingArguments::parse({"--no_logging_nan_inf_filter", "--logging_nan_inf_filter"})
                  .logging_nan_inf_filter());
  EXPECT_FALSE(
      TrainingArguments::parse({"--logging_nan_inf_filter", "true", "--no_logging_nan_inf_filter"})
          .logging_nan_inf_filter());
  // store_false takes no value.
  EXPECT_THAT(parse_error({"--no_logging_nan_inf_filter=false"}),
              HasSubstr("--no_logging_nan_inf_filter: ignored explicit argument 'false'"));
  // Bools that default to false have no --no_ flag, as in HfArgumentParser.
  EXPECT_THAT(parse_error({"--no_bf16"}), HasSubstr("unrecognized arguments: --no_bf16"));
}

TEST(TrainingArgumentsTest, DashedAliasesAndEqualsForm) {
  const auto a = TrainingArguments::parse(
      {"--learning-rate", "3e-4", "--per-device-train-batch-size=4", "--logging-nan-inf-filter",
       "false", "--output_dir=a=b", "--max_steps=-1"});
  EXPECT_EQ(a.learning_rate(), 3e-4);
  EXPECT_EQ(a.per_device_train_batch_size(), 4);
  EXPECT_FALSE(a.logging_nan_inf_filter());
  EXPECT_EQ(a.output_dir(), "a=b");
  EXPECT_EQ(a.max_steps(), -1);
}

TEST(TrainingArgumentsTest, NegativeNumbersAreValues) {
  const auto a = TrainingArguments::parse({"--max_steps", "-5", "--seed", "-1"});
  EXPECT_EQ(a.max_steps(), -5);
  EXPECT_EQ(a.seed(), -1);
  EXPECT_THAT(parse_error({"--learning_rate", "-1"}),
              HasSubstr("learning_rate must be non-negative, got -1.0"));
}

TEST(TrainingArgumentsTest, LastOccurrenceWins) {
  const auto a = TrainingArguments::parse(
      {"--learning_rate", "1e-3", "--seed", "1", "--learning-rate", "2e-3", "--seed=2"});
  EXPECT_EQ(a.learning_rate(), 2e-3);
  EXPECT_EQ(a.seed(), 2);
}

TEST(TrainingArgumentsTest, OptionalsTakeNone) {
  EXPECT_EQ(TrainingArguments::parse({"--save_total_limit", "3"}).save_total_limit(),
            std::optional<int64_t>(3));
  EXPECT_FALSE(TrainingArguments::parse({"--save_total_limit", "3", "--save_total_limit", "None"})
                   .save_total_limit()
                   .has_value());
  EXPECT_FALSE(
      TrainingArguments::parse({"--resume_from_checkpoint", "None"}).resume_from_checkpoint());
  EXPECT_EQ(TrainingArguments::parse({"--resume_from_checkpoint", "ckpt/checkpoint-500"})
                .resume_from_checkpoint(),
            std::optional<std::string>("ckpt/checkpoint-500"));
  EXPECT_EQ(TrainingArguments::parse({"--max_loss_scale", "65536"}).max_loss_scale(),
            std::optional<double>(65536.0));
}

TEST(TrainingArgumentsTest, UnknownFlagsAreRejected) {
  EXPECT_THAT(parse_error({"--lerning_rate", "3e-4"}),
              HasSubstr("unrecognized arguments: --lerning_rate 3e-4"));
  EXPECT_THAT(parse_error({"--seed", "1", "stray"}), HasSubstr("unrecognized arguments: stray"));
  EXPECT_THAT(parse_error({"-x"}), HasSubstr("unrecognized arguments: -x"));
}

TEST(TrainingArgumentsTest, ParseKnownReturnsTheRest) {
  const auto [args, rest] =
      TrainingArguments::parse_known({"--my_flag", "--learning_rate", "1e-3", "--data_dir", "/data",
                                      "--bf16", "--use_cpu", "--other=x", "positional"});
  EXPECT_EQ(args.learning_rate(), 1e-3);
  EXPECT_TRUE(args.bf16());
  EXPECT_THAT(rest, ElementsAre("--my_flag", "--data_dir", "/data", "--other=x", "positional"));

  const auto [plain, none] = TrainingArguments::parse_known({"--seed", "5"});
  EXPECT_EQ(plain.seed(), 5);
  EXPECT_THAT(none, IsEmpty());

  // Known flags are still checked.
  EXPECT_THAT(value_error([] {
                TrainingArguments::parse_known({"--seed", "x", "--mine"});
              }),
              HasSubstr("--seed: invalid value 'x'"));
  EXPECT_THAT(value_error([] {
                TrainingArguments::parse_known({"--learning_rate", "-1", "--m"});
              }),
              HasSubstr("learning_rate must be non-negative"));
}

TEST(TrainingArgumentsTest, MalformedValuesNameTheFlagAndValue) {
  EXPECT_THAT(parse_error({"--learning_rate", "abc"}),
              HasSubstr("--learning_rate: invalid value 'abc' (expected a float)"));
  EXPECT_THAT(parse_error({"--learning_rate=1e-3x"}),
              HasSubstr("--learning_rate: invalid value '1e-3x'"));
  EXPECT_THAT(parse_error({"--max_steps", "3.5"}),
              HasSubstr("--max_steps: invalid value '3.5' (expected an integer)"));
  EXPECT_THAT(parse_error({"--seed", "99999999999999999999"}),
              HasSubstr("--seed: invalid value '99999999999999999999' (out of range"));
  EXPECT_THAT(parse_error({"--save_total_limit", "many"}),
              HasSubstr("--save_total_limit: invalid value 'many'"));
  EXPECT_THAT(parse_error({"--eval_steps", "+-3"}), HasSubstr("--eval_steps: invalid value '+-3'"));
  EXPECT_THAT(parse_error({"--per-device-train-batch-size", "x"}),
              HasSubstr("--per-device-train-batch-size: invalid value 'x'"));
  const std::string bad_bool = parse_error({"--bf16", "maybe"});
  EXPECT_THAT(bad_bool, HasSubstr("--bf16: invalid value 'maybe'"));
  EXPECT_THAT(bad_bool, HasSubstr("Truthy value expected: got maybe but expected one of yes/no, "
                                  "true/false, t/f, y/n, 1/0 (case insensitive)."));
  EXPECT_THAT(parse_error({"--tf32", "sometimes"}), HasSubstr("--tf32: invalid value 'sometimes'"));
  // A value flag at the very end has no value.
  EXPECT_THAT(parse_error({"--seed", "1", "--learning_rate"}), HasSubstr("--learning_rate"));
  // Accepted spellings of numbers.
  EXPECT_EQ(TrainingArguments::parse({"--learning_rate", "+0.5"}).learning_rate(), 0.5);
  EXPECT_EQ(TrainingArguments::parse({"--learning_rate", "1E-3"}).learning_rate(), 1e-3);
  EXPECT_EQ(TrainingArguments::parse({"--max_steps", "+7"}).max_steps(), 7);
}

TEST(TrainingArgumentsTest, EveryIntegerFlagRefusesValuesBeyond64Bits) {
  std::vector<std::string> integer_flags;
  // The field's type through its getter: the macro's `type` is spelled inside namespace mantissa.
#define MANTISSA_TEST_INTEGER_(type, name, default_value, help)                            \
  {                                                                                        \
    using Field = std::decay_t<decltype(TrainingArguments().name())>;                      \
    if (std::is_same_v<Field, int64_t> || std::is_same_v<Field, std::optional<int64_t>>) { \
      integer_flags.push_back("--" #name);                                                 \
    }                                                                                      \
  }
  MANTISSA_TRAINING_ARGUMENTS_FIELDS(MANTISSA_TEST_INTEGER_)
#undef MANTISSA_TEST_INTEGER_
  ASSERT_GE(integer_flags.size(), 10u);
  for (const auto& flag : integer_flags) {
    for (const std::string text : {"9223372036854775808", "-9223372036854775809"}) {
      EXPECT_THAT(parse_error({flag, text}), HasSubstr(flag + ": invalid value '" + text +
                                                       "' (out of range for a 64-bit integer)"));
    }
  }
  EXPECT_EQ(TrainingArguments::parse({"--seed", "9223372036854775807"}).seed(),
            std::numeric_limits<int64_t>::max());
}

TEST(TrainingArgumentsTest, MalformedValuesAreQuotedShort) {
  const std::string huge(100'000, '7');
  for (const std::vector<std::string>& argv : {std::vector<std::string>{"--seed", huge},
                                               {"--learning_rate", huge + "x"},
                                               {"--bf16", huge},
                                               {"--no_logging_nan_inf_filter=" + huge},
                                               {"--" + huge}}) {
    const std::string message = parse_error(argv);
    EXPECT_THAT(message, HasSubstr("7777..."));
    EXPECT_LT(message.size(), 400u) << argv[0];
  }
}

TEST(TrainingArgumentsTest, ParseValidates) {
  EXPECT_THAT(parse_error({"--fp16", "--bf16", "--use_cpu"}),
              HasSubstr("At most one of fp16 and bf16 can be True, but not both"));
  EXPECT_THAT(parse_error({"--lr_scheduler_type", "reduce_lr_on_plateau"}),
              HasSubstr("reduce_lr_on_plateau is not a valid SchedulerType"));
}

TEST(TrainingArgumentsTest, CharPointerArgv) {
  std::vector<std::string> storage{"prog", "--learning_rate", "1e-3", "--extra"};
  std::vector<char*> argv;
  for (auto& s : storage) argv.push_back(s.data());
  EXPECT_EQ(TrainingArguments::parse(3, argv.data()).learning_rate(), 1e-3);
  const auto [args, rest] = TrainingArguments::parse_known(4, argv.data());
  EXPECT_EQ(args.learning_rate(), 1e-3);
  EXPECT_THAT(rest, ElementsAre("--extra"));
  const char* const cargv[] = {"prog", "--seed", "9"};
  EXPECT_EQ(TrainingArguments::parse(3, cargv).seed(), 9);
}

TEST(TrainingArgumentsTest, HelpListsEveryFlagWithItsDefault) {
  const std::string help = TrainingArguments::help_text("train_mnist");
  EXPECT_THAT(help, HasSubstr("train_mnist"));
  for (const auto& name : field_names()) {
    const auto at = help.find("--" + name + " ");
    ASSERT_NE(at, std::string::npos) << name << " missing from --help:\n" << help;
    const auto next = help.find("\n  -", at + 1);
    const std::string entry = help.substr(at, next == std::string::npos ? next : next - at);
    EXPECT_THAT(entry, HasSubstr("(default: ")) << name;
  }
  EXPECT_THAT(help, HasSubstr("--learning_rate FLOAT"));
  EXPECT_THAT(help, HasSubstr("Peak learning rate, reached after warmup. (default: 5e-05)"));
  EXPECT_THAT(help, HasSubstr("(default: trainer_output)"));
  EXPECT_THAT(help, HasSubstr("(default: 3.0)"));
  EXPECT_THAT(help, HasSubstr("(default: 1e-08)"));
  EXPECT_THAT(help, HasSubstr("(default: 0.999)"));
  EXPECT_THAT(help, HasSubstr("(default: 500.0)"));
  EXPECT_THAT(help, HasSubstr("(default: None)"));
  EXPECT_THAT(help, HasSubstr("(default: True)"));
  EXPECT_THAT(help, HasSubstr("--bf16 [BOOL]"));
  EXPECT_THAT(help, HasSubstr("--per_device_train_batch_size INT"));
  EXPECT_THAT(help, HasSubstr("--lr_scheduler_type {linear,cosine,cosine_with_restarts,polynomial,"
                              "constant,constant_with_warmup,inverse_sqrt,cosine_with_min_lr,"
                              "cosine_warmup_with_min_lr,warmup_stable_decay}"));
  EXPECT_THAT(help, HasSubstr("--lr_scheduler_kwargs JSON"));
  EXPECT_THAT(help, HasSubstr("lists what each schedule takes). (default: {})"));
  EXPECT_THAT(help, HasSubstr("--save_strategy {no,steps,epoch,best}"));
  EXPECT_THAT(help, HasSubstr("--no_logging_nan_inf_filter"));
  EXPECT_THAT(help, HasSubstr("-h,--help"));
  // The dashed spellings are described once in the footer, not listed flag by flag.
  EXPECT_THAT(help, Not(HasSubstr("--learning-rate FLOAT")));
  EXPECT_THAT(help, HasSubstr("dashes for underscores"));
}

// The backquoted names in the first column of each table row between `from` and `to`.
std::set<std::string> first_column_names(const std::string& text, const std::string& from,
                                         const std::string& to) {
  std::set<std::string> names;
  const auto begin = text.find(from);
  const auto end = text.find(to, begin);
  EXPECT_NE(begin, std::string::npos) << from;
  std::istringstream lines(text.substr(begin, end - begin));
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("| ", 0) != 0) continue;
    const std::string cell = line.substr(0, line.find('|', 1));
    for (auto open = cell.find('`'); open != std::string::npos; open = cell.find('`', open)) {
      const auto close = cell.find('`', open + 1);
      if (close == std::string::npos) break;
      names.insert(cell.substr(open + 1, close - open - 1));
      open = close + 1;
    }
  }
  return names;
}

TEST(TrainingArgumentsTest, TheDocsListEveryFieldWhereItBelongs) {
  std::ifstream in(mantissa_test::docs_dir() + "/guide/from_python.md");
  ASSERT_TRUE(in.good());
  const std::string guide((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto has = first_column_names(guide, "### Fields mantissa has", "### Fields mantissa adds");
  const auto adds =
      first_column_names(guide, "### Fields mantissa adds", "### Fields mantissa does not have");
  const auto lacks =
      first_column_names(guide, "### Fields mantissa does not have", "## Python APIs");
  std::ifstream reference_in(mantissa_test::docs_dir() + "/training_arguments.md");
  const std::string reference((std::istreambuf_iterator<char>(reference_in)),
                              std::istreambuf_iterator<char>());
  for (const auto& name : field_names()) {
    EXPECT_TRUE(has.count(name) + adds.count(name) == 1)
        << name << " must be in exactly one of from_python.md's tables of fields mantissa has";
    EXPECT_EQ(lacks.count(name), 0u) << name << " is listed as missing in from_python.md";
    EXPECT_NE(reference.find("| `" + name + "` |"), std::string::npos)
        << name << " has no row in docs/training_arguments.md";
  }
}

TEST(TrainingArgumentsTest, FlagsHelpTextShowsTheDefaultsItIsGiven) {
  // The program's defaults, as argparse's help shows set_defaults; unvalidated (bf16 with
  // fp16 would not validate) and unknown names skipped.
  const std::string flags =
      TrainingArguments::flags_help_text({"--learning_rate", "3e-3", "--bf16", "true", "--fp16",
                                          "--eval_steps", "50", "--no_such_flag", "1"});
  EXPECT_THAT(flags, HasSubstr("Peak learning rate, reached after warmup. (default: 0.003)"));
  EXPECT_THAT(flags, Not(HasSubstr("(default: 5e-05)")));
  const auto bf16 = flags.find("--bf16 [BOOL]");
  ASSERT_NE(bf16, std::string::npos);
  EXPECT_THAT(flags.substr(bf16, flags.find("\n  -", bf16) - bf16), HasSubstr("(default: True)"));
  EXPECT_THAT(flags, HasSubstr("(default: 50.0)"));
  // The flags themselves are the library's: no --no_bf16, which parse would not take.
  EXPECT_THAT(flags, Not(HasSubstr("--no_bf16")));
  EXPECT_EQ(TrainingArguments::flags_help_text({}), TrainingArguments::flags_help_text());
  EXPECT_THAT(TrainingArguments::flags_help_text(), HasSubstr("(default: 5e-05)"));
}

TEST(TrainingArgumentsTest, FlagsHelpTextHasNoUsageOfItsOwn) {
  const std::string flags = TrainingArguments::flags_help_text();
  EXPECT_THAT(flags, ::testing::StartsWith("TrainingArguments options:\n"));
  EXPECT_THAT(flags, Not(HasSubstr("Usage")));
  EXPECT_THAT(flags, Not(HasSubstr("-h,--help")));
  EXPECT_THAT(flags, HasSubstr("--learning_rate FLOAT"));
  EXPECT_THAT(flags, HasSubstr("dashes for underscores"));
}

TEST(TrainingArgumentsTest, HelpFlagPrintsAndExitsZero) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(TrainingArguments::parse({"--help"}), ::testing::ExitedWithCode(0), "");
  EXPECT_EXIT(TrainingArguments::parse({"--seed", "3", "-h"}), ::testing::ExitedWithCode(0), "");
  EXPECT_EXIT(TrainingArguments::parse_known({"--mine", "--help"}), ::testing::ExitedWithCode(0),
              "");
}

TEST(TrainingArgumentsTest, SingleJsonArgumentLoadsTheFile) {
  TempDir dir;
  const std::string path = dir.file("args.json");
  const auto want = TrainingArguments().learning_rate(0.1).seed(3).output_dir("x");
  want.save_json(path);
  EXPECT_EQ(TrainingArguments::parse({path}), want);
  EXPECT_EQ(TrainingArguments::parse_known({path}).first, want);
}

// ---- validation -------------------------------------------------------------------------------

struct InvalidCase {
  const char* label;
  TrainingArguments args;
  const char* message;
};

TEST(TrainingArgumentsTest, EveryValidationErrorNamesFieldAndValue) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  const TrainingArguments d;
  const std::vector<InvalidCase> cases = {
      {"fp16+bf16", TrainingArguments(d).fp16(true).bf16(true),
       "At most one of fp16 and bf16 can be True, but not both"},
      {"full eval", TrainingArguments(d).fp16_full_eval(true).bf16_full_eval(true),
       "At most one of fp16 and bf16 can be True for full eval, but not both"},
      {"train batch", TrainingArguments(d).per_device_train_batch_size(0),
       "per_device_train_batch_size must be positive, got 0"},
      {"eval batch", TrainingArguments(d).per_device_eval_batch_size(-1),
       "per_device_eval_batch_size must be positive, got -1"},
      {"lr", TrainingArguments(d).learning_rate(-1e-3),
       "learning_rate must be non-negative, got -0.001"},
      {"accumulation", TrainingArguments(d).gradient_accumulation_steps(0),
       "gradient_accumulation_steps must be at least 1, got 0"},
      {"max_grad_norm", TrainingArguments(d).max_grad_norm(-1),
       "max_grad_norm must be non-negative (0 disables clipping), got -1.0"},
      {"warmup_ratio high", TrainingArguments(d).warmup_ratio(1.5),
       "warmup_ratio must lie in range [0,1], got 1.5"},
      {"warmup_ratio low", TrainingArguments(d).warmup_ratio(-0.1),
       "warmup_ratio must lie in range [0,1], got -0.1"},
      {"warmup_steps", TrainingArguments(d).warmup_steps(-1),
       "warmup_steps must be non-negative, got -1"},
      {"save_total_limit", TrainingArguments(d).save_total_limit(0),
       "save_total_limit must be at least 1 (or None to keep every checkpoint), got 0"},
      {"logging_steps 0", TrainingArguments(d).logging_steps(0),
       "logging strategy steps requires non-zero --logging_steps"},
      {"logging_steps <0", TrainingArguments(d).logging_steps(-5), "got logging_steps=-5.0"},
      {"logging_steps fraction", TrainingArguments(d).logging_steps(2.5),
       "--logging_steps must be an integer if bigger than 1: 2.5"},
      {"save_steps 0", TrainingArguments(d).save_steps(0),
       "save strategy steps requires a positive --save_steps"},
      {"save_steps fraction", TrainingArguments(d).save_steps(10.5),
       "--save_steps must be an integer if bigger than 1: 10.5"},
      {"eval_steps <0", TrainingArguments(d).eval_strategy("steps").eval_steps(-1.0),
       "eval_steps must be positive (or unset to follow logging_steps), got -1.0"},
      {"eval_steps fallback 0",
       TrainingArguments(d).eval_strategy("steps").logging_strategy("no").logging_steps(0),
       "evaluation strategy steps requires either non-zero --eval_steps or --logging_steps, got "
       "eval_steps=None and logging_steps=0.0"},
      {"eval_steps fraction", TrainingArguments(d).eval_strategy("steps").eval_steps(2.5),
       "--eval_steps must be an integer if bigger than 1: 2.5"},
      {"epochs", TrainingArguments(d).num_train_epochs(0),
       "num_train_epochs must be positive when max_steps <= 0, got num_train_epochs=0.0 and "
       "max_steps=-1"},
      {"scheduler", TrainingArguments(d).lr_scheduler_type("foo"),
       "lr_scheduler_type: foo is not a valid SchedulerType, please select one of ['linear', "
       "'cosine', 'cosine_with_restarts', 'polynomial', 'constant', 'constant_with_warmup', "
       "'inverse_sqrt', 'cosine_with_min_lr', 'cosine_warmup_with_min_lr', "
       "'warmup_stable_decay']"},
      {"scheduler kwarg", TrainingArguments(d).lr_scheduler_kwargs({{"num_cycles", 2}}),
       "lr_scheduler_kwargs: 'num_cycles': 2 is not an argument of the linear schedule"},
      {"scheduler kwarg type",
       TrainingArguments(d).lr_scheduler_type("cosine").lr_scheduler_kwargs({{"num_cycles", "2"}}),
       "lr_scheduler_kwargs: num_cycles of the cosine schedule must be a number, got '2' (a "
       "string)"},
      {"scheduler kwarg value",
       TrainingArguments(d)
           .lr_scheduler_type("cosine_with_restarts")
           .lr_scheduler_kwargs({{"num_cycles", -2}}),
       "lr_scheduler_kwargs: num_cycles of the cosine_with_restarts schedule counts cosine waves: "
       "it must be >= 0, got -2"},
      {"lr_end vs learning_rate",
       TrainingArguments(d).lr_scheduler_type("polynomial").lr_scheduler_kwargs({{"lr_end", 1e-4}}),
       "lr_scheduler_kwargs: lr_end (0.0001) must be smaller than initial lr (5e-05)"},
      {"wsd without decay", TrainingArguments(d).lr_scheduler_type("warmup_stable_decay"),
       "needs num_decay_steps"},
      {"optim", TrainingArguments(d).optim("adam"),
       "optim: adam is not a valid OptimizerNames, please select one of ['adamw_torch', "
       "'adamw_torch_fused', 'adamw_mantissa_fused', 'sgd', 'adafactor', 'adamw_torch_8bit', "
       "'muon']"},
      {"eval_strategy", TrainingArguments(d).eval_strategy("sometimes"),
       "eval_strategy: sometimes is not a valid IntervalStrategy, please select one of ['no', "
       "'steps', 'epoch']"},
      {"logging_strategy", TrainingArguments(d).logging_strategy("Steps"),
       "logging_strategy: Steps is not a valid IntervalStrategy"},
      {"save_strategy", TrainingArguments(d).save_strategy("always"),
       "save_strategy: always is not a valid SaveStrategy, please select one of ['no', 'steps', "
       "'epoch', 'best']"},
      {"master_weights", TrainingArguments(d).master_weights("yes"),
       "master_weights: yes is not a valid MasterWeightsMode, please select one of ['auto', "
       "'on', 'off']"},
      {"beta1 high", TrainingArguments(d).adam_beta1(1.0), "adam_beta1 must be in [0, 1), got 1.0"},
      {"beta1 low", TrainingArguments(d).adam_beta1(-0.1),
       "adam_beta1 must be in [0, 1), got -0.1"},
      {"beta2", TrainingArguments(d).adam_beta2(1.5), "adam_beta2 must be in [0, 1), got 1.5"},
      {"epsilon", TrainingArguments(d).adam_epsilon(-1e-8),
       "adam_epsilon must be non-negative, got -1e-08"},
      {"weight_decay", TrainingArguments(d).weight_decay(-0.01),
       "weight_decay must be non-negative, got -0.01"},
      {"hysteresis", TrainingArguments(d).hysteresis(0),
       "hysteresis must be at least 1 (1 = back off on every overflow), got 0"},
      {"scale power high", TrainingArguments(d).initial_scale_power(128),
       "initial_scale_power must be in [0, 127] (2^128 overflows float32), got 128"},
      {"scale power low", TrainingArguments(d).initial_scale_power(-1),
       "initial_scale_power must be in [0, 127] (2^128 overflows float32), got -1"},
      {"loss_scale", TrainingArguments(d).loss_scale(-1),
       "loss_scale must be non-negative (0 = dynamic loss scaling), got -1.0"},
      {"min_loss_scale", TrainingArguments(d).min_loss_scale(-1),
       "min_loss_scale must be non-negative, got -1.0"},
      {"max < min", TrainingArguments(d).min_loss_scale(2).max_loss_scale(1.0),
       "max_loss_scale must be positive and >= min_loss_scale, got max_loss_scale=1.0 and "
       "min_loss_scale=2.0"},
      {"max zero", TrainingArguments(d).max_loss_scale(0.0),
       "max_loss_scale must be positive and >= min_loss_scale, got max_loss_scale=0.0"},
      {"loss_scale_window", TrainingArguments(d).loss_scale_window(0),
       "loss_scale_window must be at least 1, got 0"},
      {"nonfinite", TrainingArguments(d).max_consecutive_nonfinite(-1),
       "max_consecutive_nonfinite must be non-negative (0 = never stop), got -1"},
      {"workers", TrainingArguments(d).dataloader_num_workers(-1),
       "dataloader_num_workers must be non-negative, got -1"},
      {"graph warmup", TrainingArguments(d).cuda_graph_warmup_steps(0),
       "cuda_graph_warmup_steps must be at least 1 (the optimizer state is made by an eager step), "
       "got 0"},
      {"output_dir", TrainingArguments(d).output_dir(""), "output_dir must not be empty"},
      {"resume", TrainingArguments(d).resume_from_checkpoint(std::string()),
       "resume_from_checkpoint must be a checkpoint folder or 'latest', got ''"},
      {"best without eval", TrainingArguments(d).save_strategy("best"),
       "save_strategy best saves when eval_loss improves, so it requires an "
       "eval_strategy of steps or epoch, got eval_strategy='no'"},
      {"nan lr", TrainingArguments(d).learning_rate(nan),
       "learning_rate must be a finite number, got nan"},
      {"inf clip", TrainingArguments(d).max_grad_norm(inf),
       "max_grad_norm must be a finite number, got inf"},
      {"inf eval_steps", TrainingArguments(d).eval_steps(inf),
       "eval_steps must be a finite number or None, got inf"},
  };
  for (const auto& c : cases) {
    EXPECT_THAT(validate_error(c.args), HasSubstr(c.message)) << c.label;
  }
}

TEST(TrainingArgumentsTest, BoundaryValuesAreValid) {
  const std::vector<TrainingArguments> valid = {
      TrainingArguments().num_train_epochs(0).max_steps(10),
      TrainingArguments().warmup_ratio(0.0),
      TrainingArguments().warmup_ratio(1.0),
      TrainingArguments().adam_beta1(0.0).adam_beta2(0.0),
      TrainingArguments().learning_rate(0.0).max_grad_norm(0.0).adam_epsilon(0.0),
      TrainingArguments().logging_steps(0.5).save_steps(0.1),
      TrainingArguments().logging_strategy("no").logging_steps(0),
      TrainingArguments().logging_strategy("epoch").logging_steps(2.5),
      TrainingArguments().save_strategy("no").save_steps(0),
      TrainingArguments().save_strategy("best").eval_strategy("epoch"),
      TrainingArguments().eval_strategy("steps").eval_steps(0.0),  // 0 follows logging_steps
      TrainingArguments().eval_strategy("steps").eval_steps(0.2),
      TrainingArguments().save_total_limit(1),
      TrainingArguments().initial_scale_power(0),
      TrainingArguments().initial_scale_power(127),
      TrainingArguments().min_loss_scale(1).max_loss_scale(1.0),
      TrainingArguments().max_consecutive_nonfinite(0),
      TrainingArguments().loss_scale(128),
      TrainingArguments().optim("sgd").lr_scheduler_type("constant_with_warmup"),
      TrainingArguments()
          .lr_scheduler_type("cosine_with_min_lr")
          .lr_scheduler_kwargs({{"min_lr", 5e-5}}),
      TrainingArguments()
          .lr_scheduler_type("polynomial")
          .lr_scheduler_kwargs({{"lr_end", 0}, {"power", 2}}),
      TrainingArguments().optim("adamw_torch_fused").master_weights("off"),
      TrainingArguments().tf32(false),
      TrainingArguments().use_cpu(true).bf16(true).bf16_full_eval(true),
  };
  for (std::size_t i = 0; i < valid.size(); ++i) {
    EXPECT_EQ(validate_error(valid[i]), "<no exception>") << "case " << i;
  }
}

// Issue 11, defect 7: a size the run cannot count in int64 is an error naming the flag and its
// value, never a wrapped count (which trained nothing and exited 0) or a misleading message.
TEST(TrainingArgumentsTest, SizesBeyondInt64AreErrorsNamingTheFlag) {
  const std::string max = "9223372036854775807";
  EXPECT_THAT(
      parse_error({"--per_device_train_batch_size", max, "--gradient_accumulation_steps", "2"}),
      HasSubstr("--per_device_train_batch_size " + max +
                " x --gradient_accumulation_steps 2 examples per optimizer step is more "
                "than a 64-bit count holds"));
  // Three epochs take at least three optimizer steps of that many examples.
  EXPECT_THAT(parse_error({"--per_device_train_batch_size", max}),
              HasSubstr("--num_train_epochs 3.0 (at least 3 optimizer steps) of " + max +
                        " examples per step (--per_device_train_batch_size " + max));
  EXPECT_THAT(parse_error({"--max_steps", max}),
              HasSubstr("--max_steps " + max + " optimizer steps of 8 examples each"));
  EXPECT_THAT(parse_error({"--num_train_epochs", "1e300"}),
              HasSubstr("--num_train_epochs 1e+300 is more epochs than a 64-bit count holds"));
  EXPECT_THAT(parse_error({"--num_train_epochs", "9.3e18"}),
              HasSubstr("--num_train_epochs 9.3e+18 is more epochs than a 64-bit count holds"));
  // Intervals become step counts whatever their strategy.
  EXPECT_THAT(parse_error({"--logging_steps", "1e300"}),
              HasSubstr("--logging_steps 1e+300 is not a number of steps"));
  EXPECT_THAT(parse_error({"--save_strategy", "no", "--save_steps", "1e19"}),
              HasSubstr("--save_steps 1e+19 is not a number of steps"));
  EXPECT_THAT(parse_error({"--eval_steps", "1e300"}),
              HasSubstr("--eval_steps 1e+300 is not a number of steps"));
  EXPECT_THAT(parse_error({"--logging_strategy", "no", "--logging_steps", "-1e300"}),
              HasSubstr("--logging_steps -1e+300 is not a number of steps"));
  // The loss scale is a float32 tensor: a larger value would be inf on the first step.
  EXPECT_THAT(
      parse_error({"--loss_scale", "1e39"}),
      HasSubstr("--loss_scale 1e+39 does not fit in the float32 that holds the loss scale"));
  EXPECT_THAT(parse_error({"--min_loss_scale", "1e39"}),
              HasSubstr("--min_loss_scale 1e+39 does not fit in the float32"));
  EXPECT_THAT(parse_error({"--max_loss_scale", "1e300"}),
              HasSubstr("--max_loss_scale 1e+300 does not fit in the float32"));
  // The same checks guard arguments built in C++ and read from JSON.
  EXPECT_THAT(validate_error(TrainingArguments().max_steps(std::numeric_limits<int64_t>::max())),
              HasSubstr("--max_steps " + max));
  EXPECT_THAT(value_error([] { TrainingArguments::from_json(R"({"num_train_epochs": 1e300})"); }),
              HasSubstr("--num_train_epochs 1e+300 is more epochs"));
}

TEST(TrainingArgumentsTest, SizesAtTheInt64LimitAreValid) {
  const int64_t max = std::numeric_limits<int64_t>::max();
  const std::vector<TrainingArguments> valid = {
      TrainingArguments().max_steps(max).per_device_train_batch_size(1),
      TrainingArguments().max_steps(1).per_device_train_batch_size(max),
      TrainingArguments().per_device_train_batch_size(max).num_train_epochs(1),
      TrainingArguments().num_train_epochs(1e18).per_device_train_batch_size(9),
      TrainingArguments().num_train_epochs(1e300).max_steps(10),  // epochs unused with max_steps
      TrainingArguments().logging_steps(9.2e18).save_steps(9.2e18).eval_steps(9.2e18),
      TrainingArguments().loss_scale(3.4e38).min_loss_scale(1e38).max_loss_scale(3.4e38),
      TrainingArguments().per_device_eval_batch_size(max).dataloader_num_workers(max),
  };
  for (std::size_t i = 0; i < valid.size(); ++i) {
    EXPECT_EQ(validate_error(valid[i]), "<no exception>") << "case " << i;
  }
}

TEST(TrainingArgumentsTest, StepHelpersNeverOverflow) {
  const int64_t max = std::numeric_limits<int64_t>::max();
  // ceil(2^63 * 1.0) as a double is 2^63, one past int64: the warmup is the whole run.
  EXPECT_EQ(TrainingArguments().warmup_ratio(1.0).get_warmup_steps(max), max);
  EXPECT_EQ(TrainingArguments().warmup_ratio(0.5).get_warmup_steps(max), int64_t{1} << 62);
  EXPECT_EQ(TrainingArguments::resolve_steps(0.5, max), int64_t{1} << 62);
  EXPECT_THAT(value_error([] { TrainingArguments::resolve_steps(1e300, 10); }),
              HasSubstr("1e+300 is not a number of steps"));
  EXPECT_THAT(value_error([] { TrainingArguments::resolve_steps(-0.5, 10); }),
              HasSubstr("-0.5 is not a number of steps"));
}

// ---- hardware decision (pure function, fake machines) ------------------------------------------

DeviceInfo machine(bool cuda, int major, int minor, bool cpu_fp16) {
  DeviceInfo info;
  info.cuda_available = cuda;
  info.cuda_capability_major = major;
  info.cuda_capability_minor = minor;
  info.cpu_fp16 = cpu_fp16;
  return info;
}

std::string support_error(const TrainingArguments& args, const DeviceInfo& info) {
  return value_error([&] { check_precision_support(args, info); });
}

const std::string kOk = "<no exception>";

TEST(TrainingArgumentsTest, Bf16NeedsAmpereOnTheGpu) {
  const auto turing = machine(true, 7, 5, true);
  const std::string e = support_error(TrainingArguments().bf16(true), turing);
  EXPECT_THAT(e, HasSubstr("Your setup doesn't support bf16/gpu."));
  EXPECT_THAT(e, HasSubstr("bf16=True, but cuda:0 has compute capability 7.5"));
  EXPECT_THAT(support_error(TrainingArguments().bf16_full_eval(true), turing),
              HasSubstr("bf16_full_eval=True, but cuda:0 has compute capability 7.5"));
  EXPECT_EQ(support_error(TrainingArguments().bf16(true), machine(true, 8, 0, true)), kOk);
  EXPECT_EQ(support_error(TrainingArguments().bf16(true), machine(true, 9, 0, true)), kOk);
  EXPECT_EQ(support_error(TrainingArguments().bf16(true), machine(false, -1, -1, true)), kOk);
  EXPECT_EQ(support_error(TrainingArguments().bf16(true).use_cpu(true), turing), kOk);
  // Capability unknown (built without the CUDA runtime): let through.
  EXPECT_EQ(support_error(TrainingArguments().bf16(true), machine(true, -1, -1, true)), kOk);
}

TEST(TrainingArgumentsTest, Fp16NeedsCpuKernelsOnTheCpu) {
  const auto old_cpu = machine(false, -1, -1, false);
  const std::string e = support_error(TrainingArguments().fp16(true), old_cpu);
  EXPECT_THAT(e, HasSubstr("FP16 Mixed precision training with AMP or APEX (`--fp16`)"));
  EXPECT_THAT(e, HasSubstr("fp16=True on the CPU"));
  EXPECT_THAT(support_error(TrainingArguments().fp16_full_eval(true), old_cpu),
              HasSubstr("fp16_full_eval=True on the CPU"));
  EXPECT_EQ(support_error(TrainingArguments().fp16(true), machine(false, -1, -1, true)), kOk);
  // Any CUDA device runs fp16, even without CPU kernels; --use_cpu brings the CPU back.
  EXPECT_EQ(support_error(TrainingArguments().fp16(true), machine(true, 6, 0, false)), kOk);
  EXPECT_THAT(
      support_error(TrainingArguments().fp16(true).use_cpu(true), machine(true, 8, 0, false)),
      HasSubstr("fp16=True on the CPU"));
}

TEST(TrainingArgumentsTest, Tf32NeedsAnAmpereGpu) {
  const std::string hf = "--tf32 requires Ampere or a newer GPU arch, cuda>=11 and torch>=1.7";
  const auto tf32 = TrainingArguments().tf32(true);
  EXPECT_THAT(support_error(tf32, machine(false, -1, -1, true)), HasSubstr(hf));
  EXPECT_THAT(support_error(tf32, machine(false, -1, -1, true)),
              HasSubstr("tf32=True, but no CUDA device is visible"));
  EXPECT_THAT(support_error(tf32, machine(true, 7, 0, true)),
              HasSubstr("cuda:0 has compute capability 7.0"));
  EXPECT_THAT(support_error(TrainingArguments(tf32).use_cpu(true), machine(true, 8, 0, true)),
              HasSubstr("use_cpu=True trains on the CPU"));
  EXPECT_EQ(support_error(tf32, machine(true, 8, 6, true)), kOk);
  EXPECT_EQ(support_error(TrainingArguments().tf32(false), machine(false, -1, -1, false)), kOk);
  EXPECT_EQ(support_error(TrainingArguments(), machine(false, -1, -1, false)), kOk);
}

TEST(TrainingArgumentsTest, ThisMachine) {
  const DeviceInfo& info = mantissa::detail::query_device_info();
  EXPECT_EQ(info.cuda_available, torch::cuda::is_available());
  EXPECT_EQ(mantissa::detail::cuda_compute_capability_major(), info.cuda_capability_major);
  if (!info.cuda_available) {
    EXPECT_EQ(info.cuda_capability_major, -1);
  }
  EXPECT_TRUE(info.cpu_fp16) << "LibTorch 2.11 has float16 matmul on the CPU";
  // So fp16 on the CPU validates here.
  EXPECT_EQ(validate_error(TrainingArguments().fp16(true).use_cpu(true)), kOk);
  EXPECT_EQ(validate_error(TrainingArguments().bf16(true).use_cpu(true)), kOk);
}

// ---- derived values ---------------------------------------------------------------------------

TEST(TrainingArgumentsTest, ComputeDtype) {
  EXPECT_EQ(TrainingArguments().compute_dtype(), c10::kFloat);
  EXPECT_EQ(TrainingArguments().bf16(true).compute_dtype(), c10::kBFloat16);
  EXPECT_EQ(TrainingArguments().fp16(true).compute_dtype(), c10::kHalf);
  EXPECT_THAT(value_error([] { TrainingArguments().fp16(true).bf16(true).compute_dtype(); }),
              HasSubstr("At most one of fp16 and bf16"));
}

TEST(TrainingArgumentsTest, Device) {
  EXPECT_EQ(TrainingArguments().use_cpu(true).device(), c10::Device(c10::kCPU));
  const c10::Device want =
      torch::cuda::is_available() ? c10::Device(c10::kCUDA, 0) : c10::Device(c10::kCPU);
  EXPECT_EQ(TrainingArguments().device(), want);
}

TEST(TrainingArgumentsTest, LossScaleHelpers) {
  EXPECT_EQ(TrainingArguments().init_loss_scale(), 65536.0);
  EXPECT_EQ(TrainingArguments().initial_scale_power(0).init_loss_scale(), 1.0);
  EXPECT_EQ(TrainingArguments().initial_scale_power(24).init_loss_scale(), 16777216.0);
  EXPECT_TRUE(TrainingArguments().dynamic_loss_scale());
  const auto fixed = TrainingArguments().loss_scale(128);
  EXPECT_EQ(fixed.init_loss_scale(), 128.0);
  EXPECT_FALSE(fixed.dynamic_loss_scale());
}

TEST(TrainingArgumentsTest, StepHelpers) {
  EXPECT_EQ(TrainingArguments().resolved_eval_steps(), 500.0);
  EXPECT_EQ(TrainingArguments().eval_steps(50.0).resolved_eval_steps(), 50.0);
  EXPECT_EQ(TrainingArguments().eval_steps(0.0).logging_steps(20).resolved_eval_steps(), 20.0);
  EXPECT_EQ(TrainingArguments().logging_steps(0.1).resolved_eval_steps(), 0.1);

  EXPECT_EQ(TrainingArguments::resolve_steps(0.1, 1000), 100);
  EXPECT_EQ(TrainingArguments::resolve_steps(0.25, 10), 3);  // ceil(2.5)
  EXPECT_EQ(TrainingArguments::resolve_steps(500, 1000), 500);
  EXPECT_EQ(TrainingArguments::resolve_steps(1, 1000), 1);

  EXPECT_EQ(TrainingArguments().get_warmup_steps(1000), 0);
  EXPECT_EQ(TrainingArguments().warmup_ratio(0.1).get_warmup_steps(1000), 100);
  EXPECT_EQ(TrainingArguments().warmup_ratio(0.1).get_warmup_steps(15), 2);  // ceil(1.5)
  EXPECT_EQ(TrainingArguments().warmup_ratio(0.1).warmup_steps(7).get_warmup_steps(1000), 7);
}

// ---- JSON -------------------------------------------------------------------------------------

TEST(TrainingArgumentsTest, ToJsonWritesEveryFieldInOrder) {
  const std::string json = TrainingArguments().to_json();
  std::size_t last = 0;
  for (const auto& name : field_names()) {
    const auto at = json.find("\"" + name + "\":");
    ASSERT_NE(at, std::string::npos) << name;
    EXPECT_GT(at, last) << name << " out of order";
    last = at;
  }
  EXPECT_EQ(json.front(), '{');
  EXPECT_THAT(json, HasSubstr("\n  \"output_dir\": \"trainer_output\",\n"));
  EXPECT_THAT(json, HasSubstr("\"learning_rate\": 5e-05"));
  EXPECT_THAT(json, HasSubstr("\"num_train_epochs\": 3.0"));
  EXPECT_THAT(json, HasSubstr("\"max_steps\": -1"));
  EXPECT_THAT(json, HasSubstr("\"eval_steps\": null"));
  EXPECT_THAT(json, HasSubstr("\"tf32\": null"));
  EXPECT_THAT(json, HasSubstr("\"logging_nan_inf_filter\": true"));
}

TEST(TrainingArgumentsTest, JsonRoundTripIsExact) {
  EXPECT_EQ(TrainingArguments::from_json(TrainingArguments().to_json()), TrainingArguments());

  const auto a = TrainingArguments()
                     .output_dir("runs/\"quoted\" \\ dir/\xC3\xBC")
                     .learning_rate(3e-4)
                     .weight_decay(0.1)
                     .warmup_ratio(1.0 / 3.0)
                     .num_train_epochs(2.7182818284590451)
                     .adam_epsilon(1e-300)
                     .max_grad_norm(0.30000000000000004)
                     .eval_strategy("steps")
                     .eval_steps(0.1)
                     .save_total_limit(2)
                     .data_seed(std::numeric_limits<int64_t>::max())
                     .seed(std::numeric_limits<int64_t>::min())
                     .tf32(false)
                     .max_loss_scale(1e30)
                     .resume_from_checkpoint("latest")
                     .bf16(true)
                     .use_cpu(true);
  const std::string text = a.to_json();
  const TrainingArguments b = TrainingArguments::from_json(text);
  EXPECT_EQ(b, a);
  EXPECT_EQ(b.learning_rate(), 3e-4);
  EXPECT_EQ(b.weight_decay(), 0.1);
  EXPECT_EQ(b.warmup_ratio(), 1.0 / 3.0);
  EXPECT_EQ(b.max_grad_norm(), 0.30000000000000004);
  EXPECT_EQ(b.adam_epsilon(), 1e-300);
  EXPECT_EQ(b.eval_steps(), std::optional<double>(0.1));
  EXPECT_EQ(b.tf32(), std::optional<bool>(false));
  EXPECT_EQ(b.output_dir(), a.output_dir());
  EXPECT_EQ(b.to_json(), text);
  EXPECT_THAT(text, HasSubstr("\"tf32\": false"));
  EXPECT_THAT(text, HasSubstr("\"save_total_limit\": 2"));

  // Unset and set optionals stay apart.
  const auto unset = TrainingArguments::from_json(TrainingArguments().to_json());
  EXPECT_FALSE(unset.tf32().has_value());
  EXPECT_FALSE(unset.save_total_limit().has_value());
}

TEST(TrainingArgumentsTest, FromJsonKeepsDefaultsForMissingKeys) {
  const auto a = TrainingArguments::from_json(R"({"learning_rate": 0.001, "num_train_epochs": 2})");
  EXPECT_EQ(a.learning_rate(), 0.001);
  EXPECT_EQ(a.num_train_epochs(), 2.0);  // a JSON integer for a float field
  EXPECT_EQ(TrainingArguments(a).learning_rate(5e-5).num_train_epochs(3.0), TrainingArguments());
  EXPECT_EQ(TrainingArguments::from_json("{}"), TrainingArguments());
}

TEST(TrainingArgumentsTest, FromJsonRejectsUnknownKeys) {
  EXPECT_THAT(value_error([] {
                TrainingArguments::from_json(R"({"learning_rate": 0.001, "lerning_rate": 1})");
              }),
              HasSubstr("unknown key 'lerning_rate'"));
  EXPECT_THAT(value_error([] { TrainingArguments::from_json(R"({"a": 1, "b": 2})"); }),
              HasSubstr("unknown keys 'a', 'b'"));
}

TEST(TrainingArgumentsTest, FromJsonRejectsWrongTypes) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"per_device_train_batch_size": "8"})",
       R"(per_device_train_batch_size: expected an integer, got "8")"},
      {R"({"per_device_train_batch_size": 8.5})",
       "per_device_train_batch_size: expected an integer, got 8.5"},
      {R"({"bf16": 1})", "bf16: expected true or false, got 1"},
      {R"({"tf32": "yes"})", R"(tf32: expected true or false, got "yes")"},
      {R"({"output_dir": 3})", "output_dir: expected a string, got 3"},
      {R"({"learning_rate": null})", "learning_rate: expected a number, got null"},
      {R"({"learning_rate": "3e-4"})", R"(learning_rate: expected a number, got "3e-4")"},
      {R"({"save_total_limit": [1]})", "save_total_limit: expected an integer, got [1]"},
      {R"({"max_steps": 18446744073709551615})",
       "max_steps: 18446744073709551615 is out of range for a 64-bit integer"},
  };
  // No structured binding: clang before 16 cannot capture one in a lambda (the asan build).
  for (const auto& test_case : cases) {
    const std::string& text = test_case.first;
    EXPECT_THAT(value_error([&] { TrainingArguments::from_json(text); }),
                HasSubstr(test_case.second))
        << text;
  }
}

// ---- lr_scheduler_kwargs ------------------------------------------------------------------------

TEST(TrainingArgumentsTest, LrSchedulerKwargsFromTheCommandLine) {
  const auto a = TrainingArguments::parse(
      {"--lr_scheduler_type", "warmup_stable_decay", "--lr_scheduler_kwargs",
       R"({"num_decay_steps": 100, "decay_type": "1-sqrt", "min_lr_ratio": 0.1})"});
  EXPECT_EQ(a.lr_scheduler_kwargs(), (LrSchedulerKwargs{{"num_decay_steps", int64_t{100}},
                                                        {"decay_type", "1-sqrt"},
                                                        {"min_lr_ratio", 0.1}}));
  // HF's _convert_str_dict: on the command line a string of digits is an int and digits with
  // one dot a float (other strings, "1-sqrt" above, stay strings).
  const auto b = TrainingArguments::parse(
      {"--lr_scheduler_type=warmup_stable_decay",
       R"(--lr_scheduler_kwargs={"num_decay_steps": "100", "min_lr_ratio": ".5"})"});
  EXPECT_EQ(b.lr_scheduler_kwargs(),
            (LrSchedulerKwargs{{"num_decay_steps", int64_t{100}}, {"min_lr_ratio", 0.5}}));
  EXPECT_EQ(std::get<double>(b.lr_scheduler_kwargs().at("min_lr_ratio")), 0.5);
  // The dashed spelling, an empty object and None.
  EXPECT_EQ(TrainingArguments::parse({"--lr-scheduler-kwargs", "{}"}), TrainingArguments());
  EXPECT_EQ(TrainingArguments::parse({"--lr_scheduler_kwargs", "None"}), TrainingArguments());
  // 2 is an int, 2.0 a float: both are numbers to num_cycles.
  EXPECT_EQ(TrainingArguments::parse({"--lr_scheduler_type", "cosine", "--lr_scheduler_kwargs",
                                      R"({"num_cycles": 2.0})"})
                .lr_scheduler_kwargs(),
            (LrSchedulerKwargs{{"num_cycles", 2.0}}));

  EXPECT_THAT(parse_error({"--lr_scheduler_kwargs", "num_cycles=2"}),
              HasSubstr("--lr_scheduler_kwargs: invalid value 'num_cycles=2' (expected a JSON "
                        "object such as '{\"num_cycles\": 2}'"));
  EXPECT_THAT(parse_error({"--lr_scheduler_kwargs", "[2]"}),
              HasSubstr("--lr_scheduler_kwargs: invalid value '[2]' (expected a JSON object"));
  EXPECT_THAT(parse_error({"--lr_scheduler_kwargs", R"({"num_cycles": [1, 2]})"}),
              HasSubstr("--lr_scheduler_kwargs: 'num_cycles' must be a number or a string (the "
                        "schedules take nothing else), got [1,2]"));
  EXPECT_THAT(parse_error({"--lr_scheduler_kwargs", R"({"num_cycles": true})"}),
              HasSubstr("'num_cycles' must be a number or a string"));
  EXPECT_THAT(parse_error({"--lr_scheduler_kwargs", R"({"timescale": "99999999999999999999"})"}),
              HasSubstr("--lr_scheduler_kwargs: 'timescale': '99999999999999999999' is out of "
                        "range for a 64-bit integer"));
  // A hostile value gives a message of one short line.
  const std::string digits(100'000, '9');
  for (const std::string& text :
       {R"({"timescale": ")" + digits + "\"}", "{\"" + digits + "\": [1]}", "[" + digits + "]",
        R"({"decay_type": ")" + digits + "\"}"}) {
    const std::string message =
        parse_error({"--lr_scheduler_type", "warmup_stable_decay", "--lr_scheduler_kwargs", text});
    EXPECT_THAT(message, HasSubstr("lr_scheduler_kwargs"));
    EXPECT_LT(message.size(), 600u) << message.substr(0, 600);
  }
  // parse() validates: a key the schedule does not take, and a bad value.
  EXPECT_THAT(parse_error({"--lr_scheduler_type", "cosine", "--lr_scheduler_kwargs",
                           R"({"min_lr": 1e-6})"}),
              HasSubstr("'min_lr': 1e-06 is not an argument of the cosine schedule (transformers' "
                        "get_cosine_schedule_with_warmup), which takes num_cycles"));
  EXPECT_THAT(parse_error({"--lr_scheduler_type", "inverse_sqrt", "--lr_scheduler_kwargs",
                           R"({"timescale": 0})"}),
              HasSubstr("timescale of the inverse_sqrt schedule must be at least 1"));
}

TEST(TrainingArgumentsTest, GradientCheckpointingFlags) {
  using mantissa::GradientCheckpointingKwargs;
  const auto a =
      TrainingArguments::parse({"--gradient_checkpointing", "--gradient_checkpointing_kwargs",
                                R"({"use_reentrant": true, "preserve_rng_state": false})"});
  EXPECT_TRUE(a.gradient_checkpointing());
  EXPECT_EQ(a.gradient_checkpointing_kwargs(), (GradientCheckpointingKwargs{true, false}));
  EXPECT_EQ(TrainingArguments::parse({"--gradient_checkpointing_kwargs", "{}"})
                .gradient_checkpointing_kwargs(),
            GradientCheckpointingKwargs{});
  EXPECT_FALSE(TrainingArguments::parse({"--gradient_checkpointing_kwargs", "None"})
                   .gradient_checkpointing_kwargs()
                   .has_value());
  // training_args.json holds an object, as HF writes the dict, and reads it back.
  const auto json = a.to_json();
  EXPECT_THAT(json, HasSubstr(R"("gradient_checkpointing_kwargs": {
    "use_reentrant": true,
    "preserve_rng_state": false
  })"));
  EXPECT_EQ(TrainingArguments::from_json(json), a);
  EXPECT_EQ(TrainingArguments::from_json(R"({"gradient_checkpointing_kwargs": null})"),
            TrainingArguments());
  EXPECT_THAT(TrainingArguments::help_text(), HasSubstr("--gradient_checkpointing_kwargs JSON"));

  EXPECT_THAT(parse_error({"--gradient_checkpointing_kwargs", R"({"use_reentrant": 1})"}),
              HasSubstr("--gradient_checkpointing_kwargs: 'use_reentrant' must be true or false, "
                        "got 1"));
  EXPECT_THAT(parse_error({"--gradient_checkpointing_kwargs", R"({"context_fn": "x"})"}),
              HasSubstr("--gradient_checkpointing_kwargs: unknown key 'context_fn'"));
  EXPECT_THAT(parse_error({"--gradient_checkpointing_kwargs", "use_reentrant=False"}),
              HasSubstr("--gradient_checkpointing_kwargs: invalid value 'use_reentrant=False' "
                        "(expected a JSON object such as '{\"use_reentrant\": false}'"));
  EXPECT_THAT(parse_error({"--gradient_checkpointing_kwargs", "[true]"}),
              HasSubstr("--gradient_checkpointing_kwargs: expected a JSON object"));
  EXPECT_THAT(
      value_error([] {
        TrainingArguments::from_json(R"({"gradient_checkpointing_kwargs": {"debug": true}})");
      }),
      HasSubstr("gradient_checkpointing_kwargs: unknown key 'debug'"));

  EXPECT_THAT(validate_error(TrainingArguments().gradient_checkpointing(true).cuda_graph(true)),
              HasSubstr("cuda_graph must be false"));
  EXPECT_THAT(validate_error(TrainingArguments().gradient_checkpointing(true).fp8(true).bf16(true)),
              HasSubstr("gradient_checkpointing with fp8"));
  EXPECT_EQ(validate_error(TrainingArguments().cuda_graph(true).gradient_checkpointing_kwargs(
                GradientCheckpointingKwargs{})),
            "<no exception>");
}

TEST(TrainingArgumentsTest, LrSchedulerKwargsJsonRoundTrip) {
  const auto a = TrainingArguments()
                     .lr_scheduler_type("cosine_warmup_with_min_lr")
                     .lr_scheduler_kwargs(
                         {{"min_lr_rate", 0.1}, {"num_cycles", 2}, {"warmup_lr_rate", 1.0 / 3.0}});
  const std::string text = a.to_json();
  EXPECT_THAT(text,
              HasSubstr("\"lr_scheduler_kwargs\": {\n    \"min_lr_rate\": 0.1,\n    "
                        "\"num_cycles\": 2,\n    \"warmup_lr_rate\": 0.3333333333333333\n  }"));
  const auto b = TrainingArguments::from_json(text);
  EXPECT_EQ(b, a);
  EXPECT_EQ(b.to_json(), text);
  EXPECT_TRUE(std::holds_alternative<int64_t>(b.lr_scheduler_kwargs().at("num_cycles")));
  EXPECT_EQ(std::get<double>(b.lr_scheduler_kwargs().at("warmup_lr_rate")), 1.0 / 3.0);
  // An integral float stays a float.
  const auto c =
      TrainingArguments().lr_scheduler_type("cosine").lr_scheduler_kwargs({{"num_cycles", 2.0}});
  EXPECT_THAT(c.to_json(), HasSubstr("\"num_cycles\": 2.0"));
  EXPECT_EQ(TrainingArguments::from_json(c.to_json()), c);
  EXPECT_THAT(TrainingArguments().to_json(), HasSubstr("\"lr_scheduler_kwargs\": {},"));
  // HF 5 writes its default None as null.
  EXPECT_EQ(TrainingArguments::from_json(R"({"lr_scheduler_kwargs": null})"), TrainingArguments());

  EXPECT_THAT(value_error([] { TrainingArguments::from_json(R"({"lr_scheduler_kwargs": "{}"})"); }),
              HasSubstr("lr_scheduler_kwargs: expected a JSON object of the schedule's arguments "
                        "(such as {\"num_cycles\": 2}), got \"{}\""));
  EXPECT_THAT(value_error([] {
                TrainingArguments::from_json(R"({"lr_scheduler_kwargs": {"num_cycles": null}})");
              }),
              HasSubstr("lr_scheduler_kwargs: 'num_cycles' must be a number or a string"));
  EXPECT_THAT(value_error([] {
                TrainingArguments::from_json(
                    R"({"lr_scheduler_type": "linear", "lr_scheduler_kwargs": {"power": 2}})");
              }),
              HasSubstr("'power': 2 is not an argument of the linear schedule"));
  EXPECT_EQ(value_error([] {
              TrainingArguments::from_json(
                  R"({"lr_scheduler_type": "linear", "lr_scheduler_kwargs": {"power": 2}})",
                  /*validate=*/false);
            }),
            "<no exception>");
  const double inf = std::numeric_limits<double>::infinity();
  EXPECT_THAT(
      value_error([&] {
        TrainingArguments().lr_scheduler_kwargs({{"num_cycles", inf}}).to_json();
      }),
      HasSubstr("to_json: lr_scheduler_kwargs 'num_cycles' is inf, which JSON cannot hold"));
}

TEST(TrainingArgumentsTest, FromJsonRejectsMalformedJson) {
  EXPECT_THAT(value_error([] { TrainingArguments::from_json("{\"seed\": "); }),
              HasSubstr("from_json: not valid JSON"));
  EXPECT_THAT(value_error([] { TrainingArguments::from_json("[1, 2]"); }),
              HasSubstr("expected a JSON object of TrainingArguments fields, got array"));
  // An out_of_range error of nlohmann's, not a parse error, and once not caught at all.
  EXPECT_THAT(
      value_error([] { TrainingArguments::from_json(R"({"learning_rate": 1e400})"); }),
      HasSubstr("from_json: not valid JSON: [json.exception.out_of_range.406] number overflow"));
}

TEST(TrainingArgumentsTest, FromJsonRefusesDeepNestingWithoutCrashing) {
  // The type error for "seed" used to print the value with nlohmann's recursive dump(), which
  // overflowed the stack at this depth. The nesting is now refused before parsing.
  const std::string deep =
      R"({"seed": )" + std::string(100'000, '[') + std::string(100'000, ']') + "}";
  EXPECT_THAT(
      value_error([&] { TrainingArguments::from_json(deep); }),
      HasSubstr("from_json: not valid JSON: arrays and objects nest deeper than 127 levels"));
  TempDir dir;
  const std::string path = dir.file("training_args.json");
  write_text(path, deep);
  const std::string message = value_error([&] { TrainingArguments::load_json(path); });
  EXPECT_THAT(message, HasSubstr(path));
  EXPECT_THAT(message, HasSubstr("nest deeper than 127 levels"));
}

TEST(TrainingArgumentsTest, Fp8AmaxHistoryHasAnUpperBound) {
  // 1e9 entries used to reach the allocation of the history (12 GB per layer) unchecked.
  EXPECT_THAT(parse_error({"--fp8_amax_history_len", "1000000000"}),
              HasSubstr("fp8_amax_history_len must be at most 4096 (four times "
                        "TransformerEngine's default of 1024), got 1000000000"));
  EXPECT_THAT(validate_error(TrainingArguments().fp8_amax_history_len(4097)),
              HasSubstr("fp8_amax_history_len must be at most 4096"));
  EXPECT_EQ(validate_error(TrainingArguments().fp8_amax_history_len(4096)), "<no exception>");
  EXPECT_THAT(validate_error(TrainingArguments().fp8_amax_history_len(0)),
              HasSubstr("fp8_amax_history_len must be at least 1, got 0"));
}

TEST(TrainingArgumentsTest, FromJsonRefusesNulBytes) {
  // nlohmann stops at a NUL and took the rest of the file for padding; Python's json refuses it.
  EXPECT_THAT(
      value_error([] { TrainingArguments::from_json(std::string("{\"seed\": 1}\0{junk", 17)); }),
      HasSubstr("from_json: not valid JSON: a NUL byte at offset 11"));
}

TEST(TrainingArgumentsTest, FromJsonMessagesStayShort) {
  std::string long_list = R"({"seed": [)";
  for (int i = 0; i < 100'000; ++i) long_list += i ? ",7" : "7";
  long_list += "]}";
  const std::string e1 = value_error([&] { TrainingArguments::from_json(long_list); });
  EXPECT_THAT(e1, HasSubstr("seed: expected an integer, got [7,7,7,"));
  EXPECT_LT(e1.size(), 300u);

  std::string many_keys = "{";
  for (int i = 0; i < 1000; ++i)
    many_keys += (i ? ",\"" : "\"") + std::string(200, 'k') + std::to_string(i) + "\":1";
  many_keys += "}";
  const std::string e2 = value_error([&] { TrainingArguments::from_json(many_keys); });
  EXPECT_THAT(e2, HasSubstr("unknown keys '" + std::string(60, 'k') + "...'"));
  EXPECT_THAT(e2, HasSubstr(" and 995 more: TrainingArguments has no such field"));
  EXPECT_LT(e2.size(), 600u);
}

TEST(TrainingArgumentsTest, FromJsonValidatesUnlessAskedNot) {
  const std::string text = R"({"learning_rate": -1, "tf32": true})";
  EXPECT_THAT(value_error([&] { TrainingArguments::from_json(text); }),
              HasSubstr("learning_rate must be non-negative, got -1.0"));
  const auto a = TrainingArguments::from_json(text, /*validate=*/false);
  EXPECT_EQ(a.learning_rate(), -1.0);
  EXPECT_EQ(a.tf32(), std::optional<bool>(true));
}

TEST(TrainingArgumentsTest, ToJsonRejectsNonFinite) {
  EXPECT_THAT(
      value_error([] {
        TrainingArguments().learning_rate(std::numeric_limits<double>::quiet_NaN()).to_json();
      }),
      HasSubstr("to_json: learning_rate is nan, which JSON cannot hold"));
  EXPECT_THAT(
      value_error([] {
        TrainingArguments().max_loss_scale(std::numeric_limits<double>::infinity()).to_json();
      }),
      HasSubstr("to_json: max_loss_scale is inf"));
}

TEST(TrainingArgumentsTest, SaveAndLoadFile) {
  TempDir dir;
  const std::string path = dir.file("training_args.json");
  const auto a =
      TrainingArguments().learning_rate(0.1).save_total_limit(5).fp16(true).use_cpu(true);
  a.save_json(path);
  EXPECT_EQ(TrainingArguments::load_json(path), a);
  // Nothing but the file itself is left behind (the temporary was renamed over it).
  EXPECT_THAT(dir.entries(), ElementsAre("training_args.json"));
  // Saving again replaces the content.
  const auto b = TrainingArguments().seed(1);
  b.save_json(path);
  EXPECT_EQ(TrainingArguments::load_json(path), b);
  EXPECT_THAT(dir.entries(), ElementsAre("training_args.json"));
  std::ifstream in(path);
  const std::string content((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(content, b.to_json() + "\n");
}

TEST(TrainingArgumentsTest, LoadErrorsNameThePath) {
  TempDir dir;
  const std::string missing = dir.file("nope.json");
  try {
    TrainingArguments::load_json(missing);
    ADD_FAILURE() << "no exception";
  } catch (const c10::Error& e) {
    EXPECT_THAT(e.what_without_backtrace(), HasSubstr(missing));
  }

  const std::string corrupt = dir.file("corrupt.json");
  write_text(corrupt, "{\"seed\": 1,");
  const std::string e1 = value_error([&] { TrainingArguments::load_json(corrupt); });
  EXPECT_THAT(e1, HasSubstr(corrupt));
  EXPECT_THAT(e1, HasSubstr("not valid JSON"));

  const std::string bad = dir.file("bad.json");
  write_text(bad, R"({"per_device_train_batch_size": 0})");
  const std::string e2 = value_error([&] { TrainingArguments::load_json(bad); });
  EXPECT_THAT(e2, HasSubstr(bad));
  EXPECT_THAT(e2, HasSubstr("per_device_train_batch_size must be positive, got 0"));
  EXPECT_EQ(TrainingArguments::load_json(bad, /*validate=*/false).per_device_train_batch_size(), 0);
}

TEST(TrainingArgumentsTest, SaveErrorNamesThePath) {
  TempDir dir;
  const std::string path = dir.file("no/such/dir/training_args.json");
  try {
    TrainingArguments().save_json(path);
    ADD_FAILURE() << "no exception";
  } catch (const c10::Error& e) {
    EXPECT_THAT(e.what_without_backtrace(), HasSubstr(path));
  }
}

}  // namespace
