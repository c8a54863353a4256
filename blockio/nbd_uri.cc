// URIs as barge reads and shows them: NBD URI parameters, the server a URI
// names, and the one redaction every printed location and message goes
// through (RedactUri, RedactUrisIn, WithoutNbdSecrets).
#include <algorithm>
#include <cctype>
#include <string>
#include <vector>

#include "blockio/nbd.h"

namespace barge {

bool IsNbdUri(std::string_view uri) {
  for (std::string_view scheme : {"nbd://", "nbds://", "nbd+unix://", "nbds+unix://",
                                  "nbd+vsock://", "nbds+vsock://"}) {
    if (uri.starts_with(scheme)) return true;
  }
  return false;
}

namespace {

// The query of `uri` (between '?' and '#'), "" when none.
std::string_view QueryOf(std::string_view uri) {
  size_t q = uri.find('?');
  if (q == std::string_view::npos) return {};
  std::string_view query = uri.substr(q + 1);
  return query.substr(0, query.find('#'));
}

std::string PercentDecode(std::string_view in) {
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  std::string out;
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i] == '%' && i + 2 < in.size() && hex(in[i + 1]) >= 0 && hex(in[i + 2]) >= 0) {
      out += static_cast<char>(hex(in[i + 1]) * 16 + hex(in[i + 2]));
      i += 2;
    } else {
      out += in[i];
    }
  }
  return out;
}

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// A query parameter that names a credential or the file holding one:
// libnbd's tls-* (tls-psk-file, tls-certificates, tls-username), libvirt's
// keyfile= and pkipath=, anything called a password, secret, token or
// key, and the signature of a signed URL (an Azure SAS's sig=, S3's
// X-Amz-Signature, Google's X-Goog-Signature, CloudFront's Signature): a
// signed link is a credential until it expires. `name` is decoded
// ("tls%2Dpsk-file" is tls-psk-file to libnbd).
bool IsSecretParam(std::string_view name) {
  const std::string n = Lower(PercentDecode(name));
  if (n.starts_with("tls-")) return true;
  for (std::string_view word : {"key", "pass", "secret", "token", "psk", "cert", "pki", "cred", "auth", "sig"}) {
    if (n.find(word) != std::string::npos) return true;
  }
  return false;
}

// RFC 3986 scheme characters; a scheme starts with a letter.
bool IsSchemeChar(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '+' || c == '-' || c == '.';
}

// Where the scheme of a URI ending its scheme at `sep` ("://") starts in
// `text`, or npos when the characters before it are no scheme.
size_t SchemeStart(std::string_view text, size_t sep) {
  size_t start = sep;
  while (start > 0 && IsSchemeChar(text[start - 1])) --start;
  while (start < sep && std::isalpha(static_cast<unsigned char>(text[start])) == 0) ++start;
  return start < sep ? start : std::string_view::npos;
}

}  // namespace

std::string RedactUri(std::string_view location) {
  const size_t sep = location.find("://");
  if (sep == std::string_view::npos || SchemeStart(location, sep) != 0) return std::string(location);
  const bool nbd = IsNbdUri(location);
  std::string_view rest = location.substr(sep + 3);
  std::string out(location.substr(0, sep + 3));
  // The authority ends at the first '/', '?' or '#'; its user part at its
  // last '@'. An NBD URI's user is the TLS PSK identity: all of it goes.
  // Elsewhere (qemu+ssh://root@host) the user names the account and stays;
  // its ":password" goes.
  std::string_view authority = rest.substr(0, rest.find_first_of("/?#"));
  if (auto at = authority.rfind('@'); at != std::string_view::npos) {
    std::string_view user = authority.substr(0, at);
    if (!nbd) out += std::string(user.substr(0, user.find(':'))) + "@";
    rest.remove_prefix(at + 1);
  }
  size_t q = rest.find('?');
  out += rest.substr(0, q);
  if (q == std::string_view::npos) return out;
  std::string_view query = rest.substr(q + 1);
  std::string fragment;
  if (auto hash = query.find('#'); hash != std::string_view::npos) {
    fragment = std::string(query.substr(hash));
    query = query.substr(0, hash);
  }
  std::string kept;
  while (!query.empty()) {
    size_t amp = query.find('&');
    std::string_view param = query.substr(0, amp);
    query = amp == std::string_view::npos ? std::string_view() : query.substr(amp + 1);
    if (param.empty() || IsSecretParam(param.substr(0, param.find('=')))) continue;
    kept += (kept.empty() ? "" : "&") + std::string(param);
  }
  if (!kept.empty()) out += "?" + kept;
  return out + fragment;
}

std::string RedactNbdUri(std::string_view location) { return RedactUri(location); }

std::string RedactUrisIn(std::string_view text) {
  std::string out;
  size_t done = 0;  // text[0, done) is in `out`
  size_t search = 0;
  while (true) {
    const size_t sep = text.find("://", search);
    if (sep == std::string_view::npos) break;
    search = sep + 3;
    const size_t start = SchemeStart(text, sep);
    if (start == std::string_view::npos || start < done) continue;
    // A URI has no blanks; quotes and brackets around it are not its own.
    size_t end = sep + 3;
    while (end < text.size() && std::isspace(static_cast<unsigned char>(text[end])) == 0 &&
           std::string_view("\"'<>()[]{}`").find(text[end]) == std::string_view::npos) {
      ++end;
    }
    out += text.substr(done, start - done);
    out += RedactUri(text.substr(start, end - start));
    done = end;
    search = end;
  }
  out += text.substr(done);
  return out;
}

std::string NbdUriParam(std::string_view uri, std::string_view name) {
  std::string_view query = QueryOf(uri);
  while (!query.empty()) {
    size_t amp = query.find('&');
    std::string_view param = query.substr(0, amp);
    query = amp == std::string_view::npos ? std::string_view() : query.substr(amp + 1);
    size_t eq = param.find('=');
    if (PercentDecode(param.substr(0, eq)) == name) return eq == std::string_view::npos ? "" : PercentDecode(param.substr(eq + 1));
  }
  return {};
}

bool NbdUriRequestsTls(std::string_view uri) {
  return uri.starts_with("nbds") || !NbdUriParam(uri, "tls-certificates").empty() ||
         !NbdUriParam(uri, "tls-psk-file").empty();
}

std::string NbdServerName(std::string_view uri) {
  if (uri.find("+unix://") != std::string_view::npos) return "unix socket " + NbdUriParam(uri, "socket");
  std::string_view rest = uri;
  if (auto scheme = rest.find("://"); scheme != std::string_view::npos) rest.remove_prefix(scheme + 3);
  std::string_view authority = rest.substr(0, rest.find_first_of("/?#"));
  if (auto at = authority.rfind('@'); at != std::string_view::npos) authority.remove_prefix(at + 1);
  if (uri.find("+vsock://") != std::string_view::npos) return "vsock " + std::string(authority);
  // A port follows the last ':' outside an IPv6 literal's brackets.
  size_t colon = authority.rfind(':');
  bool has_port = colon != std::string_view::npos && authority.find(']', colon) == std::string_view::npos;
  std::string host(has_port ? authority.substr(0, colon) : authority);
  if (host.empty()) host = "localhost";
  return host + ":" + (has_port ? std::string(authority.substr(colon + 1)) : std::string("10809"));
}

namespace {

// Replaces each occurrence of `secret` in `text` that stands as a word of
// its own (not inside a longer name: "al" in "alice" stays) by `shown`.
void ReplaceWord(std::string& text, const std::string& secret, const std::string& shown) {
  if (secret.empty()) return;
  auto inside = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '_' || c == '-'; };
  size_t pos = 0;
  while ((pos = text.find(secret, pos)) != std::string::npos) {
    const size_t end = pos + secret.size();
    const bool word = (pos == 0 || !inside(text[pos - 1])) && (end == text.size() || !inside(text[end]));
    if (!word) {
      pos = end;
      continue;
    }
    text.replace(pos, secret.size(), shown);
    pos += shown.size();
  }
}

}  // namespace

Error WithoutNbdSecrets(const Error& error, std::string_view uri, const NbdTls& tls) {
  std::string text = RedactUrisIn(error.message());
  // Longest first: a path must go whole before a user name inside it could.
  std::vector<std::pair<std::string, std::string>> secrets = {
      {NbdUriParam(uri, "tls-psk-file"), "<tls-psk-file>"},
      {NbdUriParam(uri, "tls-certificates"), "<tls-certificates>"},
      {tls.psk_file, "<tls-psk-file>"},
      {tls.certificates_dir, "<tls-certificates>"},
      {NbdUriParam(uri, "tls-username"), "<tls-username>"},
      {tls.username, "<tls-username>"}};
  std::string_view rest = uri.substr(std::min(uri.size(), uri.find("://") + 3));
  std::string_view authority = rest.substr(0, rest.find_first_of("/?#"));
  if (auto at = authority.rfind('@'); at != std::string_view::npos && IsNbdUri(uri)) {
    std::string_view user = authority.substr(0, at);
    secrets.emplace_back(PercentDecode(user.substr(0, user.find(':'))), "<tls-username>");
    if (auto colon = user.find(':'); colon != std::string_view::npos) {
      secrets.emplace_back(PercentDecode(user.substr(colon + 1)), "<password>");
    }
  }
  std::stable_sort(secrets.begin(), secrets.end(),
                   [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
  for (const auto& [secret, shown] : secrets) ReplaceWord(text, secret, shown);
  Error out(error.code(), std::move(text));
  out.set_errno(error.errno_value()).set_retryable(error.retryable()).set_path(RedactUri(error.path()));
  if (error.offset()) out.set_offset(*error.offset());
  if (error.offset() && error.length()) out.set_range(*error.offset(), *error.length());
  return out;
}

}  // namespace barge
