// Fuzzes the readers of debugfs's output (`barge files`: the names, modes,
// times and link targets of a point's filesystem, which come from the
// image, so from whoever wrote the guest's disk): any input gives entries
// or an Error, never a crash; an accepted listing holds no "." or ".." and
// no inode 0, and (names without '/') each entry's facts come back from
// the listing printed again.
//
// Input: the first byte picks the reader (even: `ls -p -r`, odd: `stat`
// output for up to 8 inodes named by the next bytes), the rest is the text.
#include <cstddef>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "pipeline/debugfs_output.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace barge::pipeline;
  if (size == 0) return 0;
  const bool stats = (data[0] & 1) != 0;
  std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);
  if (!stats) {
    auto r = ParseLsP(rest);
    if (!r.ok()) return 0;
    std::string again;
    bool slashes = false;
    for (const ListedEntry& e : *r) {
      if (e.inode == 0 || e.name == "." || e.name == "..") std::abort();
      // A damaged folder entry may hold '/' (ext4 does not check the
      // bytes): listed as it is, and never matched by a path's component.
      slashes = slashes || e.name.find('/') != std::string::npos;
      char mode[24];
      std::snprintf(mode, sizeof mode, "%o", e.mode);
      again += "/" + std::to_string(e.inode) + "/" + mode + "/0/0/" + e.name + "/" + std::to_string(e.size_bytes) +
               "/\n";
    }
    if (slashes) return 0;
    // Printed again as debugfs would, the same entries.
    auto round = ParseLsP(again);
    if (!round.ok() || round->size() != r->size()) std::abort();
    for (size_t i = 0; i < r->size(); ++i) {
      if ((*round)[i].name != (*r)[i].name || (*round)[i].inode != (*r)[i].inode ||
          (*round)[i].mode != (*r)[i].mode || (*round)[i].size_bytes != (*r)[i].size_bytes) {
        std::abort();
      }
    }
    return 0;
  }
  const size_t count = rest.empty() ? 0 : static_cast<uint8_t>(rest[0]) % 9;
  std::vector<uint64_t> inodes;
  for (size_t i = 0; i < count; ++i) inodes.push_back(11 + i);
  std::string_view text = rest.empty() ? rest : rest.substr(1);
  auto r = ParseStats(text, inodes);
  if (r.ok() && r->size() != inodes.size()) std::abort();
  (void)ParseStatTime(text);
  return 0;
}
