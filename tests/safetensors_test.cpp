// The safetensors writer and reader: round trips for every dtype, the exact file layout, the
// checks on corrupt files, module save/load, and interop with Python's safetensors package.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include <mantissa/io/pretrained_weights.h>
#include <mantissa/io/safetensors.h>
#include "io/filesystem.h"

#include "io/atomic_file.h"
#include "io_test_util.h"
#include "value_error.h"

namespace {

using mantissa::io::load_module_safetensors;
using mantissa::io::load_safetensors;
using mantissa::io::load_safetensors_metadata;
using mantissa::io::save_module_safetensors;
using mantissa::io::save_safetensors;
using mantissa_test::TempDir;
using mantissa_test::write_raw_file;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;
using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

// Every element's bytes, for a bit-exact comparison that works for every dtype (nan included).
std::string bytes_of(const torch::Tensor& tensor) {
  const auto contiguous = tensor.contiguous();
  return std::string(static_cast<const char*>(contiguous.const_data_ptr()), contiguous.nbytes());
}

void expect_same_tensor(const torch::Tensor& actual, const torch::Tensor& expected,
                        const std::string& name) {
  SCOPED_TRACE(name);
  EXPECT_EQ(actual.scalar_type(), expected.scalar_type());
  EXPECT_EQ(actual.sizes(), expected.sizes());
  EXPECT_TRUE(actual.device().is_cpu());
  EXPECT_TRUE(actual.is_contiguous());
  EXPECT_EQ(bytes_of(actual), bytes_of(expected));
}

// The values both this file and the Python interop scripts build for a dtype and shape:
// arange * 1.5 - 4 (signed and float types), arange * 3 (unsigned), arange % 3 == 0 (bool).
torch::Tensor pattern(torch::ScalarType dtype, at::IntArrayRef shape) {
  int64_t numel = 1;
  for (auto d : shape) numel *= d;
  const auto base = torch::arange(numel, torch::kDouble).reshape(shape);
  switch (dtype) {
    case torch::kBool:
      return base.fmod(3).eq(0);
    case torch::kByte:
    case torch::kUInt16:
    case torch::kUInt32:
    case torch::kUInt64:
      return (base * 3).to(dtype);
    case torch::kComplexFloat:
      return torch::complex((base * 1.5 - 4).to(torch::kFloat), (4 - base).to(torch::kFloat));
    default:
      return (base * 1.5 - 4).to(dtype);
  }
}

// Every dtype the format knows, with its safetensors code.
const std::vector<std::pair<std::string, torch::ScalarType>>& all_dtypes() {
  static const std::vector<std::pair<std::string, torch::ScalarType>> dtypes = {
      {"F64", torch::kDouble},
      {"F32", torch::kFloat},
      {"F16", torch::kHalf},
      {"BF16", torch::kBFloat16},
      {"I64", torch::kLong},
      {"I32", torch::kInt},
      {"I16", torch::kShort},
      {"I8", torch::kChar},
      {"U8", torch::kByte},
      {"BOOL", torch::kBool},
      {"U64", torch::kUInt64},
      {"U32", torch::kUInt32},
      {"U16", torch::kUInt16},
      {"F8_E4M3", torch::kFloat8_e4m3fn},
      {"F8_E5M2", torch::kFloat8_e5m2},
      {"F8_E4M3FNUZ", torch::kFloat8_e4m3fnuz},
      {"F8_E5M2FNUZ", torch::kFloat8_e5m2fnuz},
      {"F8_E8M0", torch::kFloat8_e8m0fnu},
      {"C64", torch::kComplexFloat},
  };
  return dtypes;
}

// A safetensors file from a header text and raw data: 8-byte little-endian length, header, data.
std::string make_file(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + header + data;
}

nlohmann::json read_header(const std::string& path, uint64_t* header_length = nullptr) {
  const auto bytes = mantissa::io::read_file(path);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[i]);
  if (header_length) *header_length = n;
  return nlohmann::json::parse(std::string(bytes.data() + 8, n));
}

TEST(SafetensorsTest, RoundTripsEveryDtype) {
  TempDir dir;
  NamedTensors tensors;
  for (const auto& [code, dtype] : all_dtypes()) {
    tensors.emplace_back(code + ".matrix", pattern(dtype, {2, 3, 4}));
    tensors.emplace_back(code + ".scalar", pattern(dtype, {}));
    tensors.emplace_back(code + ".empty", pattern(dtype, {0, 3}));
  }
  const auto path = dir.file("all.safetensors");
  save_safetensors(path, tensors);
  const auto loaded = load_safetensors(path);
  ASSERT_EQ(loaded.size(), tensors.size());
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    EXPECT_EQ(loaded[i].first, tensors[i].first) << "file order is the order written";
    expect_same_tensor(loaded[i].second, tensors[i].second, tensors[i].first);
  }
  // The header names each dtype by its safetensors code.
  const auto header = read_header(path);
  for (const auto& [code, dtype] : all_dtypes()) {
    EXPECT_EQ(header[code + ".matrix"]["dtype"], code);
    EXPECT_EQ(header[code + ".scalar"]["shape"], nlohmann::json::array());
    EXPECT_EQ(header[code + ".empty"]["shape"], nlohmann::json({0, 3}));
  }
}

TEST(SafetensorsTest, KeepsSpecialFloatValuesBitForBit) {
  TempDir dir;
  const float inf = std::numeric_limits<float>::infinity();
  const auto f32 = torch::tensor({0.f, -0.f, inf, -inf, std::numeric_limits<float>::quiet_NaN(),
                                  std::numeric_limits<float>::denorm_min(), 3.4e38f, -1e-30f});
  const NamedTensors tensors = {
      {"f32", f32}, {"bf16", f32.to(torch::kBFloat16)}, {"f16", f32.to(torch::kHalf)}};
  save_safetensors(dir.file("special.safetensors"), tensors);
  const auto loaded = load_safetensors(dir.file("special.safetensors"));
  ASSERT_EQ(loaded.size(), 3u);
  for (std::size_t i = 0; i < 3; ++i)
    expect_same_tensor(loaded[i].second, tensors[i].second, tensors[i].first);
}

TEST(SafetensorsTest, WritesNonContiguousTensorsAsTheirValues) {
  TempDir dir;
  const auto base = torch::arange(24, torch::kFloat).reshape({4, 6});
  const NamedTensors tensors = {
      {"transposed", base.t()},
      {"strided_slice", base.slice(1, 1, 6, 2)},                     // storage offset and stride 2
      {"expanded", torch::arange(3, torch::kFloat).expand({4, 3})},  // stride 0
      {"conjugate_view", torch::complex(base, -base).conj()},        // lazy conjugate bit
  };
  for (const auto& item : tensors)
    ASSERT_FALSE(item.second.is_contiguous() && !item.second.is_conj()) << item.first;
  ASSERT_TRUE(tensors[3].second.is_conj());
  save_safetensors(dir.file("views.safetensors"), tensors);
  const auto loaded = load_safetensors(dir.file("views.safetensors"));
  ASSERT_EQ(loaded.size(), tensors.size());
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    EXPECT_TRUE(torch::equal(loaded[i].second, tensors[i].second.resolve_conj()))
        << tensors[i].first;
    EXPECT_TRUE(loaded[i].second.is_contiguous());
  }
  // Writing a view never changes its base.
  EXPECT_TRUE(torch::equal(base, torch::arange(24, torch::kFloat).reshape({4, 6})));
}

TEST(SafetensorsTest, FileLayoutFollowsTheFormat) {
  TempDir dir;
  const auto path = dir.file("layout.safetensors");
  const NamedTensors tensors = {{"b", torch::ones({3}, torch::kFloat)},
                                {"a", torch::ones({5}, torch::kBFloat16)},
                                {"c", torch::ones({2, 2}, torch::kLong)}};
  save_safetensors(path, tensors, {{"step", "42"}});
  uint64_t n = 0;
  const auto header = read_header(path, &n);
  EXPECT_EQ(n % 8, 0u) << "header padded to a multiple of 8";
  EXPECT_EQ(header["__metadata__"], nlohmann::json({{"format", "pt"}, {"step", "42"}}));
  // Data in the order given, back to back from offset 0.
  EXPECT_EQ(header["b"]["data_offsets"], nlohmann::json({0, 12}));
  EXPECT_EQ(header["a"]["data_offsets"], nlohmann::json({12, 22}));
  EXPECT_EQ(header["c"]["data_offsets"], nlohmann::json({22, 54}));
  EXPECT_EQ(header["c"]["shape"], nlohmann::json({2, 2}));
  EXPECT_EQ(mantissa::io::read_file(path).size(), 8 + n + 54);
  // The padding is spaces.
  const auto bytes = mantissa::io::read_file(path);
  const std::string text(bytes.data() + 8, n);
  EXPECT_EQ(text.find_last_not_of(' '), text.find_last_of('}'));

  EXPECT_EQ(load_safetensors_metadata(path),
            (std::map<std::string, std::string>{{"format", "pt"}, {"step", "42"}}));
  // The caller's "format" wins.
  save_safetensors(path, tensors, {{"format", "mlx"}});
  EXPECT_EQ(load_safetensors_metadata(path).at("format"), "mlx");
}

TEST(SafetensorsTest, ReadsTensorsInOffsetOrderNotHeaderOrder) {
  TempDir dir;
  const auto path = dir.file("order.safetensors");
  // JSON keys in one order, data in another.
  const std::string header = R"({"z":{"dtype":"I32","shape":[1],"data_offsets":[0,4]},)"
                             R"("a":{"dtype":"I32","shape":[2],"data_offsets":[4,12]}})";
  const int32_t data[3] = {7, 8, 9};
  write_raw_file(path,
                 make_file(header, std::string(reinterpret_cast<const char*>(data), sizeof(data))));
  const auto loaded = load_safetensors(path);
  ASSERT_EQ(loaded.size(), 2u);
  EXPECT_EQ(loaded[0].first, "z");
  EXPECT_EQ(loaded[1].first, "a");
  EXPECT_EQ(loaded[0].second.item<int32_t>(), 7);
  EXPECT_TRUE(torch::equal(loaded[1].second, torch::tensor({8, 9}, torch::kInt)));
  EXPECT_TRUE(load_safetensors_metadata(path).empty());
}

TEST(SafetensorsTest, RoundTripsUnicodeAndQuotedNames) {
  TempDir dir;
  const auto path = dir.file("names.safetensors");
  const NamedTensors tensors = {{"encoder.gewicht_\xc3\xa4", torch::ones({2})},  // UTF-8 "ä"
                                {"with \"quotes\" and \\ backslash", torch::zeros({1})}};
  save_safetensors(path, tensors, {{"author", "J\xc3\xb6rg"}});
  const auto loaded = load_safetensors(path);
  ASSERT_EQ(loaded.size(), 2u);
  EXPECT_EQ(loaded[0].first, tensors[0].first);
  EXPECT_EQ(loaded[1].first, tensors[1].first);
  EXPECT_EQ(load_safetensors_metadata(path).at("author"), "J\xc3\xb6rg");
}

TEST(SafetensorsTest, RejectsBadInputWithValueError) {
  TempDir dir;
  const auto path = dir.file("bad.safetensors");
  const auto t = torch::ones({2});
  EXPECT_THAT(
      [&] {
        save_safetensors(path, {{"a", t}, {"b", t}, {"a", t}});
      },
      ThrowsMessage<c10::ValueError>(HasSubstr("the tensor name 'a' appears more than once")));
  EXPECT_THAT(
      [&] {
        save_safetensors(path, {{"__metadata__", t}});
      },
      ThrowsMessage<c10::ValueError>(HasSubstr("'__metadata__' is reserved")));
  EXPECT_THAT(
      [&] {
        save_safetensors(path, {{"w", torch::Tensor()}});
      },
      ThrowsMessage<c10::ValueError>(HasSubstr("tensor 'w' is undefined")));
  EXPECT_THAT(
      [&] {
        save_safetensors(path, {{"c128", torch::ones({2}, torch::kComplexDouble)}});
      },
      ThrowsMessage<c10::ValueError>(
          AllOf(HasSubstr("tensor 'c128' has dtype ComplexDouble"), HasSubstr("cannot store"))));
  EXPECT_THAT(
      [&] {
        save_safetensors(path, {{"sparse", torch::eye(3).to_sparse()}});
      },
      ThrowsMessage<c10::ValueError>(HasSubstr("tensor 'sparse' has layout Sparse")));
  EXPECT_THAT(
      [&] {
        save_safetensors(path, {{"bad\xff"
                                 "name",
                                 t}});
      },
      ThrowsMessage<c10::ValueError>(HasSubstr("must be valid UTF-8")));
  EXPECT_THAT(
      [&] {
        save_safetensors(path, {{"w", t}}, {{"note", "\xc3"}});
      },
      ThrowsMessage<c10::ValueError>(HasSubstr("must be valid UTF-8")));
  EXPECT_FALSE(mantissa::io::path_exists(path)) << "nothing is written on bad input";
}

TEST(SafetensorsTest, FailedSaveKeepsTheOldFileAndLeavesNoTemporary) {
  TempDir dir;
  const auto path = dir.file("model.safetensors");
  save_safetensors(path, {{"w", torch::full({4}, 1.5)}});
  const auto before = mantissa::io::read_file(path);
  EXPECT_THROW(save_safetensors(path, {{"w", torch::ones({2})}, {"w", torch::ones({2})}}),
               c10::ValueError);
  EXPECT_EQ(mantissa::io::read_file(path), before);

  // A producer that fails halfway through a streamed write.
  EXPECT_THROW(
      mantissa::io::write_file_atomically_streamed(path,
                                                   [](const mantissa::io::ChunkWriter& write) {
                                                     write("partial");
                                                     throw std::runtime_error("disk on fire");
                                                   }),
      std::runtime_error);
  EXPECT_EQ(mantissa::io::read_file(path), before);
  EXPECT_EQ(mantissa::io::list_directory(dir.path()),
            std::vector<std::string>{"model.safetensors"});
  EXPECT_TRUE(torch::equal(load_safetensors(path).at(0).second, torch::full({4}, 1.5)));
}

TEST(SafetensorsTest, WriteErrorNamesTheFile) {
  const std::string path = "/nonexistent-folder-mantissa/model.safetensors";
  EXPECT_THAT(
      [&] {
        save_safetensors(path, {{"w", torch::ones({2})}});
      },
      ThrowsMessage<c10::Error>(HasSubstr(path)));
}

// ---------------------------------------------------------------------------------------------
// Corrupt files: each raises a c10::Error that names the file and the problem.

class SafetensorsCorruptFileTest : public ::testing::Test {
 protected:
  void expect_error(const std::string& bytes, const std::string& what) {
    write_raw_file(path_, bytes);
    EXPECT_THAT([&] { load_safetensors(path_); },
                ThrowsMessage<c10::Error>(AllOf(HasSubstr("'" + path_ + "'"), HasSubstr(what))));
  }
  static std::string f32_entry(const std::string& name, const std::string& shape, uint64_t begin,
                               uint64_t end) {
    return "\"" + name + "\":{\"dtype\":\"F32\",\"shape\":" + shape + ",\"data_offsets\":[" +
           std::to_string(begin) + "," + std::to_string(end) + "]}";
  }

  TempDir dir_;
  std::string path_ = dir_.file("corrupt.safetensors");
};

TEST_F(SafetensorsCorruptFileTest, MissingOrTooShortFile) {
  EXPECT_THAT(
      [&] { load_safetensors(dir_.file("absent.safetensors")); },
      ThrowsMessage<c10::Error>(AllOf(HasSubstr("absent.safetensors"), HasSubstr("No such file"))));
  expect_error("", "fewer than the 8-byte header length");
  expect_error("abc", "fewer than the 8-byte header length");
  EXPECT_THAT([&] { load_safetensors(dir_.path()); },
              ThrowsMessage<c10::Error>(HasSubstr("not a regular file")));
}

TEST_F(SafetensorsCorruptFileTest, HeaderLengthBeyondTheFile) {
  std::string bytes = make_file("{}", "");
  bytes[0] = 100;  // claims a 100-byte header; 2 bytes follow
  expect_error(bytes, "the header length is 100 bytes but only 2 bytes follow it");
  std::string huge(8, '\xff');
  expect_error(huge + "{}", "header length is 18446744073709551615 bytes");
}

TEST_F(SafetensorsCorruptFileTest, HeaderLengthAboveTheLimit) {
  // A sparse 150 MB file whose header length claims 120 MB: rejected before allocating it.
  std::string bytes = make_file("{}", "");
  const uint64_t n = 120'000'000;
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  write_raw_file(path_, bytes);
  ASSERT_EQ(::truncate(path_.c_str(), 150'000'000), 0);
  EXPECT_THAT([&] { load_safetensors(path_); },
              ThrowsMessage<c10::Error>(HasSubstr("exceeds the limit of 100000000 bytes")));
}

TEST_F(SafetensorsCorruptFileTest, HeaderThatIsNotTheExpectedJson) {
  expect_error(make_file("{\"a\": {", ""), "the header is not valid JSON");
  expect_error(make_file(std::string("{\"a\"\0}", 6), ""), "the header is not valid JSON");
  expect_error(make_file("[1, 2]", ""), "the header is not a JSON object but array");
  expect_error(make_file("{\"w\": 5}", ""), "the header entry of tensor 'w' is not a JSON object");
  expect_error(make_file(R"({"w":{"shape":[1],"data_offsets":[0,4]}})", std::string(4, '\0')),
               "tensor 'w' has no \"dtype\" string");
  expect_error(make_file(R"({"w":{"dtype":"F32","data_offsets":[0,4]}})", std::string(4, '\0')),
               "tensor 'w' has no \"shape\" list");
  expect_error(make_file(R"({"w":{"dtype":"F32","shape":[1]}})", std::string(4, '\0')),
               "tensor 'w' has no \"data_offsets\" list");
  expect_error(
      make_file(R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", std::string(4, '\0')),
      "tensor 'w' has a bad shape [-1]");
  expect_error(make_file(R"({"w":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}})",
                         std::string(4, '\0')),
               "tensor 'w' has a bad shape");
  expect_error(
      make_file(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0]}})", std::string(4, '\0')),
      "tensor 'w' has bad data_offsets [0]");
  expect_error(make_file(R"({"__metadata__":{"format":1}})", ""),
               "\"__metadata__\" must map strings to strings, but 'format' holds 1");
  expect_error(make_file(R"({"__metadata__":[]})", ""), "\"__metadata__\" is not a JSON object");
  // nlohmann reports a number beyond double as out_of_range, not as a parse error.
  expect_error(make_file(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"x":1e400}})",
                         std::string(4, '\0')),
               "the header is not valid JSON: [json.exception.out_of_range.406] number overflow");
}

TEST_F(SafetensorsCorruptFileTest, DeeplyNestedHeaderIsRefusedWithoutCrashing) {
  // 100k open brackets: the error message used to print the value with nlohmann's recursive
  // dump(), which overflowed the stack. The nesting is now refused before parsing.
  const std::string open(100'000, '['), close(100'000, ']');
  expect_error(make_file("{\"a\":" + open + close + "}", ""),
               "nest deeper than 127 levels (the bracket at offset 131 opens level 128)");
  expect_error(make_file("{\"__metadata__\":{\"m\":" + open + close + "}}", ""), "nest deeper");
  expect_error(
      make_file(R"({"w":{"dtype":"F32","shape":)" + open + close + R"(,"data_offsets":[0,0]}})",
                ""),
      "nest deeper");
  // Brackets inside strings do not count, escaped quotes do not end a string.
  const std::string name = "\\\"" + open;
  write_raw_file(
      path_,
      make_file("{\"" + name + "\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", "x"));
  EXPECT_EQ(load_safetensors(path_).at(0).first, "\"" + open);
}

TEST_F(SafetensorsCorruptFileTest, MessagesShowOnlyTheStartOfABadValue) {
  std::string long_list = "[";
  for (int i = 0; i < 100'000; ++i) long_list += i ? ",-1" : "-1";
  long_list += "]";
  write_raw_file(
      path_,
      make_file(R"({"w":{"dtype":"F32","shape":)" + long_list + R"(,"data_offsets":[0,0]}})", ""));
  try {
    load_safetensors(path_);
    ADD_FAILURE() << "no exception";
  } catch (const c10::Error& e) {
    const std::string message = e.msg();
    EXPECT_THAT(message, HasSubstr("tensor 'w' has a bad shape [-1,-1,-1,"));
    EXPECT_THAT(message, HasSubstr("..."));
    EXPECT_LT(message.size(), 400u) << message.substr(0, 400);
  }
  expect_error(make_file(R"({"__metadata__":{"m":")" + std::string(1'000'000, 'x') +
                             "\"}, \"__metadata__x\": 1}",
                         ""),
               "the header entry of tensor '__metadata__x' is not a JSON object but 1");
  expect_error(make_file(R"({"__metadata__":{"m":[")" + std::string(1'000'000, 'x') + "\"]}}", ""),
               "'m' holds [\"xxxxxxxx");
}

TEST_F(SafetensorsCorruptFileTest, HeaderPaddingFollowsPythonsReader) {
  const std::string entry = R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})";
  // Spaces (what writers pad with), tabs and newlines around the JSON are whitespace...
  for (const std::string& padded : {entry + "   ", "  " + entry, entry + "\n\t\r "}) {
    write_raw_file(path_, make_file(padded, "x"));
    EXPECT_EQ(load_safetensors(path_).size(), 1u) << padded;
  }
  // ... a NUL byte is not: nlohmann stops reading at one, Python's reader refuses it.
  expect_error(make_file(entry + std::string(3, '\0'), "x"), "a NUL byte at offset 53");
  expect_error(make_file(entry + std::string("\0junk", 5), "x"), "a NUL byte at offset 53");
}

TEST_F(SafetensorsCorruptFileTest, NullMetadataIsNoMetadata) {
  write_raw_file(
      path_,
      make_file(R"({"__metadata__":null,"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})",
                "x"));
  EXPECT_EQ(load_safetensors(path_).size(), 1u);
  EXPECT_TRUE(load_safetensors_metadata(path_).empty());
  expect_error(make_file(R"({"__metadata__":"pt"})", ""),
               "\"__metadata__\" is not a JSON object (or null) but \"pt\"");
}

TEST_F(SafetensorsCorruptFileTest, DuplicateFieldsFollowPythonsReader) {
  // Refused, as serde refuses a struct field given twice.
  expect_error(make_file(R"({"__metadata__":{},"__metadata__":{}})", ""),
               "the header has \"__metadata__\" twice");
  expect_error(
      make_file(R"({"w":{"dtype":"F32","dtype":"U8","shape":[1],"data_offsets":[0,1]}})", "x"),
      "the header entry of tensor 'w' has \"dtype\" twice");
  expect_error(
      make_file(R"({"w":{"dtype":"U8","shape":[1],"shape":[1],"data_offsets":[0,1]}})", "x"),
      "has \"shape\" twice");
  // Kept, the last one winning: a tensor name, a metadata key, a field the format does not know.
  write_raw_file(path_,
                 make_file(R"({"w":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},)"
                           R"("w":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"x":1,"x":2},)"
                           R"("__metadata__":{"k":"1","k":"2"}})",
                           "x"));
  const auto loaded = load_safetensors(path_);
  ASSERT_EQ(loaded.size(), 1u);
  EXPECT_EQ(loaded[0].second.sizes(), at::IntArrayRef({1}));
  EXPECT_EQ(load_safetensors_metadata(path_), (std::map<std::string, std::string>{{"k", "2"}}));
}

TEST_F(SafetensorsCorruptFileTest, UnknownDtype) {
  expect_error(make_file(R"({"w":{"dtype":"F128","shape":[1],"data_offsets":[0,16]}})",
                         std::string(16, '\0')),
               "tensor 'w' has unknown dtype 'F128' (known: F64, F32, F16, BF16");
}

TEST_F(SafetensorsCorruptFileTest, OffsetsThatDoNotTileTheData) {
  const std::string data(16, '\0');
  expect_error(
      make_file("{" + f32_entry("a", "[2]", 0, 8) + "," + f32_entry("b", "[2]", 4, 12) + "}",
                data.substr(0, 12)),
      "tensor 'b' (bytes [4, 12)) overlaps tensor 'a' (bytes [0, 8))");
  expect_error(
      make_file("{" + f32_entry("a", "[2]", 0, 8) + "," + f32_entry("b", "[2]", 12, 20) + "}",
                data + "xxxx"),
      "the 4 bytes before tensor 'b' (bytes [12, 20)) belong to no tensor");
  expect_error(make_file("{" + f32_entry("a", "[2]", 4, 12) + "}", data.substr(0, 12)),
               "the 4 bytes before tensor 'a'");
  expect_error(make_file("{" + f32_entry("a", "[2]", 8, 0) + "}", data),
               "tensor 'a' has data_offsets [8, 0] whose end is before its begin");
  expect_error(
      make_file("{" + f32_entry("a", "[2,2]", 0, 12) + "}", data.substr(0, 12)),
      "tensor 'a' has 12 bytes (data_offsets [0, 12]), but dtype F32 and shape [2, 2] need 16");
  expect_error(make_file("{" + f32_entry("a", "[4611686018427387904,8]", 0, 16) + "}", data),
               "need more than 2^64");
  expect_error(
      make_file("{" + f32_entry("a", "[4]", 0, 16) + "," + f32_entry("b", "[4]", 16, 32) + "}",
                data),
      "tensor 'b' ends at byte 32 of the data, but the file holds only 16 bytes of data after "
      "the header (truncated?)");
  expect_error(make_file("{" + f32_entry("a", "[2]", 0, 8) + "}", data),
               "the file has 8 bytes after the last tensor's data (which ends at byte 8 of 16)");
}

TEST_F(SafetensorsCorruptFileTest, TruncatedAndExtendedValidFiles) {
  const auto good = dir_.file("good.safetensors");
  save_safetensors(
      good, {{"w", torch::arange(10, torch::kFloat)}, {"b", torch::ones({3}, torch::kHalf)}});
  const auto bytes = mantissa::io::read_file(good);
  const std::string valid(bytes.begin(), bytes.end());
  expect_error(valid.substr(0, valid.size() - 3), "truncated?");
  expect_error(valid.substr(0, 20), "the header length is");
  expect_error(valid + "junk", "bytes after the last tensor's data");
}

TEST_F(SafetensorsCorruptFileTest, RandomDamageNeverCrashes) {
  // Flip bytes of a valid file and cut it at random places: the reader either loads something
  // well-formed or throws c10::Error; it never crashes, hangs or throws anything else.
  const auto good = dir_.file("good.safetensors");
  save_safetensors(good,
                   {{"weight", torch::randn({5, 7})},
                    {"bias", torch::randn({7}).to(torch::kBFloat16)},
                    {"steps", torch::arange(4, torch::kLong)}},
                   {{"note", "fuzz"}});
  const auto bytes = mantissa::io::read_file(good);
  const std::string valid(bytes.begin(), bytes.end());
  std::mt19937 rng(20240531);
  int loaded = 0;
  int rejected = 0;
  for (int trial = 0; trial < 400; ++trial) {
    std::string damaged = valid;
    if (trial % 4 == 3) {
      damaged.resize(std::uniform_int_distribution<std::size_t>(0, valid.size() - 1)(rng));
    } else {
      // Mostly damage the header (the first ~250 bytes), where the structure lives.
      const int flips = 1 + trial % 3;
      for (int f = 0; f < flips; ++f) {
        const auto limit =
            trial % 2 ? valid.size() - 1 : std::min<std::size_t>(valid.size() - 1, 250);
        const auto pos = std::uniform_int_distribution<std::size_t>(0, limit)(rng);
        damaged[pos] = static_cast<char>(std::uniform_int_distribution<int>(0, 255)(rng));
      }
    }
    write_raw_file(path_, damaged);
    try {
      for (const auto& [name, tensor] : load_safetensors(path_)) {
        ASSERT_TRUE(tensor.defined()) << name;
        ASSERT_EQ(static_cast<std::size_t>(tensor.nbytes()),
                  tensor.numel() * tensor.element_size());
      }
      ++loaded;
    } catch (const c10::Error& e) {
      ASSERT_THAT(e.what(), HasSubstr(path_));
      ++rejected;
    }
  }
  EXPECT_GT(rejected, 100);
  EXPECT_GT(loaded, 0) << "flips in tensor data leave a loadable file";
}

// ---------------------------------------------------------------------------------------------
// Modules

struct NetImpl : torch::nn::Module {
  explicit NetImpl(int64_t hidden = 16, bool with_head = false) {
    fc1 = register_module("fc1", torch::nn::Linear(8, hidden));
    bn = register_module("bn", torch::nn::BatchNorm1d(hidden));
    fc2 = register_module("fc2", torch::nn::Linear(hidden, 4));
    if (with_head) head = register_module("head", torch::nn::Linear(4, 2));
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, head{nullptr};
  torch::nn::BatchNorm1d bn{nullptr};
};
TORCH_MODULE(Net);

void expect_same_state(const torch::nn::Module& a, const torch::nn::Module& b) {
  auto pa = a.named_parameters();
  auto pb = b.named_parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (const auto& item : pa) EXPECT_TRUE(torch::equal(item.value(), pb[item.key()])) << item.key();
  auto ba = a.named_buffers();
  auto bb = b.named_buffers();
  ASSERT_EQ(ba.size(), bb.size());
  for (const auto& item : ba) EXPECT_TRUE(torch::equal(item.value(), bb[item.key()])) << item.key();
}

TEST(SafetensorsModuleTest, RoundTripsParametersAndBuffersWithHfNames) {
  TempDir dir;
  const auto path = dir.file("model.safetensors");
  torch::manual_seed(1);
  Net source;
  {
    torch::NoGradGuard no_grad;
    source->bn->forward(torch::randn({6, 16}) * 3 +
                        1);  // moves running_mean/var, num_batches_tracked
  }
  save_module_safetensors(path, *source);

  std::vector<std::string> names;
  for (const auto& [name, tensor] : load_safetensors(path)) names.push_back(name);
  EXPECT_EQ(names, (std::vector<std::string>{"fc1.weight", "fc1.bias", "bn.weight", "bn.bias",
                                             "fc2.weight", "fc2.bias", "bn.running_mean",
                                             "bn.running_var", "bn.num_batches_tracked"}));
  EXPECT_EQ(load_safetensors_metadata(path),
            (std::map<std::string, std::string>{{"format", "pt"}}));

  torch::manual_seed(2);
  Net target;
  ASSERT_FALSE(torch::equal(target->fc1->weight, source->fc1->weight));
  const auto keys = load_module_safetensors(path, *target);
  EXPECT_TRUE(keys.missing_keys.empty());
  EXPECT_TRUE(keys.unexpected_keys.empty());
  expect_same_state(*source, *target);
  EXPECT_EQ(target->bn->num_batches_tracked.item<int64_t>(), 1);
  // Loading copies into the existing tensors: parameters stay leaves that require grad.
  EXPECT_TRUE(target->fc1->weight.requires_grad());
  EXPECT_TRUE(target->fc1->weight.is_leaf());
}

TEST(SafetensorsModuleTest, StrictLoadListsMissingAndUnexpectedKeys) {
  TempDir dir;
  const auto path = dir.file("model.safetensors");
  Net with_head(16, true);
  Net without_head(16, false);
  save_module_safetensors(path, *without_head);
  const auto before = with_head->fc1->weight.clone();
  EXPECT_THAT([&] { load_module_safetensors(path, *with_head); },
              ThrowsMessage<c10::Error>(AllOf(
                  HasSubstr("Error(s) in loading state_dict for"), HasSubstr(path),
                  HasSubstr("Missing key(s) in state_dict: \"head.weight\", \"head.bias\". "))));
  EXPECT_TRUE(torch::equal(with_head->fc1->weight, before)) << "a failed load changes nothing";

  save_module_safetensors(path, *with_head);
  EXPECT_THAT([&] { load_module_safetensors(path, *without_head); },
              ThrowsMessage<c10::Error>(
                  HasSubstr("Unexpected key(s) in state_dict: \"head.weight\", \"head.bias\". ")));

  // Not strict: loads what matches and reports the rest, like Python's _IncompatibleKeys.
  Net fresh(16, false);
  const auto keys = load_module_safetensors(path, *fresh, /*strict=*/false);
  EXPECT_TRUE(keys.missing_keys.empty());
  EXPECT_EQ(keys.unexpected_keys, (std::vector<std::string>{"head.weight", "head.bias"}));
  EXPECT_TRUE(torch::equal(fresh->fc2->weight, with_head->fc2->weight));
}

TEST(SafetensorsModuleTest, ShapeMismatchNamesTensorAndBothShapes) {
  TempDir dir;
  const auto path = dir.file("model.safetensors");
  Net small(4);
  Net big(16);
  save_module_safetensors(path, *small);
  const auto before = big->fc1->bias.clone();
  for (const bool strict : {true, false}) {
    EXPECT_THAT(
        [&] { load_module_safetensors(path, *big, strict); },
        ThrowsMessage<c10::Error>(HasSubstr(
            "size mismatch for fc1.weight: copying a param with shape torch.Size([4, 8]) from "
            "checkpoint, the shape in current model is torch.Size([16, 8]).")));
  }
  EXPECT_TRUE(torch::equal(big->fc1->bias, before)) << "nothing copied, not even matching tensors";
}

TEST(SafetensorsModuleTest, DtypeMismatchNeedsOptIn) {
  TempDir dir;
  const auto path = dir.file("model.safetensors");
  Net bf16;
  bf16->to(torch::kBFloat16);
  save_module_safetensors(path, *bf16);
  Net f32;
  EXPECT_THAT([&] { load_module_safetensors(path, *f32); },
              ThrowsMessage<c10::Error>(
                  AllOf(HasSubstr("dtype mismatch for fc1.weight: the checkpoint holds "
                                  "BFloat16, the model has Float"),
                        HasSubstr("allow_dtype_cast"))));
  load_module_safetensors(path, *f32, /*strict=*/true, /*allow_dtype_cast=*/true);
  EXPECT_EQ(f32->fc1->weight.scalar_type(), torch::kFloat);
  EXPECT_TRUE(torch::equal(f32->fc1->weight, bf16->fc1->weight.to(torch::kFloat)));
}

// ---------------------------------------------------------------------------------------------
// Interop with Python's safetensors package (the reference implementation).

// The tensors both sides build: name -> (safetensors code, shape).
const std::vector<std::pair<std::string, std::pair<std::string, std::vector<int64_t>>>>&
interop_specs() {
  static const std::vector<std::pair<std::string, std::pair<std::string, std::vector<int64_t>>>>
      specs = {
          {"model.f64", {"F64", {2, 3}}},    {"model.f32", {"F32", {4, 5}}},
          {"model.bf16", {"BF16", {3, 7}}},  {"model.f16", {"F16", {6}}},
          {"model.i64", {"I64", {2, 2, 2}}}, {"model.i32", {"I32", {5}}},
          {"model.i16", {"I16", {3}}},       {"model.i8", {"I8", {4}}},
          {"model.u8", {"U8", {9}}},         {"model.bool", {"BOOL", {2, 5}}},
          {"model.scalar", {"F32", {}}},     {"model.empty", {"F32", {0, 3}}},
      };
  return specs;
}

torch::ScalarType dtype_of(const std::string& code) {
  for (const auto& [c, dtype] : all_dtypes()) {
    if (c == code) return dtype;
  }
  throw std::runtime_error("unknown code " + code);
}

// The Python twin of pattern() and interop_specs().
constexpr const char* kPythonPattern = R"PY(
import sys
import torch

TYPES = {"F64": torch.float64, "F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16,
         "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
         "U8": torch.uint8, "BOOL": torch.bool}
SPECS = {"model.f64": ("F64", [2, 3]), "model.f32": ("F32", [4, 5]), "model.bf16": ("BF16", [3, 7]),
         "model.f16": ("F16", [6]), "model.i64": ("I64", [2, 2, 2]), "model.i32": ("I32", [5]),
         "model.i16": ("I16", [3]), "model.i8": ("I8", [4]), "model.u8": ("U8", [9]),
         "model.bool": ("BOOL", [2, 5]), "model.scalar": ("F32", []), "model.empty": ("F32", [0, 3])}

def pattern(dtype, shape):
    numel = 1
    for d in shape:
        numel *= d
    base = torch.arange(numel, dtype=torch.float64).reshape(shape)
    if dtype == torch.bool:
        return base.fmod(3).eq(0)
    if dtype == torch.uint8:
        return (base * 3).to(dtype)
    return (base * 1.5 - 4).to(dtype)
)PY";

TEST(SafetensorsInteropTest, PythonReadsWhatCppWrites) {
  TempDir dir;
  std::string python;
  MANTISSA_SKIP_WITHOUT_PYTHON_MODULES(python, "torch, safetensors.torch", dir.path());
  NamedTensors tensors;
  for (const auto& [name, spec] : interop_specs())
    tensors.emplace_back(name, pattern(dtype_of(spec.first), spec.second));
  const auto path = dir.file("from_cpp.safetensors");
  save_safetensors(path, tensors, {{"producer", "mantissa"}});

  const std::string script = std::string(kPythonPattern) + R"PY(
from safetensors import safe_open
from safetensors.torch import load_file

loaded = load_file(sys.argv[1])
assert sorted(loaded) == sorted(SPECS), sorted(loaded)
for name, (code, shape) in SPECS.items():
    expected = pattern(TYPES[code], shape)
    got = loaded[name]
    assert got.dtype == expected.dtype, (name, got.dtype, expected.dtype)
    assert list(got.shape) == shape, (name, got.shape, shape)
    assert torch.equal(got, expected), (name, got, expected)
with safe_open(sys.argv[1], framework="pt") as f:
    assert f.metadata() == {"format": "pt", "producer": "mantissa"}, f.metadata()
print("INTEROP_OK", len(loaded))
)PY";
  const auto result = mantissa_test::run_python(python, script, path, dir.path());
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_THAT(result.output, HasSubstr("INTEROP_OK 12"));
}

TEST(SafetensorsInteropTest, CppReadsWhatPythonWrites) {
  TempDir dir;
  std::string python;
  MANTISSA_SKIP_WITHOUT_PYTHON_MODULES(python, "torch, safetensors.torch", dir.path());
  const auto path = dir.file("from_python.safetensors");
  // safetensors.torch.save_file needs numpy (it takes each tensor's address through a numpy
  // array); without numpy the script hands the same addresses to the same Rust serializer
  // that save_file calls, safetensors.serialize_file.
  const std::string script = std::string(kPythonPattern) + R"PY(
tensors = {name: pattern(TYPES[code], shape) for name, (code, shape) in SPECS.items()}
metadata = {"format": "pt", "producer": "python"}
try:
    import numpy  # noqa: F401
    from safetensors.torch import save_file
    save_file(tensors, sys.argv[1], metadata=metadata)
    print("WROTE_WITH save_file")
except ImportError:
    from safetensors import TensorSpec, serialize_file
    specs = {name: TensorSpec(dtype=str(t.dtype).split(".")[-1], shape=t.shape,
                              data_ptr=t.data_ptr(), data_len=t.nbytes)
             for name, t in tensors.items()}
    serialize_file(specs, sys.argv[1], metadata=metadata)
    print("WROTE_WITH serialize_file")
)PY";
  const auto result = mantissa_test::run_python(python, script, path, dir.path());
  ASSERT_EQ(result.exit_code, 0) << result.output;
  ASSERT_THAT(result.output, HasSubstr("WROTE_WITH"));

  const auto loaded = load_safetensors(path);
  ASSERT_EQ(loaded.size(), interop_specs().size());
  std::map<std::string, torch::Tensor> by_name(loaded.begin(), loaded.end());
  for (const auto& [name, spec] : interop_specs()) {
    ASSERT_EQ(by_name.count(name), 1u) << name;
    expect_same_tensor(by_name[name], pattern(dtype_of(spec.first), spec.second), name);
  }
  EXPECT_EQ(load_safetensors_metadata(path),
            (std::map<std::string, std::string>{{"format", "pt"}, {"producer", "python"}}));
}

}  // namespace

namespace {

// Hand-made headers on the edges of the format, each paired with a short name. The interop test
// below feeds the same bytes to Python's safetensors and to load_safetensors.
std::vector<std::pair<std::string, std::string>> edge_case_files() {
  const std::string w = R"("w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]})";
  const std::string four(4, '\0');
  const auto nested = [](std::size_t levels) {
    return R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"x":)" +
           std::string(levels, '[') + std::string(levels, ']') + "}}";
  };
  return {
      {"nul_padding", make_file("{" + w + "}" + std::string(3, '\0'), four)},
      {"nul_then_text", make_file("{" + w + "}" + std::string("\0xyz", 4), four)},
      {"space_padding", make_file("{" + w + "}   ", four)},
      {"leading_spaces", make_file("   {" + w + "}", four)},
      {"tab_newline_padding", make_file("{" + w + "}\t\n\r ", four)},
      {"metadata_null", make_file(R"({"__metadata__":null,)" + w + "}", four)},
      {"metadata_number", make_file(R"({"__metadata__":{"a":1},)" + w + "}", four)},
      {"metadata_twice", make_file(R"({"__metadata__":{},"__metadata__":{},)" + w + "}", four)},
      {"metadata_key_twice", make_file(R"({"__metadata__":{"a":"1","a":"2"}})", "")},
      {"tensor_twice",
       make_file("{" + w + ",\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
                 std::string(8, '\0'))},
      {"dtype_twice",
       make_file(R"({"w":{"dtype":"F16","dtype":"F32","shape":[1],"data_offsets":[0,4]}})", four)},
      {"unknown_field_twice",
       make_file(R"({"w":{"x":1,"x":2,"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", four)},
      {"unknown_field",
       make_file(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"x":[{"y":2}]}})", four)},
      {"number_overflow",
       make_file(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"x":-1e400}})", four)},
      {"number_underflow",
       make_file(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"x":1e-400}})", four)},
      {"shape_minus_zero",
       make_file(R"({"w":{"dtype":"F32","shape":[-0],"data_offsets":[0,0]}})", "")},
      {"shape_float",
       make_file(R"({"w":{"dtype":"F32","shape":[1.0],"data_offsets":[0,4]}})", four)},
      {"shape_exponent",
       make_file(R"({"w":{"dtype":"F32","shape":[1e0],"data_offsets":[0,4]}})", four)},
      {"shape_null", make_file(R"({"w":{"dtype":"F32","shape":null,"data_offsets":[0,0]}})", "")},
      {"shape_2_64",
       make_file(R"({"w":{"dtype":"F32","shape":[18446744073709551616],"data_offsets":[0,4]}})",
                 four)},
      {"numel_overflow",
       make_file(R"({"w":{"dtype":"U8","shape":[4294967296,4294967296],"data_offsets":[0,0]}})",
                 "")},
      {"three_offsets",
       make_file(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4,4]}})", four)},
      {"offsets_object",
       make_file(R"({"w":{"dtype":"F32","shape":[],"data_offsets":{"0":0}}})", four)},
      {"lone_surrogate",
       make_file(R"({"\ud800":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", four)},
      {"escaped_nul_in_name",
       make_file(R"({"a\u0000b":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", four)},
      {"empty_header", make_file("", "")},
      {"empty_object", make_file("{}", "")},
      {"byte_order_mark", make_file("\xef\xbb\xbf{}", "")},
      {"invalid_utf8_padding", make_file("{}\xff", "")},
      {"comment", make_file("{/*x*/}", "")},
      {"lowercase_dtype",
       make_file(R"({"w":{"dtype":"f32","shape":[1],"data_offsets":[0,4]}})", four)},
      {"tensor_null", make_file(R"({"w":null})", "")},
      {"two_empty_tensors", make_file(R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},)"
                                      R"("b":{"dtype":"F32","shape":[0],"data_offsets":[0,0]}})",
                                      "")},
      {"fp8_fnuz_and_e8m0",
       make_file(R"({"a":{"dtype":"F8_E4M3FNUZ","shape":[2],"data_offsets":[0,2]},)"
                 R"("b":{"dtype":"F8_E5M2FNUZ","shape":[1],"data_offsets":[2,3]},)"
                 R"("c":{"dtype":"F8_E8M0","shape":[1],"data_offsets":[3,4]}})",
                 "\x01\x02\x03\x7f")},
      {"nested_127", make_file(nested(125), four)},
      {"nested_128", make_file(nested(126), four)},
      {"nested_100000", make_file(nested(100'000), four)},
  };
}

// "OK a[2] b[]" (names and shapes, by name) or "FAIL": what a reader made of a file.
std::string cpp_verdict(const std::string& path) {
  try {
    auto loaded = load_safetensors(path);
    std::sort(loaded.begin(), loaded.end(),
              [](const auto& a, const auto& b) { return a.first < b.first; });
    std::string out = "OK";
    for (const auto& [name, tensor] : loaded) {
      out += " " + name + "[";
      for (std::size_t i = 0; i < tensor.sizes().size(); ++i)
        out += (i ? "," : "") + std::to_string(tensor.size(i));
      out += "]";
    }
    return out;
  } catch (const c10::Error&) {
    return "FAIL";
  }
}

}  // namespace

TEST(SafetensorsInteropTest, AcceptsAndRefusesTheSameFilesAsPython) {
  TempDir dir;
  std::string python;
  MANTISSA_SKIP_WITHOUT_PYTHON_MODULES(python, "torch, safetensors.torch", dir.path());
  const auto cases = edge_case_files();
  for (const auto& [name, bytes] : cases) write_raw_file(dir.file(name + ".safetensors"), bytes);
  const std::string script = R"PY(
import os, sys
from safetensors.torch import load_file
for entry in sorted(os.listdir(sys.argv[1])):
    if not entry.endswith(".safetensors"):
        continue
    try:
        loaded = load_file(os.path.join(sys.argv[1], entry))
        parts = ["%s[%s]" % (k, ",".join(str(d) for d in loaded[k].shape)) for k in sorted(loaded)]
        verdict = " ".join(["OK"] + parts)
    except Exception:
        verdict = "FAIL"
    print("VERDICT", entry[: -len(".safetensors")], verdict, sep="\t")
)PY";
  const auto result = mantissa_test::run_python(python, script, dir.path(), dir.path());
  ASSERT_EQ(result.exit_code, 0) << result.output;
  std::map<std::string, std::string> python_verdicts;
  std::istringstream lines(result.output);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("VERDICT\t", 0) != 0) continue;
    const auto tab = line.find('\t', 8);
    python_verdicts[line.substr(8, tab - 8)] = line.substr(tab + 1);
  }
  ASSERT_EQ(python_verdicts.size(), cases.size()) << result.output;
  for (const auto& [name, bytes] : cases) {
    EXPECT_EQ(cpp_verdict(dir.file(name + ".safetensors")), python_verdicts[name]) << name;
  }
}

namespace {

TEST(SafetensorsFileTest, ReadsOneTensorOrARangeOfItWithoutTheRest) {
  TempDir dir;
  const auto path = dir.file("t.safetensors");
  const auto a = torch::arange(12, torch::kFloat).view({3, 4});
  const auto b = torch::arange(5, torch::kLong);
  save_safetensors(path, {{"a", a}, {"b", b}}, {{"note", "x"}});
  const mantissa::io::SafetensorsFile file(path);
  EXPECT_EQ(file.keys(), (std::vector<std::string>{"a", "b"}));
  EXPECT_TRUE(file.contains("b"));
  EXPECT_FALSE(file.contains("c"));
  EXPECT_EQ(file.metadata().at("note"), "x");
  EXPECT_EQ(file.shape("a"), (std::vector<std::int64_t>{3, 4}));
  EXPECT_EQ(file.dtype("b"), torch::kLong);
  EXPECT_TRUE(torch::equal(file.get_tensor("a"), a));
  EXPECT_TRUE(torch::equal(file.get_flat_slice("a", 5, 6), a.reshape({-1}).narrow(0, 5, 6)));
  EXPECT_TRUE(torch::equal(file.get_flat_slice("b", 4, 1), b.narrow(0, 4, 1)));
  EXPECT_EQ(file.get_flat_slice("b", 5, 0).numel(), 0);
  EXPECT_THAT([&] { file.get_flat_slice("a", 10, 3); },
              ThrowsMessage<c10::Error>(AllOf(HasSubstr("elements [10, 13) are outside tensor 'a'"),
                                              HasSubstr(path))));
  EXPECT_THAT([&] { file.get_tensor("c"); },
              ThrowsMessage<c10::Error>(HasSubstr("has no tensor 'c'")));
  // A corrupt header is refused when the file is opened, as load_safetensors refuses it.
  write_raw_file(dir.file("bad.safetensors"), std::string(4, '\0'));
  EXPECT_THAT([&] { mantissa::io::SafetensorsFile bad(dir.file("bad.safetensors")); },
              ThrowsMessage<c10::Error>(HasSubstr("fewer than the 8-byte header length")));
}

}  // namespace

// ---- save_pretrained_weights: model.safetensors, or shards with their index -----------------

namespace {

using mantissa::io::parse_shard_size;
using mantissa::io::save_pretrained_weights;

NamedTensors four_tensors() {
  // 400, 200, 800 and 40 bytes of fp32, in the model's order.
  return {{"embed.weight", torch::arange(100, torch::kFloat)},
          {"blocks.0.w", torch::arange(50, torch::kFloat).neg()},
          {"blocks.1.w", torch::linspace(0, 1, 200)},
          {"norm.weight", torch::ones({10})}};
}

std::vector<std::string> weight_files(const std::string& dir) {
  auto names = mantissa::io::list_directory(dir);
  std::sort(names.begin(), names.end());
  return names;
}

TEST(PretrainedWeightsTest, OneFileUpToTheLimitAndShardsWithAnIndexAbove) {
  TempDir dir;
  const auto tensors = four_tensors();
  EXPECT_THAT(save_pretrained_weights(dir.path(), tensors),
              ::testing::ElementsAre("model.safetensors"));
  const auto whole = load_safetensors(dir.file("model.safetensors"));
  ASSERT_EQ(whole.size(), 4u);
  EXPECT_TRUE(whole[2].second.equal(tensors[2].second));
  EXPECT_EQ(load_safetensors_metadata(dir.file("model.safetensors")).at("format"), "pt");

  // 600 bytes: [embed, blocks.0] (600), [blocks.1] (800, larger than the limit: alone),
  // [norm] (40). The single file of the first save is removed.
  const auto written = save_pretrained_weights(dir.path(), tensors, 600);
  EXPECT_THAT(written, ::testing::ElementsAre("model-00001-of-00003.safetensors",
                                              "model-00002-of-00003.safetensors",
                                              "model-00003-of-00003.safetensors",
                                              "model.safetensors.index.json"));
  EXPECT_THAT(weight_files(dir.path()), ::testing::ElementsAreArray(std::vector<std::string>{
                                            "model-00001-of-00003.safetensors",
                                            "model-00002-of-00003.safetensors",
                                            "model-00003-of-00003.safetensors",
                                            "model.safetensors.index.json"}));
  const auto bytes = mantissa::io::read_file(dir.file("model.safetensors.index.json"), 1 << 20);
  const auto index = nlohmann::json::parse(std::string(bytes.data(), bytes.size()));
  EXPECT_EQ(index["metadata"]["total_size"], 1440);
  EXPECT_EQ(index["metadata"]["total_parameters"], 360);
  EXPECT_EQ(index["weight_map"]["embed.weight"], "model-00001-of-00003.safetensors");
  EXPECT_EQ(index["weight_map"]["blocks.0.w"], "model-00001-of-00003.safetensors");
  EXPECT_EQ(index["weight_map"]["blocks.1.w"], "model-00002-of-00003.safetensors");
  EXPECT_EQ(index["weight_map"]["norm.weight"], "model-00003-of-00003.safetensors");
  // Every tensor is in the shard the index names, with its values.
  for (const auto& [tensor_name, tensor] : tensors) {
    const std::string& name = tensor_name;
    const auto shard = load_safetensors(dir.file(index["weight_map"][name].get<std::string>()));
    const auto found = std::find_if(shard.begin(), shard.end(),
                                    [&](const auto& item) { return item.first == name; });
    ASSERT_NE(found, shard.end()) << name;
    EXPECT_TRUE(found->second.equal(tensor)) << name;
  }

  // Back to one file: the shards and the index of the previous save go; other files stay.
  mantissa::io::write_file_atomically(dir.file("config.json"), "{}\n");
  save_pretrained_weights(dir.path(), tensors);
  EXPECT_THAT(weight_files(dir.path()),
              ::testing::ElementsAre("config.json", "model.safetensors"));
}

TEST(PretrainedWeightsTest, SizesAreReadAsSavePretrainedReadsThem) {
  EXPECT_EQ(parse_shard_size("1000000"), 1000000);
  EXPECT_EQ(parse_shard_size("5GB"), 5'000'000'000);
  EXPECT_EQ(parse_shard_size("200KB"), 200'000);
  EXPECT_EQ(parse_shard_size("1.5mib"), 1572864);
  EXPECT_EQ(parse_shard_size("2GiB"), 2147483648);
  for (const char* bad : {"", "GB", "5 TB", "-1GB", "0", "nan", "1e30GB"}) {
    EXPECT_THAT(mantissa_test::value_error_of([&] { parse_shard_size(bad); }),
                HasSubstr(std::string("max_shard_size \"") + bad + "\" is not a positive size"))
        << bad;
  }
  TempDir dir;
  EXPECT_THAT(mantissa_test::value_error_of([&] { save_pretrained_weights(dir.path(), {}); }),
              HasSubstr("no tensors to save"));
  EXPECT_THAT(
      mantissa_test::value_error_of([&] { save_pretrained_weights(dir.path(), four_tensors(), 0); }),
      HasSubstr("max_shard_size must be positive, got 0"));
}

}  // namespace
