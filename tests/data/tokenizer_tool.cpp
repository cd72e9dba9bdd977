// A test tool over mxtrain's tokenizers, for tests/data/tokenizer_reference.py:
//   tokenizer_tool TOKENIZER DOCS.json   DOCS.json is a JSON list of strings; prints one JSON
//                                        object: {"vocab_size", "bos", "eos", "ids": [[...], ...],
//                                        "roundtrip_failures": [indices where decode(encode(doc)) != doc],
//                                        "roundtrip_texts": [decode(encode(doc)) of each of them]}
// Exit 1 with the error's message on stderr when mxtrain refuses the tokenizer.
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "mxtrain/core/error.hpp"
#include "mxtrain/data/tokenizer.hpp"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: tokenizer_tool TOKENIZER DOCS.json\n");
    return 2;
  }
  try {
    const auto tokenizer = mxtrain::data::make_tokenizer(argv[1]);
    std::ifstream in(argv[2]);
    const std::vector<std::string> documents = nlohmann::json::parse(in).get<std::vector<std::string>>();
    nlohmann::json out{{"vocab_size", tokenizer->vocab_size()}, {"ids", nlohmann::json::array()},
                       {"roundtrip_failures", nlohmann::json::array()}, {"roundtrip_texts", nlohmann::json::array()}};
    out["bos"] = tokenizer->bos_id() ? nlohmann::json(*tokenizer->bos_id()) : nlohmann::json();
    out["eos"] = tokenizer->eos_id() ? nlohmann::json(*tokenizer->eos_id()) : nlohmann::json();
    for (size_t i = 0; i < documents.size(); ++i) {
      const std::vector<int32_t> ids = tokenizer->encode(documents[i]);
      const std::string decoded = tokenizer->decode(ids);
      if (decoded != documents[i]) {
        out["roundtrip_failures"].push_back(i);
        out["roundtrip_texts"].push_back(decoded);
      }
      out["ids"].push_back(ids);
    }
    std::puts(out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    return 0;
  } catch (const mxtrain::Error& error) {
    std::fprintf(stderr, "%s\n", error.full_message().c_str());
    return 1;
  }
}
