#!/usr/bin/env bash
# barge over NBD from another "host": a generated disk served by qemu-nbd
# inside a network namespace reached through a veth pair, once in plaintext
# and once with TLS (x509, client certificates verified, made here with
# certtool), backed up by barge in the same run; medians of --repeat runs
# and the ratio TLS / plaintext (target: TLS costs <= 15%). Also a raw
# `barge convert` of the same export, where nothing else hides the cost,
# `nbdcopy --connections 4` over both as the peer's cost of the same TLS,
# the peer's remote full backup over TLS (`nbdcopy --connections 4` to a
# local raw file, then `qemu-img convert -c` to a zstd qcow2; target:
# barge >= 1.5x faster), and the CPU seconds the server (qemu-nbd) spent
# per run: on one machine the server's encryption shares the client's cores.
# barge uses its default connections (4 in plaintext, over TLS one per core
# up to 4); nbdcopy caps its --connections 4 at its threads (the cores).
# --size 4G for the issue's numbers (1G by default, quicker).
# --background-load N: a second pass with N busy loops running during
# every tool's runs (bench/load.sh), its figures and ratios labelled -loadN.
# Needs root (ip netns). Removes its namespace, veth pair, servers, busy
# loops and data.
#
#   bench/nbd_tls.sh [--size 1G] [--seed 1] [--workdir /var/tmp]
#                    [--barge PATH] [--repeat 3] [--cache warm]
#                    [--background-load N]
CACHE=${CACHE:-warm}
REPEAT=${REPEAT:-3}
SIZE=${SIZE:-1G}
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/load.sh"

usage() { sed -n '2,21p' "$0"; }

take_load_flag "$@"
parse_common_flags "${ARGS[@]}"
need_tools qemu-nbd qemu-img certtool ip numfmt nbdcopy nbdinfo
[ "$(id -u)" = 0 ] || die "needs root (ip netns)"
make_workdir

NS=barge-tls-$$
VETH_HOST=btls$$h
VETH_NS=btls$$n
HOST_IP=10.231.$(( $$ % 250 )).1
NS_IP=10.231.$(( $$ % 250 )).2
PIDS=()
cleanup() {
  stop_load
  local pid
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
  done
  ip link del "$VETH_HOST" 2>/dev/null || true
  ip netns del "$NS" 2>/dev/null || true
  if [ "${BARGE_BENCH_KEEP:-0}" = 1 ]; then echo "kept $WORK" >&2; else rm -rf "$WORK"; fi
}
trap cleanup EXIT

print_machine

echo
echo "== network: namespace $NS, veth $VETH_HOST ($HOST_IP) <-> $VETH_NS ($NS_IP)"
ip netns add "$NS"
ip link add "$VETH_HOST" type veth peer name "$VETH_NS"
ip link set "$VETH_NS" netns "$NS"
ip addr add "$HOST_IP/30" dev "$VETH_HOST"
ip link set "$VETH_HOST" up
ip netns exec "$NS" ip addr add "$NS_IP/30" dev "$VETH_NS"
ip netns exec "$NS" ip link set "$VETH_NS" up
ip netns exec "$NS" ip link set lo up

echo
echo "== certificates (certtool: CA, server for $NS_IP, client)"
PKI=$WORK/pki
mkdir -p "$PKI/server" "$PKI/client"
(
  cd "$PKI"
  printf 'cn = bench CA\nca\ncert_signing_key\nexpiration_days = 2\n' > ca.info
  printf 'cn = %s\nip_address = %s\ntls_www_server\nsigning_key\nencryption_key\nexpiration_days = 2\n' \
    "$NS_IP" "$NS_IP" > server.info
  printf 'cn = client\ntls_www_client\nsigning_key\nencryption_key\nexpiration_days = 2\n' > client.info
  certtool -q --generate-privkey --outfile ca-key.pem 2>/dev/null
  certtool -q --generate-self-signed --load-privkey ca-key.pem --template ca.info --outfile ca-cert.pem 2>/dev/null
  for who in server client; do
    certtool -q --generate-privkey --outfile "$who/$who-key.pem" 2>/dev/null
    certtool -q --generate-certificate --load-privkey "$who/$who-key.pem" --load-ca-certificate ca-cert.pem \
      --load-ca-privkey ca-key.pem --template "$who.info" --outfile "$who/$who-cert.pem" 2>/dev/null
    cp ca-cert.pem "$who/"
    chmod 600 "$who/$who-key.pem"
  done
) > /dev/null

DISK=$WORK/disk.raw
echo
echo "== disk"
"$BARGE" bench generate --size "$SIZE" --seed "$SEED" "$DISK"
echo "allocated: $(du -B1 "$DISK" | cut -f1) bytes of $(stat -c %s "$DISK")"

# Both servers read the same file, read-only, 4 clients each (multi-conn).
ip netns exec "$NS" qemu-nbd -t -r --shared=4 -f raw -b "$NS_IP" -p 10809 "$DISK" &
PIDS+=($!)
ip netns exec "$NS" qemu-nbd -t -r --shared=4 -f raw -b "$NS_IP" -p 10810 \
  --object "tls-creds-x509,id=t0,endpoint=server,dir=$PKI/server,verify-peer=on" --tls-creds t0 "$DISK" &
PIDS+=($!)
PLAIN_PID=${PIDS[0]}
TLS_PID=${PIDS[1]}
PLAIN="nbd://$NS_IP:10809/"
TLS="nbds://$NS_IP:10810/?tls-certificates=$PKI/client"
for _ in $(seq 100); do
  if nbdinfo --size "$PLAIN" >/dev/null 2>&1 && nbdinfo --size "$TLS" >/dev/null 2>&1; then
    break
  fi
  sleep 0.1
done
echo "servers: plaintext $PLAIN, TLS nbds://$NS_IP:10810/ (x509, verify-peer=on)"

# server_ticks PID: CPU time (user + system, clock ticks) of a server so far.
server_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
SERVER_CPU=$WORK/server_cpu.tsv
: > "$SERVER_CPU"
# measure_served LABEL KIND CMD...: measure, plus the CPU seconds the
# server of KIND (plain or tls) spent meanwhile, into $SERVER_CPU.
measure_served() {
  local label=$1 kind=$2 output=$3
  shift 3
  local pid=$PLAIN_PID
  [ "$kind" = tls ] && pid=$TLS_PID
  local before after
  before=$(server_ticks "$pid")
  measure "$label" "$mode" "$output" -- "$@"
  after=$(server_ticks "$pid")
  awk -v l="$label" -v t=$((after - before)) -v hz="$(getconf CLK_TCK)" \
    'BEGIN { printf "%s\t%.2f\n", l, t / hz }' >> "$SERVER_CPU"
}
# server_cpu LABEL: the median server CPU seconds of LABEL's runs.
server_cpu() {
  awk -F'\t' -v l="$1" '$1 == l { print $2 }' "$SERVER_CPU" | sort -g |
    awk '{ v[NR] = $1 } END { if (NR) print v[int((NR + 1) / 2)] }'
}

echo
echo "== runs"
for load in $(load_levels); do
sfx=$(load_suffix "$load")
for mode in $(cache_modes); do
for run in $(runs); do
  echo " [$mode, run $run of $REPEAT, $load busy loops]"
  start_load "$load"
  # Plaintext and TLS take turns within each run.
  for kind in plain tls; do
    uri=$PLAIN; [ "$kind" = tls ] && uri=$TLS
    rm -rf "$WORK"/out*
    prepare_cache "$mode" "$DISK"
    measure_served "backup-$kind$sfx" "$kind" "$WORK/out-b" \
      "$BARGE" backup --source "$uri" --target "$WORK/out-b" --name disk
  done
  for kind in plain tls; do
    uri=$PLAIN; [ "$kind" = tls ] && uri=$TLS
    rm -rf "$WORK"/out*
    prepare_cache "$mode" "$DISK"
    measure_served "convert-raw-$kind$sfx" "$kind" "$WORK/out-c.raw" \
      "$BARGE" convert "$uri" "$WORK/out-c.raw" --no-sync
    rm -rf "$WORK"/out*
    prepare_cache "$mode" "$DISK"
    measure_served "nbdcopy-raw-$kind$sfx" "$kind" "$WORK/out-n.raw" \
      nbdcopy --connections 4 "$uri" "$WORK/out-n.raw"
  done
  # The peer's remote full backup over TLS: pull the export raw, then
  # compress it into a zstd qcow2 (the staging file is removed after).
  rm -rf "$WORK"/out*
  prepare_cache "$mode" "$DISK"
  measure_served "peer-backup-tls$sfx" tls "$WORK/out-p.qcow2" \
    sh -c 'nbdcopy --connections 4 "$1" "$2" && qemu-img convert -f raw -O qcow2 -c -o compression_type=zstd -W -m 16 "$2" "$3"' \
    sh "$TLS" "$WORK/out-p.raw" "$WORK/out-p.qcow2"
  rm -f "$WORK/out-p.raw"
  rm -rf "$WORK"/out*
  stop_load
done
done
done

print_results

echo
echo "== ratios and targets"
for load in $(load_levels); do
sfx=$(load_suffix "$load")
for mode in $(cache_modes); do
  bp=$(get backup-plain$sfx "$mode" wall); bt=$(get backup-tls$sfx "$mode" wall)
  cp_=$(get convert-raw-plain$sfx "$mode" wall); ct=$(get convert-raw-tls$sfx "$mode" wall)
  np=$(get nbdcopy-raw-plain$sfx "$mode" wall); nt=$(get nbdcopy-raw-tls$sfx "$mode" wall)
  cost=$(awk -v t="$bt" -v p="$bp" 'BEGIN { if (p + 0 == 0) print "-"; else printf "%.1f", (t / p - 1) * 100 }')
  ccost=$(awk -v t="$ct" -v p="$cp_" 'BEGIN { if (p + 0 == 0) print "-"; else printf "%.1f", (t / p - 1) * 100 }')
  echo "[$mode, $load busy loops]"
  echo "  barge backup over TLS / plaintext = $(ratio "$bt" "$bp") (TLS costs ${cost}%; target <= 15%:" \
       "$(verdict "$(ratio "$bt" "$bp")" '<=' 1.15))"
  echo "  raw convert over TLS / plaintext  = $(ratio "$ct" "$cp_") (TLS costs ${ccost}%)"
  echo "  peer: nbdcopy --connections 4 over TLS / plaintext = $(ratio "$nt" "$np")"
  echo "  raw convert over TLS / nbdcopy over TLS = $(ratio "$ct" "$nt") (target <= 1.05: $(verdict "$(ratio "$ct" "$nt")" '<=' 1.05))"
  echo "  raw convert in plaintext / nbdcopy in plaintext = $(ratio "$cp_" "$np") (target <= 1.0: $(verdict "$(ratio "$cp_" "$np")" '<=' 1.0))"
  pb=$(get peer-backup-tls$sfx "$mode" wall)
  echo "  remote full backup over TLS: nbdcopy + qemu-img convert -c zstd / barge backup = $(ratio "$pb" "$bt")" \
       "(target >= 1.5x: $(verdict "$(ratio "$pb" "$bt")" '>=' 1.5))"
  echo "  client cpu seconds: backup plain $(get backup-plain$sfx "$mode" cpu), tls $(get backup-tls$sfx "$mode" cpu);" \
       "convert plain $(get convert-raw-plain$sfx "$mode" cpu), tls $(get convert-raw-tls$sfx "$mode" cpu);" \
       "nbdcopy plain $(get nbdcopy-raw-plain$sfx "$mode" cpu), tls $(get nbdcopy-raw-tls$sfx "$mode" cpu)"
  echo "  server (qemu-nbd) cpu seconds: backup plain $(server_cpu backup-plain$sfx), tls $(server_cpu backup-tls$sfx);" \
       "convert plain $(server_cpu convert-raw-plain$sfx), tls $(server_cpu convert-raw-tls$sfx);" \
       "nbdcopy plain $(server_cpu nbdcopy-raw-plain$sfx), tls $(server_cpu nbdcopy-raw-tls$sfx);" \
       "peer backup tls $(server_cpu peer-backup-tls$sfx)"
done
done
