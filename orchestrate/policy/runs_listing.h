// `barge runs list`: which catalog files it reads, the records of all of
// them as one table, and what became of a record's point. Reads only;
// never creates a catalog.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "blockio/env.h"
#include "blockio/error.h"
#include "orchestrate/policy/policy_catalog.h"

namespace barge::orchestrate {

// The catalog files for the --catalog flags `flags`: each that is a file,
// and every *.db of each that is a folder (a records folder of sharded
// runs, RecordsCatalogPath), in name order; with no flag, the default one.
// kNotFound when one is not there (listing never creates a catalog) or a
// folder holds no *.db.
Result<std::vector<std::string>> ListedCatalogs(Env& env, const std::vector<std::string>& flags);

// `policy_flag` as a policy name: a policy file names its policy (a file
// that does not load is its error); anything else is the name.
Result<std::string> PolicyNameFromFlag(Env& env, const std::string& policy_flag);

// Called with (what, catalog file) for a file whose runs cut short (a
// process that died) could not be settled to "interrupted" first.
using ListWarning = std::function<void(const std::string& what, const std::string& file)>;

// The records of `files` matching `filter` and `shard` (ListRuns) as one
// table, each with the catalog file it is in: newest first, at most
// filter.limit of them (0: all). A file that cannot be opened or listed is
// the error.
Result<std::vector<std::pair<RunRecord, std::string>>> ListRunsOf(Env& env, const std::vector<std::string>& files,
                                                                  const RunFilter& filter,
                                                                  const std::optional<ShardSpec>& shard,
                                                                  const ListWarning& warn);

// Part `i` of `r`'s point as the catalog keeps it: "present", "removed" or
// "merged into ID".
std::string PartState(const RunRecord& r, size_t i);

// What became of `r`'s point: "" while present, else "point removed",
// "point merged into ID[, ID...]" (every part folded into a later point),
// "point partly removed".
std::string PointFate(const RunRecord& r);

}  // namespace barge::orchestrate
