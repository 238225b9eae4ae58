#include "data/token_shards.h"

#include <glob.h>

#include <algorithm>
#include <filesystem>

#include "core/error.h"

namespace dpt::data {

bool is_glob_pattern(const std::string& path) { return path.find_first_of("*?[") != std::string::npos; }

std::vector<std::string> glob_paths(const std::string& pattern) {
  // A file whose name holds a glob character is still itself.
  std::error_code ec;
  if (!is_glob_pattern(pattern) || std::filesystem::exists(pattern, ec)) return {pattern};
  glob_t matches{};
  const int rc = ::glob(pattern.c_str(), 0, nullptr, &matches);
  std::vector<std::string> out;
  if (rc == 0) {
    for (size_t i = 0; i < matches.gl_pathc; ++i) out.emplace_back(matches.gl_pathv[i]);
  }
  ::globfree(&matches);
  DPT_CHECK(rc == 0 || rc == GLOB_NOMATCH, "cannot list the files matching '{}' (glob error {})", pattern, rc);
  // glob sorts by the locale's collation; shards are numbered, so byte order is what users expect.
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<std::string> token_shard_paths(const std::string& pattern) {
  std::vector<std::string> paths = glob_paths(pattern);
  DPT_CHECK(!paths.empty(), "no token file matches the pattern '{}'", pattern);
  return paths;
}

}  // namespace dpt::data
