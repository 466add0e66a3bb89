// The POSIX implementation of the storage tier's file-system seam.
#include "cache/storage_file_system.h"

#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>

namespace strata {

namespace {

class PosixFs final : public StorageFileSystem {
 public:
  int MakeDir(const std::string& path) override {
    if (::mkdir(path.c_str(), 0755) == 0) return 0;
    const int e = errno;
    struct stat st;
    if (e == EEXIST && ::stat(path.c_str(), &st) == 0) return S_ISDIR(st.st_mode) ? 0 : ENOTDIR;
    return e;
  }
  int ListDir(const std::string& dir, std::vector<std::string>* names) override {
    DIR* d = ::opendir(dir.c_str());
    if (d == nullptr) return errno;
    names->clear();
    for (;;) {
      errno = 0;
      struct dirent* e = ::readdir(d);
      if (e == nullptr) break;
      const std::string n = e->d_name;
      if (n != "." && n != "..") names->push_back(n);
    }
    const int e = errno;
    ::closedir(d);
    return e;
  }
  int Stat(const std::string& path, uint64_t* size, int64_t* mtime_ns) override {
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) return errno;
    if (!S_ISREG(st.st_mode)) return EISDIR;
    *size = static_cast<uint64_t>(st.st_size);
    *mtime_ns = int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec;
    return 0;
  }
  int ReadFile(const std::string& path, uint64_t max_bytes, std::vector<uint8_t>* out) override {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return errno;
    struct stat st;
    if (::fstat(fd, &st) != 0) {
      const int e = errno;
      ::close(fd);
      return e;
    }
    out->resize(std::min<uint64_t>(static_cast<uint64_t>(st.st_size), max_bytes));
    size_t done = 0;
    while (done < out->size()) {
      const ssize_t n =
          ::pread(fd, out->data() + done, out->size() - done, static_cast<off_t>(done));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        const int e = errno;
        ::close(fd);
        return e;
      }
      if (n == 0) break;  // shrank since fstat: the parser sees it truncated
      done += static_cast<size_t>(n);
    }
    out->resize(done);
    ::close(fd);
    return 0;
  }
  int WriteNewFile(const std::string& path,
                   std::span<const std::span<const uint8_t>> pieces) override {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) return errno;
    std::vector<struct iovec> iov;
    iov.reserve(pieces.size());
    for (auto p : pieces) {
      if (!p.empty()) iov.push_back({const_cast<uint8_t*>(p.data()), p.size()});
    }
    size_t first = 0;
    while (first < iov.size()) {
      const int count = static_cast<int>(std::min<size_t>(iov.size() - first, IOV_MAX));
      const ssize_t n = ::writev(fd, iov.data() + first, count);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        const int e = errno;
        ::close(fd);
        return e;
      }
      size_t left = static_cast<size_t>(n);  // skip what was written, maybe part of an iovec
      while (left > 0 && left >= iov[first].iov_len) left -= iov[first++].iov_len;
      if (left > 0) {
        iov[first].iov_base = static_cast<char*>(iov[first].iov_base) + left;
        iov[first].iov_len -= left;
      }
    }
    // close can report a deferred write error (NFS, quotas).
    return ::close(fd) == 0 ? 0 : errno;
  }
  int Rename(const std::string& from, const std::string& to) override {
    return ::rename(from.c_str(), to.c_str()) == 0 ? 0 : errno;
  }
  int Remove(const std::string& path) override { return ::unlink(path.c_str()) == 0 ? 0 : errno; }
  int Touch(const std::string& path) override {
    return ::utimensat(AT_FDCWD, path.c_str(), nullptr, 0) == 0 ? 0 : errno;
  }
};

}  // namespace

std::shared_ptr<StorageFileSystem> PosixStorageFileSystem() {
  static const std::shared_ptr<StorageFileSystem> fs = std::make_shared<PosixFs>();
  return fs;
}

}  // namespace strata
