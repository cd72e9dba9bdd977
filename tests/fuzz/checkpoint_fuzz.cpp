// Checkpoint directories through their public entry (train/checkpoint: CheckpointReader, what
// resume and export open): the input is manifest.json, then a NUL byte, then rank_00000.bin.
// Every group of an accepted checkpoint's model is read in full (models up to 2^22 elements), and
// every resume state buffer.
#include <filesystem>
#include <vector>

#include "fuzz_support.hpp"
#include "mxtrain/config/loader.hpp"
#include "mxtrain/model/layout.hpp"
#include "mxtrain/train/checkpoint.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace mxtrain;
  const std::string input(reinterpret_cast<const char*>(data), size);
  const size_t split = input.find('\0');
  const std::string manifest = input.substr(0, split);
  const std::string segments = split == std::string::npos ? std::string() : input.substr(split + 1);
  const std::string dir = fuzz::work_dir() + "/step_00000001";
  std::filesystem::create_directories(dir);
  fuzz::write_input("step_00000001/manifest.json", reinterpret_cast<const uint8_t*>(manifest.data()), manifest.size());
  fuzz::write_input("step_00000001/rank_00000.bin", reinterpret_cast<const uint8_t*>(segments.data()), segments.size());
  return fuzz::run_one([&] {
    CheckpointReader reader(dir);
    const RunConfig config = config_from_json(reader.meta().config);
    const ModelLayout layout = build_layout(config.model);
    int64_t total = 0;
    for (const ParamGroup& group : layout.groups) total += group.numel;
    if (total > (int64_t{1} << 22)) return;
    std::vector<float> values;
    for (size_t g = 0; g < layout.groups.size(); ++g) {
      values.resize(static_cast<size_t>(layout.groups[g].numel));
      for (CheckpointKind kind : {CheckpointKind::master, CheckpointKind::adam_m, CheckpointKind::adam_v})
        reader.read(static_cast<int>(g), kind, 0, layout.groups[g].numel, values.data());
    }
    // Rank 0's resume state, every buffer the manifest names, at the size its segment says.
    for (const CheckpointReader::Segment& segment : reader.segments())
      if (segment.kind == CheckpointKind::state && segment.count <= (int64_t{1} << 22)) {
        values.resize(static_cast<size_t>(segment.count));
        reader.read_state(0, segment.group, segment.count, values.data());
      }
  });
}
