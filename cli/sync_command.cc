// barge sync SRC DST: copy the points a chain location lacks, each verified
// (pipeline/chain_sync.h, docs/sync.md).
#include <iostream>

#include "cli/common.h"
#include "cli/http_flags.h"
#include "cli/interrupt.h"
#include "cli/owner_flag.h"
#include "pipeline/chain_sync.h"

namespace barge::cli {
namespace {

struct SyncArgs {
  std::string src, dst;
};

nlohmann::json ChainJson(const pipeline::SyncChainResult& c) {
  nlohmann::json points = nlohmann::json::array();
  for (const pipeline::SyncedPoint& p : c.points) {
    points.push_back({{"id", p.id},
                      {"action", p.copied ? "copied" : "skipped"},
                      {"bytes", p.bytes},
                      {"verified", p.verified},
                      {"duration_seconds", p.seconds}});
  }
  return {{"src", c.src}, {"dst", c.dst},       {"copied", c.copied},          {"skipped", c.skipped},
          {"bytes", c.bytes_copied}, {"points", points}, {"duration_seconds", c.seconds}};
}

int RunSyncCommand(const SyncArgs& a, Output& out) {
  Env& env = Env::Default();
  auto pairs = pipeline::SyncPairs(env, a.src, a.dst);
  if (!pairs.ok()) return out.Fail(pairs.error());
  pipeline::SyncOptions options;
  options.cancel = &CancelFlag();
  options.on_point = [&](const pipeline::SyncChainResult&, const pipeline::SyncedPoint& p) {
    out.text() << pipeline::SyncPointText(p) << "\n";
    out.text().flush();
  };
  nlohmann::json chains = nlohmann::json::array();
  uint64_t bytes = 0;
  size_t copied = 0, skipped = 0;
  for (const auto& [src, dst] : *pairs) {
    out.text() << src << " -> " << dst << "\n";
    auto r = pipeline::SyncChain(env, src, dst, options);
    if (!r.ok()) return out.Fail(r.error());
    out.text() << pipeline::SyncChainText(*r) << "\n";
    chains.push_back(ChainJson(*r));
    bytes += r->bytes_copied;
    copied += r->copied;
    skipped += r->skipped;
  }
  out.Result({{"chains", chains}, {"copied", copied}, {"skipped", skipped}, {"bytes", bytes}});
  return kExitOk;
}

}  // namespace

void RegisterSyncCommand(CLI::App& app, int& exit_code) {
  auto a = std::make_shared<SyncArgs>();
  auto* cmd = AddCommand(app, "sync",
                         "Copy the backup points DST lacks from SRC (a chain folder, or a target folder of chains), "
                         "oldest first, each verified, each whole or not at all",
                         exit_code, [a](Output& out) { return RunSyncCommand(*a, out); });
  AddAllowOtherOwnerFlag(cmd);
  cmd->add_option("src", a->src, "The chain folder (TARGET/NAME) or target folder to copy from")->required();
  cmd->add_option("dst", a->dst, "The chain folder or target folder to copy into (made when missing)")->required();
  AddBucketFlags(cmd);
}

}  // namespace barge::cli
