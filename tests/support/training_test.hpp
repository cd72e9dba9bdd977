// A test that trains in-process: a prepared corpus (make_test_corpus) in a fresh directory, and
// no stop request left over from another test, before or after (the stop flag is process-wide).
#pragma once
#include <gtest/gtest.h>

#include <string>

#include "mxtrain/train/stop_signal.hpp"
#include "support/test_support.hpp"

namespace mxtrain::test {

class TrainingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    clear_stop_request();
    corpus_ = make_test_corpus(dir_.file("corpus"));
  }
  void TearDown() override { clear_stop_request(); }
  TempDir dir_;
  std::string corpus_;
};

}  // namespace mxtrain::test
