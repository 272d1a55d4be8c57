#pragma once
// The collective backends, apart from the rest of include/mantissa/distributed.h, so that
// TrainingArguments can name one without pulling in c10d.

#include <mantissa/choice.h>

namespace mantissa::distributed {

/// The collective backends c10d offers here. Python: `torch.distributed.Backend`'s members
/// `GLOO` and `NCCL`, spelt "gloo" and "nccl".
enum class Backend {
  kGloo,  ///< "gloo": CPU tensors (and CUDA tensors through host copies); always built
  kNccl,  ///< "nccl": CUDA tensors; only in builds with CUDA
};

/// `"gloo"` / `"nccl"`, as `torch.distributed` spells them. Host only.
const char* backend_name(Backend backend);

}  // namespace mantissa::distributed

namespace mantissa {

/// The spellings of `distributed::Backend`, so that `Choice<distributed::Backend>` reads
/// `--ddp_backend`'s text.
template <>
struct ChoiceTraits<distributed::Backend> {
  static constexpr const char* enum_name = "Backend";
  static constexpr const char* names[] = {"gloo", "nccl"};
};

static_assert(Choice<distributed::Backend>::size() ==
              static_cast<int>(distributed::Backend::kNccl) + 1);

}  // namespace mantissa
