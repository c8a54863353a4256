// SIGINT and SIGTERM for every command. The first signal asks the running
// job to stop: CancelFlag() turns true, and the pipeline and the
// orchestration loops poll it; the job unwinds (its temporaries removed,
// its locks released) and the command exits 130 (SIGINT) or 143 (SIGTERM).
// A second signal, or a job still running when the grace period ends,
// removes every registered temporary (blockio/env.h TempRegistration) and
// exits at once with the same code.
#pragma once

#include <atomic>
#include <chrono>

namespace barge::cli {

// Installs the handlers and the watcher thread; idempotent.
void InstallInterruptHandling(std::chrono::seconds grace = std::chrono::seconds(30));

// True once SIGINT or SIGTERM arrived. Give its address to
// pipeline::CopyOptions::cancel and poll it in long loops.
const std::atomic<bool>& CancelFlag();

// The first signal that arrived (SIGINT or SIGTERM), 0 when none.
int InterruptSignal();

}  // namespace barge::cli
