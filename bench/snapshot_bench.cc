// A small driver for bench/snapshot_vs_qemu.sh: barge's offline snapshot
// operations through the library (the path `barge snapshot` takes: image
// lock, free-space check, the edit), until the CLI has them.
//
//   snapshot_bench create IMAGE NAME...   one transaction per name, in order
//   snapshot_bench delete IMAGE NAME...
//   snapshot_bench rollback IMAGE NAME
//   snapshot_bench metrics IMAGE          every snapshot's metrics, one pass
// Prints one line per operation; exits 1 with the error on failure.
#include <chrono>
#include <cstdio>
#include <string>

#include "orchestrate/snapshot/snapshot.h"

using namespace barge;
using namespace barge::orchestrate;

namespace {

double Since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int Fail(const Error& e) {
  std::fprintf(stderr, "snapshot_bench: %s\n", e.ToString().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s create|delete|rollback|metrics IMAGE [NAME...]\n", argv[0]);
    return 2;
  }
  const std::string op = argv[1];
  SnapshotTarget target;
  target.image = argv[2];
  if (op == "metrics") {
    const auto t0 = std::chrono::steady_clock::now();
    auto listing = ListDiskSnapshots(PosixEnv(), target);
    if (!listing.ok()) return Fail(listing.error());
    for (const auto& s : listing->snapshots) {
      std::printf("%s %s vol_size=%llu referenced=%llu logical=%llu used=%llu written=%llu ratio=%.2f\n",
                  s.info.id.c_str(), s.info.name.c_str(), (unsigned long long)s.usage.vol_size,
                  (unsigned long long)s.usage.referenced, (unsigned long long)s.usage.logical_referenced,
                  (unsigned long long)s.usage.used, (unsigned long long)s.usage.written, s.usage.compress_ratio);
    }
    std::printf("metrics of %zu snapshots: %.3f s\n", listing->snapshots.size(), Since(t0));
    return 0;
  }
  for (int i = 3; i < argc; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    Result<SnapshotOpResult> r = Error::InvalidArgument("unknown operation '" + op + "'");
    if (op == "create") {
      SnapshotCreateRequest req;
      req.target = target;
      req.name = argv[i];
      r = CreateDiskSnapshot(PosixEnv(), req);
    } else if (op == "delete") {
      r = DeleteDiskSnapshot(PosixEnv(), target, argv[i]);
    } else if (op == "rollback") {
      r = RollbackDiskSnapshot(PosixEnv(), target, argv[i], false);
    }
    if (!r.ok()) return Fail(r.error());
    std::printf("%s %s: %.3f s\n", op.c_str(), argv[i], Since(t0));
  }
  return 0;
}
