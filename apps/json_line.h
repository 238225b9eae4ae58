#pragma once
// A JSON object on one line, laid out as Python's json.dumps writes it: {"key": value, "key2": value}.
// Records written this way (metrics.jsonl, the benchmarks' result lines) are read by JSON parsers and by
// scripts/plot-metrics.sh, whose sed expects that layout. nlohmann-json writes every key and value, so
// strings are escaped and a non-finite number is null; keys keep the order they were added in.
#include <nlohmann/json.hpp>
#include <string>

namespace dpt {

inline std::string json_line(const nlohmann::ordered_json& object) {
  std::string out = "{";
  for (auto it = object.begin(); it != object.end(); ++it) {
    if (it != object.begin()) out += ", ";
    out += nlohmann::json(it.key()).dump() + ": " + it.value().dump();
  }
  return out + "}";
}

}  // namespace dpt
