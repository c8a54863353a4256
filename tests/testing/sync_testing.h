// Helpers of the sync tests (tests/sync_test.cc folder to folder,
// tests/s3_sync_test.cc with a bucket): local chain folders' files and
// damage done to them.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "tests/testing/cli_testing.h"
#include "tests/testing/testing.h"

namespace barge::testing {

// The bytes of point `id`'s files in local chain folder `chain`: image,
// digest tables, manifest (what a sync of that point moves).
inline uint64_t PointBytes(const std::string& chain, const std::string& id) {
  namespace fs = std::filesystem;
  const nlohmann::json m = ReadJson(ManifestPath(chain, id));
  uint64_t bytes = fs::file_size(ManifestPath(chain, id)) + fs::file_size(chain + "/" + m["image"].get<std::string>()) +
                   fs::file_size(chain + "/" + m["digest_table"].get<std::string>());
  if (m.contains("strong_digest_table")) {
    bytes += fs::file_size(chain + "/" + m["strong_digest_table"].get<std::string>());
  }
  return bytes;
}

// XORs one byte of a file in place.
inline void FlipByte(const std::string& path, uint64_t offset) {
  int fd = ::open(path.c_str(), O_RDWR);
  ASSERT_GE(fd, 0) << path;
  uint8_t b = 0;
  ASSERT_EQ(::pread(fd, &b, 1, static_cast<off_t>(offset)), 1);
  b ^= 0x40;
  ASSERT_EQ(::pwrite(fd, &b, 1, static_cast<off_t>(offset)), 1);
  ::close(fd);
}

// A qcow2 disk of random data (a raw file converted) with bitmap cbt0.
inline void MakeCbtDisk(const std::string& path, uint64_t size) {
  const std::string raw = path + ".raw";
  WriteFile(raw, RandomBytes(size, 40 + size));
  RunOk("qemu-img convert -q -f raw -O qcow2 " + ShellQuote(raw) + " " + ShellQuote(path) +
        " && qemu-img bitmap --add --enable " + ShellQuote(path) + " cbt0 && rm -f " + ShellQuote(raw));
}

// Flips a byte of the first uncompressed data cluster but three of the
// first point of local chain folder `chain` (`barge map` finds it).
inline void DamageFirstPoint(const std::string& chain) {
  const std::string image =
      chain + "/" + ReadJson(ManifestPath(chain, PointIds(chain).at(0)))["image"].get<std::string>();
  uint64_t host = 0;
  const nlohmann::json map = RunResult(Barge("map --json " + ShellQuote(image)));
  for (const nlohmann::json& e : map["extents"]) {
    if (e.value("data", false) && !e.value("compressed", false) && e.contains("offset")) {
      host = e["offset"].get<uint64_t>();
      break;
    }
  }
  ASSERT_NE(host, 0u) << image;
  FlipByte(image, host + 3 * 65536 + 100);
}

}  // namespace barge::testing
