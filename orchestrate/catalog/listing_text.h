// The readable text of `barge list` (a chain folder's points, or the chain
// folders below a target) and `barge catalog list` (the catalog's
// trackers, checkpoints and backup records): tables a person reads. The
// cli prints these strings as they are; --json is the cli's own.
#pragma once

#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "orchestrate/catalog/catalog_listing.h"
#include "pipeline/chain_summary.h"

namespace barge::orchestrate {

// Columns padded to their widest cell, two spaces apart; the last column
// is not padded (free text such as a reason goes there), and no line ends
// in spaces.
class TextTable {
 public:
  explicit TextTable(std::vector<std::string> header) { rows_.push_back(std::move(header)); }
  void Add(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  // Every row, header first, each line led by `indent`.
  void Print(std::ostream& out, const std::string& indent = "") const;

 private:
  std::vector<std::vector<std::string>> rows_;
};

// A point's last verification in a word or three: "never", "ok TIME",
// "FAILED TIME", with " (stale: image changed since)" when it is.
std::string VerificationText(const std::optional<pipeline::LastVerification>& v);

// `barge list`'s text: a target's chain folders (a row each, one that
// cannot be loaded says so), "no backups", or the points of each chain in
// order and then the points whose links are broken.
std::string ChainListingText(const pipeline::ChainListing& l);

// `barge catalog list`'s text: the catalog's path (and `domain` when the
// listing is only its), then a table each of trackers (with what the next
// backup will be), checkpoints and backup records (totals of their disks).
std::string CatalogListingText(const CatalogListing& listing, const std::string& domain);

}  // namespace barge::orchestrate
