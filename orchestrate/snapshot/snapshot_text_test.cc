// snapshot list's table and apply's lines, and how an apply with failed
// actions ends.
#include "orchestrate/snapshot/snapshot_text.h"

#include <gtest/gtest.h>

namespace barge::orchestrate {
namespace {

bool Has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST(SnapshotTextTest, TargetIsAnImageOrADomainsDisk) {
  std::vector<std::string> words;
  auto image = ResolveSnapshotTarget({{"/d.qcow2", "old", "new"}, {"IMAGE", "NAME", "NEW_NAME"}, "", "", ""}, words);
  ASSERT_TRUE(image.ok()) << image.error().message();
  EXPECT_EQ(image->image, "/d.qcow2");
  EXPECT_EQ(words, (std::vector<std::string>{"old", "new"}));

  // With --domain CLI11 fills IMAGE's slot with the first word.
  words.clear();
  auto domain = ResolveSnapshotTarget({{"old", "new", ""}, {"IMAGE", "NAME", "NEW_NAME"}, "vm1", "vda", "qemu:///x"},
                                      words);
  ASSERT_TRUE(domain.ok()) << domain.error().message();
  EXPECT_EQ(domain->domain, "vm1");
  EXPECT_EQ(domain->disk, "vda");
  EXPECT_EQ(domain->libvirt_uri, "qemu:///x");
  EXPECT_EQ(words, (std::vector<std::string>{"old", "new"}));
}

TEST(SnapshotTextTest, TargetUsageErrors) {
  auto message = [](SnapshotTargetArgs a) {
    std::vector<std::string> words;
    auto t = ResolveSnapshotTarget(a, words);
    EXPECT_FALSE(t.ok());
    return t.ok() ? std::string() : t.error().message();
  };
  const std::vector<std::string> names = {"IMAGE", "NAME"};
  EXPECT_EQ(message({{"", "", ""}, names, "", "vda", ""}), "--disk needs --domain");
  EXPECT_EQ(message({{"", "", ""}, names, "vm1", "", ""}), "--domain needs --disk (the disk target, e.g. vda)");
  EXPECT_EQ(message({{"/d.qcow2", "s1", ""}, names, "vm1", "vda", ""}),
            "both an IMAGE and --domain given: name one of them");
  EXPECT_EQ(message({{"/d.qcow2", "s1", ""}, names, "", "", "qemu:///x"}),
            "--connect needs --domain (an IMAGE is a local file)");
  EXPECT_EQ(message({{"", "", ""}, names, "", "", ""}), "name an IMAGE, or --domain D --disk vda");
  EXPECT_EQ(message({{"/d.qcow2", "", ""}, names, "", "", ""}), "missing NAME");
}

TEST(SnapshotTextTest, ListShowsDisplayNamesAndStates) {
  SnapshotListing l;
  SnapshotListEntry plain, applied;
  plain.info.id = "1";
  plain.info.name = "before-upgrade";
  applied.info.id = "2";
  applied.info.name = "0b5c-uuid";
  l.snapshots = {plain, applied};
  std::map<std::string, StoredSnapshot> states;
  states["0b5c-uuid"].display_name = "nightly";
  states["0b5c-uuid"].state = SnapshotState::kError;
  EXPECT_EQ(ListedStateName(states, "before-upgrade"), "created");
  EXPECT_EQ(ListedStateName(states, "0b5c-uuid"), std::string(SnapshotStateName(SnapshotState::kError)));
  const std::string text = SnapshotListText(l, states);
  EXPECT_EQ(text.rfind("ID   NAME                 CREATED", 0), 0u) << text;
  EXPECT_TRUE(Has(text, "nightly [0b5c-uuid]")) << text;
  EXPECT_TRUE(Has(text, "before-upgrade")) << text;
  EXPECT_FALSE(Has(text, "current state")) << text;  // no usage known
  EXPECT_EQ(SnapshotListText(SnapshotListing{}, {}).find("(no snapshots)\n") != std::string::npos, true);
}

TEST(SnapshotTextTest, ApplyLinesAndItsFailure) {
  ApplyResult r;
  r.image = "/d.qcow2";
  EXPECT_EQ(ApplyText(r), "  nothing to do\n");
  EXPECT_FALSE(ApplyFailure(r).has_value());
  ApplyActionResult ok, bad;
  ok.action.kind = ActionKind::kCreate;
  ok.action.uuid = "u1";
  ok.action.reason = "listed and missing";
  bad.action.kind = ActionKind::kDelete;
  bad.action.uuid = "u2";
  bad.ok = false;
  bad.error = "IoError: busy";
  r.actions = {ok, bad};
  const std::string text = ApplyText(r);
  EXPECT_TRUE(Has(text, "  " + std::string(ActionKindName(ActionKind::kCreate)) + " u1: listed and missing\n")) << text;
  EXPECT_TRUE(Has(text, " u2: FAILED: IoError: busy\n")) << text;
  auto failure = ApplyFailure(r);
  ASSERT_TRUE(failure.has_value());
  EXPECT_EQ(failure->message(), "1 of 2 snapshot actions failed; first: u2: IoError: busy");
  EXPECT_TRUE(Has(failure->ToString(), "/d.qcow2")) << failure->ToString();
}

}  // namespace
}  // namespace barge::orchestrate
