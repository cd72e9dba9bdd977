// What a run reports: one line per step ("step 20/500 | loss 3.2145 | ...") and the same fields
// as JSON lines in the run directory, so logs and plots read the same numbers. Every record is
// one write(2) of a whole line, checked: a full disk is an Error(system) at once, and the file is
// cut back to its last whole record, so a reader never sees half of one.
#pragma once
#include <cstdint>
#include <set>
#include <string>

#include <nlohmann/json_fwd.hpp>

namespace mxtrain {

struct StepMetrics {
  int64_t step = 0, steps = 0;
  double loss = 0, lr = 0, grad_norm = 0;
  double step_ms = 0;
  double tokens_per_s = 0;           // global (all ranks)
  double tokens_per_s_per_gpu = 0;
  double tflops = 0;                 // model TFLOP/s, global, PaLM convention
  double mfu = -1;                   // fraction of the device's dense peak; < 0 when unknown
  uint64_t peak_bytes = 0;           // max over ranks of the allocator's peak live bytes
  uint64_t reserved_bytes = 0;
  int64_t tokens = 0;                // tokens consumed so far
  bool skipped = false;              // the update was skipped (fp16 overflow, or non-finite with train.nonfinite = skip)
  bool nonfinite = false;            // skipped because the loss or the gradients were not finite
  int64_t nonfinite_skips = 0;       // such skips so far in this run (train.nonfinite = skip)
  double loss_scale = 0;             // fp16 dynamic loss scale (0 when not used)
  double elapsed_s = -1;             // since this process's first step; < 0: not shown
  double eta_s = -1;                 // to the last step at this process's mean step time; < 0: unknown
};

std::string format_step_line(const StepMetrics& metrics);
nlohmann::json step_json(const StepMetrics& metrics);
std::string format_bytes(uint64_t bytes);  // "1.2 GiB", "340.0 MiB"

class MetricsFile {
 public:
  MetricsFile() = default;
  explicit MetricsFile(const std::string& path);  // appends; throws Error(system) if it cannot open
  ~MetricsFile();
  MetricsFile(MetricsFile&& other) noexcept;
  MetricsFile& operator=(MetricsFile&& other) noexcept;
  MetricsFile(const MetricsFile&) = delete;
  MetricsFile& operator=(const MetricsFile&) = delete;

  // Appends one record as a line; throws Error(system) naming the file when it cannot be written
  // whole (the partial line is removed).
  void write(const nlohmann::json& record);
  bool is_open() const { return descriptor_ >= 0; }
  const std::string& path() const { return path_; }

  // For a run resumed at `step`: keeps the records of steps <= step (and drops lines a kill cut
  // short), rewriting the file atomically when anything goes.
  struct Kept {
    int64_t dropped = 0;                 // records removed
    std::set<std::string> keys_at_step;  // the keys of the kept records of `step` itself
  };
  static Kept keep_through_step(const std::string& path, int64_t step);

 private:
  std::string path_;
  int descriptor_ = -1;
};

}  // namespace mxtrain
