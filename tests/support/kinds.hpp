// The sandbox kinds of the registry as test parameters: suites that every
// kind (or every kind with a trait) must pass take them from here, so a new
// kind is tested by being registered.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "drivers/registry.hpp"

namespace dsec::testing {

struct KindParam {
  std::string name;
  v1::Kind kind;
  drivers::KindTraits traits;
};

// Every registered kind for which `want` holds (all when it is empty).
inline std::vector<KindParam> RegisteredKinds(std::function<bool(const drivers::KindTraits&)> want = nullptr) {
  std::vector<KindParam> out;
  for (const auto& k : drivers::AllKinds())
    if (!want || want(k->traits())) out.push_back({k->name(), k->kind(), k->traits()});
  return out;
}

// The test's name suffix: the kind's.
inline std::string KindParamName(const ::testing::TestParamInfo<KindParam>& info) { return info.param.name; }

// gtest prints a parameter with this, not as raw bytes.
inline void PrintTo(const KindParam& k, std::ostream* os) { *os << k.name; }

}  // namespace dsec::testing
