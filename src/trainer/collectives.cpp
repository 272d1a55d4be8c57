#include "trainer/collectives.h"

#include "checked_math.h"
#include "io/json_reader.h"
#include "trainer/resume_check.h"

#include <algorithm>
#include <cstring>
#include <mutex>

#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/StringUtil.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>
#include <torch/csrc/distributed/c10d/comm.hpp>
#include <torch/csrc/distributed/c10d/reducer.hpp>

namespace mantissa::detail {
namespace {

// DDP's broadcast_bucket_size for _sync_module_states.
constexpr std::size_t kBroadcastBucketBytes = 250 * 1024 * 1024;

// The fields whose values differ between two training_args.json texts, each as
// "name: <here> (rank 0: <there>)".
std::vector<std::string> differing_fields(const std::string& mine, const std::string& rank0) {
  // rank0 came over the wire; both are to_json()'s, read as any other JSON text is.
  const auto a = io::parse_json_text<nlohmann::json>(mine);
  const auto b = io::parse_json_text<nlohmann::json>(rank0);
  std::vector<std::string> out;
  for (const auto& [key, value] : a.items()) {
    if (is_execution_detail(key)) continue;  // output_dir, workers, ... may differ per process
    const auto other = b.find(key);
    if (other == b.end() || *other != value) {
      out.push_back(
          fmt::format("{}: {} (rank 0: {})", key, io::describe_json(value),
                      other == b.end() ? std::string("missing") : io::describe_json(*other)));
    }
  }
  return out;
}

// `bytes` in a host tensor of `length` bytes (>= its size), zero-padded: what the collectives
// of bytes send.
torch::Tensor byte_tensor(const std::string& bytes, std::int64_t length) {
  auto data = torch::zeros({length}, torch::kUInt8);
  std::memcpy(data.data_ptr(), bytes.data(), bytes.size());
  return data;
}

// The first `length` bytes of `tensor` (uint8, on any device).
std::string string_of(const torch::Tensor& tensor, std::int64_t length) {
  const auto host = tensor.cpu();
  return std::string(static_cast<const char*>(host.data_ptr()), static_cast<std::size_t>(length));
}

}  // namespace

std::shared_ptr<Collectives> Collectives::join_if_launched(distributed::DistributedEnvironment env,
                                                           const TrainingArguments& args,
                                                           const c10::Device& device) {
  if (!env.is_distributed()) return nullptr;
  const auto backend = args.resolved_ddp_backend(device);
  static std::mutex mutex;
  // Kept until the process exits and never destroyed: a process group torn down by static
  // destructors, after LibTorch's own statics are gone, can crash at exit.
  static auto* const joined_slot = new std::shared_ptr<Collectives>();
  auto& joined = *joined_slot;
  const std::lock_guard<std::mutex> lock(mutex);
  if (joined) {
    TORCH_CHECK_VALUE(joined->backend() == backend, "this process already joined its job with ",
                      "ddp_backend ", distributed::backend_name(joined->backend()),
                      "; a later Trainer cannot use ", distributed::backend_name(backend));
    return joined;
  }
  TORCH_CHECK_VALUE(backend != distributed::Backend::kNccl || device.is_cuda(),
                    "ddp_backend nccl needs a CUDA device, ", "but this run trains on ",
                    device.str(), "; use ddp_backend gloo (or leave it unset) for the CPU");
  // NCCL binds to the current device; without this every rank would use cuda:0.
  if (device.is_cuda()) c10::impl::getDeviceGuardImpl(c10::kCUDA)->setDevice(device);
  const auto timeout = std::chrono::seconds(args.ddp_timeout());
  auto group = distributed::init_process_group(env, backend, timeout);
  joined = std::make_shared<Collectives>(
      std::move(env), backend, std::move(group),
      backend == distributed::Backend::kNccl ? device : c10::Device(c10::kCPU), timeout);
  return joined;
}

Collectives::Collectives(distributed::DistributedEnvironment env, distributed::Backend backend,
                         c10::intrusive_ptr<c10d::ProcessGroup> group, c10::Device device,
                         std::chrono::milliseconds timeout)
    : env_(std::move(env)),
      backend_(backend),
      group_(std::move(group)),
      device_(device),
      timeout_(timeout) {}

std::string Collectives::failure_message(const char* what, const std::string& cause) const {
  return fmt::format(
      "rank {} of {}: {} failed: {}. {} most likely exited or stopped responding (a process "
      "waits at most ddp_timeout = {} s); look at its output for the first error",
      rank(), world_size(), what, cause, kFailureMark,
      std::chrono::duration_cast<std::chrono::seconds>(timeout_).count());
}

bool Collectives::is_collective_failure(const std::exception& error) {
  if (dynamic_cast<const c10::DistError*>(&error) != nullptr) return true;
  const std::string text = error.what();
  if (text.find(kFailureMark) != std::string::npos) return false;  // named by us already
  for (const char* mark : {"gloo", "Gloo", "NCCL", "Connection closed", "Connection reset",
                           "Timed out", "timed out"}) {
    if (text.find(mark) != std::string::npos) return true;
  }
  return false;
}

void Collectives::check_same_arguments(const TrainingArguments& args) const {
  const auto mine = args.to_json();
  const auto rank0 = broadcast_bytes(mine);
  const auto differences =
      mine == rank0 ? std::vector<std::string>() : differing_fields(mine, rank0);
  const auto differ = differing_ranks(!differences.empty());
  if (differ.empty()) return;
  TORCH_CHECK_VALUE(
      false, "the processes of this job were given different TrainingArguments: rank(s) ", differ,
      " differ from rank 0",
      differences.empty()
          ? std::string()
          : fmt::format(" (here, on rank {}: {})", rank(), c10::Join("; ", differences)),
      ". Every process must run with the same arguments");
}

void Collectives::check_same_parameters(const torch::nn::Module& module) const {
  // One line per parameter, "name [shape] dtype"; compared with rank 0's on every rank, so that
  // every rank stops (c10d::verify_params_across_processes raises on the differing ranks only,
  // and rank 0 would then wait for them in the next collective).
  std::vector<std::string> mine;
  for (const auto& item : module.named_parameters()) {
    const auto& p = item.value();
    mine.push_back(fmt::format("{} [{}] {}{}", item.key(), fmt::join(p.sizes(), ", "),
                               c10::toString(p.scalar_type()),
                               p.requires_grad() ? "" : " (frozen)"));
  }
  const auto text = c10::Join("\n", mine);
  const auto rank0_text = broadcast_bytes(text);
  const auto differ = differing_ranks(text != rank0_text);
  if (differ.empty()) return;
  std::string here;
  if (text != rank0_text) {
    const auto rank0 = c10::split(rank0_text, '\n');
    std::size_t i = 0;
    while (i < mine.size() && i < rank0.size() && mine[i] == rank0[i]) ++i;
    here =
        fmt::format(" (here, on rank {}: parameter {} is {}, on rank 0 {})", rank(), i,
                    i < mine.size() ? mine[i] : "missing", i < rank0.size() ? rank0[i] : "missing");
  }
  TORCH_CHECK_VALUE(false, "the processes of this job built different models: rank(s) ", differ,
                    " differ from rank 0 in their parameters' number, "
                    "names, shapes, dtypes or requires_grad",
                    here, ". Every process must build the same model");
}

void Collectives::check_same_text(const std::string& value, const std::string& what) const {
  const auto rank0 = broadcast_bytes(value);
  const auto differ = differing_ranks(value != rank0);
  if (differ.empty()) return;
  TORCH_CHECK_VALUE(false, "the processes of this job disagree about ", what, ": rank(s) ", differ,
                    " differ from rank 0's '", rank0, "' (rank ", rank(), " has '", value, "')");
}

void Collectives::broadcast_module_states(torch::nn::Module& module, bool with_buffers,
                                          std::size_t bucket_bytes) const {
  std::vector<torch::Tensor> states;
  for (const auto& p : module.parameters()) states.push_back(p.detach());
  if (with_buffers) {
    for (const auto& b : module.buffers()) states.push_back(b.detach());
  }
  if (states.empty()) return;
  guarded("copying rank 0's model to every process",
          [&] { c10d::broadcast_coalesced(group_, states, bucket_bytes, /*rank=*/0); });
}

void Collectives::broadcast_tensors(const std::vector<torch::Tensor>& tensors,
                                    std::int64_t root) const {
  if (tensors.empty()) return;
  guarded("copying one process's tensors to every process", [&] {
    c10d::broadcast_coalesced(group_, tensors, kBroadcastBucketBytes, static_cast<int>(root));
  });
}

std::string Collectives::broadcast_bytes(const std::string& bytes, std::int64_t root) const {
  return guarded("copying one process's bytes to every process", [&] {
    const auto on = torch::TensorOptions().device(device_);
    c10d::BroadcastOptions options;
    options.rootRank = root;
    std::vector<torch::Tensor> size{
        torch::full({1}, static_cast<std::int64_t>(bytes.size()), on.dtype(torch::kLong))};
    group_->broadcast(size, options)->wait();
    const auto n = size[0].item<std::int64_t>();
    std::vector<torch::Tensor> payload{
        (rank() == root ? byte_tensor(bytes, n) : torch::empty({n}, torch::kUInt8)).to(device_)};
    group_->broadcast(payload, options)->wait();
    return string_of(payload[0], n);
  });
}

std::vector<std::string> Collectives::gather_bytes(const std::string& bytes) const {
  return guarded("gathering every process's bytes on rank 0", [&] {
    const auto on = torch::TensorOptions().device(device_);
    const auto world = world_size();
    std::vector<torch::Tensor> mine{
        torch::full({1}, static_cast<std::int64_t>(bytes.size()), on.dtype(torch::kLong))};
    std::vector<std::vector<torch::Tensor>> sizes(1);
    for (std::int64_t r = 0; r < world; ++r) sizes[0].push_back(torch::empty_like(mine[0]));
    group_->allgather(sizes, mine)->wait();
    const auto all_sizes = torch::cat(sizes[0]).cpu();  // one copy to the host
    const std::vector<std::int64_t> lengths(all_sizes.data_ptr<std::int64_t>(),
                                            all_sizes.data_ptr<std::int64_t>() + world);
    const auto longest = *std::max_element(lengths.begin(), lengths.end());
    // Every rank sends the longest length (gather takes tensors of one shape), zero-padded.
    std::vector<torch::Tensor> input{
        byte_tensor(bytes, std::max<std::int64_t>(longest, 1)).to(device_)};
    std::vector<std::vector<torch::Tensor>> output;
    if (rank() == 0) {
      output.emplace_back();
      for (std::int64_t r = 0; r < world; ++r) output[0].push_back(torch::empty_like(input[0]));
    }
    c10d::GatherOptions options;
    options.rootRank = 0;
    group_->gather(output, input, options)->wait();
    std::vector<std::string> gathered;
    if (rank() != 0) return gathered;
    for (std::int64_t r = 0; r < world; ++r) {
      auto& received = output[0][static_cast<std::size_t>(r)];
      gathered.push_back(string_of(received, lengths[static_cast<std::size_t>(r)]));
      received = torch::Tensor();  // off the device as soon as it is on the host
    }
    return gathered;
  });
}

std::string Collectives::scatter_bytes(const std::vector<std::string>& for_each_rank) const {
  const auto world = world_size();
  if (rank() == 0) {
    TORCH_INTERNAL_ASSERT(static_cast<std::int64_t>(for_each_rank.size()) == world,
                          "scatter_bytes: ", for_each_rank.size(), " entries for ", world,
                          " processes");
  }
  return guarded("sending each process its bytes from rank 0", [&] {
    const auto on = torch::TensorOptions().device(device_);
    // Rank 0's lengths to everyone, then each entry padded to the longest.
    std::vector<std::int64_t> lengths(static_cast<std::size_t>(world), 0);
    if (rank() == 0) {
      for (std::int64_t r = 0; r < world; ++r) {
        lengths[static_cast<std::size_t>(r)] =
            static_cast<std::int64_t>(for_each_rank[static_cast<std::size_t>(r)].size());
      }
    }
    std::vector<torch::Tensor> sizes{torch::tensor(lengths, torch::kLong).to(device_)};
    group_->broadcast(sizes)->wait();
    const auto host_sizes = sizes[0].cpu();
    std::memcpy(lengths.data(), host_sizes.data_ptr(), lengths.size() * sizeof(std::int64_t));
    const auto longest =
        std::max<std::int64_t>(*std::max_element(lengths.begin(), lengths.end()), 1);
    std::vector<torch::Tensor> output{torch::empty({longest}, on.dtype(torch::kUInt8))};
    std::vector<std::vector<torch::Tensor>> input;
    if (rank() == 0) {
      input.emplace_back();
      for (std::int64_t r = 0; r < world; ++r) {
        input[0].push_back(
            byte_tensor(for_each_rank[static_cast<std::size_t>(r)], longest).to(device_));
      }
    }
    c10d::ScatterOptions options;
    options.rootRank = 0;
    group_->scatter(output, input, options)->wait();
    return string_of(output[0], lengths[static_cast<std::size_t>(rank())]);
  });
}

std::vector<double> Collectives::sum(std::vector<double> values) const {
  if (values.empty()) return values;
  return guarded("summing over the processes", [&] {
    std::vector<torch::Tensor> t{torch::tensor(values, torch::kDouble).to(device_)};
    group_->allreduce(t)->wait();
    const auto host = t[0].cpu();
    std::memcpy(values.data(), host.data_ptr(), values.size() * sizeof(double));
    return values;
  });
}

bool Collectives::all_ok(bool ok) const {
  return guarded("agreeing on success", [&] {
    std::vector<torch::Tensor> t{
        torch::full({1}, ok ? 1 : 0, torch::TensorOptions().dtype(torch::kInt).device(device_))};
    c10d::AllreduceOptions options;
    options.reduceOp = c10d::ReduceOp::MIN;
    group_->allreduce(t, options)->wait();
    return t[0].item<int>() == 1;
  });
}

std::string Collectives::differing_ranks(bool differs_here) const {
  std::vector<double> flags(static_cast<std::size_t>(world_size()), 0.0);
  flags[static_cast<std::size_t>(rank())] = differs_here ? 1.0 : 0.0;
  const auto summed = sum(std::move(flags));
  std::vector<std::string> ranks;
  for (std::size_t r = 0; r < summed.size(); ++r) {
    if (summed[r] != 0.0) ranks.push_back(std::to_string(r));
  }
  return c10::Join(", ", ranks);
}

torch::Tensor Collectives::gather_rows(const torch::Tensor& rows, std::int64_t num_examples,
                                       double padding_value) const {
  return guarded("gathering the evaluation results", [&] {
    const auto world = world_size();
    const auto most_rows = ceil_div(num_examples, world);  // rank 0's share
    TORCH_CHECK(rows.dim() >= 1 && rows.size(0) <= most_rows, "gather_rows: rank ", rank(),
                " holds ", rows.size(0), " rows, more than the ", most_rows, " of rank 0");
    // Every rank pads to the same shape: rank 0's row count, the widest dimension 1.
    std::int64_t width = rows.dim() >= 2 ? rows.size(1) : 0;
    if (rows.dim() >= 2) {
      std::vector<torch::Tensor> longest{
          torch::full({1}, width, torch::TensorOptions().dtype(torch::kLong).device(device_))};
      c10d::AllreduceOptions options;
      options.reduceOp = c10d::ReduceOp::MAX;
      group_->allreduce(longest, options)->wait();
      width = longest[0].item<std::int64_t>();
    }
    auto shape = rows.sizes().vec();
    shape[0] = most_rows;
    if (rows.dim() >= 2) shape[1] = width;
    auto local = torch::full(shape, padding_value, rows.options().device(device_));
    auto filled = local.narrow(0, 0, rows.size(0));
    if (rows.dim() >= 2) filled = filled.narrow(1, 0, rows.size(1));
    filled.copy_(rows);
    std::vector<torch::Tensor> inputs{local};
    std::vector<std::vector<torch::Tensor>> outputs(1);
    for (std::int64_t r = 0; r < world; ++r) outputs[0].push_back(torch::empty_like(local));
    group_->allgather(outputs, inputs)->wait();
    // [world, rows, ...] -> [rows, world, ...]: row k of rank r lands at r + k * world, and the
    // padding rows at positions from num_examples on, which are cut off.
    auto interleaved = torch::stack(outputs[0]).transpose(0, 1).contiguous();
    auto flat = interleaved.sizes().vec();
    flat.erase(flat.begin());
    flat[0] = most_rows * world;
    return interleaved.reshape(flat).narrow(0, 0, num_examples).cpu();
  });
}

}  // namespace mantissa::detail
