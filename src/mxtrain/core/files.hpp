// Whole files written so that a reader never sees half of one: the bytes go to PATH.tmp, are
// flushed to the disk (fsync), and one rename puts them in place; the directory entry is synced
// too. A failure at any point (a full disk, a read-only directory) removes the temporary and
// throws Error(system) naming the file and the reason, and leaves whatever PATH held before.
#pragma once
#include <string>

namespace mxtrain {

// Writes `contents` to `path` atomically. `advice` is the fix the error carries.
void write_file_atomically(const std::string& path, const std::string& contents,
                           const std::string& advice = "check that the directory exists, is writable and has free space");
// The same without throwing: 0, or the errno of the failure (for a caller that passes the reason
// on as a number).
int try_write_file_atomically(const std::string& path, const std::string& contents);

// Flushes a file's or a directory's entry to the disk (best effort: errors are ignored, as a
// rename that already happened stays valid).
void fsync_path(const std::string& path, bool directory);

}  // namespace mxtrain
