// On-disk index of compiled executables. Torch-independent.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace torch_tpu::core {

// One file per entry, named by its key. Writes go to a temporary file in the
// same directory, are flushed, then renamed into place, so readers (other
// processes included) see either no entry or a whole one.
class CacheIndex {
 public:
  explicit CacheIndex(std::string directory);

  const std::string& directory() const { return directory_; }
  std::optional<std::string> get(const std::string& key) const;
  // Returns false if the entry could not be written (the cache is best-effort).
  bool put(const std::string& key, const std::string& value) const;
  bool contains(const std::string& key) const;

  struct Summary {
    int64_t entries = 0;
    int64_t bytes = 0;
  };
  Summary summary() const;
  void clear() const;

 private:
  std::string path_for(const std::string& key) const;
  std::string directory_;
};

}  // namespace torch_tpu::core
