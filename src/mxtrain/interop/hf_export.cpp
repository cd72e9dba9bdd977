#include "mxtrain/interop/hf_export.hpp"

#include <cstring>
#include <filesystem>
#include <map>

#include <nlohmann/json.hpp>

#include "mxtrain/core/error.hpp"
#include "mxtrain/core/files.hpp"
#include "mxtrain/interop/hf_checkpoint.hpp"
#include "mxtrain/interop/safetensors.hpp"

namespace mxtrain::interop {

namespace fs = std::filesystem;

namespace {

// One Hugging Face tensor: which rows of which mxtrain parameter (first_row, then every
// row_step-th: HfSource::interleaved), and whether stored transposed.
struct Output {
  std::string name;
  const ParamSpec* spec;
  int64_t first_row, rows, cols;
  bool transposed;
  int64_t row_step = 1;
  std::vector<int64_t> shape() const {
    if (spec->shape.rank == 1) return {rows};
    return transposed ? std::vector<int64_t>{cols, rows} : std::vector<int64_t>{rows, cols};
  }
  int64_t numel() const { return rows * cols; }
};

std::vector<Output> outputs(const ModelConfig& config, const ModelLayout& layout) {
  std::vector<Output> list;
  for (const ParamGroup& group : layout.groups)
    for (const ParamSpec& spec : group.params) {
      const int64_t cols = spec.shape.rank == 2 ? spec.shape[1] : 1;
      const HfSource source = hf_source(config, spec);
      const int64_t step = source.interleaved ? static_cast<int64_t>(source.parts.size()) : 1;
      int64_t row = 0;
      for (const HfSource::Part& part : source.parts) {
        list.push_back({part.tensor, &spec, row, part.rows, cols, part.transposed, step});
        row += source.interleaved ? 1 : part.rows;
      }
    }
  return list;
}

// The tensor's values in its Hugging Face layout, converted to the export dtype.
std::vector<unsigned char> tensor_bytes(const Output& output, const ParameterValues& values, DType dtype) {
  std::vector<float> rows(static_cast<size_t>(output.numel()));
  if (output.row_step == 1) {
    values(*output.spec, output.first_row * output.cols, output.numel(), rows.data());
  } else {
    // Every row_step-th row from first_row: read the rows they span, keep theirs.
    const int64_t span = (output.rows - 1) * output.row_step + 1;
    std::vector<float> all(static_cast<size_t>(span * output.cols));
    values(*output.spec, output.first_row * output.cols, span * output.cols, all.data());
    for (int64_t r = 0; r < output.rows; ++r)
      std::memcpy(rows.data() + r * output.cols, all.data() + r * output.row_step * output.cols,
                  static_cast<size_t>(output.cols) * sizeof(float));
  }
  std::vector<float> ordered;
  const std::vector<float>* source = &rows;
  if (output.transposed) {
    ordered.resize(rows.size());
    for (int64_t r = 0; r < output.rows; ++r)
      for (int64_t c = 0; c < output.cols; ++c)
        ordered[static_cast<size_t>(c * output.rows + r)] = rows[static_cast<size_t>(r * output.cols + c)];
    source = &ordered;
  }
  std::vector<unsigned char> bytes(dtype_bytes(dtype, source->size()));
  if (dtype == DType::f32) {
    std::memcpy(bytes.data(), source->data(), bytes.size());
  } else {
    for (size_t i = 0; i < source->size(); ++i) {
      const uint16_t half = float_to_bf16((*source)[i]);
      std::memcpy(bytes.data() + 2 * i, &half, 2);
    }
  }
  return bytes;
}

// Copies the tokenizer's files into out under the names transformers loads; returns those names.
// A model directory, or its tokenizer.json or tokenizer.model, gives all of the directory's
// tokenizer files; a file of another name (`my_bpe.json`, `spm.model`) becomes tokenizer.json /
// tokenizer.model, with the tokenizer_config.json and special_tokens_map.json beside it (BOS and
// EOS are read from there).
std::vector<std::string> copy_tokenizer(const std::string& tokenizer, const fs::path& out) {
  if (tokenizer.empty() || tokenizer == "byte") return {};
  std::error_code error;
  const fs::path source(tokenizer);
  const bool directory = fs::is_directory(source, error);
  const bool canonical = source.filename() == "tokenizer.json" || source.filename() == "tokenizer.model";
  std::vector<std::pair<fs::path, std::string>> files;  // source, name in out
  std::vector<const char*> names = {"tokenizer_config.json", "special_tokens_map.json"};
  if (directory || canonical)
    names.insert(names.begin(), {"tokenizer.json", "tokenizer.model"});
  else if (fs::is_regular_file(source, error))
    files.emplace_back(source, source.extension() == ".model" ? "tokenizer.model" : "tokenizer.json");
  const fs::path dir = directory ? source : source.parent_path();
  if (directory || fs::is_regular_file(source, error))
    for (const char* name : names)
      if (fs::is_regular_file(dir / name, error)) files.emplace_back(dir / name, name);
  if (files.empty())
    throw Error(ErrorKind::data, "the run's tokenizer " + tokenizer + " is gone: its files cannot be exported",
                "restore the tokenizer files, or export and copy them into the model directory by hand");
  std::vector<std::string> copied;
  for (const auto& [file, name] : files) {
    fs::copy_file(file, out / name, fs::copy_options::overwrite_existing, error);
    if (error)
      throw Error(ErrorKind::system, "cannot copy " + file.string() + ": " + error.message(),
                  "check the output directory's free space");
    copied.push_back(name);
  }
  return copied;
}

}  // namespace

HfExportResult export_hf(const ModelConfig& config, const ParameterValues& values, const std::string& out_dir,
                         const HfExportOptions& options) {
  if (options.dtype != DType::bf16 && options.dtype != DType::f32)
    throw Error(ErrorKind::config, "export dtype " + std::string(dtype_name(options.dtype)) + " is not bf16 or f32",
                "use --dtype bf16 (the default) or --dtype f32");
  const fs::path out(out_dir);
  std::error_code error;
  if (fs::exists(out, error) && !fs::is_directory(out, error))
    throw Error(ErrorKind::config, "export directory " + out_dir + " is a file, not a directory",
                "choose a new directory for the export");
  if (fs::exists(out, error) && !fs::is_empty(out, error))
    throw Error(ErrorKind::config, "export directory " + out_dir + " exists and is not empty",
                "choose a new directory, or remove the old export first");
  // The config first: a model transformers has no architecture for is refused before any file.
  nlohmann::json hf_config = hf_config_from_model(config, options.bos_token_id, options.eos_token_id);
  const fs::path partial = out.string() + ".partial";
  fs::remove_all(partial, error);
  fs::create_directories(partial, error);
  if (error)
    throw Error(ErrorKind::system, "cannot create " + partial.string() + ": " + error.message(),
                "check that the parent directory exists and is writable");

  const ModelLayout layout = build_layout(config);
  const std::vector<Output> list = outputs(config, layout);
  // Shards: consecutive tensors until the next would pass max_shard_bytes.
  std::vector<std::vector<const Output*>> shards(1);
  uint64_t shard_bytes = 0;
  HfExportResult result;
  for (const Output& output : list) {
    const uint64_t bytes = dtype_bytes(options.dtype, static_cast<size_t>(output.numel()));
    if (!shards.back().empty() && shard_bytes + bytes > options.max_shard_bytes) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().push_back(&output);
    shard_bytes += bytes;
    result.tensor_bytes += bytes;
    ++result.tensors;
  }
  nlohmann::json weight_map = nlohmann::json::object();
  for (size_t s = 0; s < shards.size(); ++s) {
    const std::string file = shards.size() == 1 ? "model.safetensors"
                                                : strf("model-%05zu-of-%05zu.safetensors", s + 1, shards.size());
    std::vector<SafetensorsWriter::Declaration> declarations;
    for (const Output* output : shards[s]) {
      declarations.push_back({output->name, options.dtype, output->shape()});
      weight_map[output->name] = file;
    }
    SafetensorsWriter writer((partial / file).string(), declarations, {{"format", "pt"}});
    for (const Output* output : shards[s]) {
      const std::vector<unsigned char> bytes = tensor_bytes(*output, values, options.dtype);
      writer.append(bytes.data(), bytes.size());
    }
    writer.commit();
    result.files.push_back(file);
  }
  if (shards.size() > 1) {
    const nlohmann::json index{{"metadata", {{"total_size", result.tensor_bytes}}}, {"weight_map", weight_map}};
    write_file_atomically((partial / "model.safetensors.index.json").string(), index.dump(2) + "\n");
    result.files.push_back("model.safetensors.index.json");
  }
  hf_config["torch_dtype"] = options.dtype == DType::f32 ? "float32" : "bfloat16";
  write_file_atomically((partial / "config.json").string(), hf_config.dump(2) + "\n");
  const nlohmann::json generation{{"bos_token_id", options.bos_token_id}, {"eos_token_id", options.eos_token_id},
                                  {"_from_model_config", true}};
  write_file_atomically((partial / "generation_config.json").string(), generation.dump(2) + "\n");
  result.files.push_back("config.json");
  result.files.push_back("generation_config.json");
  for (const std::string& name : copy_tokenizer(options.tokenizer, partial)) result.files.push_back(name);

  fs::remove(out, error);  // an empty directory, if any
  fs::rename(partial, out, error);
  if (error)
    throw Error(ErrorKind::system, "cannot rename " + partial.string() + " onto " + out_dir + ": " + error.message(),
                "check the output directory");
  fsync_path(out.parent_path().empty() ? "." : out.parent_path().string(), true);
  return result;
}

}  // namespace mxtrain::interop
