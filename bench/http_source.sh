#!/usr/bin/env bash
# An image from a URL into the image catalog (issue 39): a generated disk
# as a qcow2 served over HTTPS by nginx on 127.0.0.1 (a certtool ECDSA
# certificate, as tests/testing/http_server.cc makes), then, taking turns
# in every run:
#   barge image add NAME --source https://...           (ranged GETs in place)
#   curl -o FILE https://... && barge image add --source FILE   (download first)
#   qemu-img convert -f qcow2 -O qcow2 -m 1 https://... OUT  (qemu's curl
#     driver; sslverify off: it has no option naming a CA file; -m 1: with
#     more coroutines, its default 8 included, qemu 7.2's curl driver hangs
#     now and then (seen with -m 4, 8 and 16), and -m 1 was its fastest here)
# each into fresh folders; targets: barge >= 1.3x the download-first way and
# >= 1.5x qemu-img. Then a download cut at --cut of the served bytes (barge
# killed by PID, SIGKILL, once nginx's access log shows that much sent,
# through a location rate-limited to --cut-rate per connection so the cut
# lands where asked) and the same command again: the bytes nginx served to
# the resumed run as a fraction of the file (target: <= 55%), and the
# resumed copy compared with the image (qemu-img compare). Served bytes are nginx's
# access log ($body_bytes_sent of each request). The page cache is warm
# (the served file is read once before each run).
#
#   bench/http_source.sh [--size 1G] [--long] [--seed 1] [--workdir /var/tmp]
#                        [--barge PATH] [--repeat 3] [--cut 0.5] [--cut-rate 16m]
#                        [--background-load N]
#
# --long: a 4 GiB disk (the issue's numbers); 1 GiB by default.
# --background-load N: a second pass with N busy loops (bench/load.sh).
# Needs nginx (nginx-light), certtool (gnutls-bin), curl, qemu-img with
# the curl block driver (qemu-block-extra). Stops nginx by PID
# and deletes its data on every exit path.
CACHE=warm
REPEAT=${REPEAT:-3}
SIZE=${SIZE:-1G}
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/load.sh"

usage() { sed -n '2,30p' "$0"; }

CUT=0.5
CUT_RATE=16m
take_load_flag "$@"
rest=()
set -- "${ARGS[@]+"${ARGS[@]}"}"
while [ $# -gt 0 ]; do
  case "$1" in
    --long) SIZE=4G; shift ;;
    --cut) CUT=$2; shift 2 ;;
    --cut-rate) CUT_RATE=$2; shift 2 ;;
    *) rest+=("$1"); shift ;;
  esac
done
parse_common_flags "${rest[@]+"${rest[@]}"}"
[ "$CACHE" = warm ] || die "--cache: only warm here (nginx serves from the page cache)"
need_tools nginx certtool curl qemu-img numfmt python3
[ -e /usr/lib/x86_64-linux-gnu/qemu/block-curl.so ] || ls /usr/lib/*/qemu/block-curl.so >/dev/null 2>&1 ||
  die "qemu-img has no curl block driver (Debian: qemu-block-extra)"
make_workdir

NGINX_PID=""
cleanup() {
  set +e
  stop_load
  if [ -n "$NGINX_PID" ]; then
    kill "$NGINX_PID" 2>/dev/null
    for _ in $(seq 50); do kill -0 "$NGINX_PID" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$NGINX_PID" 2>/dev/null
  fi
  if [ "${BARGE_BENCH_KEEP:-0}" = 1 ]; then echo "kept $WORK" >&2; else rm -rf "$WORK"; fi
}
trap cleanup EXIT

print_machine
echo "curl:       $(curl --version | head -1)"
echo "nginx:      $(nginx -v 2>&1)"

echo
echo "== disk"
WWW=$WORK/www
mkdir -p "$WWW/slow" "$WORK/nginx/tmp"
"$BARGE" bench generate --size "$SIZE" --seed "$SEED" "$WORK/disk.raw"
qemu-img convert -f raw -O qcow2 "$WORK/disk.raw" "$WWW/disk.qcow2"
rm -f "$WORK/disk.raw"
ln "$WWW/disk.qcow2" "$WWW/slow/disk.qcow2"
FILE_BYTES=$(stat -c %s "$WWW/disk.qcow2")
echo "qcow2:      $FILE_BYTES bytes ($(numfmt --to=iec-i --suffix=B "$FILE_BYTES"))"

echo
echo "== nginx over HTTPS on 127.0.0.1 (certtool ECDSA certificate)"
NG=$WORK/nginx
(
  cd "$NG" || exit 2
  printf 'cn = barge bench CA\nca\ncert_signing_key\nexpiration_days = 2\n' > ca.info
  printf 'organization = barge bench\ncn = 127.0.0.1\nip_address = 127.0.0.1\ntls_www_server\nsigning_key\nencryption_key\nexpiration_days = 2\n' > server.info
  key="certtool -q --generate-privkey --key-type=ecdsa --outfile"
  $key ca-key.pem 2>/dev/null
  certtool -q --generate-self-signed --load-privkey ca-key.pem --template ca.info --outfile ca-cert.pem 2>/dev/null
  $key server-key.pem 2>/dev/null
  certtool -q --generate-certificate --load-privkey server-key.pem --load-ca-certificate ca-cert.pem \
    --load-ca-privkey ca-key.pem --template server.info --outfile server-cert.pem 2>/dev/null
)
CA=$NG/ca-cert.pem
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
ACCESS=$NG/access.log
cat > "$NG/nginx.conf" <<EOF
daemon off;
master_process off;
worker_processes 1;
pid $NG/nginx.pid;
error_log $NG/error.log;
events { worker_connections 256; }
http {
  log_format bench '\$status \$body_bytes_sent "\$http_range"';
  access_log $ACCESS bench;
  client_body_temp_path $NG/tmp/body;
  proxy_temp_path $NG/tmp/proxy;
  fastcgi_temp_path $NG/tmp/fastcgi;
  uwsgi_temp_path $NG/tmp/uwsgi;
  scgi_temp_path $NG/tmp/scgi;
  default_type application/octet-stream;
  sendfile on;
  keepalive_requests 100000;
  server {
    listen 127.0.0.1:$PORT ssl;
    ssl_certificate $NG/server-cert.pem;
    ssl_certificate_key $NG/server-key.pem;
    root $WWW;
    location /slow/ { limit_rate $CUT_RATE; }
  }
}
EOF
[ "$(id -u)" = 0 ] && sed -i '1i user root;' "$NG/nginx.conf"
nginx -p "$NG" -c "$NG/nginx.conf" > "$NG/stdout.log" 2>&1 &
NGINX_PID=$!
URL=https://127.0.0.1:$PORT/disk.qcow2
for i in $(seq 100); do
  curl -s --cacert "$CA" -r 0-0 -o /dev/null "$URL" && break
  kill -0 "$NGINX_PID" 2>/dev/null || die "nginx exited: $(cat "$NG/error.log" "$NG/stdout.log")"
  [ "$i" -lt 100 ] || die "nginx not answering on $URL"
  sleep 0.1
done
echo "nginx:      pid $NGINX_PID, $URL (worker_processes 1; /slow/ limit_rate $CUT_RATE per connection)"

# served_since LINE: bytes nginx sent (bodies) in the access log's lines after LINE.
log_lines() { wc -l < "$ACCESS"; }
served_since() { awk -v from="$1" 'NR > from { s += $2 } END { printf "%.0f\n", s }' "$ACCESS"; }
SERVED=$WORK/served.tsv
: > "$SERVED"
# measure_served LABEL DIR -- CMD...: measure, plus the bytes nginx served meanwhile.
measure_served() {
  local label=$1 out=$2 mark
  mark=$(log_lines)
  # The output: every file written under it (a catalog copy has no .qcow2 name).
  MEASURE_WRITTEN_SINCE=0 measure "$label" warm "$out" "${@:3}"
  printf '%s\t%s\n' "$label" "$(served_since "$mark")" >> "$SERVED"
}
served_median() {
  awk -F'\t' -v l="$1" '$1 == l { print $2 }' "$SERVED" | sort -g |
    awk '{ v[NR] = $1 } END { if (NR) print v[int((NR + 1) / 2)] }'
}
# check_copy DISK WHO: the catalog's copy on DISK (its one file beside the
# .sha512.json record; a URL's copy is named without an extension) holds
# the served image's disk (qemu-img compare: barge writes its own qcow2, so
# the files' bytes differ).
check_copy() {
  local copy
  copy=$(find "$1" -maxdepth 1 -type f ! -name '*.sha512.json' ! -name '.*' | head -1)
  [ -n "$copy" ] || die "$2: no copy in $1"
  qemu-img compare -q "$WWW/disk.qcow2" "$copy" || die "$2: the copy $copy differs from the served image"
}

echo
echo "== runs (the three take turns; page cache warm)"
for load in $(load_levels); do
sfx=$(load_suffix "$load")
for run in $(runs); do
  echo " [run $run of $REPEAT, $load busy loops]"
  start_load "$load"
  rm -rf "$WORK"/out-*; mkdir -p "$WORK/out-a" "$WORK/out-b" "$WORK/out-q"
  warm_cache "$WWW/disk.qcow2"
  measure_served "barge-image-add-https$sfx" "$WORK/out-a/d" -- \
    "$BARGE" image add base --source "$URL" --ca-file "$CA" --disk "$WORK/out-a/d" --catalog "$WORK/out-a/catalog.db"
  check_copy "$WORK/out-a/d" "barge image add (https)"
  warm_cache "$WWW/disk.qcow2"
  measure_served "curl-then-image-add$sfx" "$WORK/out-b/d" -- sh -c \
    'curl -sS --fail --cacert "$1" -o "$2/disk.qcow2" "$3" &&
     "$4" image add base --source "$2/disk.qcow2" --disk "$2/d" --catalog "$2/catalog.db"' \
    sh "$CA" "$WORK/out-b" "$URL" "$BARGE"
  check_copy "$WORK/out-b/d" "curl + barge image add"
  warm_cache "$WWW/disk.qcow2"
  measure_served "qemu-img-convert-https$sfx" "$WORK/out-q" -- \
    qemu-img convert -f qcow2 -O qcow2 -m 1 \
    "json:{\"file\":{\"driver\":\"https\",\"url\":\"$URL\",\"sslverify\":false}}" "$WORK/out-q/disk.qcow2"
  qemu-img compare -q "$WWW/disk.qcow2" "$WORK/out-q/disk.qcow2" || die "qemu-img convert: the copy differs"
  stop_load
done
done
rm -rf "$WORK"/out-*

echo
echo "== a download cut at $CUT and resumed (/slow/: $CUT_RATE per connection)"
SLOW=https://127.0.0.1:$PORT/slow/disk.qcow2
R=$WORK/resume
mkdir -p "$R"
ADD=("$BARGE" image add base --source "$SLOW" --ca-file "$CA" --disk "$R/d" --catalog "$R/catalog.db")
CUT_AT=$(awk -v f="$FILE_BYTES" -v c="$CUT" 'BEGIN { printf "%.0f\n", f * c }')
mark=$(log_lines)
"${ADD[@]}" > "$R/first.log" 2>&1 &
pid=$!
while kill -0 "$pid" 2>/dev/null; do
  [ "$(served_since "$mark")" -ge "$CUT_AT" ] && break
  sleep 0.05
done
kill -9 "$pid" 2>/dev/null || die "barge finished before the cut ($(served_since "$mark") bytes served): lower --cut-rate"
wait "$pid" 2>/dev/null || true
sleep 0.5   # nginx logs the requests the kill cut
first=$(served_since "$mark")
staged=$(find "$R/d" -name '*.barge-tmp' -printf '%s\n' | head -1)
echo "cut:        after $first bytes served ($(ratio "$first" "$FILE_BYTES") of the file); staged file ${staged:-none}"
mark=$(log_lines)
start=$(date +%s.%N)
"${ADD[@]}" > "$R/second.log" 2>&1 || die "the resumed image add failed: $(tail -5 "$R/second.log")"
secs=$(awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN { printf "%.2f", e - s }')
second=$(served_since "$mark")
check_copy "$R/d" "the resumed image add"
echo "resumed:    $second bytes served in ${secs} s ($(ratio "$second" "$FILE_BYTES") of the file); copy = image (qemu-img compare)"
grep -i -m2 'resum' "$R/second.log" | sed 's/^/            /' || true

print_results

echo
echo "== ratios and targets (wall; bytes nginx served per run)"
for load in $(load_levels); do
sfx=$(load_suffix "$load")
a=$(get "barge-image-add-https$sfx" warm wall)
b=$(get "curl-then-image-add$sfx" warm wall)
q=$(get "qemu-img-convert-https$sfx" warm wall)
echo " [$load busy loops]"
echo "  curl -o + image add / barge image add https = $(ratio "$b" "$a") (target >= 1.3: $(verdict "$(ratio "$b" "$a")" '>=' 1.3))"
echo "  qemu-img convert https / barge image add https = $(ratio "$q" "$a") (target >= 1.5: $(verdict "$(ratio "$q" "$a")" '>=' 1.5))"
echo "  cpu: barge $(get "barge-image-add-https$sfx" warm cpu) s, curl + image add $(get "curl-then-image-add$sfx" warm cpu) s," \
     "qemu-img $(get "qemu-img-convert-https$sfx" warm cpu) s (client only; nginx shares the cores)"
echo "  served: barge $(served_median "barge-image-add-https$sfx"), curl $(served_median "curl-then-image-add$sfx")," \
     "qemu-img $(served_median "qemu-img-convert-https$sfx") bytes (file $FILE_BYTES)"
done
echo " [resume]"
echo "  re-read by the resumed run: $(ratio "$second" "$FILE_BYTES") of the file (target <= 0.55:" \
     "$(verdict "$(ratio "$second" "$FILE_BYTES")" '<=' 0.55)); cut at $(ratio "$first" "$FILE_BYTES")"
echo "  load at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
