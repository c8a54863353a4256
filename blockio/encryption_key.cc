// Key files, passphrases through scrypt, key ids.
#include "blockio/encryption_key.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>

#include "blockio/env.h"

namespace barge {

namespace {

constexpr std::string_view kKeyIdLabel = "barge key id";

std::array<uint8_t, kKeyIdBytes> KeyIdOf(const std::array<uint8_t, kKekBytes>& kek) {
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int mac_len = 0;
  HMAC(EVP_sha256(), kek.data(), int(kek.size()), reinterpret_cast<const unsigned char*>(kKeyIdLabel.data()),
       kKeyIdLabel.size(), mac, &mac_len);
  std::array<uint8_t, kKeyIdBytes> id{};
  std::memcpy(id.data(), mac, id.size());
  return id;
}

std::shared_ptr<const Kek> MakeKek(const uint8_t* bytes) {
  auto kek = std::make_shared<Kek>();
  std::memcpy(kek->bytes.data(), bytes, kKekBytes);
  kek->id = KeyIdOf(kek->bytes);
  return kek;
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// The file's contents once its type, owner and mode pass; the error says
// which rule failed and how to fix it.
Result<std::string> ReadSecretFile(Env& env, const std::string& path, std::string_view what) {
  BARGE_ASSIGN_OR_RETURN(FileStat st, env.Stat(path));
  auto refuse = [&](std::string why) {
    return Error::InvalidArgument(std::string(what) + " refused: " + why).set_path(path);
  };
  if (!st.is_regular()) return refuse("not a regular file");
  if (st.uid != uint32_t(geteuid())) {
    return refuse("owned by uid " + std::to_string(st.uid) + ", not by this user (uid " +
                  std::to_string(geteuid()) + ")");
  }
  if ((st.mode & 077) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", st.mode & 07777);
    return refuse(std::string("mode ") + mode +
                  " lets other users read it; chmod 600 it (0600 or 0400 only)");
  }
  return env.ReadFile(path, 4096);
}

}  // namespace

Kek::~Kek() { OPENSSL_cleanse(bytes.data(), bytes.size()); }

std::string KeyIdHex(std::span<const uint8_t, kKeyIdBytes> id) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  for (uint8_t b : id) {
    out += kDigits[b >> 4];
    out += kDigits[b & 15];
  }
  return out;
}

Status CheckKdfParams(const KdfParams& kdf) {
  switch (kdf.kind) {
    case KdfParams::Kind::kNone:
      return OkStatus();
    case KdfParams::Kind::kScrypt:
      if (kdf.log2_n < 10 || kdf.log2_n > 20 || kdf.r < 1 || kdf.r > 16 || kdf.p < 1 || kdf.p > 4 ||
          (uint64_t{128} * kdf.r << kdf.log2_n) > (uint64_t{1} << 30)) {
        return Error::Corruption("scrypt parameters out of bounds (log2 N " + std::to_string(kdf.log2_n) +
                                 ", r " + std::to_string(kdf.r) + ", p " + std::to_string(kdf.p) + ")");
      }
      return OkStatus();
  }
  return Error::Corruption("unknown key derivation " + std::to_string(int(kdf.kind)));
}

struct EncryptionKey::State {
  KdfParams write_kdf;
  std::shared_ptr<const Kek> raw;  // a key file's KEK
  std::string passphrase;          // or a passphrase
  std::mutex mu;
  std::map<std::array<uint8_t, kKdfSaltBytes + 3>, std::shared_ptr<const Kek>> derived;  // guarded by mu
  ~State() { OPENSSL_cleanse(passphrase.data(), passphrase.size()); }
};

EncryptionKey EncryptionKey::FromRawKey(std::span<const uint8_t, kKekBytes> key) {
  auto state = std::make_shared<State>();
  state->raw = MakeKek(key.data());
  return EncryptionKey(std::move(state));
}

Result<EncryptionKey> EncryptionKey::FromPassphrase(std::string_view passphrase, uint8_t log2_n) {
  if (passphrase.empty()) return Error::InvalidArgument("the passphrase is empty");
  auto state = std::make_shared<State>();
  state->passphrase = std::string(passphrase);
  KdfParams& kdf = state->write_kdf;
  kdf.kind = KdfParams::Kind::kScrypt;
  kdf.log2_n = log2_n;
  kdf.r = kScryptR;
  kdf.p = kScryptP;
  if (!CheckKdfParams(kdf).ok()) return Error::InvalidArgument("scrypt cost out of bounds");
  if (RAND_bytes(kdf.salt.data(), int(kdf.salt.size())) != 1) {
    return Error::Internal("RAND_bytes failed for a scrypt salt");
  }
  return EncryptionKey(std::move(state));
}

const KdfParams& EncryptionKey::write_kdf() const { return state_->write_kdf; }

Result<std::shared_ptr<const Kek>> EncryptionKey::KekFor(const KdfParams& kdf) const {
  BARGE_RETURN_IF_ERROR(CheckKdfParams(kdf));
  if (kdf.kind == KdfParams::Kind::kNone) {
    if (!state_->raw) {
      return Error::InvalidArgument("wrong key: the object was encrypted with a key file, not a passphrase");
    }
    return state_->raw;
  }
  if (state_->raw) {
    return Error::InvalidArgument("wrong key: the object was encrypted with a passphrase, not a key file");
  }
  std::array<uint8_t, kKdfSaltBytes + 3> cache_key{};
  std::memcpy(cache_key.data(), kdf.salt.data(), kKdfSaltBytes);
  cache_key[kKdfSaltBytes] = kdf.log2_n;
  cache_key[kKdfSaltBytes + 1] = kdf.r;
  cache_key[kKdfSaltBytes + 2] = kdf.p;
  std::lock_guard lock(state_->mu);  // one derivation per salt, even when asked at once
  if (auto it = state_->derived.find(cache_key); it != state_->derived.end()) return it->second;
  const uint64_t n = uint64_t{1} << kdf.log2_n;
  const uint64_t max_mem = 128 * uint64_t{kdf.r} * (n + 2 + kdf.p);  // what OpenSSL needs, no more
  std::array<uint8_t, kKekBytes> out{};
  if (EVP_PBE_scrypt(state_->passphrase.data(), state_->passphrase.size(), kdf.salt.data(), kdf.salt.size(), n,
                     kdf.r, kdf.p, max_mem, out.data(), out.size()) != 1) {
    return Error::Internal("scrypt failed (log2 N " + std::to_string(kdf.log2_n) + ")");
  }
  auto kek = MakeKek(out.data());
  OPENSSL_cleanse(out.data(), out.size());
  state_->derived.emplace(cache_key, kek);
  return kek;
}

Result<EncryptionKey> LoadEncryptionKeyFile(Env& env, const std::string& path) {
  BARGE_ASSIGN_OR_RETURN(std::string text, ReadSecretFile(env, path, "encryption key file"));
  std::array<uint8_t, kKekBytes> key{};
  Status parsed = OkStatus();
  if (text.size() == kKekBytes) {
    std::memcpy(key.data(), text.data(), kKekBytes);
  } else {
    std::string_view hex(text);
    if (hex.ends_with('\n')) hex.remove_suffix(1);
    if (hex.size() != 2 * kKekBytes) {
      parsed = Error::InvalidArgument("encryption key file holds " + std::to_string(text.size()) +
                                      " bytes; it needs 32 random bytes or 64 hex digits")
                   .set_path(path);
    }
    for (size_t i = 0; parsed.ok() && i < kKekBytes; ++i) {
      const int hi = HexValue(hex[2 * i]), lo = HexValue(hex[2 * i + 1]);
      if (hi < 0 || lo < 0) {
        parsed = Error::InvalidArgument("encryption key file: 64 characters but not all hex digits").set_path(path);
      } else {
        key[i] = uint8_t(hi << 4 | lo);
      }
    }
  }
  OPENSSL_cleanse(text.data(), text.size());
  if (!parsed.ok()) return std::move(parsed).error();
  EncryptionKey result = EncryptionKey::FromRawKey(key);
  OPENSSL_cleanse(key.data(), key.size());
  return result;
}

Result<EncryptionKey> LoadPassphraseFile(Env& env, const std::string& path, uint8_t log2_n) {
  BARGE_ASSIGN_OR_RETURN(std::string text, ReadSecretFile(env, path, "passphrase file"));
  std::string_view line(text);
  line = line.substr(0, line.find('\n'));
  if (line.ends_with('\r')) line.remove_suffix(1);
  auto key = EncryptionKey::FromPassphrase(line, log2_n);
  OPENSSL_cleanse(text.data(), text.size());
  if (!key.ok()) return std::move(key).error().set_path(path);
  return key;
}

}  // namespace barge
