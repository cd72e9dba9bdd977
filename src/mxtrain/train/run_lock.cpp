#include "mxtrain/train/run_lock.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <string>

#include "mxtrain/core/error.hpp"

namespace mxtrain {
namespace {

std::string read_all(int descriptor) {
  std::string text;
  char chunk[512];
  ::lseek(descriptor, 0, SEEK_SET);
  for (ssize_t got; (got = ::read(descriptor, chunk, sizeof chunk)) > 0 && text.size() < 4096;)
    text.append(chunk, static_cast<size_t>(got));
  while (!text.empty() && (text.back() == '\n' || text.back() == '\0')) text.pop_back();
  return text;
}

std::string holder_description() {
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0) std::strcpy(host, "?");
  const std::time_t now = std::time(nullptr);
  char started[64] = {};
  std::tm utc{};
  gmtime_r(&now, &utc);
  std::strftime(started, sizeof started, "%Y-%m-%dT%H:%M:%SZ", &utc);
  return strf("pid %d on host %s, started %s", static_cast<int>(::getpid()), host, started);
}

}  // namespace

std::string run_lock_path(const std::string& run_dir) { return run_dir + "/.mxtrain.lock"; }

RunDirectoryLock::RunDirectoryLock(const std::string& run_dir) : path_(run_lock_path(run_dir)) {
  // No O_TRUNC: the holder's description must survive a second process opening the file.
  descriptor_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (descriptor_ < 0)
    throw Error(ErrorKind::system, strf("cannot create the run directory's lock file %s: %s", path_.c_str(),
                                        std::strerror(errno)),
                "set checkpoint.dir (-o) to a writable directory");
  if (::flock(descriptor_, LOCK_EX | LOCK_NB) != 0) {
    const int saved = errno;
    const std::string holder = read_all(descriptor_);
    ::close(descriptor_);
    descriptor_ = -1;
    if (saved == EWOULDBLOCK)
      throw Error(ErrorKind::system,
                  "run directory " + run_dir + " is in use by another mxtrain run (" +
                      (holder.empty() ? std::string("a process that is starting") : holder) + "; lock " + path_ + ")",
                  "wait for that run to finish or stop it (SIGTERM saves a checkpoint), or train in another "
                  "directory with -o DIR");
    throw Error(ErrorKind::system, strf("cannot lock %s: %s", path_.c_str(), std::strerror(saved)),
                "use a run directory on a filesystem that supports flock (local disks and NFS do)");
  }
  // Ours: whatever the file says was written by a process that no longer holds the lock.
  stale_holder_ = read_all(descriptor_);
  const std::string description = holder_description() + "\n";
  const bool written = ::ftruncate(descriptor_, 0) == 0 &&
                       ::pwrite(descriptor_, description.data(), description.size(), 0) ==
                           static_cast<ssize_t>(description.size());
  if (!written) {
    const int saved = errno;
    release();
    throw Error(ErrorKind::system, strf("cannot write the lock file %s: %s", path_.c_str(), std::strerror(saved)),
                "free space in the run directory's filesystem");
  }
}

RunDirectoryLock::~RunDirectoryLock() { release(); }

RunDirectoryLock::RunDirectoryLock(RunDirectoryLock&& other) noexcept
    : path_(std::move(other.path_)), stale_holder_(std::move(other.stale_holder_)), descriptor_(other.descriptor_) {
  other.descriptor_ = -1;
}

RunDirectoryLock& RunDirectoryLock::operator=(RunDirectoryLock&& other) noexcept {
  if (this != &other) {
    release();
    path_ = std::move(other.path_);
    stale_holder_ = std::move(other.stale_holder_);
    descriptor_ = other.descriptor_;
    other.descriptor_ = -1;
  }
  return *this;
}

void RunDirectoryLock::release() {
  if (descriptor_ < 0) return;
  // Emptied first, so a file left behind says nobody holds it; the file itself stays (removing
  // it would race with a process that has just opened it).
  [[maybe_unused]] const int emptied = ::ftruncate(descriptor_, 0);
  ::flock(descriptor_, LOCK_UN);
  ::close(descriptor_);
  descriptor_ = -1;
}

}  // namespace mxtrain
