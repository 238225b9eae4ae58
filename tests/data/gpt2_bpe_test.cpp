// GPT-2's tokenizer against known ids. The expected ids come from tiktoken's "gpt2" encoding (the
// tokenizer of nanoGPT's and llm.c's data scripts), computed once; whole files are compared through
// their token count and a 64-bit FNV-1a hash of the ids.
#include "data/gpt2_bpe.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "core/flags.h"
#include "data/char_text.h"
#include "data/gpt2_pretokenize.h"
#include "temp_dir.h"

namespace dpt::data {
namespace {

using testing::expect_error_containing;
using testing::TempDir;
using testing::write_text;

const Gpt2Tokenizer& gpt2() {
  static const Gpt2Tokenizer tokenizer = Gpt2Tokenizer::load();
  return tokenizer;
}

uint64_t fnv1a(const std::vector<int32_t>& ids) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (int32_t id : ids) {
    h ^= static_cast<uint64_t>(id);
    h *= 0x100000001b3ull;
  }
  return h;
}

TEST(Gpt2Tokenizer, LoadsTheFullVocabularyWithEndOfText) {
  EXPECT_EQ(gpt2().vocab_size(), 50257);
  EXPECT_EQ(gpt2().end_of_text(), 50256);
  EXPECT_EQ(gpt2().token_bytes(50256), "<|endoftext|>");
  EXPECT_EQ(gpt2().token_bytes(995), " world");  // written "Ġworld" in the file
  EXPECT_EQ(gpt2().token_bytes(198), "\n");
}

TEST(Gpt2Tokenizer, ByteToUnicodeKeepsPrintableBytesAndShiftsTheRest) {
  const auto map = gpt2_byte_to_unicode();
  EXPECT_EQ(map['!'], U'!');
  EXPECT_EQ(map['~'], U'~');
  EXPECT_EQ(map[0xA1], U'\u00A1');
  EXPECT_EQ(map[0x00], U'\u0100');
  EXPECT_EQ(map[' '], U'\u0120');   // "Ġ"
  EXPECT_EQ(map['\n'], U'\u010A');  // "Ċ"
  EXPECT_EQ(map[0xAD], U'\u0143');  // the last of the 68 shifted bytes
}

TEST(Gpt2Tokenizer, EncodesKnownStringsToTiktokensIds) {
  const std::vector<std::pair<std::string, std::vector<int32_t>>> cases = {
      {"Hello world", {15496, 995}},
      {" Hello, world!\n\nIt's  a   test.\t\tOK?",
       {18435, 11, 995, 0, 198, 198, 1026, 338, 220, 257, 220, 220, 1332, 13, 197, 197, 11380, 30}},
      {"I'm we'll they've she'd he's it'S DON'T 'tis",
       {40, 1101, 356, 1183, 484, 1053, 673, 1549, 339, 338, 340, 6, 50, 23917, 6, 51, 705, 48010}},
      {"naïve café 日本語 Ελληνικά 🙂👍🏽 x\u00a0y\u3000z",
       {2616,  38776, 40304, 10545, 245,   98,    17312, 105,  45739, 252, 7377, 243,  39377, 39377, 138, 115, 26180,
        29945, 43000, 138,   105,   32485, 41840, 235,   8582, 237,   121, 2124, 1849, 88,    5099,  222, 89}},
      {"1234567 3.14159 ٣٤٥ ½ Ⅻ",
       {10163, 2231, 3134, 513, 13, 1415, 19707, 18923, 96, 149, 97, 149, 98, 25208, 2343, 227, 104}},
      {"   leading and trailing   ", {220, 220, 3756, 290, 25462, 220, 220, 220}},
      {"\n\n\n", {628, 198}},
      // U+0085 is white space (Unicode's White_Space), U+FEFF is not: tiktoken's classes.
      {"x  \u0085y", {87, 220, 220, 126, 227, 88}},
      {"x  \ufeffy", {87, 220, 27332, 119, 123, 88}},
      {"<|endoftext|>", {27, 91, 437, 1659, 5239, 91, 29}},  // ordinary text, not the special token
      {"", {}},
  };
  for (const auto& [text, ids] : cases) {
    SCOPED_TRACE(text);
    EXPECT_EQ(gpt2().encode(text), ids);
    EXPECT_EQ(gpt2().decode(ids), text);
  }
}

TEST(Gpt2Tokenizer, EncodesAParagraphOfShakespeareToTiktokensIds) {
  const std::string text = R"(First Citizen:
Before we proceed any further, hear me speak.

All:
Speak, speak.

First Citizen:
You are all resolved rather to die than to famish?

All:
Resolved. resolved.

First Citizen:
First, you know Caius Marcius is chief enemy to the people.

All:
We know't, we know't.

First Citizen:
Let us kill him, and we'll have corn at our own price.
Is't a verdict?

All:
No more talking on't; let it be done: away, away!

Second Citizen:
One word, good citizens.

First Citizen:
We are accounted poor)";
  const std::vector<int32_t> expected = {
      5962,  22307, 25,    198,  8421, 356,   5120,  597,   2252,  11,    3285,  502,   2740, 13,   198,  198,
      3237,  25,    198,   5248, 461,  11,    2740,  13,    198,   198,   5962,  22307, 25,   198,  1639, 389,
      477,   12939, 2138,  284,  4656, 621,   284,   1145,  680,   30,    198,   198,   3237, 25,   198,  4965,
      5634,  13,    12939, 13,   198,  198,   5962,  22307, 25,    198,   5962,  11,    345,  760,  327,  1872,
      385,   1526,  28599, 318,  4039, 4472,  284,   262,   661,   13,    198,   198,   3237, 25,   198,  1135,
      760,   470,   11,    356,  760,  470,   13,    198,   198,   5962,  22307, 25,    198,  5756, 514,  1494,
      683,   11,    290,   356,  1183, 423,   11676, 379,   674,   898,   2756,  13,    198,  3792, 470,  257,
      15593, 30,    198,   198,  3237, 25,    198,   2949,  517,   3375,  319,   470,   26,   1309, 340,  307,
      1760,  25,    1497,  11,   1497, 0,     198,   198,   12211, 22307, 25,    198,   3198, 1573, 11,   922,
      4290,  13,    198,   198,  5962, 22307, 25,    198,   1135,  389,   17830, 3595};
  EXPECT_EQ(gpt2().encode(text), expected);
}

TEST(Gpt2Tokenizer, EncodesTheShippedStoryToTiktokensIds) {
  const std::vector<int32_t> ids = gpt2().encode(read_text_file(std::string(DPT_SOURCE_DIR) + "/data/corpus/tiny.txt"));
  EXPECT_EQ(ids.size(), 1512u);
  EXPECT_EQ(fnv1a(ids), 0xeacc59ac51b76914ull);
}

TEST(Gpt2Tokenizer, EncodesAllOfTinyShakespeareToTiktokensIds) {
  const std::string text = read_text_file(std::string(DPT_SOURCE_DIR) + "/data/corpus/tinyshakespeare.txt");
  const std::vector<int32_t> ids = gpt2().encode(text);
  EXPECT_EQ(ids.size(), 338025u);
  EXPECT_EQ(fnv1a(ids), 0xb547ad363c19676eull);
  EXPECT_EQ(gpt2().decode(ids), text);
}

TEST(Gpt2Tokenizer, DecodeInvertsEncodeForAnyBytes) {
  const std::vector<std::string> texts = {"emoji 🧑‍🚀🏳️‍🌈 and flags 🇫🇷",
                                          "tabs\t\t\tand\r\nCRLF\r\n",
                                          "\v\f\u2028\u2029\u00a0\u3000 mixed  \n ",
                                          "trailing spaces    ",
                                          "    ",
                                          "'s'S'''ll'LL",
                                          "\xff\xfe invalid \xc3 utf-8 \xe2\x82",
                                          std::string("nul\0byte", 8),
                                          std::string(100000, ' ') + "x" + std::string(50000, 'a')};
  for (const auto& text : texts) EXPECT_EQ(gpt2().decode(gpt2().encode(text)), text) << text.substr(0, 40);
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    std::string bytes(rng() % 64, '\0');
    for (char& c : bytes) c = static_cast<char>(rng() % 256);
    EXPECT_EQ(gpt2().decode(gpt2().encode(bytes)), bytes);
  }
}

TEST(Gpt2Tokenizer, LongRunsOfOneCharacterMergeToTiktokensIds) {
  // A run is one piece: 100,000 merge candidates at once (the heap keeps it n log n).
  const std::vector<int32_t> equals = gpt2().encode(std::string(100000, '='));
  EXPECT_EQ(equals.size(), 1563u);
  EXPECT_EQ(equals.front(), 23926);  // 64 '='
  EXPECT_EQ(fnv1a(equals), 0xbce8b611035b12ebull);
  const std::vector<int32_t> letters = gpt2().encode(std::string(100000, 'a'));
  EXPECT_EQ(letters.size(), 25000u);
  EXPECT_EQ(fnv1a(letters), 0x8d3e0cc45d4a0ce5ull);
}

TEST(Gpt2Pretokenize, CutsTextAsGpt2sPattern) {
  using Pieces = std::vector<std::string_view>;
  EXPECT_EQ(gpt2_pretokenize("Hello world's  end\n\n x!?"),
            (Pieces{"Hello", " world", "'s", " ", " end", "\n\n", " x", "!?"}));
  EXPECT_EQ(gpt2_pretokenize("abc123 45 ,,\t"), (Pieces{"abc", "123", " 45", " ,,", "\t"}));
  EXPECT_EQ(gpt2_pretokenize("  \xff\xfe x"), (Pieces{" ", " \xff\xfe", " x"}));
  EXPECT_TRUE(gpt2_pretokenize("").empty());
}

TEST(Gpt2Tokenizer, RefusesIdsOutsideTheVocabulary) {
  expect_error_containing([] { gpt2().decode({15496, 50257}); }, {"token id 50257", "[0, 50257)"});
  expect_error_containing([] { gpt2().decode({-1}); }, {"token id -1"});
}

TEST(Gpt2Tokenizer, TheGpt2DirFlagNamesAnotherVocabularyFolder) {
  const std::string shipped = Gpt2Tokenizer::default_dir();
  EXPECT_TRUE(std::filesystem::exists(shipped + "/encoder.json")) << shipped;
  TempDir dir;
  const std::string elsewhere = dir.file("gpt2");
  ScopedFlag flag(Flag::Gpt2Dir, elsewhere);
  EXPECT_EQ(Gpt2Tokenizer::default_dir(), elsewhere);
  expect_error_containing([] { Gpt2Tokenizer::load(); }, {elsewhere + "/encoder.json"});
  std::filesystem::create_directories(elsewhere);
  std::filesystem::copy_file(shipped + "/encoder.json", elsewhere + "/encoder.json");
  std::filesystem::copy_file(shipped + "/vocab.bpe", elsewhere + "/vocab.bpe");
  EXPECT_EQ(Gpt2Tokenizer::load().encode("Hello world"), (std::vector<int32_t>{15496, 995}));
}

TEST(Gpt2Tokenizer, MalformedVocabularyFilesAreRefusedNamingTheFileAndLine) {
  TempDir dir;
  const std::string real = Gpt2Tokenizer::default_dir();
  const std::string json = dir.file("encoder.json"), bpe = dir.file("vocab.bpe");
  expect_error_containing([&] { Gpt2Tokenizer(dir.file("missing.json"), real + "/vocab.bpe"); }, {"missing.json"});
  write_text(json, "{\"a\": 0,");
  expect_error_containing([&] { Gpt2Tokenizer(json, real + "/vocab.bpe"); }, {json, "not valid JSON"});
  write_text(json, "{\"a\": 0, \"b\": 2}");
  expect_error_containing([&] { Gpt2Tokenizer(json, real + "/vocab.bpe"); }, {json, "'b' has id 2", "0..1"});
  write_text(json, "{\"a\": 0, \"b\": 1}");
  expect_error_containing([&] { Gpt2Tokenizer(json, real + "/vocab.bpe"); }, {json, "byte 0 has no token"});
  write_text(bpe, "#version: 0.2\nĠ t\nĠt\n");
  expect_error_containing([&] { Gpt2Tokenizer(real + "/encoder.json", bpe); }, {bpe, "line 3", "two tokens"});
  write_text(bpe, "#version: 0.2\nĠ t\nq zzzzzzzzzz\n");
  expect_error_containing([&] { Gpt2Tokenizer(real + "/encoder.json", bpe); }, {bpe, "line 3", "'zzzzzzzzzz'"});
  write_text(bpe, "#version: 0.2\nĠ t\nĠ t\n");
  expect_error_containing([&] { Gpt2Tokenizer(real + "/encoder.json", bpe); }, {bpe, "line 3", "twice"});
}

}  // namespace
}  // namespace dpt::data
