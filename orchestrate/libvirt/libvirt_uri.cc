// libvirt URI parsing and redaction.
#include "orchestrate/libvirt/libvirt_uri.h"

#include <cctype>
#include <charconv>

#include "blockio/nbd.h"

namespace barge::orchestrate {
namespace {

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// %XX escapes decoded; '+' stays (libvirt's query values are paths).
std::string Decode(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size() && HexValue(s[i + 1]) >= 0 && HexValue(s[i + 2]) >= 0) {
      out += static_cast<char>(HexValue(s[i + 1]) * 16 + HexValue(s[i + 2]));
      i += 2;
    } else {
      out += s[i];
    }
  }
  return out;
}

// A URI that does not parse, for messages: its scheme only (the rest may
// hold anything, a password too).
std::string SchemeOnly(const std::string& uri) {
  const size_t scheme_end = uri.find("://");
  return scheme_end == std::string::npos ? "(not a URI)" : uri.substr(0, scheme_end + 3) + "...";
}

}  // namespace

std::string LibvirtUri::Param(const std::string& name) const {
  for (const auto& [k, v] : params) {
    if (k == name) return v;
  }
  return "";
}

Result<LibvirtUri> ParseLibvirtUri(const std::string& text) {
  LibvirtUri u;
  const size_t scheme_end = text.find("://");
  if (scheme_end == std::string::npos || scheme_end == 0) {
    return Error::InvalidArgument("not a libvirt URI (driver[+transport]://[user@]host[:port]/path): " +
                                  SchemeOnly(text));
  }
  const std::string scheme = text.substr(0, scheme_end);
  const size_t plus = scheme.find('+');
  u.driver = scheme.substr(0, plus);
  if (plus != std::string::npos) u.transport = scheme.substr(plus + 1);
  std::string rest = text.substr(scheme_end + 3);
  const size_t query_at = rest.find('?');
  std::string query = query_at == std::string::npos ? "" : rest.substr(query_at + 1);
  if (query_at != std::string::npos) rest.resize(query_at);
  const size_t path_at = rest.find('/');
  std::string authority = path_at == std::string::npos ? rest : rest.substr(0, path_at);
  u.path = path_at == std::string::npos ? "" : rest.substr(path_at);
  if (const size_t at = authority.rfind('@'); at != std::string::npos) {
    std::string userinfo = authority.substr(0, at);
    authority = authority.substr(at + 1);
    const size_t colon = userinfo.find(':');
    u.user = Decode(userinfo.substr(0, colon));
    if (colon != std::string::npos) u.password = Decode(userinfo.substr(colon + 1));
  }
  // [v6]:port or host:port
  std::string port_text;
  if (!authority.empty() && authority[0] == '[') {
    const size_t close = authority.find(']');
    if (close == std::string::npos) return Error::InvalidArgument("bad host in libvirt URI " + SchemeOnly(text));
    u.host = authority.substr(1, close - 1);
    if (close + 1 < authority.size() && authority[close + 1] == ':') port_text = authority.substr(close + 2);
  } else {
    const size_t colon = authority.find(':');
    u.host = authority.substr(0, colon);
    if (colon != std::string::npos) port_text = authority.substr(colon + 1);
  }
  if (!port_text.empty()) {
    auto [end, ec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), u.port);
    if (ec != std::errc() || end != port_text.data() + port_text.size() || u.port <= 0 || u.port > 65535) {
      return Error::InvalidArgument("bad port '" + port_text + "' in libvirt URI " + SchemeOnly(text));
    }
  }
  size_t pos = 0;
  while (pos < query.size()) {
    size_t amp = query.find('&', pos);
    if (amp == std::string::npos) amp = query.size();
    std::string_view item(query.data() + pos, amp - pos);
    if (!item.empty()) {
      const size_t eq = item.find('=');
      u.params.emplace_back(Decode(item.substr(0, eq)),
                            eq == std::string_view::npos ? "" : Decode(item.substr(eq + 1)));
    }
    pos = amp + 1;
  }
  return u;
}

std::string LibvirtUri::Redacted() const {
  std::string s = driver + (transport.empty() ? "" : "+" + transport) + "://";
  if (!user.empty()) s += user + "@";
  s += host.find(':') != std::string::npos ? "[" + host + "]" : host;
  if (port != 0) s += ":" + std::to_string(port);
  s += path;
  for (size_t i = 0; i < params.size(); ++i) {
    s += (i == 0 ? "?" : "&") + params[i].first + "=" + params[i].second;
  }
  // keyfile=, pkipath= and their kind go (RedactUri, blockio/nbd.h).
  return RedactUri(s);
}

std::string LibvirtUri::HostKey() const {
  if (host.empty()) return "";
  // Neither the transport nor its port: qemu+ssh://h and qemu+tls://h:16514
  // reach one libvirtd, whose checkpoints a tracker's record names. Records
  // keep the URI (TrackerRecord::host), not the key, so one written with a
  // port compares equal to a connection without it.
  std::string h;
  for (char c : host) h += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return h;
}

std::string RedactLibvirtUri(const std::string& uri) {
  auto parsed = ParseLibvirtUri(uri);
  return parsed.ok() ? parsed->Redacted() : SchemeOnly(uri);
}

std::string LibvirtHostKey(const std::string& uri) {
  auto parsed = ParseLibvirtUri(uri);
  return parsed.ok() ? parsed->HostKey() : "";
}

}  // namespace barge::orchestrate
