#include "mxtrain/plan/planner.hpp"

#include <chrono>
#include <cmath>

#include "mxtrain/core/error.hpp"
#include "mxtrain/core/log.hpp"
#include "mxtrain/model/layout.hpp"

namespace mxtrain {

std::string gib_text(double bytes) { return strf("%.2f GiB", bytes / (1024.0 * 1024.0 * 1024.0)); }

namespace {

std::vector<std::string> group_names(const ModelConfig& model) {
  std::vector<std::string> names;
  for (const ParamGroup& group : build_layout(model).groups) names.push_back(group.name);
  return names;
}

int resolve_nodes(const PlanTarget& target, const GpuSpec& gpu) {
  if (target.gpus < 1)
    throw Error(ErrorKind::config, strf("--gpus %d: at least one GPU is needed", target.gpus), "pass --gpus 1 or more");
  const int nodes = target.nodes > 0 ? target.nodes : (target.gpus + gpu.gpus_per_node - 1) / gpu.gpus_per_node;
  if (target.gpus % nodes != 0 || target.gpus / nodes > gpu.gpus_per_node)
    throw Error(ErrorKind::config,
                strf("%d GPUs do not split evenly over %d nodes of at most %d %s GPUs", target.gpus, nodes,
                     gpu.gpus_per_node, gpu.key.c_str()),
                "choose --gpus as a multiple of --nodes with at most 8 GPUs per node");
  return nodes;
}

}  // namespace

Plan make_plan(const RunConfig& config, const PlanTarget& target, const Calibration& calibration,
               const PlanOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  validate(config);
  Plan plan;
  plan.config = config;
  plan.gpu = &require_gpu(target.gpu);
  const GpuSpec& gpu = *plan.gpu;
  plan.gpus = target.gpus;
  plan.nodes = resolve_nodes(target, gpu);
  plan.calibration = calibration.for_gpu(gpu);
  plan.headroom = options.headroom;
  plan.micro_batch = config.train.micro_batch_size;
  plan.seq_len = config.train.seq_len;
  plan.global_batch = config.train.global_batch(plan.gpus);
  const std::vector<std::string> groups = group_names(config.model);
  const auto capacity = static_cast<uint64_t>(gpu.memory_bytes);

  if (config.train.attention_backward == "flash-attention-4" && gpu.compute_capability != 90)
    throw Error(ErrorKind::unsupported,
                strf("train.attention_backward = flash-attention-4 on the %s (sm_%d): its kernels are compiled "
                     "for Hopper (sm_90a) only",
                     gpu.name.c_str(), gpu.compute_capability),
                "set train.attention_backward = cudnn for this GPU");
  TraceRequest request;
  request.config = config;
  request.world_size = plan.gpus;
  request.gpus_per_node = plan.gpus / plan.nodes;
  request.calibration = plan.calibration;
  request.device_label = gpu.key;
  request.compute_capability = gpu.compute_capability;
  request.native_quantized_gemms = native_quantized_gemms(gpu);
  request.steps = options.steps;
  request.detailed_peak = options.detailed;
  plan.trace = trace_step(request);
  plan.memory = memory_breakdown(plan.trace, plan.calibration, capacity, groups);
  if (plan.memory.total > capacity) {
    // The real allocator gives cached segments back and retries before it fails: replay that
    // against what cudaMalloc can get (capacity less what lives outside the allocator).
    const uint64_t outside = plan.memory.cuda_context + plan.memory.nccl_buffers;
    request.capacity_bytes = capacity > outside ? capacity - outside : 1;
    try {
      plan.trace = trace_step(request);
      plan.memory = memory_breakdown(plan.trace, plan.calibration, capacity, groups);
    } catch (const Error& error) {
      if (error.kind() != ErrorKind::out_of_memory) throw;
      plan.out_of_memory = true;
    }
  }
  plan.micro_batches = plan.trace.micro_batches;
  plan.fits = !plan.out_of_memory && plan.memory.total <= capacity;
  plan.fits_with_headroom = plan.fits && static_cast<double>(plan.memory.total) <=
                                             (1.0 - options.headroom) * static_cast<double>(capacity);

  plan.time = price_step(plan.trace, gpu, plan.calibration, Topology{plan.gpus / plan.nodes, plan.nodes});
  plan.tokens_per_step = static_cast<double>(plan.global_batch) * static_cast<double>(plan.seq_len);
  plan.tokens_per_s = plan.tokens_per_step / plan.time.total_s;
  plan.tokens_per_s_per_gpu = plan.tokens_per_s / plan.gpus;
  plan.model_tflops_per_gpu = plan.tokens_per_s_per_gpu * config.model.training_flops_per_token(plan.seq_len) / 1e12;
  const double peak = peak_flops(gpu, plan.trace.mfu_dtype);
  if (peak > 0) plan.mfu = plan.model_tflops_per_gpu * 1e12 / peak;
  plan.planning_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return plan;
}

namespace {

// "12.34 GiB", "340.0 MiB", "64.0 KiB", "0 B": table cells that stay readable at every size.
std::string bytes_text(uint64_t bytes) {
  const double value = static_cast<double>(bytes);
  if (bytes >= (uint64_t{1} << 30)) return strf("%.2f GiB", value / (1u << 30));
  if (bytes >= (uint64_t{1} << 20)) return strf("%.1f MiB", value / (1u << 20));
  if (bytes >= 1024) return strf("%.1f KiB", value / 1024);
  return strf("%llu B", static_cast<unsigned long long>(bytes));
}

std::string percent(double part, double whole) { return whole > 0 ? strf("%5.1f%%", 100.0 * part / whole) : ""; }

int64_t layers_with_activations(const MemoryBreakdown& memory) {
  int64_t count = 0;
  for (const LayerRun& run : memory.per_layer) count += run.last - run.first + 1;
  return count;
}

std::string layer_runs_text(const MemoryBreakdown& memory) {
  std::string text;
  for (const LayerRun& run : memory.per_layer) {
    text += text.empty() ? "" : "; ";
    text += run.first == run.last ? strf("layer %lld", static_cast<long long>(run.first))
                                  : strf("layers %lld-%lld", static_cast<long long>(run.first),
                                         static_cast<long long>(run.last));
    text += ": " + bytes_text(run.bytes_per_layer) + (run.first == run.last ? "" : " each");
  }
  return text;
}

// What a quantized precision runs as on the planned GPU, and whether that path has been measured:
// mxtrain has run on an H200 (every path Hopper takes) and an H100 (the accuracy set: per-tensor
// FP8 among them, the emulated block formats not), so Blackwell's native paths are compiled but
// never run, and other GPUs' step times are the H200's fractions applied to their datasheets.
// Empty for bf16/fp16/fp32.
std::string precision_path_text(const Plan& plan) {
  const std::string& precision = plan.trace.precision;
  const bool block = precision == "mxfp8" || precision == "nvfp4";
  const bool per_tensor = precision == "fp8" || precision == "fp8-current";
  if (!block && !per_tensor) return "";
  const GpuSpec& gpu = *plan.gpu;
  const std::string sm = strf("sm_%d", gpu.compute_capability);
  const bool blackwell = gpu.native_block_scaling;
  std::string path;
  if (block && !blackwell) path = "emulated on " + sm + " (quantize, dequantize, BF16 GEMM)";
  else if (block) path = "native block-scaled cuBLASLt GEMMs on " + sm;
  else path = "per-tensor FP8 cuBLASLt GEMMs on " + sm;
  if (blackwell)
    return path + ": compiled, never run (no Blackwell GPU was available); this step time is unmeasured";
  if (gpu.key == "h200") return path + ": measured on an H200";
  if (gpu.key == "h100" && per_tensor) return path + ": measured on an H100";
  if (gpu.key == "h100")
    return path + ": measured on an H200, not on " + gpu.name + " (the casts priced with the H200's fractions)";
  return path + ": measured on an H200, not on " + gpu.name + " (the H200's fractions applied to its datasheet)";
}

}  // namespace

std::string format_plan(const Plan& plan) {
  const RunConfig& c = plan.config;
  const MemoryBreakdown& m = plan.memory;
  const StepTime& t = plan.time;
  std::string out;
  out += strf("mxtrain plan: %s (%s parameters) on %d x %s (%d node%s)\n", c.model.preset.c_str(),
              log::with_commas(static_cast<double>(c.model.parameter_count())).c_str(), plan.gpus,
              plan.gpu->name.c_str(), plan.nodes, plan.nodes == 1 ? "" : "s");
  out += strf("  %s | micro-batch %lld x %lld tokens | %lld micro-batch%s per step | global batch %lld sequences "
              "(%s tokens) | recompute %s",
              plan.trace.precision.c_str(), static_cast<long long>(plan.micro_batch),
              static_cast<long long>(plan.seq_len), static_cast<long long>(plan.micro_batches),
              plan.micro_batches == 1 ? "" : "es", static_cast<long long>(plan.global_batch),
              log::with_commas(plan.tokens_per_step).c_str(), c.train.recompute.c_str());
  if (plan.gpus > 1) out += strf(" | %s", c.dist.strategy.c_str());
  const std::string path = precision_path_text(plan);
  if (!path.empty()) out += "\n  " + plan.trace.precision + " runs as " + path;
  out += "\n\n";

  out += "Memory per GPU at the peak (" + m.peak_at + ")\n";
  auto row = [&](const std::string& what, uint64_t bytes, const std::string& note = "") {
    out += strf("  %-36s %12s  %s\n", what.c_str(), bytes_text(bytes).c_str(), note.c_str());
  };
  row("weights", m.weights);
  row("master weights", m.master_weights);
  row("gradients", m.gradients);
  row("optimizer states", m.optimizer_states);
  row("quantized copies", m.quantized_copies);
  if (m.detailed) {
    row(strf("activations, %lld layers", static_cast<long long>(layers_with_activations(m))), m.layer_activations,
        layer_runs_text(m));
    row("other activations", m.other_activations, "embedding output, final norm");
    row("logits chunk", m.logits);
  } else {
    row("activations", m.other_activations);
  }
  row("scratch", m.scratch);
  row("token batch", m.data);
  row("library workspaces", m.library_workspaces, "cuBLASLt, cuDNN, RoPE tables");
  row("communication buffers", m.communication_buffers);
  out += "  " + std::string(52, '-') + "\n";
  row("allocator: live at the peak", m.peak_live);
  row("fragmentation margin", m.fragmentation, "reserved - live");
  row("allocator: reserved peak", m.peak_reserved);
  row("CUDA context and libraries", m.cuda_context, "calibration");
  row("NCCL buffers", m.nccl_buffers, "calibration");
  out += "  " + std::string(52, '-') + "\n";
  std::string verdict = plan.out_of_memory ? "does NOT fit (out of memory even after releasing cached segments)"
                        : !plan.fits       ? "does NOT fit"
                        : plan.fits_with_headroom ? strf("fits, %.1f%% headroom", 100 * m.headroom_fraction())
                                                  : strf("fits, but with less than %.0f%% headroom", 100 * plan.headroom);
  row("total", m.total, strf("of %s: %s", gib_text(static_cast<double>(m.capacity)).c_str(), verdict.c_str()));
  if (m.detailed) {
    out += "\nLargest buffer groups at the peak\n";
    for (size_t i = 0; i < m.by_name.size() && i < 8; ++i)
      out += strf("  %-36s %12s  %lld buffer%s\n", m.by_name[i].name.c_str(), bytes_text(m.by_name[i].bytes).c_str(),
                  static_cast<long long>(m.by_name[i].buffers), m.by_name[i].buffers == 1 ? "" : "s");
  }

  out += strf("\nStep time (predicted): %.1f ms\n", 1e3 * t.total_s);
  auto time_row = [&](const char* what, double seconds) {
    out += strf("  %-36s %9.1f ms  %s\n", what, 1e3 * seconds, percent(seconds, t.total_s).c_str());
  };
  const double scale = plan.calibration.step_time_scale;
  time_row("GEMMs", t.gemm_s * scale);
  time_row("attention", t.attention_s * scale);
  time_row("memory-bound ops", t.memory_bound_s * scale);
  time_row("recompute", t.recompute_s * scale);
  time_row("optimizer", t.optimizer_s * scale);
  time_row("exposed communication", t.communication_exposed_s * scale);
  out += strf("  (launch overhead %.1f ms included; all communication %.1f ms)\n", 1e3 * t.launch_s * scale,
              1e3 * t.communication_s * scale);
  out += strf("Throughput: %s tokens/s (%s per GPU) | %.1f model TFLOP/s per GPU", log::with_commas(plan.tokens_per_s).c_str(),
              log::with_commas(plan.tokens_per_s_per_gpu).c_str(), plan.model_tflops_per_gpu);
  if (plan.mfu >= 0) out += strf(" | MFU %.1f%%", 100 * plan.mfu);
  out += strf("\nPlanned in %.2f s (dryrun %.2f s); calibration: %s\n", plan.planning_seconds,
              plan.trace.dryrun_seconds, plan.calibration.source.c_str());
  return out;
}

nlohmann::json plan_json(const Plan& plan) {
  const RunConfig& c = plan.config;
  const MemoryBreakdown& m = plan.memory;
  const StepTime& t = plan.time;
  const double scale = plan.calibration.step_time_scale;
  nlohmann::json memory = {{"weights", m.weights},
                           {"master_weights", m.master_weights},
                           {"gradients", m.gradients},
                           {"optimizer_states", m.optimizer_states},
                           {"quantized_copies", m.quantized_copies},
                           {"layer_activations", m.layer_activations},
                           {"other_activations", m.other_activations},
                           {"logits", m.logits},
                           {"scratch", m.scratch},
                           {"data", m.data},
                           {"library_workspaces", m.library_workspaces},
                           {"communication_buffers", m.communication_buffers},
                           {"peak_live_bytes", m.peak_live},
                           {"fragmentation_bytes", m.fragmentation},
                           {"peak_reserved_bytes", m.peak_reserved},
                           {"cuda_context_bytes", m.cuda_context},
                           {"nccl_buffer_bytes", m.nccl_buffers},
                           {"total_bytes", m.total},
                           {"capacity_bytes", m.capacity},
                           {"headroom_fraction", m.headroom_fraction()},
                           {"peak_at", m.peak_at}};
  nlohmann::json layers = nlohmann::json::array();
  for (const LayerRun& run : m.per_layer)
    layers.push_back({{"first", run.first}, {"last", run.last}, {"bytes_per_layer", run.bytes_per_layer}});
  memory["per_layer"] = layers;
  nlohmann::json by_name = nlohmann::json::array();
  for (const NamedBytes& group : m.by_name) by_name.push_back({{"name", group.name}, {"bytes", group.bytes}, {"buffers", group.buffers}});
  memory["by_name"] = by_name;
  nlohmann::json by_lifetime = nlohmann::json::object();
  for (const NamedBytes& group : m.by_lifetime) by_lifetime[group.name] = group.bytes;
  memory["by_lifetime"] = by_lifetime;
  return {{"kind", "plan"},
          {"model", c.model.preset},
          {"parameters", c.model.parameter_count()},
          {"gpu", plan.gpu->key},
          {"gpu_name", plan.gpu->name},
          {"gpus", plan.gpus},
          {"nodes", plan.nodes},
          {"precision", plan.trace.precision},
          {"precision_path", precision_path_text(plan)},
          {"micro_batch", plan.micro_batch},
          {"seq_len", plan.seq_len},
          {"micro_batches", plan.micro_batches},
          {"global_batch", plan.global_batch},
          {"recompute", c.train.recompute},
          {"strategy", c.dist.strategy},
          {"fits", plan.fits},
          {"fits_with_headroom", plan.fits_with_headroom},
          {"memory", memory},
          {"time",
           {{"step_s", t.total_s},
            {"gemm_s", t.gemm_s * scale},
            {"attention_s", t.attention_s * scale},
            {"memory_bound_s", t.memory_bound_s * scale},
            {"recompute_s", t.recompute_s * scale},
            {"optimizer_s", t.optimizer_s * scale},
            {"communication_exposed_s", t.communication_exposed_s * scale},
            {"communication_s", t.communication_s * scale},
            {"launch_s", t.launch_s * scale},
            {"step_time_scale", scale}}},
          {"tokens_per_step", plan.tokens_per_step},
          {"tokens_per_s", plan.tokens_per_s},
          {"tokens_per_s_per_gpu", plan.tokens_per_s_per_gpu},
          {"model_tflops_per_gpu", plan.model_tflops_per_gpu},
          {"mfu", plan.mfu},
          {"planning_seconds", plan.planning_seconds},
          {"calibration_source", plan.calibration.source}};
}

}  // namespace mxtrain
