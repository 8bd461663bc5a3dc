#!/usr/bin/env bash
# Hosting checked end to end (issue 19): build the image from ./Dockerfile, run it, look at it in Chromium.
#
#   sudo dev/checks/image-check.sh            # as root; about 7 minutes from scratch; not part of the CI run (.ci/run)
#
# On a machine with the Docker client but no daemon and no registry access (these sandboxes):
#   1. installs docker.io (dockerd), debootstrap and chromium from Debian's packages where missing;
#   2. starts a private dockerd (own data root, socket and config under a temp dir; no iptables, no bridge);
#   3. bootstraps Debian bookworm (minbase + python3, pip) and imports it as `python:3.11-slim`, the image the
#      Dockerfile starts from, in that private daemon only (Docker Hub cannot be reached from here);
#   4. serves torch's CPU wheel and its dependencies on a loopback index (the build cannot reach
#      download.pytorch.org) and builds with `--build-arg TORCH_INDEX=...` and `--network host`; PyPI is reached
#      directly by the build for everything else;
#   5. runs the image's own CMD on a loopback port (`--network host`, port and address swapped), waits for
#      /_stcore/health, opens the overview and a deep link in Chromium (dev/checks/image/browser_check.py), checks that
#      the Run page is read-only and that engine.runtime.jobs refuses a job inside the container;
#   6. removes what it started: container, images, daemon, index server, temp dir (installed packages stay).
#
# Environment: PORT (default 8501 if free, so the image's HEALTHCHECK is checked too, else a free port),
# STORAGE_DRIVER (overlay2, falling back to vfs), DEBIAN_MIRROR, KEEP (a folder: keep logs and screenshots
# there), BASE_TAR (a tarball of the bootstrapped base: reused if present, written if not), SOURCE (worktree,
# the default: the checkout as it is; or HEAD: the last commit, with the checkout's Dockerfile and .dockerignore,
# for a consistent tree while files are being moved).
set -euo pipefail

REPO=$(cd "$(dirname "$0")/../.." && pwd)
TORCH_VERSION=2.13.0
DEBIAN_MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
BASE_TAG=python:3.11-slim # the Dockerfile's FROM, unchanged; a local stand-in inside the private daemon only
IMAGE=loopscope-image-check:latest
NAME=loopscope-image-check-$$
T_START=$(date +%s.%N)
TIMES=()

now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
log() { echo "[$(since "$T_START") s] $*"; }
timed() { # timed LABEL COMMAND...: run, log and record its duration
  local label=$1 t0
  shift
  t0=$(now)
  log "start: $label"
  "$@"
  TIMES+=("$label: $(since "$t0") s")
  log "done: $label ($(since "$t0") s)"
}

[ "$(id -u)" = 0 ] || {
  echo "image-check: run as root (apt-get, dockerd, debootstrap)" >&2
  exit 2
}

WORK=$(mktemp -d /tmp/loopscope-image.XXXXXX)
export DOCKER_HOST="unix://$WORK/docker.sock" DOCKER_CONFIG="$WORK/client" DOCKER_BUILDKIT=0
DOCKERD_PID="" INDEX_PID=""

cleanup() {
  local rc=$?
  set +e
  trap - EXIT INT TERM
  log "cleanup: removing what this script started"
  if [ -n "$KEEP" ]; then
    mkdir -p "$KEEP"
    cp "$WORK"/*.log "$KEEP"/ 2>/dev/null
  fi
  if [ -n "$DOCKERD_PID" ] && kill -0 "$DOCKERD_PID" 2>/dev/null; then
    # every container in this private daemon is this script's: the app, and a failed build step's
    docker ps -aq | xargs -r docker rm -f >/dev/null 2>&1
    docker rmi -f "$IMAGE" "$BASE_TAG" >/dev/null 2>&1
    docker image prune -af >/dev/null 2>&1 # the legacy builder's intermediate images
    log "cleanup: containers left $(docker ps -aq | wc -l), images left $(docker images -aq | wc -l); stopping dockerd"
    kill "$DOCKERD_PID"
    for _ in $(seq 60); do kill -0 "$DOCKERD_PID" 2>/dev/null || break; sleep 0.5; done
    kill -0 "$DOCKERD_PID" 2>/dev/null && kill -9 "$DOCKERD_PID"
    log "cleanup: dockerd stopped"
  fi
  [ -n "$INDEX_PID" ] && kill "$INDEX_PID" 2>/dev/null
  # anything still running from the temp dir (containerd, shims) was started by this script's daemon
  for pid in $(pgrep -f "$WORK" || true); do
    [ "$pid" != $$ ] && kill "$pid" 2>/dev/null
  done
  sleep 1
  awk -v w="$WORK" 'index($2, w) == 1 { print $2 }' /proc/mounts | sort -r | while read -r m; do umount -l "$m"; done
  rm -rf "$WORK"
  log "cleanup: done (temp dir $WORK removed; leftover processes: $(pgrep -f "$WORK" | grep -vc "^$$\$" || true))"
  echo
  echo "== timings =="
  printf '%s\n' "${TIMES[@]}"
  echo "total: $(since "$T_START") s"
  [ "$rc" = 0 ] && echo "image-check: PASS" || echo "image-check: FAIL (exit $rc)"
  exit "$rc"
}
KEEP=${KEEP:-}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---------------------------------------------------------------- 1. packages
install_packages() {
  local missing=()
  command -v dockerd >/dev/null || missing+=(docker.io)
  command -v debootstrap >/dev/null || missing+=(debootstrap)
  [ -x /usr/bin/chromium ] || missing+=(chromium)
  if [ ${#missing[@]} -gt 0 ]; then
    log "installing ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >"$WORK/apt.log"
  fi
  log "docker client $(docker version -f '{{.Client.Version}}' 2>/dev/null || true), $(dockerd --version)"
}
timed "packages" install_packages

PY=python3
[ -x "$REPO/.venv/bin/python" ] && PY="$REPO/.venv/bin/python"
"$PY" -c "import playwright.sync_api" 2>/dev/null || {
  echo "image-check: $PY has no playwright (pip install playwright; Chromium comes from Debian)" >&2
  exit 2
}

# ---------------------------------------------------------------- 2. a private dockerd
start_dockerd() {
  local driver
  for driver in ${STORAGE_DRIVER:-overlay2 vfs}; do
    echo '{}' >"$WORK/daemon.json"
    dockerd --config-file "$WORK/daemon.json" --data-root "$WORK/data" --exec-root "$WORK/exec" \
      --pidfile "$WORK/dockerd.pid" -H "$DOCKER_HOST" --storage-driver "$driver" \
      --iptables=false --ip-masq=false --bridge=none --log-level warn >"$WORK/dockerd.log" 2>&1 &
    DOCKERD_PID=$!
    for _ in $(seq 60); do
      docker info >/dev/null 2>&1 && break
      kill -0 "$DOCKERD_PID" 2>/dev/null || break
      sleep 0.5
    done
    if docker info >/dev/null 2>&1; then
      log "dockerd $(docker version -f '{{.Server.Version}}') up, storage driver $driver, socket $DOCKER_HOST"
      return 0
    fi
    log "dockerd with --storage-driver $driver did not start:"
    tail -n 20 "$WORK/dockerd.log"
    kill "$DOCKERD_PID" 2>/dev/null
    wait "$DOCKERD_PID" 2>/dev/null || true
    DOCKERD_PID=""
  done
  echo "image-check: no storage driver worked for dockerd (see above)" >&2
  return 1
}
timed "dockerd start" start_dockerd

# ---------------------------------------------------------------- 3. the base image, from Debian's packages
make_base() {
  if [ -n "${BASE_TAR:-}" ] && [ -s "$BASE_TAR" ]; then
    log "reusing the bootstrapped base $BASE_TAR"
  else
    local root="$WORK/rootfs"
    debootstrap --variant=minbase --include=python3,python3-pip,python-is-python3,ca-certificates \
      bookworm "$root" "$DEBIAN_MIRROR" >"$WORK/debootstrap.log" 2>&1 || {
      tail -n 30 "$WORK/debootstrap.log"
      return 1
    }
    # like python:3.11-slim: no apt caches or docs, and pip may install (`pip install --user` in the Dockerfile)
    rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root"/usr/share/{doc,man,info,locale}/*
    rm -f "$root"/usr/lib/python3*/EXTERNALLY-MANAGED
    # this host reaches PyPI through a TLS-inspecting egress proxy whose CA only the host trusts: the build's pip
    # must trust it too (a real python:3.11-slim on an ordinary network needs nothing of the kind)
    if ls /usr/local/share/ca-certificates/*.crt >/dev/null 2>&1; then
      cp /usr/local/share/ca-certificates/*.crt "$root/usr/local/share/ca-certificates/"
      chroot "$root" update-ca-certificates >/dev/null 2>&1
      log "base: trusts this host's extra CAs: $(cd /usr/local/share/ca-certificates && echo *.crt)"
    fi
    BASE_TAR=${BASE_TAR:-$WORK/base.tar}
    tar -C "$root" --numeric-owner -cf "$BASE_TAR" .
    rm -rf "$root"
  fi
  docker import --change 'ENV LANG=C.UTF-8' --change 'ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt' \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'CMD ["python3"]' "$BASE_TAR" "$BASE_TAG" >/dev/null
  log "base $BASE_TAG (local stand-in): $(docker run --rm --network host "$BASE_TAG" sh -c \
    'python --version 2>&1; pip --version | cut -d" " -f1-2; . /etc/os-release; echo $PRETTY_NAME' | paste -sd, -)"
}
timed "base image (debootstrap + import)" make_base

# ---------------------------------------------------------------- 4. torch's CPU wheel on a loopback index
serve_torch() {
  "$PY" -m pip download -q "torch==$TORCH_VERSION" -d "$WORK/wheels" 2>"$WORK/pip-download.log" || {
    cat "$WORK/pip-download.log"
    return 1
  }
  local wheel
  wheel=$(basename "$(ls "$WORK"/wheels/torch-*.whl)")
  case "$wheel" in
    *+cpu-cp311-*) log "torch wheel: $wheel" ;;
    *)
      echo "image-check: $wheel is not torch's cp311 CPU wheel; refusing to pull a CUDA build" >&2
      return 1
      ;;
  esac
  "$PY" - "$WORK/wheels" "$WORK/index/simple" <<'EOF'
import re, sys
from pathlib import Path
src, simple = Path(sys.argv[1]), Path(sys.argv[2])
for f in src.iterdir():  # a PEP 503 layout: simple/<normalised name>/<files>; http.server lists each folder
    name = re.sub(r"[-_.]+", "-", f.name.split("-")[0]).lower()
    (simple / name).mkdir(parents=True, exist_ok=True)
    f.rename(simple / name / f.name)
EOF
  INDEX_PORT=$("$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  "$PY" -m http.server --bind 127.0.0.1 --directory "$WORK/index" "$INDEX_PORT" >"$WORK/index.log" 2>&1 &
  INDEX_PID=$!
  TORCH_INDEX="http://127.0.0.1:$INDEX_PORT/simple"
  for _ in $(seq 50); do curl -fs "$TORCH_INDEX/torch/" >/dev/null && break; sleep 0.1; done
  log "serving $(ls "$WORK/index/simple" | wc -l) projects at $TORCH_INDEX"
}
timed "torch index" serve_torch

# ---------------------------------------------------------------- 5. the build
CONTEXT=$REPO
if [ "${SOURCE:-worktree}" = HEAD ]; then
  CONTEXT=$WORK/src
  mkdir -p "$CONTEXT"
  git -C "$REPO" archive HEAD | tar -x -C "$CONTEXT"
  cp "$REPO/Dockerfile" "$REPO/.dockerignore" "$CONTEXT/"
  log "build context: git HEAD $(git -C "$REPO" rev-parse --short HEAD) with the checkout's Dockerfile, .dockerignore"
fi
build() {
  log "docker build --force-rm --network host --build-arg TORCH_INDEX=$TORCH_INDEX -t $IMAGE $CONTEXT"
  local t0 rc=0
  t0=$(now)
  : >"$WORK/build.log"
  docker build --force-rm --network host --build-arg "TORCH_INDEX=$TORCH_INDEX" -t "$IMAGE" "$CONTEXT" >"$WORK/build.log" 2>&1 &
  local pid=$!
  # the build's steps, each stamped with the time since the build began
  tail -n +1 -f --pid "$pid" "$WORK/build.log" | while IFS= read -r line; do
    case "$line" in
      Step* | Sending* | Successfully*) echo "  [+$(since "$t0") s] $line" ;;
    esac
  done
  wait "$pid" || rc=$?
  if [ "$rc" != 0 ]; then
    tail -n 60 "$WORK/build.log"
    return "$rc"
  fi
}
timed "docker build" build

image_size() {
  local bytes base
  bytes=$(docker image inspect -f '{{.Size}}' "$IMAGE")
  base=$(docker image inspect -f '{{.Size}}' "$BASE_TAG")
  SIZE_LINE="image $IMAGE: $((bytes / 1000000)) MB uncompressed ($bytes bytes); base stand-in $((base / 1000000)) MB, so the Dockerfile's own layers are $(((bytes - base) / 1000000)) MB"
  log "$SIZE_LINE"
  docker history --no-trunc --format '{{.Size}}\t{{.CreatedBy}}' "$IMAGE" | awk -F'\t' '$1 != "0B" { print "  " $0 }' | cut -c1-140
}
timed "image size" image_size

# ---------------------------------------------------------------- 6. run it and look at it
PORT=${PORT:-}
if [ -z "$PORT" ]; then
  PORT=$("$PY" -c 'import socket
s = socket.socket()
try:
    s.bind(("127.0.0.1", 8501)); print(8501)
except OSError:
    s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
fi
# the image's own CMD, on a loopback port: --network host leaves no port mapping, so port and address are swapped
mapfile -t CMD < <(docker image inspect -f '{{json .Config.Cmd}}' "$IMAGE" | "$PY" -c '
import json, sys
port = sys.argv[1]
for a in json.load(sys.stdin):
    print(a.replace("--server.port=8501", "--server.port=" + port).replace("0.0.0.0", "127.0.0.1"))' "$PORT")
RUN=(docker run -d --name "$NAME" --network host "$IMAGE" "${CMD[@]}")
log "${RUN[*]}"

look() {
  local shots=()
  [ -n "$KEEP" ] && mkdir -p "$KEEP" && shots=(--shots "$KEEP")
  "$PY" "$REPO/dev/checks/image/browser_check.py" "http://127.0.0.1:$PORT" "${shots[@]}" \
    --alive "[ \"\$(docker inspect -f '{{.State.Running}}' $NAME)\" = true ]" -- "${RUN[@]}" || {
    echo "--- container log ---"
    docker logs "$NAME" 2>&1 | tail -n 40
    return 1
  }
}
timed "container + browser" look

refuses_a_job() {
  docker exec "$NAME" python -c '
import os
from pathlib import Path

try:
    from engine.runtime import jobs
except ImportError:  # the layout before engine/ was split into core, experiments, runtime
    from engine import jobs

root = Path(os.environ["LOOPSCOPE_RESULTS"])
try:
    jobs.submit(jobs.ExperimentSpec("e2", "smoke", (0,), ("parity",)), root)
except jobs.Refused as e:
    print("  engine.runtime.jobs.submit refused:", e)
else:
    raise SystemExit("a job was submitted on the read-only image")
assert not (root / "jobs").exists(), "a jobs folder appeared"
print("  LOOPSCOPE_READ_ONLY=" + os.environ["LOOPSCOPE_READ_ONLY"] + ", no jobs folder under", root)'
}
timed "read-only refuses a job (docker exec)" refuses_a_job

healthcheck() { # the image's HEALTHCHECK probes localhost:8501; its first probe is 30 s after the start
  if [ "$PORT" != 8501 ]; then
    log "port 8501 was taken here; the image's HEALTHCHECK (localhost:8501) is not checked"
    return 0
  fi
  local status
  for _ in $(seq 90); do
    status=$(docker inspect -f '{{.State.Health.Status}}' "$NAME")
    [ "$status" != starting ] && break
    sleep 1
  done
  log "docker's HEALTHCHECK status: $status"
  [ "$status" = healthy ]
}
timed "HEALTHCHECK" healthcheck

docker logs "$NAME" >"$WORK/container.log" 2>&1
log "container log (tail):"
tail -n 8 "$WORK/container.log" | sed 's/^/  /'
if grep -q Traceback "$WORK/container.log"; then
  echo "image-check: the container logged a traceback" >&2
  exit 1
fi
log "$SIZE_LINE"
