#include "mxtrain/plan/memory_breakdown.hpp"

#include <algorithm>
#include <cctype>
#include <map>

#include "mxtrain/core/error.hpp"

namespace mxtrain {
namespace {

// The layer index of "layers.<i>.<rest>", or -1.
int64_t layer_of(const std::string& name) {
  static const std::string prefix = "layers.";
  if (name.rfind(prefix, 0) != 0) return -1;
  size_t end = prefix.size();
  while (end < name.size() && std::isdigit(static_cast<unsigned char>(name[end]))) ++end;
  if (end == prefix.size() || end >= name.size() || name[end] != '.') return -1;
  return std::stoll(name.substr(prefix.size(), end - prefix.size()));
}

// The precision recipes' buffers (model/linear_recipe.cpp): quantized operand copies
// ("<operand>.rowwise", ".columnwise", their scales) and the FP8 scaling state ("fp8.*").
bool is_quantized_copy(const std::string& name) {
  for (const char* tag : {".rowwise", ".columnwise", "fp8.", "mxfp8", "nvfp4"})
    if (name.find(tag) != std::string::npos) return true;
  return false;
}

std::string position_text(const PeakSnapshot& peak, const std::vector<std::string>& group_names) {
  std::string text = phase_name(peak.phase);
  if (peak.group >= 0 && peak.group < static_cast<int>(group_names.size()))
    text += ", " + group_names[static_cast<size_t>(peak.group)];
  if (peak.micro_batch >= 0) text += strf(", micro-batch %d", peak.micro_batch + 1);
  text += strf(" of step %d", peak.step);
  return text;
}

}  // namespace

std::string name_pattern(const std::string& name) {
  const int64_t layer = layer_of(name);
  if (layer < 0) return name;
  return "layers.*" + name.substr(name.find('.', 7));
}

MemoryBreakdown memory_breakdown(const StepTrace& trace, const GpuCalibration& calibration, uint64_t capacity_bytes,
                                 const std::vector<std::string>& group_names) {
  MemoryBreakdown memory;
  const PeakSnapshot& peak = trace.peak;
  auto lifetime = [&](Lifetime kind) { return static_cast<uint64_t>(peak.live_by_lifetime[static_cast<int>(kind)]); };
  memory.peak_live = peak.live_bytes;
  memory.peak_reserved = trace.memory.peak_reserved_bytes;
  memory.fragmentation = memory.peak_reserved - std::min(memory.peak_reserved, memory.peak_live);
  memory.cuda_context = static_cast<uint64_t>(calibration.cuda_context_bytes);
  memory.nccl_buffers = static_cast<uint64_t>(calibration.nccl_buffer_bytes) * static_cast<uint64_t>(trace.communicators);
  memory.total = memory.peak_reserved + memory.cuda_context + memory.nccl_buffers;
  memory.capacity = capacity_bytes;
  memory.peak_at = position_text(peak, group_names);

  memory.weights = lifetime(Lifetime::parameter);
  memory.master_weights = lifetime(Lifetime::master_parameter);
  memory.gradients = lifetime(Lifetime::gradient);
  memory.optimizer_states = lifetime(Lifetime::optimizer_state);
  memory.data = lifetime(Lifetime::data);
  memory.library_workspaces = lifetime(Lifetime::workspace);
  memory.communication_buffers = lifetime(Lifetime::communication);
  for (int kind = 0; kind < kLifetimeCount; ++kind)
    memory.by_lifetime.push_back(NamedBytes{lifetime_name(static_cast<Lifetime>(kind)), peak.live_by_lifetime[kind], 0});

  if (peak.entries.empty()) {
    memory.other_activations = lifetime(Lifetime::activation);
    memory.scratch = lifetime(Lifetime::scratch);
    return memory;
  }
  memory.detailed = true;
  std::map<int64_t, uint64_t> layer_bytes;
  std::map<std::string, NamedBytes> patterns;
  uint64_t sum = 0;
  for (const CachingAllocator::LiveEntry& entry : peak.entries) {
    sum += entry.bytes;
    NamedBytes& group = patterns[name_pattern(entry.name)];
    group.name = name_pattern(entry.name);
    group.bytes += entry.bytes;
    group.buffers += 1;
    // Quantized copies and FP8 state are counted on their own, whether kept (parameter) or
    // made per use (scratch); quantized saved activations stay activations.
    if (entry.lifetime != Lifetime::activation && is_quantized_copy(entry.name)) {
      memory.quantized_copies += entry.bytes;
      // Taken out of the bucket its lifetime put it in (scratch is summed below, without it).
      static_assert(kLifetimeCount == 9, "one bucket per Lifetime, in enum order");
      uint64_t* bucket[kLifetimeCount] = {&memory.weights,          &memory.master_weights, &memory.gradients,
                                          &memory.optimizer_states, nullptr,                nullptr,
                                          &memory.library_workspaces, &memory.communication_buffers, &memory.data};
      if (uint64_t* from = bucket[static_cast<int>(entry.lifetime)]) *from -= entry.bytes;
      continue;
    }
    if (entry.lifetime == Lifetime::activation) {
      const int64_t layer = layer_of(entry.name);
      if (layer >= 0) {
        layer_bytes[layer] += entry.bytes;
        memory.layer_activations += entry.bytes;
      } else {
        memory.other_activations += entry.bytes;
      }
    }
    if (entry.lifetime == Lifetime::scratch) {
      if (entry.name == "logits") memory.logits += entry.bytes;
      else memory.scratch += entry.bytes;
    }
  }
  MXTRAIN_ASSERT(sum == memory.peak_live, "live buffers at the peak sum to %llu, the allocator says %llu",
                 static_cast<unsigned long long>(sum), static_cast<unsigned long long>(memory.peak_live));
  for (const auto& [layer, bytes] : layer_bytes) {
    if (!memory.per_layer.empty() && memory.per_layer.back().last == layer - 1 &&
        memory.per_layer.back().bytes_per_layer == bytes) {
      memory.per_layer.back().last = layer;
    } else {
      memory.per_layer.push_back(LayerRun{layer, layer, bytes});
    }
  }
  for (auto& [name, group] : patterns) memory.by_name.push_back(group);
  std::sort(memory.by_name.begin(), memory.by_name.end(),
            [](const NamedBytes& a, const NamedBytes& b) { return a.bytes != b.bytes ? a.bytes > b.bytes : a.name < b.name; });
  return memory;
}

}  // namespace mxtrain
