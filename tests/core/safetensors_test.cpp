// safetensors round trips, an independent reading of what we write, and hostile inputs.
#include "core/safetensors.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>

#include "core/crc32c.h"
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

  // Expects load_safetensors to throw DamagedFile (the bytes prove damage) whose message contains `needle`.
  static void expect_damage(const std::string& file, const std::string& needle) {
    try {
      load_safetensors(file);
      FAIL() << "expected damage: '" << needle << "'";
    } catch (const DamagedFile& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    } catch (const std::exception& e) {
      FAIL() << "expected DamagedFile containing '" << needle << "', got: " << e.what();
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

// --- checksums ------------------------------------------------------------------------------------

TEST(Crc32c, MatchesTheStandardsKnownAnswers) {
  const std::string digits = "123456789";
  EXPECT_EQ(crc32c(digits.data(), digits.size()), 0xE3069283u);
  // RFC 3720 (iSCSI), appendix B.4: 32 bytes of zeros, of ones, ascending.
  std::vector<unsigned char> zeros(32, 0), ones(32, 0xFF), ascending(32);
  for (int i = 0; i < 32; ++i) ascending[static_cast<size_t>(i)] = static_cast<unsigned char>(i);
  EXPECT_EQ(crc32c(zeros.data(), zeros.size()), 0x8A9136AAu);
  EXPECT_EQ(crc32c(ones.data(), ones.size()), 0x62A8AB43u);
  EXPECT_EQ(crc32c(ascending.data(), ascending.size()), 0x46DD794Eu);
  // Continuing from the value of a prefix gives the value of the whole.
  EXPECT_EQ(crc32c(digits.data() + 4, 5, crc32c(digits.data(), 4)), 0xE3069283u);
  EXPECT_EQ(crc32c(nullptr, 0), 0u);
}

// The "crc32c.<name>" value stored for `name` in a file's header, read with a regex (not our parser).
std::string stored_checksum(const std::string& file, const std::string& name) {
  const std::string bytes = read_file(file);
  std::smatch m;
  const std::regex re("\"crc32c\\." + name + "\":\"([0-9a-f]{8})\"");
  const std::string header = bytes.substr(8, 4096);
  return std::regex_search(header, m, re) ? m[1].str() : "";
}

TEST_F(SafetensorsTest, EachTensorsChecksumIsStoredAndMatchesItsBytes) {
  const std::vector<float> w = {1.5f, -2.0f, 3.25f, 0.0f};
  save_safetensors(path("c.safetensors"),
                   {{"w", from_vector<float>(w, {2, 2})},
                    {"n", from_vector<int64_t>({42}, {1}, TensorOptions{}.with_dtype(DType::Int64))}},
                   {{"format", "pt"}});
  const int64_t n42 = 42;
  EXPECT_EQ(stored_checksum(path("c.safetensors"), "w"), fmt::format("{:08x}", crc32c(w.data(), 16)));
  EXPECT_EQ(stored_checksum(path("c.safetensors"), "n"), fmt::format("{:08x}", crc32c(&n42, 8)));
  SafetensorsContents c = load_safetensors(path("c.safetensors"));
  EXPECT_TRUE(c.checksummed);
  // The checksums are the format's business, not the caller's metadata.
  EXPECT_EQ(c.metadata, (SafetensorsMetadata{{"format", "pt"}}));
  EXPECT_THROW(save_safetensors(path("d.safetensors"), {}, {{"crc32c.w", "00000000"}}), Error);
}

TEST_F(SafetensorsTest, AChangedByteFailsItsTensorsChecksumAndIsDamage) {
  save_safetensors(path("c.safetensors"),
                   {{"a", from_vector<float>({1, 2}, {2})}, {"b", from_vector<float>({3, 4}, {2})}});
  std::string bytes = read_file(path("c.safetensors"));
  // A finite change: the last byte of "b" (data order a, b) gains one bit; 4.0f becomes another finite float.
  bytes[bytes.size() - 2] = static_cast<char>(bytes[bytes.size() - 2] ^ 0x01);
  std::ofstream(path("c.safetensors"), std::ios::binary | std::ios::trunc) << bytes;
  try {
    load_safetensors(path("c.safetensors"));
    FAIL() << "a changed byte loaded";
  } catch (const DamagedFile& e) {
    EXPECT_NE(std::string(e.what()).find("tensor 'b' fails its checksum"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(path("c.safetensors")), std::string::npos) << e.what();
  }
}

TEST_F(SafetensorsTest, FilesWithoutChecksumsLoadUnverifiedAndPartialChecksumsAreDamage) {
  float v[2] = {1.0f, 2.0f};
  const std::string data(reinterpret_cast<const char*>(v), 8);
  const std::string a = R"("a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]})";
  const std::string b = R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]})";
  SafetensorsContents old = load_safetensors(write_raw("old.safetensors", "{" + a + "," + b + "}", data));
  EXPECT_FALSE(old.checksummed);
  EXPECT_EQ(old.at("b").to_vector<float>(), std::vector<float>{2.0f});
  const std::string crc_a = fmt::format("{:08x}", crc32c(v, 4));
  expect_damage(
      write_raw("partial.safetensors", R"({"__metadata__":{"crc32c.a":")" + crc_a + R"("},)" + a + "," + b + "}", data),
      "tensor 'b' has no checksum");
  expect_damage(
      write_raw("foreign.safetensors", R"({"__metadata__":{"crc32c.z":")" + crc_a + R"("},)" + a + "," + b + "}", data),
      "names tensor 'z'");
  expect_damage(
      write_raw("malformed.safetensors", R"({"__metadata__":{"crc32c.a":"xyz"},)" + a + "}", data.substr(0, 4)),
      "not 8 hex digits");
}

// --- bounds: what a header may make the reader allocate -------------------------------------------

TEST_F(SafetensorsTest, ShapesOfMoreThanEightDimensionsAreRefusedWhileParsing) {
  expect_damage(write_raw("r9.safetensors", R"({"a":{"dtype":"F32","shape":[1,1,1,1,1,1,1,1,1],"data_offsets":[0,4]}})",
                          std::string(4, '\0')),
                "a tensor has at most 8 dimensions");
  // Ten million extents (20 MB of text) stop at the ninth: the reader never holds them.
  std::string shape = "[";
  for (int i = 0; i < 10000000; ++i) shape += i ? ",1" : "1";
  expect_damage(write_raw("r10m.safetensors", R"({"a":{"dtype":"F32","shape":)" + shape + R"(],"data_offsets":[0,4]}})",
                          std::string(4, '\0')),
                "more than 8 items");
  EXPECT_THROW(save_safetensors(path("w.safetensors"), {{"a", zeros(Shape(9, 1))}}), Error);
}

TEST_F(SafetensorsTest, TooManyTensorsOrMetadataEntriesAreRefused) {
  std::string header = "{";
  for (size_t i = 0; i <= kSafetensorsMaxTensors; ++i) {
    header += fmt::format(R"({}"t{}":{{"dtype":"F32","shape":[0],"data_offsets":[0,0]}})", i ? "," : "", i);
  }
  expect_damage(write_raw("many.safetensors", header + "}", ""), "more than 262144");
  std::string meta = R"({"__metadata__":{)";
  for (size_t i = 0; i <= kSafetensorsMaxMetadata; ++i) meta += fmt::format(R"({}"k{}":"v")", i ? "," : "", i);
  expect_damage(write_raw("meta.safetensors", meta + "}}", ""), "more than " + std::to_string(kSafetensorsMaxMetadata));
}

TEST_F(SafetensorsTest, AZeroExtentDoesNotHideAnOverflowOfTheOthers) {
  // [0, 2^63-1, 2^63-1] holds no element, but its strides would overflow int64.
  expect_damage(write_raw("z.safetensors",
                          R"({"a":{"dtype":"F32","shape":[0,9223372036854775807,9223372036854775807],)"
                          R"("data_offsets":[0,0]}})",
                          ""),
                "overflows");
  EXPECT_THROW(Tensor::empty({0, INT64_MAX, INT64_MAX}), Error);
  EXPECT_THROW(Tensor::empty({INT64_MAX, 3}), Error);
  // Zero extents that fit stay fine.
  EXPECT_EQ(Tensor::empty({0, 1 << 20, 1 << 20}).numel(), 0);
}

// --- unreadable is not damaged --------------------------------------------------------------------

// Expects load_safetensors to throw a dpt::Error that is NOT DamagedFile, containing `needle`.
void expect_unreadable(const std::string& file, const std::string& needle) {
  try {
    load_safetensors(file);
    FAIL() << file << " loaded";
  } catch (const DamagedFile& e) {
    FAIL() << file << " counted as damaged: " << e.what();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(file), std::string::npos) << e.what();
  }
}

TEST_F(SafetensorsTest, AMissingFileADirectoryOrAFifoIsUnreadableNotDamaged) {
  expect_unreadable(path("missing.safetensors"), "No such file");
  fs::create_directories(path("dir.safetensors"));
  expect_unreadable(path("dir.safetensors"), "is a directory");
  ASSERT_EQ(::mkfifo(path("fifo.safetensors").c_str(), 0600), 0);
  // A writer holds the FIFO open, so that even a blocking open returns (the old reader's would).
  const int writer = ::open(path("fifo.safetensors").c_str(), O_RDWR | O_NONBLOCK);
  ASSERT_GE(writer, 0);
  expect_unreadable(path("fifo.safetensors"), "is a FIFO");
  ::close(writer);
  // Damage proper is DamagedFile.
  save_safetensors(path("t.safetensors"), {{"w", from_vector<float>({1, 2, 3, 4}, {4})}});
  fs::resize_file(path("t.safetensors"), fs::file_size(path("t.safetensors")) - 1);
  EXPECT_THROW(load_safetensors(path("t.safetensors")), DamagedFile);
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
                           "    m = f.metadata()\n"
                           "    assert m['format'] == 'pt', m\n"
                           "    assert sorted(k for k in m if k.startswith('crc32c.')) == "
                           "['crc32c.blocks.0.attn.qkv.weight', 'crc32c.h', 'crc32c.step'], m\n"
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
