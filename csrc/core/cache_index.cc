#include "csrc/core/cache_index.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <system_error>

namespace torch_tpu::core {
namespace {

namespace fs = std::filesystem;
constexpr const char* kSuffix = ".xla";
std::atomic<uint64_t> g_tmp_counter{0};

bool is_safe_key(const std::string& key) {
  if (key.empty() || key.size() > 200) {
    return false;
  }
  for (char c : key) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '-' || c == '_' || c == '.';
    if (!ok) {
      return false;
    }
  }
  return key[0] != '.';
}

bool write_all(int fd, const std::string& data) {
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0) {
      if (errno == EINTR) {
        continue;
      }
      return false;
    }
    done += static_cast<size_t>(n);
  }
  return true;
}

}  // namespace

CacheIndex::CacheIndex(std::string directory) : directory_(std::move(directory)) {
  std::error_code ec;
  fs::create_directories(directory_, ec);
  if (ec) {
    throw std::runtime_error("torch_tpu: cannot create compile cache directory " + directory_ +
                             ": " + ec.message());
  }
}

std::string CacheIndex::path_for(const std::string& key) const {
  if (!is_safe_key(key)) {
    throw std::invalid_argument("torch_tpu: invalid compile cache key '" + key + "'");
  }
  return (fs::path(directory_) / (key + kSuffix)).string();
}

std::optional<std::string> CacheIndex::get(const std::string& key) const {
  std::ifstream in(path_for(key), std::ios::binary);
  if (!in) {
    return std::nullopt;
  }
  std::ostringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) {
    return std::nullopt;
  }
  return buffer.str();
}

bool CacheIndex::contains(const std::string& key) const {
  std::error_code ec;
  return fs::exists(path_for(key), ec);
}

bool CacheIndex::put(const std::string& key, const std::string& value) const {
  const std::string final_path = path_for(key);
  const std::string tmp_path = final_path + ".tmp." + std::to_string(::getpid()) + "." +
                               std::to_string(g_tmp_counter.fetch_add(1));
  const int fd = ::open(tmp_path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) {
    return false;
  }
  const bool ok = write_all(fd, value) && ::fsync(fd) == 0;
  ::close(fd);
  if (!ok || ::rename(tmp_path.c_str(), final_path.c_str()) != 0) {
    ::unlink(tmp_path.c_str());
    return false;
  }
  return true;
}

CacheIndex::Summary CacheIndex::summary() const {
  Summary s;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(directory_, ec)) {
    if (entry.is_regular_file(ec) && entry.path().extension() == kSuffix) {
      s.entries += 1;
      s.bytes += static_cast<int64_t>(entry.file_size(ec));
    }
  }
  return s;
}

void CacheIndex::clear() const {
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(directory_, ec)) {
    if (entry.path().extension() == kSuffix) {
      fs::remove(entry.path(), ec);
    }
  }
}

}  // namespace torch_tpu::core
