#include "mxtrain/model/recompute.hpp"

#include <cctype>

#include "mxtrain/core/error.hpp"

namespace mxtrain {

RecomputePolicy RecomputePolicy::parse(const std::string& text) {
  RecomputePolicy policy;
  if (text == "none") return policy;
  if (text == "selective") {
    policy.mode = RecomputeMode::selective;
    return policy;
  }
  if (text == "full") {
    policy.mode = RecomputeMode::full;
    return policy;
  }
  bool digits = !text.empty() && text.size() < 7;
  for (char c : text) digits = digits && std::isdigit(static_cast<unsigned char>(c));
  if (digits) {
    policy.mode = RecomputeMode::full;
    policy.full_layers = std::stoll(text);
    return policy;
  }
  throw Error(ErrorKind::config, "unknown recompute policy '" + text + "'",
              "use none, selective, full, or a number K to recompute only the first K layers");
}

std::string RecomputePolicy::str() const {
  if (full_layers >= 0) return std::to_string(full_layers);
  switch (mode) {
    case RecomputeMode::none: return "none";
    case RecomputeMode::selective: return "selective";
    case RecomputeMode::full: return "full";
  }
  return "?";
}

}  // namespace mxtrain
