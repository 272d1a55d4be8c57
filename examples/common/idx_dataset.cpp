#include "idx_dataset.h"

#include <unistd.h>
#include <zlib.h>

#include <array>
#include <cstdint>
#include <vector>

#include <torch/torch.h>

namespace mantissa::examples {
namespace {

// gzread reads plain files too, so one reader serves .gz and uncompressed IDX files.
class GzFile {
 public:
  explicit GzFile(const std::string& path) : path_(path), file_(gzopen(path.c_str(), "rb")) {
    TORCH_CHECK(file_ != nullptr, "cannot open '", path, "'");
  }
  ~GzFile() { gzclose(file_); }
  GzFile(const GzFile&) = delete;
  GzFile& operator=(const GzFile&) = delete;

  void read(void* out, size_t bytes) {
    auto* dst = static_cast<char*>(out);
    while (bytes > 0) {
      const unsigned chunk = static_cast<unsigned>(std::min<size_t>(bytes, 1u << 30));
      const int got = gzread(file_, dst, chunk);
      if (got <= 0) {
        int code = 0;
        const char* message = gzerror(file_, &code);
        TORCH_CHECK(false, "'", path_, "' is truncated or corrupt (",
                    code != Z_OK ? message : "unexpected end of file", ")");
      }
      dst += got;
      bytes -= static_cast<size_t>(got);
    }
  }

 private:
  std::string path_;
  gzFile file_;
};

std::uint32_t big_endian(const std::array<unsigned char, 4>& b) {
  return (std::uint32_t{b[0]} << 24) | (std::uint32_t{b[1]} << 16) | (std::uint32_t{b[2]} << 8) |
         b[3];
}

std::string file_in(const std::string& dir, const std::string& name) {
  // POSIX rather than std::filesystem: the PyPI libtorch.so exports std::filesystem symbols of
  // its own, and calls resolved to them crash.
  const auto path = dir + "/" + name;
  TORCH_CHECK(::access(path.c_str(), R_OK) == 0, "Fashion-MNIST file '", path,
              "' not found. Install it with: apt-get install dataset-fashion-mnist "
              "(or pass --data_dir with the folder holding the four *-ubyte.gz files)");
  return path;
}

}  // namespace

torch::Tensor read_idx(const std::string& path) {
  GzFile file(path);
  std::array<unsigned char, 4> magic{};
  file.read(magic.data(), 4);
  TORCH_CHECK(magic[0] == 0 && magic[1] == 0 && magic[2] == 0x08, "'", path,
              "' is not an IDX file of unsigned bytes (bad magic number)");
  const int dims = magic[3];
  TORCH_CHECK(dims >= 1 && dims <= 4, "'", path, "' has an implausible rank ", dims);
  std::vector<int64_t> shape;
  int64_t numel = 1;
  for (int d = 0; d < dims; ++d) {
    std::array<unsigned char, 4> size{};
    file.read(size.data(), 4);
    shape.push_back(big_endian(size));
    numel *= shape.back();
  }
  TORCH_CHECK(numel > 0 && numel < (int64_t{1} << 32), "'", path, "' has an implausible shape ",
              c10::IntArrayRef(shape));
  auto tensor = torch::empty(shape, torch::kUInt8);
  file.read(tensor.data_ptr<uint8_t>(), static_cast<size_t>(numel));
  return tensor;
}

FashionMnist::FashionMnist(const std::string& dir, Split split) {
  const std::string prefix = split == Split::kTrain ? "train" : "t10k";
  auto images = read_idx(file_in(dir, prefix + "-images-idx3-ubyte.gz"));
  auto labels = read_idx(file_in(dir, prefix + "-labels-idx1-ubyte.gz"));
  TORCH_CHECK(images.dim() == 3 && labels.dim() == 1 && images.size(0) == labels.size(0),
              "Fashion-MNIST files in '", dir, "' disagree: images ", images.sizes(), ", labels ",
              labels.sizes());
  // Fashion-MNIST's train-set mean and standard deviation.
  constexpr double kMean = 0.2860;
  constexpr double kStd = 0.3530;
  images_ = images.unsqueeze(1).to(torch::kFloat).div_(255.0).sub_(kMean).div_(kStd);
  targets_ = labels.to(torch::kLong);
}

torch::data::Example<> FashionMnist::get_batch(c10::ArrayRef<size_t> indices) {
  // A view of the indices, not a copy (torch::tensor would dispatch a handful of ops): `rows`
  // outlives both index_select calls, which copy what they gather.
  std::vector<int64_t> rows(indices.begin(), indices.end());
  const auto index =
      torch::from_blob(rows.data(), {static_cast<int64_t>(rows.size())}, torch::kLong);
  return {images_.index_select(0, index), targets_.index_select(0, index)};
}

torch::optional<size_t> FashionMnist::size() const { return static_cast<size_t>(images_.size(0)); }

}  // namespace mantissa::examples
