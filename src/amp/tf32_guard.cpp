// The one file that knows how each LibTorch version spells its TF32 switches.
//   2.11+    : setFloat32Precision(Float32Backend, Float32Op, Float32Precision)  (enums)
//   2.9-2.10 : setFloat32Precision(backend, op, precision)                       (strings)
//   2.4-2.8  : setAllowTF32CuBLAS / setAllowTF32CuDNN                             (flags)
// Never mix the old and new APIs: newer releases raise when both have been used.
#include <mantissa/amp/tf32_guard.h>

#include <ATen/Context.h>
#include <torch/version.h>

#define MANTISSA_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) ||           \
   (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

namespace mantissa::amp {
namespace {

#if MANTISSA_TORCH_AT_LEAST(2, 11)
using at::Float32Backend;
using at::Float32Op;
using at::Float32Precision;

std::int32_t read(Float32Op op) {
  return static_cast<std::int32_t>(at::globalContext().float32Precision(Float32Backend::CUDA, op));
}
void write(Float32Op op, std::int32_t code) {
  at::globalContext().setFloat32Precision(Float32Backend::CUDA, op,
                                          static_cast<Float32Precision>(code));
}
std::int32_t code_for(bool allow) {
  return static_cast<std::int32_t>(allow ? Float32Precision::TF32 : Float32Precision::IEEE);
}
constexpr auto kMatmul = Float32Op::MATMUL;
constexpr auto kConv = Float32Op::CONV;
bool is_tf32(std::int32_t code) {
  return code == static_cast<std::int32_t>(Float32Precision::TF32);
}

#elif MANTISSA_TORCH_AT_LEAST(2, 9)
// Precision codes: 0 none, 1 ieee, 2 tf32 (the strings LibTorch 2.9/2.10 take).
const char* const kNames[] = {"none", "ieee", "tf32"};
std::int32_t code_of(const std::string& name) {
  for (std::int32_t i = 0; i < 3; ++i) {
    if (name == kNames[i]) return i;
  }
  return 0;
}
std::int32_t read(const char* op) {
  return code_of(at::globalContext().float32Precision("cuda", op));
}
void write(const char* op, std::int32_t code) {
  at::globalContext().setFloat32Precision("cuda", op, kNames[code]);
}
std::int32_t code_for(bool allow) { return allow ? 2 : 1; }
constexpr const char* kMatmul = "matmul";
constexpr const char* kConv = "conv";
bool is_tf32(std::int32_t code) { return code == 2; }

#else
enum class Flag { kCuBLAS, kCuDNN };
std::int32_t read(Flag flag) {
  auto& ctx = at::globalContext();
  return flag == Flag::kCuBLAS ? ctx.allowTF32CuBLAS() : ctx.allowTF32CuDNN();
}
void write(Flag flag, std::int32_t allow) {
  auto& ctx = at::globalContext();
  flag == Flag::kCuBLAS ? ctx.setAllowTF32CuBLAS(allow != 0) : ctx.setAllowTF32CuDNN(allow != 0);
}
std::int32_t code_for(bool allow) { return allow ? 1 : 0; }
constexpr auto kMatmul = Flag::kCuBLAS;
constexpr auto kConv = Flag::kCuDNN;
bool is_tf32(std::int32_t code) { return code != 0; }
#endif

}  // namespace

Tf32Guard::Tf32Guard(bool allow) : saved_matmul_(read(kMatmul)), saved_conv_(read(kConv)) {
  write(kMatmul, code_for(allow));
  write(kConv, code_for(allow));
}

Tf32Guard::~Tf32Guard() {
  write(kMatmul, saved_matmul_);
  write(kConv, saved_conv_);
}

bool tf32_matmul_allowed() { return is_tf32(read(kMatmul)); }
bool tf32_conv_allowed() { return is_tf32(read(kConv)); }

}  // namespace mantissa::amp
