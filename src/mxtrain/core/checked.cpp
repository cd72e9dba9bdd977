#include "mxtrain/core/checked.hpp"

#include "mxtrain/core/error.hpp"

namespace mxtrain {
namespace {

[[noreturn]] void overflow(const char* what) {
  throw Error(ErrorKind::config, strf("%s overflows 64-bit integers (more than 9.2e18)", what),
              "the model or batch dimensions are far too large: lower model.hidden, model.ffn_hidden, "
              "model.vocab_size, model.layers, train.micro_batch_size or train.seq_len "
              "(`mxtrain train --help-config` lists each key's range)");
}

}  // namespace

int64_t checked_mul(int64_t a, int64_t b, const char* what) {
  int64_t result = 0;
  if (__builtin_mul_overflow(a, b, &result)) overflow(what);
  return result;
}

int64_t checked_add(int64_t a, int64_t b, const char* what) {
  int64_t result = 0;
  if (__builtin_add_overflow(a, b, &result)) overflow(what);
  return result;
}

int64_t checked_product(std::initializer_list<int64_t> factors, const char* what) {
  int64_t result = 1;
  for (int64_t factor : factors) result = checked_mul(result, factor, what);
  return result;
}

}  // namespace mxtrain
