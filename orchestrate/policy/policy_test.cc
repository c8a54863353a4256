// Policy files: the README's example, every field, and errors that name
// the line (unknown keys with a suggestion, wrong types, bad values).
#include "orchestrate/policy/policy.h"

#include <gtest/gtest.h>

#include "orchestrate/schedule/time_text.h"

namespace barge::orchestrate {
namespace {

constexpr const char* kExample = R"(name: nightly
sources:
  - image: /var/lib/vm/disk.qcow2
    bitmap: cbt0          # incrementals from this persistent bitmap
  - domain: vm1
    tracker: nightly
    quiesce: true         # freeze through the guest agent; false without one (crash-consistent)
reason: ""
schedule: "0 2 * * *"
max_duration_without_backup: 26h
retention_count: 15
targets: [/backups/a, /backups/b]
free_space_multiple: 2
)";

TEST(PolicyTest, ReadmeExample) {
  auto p = ParsePolicy(Env::Default(), kExample, "nightly.yaml");
  ASSERT_TRUE(p.ok()) << p.error().message();
  EXPECT_EQ(p->name, "nightly");
  ASSERT_EQ(p->sources.size(), 2u);
  EXPECT_EQ(p->sources[0].kind, PolicySourceKind::kImage);
  EXPECT_EQ(p->sources[0].name, "disk");
  EXPECT_EQ(p->sources[0].location, "/var/lib/vm/disk.qcow2");
  EXPECT_EQ(p->sources[0].bitmap, "cbt0");
  EXPECT_EQ(p->sources[0].line, 3);
  EXPECT_EQ(p->sources[1].kind, PolicySourceKind::kDomain);
  EXPECT_EQ(p->sources[1].name, "vm1");
  EXPECT_EQ(p->sources[1].tracker, "nightly");
  EXPECT_TRUE(p->sources[1].quiesce);
  EXPECT_EQ(p->reason, "");
  ASSERT_TRUE(p->schedule.has_value());
  EXPECT_EQ(p->max_duration_without_backup, std::chrono::hours(26));
  EXPECT_EQ(p->retention_count, 15u);
  EXPECT_EQ(p->targets, (std::vector<std::string>{"/backups/a", "/backups/b"}));
  EXPECT_EQ(p->free_space_multiple, 2.0);
  // Defaults.
  EXPECT_EQ(p->max_run_time.count(), 0);
  EXPECT_EQ(p->max_parallel, 1u);
  EXPECT_EQ(p->full_every, 0u);
  EXPECT_EQ(p->compression, formats::Compression::kZstd);
  EXPECT_FALSE(p->pre_hook.has_value());

  auto runs = NextRunTimes(*p, *ParseRfc3339("2026-11-22T03:00:00Z"), 5);
  ASSERT_EQ(runs.size(), 5u);
  EXPECT_EQ(FormatRfc3339(runs[0]), "2026-11-23T02:00:00Z");
  EXPECT_EQ(FormatRfc3339(runs[4]), "2026-11-27T02:00:00Z");
}

TEST(PolicyTest, EveryField) {
  auto p = ParsePolicy(Env::Default(), R"(name: all-fields
sources:
  - name: web
    nbd: nbd+unix:///vda?socket=/run/s.sock
  - image: /a/disk.raw
reason: ticket-42
schedule: "@hourly"
max_duration_without_backup: 1d12h
retention_count: 3
targets:
  - /t1/
  - /t2
free_space_multiple: 1.5
max_run_time: 90m
max_parallel: 4
full_every: 7
compression: zlib:9
pre_hook: /usr/local/bin/freeze
post_hook:
  command: echo done
  timeout: 30s
)");
  ASSERT_TRUE(p.ok()) << p.error().message();
  EXPECT_EQ(p->sources[0].name, "web");
  EXPECT_EQ(p->sources[0].kind, PolicySourceKind::kNbd);
  EXPECT_EQ(p->sources[1].name, "disk");
  EXPECT_EQ(p->reason, "ticket-42");
  EXPECT_EQ(p->schedule->expression(), "@hourly");
  EXPECT_EQ(p->max_duration_without_backup.count(), 129600);
  EXPECT_EQ(p->retention_count, 3u);
  EXPECT_EQ(p->targets, (std::vector<std::string>{"/t1", "/t2"}));
  EXPECT_EQ(p->free_space_multiple, 1.5);
  EXPECT_EQ(p->max_run_time.count(), 5400);
  EXPECT_EQ(p->max_parallel, 4u);
  EXPECT_EQ(p->full_every, 7u);
  EXPECT_EQ(p->compression, formats::Compression::kDeflate);
  EXPECT_EQ(p->compression_level, 9);
  ASSERT_TRUE(p->pre_hook);
  EXPECT_EQ(p->pre_hook->command, "/usr/local/bin/freeze");
  EXPECT_EQ(p->pre_hook->timeout, std::chrono::minutes(5));
  EXPECT_EQ(p->post_hook->command, "echo done");
  EXPECT_EQ(p->post_hook->timeout.count(), 30);
  EXPECT_NE(p->FindSource("web"), nullptr);
  EXPECT_EQ(p->FindSource("nope"), nullptr);
}

TEST(PolicyTest, ScheduleTimeZone) {
  auto p = ParsePolicy(Env::Default(), "name: z\nsources: [{image: /d.qcow2}]\ntargets: [/t]\nschedule: 'CRON_TZ=UTC 0 2 * * *'\n");
  ASSERT_TRUE(p.ok()) << p.error().message();
  EXPECT_TRUE(p->schedule->zone().is_utc());
  EXPECT_EQ(p->schedule->expression(), "0 2 * * *");  // shown without a leading blank
  auto bad = ParsePolicy(Env::Default(), "name: z\nsources: [{image: /d.qcow2}]\ntargets: [/t]\nschedule: 'TZ=Mars/Base 0 2 * * *'\n");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message().find("policy:4:11: 'schedule': unknown time zone 'Mars/Base'"), std::string::npos)
      << bad.error().message();
  // No schedule: only reasons and manual runs.
  auto none = ParsePolicy(Env::Default(), "name: z\nsources: [{image: /d.qcow2}]\ntargets: [/t]\n");
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->schedule);
  EXPECT_TRUE(NextRunTimes(*none, *ParseRfc3339("2026-01-01T00:00:00Z"), 5).empty());
}

struct BadCase {
  const char* yaml;
  const char* want;  // a substring of the message
};

TEST(PolicyTest, ErrorsNameTheLine) {
  const std::string head = "name: p\nsources: [{image: /d.qcow2}]\ntargets: [/t]\n";  // lines 1-3
  const BadCase cases[] = {
      {"retention: 5\n", "policy:4:1: unknown key 'retention' in the policy (did you mean 'retention_count'?)"},
      {"schedul: '@daily'\n", "policy:4:1: unknown key 'schedul' in the policy (did you mean 'schedule'?)"},
      {"max_paralel: 2\n", "(did you mean 'max_parallel'?)"},
      {"colour: blue\n", "unknown key 'colour' in the policy (known keys: name, sources"},
      {"retention_count: 0\n", "policy:4:18: 'retention_count' must be a whole number from 1 to 100000, not '0'"},
      {"retention_count: many\n", "not 'many'"},
      {"retention_count: -3\n", "not '-3'"},
      {"max_parallel: 65\n", "'max_parallel' must be a whole number from 1 to 64"},
      {"max_duration_without_backup: 26x\n", "policy:4:30: 'max_duration_without_backup': not a duration: '26x' (unknown unit 'x' at position 3"},
      {"max_run_time: [1h]\n", "'max_run_time' must be a single value"},
      {"schedule: '0 25 * * *'\n", "policy:4:11: 'schedule': cron: hour (field 2) at position 3: 25 is out of range"},
      {"free_space_multiple: -1\n", "'free_space_multiple' must be a number from 0 to 1000"},
      {"free_space_multiple: nan\n", "'free_space_multiple' must be a number"},
      {"compression: lz4\n", "'compression': unknown compression 'lz4'"},
      {"compression: zstd:20\n", "compression level must be 1..19"},
      {"pre_hook: {commnd: x}\n", "unknown key 'commnd' in pre_hook (did you mean 'command'?)"},
      {"post_hook: {command: x, timeout: 0}\n", "'timeout' must be more than 0"},
      {"reason: [a]\n", "'reason' must be a single value"},
  };
  for (const auto& c : cases) {
    auto p = ParsePolicy(Env::Default(), head + c.yaml);
    ASSERT_FALSE(p.ok()) << c.yaml;
    EXPECT_EQ(p.error().code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(p.error().message().find(c.want), std::string::npos)
        << c.yaml << "\n got: " << p.error().message() << "\n want: " << c.want;
  }
}

// Targets in buckets and offsite copies (docs/policies.md): a plain entry
// or {path, offsite}; offsite a location or {to, retention_count}.
TEST(PolicyTest, BucketTargetsAndOffsites) {
  auto p = ParsePolicy(Env::Default(),
                       "name: p\nsources: [{image: /d.qcow2}]\nretention_count: 7\ntargets:\n"
                       "  - s3://bkt/pre/\n"
                       "  - path: /a\n    offsite: s3://off/x\n"
                       "  - path: /b\n    offsite: {to: /usb, retention_count: 30}\n");
  ASSERT_TRUE(p.ok()) << p.error().ToString();
  EXPECT_EQ(p->targets, (std::vector<std::string>{"s3://bkt/pre", "/a", "/b"}));
  EXPECT_TRUE(IsBucketTarget(p->targets[0]));
  EXPECT_FALSE(IsBucketTarget(p->targets[1]));
  ASSERT_EQ(p->offsites.size(), 2u);
  EXPECT_EQ(p->OffsiteOf("s3://bkt/pre"), nullptr);
  ASSERT_NE(p->OffsiteOf("/a"), nullptr);
  EXPECT_EQ(p->OffsiteOf("/a")->location, "s3://off/x");
  EXPECT_EQ(p->OffsiteOf("/a")->retention_count, 7u);  // the policy's
  EXPECT_EQ(p->OffsiteOf("/b")->location, "/usb");
  EXPECT_EQ(p->OffsiteOf("/b")->retention_count, 30u);
  EXPECT_EQ(PolicyLocations(*p), (std::vector<std::string>{"s3://bkt/pre", "/a", "/b", "s3://off/x", "/usb"}));

  const std::string head = "name: p\nsources: [{image: /d.qcow2}]\ntargets:\n";
  const BadCase cases[] = {
      {"  - s3://Bad_Bucket/x\n", "'targets': "},
      {"  - path: /a\n    ofsite: /o\n", "unknown key 'ofsite' in a target (did you mean 'offsite'?)"},
      {"  - offsite: /o\n", "a target needs 'path'"},
      {"  - path: /a\n    offsite: relative\n", "offsite must be absolute folders or s3://BUCKET/PREFIX"},
      {"  - path: /a\n    offsite: {retention_count: 3}\n", "'offsite' needs 'to'"},
      {"  - path: /a\n    offsite: {to: /o, retention_count: 0}\n", "'retention_count' must be a whole number"},
      {"  - path: /a\n    offsite: /a\n", "offsite '/a' is its own target"},
      {"  - path: /a\n    offsite: /b\n  - /b\n", "offsite '/b' is a target of the policy"},
      {"  - path: /a\n    offsite: /o\n  - path: /b\n    offsite: /o\n", "offsite '/o' is named twice"},
  };
  for (const auto& c : cases) {
    auto bad = ParsePolicy(Env::Default(), head + c.yaml);
    ASSERT_FALSE(bad.ok()) << c.yaml;
    EXPECT_NE(bad.error().message().find(c.want), std::string::npos)
        << c.yaml << "\n got: " << bad.error().message() << "\n want: " << c.want;
  }
}

TEST(PolicyTest, StructureErrors) {
  const BadCase cases[] = {
      {"", "a policy must be a map"},
      {"- a\n- b\n", "a policy must be a map"},
      {"name: p\n", "missing required field 'sources'"},
      {"name: p\nsources: []\ntargets: [/t]\n", "policy:2:10: 'sources' must be a non-empty list"},
      {"name: p p\nsources: [{image: /d}]\ntargets: [/t]\n", "policy names are [A-Za-z0-9_.-]+"},
      {"name: p\nsources:\n  - image: d.qcow2\ntargets: [/t]\n", "policy:3:12: 'image' must be an absolute path"},
      {"name: p\nsources:\n  - img: /d.qcow2\ntargets: [/t]\n",
       "policy:3:5: unknown key 'img' in a source (did you mean 'image'?)"},
      {"name: p\nsources:\n  - image: /d.qcow2\n    domain: vm\ntargets: [/t]\n", "exactly one of"},
      {"name: p\nsources:\n  - domain: vm\n    bitmap: b\ntargets: [/t]\n", "'bitmap' belongs to 'image' sources"},
      {"name: p\nsources:\n  - image: /a/disk.qcow2\n  - image: /b/disk.raw\ntargets: [/t]\n",
       "policy:4:5: two sources are named 'disk': give one a 'name'"},
      {"name: p\nsources:\n  - nbd: http://x\ntargets: [/t]\n", "'nbd' must be an NBD URI"},
      {"name: p\nsources:\n  - image: /d\n    connect: qemu:///system\ntargets: [/t]\n",
       "'connect' belongs to 'domain' sources"},
      {"name: p\nsources:\n  - domain: vm\n    connect: 'qemu+ssh://u:pw@h:99999/system'\ntargets: [/t]\n",
       "policy:4:14: 'connect' is bad port '99999' in libvirt URI qemu+ssh://..."},
      {"name: p\nsources:\n  - domain: vm\n    connect: hv1\ntargets: [/t]\n", "'connect' is not a libvirt URI"},
      {"name: p\nsources:\n  - image: /d\n    nbd_port_range: 1-2\ntargets: [/t]\n",
       "'nbd_port_range' belongs to 'domain' sources"},
      {"name: p\nsources:\n  - domain: vm\n    nbd_port_range: 20-10\ntargets: [/t]\n",
       "policy:4:21: 'nbd_port_range' is a bad port range '20-10'"},
      {"name: p\nsources:\n  - domain: vm\n    tls_certificates: pki\ntargets: [/t]\n",
       "'tls_certificates' must be an absolute folder"},
      {"name: p\nsources:\n  - image: /d\n    quiesce: false\ntargets: [/t]\n",
       "policy:4:14: 'quiesce' belongs to 'domain' sources"},
      {"name: p\nsources:\n  - nbd: nbd://h/e\n    quiesce: true\ntargets: [/t]\n",
       "'quiesce' belongs to 'domain' sources"},
      {"name: p\nsources:\n  - domain: vm\n    quiesce: no\ntargets: [/t]\n",
       "policy:4:14: 'quiesce' is true or false, not 'no'"},
      {"name: p\nsources:\n  - domain: vm\n    quiesce: [false]\ntargets: [/t]\n",
       "'quiesce' must be a single value"},
      {"name: p\nsources:\n  - domain: vm\n    quiesse: false\ntargets: [/t]\n",
       "unknown key 'quiesse' in a source (did you mean 'quiesce'?)"},
      {"name: p\nsources: [{image: /d}]\ntargets: [t]\n", "targets must be absolute folders or s3://BUCKET/PREFIX, not 't'"},
      {"name: p\nsources: [{image: /d}]\ntargets: [/t, /t/]\n", "target '/t' is listed twice"},
      {"name: p\nname: q\nsources: [{image: /d}]\ntargets: [/t]\n", "policy:2:1: duplicate key 'name'"},
      {"name: p\nsources: [{image: /d}\ntargets: [/t]\n", "policy:3:"},  // YAML syntax error
      {"name: p\nsources: [{image: /d}]\ntargets: [/t]\nreason: a: b\n", "policy:4:10: YAML: illegal map value"},
  };
  for (const auto& c : cases) {
    auto p = ParsePolicy(Env::Default(), c.yaml);
    ASSERT_FALSE(p.ok()) << c.yaml;
    EXPECT_NE(p.error().message().find(c.want), std::string::npos)
        << c.yaml << "\n got: " << p.error().message() << "\n want: " << c.want;
  }
  // Every problem is reported, one per line.
  auto p = ParsePolicy(Env::Default(), "name: p\nsources: [{image: /d}]\ntargets: [/t]\nretention_count: 0\nmax_parallel: 0\n");
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.error().message().find("policy:4:"), std::string::npos);
  EXPECT_NE(p.error().message().find("\npolicy:5:"), std::string::npos);
}

// target_group: a group the host knows (name or number), or refused.
TEST(PolicyTest, TargetGroup) {
  const std::string head = "name: p\nsources: [{image: /d.qcow2}]\ntargets: [/t]\n";
  auto p = ParsePolicy(Env::Default(), head + "target_group: 0\n");
  ASSERT_TRUE(p.ok()) << p.error().message();
  EXPECT_EQ(p->target_group, "0");
  auto none = ParsePolicy(Env::Default(), head);
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->target_group, "");
  auto bad = ParsePolicy(Env::Default(), head + "target_group: no-such-group-35\n", "p.yaml");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message().find("p.yaml:4:15: 'target_group': no such group: no-such-group-35"),
            std::string::npos)
      << bad.error().message();
}

TEST(PolicyTest, DomainSourceConnect) {
  auto p = ParsePolicy(Env::Default(), "name: p\nsources:\n  - domain: vm1\n    connect: "
                                       "'qemu+ssh://root@hv1:2222/system?keyfile=/k'\n  - domain: vm2\ntargets: [/t]\n");
  ASSERT_TRUE(p.ok()) << p.error().ToString();
  EXPECT_EQ(p->sources[0].connect, "qemu+ssh://root@hv1:2222/system?keyfile=/k");
  EXPECT_EQ(p->sources[1].connect, "");
  EXPECT_EQ(p->sources[1].tls_certificates, "");
  EXPECT_EQ(p->sources[1].nbd_port_range, "");
}

// A domain without a guest agent: its backups skip the freeze (vm backup
// --skip-quiesce); quiesced is the default.
TEST(PolicyTest, DomainSourceQuiesce) {
  auto p = ParsePolicy(Env::Default(), "name: p\nsources:\n  - domain: vm1\n    quiesce: false\n"
                                       "  - domain: vm2\n    quiesce: true\n  - domain: vm3\ntargets: [/t]\n");
  ASSERT_TRUE(p.ok()) << p.error().ToString();
  ASSERT_EQ(p->sources.size(), 3u);
  EXPECT_FALSE(p->sources[0].quiesce);
  EXPECT_TRUE(p->sources[1].quiesce);
  EXPECT_TRUE(p->sources[2].quiesce);
}

TEST(PolicyTest, DomainSourceTlsExport) {
  auto p = ParsePolicy(Env::Default(), "name: p\nsources:\n  - domain: vm1\n    connect: qemu+tls://hv1/system\n"
                                       "    tls_certificates: /etc/barge/nbd-pki\n    nbd_port_range: 20000-20009\n"
                                       "targets: [/t]\n");
  ASSERT_TRUE(p.ok()) << p.error().ToString();
  EXPECT_EQ(p->sources[0].tls_certificates, "/etc/barge/nbd-pki");
  EXPECT_EQ(p->sources[0].nbd_port_range, "20000-20009");
}

// Issue 23: how an image or NBD source's incrementals find changes.
TEST(PolicyTest, ChangedByDefaultsAndRefusals) {
  auto p = ParsePolicy(Env::Default(),
                       "name: p\nsources:\n  - image: /a.raw\n  - image: /b.qcow2\n    bitmap: cbt0\n"
                       "  - image: /c.qcow2\n    bitmap: cbt0\n    changed_by: bitmap+digests\n"
                       "  - nbd: nbd://h/e\n  - nbd: nbd://h/f\n    changed_by: digests\n  - domain: vm\n"
                       "targets: [/t]\n");
  ASSERT_TRUE(p.ok()) << p.error().ToString();
  EXPECT_EQ(p->sources[0].changed_by, "digests");  // no bitmap: digests, not a full every time
  EXPECT_EQ(p->sources[1].changed_by, "bitmap");
  EXPECT_EQ(p->sources[2].changed_by, "bitmap+digests");
  EXPECT_EQ(p->sources[3].changed_by, "full");
  EXPECT_EQ(p->sources[4].changed_by, "digests");
  EXPECT_EQ(p->sources[5].changed_by, "");
  for (const char* bad : {"  - image: /a.raw\n    changed_by: bitmap\n",
                          "  - image: /a.qcow2\n    bitmap: b\n    changed_by: digests\n",
                          "  - image: /a.raw\n    changed_by: sometimes\n",
                          "  - domain: vm\n    changed_by: digests\n"}) {
    auto r = ParsePolicy(Env::Default(), std::string("name: p\nsources:\n") + bad + "targets: [/t]\n");
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.error().message().find("changed_by"), std::string::npos) << r.error().message();
  }
}

// Issue 36 §8: an NBD source's chain followed its URI (port included); a
// source may name its disk instead, as `barge backup --disk-id`.
TEST(PolicyTest, DiskIdNamesAnImageOrNbdSourcesDisk) {
  auto p = ParsePolicy(Env::Default(),
                       "name: p\nsources:\n  - nbd: nbd://h:10810/e\n    changed_by: digests\n    disk_id: db1\n"
                       "  - image: /b.qcow2\n    disk_id: serial:WD-1\n  - image: /c.qcow2\ntargets: [/t]\n");
  ASSERT_TRUE(p.ok()) << p.error().ToString();
  EXPECT_EQ(p->sources[0].disk_id, "db1");
  EXPECT_EQ(p->sources[1].disk_id, "serial:WD-1");
  EXPECT_EQ(p->sources[2].disk_id, "");
  for (const char* bad : {"  - domain: vm\n    disk_id: db1\n", "  - nbd: nbd://h/e\n    disk_id: \"a b\"\n",
                          "  - nbd: nbd://h/e\n    disk_id: \"\"\n"}) {
    auto r = ParsePolicy(Env::Default(), std::string("name: p\nsources:\n") + bad + "targets: [/t]\n");
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.error().message().find("disk_id"), std::string::npos) << r.error().message();
  }
}

TEST(PolicyTest, LoadThroughEnv) {
  auto missing = LoadPolicy(Env::Default(), "/nonexistent/barge-policy.yaml");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().code(), ErrorCode::kNotFound);
}

}  // namespace
}  // namespace barge::orchestrate
