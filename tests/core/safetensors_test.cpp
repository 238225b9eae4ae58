// safetensors round trips, an independent reading of what we write, and hostile inputs.
#include "core/safetensors.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>

#include "core/error.h"
#include "core/factory.h"

namespace dpt {
namespace {

namespace fs = std::filesystem;

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("dpt_safetensors_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  // A file from a raw header and data, for hostile inputs. `length` overrides the header length field.
  std::string write_raw(const std::string& name, std::string header, const std::string& data,
                        int64_t length = -1) {
    while (header.size() % 8) header += ' ';
    uint64_t n = length >= 0 ? static_cast<uint64_t>(length) : header.size();
    std::string bytes(8, '\0');
    for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>(n >> (8 * i));
    bytes += header + data;
    std::ofstream(path(name), std::ios::binary) << bytes;
    return path(name);
  }

  // Expects load_safetensors to throw dpt::Error whose message contains `needle`.
  static void expect_error(const std::string& file, const std::string& needle) {
    try {
      load_safetensors(file);
      FAIL() << "expected an error containing '" << needle << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  }

  fs::path dir_;
};

std::string read_file(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

TEST_F(SafetensorsTest, RoundTripKeepsNamesShapesDtypesValuesAndMetadata) {
  NamedTensors tensors = {
      {"blocks.0.attn.qkv.weight", from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3})},
      {"step", from_vector<int64_t>({42}, {}, TensorOptions{}.with_dtype(DType::Int64))},
      {"x64", from_vector<double>({0.1, -0.2}, {2}, TensorOptions{}.with_dtype(DType::Float64))},
      {"h", from_vector<float>({1.5f, -2.25f, 3.0f}, {3}, TensorOptions{}.with_dtype(DType::BFloat16))},
      {"idx", from_vector<int32_t>({7, 8, 9, 10}, {2, 2}, TensorOptions{}.with_dtype(DType::Int32))},
      {"empty", from_vector<float>({}, {0, 4})},
  };
  save_safetensors(path("a.safetensors"), tensors, {{"format", "pt"}, {"quote\"d", "line\nbreak"}});
  SafetensorsContents c = load_safetensors(path("a.safetensors"));
  ASSERT_EQ(c.tensors.size(), tensors.size());
  for (const auto& [name, t] : tensors) {
    ASSERT_TRUE(c.contains(name)) << name;
    const Tensor& r = c.at(name);
    EXPECT_EQ(r.shape(), t.shape()) << name;
    EXPECT_EQ(r.dtype(), t.dtype()) << name;
    EXPECT_EQ(r.to_vector<double>(), t.to_vector<double>()) << name;
  }
  EXPECT_EQ(c.metadata.at("format"), "pt");
  EXPECT_EQ(c.metadata.at("quote\"d"), "line\nbreak");
  // Data is ordered by alignment (8-byte dtypes first), then name.
  EXPECT_EQ(c.tensors[0].first, "step");
  EXPECT_EQ(c.tensors[1].first, "x64");
  EXPECT_THROW(c.at("missing"), Error);
}

// Reads the file with nothing from our parser: the byte layout a Python reader relies on.
TEST_F(SafetensorsTest, IndependentReaderSeesTheSameLayout) {
  std::vector<float> w = {1.5f, -2.0f, 3.25f, 0.0f, 7.0f, -8.5f};
  std::vector<int64_t> s = {123456789012345LL};
  save_safetensors(path("b.safetensors"), {{"layer.weight", from_vector<float>(w, {3, 2})},
                                           {"a.step", from_vector<int64_t>(s, {1}, TensorOptions{}.with_dtype(DType::Int64))}});
  std::string bytes = read_file(path("b.safetensors"));
  ASSERT_GE(bytes.size(), 8u);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[i]);
  EXPECT_EQ(n % 8, 0u);
  ASSERT_LE(8 + n, bytes.size());
  std::string header = bytes.substr(8, n);
  EXPECT_EQ(header[0], '{');
  std::regex entry_re(R"re("([^"]+)"\s*:\s*\{\s*"dtype"\s*:\s*"(\w+)"\s*,\s*"shape"\s*:\s*\[([0-9,\s]*)\]\s*,)re"
                      R"re(\s*"data_offsets"\s*:\s*\[\s*(\d+)\s*,\s*(\d+)\s*\]\s*\})re");
  std::map<std::string, std::tuple<std::string, std::string, size_t, size_t>> found;
  for (auto it = std::sregex_iterator(header.begin(), header.end(), entry_re); it != std::sregex_iterator(); ++it) {
    found[(*it)[1]] = {(*it)[2], (*it)[3], std::stoul((*it)[4]), std::stoul((*it)[5])};
  }
  ASSERT_EQ(found.size(), 2u) << header;
  auto [wd, wshape, wb, we] = found.at("layer.weight");
  EXPECT_EQ(wd, "F32");
  EXPECT_EQ(wshape, "3,2");
  ASSERT_EQ(we - wb, w.size() * 4);
  std::vector<float> wr(w.size());
  std::memcpy(wr.data(), bytes.data() + 8 + n + wb, we - wb);
  EXPECT_EQ(wr, w);
  auto [sd, sshape, sb, se] = found.at("a.step");
  EXPECT_EQ(sd, "I64");
  EXPECT_EQ(sshape, "1");
  EXPECT_EQ(sb, 0u);  // the 8-byte dtype precedes the 4-byte one
  int64_t sr;
  std::memcpy(&sr, bytes.data() + 8 + n + sb, 8);
  EXPECT_EQ(sr, s[0]);
  EXPECT_EQ(bytes.size(), 8 + n + 8 + w.size() * 4);
}

TEST_F(SafetensorsTest, ReadsAHandWrittenFileWithEscapesAndWhitespace) {
  float v[2] = {1.0f, 2.0f};
  std::string data(reinterpret_cast<const char*>(v), 8);
  std::string f = write_raw("h.safetensors",
                            "{ \"__metadata__\" : {\"k\": \"v\\u00e9\"},\n \"a\\/b\" : {\"dtype\":\"F32\", "
                            "\"shape\": [2], \"data_offsets\": [0, 8]} }",
                            data);
  SafetensorsContents c = load_safetensors(f);
  EXPECT_EQ(c.metadata.at("k"), "v\xc3\xa9");
  EXPECT_EQ(c.at("a/b").to_vector<float>(), (std::vector<float>{1.0f, 2.0f}));
}

TEST_F(SafetensorsTest, SaveReplacesAtomicallyAndLeavesNoTemporaryFiles) {
  save_safetensors(path("m.safetensors"), {{"w", from_vector<float>({1, 2}, {2})}});
  save_safetensors(path("m.safetensors"), {{"w", from_vector<float>({3, 4, 5}, {3})}});
  EXPECT_EQ(load_safetensors(path("m.safetensors")).at("w").to_vector<float>(), (std::vector<float>{3, 4, 5}));
  int files = 0;
  for (const auto& entry : fs::directory_iterator(dir_)) {
    (void)entry;
    ++files;
  }
  EXPECT_EQ(files, 1);
  // A failed save (duplicate names) leaves the good file and no temporary behind.
  EXPECT_THROW(save_safetensors(path("m.safetensors"), {{"w", from_vector<float>({1}, {1})},
                                                        {"w", from_vector<float>({1}, {1})}}),
               Error);
  EXPECT_EQ(load_safetensors(path("m.safetensors")).at("w").numel(), 3);
  EXPECT_THROW(save_safetensors(path("no_such_dir/m.safetensors"), {}), Error);
}

TEST_F(SafetensorsTest, RejectsTruncatedFile) {
  save_safetensors(path("t.safetensors"), {{"w", from_vector<float>({1, 2, 3, 4}, {4})}});
  std::string bytes = read_file(path("t.safetensors"));
  std::ofstream(path("cut.safetensors"), std::ios::binary) << bytes.substr(0, bytes.size() - 3);
  expect_error(path("cut.safetensors"), "truncated");
  std::ofstream(path("tiny.safetensors"), std::ios::binary) << bytes.substr(0, 5);
  expect_error(path("tiny.safetensors"), "too short");
  std::ofstream(path("long.safetensors"), std::ios::binary) << bytes + "xx";
  expect_error(path("long.safetensors"), "trailing bytes");
}

TEST_F(SafetensorsTest, RejectsHeaderLengthPastEndOrHuge) {
  expect_error(write_raw("p.safetensors", "{}", "", 4096), "past the end");
  expect_error(write_raw("q.safetensors", "{}", "", int64_t{1} << 40), "exceeds");
}

TEST_F(SafetensorsTest, RejectsOverlappingOffsetsAndHoles) {
  std::string data(16, '\0');
  expect_error(write_raw("o.safetensors",
                         R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                         R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                         data.substr(0, 12)),
               "overlaps");
  expect_error(write_raw("g.safetensors",
                         R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                         R"("b":{"dtype":"F32","shape":[1],"data_offsets":[12,16]}})",
                         data),
               "hole");
}

TEST_F(SafetensorsTest, RejectsWrongDtypes) {
  expect_error(write_raw("d.safetensors", R"({"a":{"dtype":"F33","shape":[1],"data_offsets":[0,4]}})",
                         std::string(4, '\0')),
               "unknown dtype 'F33'");
  expect_error(write_raw("e.safetensors", R"({"a":{"dtype":"I16","shape":[2],"data_offsets":[0,4]}})",
                         std::string(4, '\0')),
               "cannot hold");
  expect_error(write_raw("f.safetensors", R"({"a":{"dtype":3,"shape":[1],"data_offsets":[0,4]}})",
                         std::string(4, '\0')),
               "must be a string");
}

TEST_F(SafetensorsTest, RejectsSizeMismatch) {
  expect_error(write_raw("s.safetensors", R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})",
                         std::string(8, '\0')),
               "needs 12 bytes");
  expect_error(write_raw("v.safetensors",
                         R"({"a":{"dtype":"F64","shape":[4294967296,4294967296],"data_offsets":[0,8]}})",
                         std::string(8, '\0')),
               "overflows");
}

TEST_F(SafetensorsTest, RejectsMalformedJson) {
  std::string z(4, '\0');
  expect_error(write_raw("j1.safetensors", R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]})", z),
               "invalid header JSON");
  expect_error(write_raw("j2.safetensors",
                         R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
                         z),
               "duplicate key");
  expect_error(write_raw("j3.safetensors", R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", z),
               "negative");
  expect_error(write_raw("j4.safetensors", R"({"a":{"dtype":"F32","shape":[1.0],"data_offsets":[0,4]}})", z),
               "only integers");
  expect_error(write_raw("j5.safetensors", R"([1,2])", ""), "must start with");
  expect_error(write_raw("j6.safetensors", R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"x":1}})", z),
               "unknown field");
  expect_error(write_raw("j7.safetensors", R"({"__metadata__":{"k":1}})", ""), "must be a string");
  expect_error(write_raw("j8.safetensors", R"({"a":{"dtype":"F32","shape":[1]}})", z), "no \"data_offsets\"");
  expect_error(write_raw("j9.safetensors", "{}xyz", ""), "after the top-level");
}

// Python's own safetensors reads what we write (runs where the package is installed, else skips).
TEST_F(SafetensorsTest, PythonSafetensorsReadsOurFile) {
  if (std::system("python3 -c 'import safetensors, numpy' > /dev/null 2>&1") != 0) {
    GTEST_SKIP() << "python3 with safetensors and numpy not installed";
  }
  save_safetensors(path("py.safetensors"),
                   {{"blocks.0.attn.qkv.weight", from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3})},
                    {"step", from_vector<int64_t>({7}, {1}, TensorOptions{}.with_dtype(DType::Int64))},
                    {"h", from_vector<float>({1.5f, -2.0f}, {2}, TensorOptions{}.with_dtype(DType::BFloat16))}},
                   {{"format", "pt"}});
  std::string script = path("check.py");
  std::ofstream(script) << "import sys\n"
                           "from safetensors import safe_open\n"
                           "with safe_open(sys.argv[1], framework='numpy') as f:\n"
                           "    assert f.metadata() == {'format': 'pt'}, f.metadata()\n"
                           "    w = f.get_tensor('blocks.0.attn.qkv.weight')\n"
                           "    assert w.shape == (2, 3) and str(w.dtype) == 'float32', (w.shape, w.dtype)\n"
                           "    assert w.tolist() == [[1, 2, 3], [4, 5, 6]], w\n"
                           "    s = f.get_tensor('step')\n"
                           "    assert str(s.dtype) == 'int64' and s.tolist() == [7], s\n"
                           "    assert sorted(f.keys()) == ['blocks.0.attn.qkv.weight', 'h', 'step'], list(f.keys())\n"
                           "try:\n"
                           "    import torch\n"
                           "    from safetensors.torch import load_file as load_torch\n"
                           "    h = load_torch(sys.argv[1])['h']\n"
                           "    assert h.dtype == torch.bfloat16 and h.tolist() == [1.5, -2.0], h\n"
                           "except ImportError:\n"
                           "    pass\n";
  std::string cmd = "python3 " + script + " " + path("py.safetensors");
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
}

}  // namespace
}  // namespace dpt
