#include "mxtrain/train/metrics.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>

#include <nlohmann/json.hpp>

#include "mxtrain/core/error.hpp"
#include "mxtrain/core/files.hpp"
#include "mxtrain/core/log.hpp"
#include "mxtrain/core/progress.hpp"

namespace mxtrain {

std::string format_bytes(uint64_t bytes) {
  double value = static_cast<double>(bytes);
  if (value >= 1024.0 * 1024 * 1024) return strf("%.1f GiB", value / (1024.0 * 1024 * 1024));
  return strf("%.1f MiB", value / (1024.0 * 1024));
}

std::string format_step_line(const StepMetrics& m) {
  std::string line = strf("step %lld/%lld | loss %.4f | lr %.1e | grad_norm %.2f | %.1f ms | %s tok/s | %.2f TFLOP/s",
                          static_cast<long long>(m.step), static_cast<long long>(m.steps), m.loss, m.lr, m.grad_norm,
                          m.step_ms, log::with_commas(m.tokens_per_s).c_str(), m.tflops);
  if (m.mfu >= 0) line += strf(" | MFU %.1f%%", 100.0 * m.mfu);
  line += " | peak " + format_bytes(m.peak_bytes);
  if (m.loss_scale > 0) line += strf(" | loss_scale %g", m.loss_scale);
  if (m.skipped) line += m.nonfinite ? " | skipped (non-finite)" : " | skipped (overflow)";
  if (m.elapsed_s >= 0)
    line += " | " + Progress::duration(m.elapsed_s) + " elapsed" +
            (m.eta_s >= 0 ? ", ETA " + Progress::duration(m.eta_s) : "");
  return line;
}

nlohmann::json step_json(const StepMetrics& m) {
  nlohmann::json json = {{"step", m.step},
                         {"steps", m.steps},
                         {"loss", m.loss},
                         {"lr", m.lr},
                         {"grad_norm", m.grad_norm},
                         {"step_ms", m.step_ms},
                         {"tokens_per_s", m.tokens_per_s},
                         {"tokens_per_s_per_gpu", m.tokens_per_s_per_gpu},
                         {"tflops", m.tflops},
                         {"peak_bytes", m.peak_bytes},
                         {"reserved_bytes", m.reserved_bytes},
                         {"tokens", m.tokens}};
  if (m.mfu >= 0) json["mfu"] = m.mfu;
  if (m.loss_scale > 0) json["loss_scale"] = m.loss_scale;
  if (m.skipped) json["skipped"] = true;
  if (m.nonfinite) json["nonfinite"] = true;
  if (m.nonfinite_skips > 0) json["nonfinite_skips"] = m.nonfinite_skips;
  return json;
}

MetricsFile::MetricsFile(const std::string& path)
    : path_(path), descriptor_(::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644)) {
  if (descriptor_ < 0)
    throw Error(ErrorKind::system, strf("cannot open the metrics file %s: %s", path.c_str(), std::strerror(errno)),
                "check that the run directory is writable");
}

MetricsFile::~MetricsFile() {
  if (descriptor_ >= 0) ::close(descriptor_);
}

MetricsFile::MetricsFile(MetricsFile&& other) noexcept : path_(std::move(other.path_)), descriptor_(other.descriptor_) {
  other.descriptor_ = -1;
}

MetricsFile& MetricsFile::operator=(MetricsFile&& other) noexcept {
  if (this != &other) {
    if (descriptor_ >= 0) ::close(descriptor_);
    path_ = std::move(other.path_);
    descriptor_ = other.descriptor_;
    other.descriptor_ = -1;
  }
  return *this;
}

void MetricsFile::write(const nlohmann::json& record) {
  if (descriptor_ < 0) return;
  // Generated samples may hold invalid UTF-8 (a byte tokenizer's output): replaced, not an error.
  const std::string line = record.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  const off_t before = ::lseek(descriptor_, 0, SEEK_END);
  size_t done = 0;
  while (done < line.size()) {
    const ssize_t written = ::write(descriptor_, line.data() + done, line.size() - done);
    if (written < 0 && errno == EINTR) continue;
    if (written <= 0) {
      const int saved = written < 0 ? errno : ENOSPC;
      const bool cut_back = before >= 0 && ::ftruncate(descriptor_, before) == 0;  // no half record
      throw Error(ErrorKind::system,
                  strf("cannot write the metrics file %s: %s%s", path_.c_str(), std::strerror(saved),
                       cut_back ? "" : " (its last line may be cut short)"),
                  "free space on the run directory's filesystem, then re-run the same command to resume");
    }
    done += static_cast<size_t>(written);
  }
}

MetricsFile::Kept MetricsFile::keep_through_step(const std::string& path, int64_t step) {
  Kept result;
  std::ifstream in(path);
  if (!in) return result;
  std::string kept;
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json record = nlohmann::json::parse(line, nullptr, false);
    const bool whole = !record.is_discarded() && record.is_object() && record.contains("step") &&
                       record["step"].is_number_integer() && !in.eof();  // the last line needs its newline
    if (whole && record["step"].get<int64_t>() <= step) {
      kept += line + "\n";
      if (record["step"].get<int64_t>() == step)
        for (const auto& item : record.items()) result.keys_at_step.insert(item.key());
    } else if (!line.empty()) {
      ++result.dropped;
    }
  }
  in.close();
  if (result.dropped > 0)
    write_file_atomically(path, kept, "free space on the run directory's filesystem, then re-run the same command");
  return result;
}

}  // namespace mxtrain
