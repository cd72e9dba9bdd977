#include "mxtrain/core/files.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "mxtrain/core/error.hpp"

namespace mxtrain {

void fsync_path(const std::string& path, bool directory) {
  const int descriptor = ::open(path.c_str(), (directory ? O_RDONLY | O_DIRECTORY : O_RDONLY) | O_CLOEXEC);
  if (descriptor < 0) return;
  ::fsync(descriptor);
  ::close(descriptor);
}

int try_write_file_atomically(const std::string& path, const std::string& contents) {
  const std::string temporary = path + ".tmp";
  const int descriptor = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  bool ok = descriptor >= 0;
  for (size_t done = 0; ok && done < contents.size();) {
    const ssize_t written = ::write(descriptor, contents.data() + done, contents.size() - done);
    if (written < 0 && errno == EINTR) continue;
    ok = written > 0;
    if (ok) done += static_cast<size_t>(written);
  }
  ok = ok && ::fsync(descriptor) == 0;
  if (descriptor >= 0) ok = ::close(descriptor) == 0 && ok;
  ok = ok && std::rename(temporary.c_str(), path.c_str()) == 0;
  if (!ok) {
    const int saved = errno != 0 ? errno : EIO;
    ::unlink(temporary.c_str());
    return saved;
  }
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  fsync_path(parent.empty() ? "." : parent.string(), true);
  return 0;
}

void write_file_atomically(const std::string& path, const std::string& contents, const std::string& advice) {
  const int failure = try_write_file_atomically(path, contents);
  if (failure != 0)
    throw Error(ErrorKind::system, strf("cannot write %s: %s", path.c_str(), std::strerror(failure)), advice);
}

}  // namespace mxtrain
