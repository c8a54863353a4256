// barge bench: every pipeline stage alone on the same (generated or given)
// disk, then the whole backup-like pipeline, with the knobs printed next to
// the numbers. `barge bench generate` writes the deterministic test disk so
// scripts can give peers the exact same data.
#include <cstdio>
#include <cstdlib>
#include <iostream>

#include "blockio/path.h"
#include "cli/common.h"
#include "cli/copy_flags.h"
#include "cli/interrupt.h"
#include "orchestrate/report/status_html.h"
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
  std::string svg;  // --svg FILE: the stages' throughput as a bar chart
};

struct GenerateArgs {
  std::string size = "4G";
  uint64_t seed = 1;
  std::string out;
};

bool size_option_given(const BenchArgs& a) { return a.size_option != nullptr && a.size_option->count() > 0; }

double MiB(uint64_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); }

json MachineJson(const pipeline::BenchMachine& m, const std::string& workdir, int threads) {
  return {{"cpu", m.cpu}, {"cores", threads}, {"kernel", m.kernel}, {"workdir", workdir}, {"filesystem", m.filesystem}};
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

// The flags' bench request, and the compression as given (for the knobs).
struct BenchPlan {
  pipeline::BenchRequest request;
  formats::CompressionSpec compression;
};

// Fills the bench request from the flags; an error is a usage error (its
// message is the one to print).
Result<BenchPlan> PlanOf(const BenchArgs& a) {
  BenchPlan plan;
  pipeline::CopyOptions copy;
  BARGE_RETURN_IF_ERROR(a.copy.Apply(copy, plan.compression));
  auto chunk = ParseSize(a.chunk_size);
  if (!chunk.ok()) return Error::InvalidArgument("--chunk-size: " + chunk.error().message());
  if (*chunk < copy.cluster_bytes || *chunk % copy.cluster_bytes != 0 || *chunk > (64u << 20)) {
    return Error::InvalidArgument("--chunk-size must be a multiple of the cluster size, at most 64M");
  }
  pipeline::BenchRequest& q = plan.request;
  if (a.source.empty()) {
    auto size = ParseSize(a.size);
    if (!size.ok()) return Error::InvalidArgument("--size: " + size.error().message());
    if (Status s = pipeline::CheckGeneratedDiskSize(*size); !s.ok()) {
      return Error::InvalidArgument("--size: " + s.error().message());
    }
    if (*size < pipeline::kMinBenchDiskBytes) {
      return Error::InvalidArgument("--size: bench measures a disk of at least " +
                                    HumanBytes(pipeline::kMinBenchDiskBytes) +
                                    " (smaller ones finish within a few chunks: the table would show timer "
                                    "noise), not " +
                                    HumanBytesExact(*size));
    }
    q.size_bytes = *size;
  } else if (size_option_given(a)) {
    return Error::InvalidArgument("--size sizes the generated disk; it does not apply with --source");
  }
  q.source = a.source;
  q.seed = a.seed;
  q.workdir = a.workdir;
  q.keep = a.keep;
  q.options.cluster_bytes = copy.cluster_bytes;
  q.options.chunk_bytes = static_cast<uint32_t>(*chunk);
  q.options.memory_bytes = copy.memory_bytes;
  q.options.threads = copy.threads;
  q.options.compression = plan.compression.type;
  q.options.compression_level = plan.compression.level;
  q.options.cold = a.cold;
  q.options.cancel = &CancelFlag();
  return plan;
}

json MeasureJson(const pipeline::BenchMeasure& m, double logical) {
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
}

json BenchJson(const BenchArgs& a, const BenchPlan& plan, const pipeline::BenchRun& run) {
  const pipeline::BenchReport& r = run.report;
  const pipeline::BenchSummary& s = run.summary;
  const pipeline::BenchOptions& o = plan.request.options;
  json knobs = {{"threads", r.threads},
                {"memory", o.memory_bytes},
                {"chunk_size", o.chunk_bytes},
                {"cluster_size", o.cluster_bytes},
                {"compress", plan.compression.ToString()},
                {"cache", a.cold ? "cold" : "warm"},
                {"seed", a.seed},
                {"size", r.logical_bytes}};
  json stages = json::array();
  for (const auto& m : r.stages) stages.push_back(MeasureJson(m, s.logical_mib));
  json result = {{"machine", MachineJson(pipeline::DescribeMachine(Env::Default(), a.workdir), a.workdir, r.threads)},
                 {"knobs", knobs},
                 {"source", a.source.empty() ? json("generated") : json(a.source)},
                 {"stages", stages},
                 {"end_to_end", MeasureJson(r.end_to_end, s.logical_mib)},
                 {"pool", {{"chunks", r.pool_chunks}, {"bytes", r.pool_bytes}}},
                 {"clusters",
                  {{"data", r.data_clusters}, {"compressed", r.compressed_clusters}, {"zero", r.zero_clusters},
                   {"hole", r.hole_clusters}}},
                 {"limits",
                  {{"read_mib_s", s.read_mib_s},
                   {"compress_mib_s_per_core", s.compress_mib_s_per_core},
                   {"compress_mib_s_all_cores", s.compress_mib_s_per_core * r.threads}}},
                 {"slowest_stage", s.slowest_stage},
                 {"slowest_stage_logical_mib_s", s.slowest_logical_mib_s},
                 {"cpu_stages_sum_logical_mib_s", s.cpu_stages_sum_logical_mib_s},
                 {"end_to_end_logical_mib_s", s.end_to_end_logical_mib_s},
                 {"ratio_end_to_end_over_slowest", s.ratio},
                 {"cpu_ceiling_ratio", s.cpu_ceiling_ratio},
                 {"backup_path_stages_cpu_seconds", s.stages_cpu_seconds},
                 {"end_to_end_cpu_seconds", s.end_to_end_cpu_seconds},
                 {"target_ratio", 0.8}};
  if (run.mix) result["disk"] = MixJson(*run.mix);
  if (run.kept) result["kept"] = run.source;
  return result;
}

void PrintBench(std::ostream& t, const BenchArgs& a, const BenchPlan& plan, const pipeline::BenchRun& run) {
  const pipeline::BenchReport& r = run.report;
  const pipeline::BenchSummary& s = run.summary;
  const pipeline::BenchOptions& o = plan.request.options;
  const auto& e = r.end_to_end;
  const double logical = s.logical_mib;
  const std::string cache = a.cold ? "cold (source pages dropped with POSIX_FADV_DONTNEED)" : "warm";
  pipeline::BenchMachine machine = pipeline::DescribeMachine(Env::Default(), a.workdir);
  t << Format("machine: %s, %d threads, %s, %s on %s\n", machine.cpu.c_str(), r.threads, machine.kernel.c_str(),
              machine.filesystem.c_str(), a.workdir.c_str());
  t << Format("knobs: --threads %d --memory %s --chunk-size %s --cluster-size %s --compress %s --seed %llu "
              "--size %s, cache %s\n",
              r.threads, HumanBytes(o.memory_bytes).c_str(), HumanBytes(o.chunk_bytes).c_str(),
              HumanBytes(o.cluster_bytes).c_str(), plan.compression.ToString().c_str(),
              static_cast<unsigned long long>(a.seed), HumanBytes(r.logical_bytes).c_str(), cache.c_str());
  if (run.mix) PrintMix(t, *run.mix, run.kept ? run.source : "generated (deleted)");
  else t << Format("disk: %s, %s\n", run.source.c_str(), HumanBytes(r.logical_bytes).c_str());
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
  t << Format("limits: read %.1f MiB/s (allocated bytes); %s %.1f MiB/s per core x %d = %.1f MiB/s\n", s.read_mib_s,
              plan.compression.ToString().c_str(), s.compress_mib_s_per_core, r.threads,
              s.compress_mib_s_per_core * r.threads);
  t << Format("slowest backup-path stage: %s at %.1f MiB/s logical; zero+xxh3+compress together on the same "
              "cores %.1f MiB/s logical (sha512 is not on the backup path)\n",
              s.slowest_stage.empty() ? "-" : s.slowest_stage.c_str(), s.slowest_logical_mib_s,
              s.cpu_stages_sum_logical_mib_s);
  t << Format("cpu: backup-path stages alone %s, end-to-end %s (pipeline overhead %+.0f%%)\n",
              HumanSeconds(s.stages_cpu_seconds).c_str(), HumanSeconds(s.end_to_end_cpu_seconds).c_str(),
              s.stages_cpu_seconds > 0
                  ? 100.0 * (s.end_to_end_cpu_seconds - s.stages_cpu_seconds) / s.stages_cpu_seconds
                  : 0.0);
  t << Format("end-to-end: %.1f MiB/s logical = %.2f x slowest stage (target >= 0.80: %s)\n",
              s.end_to_end_logical_mib_s, s.ratio, s.ratio >= 0.8 ? "met" : "missed");
  if (s.cpu_ceiling_ratio > 0) {
    t << Format("ceiling on %d cores: %.2f x slowest stage (the backup-path stages' %s of CPU cannot take less "
                "than %s on %d cores); end-to-end reached %.0f%% of it\n",
                r.threads, s.cpu_ceiling_ratio, HumanSeconds(s.stages_cpu_seconds).c_str(),
                HumanSeconds(s.stages_cpu_seconds / r.threads).c_str(), r.threads,
                100.0 * s.ratio / s.cpu_ceiling_ratio);
  }
  if (run.kept) t << Format("kept: %s\n", run.source.c_str());
}

// The table's "MiB/s logic" column (each stage and end-to-end) as an SVG
// bar chart: logical MiB over wall seconds, as the table computes it.
std::string BenchSvg(const pipeline::BenchRun& run) {
  std::vector<std::pair<std::string, double>> bars;
  auto add = [&](const pipeline::BenchMeasure& m) {
    bars.emplace_back(m.name + (m.in_backup_path ? "" : "*"),
                      m.wall_seconds > 0 ? run.summary.logical_mib / m.wall_seconds : 0.0);
  };
  for (const auto& m : run.report.stages) add(m);
  add(run.report.end_to_end);
  return orchestrate::SvgBarChart("barge bench: logical MiB/s per stage (" + std::to_string(run.report.threads) +
                                      " threads; * not on the backup path)",
                                  bars, "MiB/s");
}

// The cli fills a request from the flags; pipeline::RunBenchRequest runs it.
int RunBenchCommand(const BenchArgs& a, Output& out) {
  auto plan = PlanOf(a);
  if (!plan.ok()) return out.Usage(plan.error().message());
  if (!a.svg.empty()) {
    // The chart's folder is checked before the minutes of measuring.
    const size_t slash = a.svg.rfind('/');
    const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : a.svg.substr(0, slash);
    auto st = Env::Default().Stat(dir);
    if (!st.ok()) {
      Error e = st.error();
      return out.Fail(e.Wrap("--svg: the chart's folder"));
    }
  }
  plan->request.generate_log = Log;
  plan->request.stage_log = out.json() ? nullptr : Log;
  auto run = pipeline::RunBenchRequest(Env::Default(), plan->request);
  if (!run.ok()) return out.Fail(run.error());
  if (run->not_removed) out.Warning("bench scratch folder not removed: " + run->not_removed->ToString(), run->scratch);
  // The results are printed first: a chart that cannot be written loses
  // no measurement.
  if (out.json()) {
    out.Result(BenchJson(a, *plan, *run));
  } else {
    PrintBench(out.text(), a, *plan, *run);
  }
  if (!a.svg.empty()) {
    if (Status s = Env::Default().WriteFileAtomic(a.svg, BenchSvg(*run)); !s.ok()) return out.Fail(s.error());
  }
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
  cmd->add_option("--svg", args->svg, "Also draw the stages' throughput (MiB/s logical) as an SVG bar chart there");

  auto* g = AddCommand(*cmd, "generate", "Write the deterministic VM-like test disk (sparse raw) to OUT", exit_code,
                       [gen](Output& out) { return RunGenerate(*gen, out); });
  *generate_cmd = g;
  g->add_option("--size", gen->size, "Virtual size (at least 1M, a multiple of 4K)")->capture_default_str();
  g->add_option("--seed", gen->seed, "Seed: the same size and seed give the same bytes")->capture_default_str();
  g->add_option("out", gen->out, "Output file (created or replaced)")->required();

}

}  // namespace barge::cli
