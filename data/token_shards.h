#pragma once
// Token data split over shards, as llm.c's data scripts write it: `data/fineweb_train_*.bin`, each
// shard a `.bin` token file (token_file.h). A path with a glob character (* ? [) names every file it
// matches, in sorted order; any other path names itself.
#include <string>
#include <vector>

namespace dpt::data {

// Whether `path` is a glob pattern (holds *, ? or [).
bool is_glob_pattern(const std::string& path);

// The files a pattern matches, sorted; empty when none does. A plain path is returned as is.
std::vector<std::string> glob_paths(const std::string& pattern);

// glob_paths, but a pattern that matches nothing is an error naming it.
std::vector<std::string> token_shard_paths(const std::string& pattern);

}  // namespace dpt::data
