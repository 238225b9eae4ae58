#pragma once
// GPT-2's pre-tokenization: before BPE, text is cut into pieces by the pattern
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// matched left to right, the first alternative that matches at a position winning. BPE never merges
// across pieces, so this decides the token boundaries as much as the merges do.
//
// The classes are Unicode's: \p{L} letters (general category L*), \p{N} numbers (N*), \s the White_Space
// property, as tiktoken (which nanoGPT and llm.c tokenize with) and OpenAI's encoder read them. Bytes
// that are not valid UTF-8 form pieces of their own kind ("other"), so every byte string splits and the
// pieces always concatenate back to the input.
#include <string_view>
#include <vector>

namespace dpt::data {

// The pieces of `text`, in order, as views into it. Linear in the length of `text`.
std::vector<std::string_view> gpt2_pretokenize(std::string_view text);

}  // namespace dpt::data
