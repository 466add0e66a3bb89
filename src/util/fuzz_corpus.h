// Test helper for the g++ replay tests of the libFuzzer targets: the seed
// corpus of one target, tests/fuzz/<folder>/, every file's bytes in file-name
// order (so a replay is deterministic). REQUIRES: STRATA_SOURCE_DIR.
#pragma once

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace strata {

inline std::vector<std::string> LoadFuzzCorpus(const std::string& folder) {
  const std::filesystem::path dir = std::filesystem::path(STRATA_SOURCE_DIR) / "tests/fuzz" / folder;
  std::vector<std::filesystem::path> files;
  for (const auto& e : std::filesystem::directory_iterator(dir)) files.push_back(e.path());
  std::sort(files.begin(), files.end());
  std::vector<std::string> corpus;
  for (const auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    corpus.push_back(ss.str());
  }
  return corpus;
}

}  // namespace strata
