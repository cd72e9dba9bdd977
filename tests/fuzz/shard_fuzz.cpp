// Token shards (data/shard): header, version, size against token count, and every token read.
#include "fuzz_support.hpp"
#include "mxtrain/data/shard.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace mxtrain;
  const std::string path = fuzz::write_input("shard.bin", data, size);
  return fuzz::run_one([&] {
    data::ShardReader reader(path);
    const std::vector<int32_t> tokens = reader.read_all();
    fuzz::require(static_cast<int64_t>(tokens.size()) == reader.token_count(), "read_all size != token_count");
    data::OutOfRangeToken found;
    reader.find_token_at_or_above(256, &found);
    reader.validate_vocab(int64_t{1} << 31);
  });
}
