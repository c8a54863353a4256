// policy check's problem list (PolicyProblems).
#include "orchestrate/policy/policy_problems.h"

#include <gtest/gtest.h>

namespace barge::orchestrate {
namespace {

TEST(PolicyProblemsTest, PlacesInFileOrderWholeFileFirst) {
  const std::string text =
      "p.yaml:7:3: unknown key 'x'\n"
      "p.yaml:2:1: schedule: bad expression\n"
      "p.yaml: missing 'targets'\n"
      "\n"
      "something else\n";
  auto problems = PolicyProblems("p.yaml", text);
  ASSERT_EQ(problems.size(), 4u);
  EXPECT_EQ(problems[0].line, 0);
  EXPECT_EQ(problems[0].message, "missing 'targets'");
  EXPECT_EQ(problems[1].line, 0);
  EXPECT_EQ(problems[1].message, "something else");
  EXPECT_EQ(problems[2].line, 2);
  EXPECT_EQ(problems[2].column, 1);
  EXPECT_EQ(problems[2].message, "schedule: bad expression");
  EXPECT_EQ(problems[3].line, 7);
  EXPECT_EQ(problems[3].column, 3);
  EXPECT_EQ(problems[3].message, "unknown key 'x'");
}

TEST(PolicyProblemsTest, NoCredentialInAMessage) {
  auto problems = PolicyProblems("p.yaml", "p.yaml:3:5: source nbd://user:secret@host/x is not reachable");
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_EQ(problems[0].message.find("secret"), std::string::npos) << problems[0].message;
}

}  // namespace
}  // namespace barge::orchestrate
