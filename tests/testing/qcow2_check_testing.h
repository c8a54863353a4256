// Test helpers around CheckQcow2 shared by the formats tests: run the
// checker on in-memory image bytes and print its messages. Kept with the
// tests: it reads through MemorySource, a blockio implementation that
// formats/ itself never sees.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <string>
#include <vector>

#include "blockio/memory.h"
#include "formats/qcow2_check.h"

namespace barge::formats::qcow2::check_testing {

// The checker's report on `bytes` (an empty report, with a test failure,
// when the checker itself fails).
inline CheckReport MustCheck(const std::vector<std::byte>& bytes) {
  MemorySource source(bytes, "check.qcow2");
  auto report = CheckQcow2(source);
  EXPECT_TRUE(report.ok()) << report.error().ToString();
  return report.ok() ? *report : CheckReport{};
}

// The report's messages, one per line.
inline std::string Messages(const CheckReport& r) {
  std::string s;
  for (const auto& m : r.messages) s += m + "\n";
  return s;
}

}  // namespace barge::formats::qcow2::check_testing
