// systemd's readiness protocol (sd_notify(3)) without libsystemd: one
// datagram of "KEY=VALUE" lines to the AF_UNIX socket named by
// $NOTIFY_SOCKET (a path, or "@name" in the abstract namespace). `barge
// serve` sends READY=1, RELOADING=1, STOPPING=1 and STATUS= lines; a unit of
// Type=notify waits for READY=1.
#pragma once

#include <string>
#include <string_view>

#include "blockio/error.h"

namespace barge::cli {

// Sends `state` ("READY=1\nSTATUS=waiting") to $NOTIFY_SOCKET. Without that
// variable (not started by systemd) it does nothing and returns ok.
// Returns: an errno Error when the socket cannot be reached. Thread-safe.
Status SdNotify(std::string_view state);

// "RELOADING=1\nMONOTONIC_USEC=<now>" (systemd 253+ wants the timestamp;
// older ones ignore it).
std::string SdReloadingMessage();

}  // namespace barge::cli
