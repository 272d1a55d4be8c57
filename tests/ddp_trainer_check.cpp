// The Trainer across several real processes over Gloo on 127.0.0.1. One executable plays every
// part:
//
//   ddp_trainer_check worker --results FILE [worker options] [TrainingArguments flags]
//     one training run: a small MLP on a fixed classification problem through mantissa's
//     Trainer. Alone it trains as one process; with the launcher's variables set (RANK,
//     WORLD_SIZE, ...) as one rank of a data-parallel job. Writes the final weights, the loss
//     scale after every step and (with --eval N) the evaluation's metrics and predictions into
//     FILE, a safetensors file (rank r of several writes FILE.rank<r>).
//   ddp_trainer_check check SCENARIO [--deadline-s S] [--torchrun PATH] [--python PATH]
//                                     [--reference SCRIPT]
//     starts the workers a scenario needs (as separate processes) and compares what they wrote;
//     prints "check: PASSED" when everything came out as it must. The scenarios are the
//     branches of `run_check` below (and tests/CMakeLists.txt's list). A scenario that cannot
//     run here (torchrun missing) prints "check: SKIPPED, <why>" and exits with 77, which
//     CTest reports as a skip.
//
// The worker and the launcher are in trainer_check_common.h (with the worker's options).
#include "trainer_check_common.h"

namespace {

using namespace trainer_check;

// The newest checkpoint-<N> in `dir`: N, or -1 when there is none.
std::int64_t latest_checkpoint_step(const std::string& dir) {
  std::int64_t latest = -1;
  if (!mantissa::io::is_directory(dir)) return latest;
  for (const auto& name : mantissa::io::list_directory(dir)) {
    if (name.rfind("checkpoint-", 0) != 0) continue;
    char* end = nullptr;
    const auto step = std::strtoll(name.c_str() + 11, &end, 10);
    if (end != nullptr && *end == '\0') latest = std::max<std::int64_t>(latest, step);
  }
  return latest;
}

// 8 steps at 2 ranks in one go against 4 + a resume from checkpoint-4 at 2 ranks, with
// `extra` flags (an optimizer and its model): the resumed ranks end bitwise where the
// uninterrupted ones did.
bool check_resume_bitwise(const Launch& l, const std::vector<std::string>& extra,
                          const std::string& tag) {
  const std::vector<std::string> flags =
      std::vector<std::string>{"--dropout", "0.2",          "--per_device_train_batch_size",
                               "32",        "--save_steps", "4"} +
      extra;
  const auto run = [&](const std::string& name, const std::vector<std::string>& more) {
    const auto out = l.dir + "/" + tag + "-" + name;
    return all_zero(run_ranks(
        l, 2,
        flags + common_flags(out) +
            std::vector<std::string>{"--save_strategy", "steps", "--results", out + ".st"} + more,
        out));
  };
  bool ok = run("full", {});
  ok &=
      ok && run("resumed", {"--resume_from_checkpoint", l.dir + "/" + tag + "-full/checkpoint-4"});
  for (int r = 0; ok && r < 2; ++r) {
    const auto suffix = ".st.rank" + std::to_string(r);
    ok &=
        same_weights(load_results(l.dir + "/" + tag + "-full" + suffix),
                     load_results(l.dir + "/" + tag + "-resumed" + suffix), 0, 0,
                     tag + ": uninterrupted vs resumed, rank " + std::to_string(r) + " (bitwise)");
  }
  return ok;
}

// What torchrun does on Ctrl-C: SIGTERM to every rank, here while both save a checkpoint at
// every step (two kept). Each checkpoint-<N> left behind is whole, and the job resumes from
// the latest and finishes.
bool check_sigterm(const Launch& l) {
  const auto out = l.dir + "/out";
  const auto flags = common_flags(out) + std::vector<std::string>{"--results",
                                                                  l.dir + "/r.st",
                                                                  "--per_device_train_batch_size",
                                                                  "32",
                                                                  "--save_strategy",
                                                                  "steps",
                                                                  "--save_steps",
                                                                  "1",
                                                                  "--save_total_limit",
                                                                  "2",
                                                                  "--max_steps",
                                                                  "1000000",
                                                                  "--logging_steps",
                                                                  "1000000"};
  const auto port = mt::free_port();
  const auto base = mt::environment_without_launcher_variables();
  std::vector<pid_t> pids;
  for (int rank = 0; rank < 2; ++rank) {
    auto env = base;
    for (const auto& kv : mt::rank_variables(rank, 2, port)) env.push_back(kv);
    std::vector<std::string> args = {"trainer_check", "worker"};
    args.insert(args.end(), flags.begin(), flags.end());
    pids.push_back(
        mt::start_process(l.self, args, env, l.dir + "/term.rank" + std::to_string(rank) + ".log"));
  }
  bool signalled = false;
  const auto status = mt::wait_for(pids, l.deadline_s, [&](const std::vector<int>&) {
    if (signalled || latest_checkpoint_step(out) < 5) return;
    for (const auto pid : pids) ::kill(pid, SIGTERM);
    signalled = true;
  });
  std::cout << "SIGTERM sent: " << signalled << "; exit statuses " << status[0] << ", " << status[1]
            << std::endl;
  bool ok = signalled && status[0] != -1 && status[1] != -1;
  int whole = 0;
  for (const auto& name : mantissa::io::list_directory(out)) {
    if (name.rfind("checkpoint-", 0) != 0) continue;
    for (const char* file : {"model.safetensors", "optimizer.pt", "scheduler.pt",
                             "trainer_state.json", "rng_state_0.pth", "rng_state_1.pth"}) {
      const bool there = mantissa::io::path_exists(out + "/" + name + "/" + file);
      if (!there) std::cout << name << "/" << file << " MISSING" << std::endl;
      ok &= there;
    }
    ++whole;
  }
  const auto latest = latest_checkpoint_step(out);
  std::cout << whole << " checkpoint(s) left, the latest at step " << latest << std::endl;
  ok &= whole >= 1 && latest >= 5;
  const auto resumed = run_ranks(
      l, 2,
      common_flags(out) + std::vector<std::string>{"--results", l.dir + "/resumed.st",
                                                   "--per_device_train_batch_size", "32",
                                                   "--resume_from_checkpoint", "latest",
                                                   "--max_steps", std::to_string(latest + 3)},
      l.dir + "/resumed");
  ok &= all_zero(resumed);
  return ok;
}

int run_check(const std::string& scenario, Launch l) {
  const char* tmp = std::getenv("TMPDIR");
  l.dir = mantissa::io::make_temp_directory(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp",
                                            "mantissa-ddp-" + scenario + "-");
  std::cout << "check: " << scenario << " in " << l.dir << std::endl;
  bool ok = false;
  if (scenario == "fp32") {
    ok = check_equivalence(l, {}, 32, 1e-5, /*compare_eval=*/true);
  } else if (scenario == "accumulation") {
    ok = check_equivalence(l, {"--gradient_accumulation_steps", "2"}, 16, 1e-5, false);
  } else if (scenario == "bf16_masters") {
    ok = check_equivalence(l, {"--model_dtype", "bf16", "--bf16"}, 32, 3e-2, true);
  } else if (scenario == "fp8") {
    // One FP8 layer under the delayed recipe. The ranks see other examples, so their own input
    // amaxes differ; the all-reduce (max) before each update gives both the same history and
    // scales, bit for bit, and the run stays the one process's within bf16's tolerance.
    ok = check_equivalence(l, {"--middle", "32", "--bf16", "--fp8", "--fp8_amax_history_len", "16"},
                           32, 3e-2, false);
    const auto rank0 = load_results(l.dir + "/two.safetensors.rank0");
    const auto rank1 = load_results(l.dir + "/two.safetensors.rank1");
    for (const char* name : {"fp8.amax_history", "fp8.scale"}) {
      ok &= same_tensor(rank0, rank1, name, 0, 0, "rank 0 vs rank 1");
    }
    if (rank0.count("fp8.scale") != 0) {
      std::cout << "FP8 scales of rank 0: " << rank0.at("fp8.scale") << std::endl;
      ok &= rank0.at("fp8.scale").ne(1.0).all().item<bool>();  // updated from their start
    }
  } else if (scenario == "fp16_compress" || scenario == "bf16_compress") {
    // Gradients summed in 16 bits: close to the fp32 run, not equal. With SGD, whose step is
    // proportional to the gradient (Adam's is not), a bucket averaged wrongly would show.
    ok = check_equivalence(
        l, {"--ddp_comm_hook", scenario, "--optim", "sgd", "--learning_rate", "0.1"}, 32,
        scenario == "fp16_compress" ? 5e-5 : 5e-4, false);
  } else if (scenario == "optim_adafactor" || scenario == "optim_muon") {
    // The optimizers of docs/optimizers.md hold whole tensors on every rank: two ranks at half
    // the batch each are the one process at the whole batch, as AdamW's are (fp32 above).
    ok = check_equivalence(l, {"--optim", scenario.substr(6)}, 32, 1e-5, false);
    ok &= check_resume_bitwise(l, {"--optim", scenario.substr(6)}, "resume");
  } else if (scenario == "optim_adamw_torch_8bit") {
    // fc1 (20 x 256) is quantised. The ranks stay bitwise equal; against one process, the
    // gradient averaged in another order can put a moment on the other side of a code boundary,
    // a change of one quantisation level (a few percent of that element's step), so the
    // tolerance is the size of such a step at this learning rate rather than fp32 rounding's
    // (measured: 5.5e-5 in fc1.weight; 3e-7 in the unquantised fc2.weight).
    ok = check_equivalence(l, {"--optim", "adamw_torch_8bit", "--hidden", "256"}, 32, 2e-4, false);
    ok &= check_resume_bitwise(l, {"--optim", "adamw_torch_8bit", "--hidden", "256"}, "resume");
  } else if (scenario == "fp16_loss_scaling") {
    // A first scale of 2^24 overflows the fp16 gradients: the first steps are skipped while
    // it backs off, then it trains.
    ok = check_equivalence(l, {"--fp16", "--initial_scale_power", "24", "--max_steps", "12"}, 32,
                           1e-3, false);
    const auto scales = load_results(l.dir + "/two.safetensors.rank0").at("scales");
    std::cout << "loss scales of rank 0: " << scales << std::endl;
    const double first = scales[0].item<double>();
    const double last = scales[-1].item<double>();
    ok &= first < std::ldexp(1.0, 24) && last == scales[-2].item<double>() && last >= 1024;
  } else if (scenario == "resume") {
    // 8 steps in one go against 4 + a resume from checkpoint-4 (with dropout, so the random
    // states matter); only rank 0 writes the shared output_dir.
    const std::vector<std::string> flags = {
        "--dropout",    "0.2", "--per_device_train_batch_size", "32", "--save_strategy", "steps",
        "--save_steps", "4"};
    const auto full_dir = l.dir + "/full";
    auto status = run_ranks(
        l, 2,
        flags + common_flags(full_dir) +
            std::vector<std::string>{"--save_strategy", "steps", "--results", l.dir + "/full.st"},
        l.dir + "/full");
    ok = all_zero(status);
    const auto checkpoint = full_dir + "/checkpoint-4";
    for (const char* file : {"rng_state_0.pth", "rng_state_1.pth", "model.safetensors",
                             "optimizer.pt", "trainer_state.json"}) {
      const bool there = mantissa::io::path_exists(checkpoint + "/" + file);
      std::cout << "checkpoint-4/" << file << (there ? " written" : " MISSING") << std::endl;
      ok &= there;
    }
    ok &= !mantissa::io::path_exists(checkpoint + "/rng_state.pth");
    // One trainer_log.jsonl line per step (plus the summary): rank 1 wrote none of its own.
    const auto log = read_text(full_dir + "/trainer_log.jsonl");
    const auto lines = std::count(log.begin(), log.end(), '\n');
    std::cout << "trainer_log.jsonl has " << lines << " lines" << std::endl;
    ok &= lines == 9;
    status = run_ranks(
        l, 2,
        flags + common_flags(l.dir + "/resumed") +
            std::vector<std::string>{"--save_strategy", "steps", "--resume_from_checkpoint",
                                     checkpoint, "--results", l.dir + "/resumed.st"},
        l.dir + "/resumed");
    ok &= all_zero(status);
    // The same checkpoint continued by one process at twice the batch (the same global batch,
    // as an elastic job does): it trains on, and warns that the examples and random states now
    // differ from the uninterrupted run's.
    const auto alone = l.dir + "/alone.log";
    ok &=
        run_alone(l,
                  common_flags(l.dir + "/alone") +
                      std::vector<std::string>{"--dropout", "0.2", "--per_device_train_batch_size",
                                               "64", "--resume_from_checkpoint", checkpoint,
                                               "--results", l.dir + "/alone.st"},
                  alone) == 0;
    ok &= contains(read_text(alone), "which a run of 2 process(es) saved, with 1 process(es)",
                   "the lone process's warning");
    ok &= contains(read_text(alone), "is 64 x 1 x 1 = 64 now and was 32 x 2 x 1 = 64",
                   "the lone process's warning");
    // A lone process's checkpoint (rng_state.pth) continued by 2 ranks: rank 0 restores that
    // file, rank 1 (which the saving run did not have) starts its random state afresh.
    ok &= run_alone(l,
                    flags + common_flags(l.dir + "/lone") +
                        std::vector<std::string>{"--save_strategy", "steps", "--results",
                                                 l.dir + "/lone.st"},
                    l.dir + "/lone.log") == 0;
    status = run_ranks(
        l, 2,
        flags + common_flags(l.dir + "/from-lone") +
            std::vector<std::string>{"--resume_from_checkpoint", l.dir + "/lone/checkpoint-4",
                                     "--results", l.dir + "/from-lone.st"},
        l.dir + "/from-lone");
    ok &= all_zero(status);
    ok &= contains(read_text(l.dir + "/from-lone.rank0.log"),
                   "which a run of 1 process(es) saved, with 2 process(es)", "rank 0's warning");
    ok &= contains(read_text(l.dir + "/from-lone.rank1.log"), "process 1 was not among them",
                   "rank 1's warning");
    if (ok) {
      for (int r = 0; r < 2; ++r) {
        const auto suffix = ".rank" + std::to_string(r);
        ok &= same_weights(load_results(l.dir + "/full.st" + suffix),
                           load_results(l.dir + "/resumed.st" + suffix), 0, 0,
                           "uninterrupted vs resumed, rank " + std::to_string(r) + " (bitwise)");
      }
    }
    // Rank 1's random state deleted: the files left still say 2 processes saved it, so rank 1
    // names the missing file and rank 0 stops with it.
    mantissa::io::remove_all(checkpoint + "/rng_state_1.pth");
    status = run_ranks(l, 2,
                       flags + common_flags(l.dir + "/lost") +
                           std::vector<std::string>{"--resume_from_checkpoint", checkpoint,
                                                    "--results", l.dir + "/lost.st"},
                       l.dir + "/lost");
    ok &= status[0] != 0 && status[1] != 0 && status[0] != -1 && status[1] != -1;
    ok &= contains(read_text(l.dir + "/lost.rank1.log"),
                   "rng_state_1.pth' is missing: 2 process(es) saved", "rank 1's error");
    ok &= contains(read_text(l.dir + "/lost.rank0.log"), "another process could not load it",
                   "rank 0's error");
  } else if (scenario == "sigterm") {
    ok = check_sigterm(l);
  } else if (scenario == "rank_killed") {
    const auto status = run_ranks(
        l, 2,
        std::vector<std::string>{"--results", l.dir + "/r.st", "--die-on-rank", "1",
                                 "--die-at-step", "3", "--per_device_train_batch_size", "32"} +
            common_flags(l.dir + "/out") +
            // No log line to sum over the ranks: the survivor finds out in the gradient sync.
            std::vector<std::string>{"--max_steps", "100000", "--logging_steps", "100000"},
        l.dir + "/killed");
    ok = status[1] == 128 + SIGKILL && status[0] != 0 && status[0] != -1;
    ok &= contains(read_text(l.dir + "/killed.rank0.log"), "rank 0 of 2", "rank 0's error");
  } else if (scenario == "mismatched_arguments") {
    const auto status = run_ranks(
        l, 2, std::vector<std::string>{"--results", l.dir + "/r.st"} + common_flags(l.dir + "/out"),
        l.dir + "/args", [](int rank) {
          // The worker count only says how a process loads its data: it may differ.
          return rank == 1 ? std::vector<std::string>{"--learning_rate", "0.5",
                                                      "--dataloader_num_workers", "1"}
                           : std::vector<std::string>{};
        });
    ok = status[0] != 0 && status[1] != 0 && status[0] != -1 && status[1] != -1;
    ok &= contains(read_text(l.dir + "/args.rank0.log"), "rank(s) 1 differ from rank 0",
                   "rank 0's error");
    ok &= contains(read_text(l.dir + "/args.rank1.log"), "learning_rate: 0.5", "rank 1's error");
    ok &=
        !contains(read_text(l.dir + "/args.rank1.log"), "dataloader_num_workers", "rank 1's error");
  } else if (scenario == "gradient_checkpointing") {
    // With the search for unused parameters on (the default) both ranks refuse; with it off,
    // two ranks that recompute the first layer end with the weights of one process.
    const auto status = run_ranks(
        l, 2,
        std::vector<std::string>{"--results", l.dir + "/r.st", "--gradient_checkpointing"} +
            common_flags(l.dir + "/out"),
        l.dir + "/gc");
    ok = status[0] != 0 && status[1] != 0 && status[0] != -1 && status[1] != -1;
    for (int r = 0; r < 2; ++r) {
      ok &= contains(read_text(l.dir + "/gc.rank" + std::to_string(r) + ".log"),
                     "--gradient_checkpointing across 2 processes needs "
                     "--ddp_find_unused_parameters false",
                     "rank " + std::to_string(r) + "'s error");
    }
    ok = ok &&
         check_equivalence(l, {"--gradient_checkpointing", "--ddp_find_unused_parameters", "false"},
                           32, 1e-5, false);
  } else if (scenario == "mismatched_model") {
    const auto status = run_ranks(
        l, 2, std::vector<std::string>{"--results", l.dir + "/r.st"} + common_flags(l.dir + "/out"),
        l.dir + "/model", [](int rank) {
          return rank == 1 ? std::vector<std::string>{"--hidden", "33"}
                           : std::vector<std::string>{};
        });
    ok = status[0] != 0 && status[1] != 0 && status[0] != -1 && status[1] != -1;
    for (int r = 0; r < 2; ++r) {
      ok &= contains(read_text(l.dir + "/model.rank" + std::to_string(r) + ".log"),
                     "built different models", "rank " + std::to_string(r) + "'s error");
    }
  } else if (scenario == "output_dir_refused") {
    // Rank 0 refuses an output_dir another run wrote; rank 1 (which never checks it) must stop
    // too instead of waiting in the first collective of training.
    const auto out = l.dir + "/taken";
    mantissa::io::create_directories(out);
    std::ofstream(out + "/left_by_another_run.txt") << "x";
    auto flags = common_flags(out);
    flags.erase(std::find(flags.begin(), flags.end(), "--overwrite_output_dir"));
    const auto status = run_ranks(
        l, 2, std::vector<std::string>{"--results", l.dir + "/r.st"} + flags, l.dir + "/dir");
    ok = status[0] != 0 && status[1] != 0 && status[0] != -1 && status[1] != -1;
    ok &= contains(read_text(l.dir + "/dir.rank0.log"), "already exists and is not empty",
                   "rank 0's error");
    ok &= contains(read_text(l.dir + "/dir.rank1.log"), "another process refused the output_dir",
                   "rank 1's error");
  } else if (scenario == "port_in_use") {
    // Another program listens on MASTER_PORT: rank 0 cannot host the store and says so; rank 1
    // reaches that program instead and gives up after ddp_timeout.
    const int blocker = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    ::bind(blocker, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    ::listen(blocker, 8);
    ::getsockname(blocker, reinterpret_cast<sockaddr*>(&addr), &len);
    const auto status =
        run_ranks(l, 2,
                  std::vector<std::string>{"--results", l.dir + "/r.st"} +
                      common_flags(l.dir + "/out") + std::vector<std::string>{"--ddp_timeout", "5"},
                  l.dir + "/port", {}, ntohs(addr.sin_port));
    ::close(blocker);
    ok = status[0] != 0 && status[1] != 0 && status[0] != -1 && status[1] != -1;
    ok &= contains(read_text(l.dir + "/port.rank0.log"),
                   "cannot host the job's store on 127.0.0.1:", "rank 0's error");
    ok &= contains(read_text(l.dir + "/port.rank1.log"), "cannot reach the job's store",
                   "rank 1's error");
  } else if (scenario == "torchrun") {
    // The same job started by torchrun --no-python (its agent hosts the store).
    if (l.torchrun.empty() || !mantissa::io::path_exists(l.torchrun)) {
      std::cout << "check: SKIPPED, no torchrun at '" << l.torchrun << "'" << std::endl;
      return kSkipped;
    }
    const auto one = l.dir + "/one.st";
    ok = run_alone(
             l,
             std::vector<std::string>{"--results", one, "--per_device_train_batch_size", "64"} +
                 common_flags(l.dir + "/out-one"),
             l.dir + "/one.log") == 0;
    const auto port = std::to_string(mt::free_port());
    std::vector<std::string> args = {"torchrun",
                                     "--no-python",
                                     "--nproc_per_node",
                                     "2",
                                     "--master_addr",
                                     "127.0.0.1",
                                     "--master_port",
                                     port,
                                     l.self,
                                     "worker",
                                     "--results",
                                     l.dir + "/two.st",
                                     "--per_device_train_batch_size",
                                     "32"};
    args = args + common_flags(l.dir + "/out-two");
    auto env = mt::environment_without_launcher_variables();
    env.push_back("GLOO_SOCKET_IFNAME=lo");
    const auto pid = mt::start_process(l.torchrun, args, env, l.dir + "/torchrun.log");
    const auto status = mt::wait_for({pid}, l.deadline_s);
    std::cout << "---- torchrun (exit " << status[0] << ")\n"
              << read_text(l.dir + "/torchrun.log") << std::flush;
    ok &= status[0] == 0;
    if (ok) {
      ok &= same_weights(load_results(one), load_results(l.dir + "/two.st.rank0"), 1e-4, 1e-5,
                         "1 process x 64 vs torchrun 2 x 32");
      ok &= same_weights(load_results(l.dir + "/two.st.rank0"),
                         load_results(l.dir + "/two.st.rank1"), 0, 0, "rank 0 vs rank 1");
    }
  } else if (scenario == "pytorch_parity") {
    // PyTorch's DistributedDataParallel under torchrun against mantissa's 2 ranks, on the same
    // data, initial weights, order and step.
    const auto agreed = check_pytorch_parity(
        l, {}, {"--optim", "adamw_torch", "--ddp_find_unused_parameters", "false"},
        "PyTorch DDP vs mantissa");
    if (!agreed) return kSkipped;
    ok = *agreed;
  } else {
    std::cout << "check: unknown scenario '" << scenario << "'" << std::endl;
    return 2;
  }
  std::cout << "check: " << (ok ? "PASSED" : "FAILED") << std::endl;
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) { return trainer_check_main(argc, argv, run_check); }
