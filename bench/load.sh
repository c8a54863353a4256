# --background-load N for the remote benches (sourced after lib.sh): N
# busy loops (one shell each, spinning) run during both tools' runs of a
# loaded pass, started before and killed by PID after each measurement, so
# the figures show what a host already busy with other work gets. The
# quiet pass runs first, then the loaded one; labels of the loaded pass end
# in "-loadN".

BACKGROUND_LOAD=${BACKGROUND_LOAD:-0}
LOAD_PIDS=()

# take_load_flag "$@": sets BACKGROUND_LOAD from --background-load N and
# leaves the other arguments in ARGS (for parse_common_flags "${ARGS[@]}").
take_load_flag() {
  ARGS=()
  while [ $# -gt 0 ]; do
    case "$1" in
      --background-load) BACKGROUND_LOAD=$2; shift 2 ;;
      *) ARGS+=("$1"); shift ;;
    esac
  done
  [[ "$BACKGROUND_LOAD" =~ ^[0-9]+$ ]] || die "--background-load must be a whole number >= 0"
}

# The passes to run: "0" (quiet), then N when --background-load N was given.
load_levels() {
  if [ "$BACKGROUND_LOAD" -gt 0 ]; then echo "0 $BACKGROUND_LOAD"; else echo 0; fi
}

# load_suffix LEVEL: "" for the quiet pass, "-loadN" for a loaded one.
load_suffix() { if [ "$1" -gt 0 ]; then echo "-load$1"; fi; }

# start_load LEVEL: starts LEVEL busy loops (none for 0).
start_load() {
  local i
  for ((i = 0; i < $1; i++)); do
    sh -c 'while :; do :; done' &
    LOAD_PIDS+=($!)
  done
}

# stop_load: kills the busy loops by PID and waits for them. Safe to call
# again (the exit trap calls it too).
stop_load() {
  local pid
  for pid in "${LOAD_PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${LOAD_PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  LOAD_PIDS=()
}
