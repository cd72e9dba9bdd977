// One run per directory: rank 0 of a run holds an advisory lock (flock) on RUN_DIR/.mxtrain.lock
// for as long as it trains, and writes who holds it (pid, host, start time) into the file. A
// second run on the same directory fails at once with a message naming that process. The kernel
// releases an flock when its process dies, however it dies, so a lock file left by a crashed or
// killed run is recognised as stale (the lock is free) and taken over, never trusted.
#pragma once
#include <string>

namespace mxtrain {

class RunDirectoryLock {
 public:
  RunDirectoryLock() = default;
  // Takes the lock of `run_dir`; throws Error(system) naming the holder when another process has
  // it, or when the lock file cannot be created.
  explicit RunDirectoryLock(const std::string& run_dir);
  ~RunDirectoryLock();
  RunDirectoryLock(RunDirectoryLock&& other) noexcept;
  RunDirectoryLock& operator=(RunDirectoryLock&& other) noexcept;
  RunDirectoryLock(const RunDirectoryLock&) = delete;
  RunDirectoryLock& operator=(const RunDirectoryLock&) = delete;

  bool held() const { return descriptor_ >= 0; }
  const std::string& path() const { return path_; }
  // What the previous holder wrote when it left the file behind without the lock (a crash), or "".
  const std::string& stale_holder() const { return stale_holder_; }

 private:
  void release();
  std::string path_;
  std::string stale_holder_;
  int descriptor_ = -1;
};

// The lock file of a run directory.
std::string run_lock_path(const std::string& run_dir);

}  // namespace mxtrain
