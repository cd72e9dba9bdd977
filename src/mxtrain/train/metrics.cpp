#include "mxtrain/train/metrics.hpp"

#include <nlohmann/json.hpp>

#include "mxtrain/core/error.hpp"
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
  if (m.skipped) line += " | skipped (overflow)";
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
  return json;
}

MetricsFile::MetricsFile(const std::string& path) : path_(path), stream_(path, std::ios::app) {
  if (!stream_) throw Error(ErrorKind::system, "cannot open metrics file " + path, "check that the run directory is writable");
}

void MetricsFile::write(const nlohmann::json& record) {
  if (!stream_.is_open()) return;
  // Generated samples may hold invalid UTF-8 (a byte tokenizer's output): replaced, not an error.
  stream_ << record.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << '\n';
  stream_.flush();
}

}  // namespace mxtrain
