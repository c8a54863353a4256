// Offline disk snapshots through the Env: the lifecycle on an image file,
// refusal while another process holds QEMU's image lock, the free-space
// check (nothing changed), hooks around create, and the metrics text.
#include "orchestrate/snapshot/snapshot.h"

#include <gtest/gtest.h>

#include "blockio/memory.h"
#include "formats/qcow2_writer.h"
#include "tests/testing/testing.h"

namespace barge::orchestrate {
namespace {

using Bytes = std::vector<std::byte>;

// A 4 MiB qcow2 image with data in every other cluster, written through the Env.
std::string MakeImage(const testing::TempDir& dir, const std::string& name = "disk.qcow2") {
  formats::Qcow2WriterOptions o;
  o.virtual_size = 4 << 20;
  o.compression = formats::Compression::kNone;
  MemorySink sink;
  auto w = formats::Qcow2Writer::Create(sink, o);
  EXPECT_TRUE(w.ok());
  for (uint64_t c = 0; c < (*w)->cluster_count(); c += 2) {
    EXPECT_TRUE((*w)->WriteData(c, testing::RandomBytes(65536, c)).ok());
  }
  EXPECT_TRUE((*w)->Finish().ok());
  const std::string path = dir / name;
  EXPECT_TRUE(Env::Default().WriteFileAtomic(path, sink.contents()).ok());
  return path;
}

SnapshotTarget At(const std::string& image) {
  SnapshotTarget t;
  t.image = image;
  return t;
}

std::vector<std::string> Names(const std::string& image) {
  auto listing = ListDiskSnapshots(Env::Default(), At(image));
  EXPECT_TRUE(listing.ok()) << listing.error().ToString();
  std::vector<std::string> out;
  if (listing.ok()) {
    for (const auto& s : listing->snapshots) out.push_back(s.info.id + ":" + s.info.name);
  }
  return out;
}

Result<SnapshotOpResult> Create(const std::string& image, const std::string& name, Env& env = Env::Default(),
                                HookSpec hooks = {}) {
  SnapshotCreateRequest req;
  req.target.image = image;
  req.name = name;
  req.consistency.hooks = std::move(hooks);
  return CreateDiskSnapshot(env, req);
}

TEST(DiskSnapshot, OfflineLifecycle) {
  testing::TempDir dir;
  const std::string img = MakeImage(dir);
  auto a = Create(img, "a");
  ASSERT_TRUE(a.ok()) << a.error().ToString();
  EXPECT_EQ(a->mode, "offline");
  EXPECT_EQ(a->snapshot.id, "1");
  ASSERT_TRUE(Create(img, "b").ok());
  EXPECT_EQ(Names(img), (std::vector<std::string>{"1:a", "2:b"}));
  auto listing = ListDiskSnapshots(Env::Default(), At(img));
  ASSERT_TRUE(listing.ok());
  ASSERT_EQ(listing->snapshots.size(), 2u);
  EXPECT_TRUE(listing->has_usage);
  EXPECT_EQ(listing->snapshots[0].usage.logical_referenced, 2u << 20);
  EXPECT_EQ(listing->snapshots[1].usage.written, 0u);

  auto renamed = RenameDiskSnapshot(Env::Default(), At(img), "a", "first");
  ASSERT_TRUE(renamed.ok()) << renamed.error().ToString();
  auto rolled = RollbackDiskSnapshot(Env::Default(), At(img), "first", true);
  ASSERT_TRUE(rolled.ok()) << rolled.error().ToString();
  ASSERT_EQ(rolled->discarded.size(), 1u);
  EXPECT_EQ(rolled->discarded[0].name, "b");
  auto deleted = DeleteDiskSnapshot(Env::Default(), At(img), "1");
  ASSERT_TRUE(deleted.ok()) << deleted.error().ToString();
  EXPECT_EQ(deleted->snapshot.name, "first");
  EXPECT_TRUE(Names(img).empty());
}

TEST(DiskSnapshot, TargetsAreChecked) {
  testing::TempDir dir;
  const std::string img = MakeImage(dir);
  SnapshotTarget both = At(img);
  both.domain = "dom";
  both.disk = "vda";
  EXPECT_EQ(DeleteDiskSnapshot(Env::Default(), both, "a").error().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(DeleteDiskSnapshot(Env::Default(), SnapshotTarget{}, "a").error().code(), ErrorCode::kInvalidArgument);
  SnapshotCreateRequest req;
  req.target.image = img;
  req.name = "q";
  req.consistency.quiesce = true;
  EXPECT_EQ(CreateDiskSnapshot(Env::Default(), req).error().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(Create(img, std::string(300, 'n')).error().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(DeleteDiskSnapshot(Env::Default(), At(img), "nope").error().code(), ErrorCode::kNotFound);
}

TEST(DiskSnapshot, RefusedWhileAnotherProcessHoldsTheImage) {
  testing::TempDir dir;
  const std::string img = MakeImage(dir);
  auto held = Env::Default().LockImage(img, ImageAccess::kRead);  // as a qemu-img reading it would
  ASSERT_TRUE(held.ok());
  auto r = Create(img, "a");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::kBusy) << r.error().ToString();
  EXPECT_NE(r.error().message().find("--domain"), std::string::npos);
  held->reset();
  EXPECT_TRUE(Create(img, "a").ok());
}

// An Env whose file system has `free` bytes left.
class TightEnv final : public EnvWrapper {
 public:
  TightEnv(Env& target, uint64_t free) : EnvWrapper(target), free_(free) {}
  Result<SpaceInfo> Space(const std::string&) override { return SpaceInfo{free_, 1ull << 40}; }

 private:
  uint64_t free_;
};

TEST(DiskSnapshot, NotEnoughSpaceChangesNothing) {
  testing::TempDir dir;
  const std::string img = MakeImage(dir);
  const std::string marker = dir / "pre-ran";
  auto before = Env::Default().ReadFile(img);
  ASSERT_TRUE(before.ok());
  TightEnv tight(Env::Default(), (64 << 20) + 4096);  // the margin, and not the metadata
  HookSpec hooks;
  hooks.pre = "touch " + marker;
  auto r = Create(img, "a", tight, hooks);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::kNoSpace);
  EXPECT_NE(r.error().message().find("not enough space"), std::string::npos) << r.error().message();
  EXPECT_EQ(*Env::Default().ReadFile(img), *before);
  EXPECT_FALSE(Env::Default().Exists(marker)) << "the check comes before the hooks";
  TightEnv roomy(Env::Default(), 1ull << 30);
  EXPECT_TRUE(Create(img, "a", roomy).ok());
}

TEST(DiskSnapshot, HooksAroundCreate) {
  testing::TempDir dir;
  const std::string img = MakeImage(dir);
  const std::string log = dir / "log";
  HookSpec hooks;
  hooks.pre = "echo \"$BARGE_HOOK_PHASE $BARGE_OPERATION $BARGE_SNAPSHOT $BARGE_DISK\" >> " + log;
  hooks.post = "echo \"$BARGE_HOOK_PHASE $BARGE_HOOK_STATUS\" >> " + log;
  auto r = Create(img, "a", Env::Default(), hooks);
  ASSERT_TRUE(r.ok()) << r.error().ToString();
  EXPECT_EQ(r->hooks.size(), 2u);
  EXPECT_EQ(*Env::Default().ReadFile(log), "pre snapshot-create a " + img + "\npost ok\n");
  // A failing pre-hook: nothing created, the post-hook still runs.
  hooks.pre = "exit 7";
  auto refused = Create(img, "b", Env::Default(), hooks);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().code(), ErrorCode::kCancelled);
  EXPECT_EQ(Names(img), std::vector<std::string>{"1:a"});
  EXPECT_EQ(*Env::Default().ReadFile(log), "pre snapshot-create a " + img + "\npost ok\npost aborted\n");
}

// Issue 19, the one rule for a failing post-hook: after a good create it is
// a warning and the snapshot is kept; after a failed one it joins the error.
TEST(DiskSnapshot, FailingPostHookIsAWarningAfterAGoodCreate) {
  testing::TempDir dir;
  const std::string img = MakeImage(dir);
  HookSpec hooks;
  hooks.post = "echo cannot resume >&2; exit 4";
  auto r = Create(img, "a", Env::Default(), hooks);
  ASSERT_TRUE(r.ok()) << r.error().ToString();
  ASSERT_EQ(r->warnings.size(), 1u);
  EXPECT_NE(r->warnings[0].find("exited with 4: cannot resume"), std::string::npos) << r->warnings[0];
  EXPECT_EQ(Names(img), std::vector<std::string>{"1:a"});
  // A name that exists already: the create fails, the post-hook's failure
  // is added to its error.
  auto again = Create(img, "a", Env::Default(), hooks);
  ASSERT_FALSE(again.ok());
  EXPECT_NE(again.error().message().find("exited with 4"), std::string::npos) << again.error().message();
  EXPECT_EQ(Names(img), std::vector<std::string>{"1:a"});
}

TEST(DiskSnapshot, PrometheusText) {
  testing::TempDir dir;
  const std::string img = MakeImage(dir);
  ASSERT_TRUE(Create(img, "a\"b").ok());
  auto listing = ListDiskSnapshots(Env::Default(), At(img));
  ASSERT_TRUE(listing.ok());
  const std::string text = SnapshotMetricsText(*listing, [](const SnapshotListEntry&) {
    return Labels{{"state", "created"}};
  });
  EXPECT_NE(text.find("# TYPE barge_snapshot_used_bytes gauge"), std::string::npos) << text;
  EXPECT_NE(text.find("barge_snapshot_logical_referenced_bytes{image=\"" + img +
                      "\",id=\"1\",name=\"a\\\"b\",state=\"created\"} 2097152\n"),
            std::string::npos)
      << text;
}

}  // namespace
}  // namespace barge::orchestrate
