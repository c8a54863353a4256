# A real Ceph radosgw for the S3 benches (sourced, not run): one monitor,
# one OSD on memstore and one radosgw on free 127.0.0.1 ports, in a folder
# under $WORK, as ../shared/TESTBED.md and tests/testing/radosgw.cc start
# it. The usage log is on (flushed every second), so a bench can count the
# requests each run made (rgw_ops).
#
#   rgw_start MEMORY_BYTES   sets RGW_URL, RGW_ENV (the AWS_* variables of
#                            a fresh user with random keys); retries a
#                            cluster that does not come up (3 tries)
#   rgw_stop                 stops the daemons by PID (call it from the
#                            EXIT trap)
#   rgw_bench_start DISK_BYTES
#                            rgw_start with room for 4 copies of the disk
#                            (at least 4 GiB), its keys and AWS_ENDPOINT_URL
#                            exported, aws s3 set to 16 MiB parts 8 in
#                            flight ($S3: "aws ... s3"), bucket "bench"
#                            made, $OPS emptied for measure_ops
#   rgw_ops                  "puts gets other bytes_sent bytes_received" of
#                            every request so far (radosgw-admin usage)
#   measure_ops LABEL OUTPUT -- CMD...
#                            lib.sh's measure (warm), and the requests and
#                            bytes CMD cost the server appended to $OPS
#   ops_field LABEL N        a field of measure_ops' record: 1 puts, 2 gets,
#                            3 other, 4 bytes sent, 5 bytes received

RGW_PIDS=()
RGW_DIR=""

rgw_free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

rgw_stop() {
  local p
  for p in "${RGW_PIDS[@]+"${RGW_PIDS[@]}"}"; do kill "$p" 2>/dev/null || true; done
  for p in "${RGW_PIDS[@]+"${RGW_PIDS[@]}"}"; do
    for _ in $(seq 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$p" 2>/dev/null || true
  done
  RGW_PIDS=()
}

rgw_start_once() {
  local d=$1 mem=$2
  mkdir -p "$d"/{mon,osd/ceph-0,run,log,rgw,crash}
  local monport rgwport fsid osd_uuid
  monport=$(rgw_free_port)
  rgwport=$(rgw_free_port)
  fsid=$(cat /proc/sys/kernel/random/uuid)
  osd_uuid=$(cat /proc/sys/kernel/random/uuid)
  cat > "$d/ceph.conf" <<EOF
[global]
fsid = $fsid
mon_host = v1:127.0.0.1:$monport
public_network = 127.0.0.1/32
auth_cluster_required = none
auth_service_required = none
auth_client_required = none
auth_allow_insecure_global_id_reclaim = true
run_dir = $d/run
pid_file = $d/run/\$name.pid
admin_socket = $d/run/\$name.asok
log_file = $d/log/\$name.log
crash_dir = $d/crash
keyring = /dev/null
osd_pool_default_size = 1
osd_pool_default_min_size = 1
osd_pool_default_pg_num = 8
osd_pool_default_pgp_num = 8
osd_crush_chooseleaf_type = 0
mon_allow_pool_size_one = true
mon_warn_on_pool_no_redundancy = false
mon_max_pg_per_osd = 1000
[mon]
mon_data = $d/mon/\$cluster-\$id
mon_data_avail_warn = 2
mon_data_avail_crit = 1
[osd]
osd_data = $d/osd/\$cluster-\$id
osd_objectstore = memstore
memstore_device_bytes = $mem
osd_max_object_name_len = 460
osd_max_object_namespace_len = 64
osd_class_load_list = *
osd_class_default_list = *
[client.rgw.t]
rgw_frontends = beast endpoint=127.0.0.1:$rgwport
rgw_data = $d/rgw
rgw_enable_usage_log = true
rgw_usage_log_tick_interval = 1
rgw_usage_log_flush_threshold = 1
EOF
  export CEPH_CONF=$d/ceph.conf
  local log=$d/log/setup.log
  monmaptool --create --fsid "$fsid" --addv a "[v1:127.0.0.1:$monport]" "$d/monmap" >> "$log" 2>&1 || return 1
  ceph-mon --mkfs -i a --monmap "$d/monmap" >> "$log" 2>&1 || return 1
  ceph-mon -i a -f >> "$log" 2>&1 &
  RGW_PIDS+=($!)
  local ok=0
  for _ in $(seq 120); do
    if timeout 10 ceph --connect-timeout 5 osd new "$osd_uuid" 0 >> "$log" 2>&1; then ok=1; break; fi
    sleep 0.5
  done
  [ "$ok" = 1 ] || return 1
  ceph-osd -i 0 --mkfs --osd-uuid "$osd_uuid" >> "$log" 2>&1 || return 1
  ceph-osd -i 0 -f >> "$log" 2>&1 &
  RGW_PIDS+=($!)
  timeout 30 ceph osd crush create-or-move osd.0 1.0 root=default host=localhost >> "$log" 2>&1 || return 1
  ok=0
  for _ in $(seq 60); do
    if timeout 10 ceph osd stat -f json 2>/dev/null | grep -q '"num_up_osds":1'; then ok=1; break; fi
    sleep 1
  done
  [ "$ok" = 1 ] || return 1
  radosgw -f -n client.rgw.t >> "$log" 2>&1 &
  RGW_PIDS+=($!)
  ok=0
  for _ in $(seq 1200); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$rgwport") 2>/dev/null; then ok=1; break; fi
    sleep 0.1
  done
  [ "$ok" = 1 ] || return 1
  local key secret
  key=$(tr -dc 'A-Z0-9' < /dev/urandom | head -c 20)
  secret=$(tr -dc 'A-Za-z0-9' < /dev/urandom | head -c 40)
  timeout 60 radosgw-admin user create --uid=bench --display-name=bench \
    --access-key="$key" --secret-key="$secret" >> "$log" 2>&1 || return 1
  RGW_URL=http://127.0.0.1:$rgwport
  RGW_ENV=(AWS_ACCESS_KEY_ID="$key" AWS_SECRET_ACCESS_KEY="$secret" AWS_DEFAULT_REGION=us-east-1
           AWS_REGION=us-east-1 AWS_CONFIG_FILE=/dev/null AWS_SHARED_CREDENTIALS_FILE=/dev/null)
  RGW_DIR=$d
}

rgw_start() {
  local mem=${1:-4G} try
  for try in 1 2 3; do
    if rgw_start_once "$WORK/rgw$try" "$mem"; then return 0; fi
    echo "radosgw: try $try did not come up:" >&2
    tail -n 5 "$WORK/rgw$try/log/"*.log >&2 || true
    rgw_stop
  done
  die "radosgw did not start (logs above)"
}

# The requests of user "bench" so far, from the usage log (its counters
# reach radosgw-admin within a few seconds).
rgw_ops() {
  sleep 3
  CEPH_CONF=$RGW_DIR/ceph.conf timeout 60 radosgw-admin usage show --uid=bench 2>/dev/null |
    python3 -c '
import json, sys
d = json.load(sys.stdin)
puts = gets = other = sent = recv = 0
for e in d.get("entries", []):
    for b in e.get("buckets", []):
        for c in b.get("categories", []):
            n = c.get("ops", 0)
            cat = c.get("category", "")
            if cat in ("put_obj", "post_obj", "complete_multipart", "copy_obj"): puts += n
            elif cat in ("get_obj",): gets += n
            else: other += n
            sent += c.get("bytes_sent", 0); recv += c.get("bytes_received", 0)
print(puts, gets, other, sent, recv)'
}

measure_ops() {
  local label=$1 output=$2
  shift 3
  local before after
  before=$(rgw_ops)
  measure "$label" warm "$output" -- "$@"
  after=$(rgw_ops)
  python3 - "$label" "$before" "$after" >> "$OPS" <<'EOF'
import sys
label, b, a = sys.argv[1], [int(x) for x in sys.argv[2].split()], [int(x) for x in sys.argv[3].split()]
d = [y - x for x, y in zip(b, a)]
print("\t".join([label] + [str(x) for x in d]))
EOF
}

ops_field() {
  awk -F'\t' -v l="$1" -v n="$2" '$1 == l { v = $(n + 1) } END { print v + 0 }' "$OPS"
}

rgw_bench_start() {
  local disk_bytes=$1
  # The OSD keeps every object in memory: room for the peers' copies too.
  rgw_start "$(( disk_bytes * 4 > 4 * 1024 * 1024 * 1024 ? disk_bytes * 4 : 4 * 1024 * 1024 * 1024 ))"
  export "${RGW_ENV[@]}"
  # barge finds the endpoint here (restore, list, verify, sync have no --s3-endpoint).
  export AWS_ENDPOINT_URL=$RGW_URL
  echo "radosgw:    $RGW_URL ($(radosgw --version | head -1 | cut -c1-40))"
  # aws s3's own settings: multipart in 16 MiB parts, 8 in flight.
  cat > "$WORK/aws.conf" <<EOF
[default]
region = us-east-1
s3 =
  max_concurrent_requests = 8
  multipart_chunksize = 16MB
EOF
  export AWS_CONFIG_FILE=$WORK/aws.conf
  S3="aws --endpoint-url $RGW_URL s3"
  $S3 mb s3://bench > /dev/null
  OPS=$WORK/ops.tsv
  : > "$OPS"
}
