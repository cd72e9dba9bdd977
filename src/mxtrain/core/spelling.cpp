#include "mxtrain/core/spelling.hpp"

#include <algorithm>

namespace mxtrain {

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i)
    for (size_t j = 1; j <= b.size(); ++j) {
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[a.size()][b.size()];
}

std::string nearest_name(const std::vector<std::string>& known, const std::string& typed) {
  std::string best;
  size_t best_distance = std::max<size_t>(1, typed.size() / 4) + 1;
  for (const std::string& name : known) {
    const size_t distance = edit_distance(typed, name);
    if (distance < best_distance) best_distance = distance, best = name;
  }
  if (!best.empty() || typed.empty()) return best;
  for (const std::string& name : known)
    if (name.rfind(typed, 0) == 0) {
      if (!best.empty()) return "";
      best = name;
    }
  return best;
}

}  // namespace mxtrain
