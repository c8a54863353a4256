// The encrypted object's header and segments (docs/formats/encryption.md).
#include "blockio/aead_format.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/rand.h>

#include <algorithm>
#include <cstring>
#include <vector>

namespace barge {

namespace {

constexpr char kMagic[8] = {'B', 'A', 'R', 'G', 'E', 'E', 'N', 'C'};
constexpr size_t kWrapAadBytes = 52;  // header bytes the key wrap authenticates

void Put16(std::byte* p, uint16_t v) {
  for (int i = 0; i < 2; ++i) p[i] = std::byte(v >> (8 * i));
}
void Put32(std::byte* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = std::byte(v >> (8 * i));
}
void Put64(std::byte* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = std::byte(v >> (8 * i));
}
uint64_t GetLe(const std::byte* p, int n) {
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = v << 8 | uint64_t(p[i]);
  return v;
}

struct CipherCtx {
  EVP_CIPHER_CTX* ctx = EVP_CIPHER_CTX_new();
  ~CipherCtx() { EVP_CIPHER_CTX_free(ctx); }
};

// AES-256-GCM in one call. Encrypting writes `tag`; decrypting checks it
// (false on a mismatch or any OpenSSL failure).
bool Gcm(bool encrypt, const uint8_t* key, const uint8_t* nonce, std::span<const uint8_t> aad,
         std::span<const std::byte> in, std::byte* out, uint8_t* tag) {
  CipherCtx c;
  if (c.ctx == nullptr) return false;
  if (EVP_CipherInit_ex(c.ctx, EVP_aes_256_gcm(), nullptr, key, nonce, encrypt ? 1 : 0) != 1) return false;
  int len = 0;
  if (!aad.empty() && EVP_CipherUpdate(c.ctx, nullptr, &len, aad.data(), int(aad.size())) != 1) return false;
  if (!in.empty() &&
      EVP_CipherUpdate(c.ctx, reinterpret_cast<unsigned char*>(out), &len,
                       reinterpret_cast<const unsigned char*>(in.data()), int(in.size())) != 1) {
    return false;
  }
  if (!encrypt && EVP_CIPHER_CTX_ctrl(c.ctx, EVP_CTRL_GCM_SET_TAG, kAeadTagBytes, tag) != 1) return false;
  unsigned char end[16];
  if (EVP_CipherFinal_ex(c.ctx, end, &len) != 1) return false;
  if (encrypt && EVP_CIPHER_CTX_ctrl(c.ctx, EVP_CTRL_GCM_GET_TAG, kAeadTagBytes, tag) != 1) return false;
  return true;
}

std::array<uint8_t, kWrapAadBytes> WrapAad(const AeadHeader& header) {
  AeadHeader copy = header;
  copy.plaintext_bytes = 0;
  const auto bytes = EncodeAeadHeader(copy);
  std::array<uint8_t, kWrapAadBytes> aad{};
  std::memcpy(aad.data(), bytes.data(), aad.size());
  return aad;
}

// index (8 bytes LE) || final (1 byte) || identity.
std::vector<uint8_t> SegmentAad(uint64_t index, bool final, const std::string& identity) {
  std::vector<uint8_t> aad(9 + identity.size());
  for (int i = 0; i < 8; ++i) aad[i] = uint8_t(index >> (8 * i));
  aad[8] = final ? 1 : 0;
  std::memcpy(aad.data() + 9, identity.data(), identity.size());
  return aad;
}

bool IsPowerOfTwo(uint32_t v) { return v != 0 && (v & (v - 1)) == 0; }

}  // namespace

std::array<std::byte, kAeadHeaderBytes> EncodeAeadHeader(const AeadHeader& h) {
  std::array<std::byte, kAeadHeaderBytes> out{};
  std::byte* p = out.data();
  std::memcpy(p, kMagic, 8);
  Put16(p + 8, h.version);
  p[10] = std::byte(h.cipher);
  p[11] = std::byte(h.kdf.kind);
  Put32(p + 12, h.segment_bytes);
  Put64(p + 16, h.plaintext_bytes);
  p[24] = std::byte(h.kdf.log2_n);
  p[25] = std::byte(h.kdf.r);
  p[26] = std::byte(h.kdf.p);
  std::memcpy(p + 28, h.kdf.salt.data(), kKdfSaltBytes);
  std::memcpy(p + 44, h.key_id.data(), kKeyIdBytes);
  std::memcpy(p + 52, h.wrap_nonce.data(), kAeadNonceBytes);
  std::memcpy(p + 64, h.wrapped_key.data(), kWrappedKeyBytes);
  return out;
}

Result<AeadHeader> ParseAeadHeader(std::span<const std::byte> bytes) {
  if (bytes.size() < kAeadHeaderBytes || std::memcmp(bytes.data(), kMagic, 8) != 0) {
    return Error::Corruption("not a barge encrypted object");
  }
  const std::byte* p = bytes.data();
  AeadHeader h;
  h.version = uint16_t(GetLe(p + 8, 2));
  if (h.version != kAeadVersion) {
    return Error::Corruption("unsupported version " + std::to_string(h.version) +
                             " of the encrypted object format (this barge reads version " +
                             std::to_string(kAeadVersion) + ")");
  }
  h.cipher = uint8_t(p[10]);
  if (h.cipher != kAeadCipherAes256Gcm) return Error::Corruption("unsupported cipher " + std::to_string(h.cipher));
  h.kdf.kind = KdfParams::Kind(uint8_t(p[11]));
  h.segment_bytes = uint32_t(GetLe(p + 12, 4));
  if (!IsPowerOfTwo(h.segment_bytes) || h.segment_bytes < kAeadMinSegmentBytes ||
      h.segment_bytes > kAeadMaxSegmentBytes) {
    return Error::Corruption("segment size " + std::to_string(h.segment_bytes) +
                             " is not a power of two in 4 KiB..16 MiB");
  }
  h.plaintext_bytes = GetLe(p + 16, 8);
  if (h.plaintext_bytes > (uint64_t{1} << 56)) {
    return Error::Corruption("plaintext size " + std::to_string(h.plaintext_bytes) + " is out of bounds");
  }
  h.kdf.log2_n = uint8_t(p[24]);
  h.kdf.r = uint8_t(p[25]);
  h.kdf.p = uint8_t(p[26]);
  std::memcpy(h.kdf.salt.data(), p + 28, kKdfSaltBytes);
  BARGE_RETURN_IF_ERROR(CheckKdfParams(h.kdf));
  if (h.kdf.kind == KdfParams::Kind::kNone && !(h.kdf == KdfParams{})) {
    return Error::Corruption("key derivation parameters set for a key-file object");
  }
  std::memcpy(h.key_id.data(), p + 44, kKeyIdBytes);
  std::memcpy(h.wrap_nonce.data(), p + 52, kAeadNonceBytes);
  std::memcpy(h.wrapped_key.data(), p + 64, kWrappedKeyBytes);
  bool reserved_zero = p[27] == std::byte{0};
  for (size_t i = 112; i < kAeadHeaderBytes; ++i) reserved_zero = reserved_zero && p[i] == std::byte{0};
  if (!reserved_zero) return Error::Corruption("reserved header bytes are not zero");
  return h;
}

uint64_t AeadLayout::SegmentCount(uint64_t plaintext_bytes) const {
  return plaintext_bytes == 0 ? 1 : (plaintext_bytes + segment_bytes - 1) / segment_bytes;
}

uint64_t AeadLayout::SegmentOffset(uint64_t index) const {
  return kAeadHeaderBytes + index * (uint64_t{segment_bytes} + kAeadSegmentOverhead);
}

uint32_t AeadLayout::SegmentPlainBytes(uint64_t index, uint64_t plaintext_bytes) const {
  const uint64_t start = index * segment_bytes;
  return start >= plaintext_bytes ? 0 : uint32_t(std::min<uint64_t>(segment_bytes, plaintext_bytes - start));
}

uint64_t AeadLayout::ObjectBytes(uint64_t plaintext_bytes) const {
  return kAeadHeaderBytes + SegmentCount(plaintext_bytes) * kAeadSegmentOverhead + plaintext_bytes;
}

Result<uint64_t> AeadLayout::PlaintextBytes(uint64_t object_bytes) const {
  auto bad = [&] {
    return Error::Corruption("an encrypted object of " + std::to_string(object_bytes) +
                             " bytes is truncated or extended: no whole number of segments");
  };
  if (object_bytes < kAeadHeaderBytes + kAeadSegmentOverhead) return bad();
  const uint64_t rest = object_bytes - kAeadHeaderBytes;
  const uint64_t whole = uint64_t{segment_bytes} + kAeadSegmentOverhead;
  const uint64_t full = rest / whole, tail = rest % whole;
  if (tail == 0) return full * segment_bytes;
  if (tail < kAeadSegmentOverhead || (tail == kAeadSegmentOverhead && full > 0)) return bad();
  return full * segment_bytes + tail - kAeadSegmentOverhead;
}

AeadObjectKey::~AeadObjectKey() { OPENSSL_cleanse(data_key_.data(), data_key_.size()); }

Result<std::unique_ptr<AeadObjectKey>> AeadObjectKey::Create(const EncryptionKey& key, std::string identity,
                                                             AeadHeader& header) {
  header.kdf = key.write_kdf();
  BARGE_ASSIGN_OR_RETURN(std::shared_ptr<const Kek> kek, key.KekFor(header.kdf));
  header.key_id = kek->id;
  std::unique_ptr<AeadObjectKey> object(new AeadObjectKey(std::move(identity)));
  if (RAND_bytes(object->data_key_.data(), int(kDataKeyBytes)) != 1 ||
      RAND_bytes(header.wrap_nonce.data(), int(kAeadNonceBytes)) != 1) {
    return Error::Internal("RAND_bytes failed for a data key");
  }
  const auto aad = WrapAad(header);
  const std::span<const std::byte> plain(reinterpret_cast<const std::byte*>(object->data_key_.data()),
                                         kDataKeyBytes);
  if (!Gcm(true, kek->bytes.data(), header.wrap_nonce.data(), aad, plain,
           reinterpret_cast<std::byte*>(header.wrapped_key.data()), header.wrapped_key.data() + kDataKeyBytes)) {
    return Error::Internal("AES-256-GCM failed wrapping a data key");
  }
  return object;
}

Result<std::unique_ptr<AeadObjectKey>> AeadObjectKey::Open(const EncryptionKey& key, std::string identity,
                                                           const AeadHeader& header) {
  BARGE_ASSIGN_OR_RETURN(std::shared_ptr<const Kek> kek, key.KekFor(header.kdf));
  if (kek->id != header.key_id) {
    return Error::InvalidArgument("wrong key: the data key does not unwrap with key " + KeyIdHex(kek->id) +
                                  " (the object names key " + KeyIdHex(header.key_id) + ")")
        .set_path(identity);
  }
  std::unique_ptr<AeadObjectKey> object(new AeadObjectKey(std::move(identity)));
  const auto aad = WrapAad(header);
  std::array<uint8_t, kAeadTagBytes> tag{};
  std::memcpy(tag.data(), header.wrapped_key.data() + kDataKeyBytes, kAeadTagBytes);
  const std::span<const std::byte> sealed(reinterpret_cast<const std::byte*>(header.wrapped_key.data()),
                                          kDataKeyBytes);
  if (!Gcm(false, kek->bytes.data(), header.wrap_nonce.data(), aad, sealed,
           reinterpret_cast<std::byte*>(object->data_key_.data()), tag.data())) {
    return Error::Corruption("the encrypted object's header fails authentication under key " +
                             KeyIdHex(kek->id) + ": tampered")
        .set_path(object->identity_);
  }
  return object;
}

Status AeadObjectKey::Seal(uint64_t index, bool final, std::span<const std::byte> plain,
                           std::span<std::byte> out) const {
  if (out.size() != plain.size() + kAeadSegmentOverhead) return Error::Internal("AEAD seal: wrong output size");
  uint8_t* nonce = reinterpret_cast<uint8_t*>(out.data());
  if (RAND_bytes(nonce, int(kAeadNonceBytes)) != 1) return Error::Internal("RAND_bytes failed for a nonce");
  const auto aad = SegmentAad(index, final, identity_);
  uint8_t* tag = reinterpret_cast<uint8_t*>(out.data() + kAeadNonceBytes + plain.size());
  if (!Gcm(true, data_key_.data(), nonce, aad, plain, out.data() + kAeadNonceBytes, tag)) {
    return Error::Internal("AES-256-GCM failed sealing segment " + std::to_string(index));
  }
  return OkStatus();
}

Status AeadObjectKey::Open(uint64_t index, bool final, std::span<const std::byte> sealed,
                           std::span<std::byte> plain) const {
  if (sealed.size() < kAeadSegmentOverhead || plain.size() != sealed.size() - kAeadSegmentOverhead) {
    return Error::Internal("AEAD open: wrong sizes");
  }
  std::array<uint8_t, kAeadNonceBytes + kAeadTagBytes> nonce_tag{};
  std::memcpy(nonce_tag.data(), sealed.data(), kAeadNonceBytes);
  std::memcpy(nonce_tag.data() + kAeadNonceBytes, sealed.data() + sealed.size() - kAeadTagBytes, kAeadTagBytes);
  const auto aad = SegmentAad(index, final, identity_);
  if (!Gcm(false, data_key_.data(), nonce_tag.data(), aad, sealed.subspan(kAeadNonceBytes, plain.size()),
           plain.data(), nonce_tag.data() + kAeadNonceBytes)) {
    return Error::Corruption("segment " + std::to_string(index) + " fails authentication");
  }
  return OkStatus();
}

}  // namespace barge
