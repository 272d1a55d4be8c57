#include "trainer/param_group_options.h"

#include <exception>

#include <c10/util/Exception.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include "io/archive_file.h"

namespace mantissa::detail {
namespace {

std::string group_key(std::size_t g) { return "group_" + std::to_string(g); }

}  // namespace

std::string param_group_options_bytes(const torch::optim::Optimizer& optimizer) {
  torch::serialize::OutputArchive archive;
  const auto& groups = optimizer.param_groups();
  archive.write("num_groups", c10::IValue(static_cast<std::int64_t>(groups.size())));
  for (std::size_t g = 0; g < groups.size(); ++g) {
    torch::serialize::OutputArchive options;
    groups[g].options().serialize(options);
    archive.write(group_key(g), options);
  }
  return io::archive_bytes(archive);
}

void load_param_group_options(torch::optim::Optimizer& optimizer, const std::string& bytes,
                              const std::string& origin) {
  torch::serialize::InputArchive archive;
  try {
    archive.load_from(bytes.data(), bytes.size(), torch::kCPU);
  } catch (const std::exception& e) {
    TORCH_CHECK_VALUE(false, origin, ": the optimizer's param group options are unreadable: ",
                      e.what());
  }
  load_param_group_options(optimizer, archive, origin);
}

void load_param_group_options(torch::optim::Optimizer& optimizer,
                              torch::serialize::InputArchive& archive, const std::string& origin) {
  auto& groups = optimizer.param_groups();
  c10::IValue count;
  TORCH_CHECK_VALUE(archive.try_read("num_groups", count) && count.isInt() &&
                        count.toInt() == static_cast<std::int64_t>(groups.size()),
                    origin, ": the saved options are of ",
                    count.isInt() ? std::to_string(count.toInt()) : std::string("no"),
                    " param groups, this run's optimizer has ", groups.size());
  for (std::size_t g = 0; g < groups.size(); ++g) {
    auto options = groups[g].options().clone();
    torch::serialize::InputArchive saved;
    TORCH_CHECK_VALUE(archive.try_read(group_key(g), saved), origin,
                      ": the saved options lack param group ", g);
    try {
      options->serialize(saved);
    } catch (const std::exception& e) {
      TORCH_CHECK_VALUE(false, origin, ": the saved options of param group ", g,
                        " are not this optimizer's: ", e.what());
    }
    groups[g].set_options(std::move(options));
  }
}

void copy_param_group_options(const torch::optim::Optimizer& from, torch::optim::Optimizer& to) {
  const auto& source = from.param_groups();
  auto& target = to.param_groups();
  TORCH_INTERNAL_ASSERT(source.size() == target.size(), "copying the options of ", source.size(),
                        " param groups into an optimizer with ", target.size());
  for (std::size_t g = 0; g < source.size(); ++g) target[g].set_options(source[g].options().clone());
}

}  // namespace mantissa::detail
