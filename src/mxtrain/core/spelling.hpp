// The name a user most likely meant when they typed one that is not known: for the "did you mean"
// of a config key or a SageMaker hyperparameter name.
#pragma once
#include <string>
#include <vector>

namespace mxtrain {

// Edit distance between two short names, a swap of neighbouring letters counting as one edit (the
// optimal string alignment distance).
size_t edit_distance(const std::string& a, const std::string& b);

// Of `known`, the nearest to `typed` within a quarter of its length in edits (a swapped, dropped or
// doubled letter), else the one known name that begins with `typed` (a name cut short); empty when
// neither holds, since a wrong guess would mislead.
std::string nearest_name(const std::vector<std::string>& known, const std::string& typed);

}  // namespace mxtrain
