// A character vocabulary in checkpoint metadata: hex pairs of its bytes, ascending.
#include "vocab_metadata.h"

#include <gtest/gtest.h>

#include <string>

namespace dpt::train {
namespace {

TEST(CharVocabMetadata, IsTheBytesAscendingAsHexAndDecodesToTheSameVocabulary) {
  const data::CharVocab vocab(std::string("hello, world\n\xff", 14));
  const std::string text = encode_char_vocab(vocab);
  EXPECT_EQ(text, "0a202c6465686c6f7277ff");
  const data::CharVocab back = decode_char_vocab(text);
  EXPECT_EQ(back.chars(), vocab.chars());
  EXPECT_EQ(back.encode('w'), vocab.encode('w'));
}

TEST(CharVocabMetadata, MalformedValuesAreRefusedNamingTheKey) {
  for (const std::string bad : {"", "0a2", "0A20", "zz", "2020", "200a"}) {
    try {
      decode_char_vocab(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find(kCharVocabKey), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace dpt::train
