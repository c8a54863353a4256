// Key-encryption keys (KEKs) for encryption at rest (docs/formats/encryption.md):
// a key file of 32 random bytes (raw, or 64 hex digits), or a passphrase
// file stretched by scrypt. A KEK only wraps the random data key of each
// object; it never encrypts data itself, and it is never written anywhere:
// objects record its key id (a fingerprint) instead.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "blockio/error.h"

namespace barge {

class Env;

inline constexpr size_t kKekBytes = 32;
inline constexpr size_t kKeyIdBytes = 8;
inline constexpr size_t kKdfSaltBytes = 16;

// How an object's KEK came about: kNone (a key file's bytes are the KEK),
// or scrypt over a passphrase with these parameters and salt. Stored in each
// object's header, so a reader derives the same KEK.
struct KdfParams {
  enum class Kind : uint8_t { kNone = 0, kScrypt = 1 };
  Kind kind = Kind::kNone;
  uint8_t log2_n = 0;  // scrypt N = 2^log2_n
  uint8_t r = 0;
  uint8_t p = 0;
  std::array<uint8_t, kKdfSaltBytes> salt{};  // zeros for kNone
  friend bool operator==(const KdfParams&, const KdfParams&) = default;
};

// scrypt's cost for passphrases written by barge: N = 2^17, r = 8, p = 1
// takes 128 * r * N = 128 MiB of memory and about 0.9 s of one core here
// (docs/formats/encryption.md), once per process and salt. Readers accept
// log2_n 10..20, r 1..16, p 1..4 with 128 * r * N at most 1 GiB (a header
// asking for more is refused as corrupt rather than allowed to take the
// machine's memory).
inline constexpr uint8_t kScryptLog2N = 17;
inline constexpr uint8_t kScryptR = 8;
inline constexpr uint8_t kScryptP = 1;
// kCorruption when `kdf` is outside what readers accept (see above).
Status CheckKdfParams(const KdfParams& kdf);

// A KEK and its id, for one object's KDF parameters. The bytes are wiped
// when the last copy goes away.
struct Kek {
  std::array<uint8_t, kKekBytes> bytes{};
  // First kKeyIdBytes of HMAC-SHA256(KEK, "barge key id").
  std::array<uint8_t, kKeyIdBytes> id{};
  ~Kek();
};
std::string KeyIdHex(std::span<const uint8_t, kKeyIdBytes> id);

// The key given by the user. Copies share one state; thread-safe.
class EncryptionKey {
 public:
  // From 32 raw key bytes.
  static EncryptionKey FromRawKey(std::span<const uint8_t, kKekBytes> key);
  // From a passphrase: new objects get scrypt(passphrase, a random salt
  // made once for this key, `log2_n`, r, p); other salts are derived on
  // demand and remembered. kInvalidArgument for an empty passphrase.
  static Result<EncryptionKey> FromPassphrase(std::string_view passphrase,
                                              uint8_t log2_n = kScryptLog2N);

  // The KDF parameters new objects are written with.
  const KdfParams& write_kdf() const;
  // The KEK for an object's KDF parameters: the raw key for kNone; scrypt
  // with the header's salt and cost for a passphrase. kCorruption when
  // `kdf` is out of bounds; "wrong key" (kInvalidArgument) when the kind
  // does not match the key given (a passphrase for a key-file object).
  Result<std::shared_ptr<const Kek>> KekFor(const KdfParams& kdf) const;

 private:
  struct State;
  explicit EncryptionKey(std::shared_ptr<State> state) : state_(std::move(state)) {}
  std::shared_ptr<State> state_;
};

// Reads --encryption-key-file: exactly 32 bytes (raw), or 64 hex digits
// with an optional final newline. Refused (kInvalidArgument, naming the
// file and why) unless a regular file owned by the caller's user and
// readable by nobody else (mode 0600 or 0400): a key anyone can read is
// no secret. The message never quotes the file's bytes.
Result<EncryptionKey> LoadEncryptionKeyFile(Env& env, const std::string& path);
// Reads --encryption-passphrase-file: the first line is the passphrase
// (the final newline dropped); the same ownership and mode rules.
Result<EncryptionKey> LoadPassphraseFile(Env& env, const std::string& path,
                                         uint8_t log2_n = kScryptLog2N);

}  // namespace barge
