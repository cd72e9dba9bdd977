#include "mxtrain/plan/calibration.hpp"

#include <fstream>
#include <functional>
#include <map>
#include <sstream>

#include "mxtrain/build_info.hpp"
#include "mxtrain/core/error.hpp"

namespace mxtrain {

void merge_json(nlohmann::json& base, const nlohmann::json& overlay) {
  if (!base.is_object() || !overlay.is_object()) {
    base = overlay;
    return;
  }
  for (auto it = overlay.begin(); it != overlay.end(); ++it) {
    if (base.contains(it.key())) merge_json(base[it.key()], it.value());
    else base[it.key()] = it.value();
  }
}

nlohmann::json read_json_file(const std::string& path, const std::string& what, const std::string& unreadable_fix,
                              const std::string& invalid_fix) {
  std::ifstream in(path);
  if (!in) throw Error(ErrorKind::config, "cannot read " + what + path, unreadable_fix);
  std::stringstream text;
  text << in.rdbuf();
  try {
    return nlohmann::json::parse(text.str());
  } catch (const nlohmann::json::exception& error) {
    throw Error(ErrorKind::config, what + path + " is not valid JSON: " + json_parser_message(error), invalid_fix);
  }
}

namespace {

nlohmann::json read_calibration_file(const std::string& path) {
  return read_json_file(path, "the calibration file ", "check the path given to --calibration",
                        "fix the file, or remove it to use the committed calibration");
}

// One field of a GPU entry: its dotted path and how it lands in GpuCalibration.
struct CalibrationField {
  std::string path;
  std::function<void(GpuCalibration&, const nlohmann::json&)> set;
};

template <typename T>
CalibrationField number(const std::string& path, T GpuCalibration::*member) {
  return {path, [path, member](GpuCalibration& c, const nlohmann::json& value) {
            if (!value.is_number())
              throw Error(ErrorKind::config, "calibration field " + path + " must be a number, got " + value.dump(),
                          "fix the calibration file");
            c.*member = value.get<T>();
          }};
}

template <typename T>
CalibrationField cuda_number(const std::string& path, T CudaAllocationModel::*member) {
  return {path, [path, member](GpuCalibration& c, const nlohmann::json& value) {
            if (!value.is_number() && !value.is_boolean())
              throw Error(ErrorKind::config, "calibration field " + path + " must be a number, got " + value.dump(),
                          "fix the calibration file");
            c.cuda_allocations.*member = value.get<T>();
          }};
}

const std::vector<CalibrationField>& calibration_fields() {
  static const std::vector<CalibrationField> fields = {
      {"source", [](GpuCalibration& c, const nlohmann::json& v) { c.source = v.get<std::string>(); }},
      number("gemm.peak_fraction", &GpuCalibration::gemm_peak_fraction),
      number("gemm.k_half", &GpuCalibration::gemm_k_half),
      number("gemm.split_k_min", &GpuCalibration::gemm_split_k_min),
      number("gemm.split_k_efficiency", &GpuCalibration::gemm_split_k_efficiency),
      {"gemm.tiles",
       [](GpuCalibration& c, const nlohmann::json& v) {
         c.gemm_tiles.clear();
         for (const nlohmann::json& tile : v) {
           if (!tile.is_array() || tile.size() != 3)
             throw Error(ErrorKind::config, "calibration gemm.tiles entries are [tile_m, tile_n, efficiency], got " +
                                                tile.dump(),
                         "fix the calibration file");
           c.gemm_tiles.push_back(GemmTile{tile[0].get<int64_t>(), tile[1].get<int64_t>(), tile[2].get<double>()});
         }
       }},
      number("attention.forward_fraction", &GpuCalibration::attention_forward_fraction),
      number("attention.backward_fraction", &GpuCalibration::attention_backward_fraction),
      number("attention.seq_half", &GpuCalibration::attention_seq_half),
      number("attention.head_dim_half", &GpuCalibration::attention_head_dim_half),
      number("attention.flash_attention_4_backward_gain", &GpuCalibration::flash_attention_4_backward_gain),
      number("attention.flash_attention_4_head_dim_half", &GpuCalibration::flash_attention_4_head_dim_half),
      number("memory.bandwidth_fraction", &GpuCalibration::bandwidth_fraction),
      number("memory.mxfp8_cast_fraction", &GpuCalibration::mxfp8_cast_fraction),
      number("memory.nvfp4_cast_fraction", &GpuCalibration::nvfp4_cast_fraction),
      number("memory.host_to_device_bytes_per_s", &GpuCalibration::host_to_device_bytes_per_s),
      number("launch_overhead_s", &GpuCalibration::launch_overhead_s),
      number("collectives.nvlink_fraction", &GpuCalibration::nvlink_fraction),
      number("collectives.internode_fraction", &GpuCalibration::internode_fraction),
      number("collectives.latency_s", &GpuCalibration::collective_latency_s),
      number("outside_allocator.cuda_context_bytes", &GpuCalibration::cuda_context_bytes),
      number("outside_allocator.nccl_buffer_bytes", &GpuCalibration::nccl_buffer_bytes),
      cuda_number("cuda_allocations.attention_forward_workspace_bytes",
                  &CudaAllocationModel::attention_forward_workspace_bytes),
      cuda_number("cuda_allocations.attention_backward_dq_accum_f32",
                  &CudaAllocationModel::attention_backward_dq_accum_f32),
      cuda_number("cuda_allocations.attention_backward_row_f32", &CudaAllocationModel::attention_backward_row_f32),
      cuda_number("cuda_allocations.attention_backward_gqa_bytes", &CudaAllocationModel::attention_backward_gqa_bytes),
      cuda_number("cuda_allocations.attention_backward_engine_bytes",
                  &CudaAllocationModel::attention_backward_engine_bytes),
      cuda_number("cuda_allocations.embedding_sort_bytes_per_token",
                  &CudaAllocationModel::embedding_sort_bytes_per_token),
      cuda_number("cuda_allocations.embedding_sort_fixed_bytes", &CudaAllocationModel::embedding_sort_fixed_bytes),
      cuda_number("cuda_allocations.bias_gradient_fused", &CudaAllocationModel::bias_gradient_fused),
      number("step_time_scale", &GpuCalibration::step_time_scale),
  };
  return fields;
}

// Applies every leaf of `entry` (a GPU's object); an unknown key is an error, never ignored.
void apply_entry(GpuCalibration& calibration, const nlohmann::json& entry, const std::string& prefix,
                 const std::string& gpu) {
  for (auto it = entry.begin(); it != entry.end(); ++it) {
    if (it.key() == "notes") continue;  // documentation at any level
    const std::string path = prefix.empty() ? it.key() : prefix + "." + it.key();
    const CalibrationField* field = nullptr;
    for (const CalibrationField& candidate : calibration_fields())
      if (candidate.path == path) field = &candidate;
    if (field) {
      field->set(calibration, it.value());
    } else if (it.value().is_object() && path.find('.') == std::string::npos) {
      apply_entry(calibration, it.value(), path, gpu);
    } else {
      std::string known;
      for (const CalibrationField& candidate : calibration_fields()) {
        if (!known.empty()) known += ", ";
        known += candidate.path;
      }
      throw Error(ErrorKind::config, "unknown calibration field '" + path + "' for GPU '" + gpu + "'",
                  "known fields: " + known);
    }
  }
}

}  // namespace

std::string Calibration::committed_path() { return std::string(MXTRAIN_SOURCE_DIR) + "/configs/plan/calibration.json"; }

Calibration Calibration::from_json(const std::vector<nlohmann::json>& layers) {
  Calibration calibration;
  calibration.merged_ = nlohmann::json::object();
  for (const nlohmann::json& layer : layers) merge_json(calibration.merged_, layer);
  if (!calibration.merged_.contains("gpus") || !calibration.merged_["gpus"].contains("default"))
    throw Error(ErrorKind::config, "the calibration has no gpus.default entry",
                "restore configs/plan/calibration.json from the repository");
  return calibration;
}

Calibration Calibration::load(const std::string& extra_path) {
  std::vector<nlohmann::json> layers;
  std::vector<std::string> sources;
  const std::string committed = committed_path();
  std::ifstream probe(committed);
  if (!probe)
    throw Error(ErrorKind::config, "the planner's calibration file " + committed + " is missing",
                "run mxtrain from a build of an intact source tree (configs/plan/calibration.json), or pass "
                "--calibration FILE with a full calibration");
  layers.push_back(read_calibration_file(committed));
  sources.push_back(committed);
  if (!extra_path.empty()) {
    layers.push_back(read_calibration_file(extra_path));
    sources.push_back(extra_path);
  }
  Calibration calibration = from_json(layers);
  calibration.sources_ = sources;
  return calibration;
}

GpuCalibration Calibration::for_gpu(const GpuSpec& gpu) const {
  GpuCalibration calibration;
  calibration.gpu = gpu.key;
  const nlohmann::json& gpus = merged_["gpus"];
  apply_entry(calibration, gpus["default"], "", "default");
  if (gpus.contains(gpu.key)) apply_entry(calibration, gpus[gpu.key], "", gpu.key);
  calibration.cuda_allocations.enabled = true;
  if (calibration.gemm_tiles.empty())
    throw Error(ErrorKind::config, "the calibration for " + gpu.key + " has no gemm.tiles",
                "list at least one [tile_m, tile_n, efficiency] in configs/plan/calibration.json");
  return calibration;
}

}  // namespace mxtrain
