#include "data/gpt2_pretokenize.h"

#include <unicode/uchar.h>
#include <unicode/utf8.h>

#include <cstddef>
#include <cstdint>

namespace dpt::data {

namespace {

enum class Kind : uint8_t { Letter, Number, Space, Other };

struct CodePoint {
  size_t begin;   // byte offset in the text
  UChar32 value;  // < 0 for a byte that is not valid UTF-8
  Kind kind;
};

Kind kind_of(UChar32 c) {
  if (c < 0) return Kind::Other;
  const uint32_t category = U_GET_GC_MASK(c);
  if (category & U_GC_L_MASK) return Kind::Letter;
  if (category & U_GC_N_MASK) return Kind::Number;
  if (u_isUWhiteSpace(c)) return Kind::Space;
  return Kind::Other;
}

std::vector<CodePoint> code_points(std::string_view text) {
  std::vector<CodePoint> out;
  out.reserve(text.size());
  const auto* s = reinterpret_cast<const uint8_t*>(text.data());
  const auto length = static_cast<int32_t>(text.size());
  for (int32_t i = 0; i < length;) {
    const int32_t begin = i;
    UChar32 c = 0;
    U8_NEXT(s, i, length, c);  // an ill-formed sequence gives c < 0 and skips its maximal invalid part
    out.push_back({static_cast<size_t>(begin), c, kind_of(c)});
  }
  return out;
}

// The length in code points of a contraction ('s 't 're 've 'm 'll 'd, lower case only) at `i`, or 0.
size_t contraction(const std::vector<CodePoint>& cp, size_t i) {
  if (cp[i].value != '\'' || i + 1 >= cp.size()) return 0;
  const UChar32 a = cp[i + 1].value;
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
  if (i + 2 >= cp.size()) return 0;
  const UChar32 b = cp[i + 2].value;
  if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
  return 0;
}

// The end of " ?K+" at `i` for class K (Letter, Number, or Other for [^\s\p{L}\p{N}]), or i when it does
// not match: an optional ASCII space, then one or more of K.
size_t space_then_run(const std::vector<CodePoint>& cp, size_t i, Kind k) {
  size_t j = i;
  if (cp[j].value == ' ' && j + 1 < cp.size() && cp[j + 1].kind == k) ++j;
  if (cp[j].kind != k) return i;
  while (j < cp.size() && cp[j].kind == k) ++j;
  return j;
}

// The end of "\s+(?!\S)|\s+" at `i`, where cp[i] is white space. Greedy \s+ runs to the end of the
// white space; (?!\S) then holds only at the end of the text, else the match backs off one code point so
// that the last space can lead the next piece (" word"). A run of one before a non-space is \s+ alone.
size_t whitespace_run(const std::vector<CodePoint>& cp, size_t i) {
  size_t j = i;
  while (j < cp.size() && cp[j].kind == Kind::Space) ++j;
  if (j == cp.size() || j - i == 1) return j;
  return j - 1;
}

}  // namespace

std::vector<std::string_view> gpt2_pretokenize(std::string_view text) {
  const std::vector<CodePoint> cp = code_points(text);
  std::vector<std::string_view> pieces;
  auto byte_at = [&](size_t index) { return index < cp.size() ? cp[index].begin : text.size(); };
  for (size_t i = 0; i < cp.size();) {
    size_t end = i + contraction(cp, i);
    // The alternatives in the pattern's order; the first that consumes anything wins.
    for (Kind k : {Kind::Letter, Kind::Number, Kind::Other}) {
      if (end == i) end = space_then_run(cp, i, k);
    }
    if (end == i) end = whitespace_run(cp, i);  // only white space is left at i
    pieces.push_back(text.substr(byte_at(i), byte_at(end) - byte_at(i)));
    i = end;
  }
  return pieces;
}

}  // namespace dpt::data
