// The snapshot commands' words: which disk they name (IMAGE or --domain
// and --disk, and the words after it), what `snapshot list` and `snapshot
// apply` say to a person, and how an apply with failed actions ends,
// rendered from orchestrate's results (snapshot.h, snapshot_apply.h).
// --json is the cli's own.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "blockio/error.h"
#include "orchestrate/snapshot/snapshot.h"
#include "orchestrate/snapshot/snapshot_apply.h"

namespace barge::orchestrate {

// What a snapshot command was given: its positionals in order (`slots`,
// "" = not given; the first is IMAGE), what each means (`names`, "IMAGE"
// first, for messages) and --domain, --disk, --connect.
struct SnapshotTargetArgs {
  std::vector<std::string> slots;
  std::vector<std::string> names;
  std::string domain, disk, connect;
};

// The disk named, and in `words` the values of the slots after IMAGE.
// With --domain the words land one slot early (IMAGE is not given) and are
// taken from there. kInvalidArgument, a usage message, when --domain and
// --disk come without each other, with an IMAGE too, --connect without
// --domain, no disk is named, or a word is missing.
Result<SnapshotTarget> ResolveSnapshotTarget(const SnapshotTargetArgs& a, std::vector<std::string>& words);

// The state of the listed snapshot named `name` (a uuid under apply) in
// `states` (SnapshotStatesByUuid): its stored state's name, or "created"
// for one barge keeps no state of.
std::string ListedStateName(const std::map<std::string, StoredSnapshot>& states, const std::string& name);

// `snapshot list`'s table (ID, NAME [as "display [qcow2 name]"], CREATED,
// sizes, ratio, STATE; "-" where the metrics could not be read), "(no
// snapshots)" without any, then the current state's usage when known.
std::string SnapshotListText(const SnapshotListing& listing, const std::map<std::string, StoredSnapshot>& states);

// `snapshot apply`'s text: a line per action (its reason, or FAILED and
// why; "nothing to do" without any), then each listed snapshot's state.
std::string ApplyText(const ApplyResult& r);

// The error an apply with failed actions ends with, after its result:
// how many failed and the first; nullopt when every action succeeded.
std::optional<Error> ApplyFailure(const ApplyResult& r);

}  // namespace barge::orchestrate
