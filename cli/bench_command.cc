// barge bench: every pipeline stage alone on the same (generated or given)
// disk, then the whole backup-like pipeline, with the knobs printed next to
// the numbers. `barge bench generate` writes the deterministic test disk so
// scripts can give peers the exact same data.
#include <sys/utsname.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>

#include "blockio/path.h"
#include "cli/common.h"
#include "cli/copy_flags.h"
#include "cli/interrupt.h"
#include "pipeline/bench.h"
#include "pipeline/disk_generator.h"

namespace barge::cli {
namespace {

using nlohmann::json;

struct BenchArgs {
  std::string size = "4G";
  CLI::Option* size_option = nullptr;
  uint64_t seed = 1;
  std::string source;
  std::string workdir = "/var/tmp";
  std::string chunk_size = "1M";
  CopyFlags copy;
  bool cold = false;
  bool keep = false;
};

struct GenerateArgs {
  std::string size = "4G";
  uint64_t seed = 1;
  std::string out;
};

bool size_option_given(const BenchArgs& a) { return a.size_option != nullptr && a.size_option->count() > 0; }

double MiB(uint64_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); }

std::string CpuModel(Env& env) {
  auto text = env.ReadFile("/proc/cpuinfo");
  if (!text.ok()) return "unknown";
  for (size_t at = 0; at < text->size();) {
    size_t end = text->find('\n', at);
    if (end == std::string::npos) end = text->size();
    std::string line = text->substr(at, end - at);
    at = end + 1;
    if (line.rfind("model name", 0) == 0) {
      auto colon = line.find(':');
      if (colon != std::string::npos) return line.substr(colon + 2);
    }
  }
  return "unknown";
}

std::string FilesystemOf(Env& env, const std::string& path) {
  auto space = env.Space(path);
  if (!space.ok() || space->filesystem_type == 0) return "unknown";
  switch (static_cast<unsigned long>(space->filesystem_type)) {
    case 0xEF53: return "ext2/3/4";
    case 0x58465342: return "xfs";
    case 0x9123683E: return "btrfs";
    case 0x01021994: return "tmpfs";
    case 0x794C7630: return "overlayfs";
    case 0x2FC12FC1: return "zfs";
    case 0x6969: return "nfs";
    default: {
      char buf[32];
      std::snprintf(buf, sizeof buf, "0x%lx", static_cast<unsigned long>(space->filesystem_type));
      return buf;
    }
  }
}

json MachineJson(const std::string& workdir, int threads) {
  utsname u{};
  ::uname(&u);
  Env& env = Env::Default();
  return {{"cpu", CpuModel(env)},
          {"cores", threads},
          {"kernel", std::string(u.sysname) + " " + u.release},
          {"workdir", workdir},
          {"filesystem", FilesystemOf(env, workdir)}};
}

json MixJson(const pipeline::DiskMix& mix) {
  json kinds = json::object();
  for (size_t k = 0; k < static_cast<size_t>(pipeline::ExtentKind::kCount); ++k) {
    auto kind = static_cast<pipeline::ExtentKind>(k);
    kinds[std::string(pipeline::ExtentKindName(kind))] = {
        {"bytes", mix.bytes[k]}, {"percent", mix.percent(kind)}, {"extents", mix.extents[k]}};
  }
  return {{"size", mix.size_bytes}, {"seed", mix.seed}, {"extents", mix.extent_count()},
          {"allocated", mix.allocated_bytes()}, {"kinds", kinds}};
}

void PrintMix(std::ostream& t, const pipeline::DiskMix& mix, const std::string& path) {
  t << Format("disk: %s, %s, seed %llu, %llu extents:", path.c_str(), HumanBytes(mix.size_bytes).c_str(),
              static_cast<unsigned long long>(mix.seed), static_cast<unsigned long long>(mix.extent_count()));
  for (size_t k = 0; k < static_cast<size_t>(pipeline::ExtentKind::kCount); ++k) {
    auto kind = static_cast<pipeline::ExtentKind>(k);
    t << Format(" %s %.1f%% (%llu)", std::string(pipeline::ExtentKindName(kind)).c_str(), mix.percent(kind),
                static_cast<unsigned long long>(mix.extents[k]));
  }
  t << Format("\n");
}

int RunGenerate(const GenerateArgs& a, Output& out) {
  auto size = ParseSize(a.size);
  if (!size.ok()) return out.Usage("--size: " + size.error().message());
  if (Status s = pipeline::CheckGeneratedDiskSize(*size); !s.ok()) return out.Usage("--size: " + s.error().message());
  pipeline::DiskGeneratorOptions g;
  g.size_bytes = *size;
  g.seed = a.seed;
  g.cancel = &CancelFlag();
  auto mix = pipeline::GenerateDisk(Env::Default(), a.out, g);
  if (!mix.ok()) return out.Fail(mix.error());
  out.Result({{"path", a.out}, {"disk", MixJson(*mix)}});
  PrintMix(out.text(), *mix, a.out);
  return kExitOk;
}

void Log(const std::string& line) { std::fprintf(stderr, "bench: %s\n", line.c_str()); }

// A new, private folder "barge-bench-PID-N" under `workdir` (no other live
// process has our pid; a dead one's leftover is skipped).
Result<std::string> MakeScratchFolder(Env& env, const std::string& workdir) {
  for (int n = 0; n < 1000; ++n) {
    std::string dir = JoinPath(workdir, "barge-bench-" + std::to_string(::getpid()) + "-" + std::to_string(n));
    auto st = env.StatNoFollow(dir);
    if (st.ok()) continue;
    if (st.error().code() != ErrorCode::kNotFound) return st.error();
    BARGE_RETURN_IF_ERROR(env.CreateDir(dir));
    BARGE_RETURN_IF_ERROR(env.SetMode(dir, 0700));
    return dir;
  }
  return Error::InvalidArgument("no free scratch folder name").set_path(workdir);
}

int RunBenchCommand(const BenchArgs& a, Output& out) {
  std::ostream& t = out.text();
  pipeline::CopyOptions copy;
  formats::CompressionSpec compression;
  if (Status s = a.copy.Apply(copy, compression); !s.ok()) return out.Usage(s.error().message());
  auto chunk = ParseSize(a.chunk_size);
  if (!chunk.ok()) return out.Usage("--chunk-size: " + chunk.error().message());
  if (*chunk < copy.cluster_bytes || *chunk % copy.cluster_bytes != 0 || *chunk > (64u << 20)) {
    return out.Usage("--chunk-size must be a multiple of the cluster size, at most 64M");
  }

  uint64_t size_bytes = 0;
  if (a.source.empty()) {
    auto size = ParseSize(a.size);
    if (!size.ok()) return out.Usage("--size: " + size.error().message());
    if (Status s = pipeline::CheckGeneratedDiskSize(*size); !s.ok()) return out.Usage("--size: " + s.error().message());
    if (*size < pipeline::kMinBenchDiskBytes) {
      return out.Usage("--size: bench measures a disk of at least " + HumanBytes(pipeline::kMinBenchDiskBytes) +
                       " (smaller ones finish within a few chunks: the table would show timer noise), not " +
                       HumanBytesExact(*size));
    }
    size_bytes = *size;
  } else if (size_option_given(a)) {
    return out.Usage("--size sizes the generated disk; it does not apply with --source");
  }

  // Everything the run writes lives in one new folder under the workdir.
  Env& env = Env::Default();
  auto made = MakeScratchFolder(env, a.workdir);
  if (!made.ok()) return out.Fail(made.error());
  const std::string dir = *made;
  // Removes the scratch folder (keeping a generated disk with --keep).
  auto remove_scratch = [&](bool keep_disk, const std::string& disk) -> Status {
    if (!keep_disk) return env.RemoveTree(dir);
    BARGE_ASSIGN_OR_RETURN(std::vector<std::string> names, env.ListDir(dir));
    for (const std::string& name : names) {
      if (JoinPath(dir, name) != disk) BARGE_RETURN_IF_ERROR(env.RemoveTree(JoinPath(dir, name)));
    }
    return OkStatus();
  };
  std::string source = a.source;
  std::optional<pipeline::DiskMix> mix;
  bool keep_dir = false;
  if (source.empty()) {
    source = JoinPath(dir, "disk.raw");
    pipeline::DiskGeneratorOptions g;
    g.size_bytes = size_bytes;
    g.seed = a.seed;
    g.cancel = &CancelFlag();
    Log("generating " + HumanBytes(size_bytes) + " disk (seed " + std::to_string(a.seed) + ")");
    auto m = pipeline::GenerateDisk(env, source, g);
    if (!m.ok()) return out.Fail(std::move(m).error().Also(remove_scratch(false, "")));
    mix = *m;
    keep_dir = a.keep;
  }

  pipeline::BenchOptions o;
  o.source = source;
  o.workdir = dir;
  o.cluster_bytes = copy.cluster_bytes;
  o.chunk_bytes = static_cast<uint32_t>(*chunk);
  o.memory_bytes = copy.memory_bytes;
  o.threads = copy.threads;
  o.compression = compression.type;
  o.compression_level = compression.level;
  o.cold = a.cold;
  o.cancel = &CancelFlag();
  auto report = pipeline::RunBench(env, o, out.json() ? nullptr : Log);
  Status removed = remove_scratch(keep_dir, source);
  if (!report.ok()) return out.Fail(std::move(report).error().Also(removed));
  if (!removed.ok()) out.Warning("bench scratch folder not removed: " + removed.error().ToString(), dir);
  const pipeline::BenchReport& r = *report;

  // Derived numbers: logical MiB/s (virtual size / wall time), the slowest
  // stage, the machine's limits.
  const double logical = MiB(r.logical_bytes);
  const pipeline::BenchMeasure* slowest = nullptr;
  double cpu_sum_wall = 0;  // CPU stages share the same cores
  double zstd_per_core = 0, read_mibs = 0;
  double stages_cpu = 0;     // CPU seconds of the backup-path stages alone
  for (const auto& m : r.stages) {
    if (!m.in_backup_path) continue;
    stages_cpu += m.user_seconds + m.system_seconds;
    if (slowest == nullptr || m.wall_seconds > slowest->wall_seconds) slowest = &m;
    if (m.name != "read" && m.name != "qcow2-write") cpu_sum_wall += m.wall_seconds;
    if (m.name == "compress") {
      double cpu = m.user_seconds + m.system_seconds;
      if (cpu > 0) zstd_per_core = MiB(m.input_bytes) / cpu;
    }
    if (m.name == "read" && m.wall_seconds > 0) read_mibs = MiB(m.input_bytes) / m.wall_seconds;
  }
  const auto& e = r.end_to_end;
  const double e2e_logical = e.wall_seconds > 0 ? logical / e.wall_seconds : 0;
  const double slowest_logical = slowest && slowest->wall_seconds > 0 ? logical / slowest->wall_seconds : 0;
  const double ratio = slowest_logical > 0 ? e2e_logical / slowest_logical : 0;
  const double cpu_bound_logical = cpu_sum_wall > 0 ? logical / cpu_sum_wall : 0;
  const double e2e_cpu = e.user_seconds + e.system_seconds;
  const std::string cache = a.cold ? "cold (source pages dropped with POSIX_FADV_DONTNEED)" : "warm";

  json knobs = {{"threads", r.threads},
                {"memory", copy.memory_bytes},
                {"chunk_size", o.chunk_bytes},
                {"cluster_size", o.cluster_bytes},
                {"compress", compression.ToString()},
                {"cache", a.cold ? "cold" : "warm"},
                {"seed", a.seed},
                {"size", r.logical_bytes}};

  if (out.json()) {
    json stages = json::array();
    auto to_json = [&](const pipeline::BenchMeasure& m) {
      return json{{"name", m.name},
                  {"note", m.note},
                  {"input_bytes", m.input_bytes},
                  {"output_bytes", m.output_bytes},
                  {"wall_seconds", m.wall_seconds},
                  {"user_seconds", m.user_seconds},
                  {"system_seconds", m.system_seconds},
                  {"peak_rss_bytes", m.peak_rss_bytes},
                  {"threads", m.serial ? 1 : m.threads},
                  {"in_flight", m.in_flight},
                  {"input_mib_s", m.wall_seconds > 0 ? MiB(m.input_bytes) / m.wall_seconds : 0},
                  {"logical_mib_s", m.wall_seconds > 0 ? logical / m.wall_seconds : 0},
                  {"in_backup_path", m.in_backup_path}};
    };
    for (const auto& m : r.stages) stages.push_back(to_json(m));
    json result = {{"machine", MachineJson(a.workdir, r.threads)},
                {"knobs", knobs},
                {"source", a.source.empty() ? json("generated") : json(a.source)},
                {"stages", stages},
                {"end_to_end", to_json(e)},
                {"pool", {{"chunks", r.pool_chunks}, {"bytes", r.pool_bytes}}},
                {"clusters",
                 {{"data", r.data_clusters}, {"compressed", r.compressed_clusters}, {"zero", r.zero_clusters},
                  {"hole", r.hole_clusters}}},
                {"limits",
                 {{"read_mib_s", read_mibs},
                  {"compress_mib_s_per_core", zstd_per_core},
                  {"compress_mib_s_all_cores", zstd_per_core * r.threads}}},
                {"slowest_stage", slowest ? slowest->name : ""},
                {"slowest_stage_logical_mib_s", slowest_logical},
                {"cpu_stages_sum_logical_mib_s", cpu_bound_logical},
                {"end_to_end_logical_mib_s", e2e_logical},
                {"ratio_end_to_end_over_slowest", ratio},
                {"backup_path_stages_cpu_seconds", stages_cpu},
                {"end_to_end_cpu_seconds", e2e_cpu},
                {"target_ratio", 0.8}};
    if (mix) result["disk"] = MixJson(*mix);
    if (keep_dir) result["kept"] = source;
    out.Result(result);
    return kExitOk;
  }

  json machine = MachineJson(a.workdir, r.threads);
  t << Format("machine: %s, %d threads, %s, %s on %s\n", machine["cpu"].get<std::string>().c_str(), r.threads,
              machine["kernel"].get<std::string>().c_str(), machine["filesystem"].get<std::string>().c_str(),
              a.workdir.c_str());
  t << Format("knobs: --threads %d --memory %s --chunk-size %s --cluster-size %s --compress %s --seed %llu "
              "--size %s, cache %s\n",
              r.threads, HumanBytes(copy.memory_bytes).c_str(), HumanBytes(o.chunk_bytes).c_str(),
              HumanBytes(o.cluster_bytes).c_str(), compression.ToString().c_str(),
              static_cast<unsigned long long>(a.seed), HumanBytes(r.logical_bytes).c_str(), cache.c_str());
  if (mix) PrintMix(t, *mix, keep_dir ? source : "generated (deleted)");
  else t << Format("disk: %s, %s\n", source.c_str(), HumanBytes(r.logical_bytes).c_str());
  t << Format("\n%-12s %7s %9s %11s %10s %12s %8s %8s %10s\n", "stage", "threads", "in-flight", "input",
              "MiB/s in", "MiB/s logic", "wall s", "cpu s", "peak RSS");
  auto row = [&](const pipeline::BenchMeasure& m) {
    std::string name = m.name + (m.in_backup_path ? "" : "*");
    t << Format("%-12s %7d %9llu %11s %10.1f %12.1f %8.2f %8.2f %10s\n", name.c_str(), m.serial ? 1 : m.threads,
                static_cast<unsigned long long>(m.in_flight), HumanBytes(m.input_bytes).c_str(),
                m.wall_seconds > 0 ? MiB(m.input_bytes) / m.wall_seconds : 0.0,
                m.wall_seconds > 0 ? logical / m.wall_seconds : 0.0, m.wall_seconds,
                m.user_seconds + m.system_seconds, HumanBytes(m.peak_rss_bytes).c_str());
  };
  for (const auto& m : r.stages) row(m);
  row(e);
  t << Format("\n");
  for (const auto& m : r.stages) t << Format("  %-12s %s\n", m.name.c_str(), m.note.c_str());
  t << Format("  %-12s %s\n", e.name.c_str(), e.note.c_str());
  t << Format("  (* not on the backup path: replication streams SHA-512)\n");
  t << Format("\nend-to-end: read %s, wrote %s (%llu data, %llu compressed, %llu zero, %llu hole clusters), "
              "pool %llu chunks (%s), at most %llu in flight\n",
              HumanBytes(r.allocated_bytes).c_str(), HumanBytes(e.output_bytes).c_str(),
              static_cast<unsigned long long>(r.data_clusters), static_cast<unsigned long long>(r.compressed_clusters),
              static_cast<unsigned long long>(r.zero_clusters), static_cast<unsigned long long>(r.hole_clusters),
              static_cast<unsigned long long>(r.pool_chunks), HumanBytes(r.pool_bytes).c_str(),
              static_cast<unsigned long long>(e.in_flight));
  t << Format("limits: read %.1f MiB/s (allocated bytes); %s %.1f MiB/s per core x %d = %.1f MiB/s\n", read_mibs,
              compression.ToString().c_str(), zstd_per_core, r.threads, zstd_per_core * r.threads);
  t << Format("slowest backup-path stage: %s at %.1f MiB/s logical; zero+xxh3+compress together on the same "
              "cores %.1f MiB/s logical (sha512 is not on the backup path)\n",
              slowest ? slowest->name.c_str() : "-", slowest_logical, cpu_bound_logical);
  t << Format("cpu: backup-path stages alone %s, end-to-end %s (pipeline overhead %+.0f%%)\n",
              HumanSeconds(stages_cpu).c_str(), HumanSeconds(e2e_cpu).c_str(),
              stages_cpu > 0 ? 100.0 * (e2e_cpu - stages_cpu) / stages_cpu : 0.0);
  t << Format("end-to-end: %.1f MiB/s logical = %.2f x slowest stage (target >= 0.80: %s)\n", e2e_logical, ratio,
              ratio >= 0.8 ? "met" : "missed");
  if (keep_dir) t << Format("kept: %s\n", source.c_str());
  return kExitOk;
}

}  // namespace

void RegisterBenchCommand(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<BenchArgs>();
  auto gen = std::make_shared<GenerateArgs>();
  auto generate_cmd = std::make_shared<CLI::App*>(nullptr);
  auto* cmd = AddCommand(app, "bench", "Measure each pipeline stage and the whole pipeline on one disk", exit_code,
                         [args, generate_cmd, &exit_code](Output& out) {
                           // `bench generate` ran instead (its own callback,
                           // which set the exit code: keep it).
                           if (*generate_cmd != nullptr && (*generate_cmd)->parsed()) return exit_code;
                           return RunBenchCommand(*args, out);
                         });
  cmd->require_subcommand(0, 1);
  args->size_option = cmd->add_option("--size", args->size,
                                      "Size of the generated disk (without --source; at least 64M, a multiple of 4K)")
                          ->capture_default_str();
  cmd->add_option("--seed", args->seed, "Seed of the generated disk")->capture_default_str();
  cmd->add_option("--source", args->source, "Raw disk file to measure instead of a generated one");
  cmd->add_option("--workdir", args->workdir, "Folder for the temporary folder (disk and outputs)")
      ->capture_default_str();
  cmd->add_option("--chunk-size", args->chunk_size, "Pipeline chunk (largest read)")->capture_default_str();
  args->copy.AddTo(cmd, DefaultCompression());
  cmd->add_flag("--cold", args->cold, "Drop the source's cached pages before the read and end-to-end runs");
  cmd->add_flag("--keep", args->keep, "Keep the generated disk (its path is printed)");

  auto* g = AddCommand(*cmd, "generate", "Write the deterministic VM-like test disk (sparse raw) to OUT", exit_code,
                       [gen](Output& out) { return RunGenerate(*gen, out); });
  *generate_cmd = g;
  g->add_option("--size", gen->size, "Virtual size (at least 1M, a multiple of 4K)")->capture_default_str();
  g->add_option("--seed", gen->seed, "Seed: the same size and seed give the same bytes")->capture_default_str();
  g->add_option("out", gen->out, "Output file (created or replaced)")->required();

}

}  // namespace barge::cli
