// Size arithmetic on numbers that come from the user (model dimensions, batch and sequence
// sizes): every product or sum that counts parameters or sizes a buffer goes through these, so a
// result that does not fit in int64 is a config error naming what overflowed, never a wrapped
// (wrong, often negative) number that later surfaces as an internal error or a huge allocation.
#pragma once
#include <cstdint>
#include <initializer_list>

namespace mxtrain {

// a * b, a + b; throw Error(config) "<what> overflows 64-bit integers" when the result does not fit.
int64_t checked_mul(int64_t a, int64_t b, const char* what);
int64_t checked_add(int64_t a, int64_t b, const char* what);
// The product of all factors, checked at every step.
int64_t checked_product(std::initializer_list<int64_t> factors, const char* what);

}  // namespace mxtrain
