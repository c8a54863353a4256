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
#include <cstdint>

namespace barge::cli {

// Installs the handlers and the watcher thread; idempotent.
void InstallInterruptHandling(std::chrono::seconds grace = std::chrono::seconds(30));

// std::terminate (an exception no one caught, on any thread; oneTBB's
// "pthread_create has failed" on a worker) reports the error like any
// other, removes registered temporaries and exits 1 (a thread that could
// not start) or 70 (anything else): never an abort. Call once, first.
void InstallTerminateHandler(int argc, char** argv);

// True once SIGINT or SIGTERM arrived. Give its address to
// pipeline::CopyOptions::cancel and poll it in long loops.
const std::atomic<bool>& CancelFlag();

// The first signal that arrived (SIGINT or SIGTERM), 0 when none.
int InterruptSignal();

// SIGHUP asks a daemon (barge serve) to reload its configuration: installs
// a handler that counts the signals (instead of SIGHUP's default, which
// ends the process); idempotent. Other commands keep the default.
void InstallReloadHandling();

// How many SIGHUPs arrived since InstallReloadHandling(). Poll it.
uint64_t ReloadRequests();

}  // namespace barge::cli
