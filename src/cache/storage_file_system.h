// The few file operations the `file` storage tier does, behind an interface
// so tests can inject faults (ENOSPC, EIO, torn writes).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace strata {


// The few file operations the storage tier does. Each returns 0 or an errno
// value. The real one (PosixStorageFileSystem) is thread-safe; a fake must
// be too (the I/O threads call it concurrently).
class StorageFileSystem {
 public:
  virtual ~StorageFileSystem() = default;
  // mkdir of one level; an existing directory is success.
  virtual int MakeDir(const std::string& path) = 0;
  // Names in `dir` (not "." / ".."), regular files and others alike.
  virtual int ListDir(const std::string& dir, std::vector<std::string>* names) = 0;
  // Size and modification time (ns since the epoch) of a regular file;
  // ENOENT-like errors as errno, EISDIR-like for a non-regular file.
  virtual int Stat(const std::string& path, uint64_t* size, int64_t* mtime_ns) = 0;
  // Up to max_bytes bytes from the start of the file.
  virtual int ReadFile(const std::string& path, uint64_t max_bytes, std::vector<uint8_t>* out) = 0;
  // Creates a new file (fails if it exists) holding the pieces in order.
  virtual int WriteNewFile(const std::string& path,
                           std::span<const std::span<const uint8_t>> pieces) = 0;
  virtual int Rename(const std::string& from, const std::string& to) = 0;
  virtual int Remove(const std::string& path) = 0;
  // Sets the modification time to now (the LRU order a restart reads).
  virtual int Touch(const std::string& path) = 0;
};
std::shared_ptr<StorageFileSystem> PosixStorageFileSystem();

}  // namespace strata
