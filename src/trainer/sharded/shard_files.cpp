#include "trainer/sharded/shard_files.h"

#include <algorithm>
#include <cstdio>
#include <optional>
#include <set>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "io/filesystem.h"
#include "io/json_reader.h"

namespace mantissa::detail::sharded {
namespace {

constexpr const char* kPiecesKey = "pieces";
constexpr const char* kWorldSizeKey = "world_size";
constexpr const char* kRankKey = "rank";

std::int64_t product(const std::vector<std::int64_t>& shape) {
  std::int64_t n = 1;
  for (const auto d : shape) n *= d;
  return n;
}

// The rank and world size in "shard-<rank>-of-<world>.safetensors", or nothing for any other
// name.
std::optional<std::pair<std::int64_t, std::int64_t>> parse_shard_name(const std::string& name) {
  long long rank = 0;
  long long world = 0;
  int used = 0;
  if (std::sscanf(name.c_str(), "shard-%5lld-of-%5lld.safetensors%n", &rank, &world, &used) != 2 ||
      used != static_cast<int>(name.size()) || name != shard_file_name(rank, world)) {
    return std::nullopt;
  }
  return std::make_pair(static_cast<std::int64_t>(rank), static_cast<std::int64_t>(world));
}

}  // namespace

std::string shard_file_name(std::int64_t rank, std::int64_t world_size) {
  return fmt::format("shard-{:05d}-of-{:05d}.safetensors", rank, world_size);
}

bool is_sharded_checkpoint(const std::string& checkpoint_dir) {
  return io::is_directory(io::join_path(checkpoint_dir, kModelShardsFolder));
}

void write_shard_file(const std::string& folder, std::int64_t rank, std::int64_t world_size,
                      const std::vector<TensorPiece>& pieces, const FileFaults& faults) {
  nlohmann::ordered_json described = nlohmann::ordered_json::object();
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const auto& piece : pieces) {
    const auto numel = piece.values.numel();
    TORCH_CHECK_VALUE(piece.offset >= 0 && piece.offset + numel <= product(piece.shape),
                      "write_shard_file: the piece of '", piece.name, "' at element ",
                      piece.offset, " (", numel, " elements) lies outside its shape ",
                      at::IntArrayRef(piece.shape));
    described[piece.name] = {{"shape", piece.shape}, {"offset", piece.offset}};
    tensors.emplace_back(piece.name, piece.values);
  }
  io::create_directories(folder);
  const auto path = io::join_path(folder, shard_file_name(rank, world_size));
  faults.writing(path);
  io::save_safetensors(path, tensors,
                       {{kPiecesKey, described.dump()},
                        {kRankKey, std::to_string(rank)},
                        {kWorldSizeKey, std::to_string(world_size)}});
}

std::int64_t TensorSource::numel(const std::string& name) const { return product(shape(name)); }

at::Tensor TensorSource::read_whole(const std::string& name) const {
  return read(name, 0, numel(name)).view(shape(name));
}

std::vector<std::string> SafetensorsSource::names() const {
  auto names = file_.keys();
  std::sort(names.begin(), names.end());
  return names;
}

NamedTensorsSource::NamedTensorsSource(const io::NamedTensors& state, std::string origin)
    : origin_(std::move(origin)) {
  for (const auto& [name, tensor] : state) {
    TORCH_CHECK_VALUE(index_.emplace(name, tensor).second, "the state", origin_, " names '",
                      name, "' twice");
  }
}

std::vector<std::string> NamedTensorsSource::names() const {
  std::vector<std::string> names;
  for (const auto& entry : index_) names.push_back(entry.first);
  return names;
}

std::vector<std::int64_t> NamedTensorsSource::shape(const std::string& name) const {
  return index_.at(name).sizes().vec();
}

c10::ScalarType NamedTensorsSource::dtype(const std::string& name) const {
  return index_.at(name).scalar_type();
}

at::Tensor NamedTensorsSource::read(const std::string& name, std::int64_t offset,
                                    std::int64_t numel) const {
  return index_.at(name).detach().reshape({-1}).narrow(0, offset, numel).to(at::kCPU);
}

ShardFolderSource::ShardFolderSource(const std::string& folder) : folder_(folder) {
  TORCH_CHECK(io::is_directory(folder), "the sharded checkpoint folder '", folder,
              "' is missing");
  std::map<std::int64_t, std::string> by_rank;
  for (const auto& name : io::list_directory(folder)) {
    const auto parsed = parse_shard_name(name);
    if (!parsed) continue;
    TORCH_CHECK(world_size_ == 0 || parsed->second == world_size_, "'", folder, "' holds '",
                name, "' beside files of ", world_size_,
                " shards: the files of two different saves are mixed");
    world_size_ = parsed->second;
    TORCH_CHECK(parsed->first < world_size_, "'", folder, "' holds '", name,
                "', whose rank is not below its number of shards");
    by_rank.emplace(parsed->first, name);
  }
  TORCH_CHECK(world_size_ > 0, "'", folder,
              "' holds no shard file (shard-<rank>-of-<world>.safetensors)");
  for (std::int64_t r = 0; r < world_size_; ++r) {
    TORCH_CHECK(by_rank.count(r) != 0, "the shard file '", io::join_path(folder, shard_file_name(r, world_size_)),
                "' is missing: ", world_size_, " processes saved '", folder, "', rank ", r,
                " among them; without it the state is incomplete");
  }
  for (const auto& [rank, name] : by_rank) {
    const auto path = io::join_path(folder, name);
    files_.emplace_back(path);
    const auto& file = files_.back();
    const auto& metadata = file.metadata();
    const auto described = metadata.find(kPiecesKey);
    const auto saved_rank = metadata.find(kRankKey);
    TORCH_CHECK(described != metadata.end() && saved_rank != metadata.end() &&
                    saved_rank->second == std::to_string(rank),
                "the shard file '", path,
                "' is not one of mantissa's: its metadata has no 'pieces', or another rank");
    nlohmann::json pieces;
    try {
      pieces = io::parse_json_text<nlohmann::json>(described->second, 8);
    } catch (const std::exception& e) {
      TORCH_CHECK(false, "the shard file '", path, "': its 'pieces' metadata is not JSON: ",
                  e.what());
    }
    TORCH_CHECK(pieces.is_object(), "the shard file '", path,
                "': its 'pieces' metadata is not a JSON object");
    const auto keys = file.keys();
    TORCH_CHECK(keys.size() == pieces.size(), "the shard file '", path, "' holds ", keys.size(),
                " tensors, its 'pieces' metadata describes ", pieces.size());
    for (const auto& key : keys) {
      const auto found = pieces.find(key);
      TORCH_CHECK(found != pieces.end() && found->is_object() && found->contains("shape") &&
                      found->contains("offset") && (*found)["offset"].is_number_integer(),
                  "the shard file '", path, "': its 'pieces' metadata does not describe '", key,
                  "'");
      Piece piece;
      piece.file = files_.size() - 1;
      piece.key = key;
      piece.offset = (*found)["offset"].get<std::int64_t>();
      piece.numel = product(file.shape(key));
      std::vector<std::int64_t> shape;
      for (const auto& d : (*found)["shape"]) {
        TORCH_CHECK(d.is_number_integer() && d.get<std::int64_t>() >= 0, "the shard file '",
                    path, "': '", key, "' has a bad shape");
        shape.push_back(d.get<std::int64_t>());
      }
      TORCH_CHECK(piece.offset >= 0 && piece.offset + piece.numel <= product(shape),
                  "the shard file '", path, "': the piece of '", key, "' at element ",
                  piece.offset, " lies outside its shape ", at::IntArrayRef(shape));
      auto& saved = tensors_[key];
      if (saved.pieces.empty()) {
        saved.shape = shape;
        saved.dtype = file.dtype(key);
      }
      TORCH_CHECK(saved.shape == shape && saved.dtype == file.dtype(key), "'", folder,
                  "': the shard files disagree about the shape or dtype of '", key, "'");
      saved.pieces.push_back(piece);
    }
  }
  for (auto& [name, saved] : tensors_) {
    std::sort(saved.pieces.begin(), saved.pieces.end(),
              [](const Piece& a, const Piece& b) { return a.offset < b.offset; });
    for (std::size_t i = 1; i < saved.pieces.size(); ++i) {
      const auto& before = saved.pieces[i - 1];
      TORCH_CHECK(before.offset + before.numel <= saved.pieces[i].offset, "'", folder,
                  "': two shard files hold element ", saved.pieces[i].offset, " of '", name,
                  "'");
    }
  }
}

ShardFolderSource::~ShardFolderSource() = default;

std::vector<std::string> ShardFolderSource::names() const {
  std::vector<std::string> names;
  for (const auto& entry : tensors_) names.push_back(entry.first);
  return names;
}

std::vector<std::int64_t> ShardFolderSource::shape(const std::string& name) const {
  return tensors_.at(name).shape;
}

c10::ScalarType ShardFolderSource::dtype(const std::string& name) const {
  return tensors_.at(name).dtype;
}

at::Tensor ShardFolderSource::read(const std::string& name, std::int64_t offset,
                                   std::int64_t numel) const {
  const auto& saved = tensors_.at(name);
  auto out = at::empty({numel}, at::TensorOptions().dtype(saved.dtype));
  std::int64_t next = offset;  // the first element not yet read
  const auto end = offset + numel;
  for (const auto& piece : saved.pieces) {
    if (next >= end) break;
    const auto piece_end = piece.offset + piece.numel;
    if (piece_end <= next) continue;
    TORCH_CHECK(piece.offset <= next, "'", folder_, "': no shard file holds elements [", next,
                ", ", std::min(piece.offset, end), ") of '", name, "'");
    const auto count = std::min(piece_end, end) - next;
    out.narrow(0, next - offset, count)
        .copy_(files_[piece.file].get_flat_slice(piece.key, next - piece.offset, count));
    next += count;
  }
  TORCH_CHECK(next >= end, "'", folder_, "': no shard file holds elements [", next, ", ", end,
              ") of '", name, "'");
  return out;
}

}  // namespace mantissa::detail::sharded
