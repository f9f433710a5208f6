#!/usr/bin/env bash
# End-to-end check of the container deployment (Dockerfile + docker-compose.yml).
#
# Builds the image, brings the compose stack up under its own project name, checks the image
# (non-root, no compilers, no secret inside), walks through the service over HTTP (keys,
# upload, release, poll, budget, audit), then kills the worker container that holds a running
# release and checks that the release still completes and is charged exactly once, then registers
# a Parquet dataset by reference on the dask profile (scheduler, two Dask workers, a local S3
# endpoint) and checks that its release ran on the cluster. Always tears the stack down (volumes included); exits non-zero on any failure.
#
# Engine: `docker compose` when a Docker engine answers (`docker info`), else podman with
# podman-compose. Without a container registry (as on this project's machines), the stand-in
# base images come from ../shared/tools/standin-images.sh, which also installs podman; run as
# root there. podman-compose is installed into a virtualenv ($DPSS_SMOKE_VENV) if missing.
#
# Settings (environment, all optional):
#   DPSS_SMOKE_ENGINE=docker|podman   force an engine
#   DPSS_SMOKE_PROJECT=dpss-smoke     compose project name (containers, volumes, network)
#   DPSS_SMOKE_IMAGE=dp-subspace-service:smoke   image tag built and used
#   DPSS_SMOKE_PORT=<free port>       host port of the API
#   DPSS_SMOKE_VENV=/tmp/dpss-smoke-venv   where podman-compose is installed
#   DPSS_SMOKE_KILL_N=1000 DPSS_SMOKE_KILL_D=5000   shape of the dataset of the long release
#                                     (analyze_gauss on it runs ~7 s on 2 idle cores)
#   DPSS_SMOKE_KEEP=1                 leave the stack running (no teardown) for debugging
set -Eeuo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
cd "$root"

project=${DPSS_SMOKE_PROJECT:-dpss-smoke}
image=${DPSS_SMOKE_IMAGE:-dp-subspace-service:smoke}
venv=${DPSS_SMOKE_VENV:-/tmp/dpss-smoke-venv}
podman_compose_version=1.6.0
kill_n=${DPSS_SMOKE_KILL_N:-1000}
kill_d=${DPSS_SMOKE_KILL_D:-5000}
lease_seconds=10

work=$(mktemp -d /tmp/dpss-smoke.XXXXXX)
started=$SECONDS
phase_start=$SECONDS
timings=()
stack_up=0

log() { printf '[%4ds] %s\n' "$((SECONDS - started))" "$*"; }
fail() { log "FAIL: $*" >&2; exit 1; }
phase() {
  # Ends the running phase (recording its duration) and starts the next one.
  if [[ -n ${phase_name:-} ]]; then timings+=("$(printf '%5ds  %s' "$((SECONDS - phase_start))" "$phase_name")"); fi
  phase_name=$1
  phase_start=$SECONDS
  [[ -n $phase_name ]] && log "== $phase_name"
  return 0
}

# ---- engine --------------------------------------------------------------------------------
choose_engine() {
  case ${DPSS_SMOKE_ENGINE:-} in
    docker | podman) engine=$DPSS_SMOKE_ENGINE ;;
    "")
      if command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then
        engine=docker
      else
        engine=podman
      fi
      ;;
    *) fail "DPSS_SMOKE_ENGINE must be docker or podman" ;;
  esac
}

setup_podman() {
  local standin="$root/../shared/tools/standin-images.sh"
  if [[ -f $standin ]]; then
    [[ $(id -u) -eq 0 ]] || fail "$standin must run as root"
    log "podman and stand-in base images: $standin"
    bash "$standin"
  fi
  command -v podman >/dev/null 2>&1 || fail "podman is not installed (and no stand-in script at $standin)"
  if ! "$venv/bin/podman-compose" version >/dev/null 2>&1; then
    log "installing podman-compose $podman_compose_version into $venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet "podman-compose==$podman_compose_version"
  fi
}

choose_engine
if [[ $engine == docker ]]; then
  docker compose version >/dev/null 2>&1 || fail "docker answers but has no compose plugin"
  compose=(docker compose)
else
  phase "install podman, stand-in images, podman-compose"
  setup_podman
  compose=("$venv/bin/podman-compose")
fi
# The dask profile too (scheduler, two Dask workers, a local S3 endpoint): the deployment
# docs/deployment.md describes for datasets by reference, exercised below, not only parsed.
compose+=(-p "$project" -f "$root/docker-compose.yml" --env-file "$work/smoke.env" --profile dask)
log "engine: $engine ($("$engine" --version 2>/dev/null | head -n1)); compose: ${compose[0]}"

# ---- helpers -------------------------------------------------------------------------------
rand_hex() { python3 -c 'import secrets, sys; print(secrets.token_hex(int(sys.argv[1])))' "$1"; }
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# Container ids of a compose service of this project (-a: include exited ones).
cids() {
  local all=() svc=$1
  [[ ${2:-} == -a ]] && all=(-a)
  "$engine" ps -q "${all[@]}" --filter "label=com.docker.compose.project=$project" \
    --filter "label=com.docker.compose.service=$svc"
}
cid() {
  local id
  id=$(cids "$@" | head -n1)
  [[ -n $id ]] || fail "no container for service $1"
  echo "$id"
}
psql_db() {
  "$engine" exec -e PGPASSWORD="$pg_password" "$(cid db)" \
    psql -h 127.0.0.1 -U postgres -d dpss -At -v ON_ERROR_STOP=1 -c "$1"
}
smoke_py() { python3 "$work/smoke.py" "$@"; }
release_state() { psql_db "select status || ' ' || attempts from releases where id = '$release_id'"; }

dump_logs() {
  local c
  for c in $("$engine" ps -aq --filter "label=com.docker.compose.project=$project" 2>/dev/null); do
    echo "---- logs of $("$engine" inspect -f '{{.Name}}' "$c" 2>/dev/null) (last 60 lines)"
    "$engine" logs --tail 60 "$c" 2>&1 || true
  done
  if [[ -s $work/compose.log ]]; then
    echo "---- compose output (last 40 lines)"
    tail -n 40 "$work/compose.log"
  fi
}

project_leftovers() {
  # Containers and volumes of the project, one per line.
  "$engine" ps -aq --filter "label=com.docker.compose.project=$project"
  "$engine" volume ls -q --filter "label=com.docker.compose.project=$project"
}

remove_stack() {
  # Containers first with their anonymous volumes: podman-compose's `down` removes only the
  # replicas the compose file declares (not those added by --scale) and `-v` only the named
  # volumes. Then `down -v` for the network and named volumes, then any volume it missed.
  "$engine" ps -aq --filter "label=com.docker.compose.project=$project" | xargs -r "$engine" rm -f -v >/dev/null 2>&1
  "${compose[@]}" down -v --remove-orphans >>"$work/compose.log" 2>&1
  "$engine" volume ls -q --filter "label=com.docker.compose.project=$project" | xargs -r "$engine" volume rm -f >/dev/null 2>&1
  return 0
}

teardown() {
  local rc=$?
  trap - EXIT INT TERM
  set +e
  if ((rc != 0)) && ((stack_up)); then dump_logs; fi
  if [[ ${DPSS_SMOKE_KEEP:-} == 1 ]]; then
    log "DPSS_SMOKE_KEEP=1: stack $project left running; env file $work/smoke.env"
  else
    phase "tear down"
    remove_stack
    left=$(project_leftovers 2>/dev/null | wc -l)
    if ((left)); then
      log "FAIL: $left containers or volumes of project $project left after the teardown" >&2
      ((rc == 0)) && rc=1
    fi
    rm -rf "$work"
  fi
  phase ""
  echo "---- timings"
  printf '%s\n' "${timings[@]}"
  printf '%5ds  total\n' "$((SECONDS - started))"
  if ((rc == 0)); then echo "compose smoke: PASSED"; else echo "compose smoke: FAILED (exit $rc)"; fi
  exit "$rc"
}
trap teardown EXIT
trap 'exit 130' INT TERM

# ---- the HTTP side, in Python's standard library only (runs on the host) --------------------
cat >"$work/smoke.py" <<'PY'
"""HTTP walkthrough of a running dpss stack; stdlib only. Subcommands: see main()."""
import array
import json
import os
import random
import sys
import time
import urllib.error
import urllib.request
import uuid
from decimal import Decimal

BASE = os.environ["SMOKE_BASE"]
STATE = os.environ["SMOKE_STATE"]


def fail(msg):
    print(f"FAIL: {msg}", file=sys.stderr)
    sys.exit(1)


def check(cond, msg):
    if not cond:
        fail(msg)


def call(method, path, key=None, body=None, headers=None, expect=None, raw=None, ctype=None):
    hdrs = dict(headers or {})
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        hdrs["Content-Type"] = "application/json"
    elif raw is not None:
        data = raw
        hdrs["Content-Type"] = ctype
    if key:
        hdrs["Authorization"] = f"Bearer {key}"
    req = urllib.request.Request(BASE + path, data=data, headers=hdrs, method=method)
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            status, payload = resp.status, resp.read()
    except urllib.error.HTTPError as err:
        status, payload = err.code, err.read()
    try:
        parsed = json.loads(payload) if payload else None
    except ValueError:
        parsed = payload.decode(errors="replace")
    if expect is not None and status not in (expect if isinstance(expect, tuple) else (expect,)):
        fail(f"{method} {path}: expected {expect}, got {status}: {str(parsed)[:500]}")
    return status, parsed


def npy_bytes(rows, cols, values):
    """A version 1.0 .npy file of little-endian float64, row-major."""
    header = "{'descr': '<f8', 'fortran_order': False, 'shape': (%d, %d), }" % (rows, cols)
    pad = 64 - (10 + len(header) + 1) % 64
    header = (header + " " * pad + "\n").encode("latin1")
    arr = array.array("d", values)
    if sys.byteorder != "little":
        arr.byteswap()
    return b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header + arr.tobytes()


def upload(owner, name, filename, content, fields):
    boundary = uuid.uuid4().hex
    parts = []
    for k, v in {"name": name, **fields}.items():
        parts.append(
            f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'.encode()
        )
    parts.append(
        (
            f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{filename}"\r\n'
            "Content-Type: application/octet-stream\r\n\r\n"
        ).encode()
        + content
        + b"\r\n"
    )
    parts.append(f"--{boundary}--\r\n".encode())
    _, ds = call(
        "POST", "/v1/datasets", owner, raw=b"".join(parts),
        ctype=f"multipart/form-data; boundary={boundary}", expect=201,
    )
    return ds


def load_state():
    with open(STATE) as f:
        return json.load(f)


def save_state(state):
    with open(STATE, "w") as f:
        json.dump(state, f)


def wait_release(analyst, rid, timeout, until=("succeeded", "no_result", "failed")):
    deadline = time.monotonic() + timeout
    while True:
        _, rel = call("GET", f"/v1/releases/{rid}", analyst, expect=200)
        if rel["status"] in until:
            return rel
        if time.monotonic() > deadline:
            fail(f"release {rid} still {rel['status']} after {timeout}s")
        time.sleep(0.2)


def dec(x):
    return Decimal(str(x))


def walkthrough():
    admin = os.environ["SMOKE_ADMIN_KEY"]
    t0 = time.monotonic()

    def step(msg):
        print(f"  [{time.monotonic() - t0:5.1f}s] {msg}", flush=True)

    check(call("GET", "/healthz", expect=200)[1].get("status") == "ok", "/healthz not ok")
    check(call("GET", "/readyz", expect=200)[1].get("status") == "ok", "/readyz not ok")
    call("GET", "/v1/mechanisms", expect=401)
    step("healthz/readyz ok; no key -> 401")

    keys = {}
    for role in ("owner", "analyst", "auditor"):
        _, made = call("POST", "/v1/keys", admin, body={"role": role, "name": f"smoke {role}"}, expect=201)
        check(made["role"] == role and made["key"], f"bad KeyCreated for {role}: {made}")
        keys[role] = made["key"]
    call("POST", "/v1/keys", keys["analyst"], body={"role": "admin", "name": "x"}, expect=403)
    step("admin created owner, analyst, auditor keys; analyst may not create keys (403)")

    _, mechs = call("GET", "/v1/mechanisms", keys["analyst"], expect=200)
    names = [m["name"] for m in mechs["items"]]
    check("analyze_gauss" in names, f"analyze_gauss not in /v1/mechanisms: {names}")
    step(f"mechanisms: {', '.join(names)}")

    # 400 rows in 6 columns; most variance along the first two axes; row norms <= 1.
    rng = random.Random(7)
    n, d, values = 400, 6, []
    for _ in range(n):
        row = [rng.gauss(0, 1.0), rng.gauss(0, 0.8)] + [rng.gauss(0, 0.05) for _ in range(d - 2)]
        norm = max(1.0, sum(v * v for v in row) ** 0.5)
        values.extend(v / norm for v in row)
    ds = upload(keys["owner"], "smoke walkthrough", "walk.npy", npy_bytes(n, d, values),
                {"epsilon_budget": "1.0", "delta_budget": "0.00001", "row_norm_bound": "1.0", "accounting": "basic"})
    check(ds["n_rows"] == n and ds["n_cols"] == d, f"dataset shape wrong: {ds}")
    check(dec(ds["budget"]["epsilon_remaining"]) == Decimal("1.0"), f"fresh budget wrong: {ds['budget']}")
    call("POST", "/v1/datasets", keys["analyst"], raw=b"", ctype="multipart/form-data; boundary=x",
         expect=(403, 422))
    step(f"owner uploaded dataset {ds['id']} ({n}x{d}, eps budget 1.0)")

    req = {"mechanism": "analyze_gauss", "k": 2, "epsilon": "0.5", "delta": "0.000001",
           "params": {}}
    idem = {"Idempotency-Key": "smoke-walkthrough-1"}
    _, rel = call("POST", f"/v1/datasets/{ds['id']}/releases", keys["analyst"], body=req,
                  headers=idem, expect=202)
    check(rel["status"] in ("queued", "running", "succeeded"), f"new release status {rel['status']}")
    status, again = call("POST", f"/v1/datasets/{ds['id']}/releases", keys["analyst"], body=req,
                         headers=idem, expect=(200, 201, 202))
    check(again["id"] == rel["id"], "same Idempotency-Key gave a different release")
    step(f"analyst requested release {rel['id']} (analyze_gauss k=2 eps 0.5); retry with the same Idempotency-Key -> same release")

    done = wait_release(keys["analyst"], rel["id"], timeout=120)
    check(done["status"] == "succeeded", f"release ended {done['status']}: {done.get('reason')}")
    basis = done["result"]["basis"]
    check(len(basis) == d and all(len(r) == 2 for r in basis), "basis is not d x k")
    for i in range(2):
        for j in range(2):
            dot = sum(basis[r][i] * basis[r][j] for r in range(d))
            check(abs(dot - (1.0 if i == j else 0.0)) < 1e-6, f"basis not orthonormal ({i},{j}: {dot})")
    step(f"release succeeded after polling: basis {d}x2, orthonormal")

    _, budget = call("GET", f"/v1/datasets/{ds['id']}/budget", keys["analyst"], expect=200)
    check(dec(budget["epsilon_spent"]) == Decimal("0.5"), f"epsilon_spent {budget['epsilon_spent']} != 0.5")
    check(dec(budget["delta_spent"]) == Decimal("0.000001"), f"delta_spent {budget['delta_spent']}")
    check(dec(budget["epsilon_remaining"]) == Decimal("0.5"), f"epsilon_remaining {budget['epsilon_remaining']}")
    step("budget: epsilon_spent 0.5 (charged once despite the retried request), remaining 0.5")

    over = dict(req, epsilon="0.6")
    _, refused = call("POST", f"/v1/datasets/{ds['id']}/releases", keys["analyst"], body=over, expect=409)
    check(refused.get("error") == "budget_exceeded", f"409 body: {refused}")
    check(dec(refused["epsilon_remaining"]) == Decimal("0.5"), f"409 epsilon_remaining {refused}")
    _, budget2 = call("GET", f"/v1/datasets/{ds['id']}/budget", keys["analyst"], expect=200)
    check(budget2 == budget, "a refused request changed the budget")
    step("eps 0.6 > remaining 0.5 -> 409 budget_exceeded, nothing charged")

    call("GET", "/v1/audit", keys["analyst"], expect=403)
    events, after = [], 0
    while True:
        _, page = call("GET", f"/v1/audit?after={after}&limit=5", keys["auditor"], expect=200)
        events.extend(page["items"])
        if page["next_after"] is None:
            break
        check(page["next_after"] > after, "audit pagination does not advance")
        after = page["next_after"]
    for prev, ev in zip(events, events[1:]):
        check(ev["prev_hash"] == prev["hash"] and ev["seq"] == prev["seq"] + 1, f"audit chain broken at seq {ev['seq']}")
    types = [e["event_type"] for e in events]
    for needed in ("key_created", "dataset_created", "release_requested", "release_succeeded"):
        check(needed in types, f"audit log lacks {needed}: {types}")
    succ = [e for e in events if e["event_type"] == "release_succeeded" and e["release_id"] == rel["id"]]
    check(len(succ) == 1, f"{len(succ)} release_succeeded events for the release")
    check(done["result"].get("basis_sha256") in json.dumps(succ[0]["details"]), "basis SHA-256 not in the audit event")
    step(f"auditor read {len(events)} audit events in pages of 5; chain links hold; analyst may not (403)")

    save_state({"keys": keys})


def start_long():
    state = load_state()
    n, d = int(os.environ["SMOKE_KILL_N"]), int(os.environ["SMOKE_KILL_D"])
    rng = random.Random(11)
    scale = 1.0 / d**0.5
    values = [(rng.random() - 0.5) * scale for _ in range(n * d)]
    t = time.monotonic()
    ds = upload(state["keys"]["owner"], "smoke long", "long.npy", npy_bytes(n, d, values),
                {"epsilon_budget": "2", "delta_budget": "0.0001", "row_norm_bound": "1", "accounting": "basic"})
    print(f"  uploaded {n}x{d} dataset ({n * d * 8 / 2**20:.0f} MiB) in {time.monotonic() - t:.1f}s", file=sys.stderr, flush=True)
    req = {"mechanism": "analyze_gauss", "k": 5, "epsilon": "0.7", "delta": "0.000001", "params": {}}
    _, rel = call("POST", f"/v1/datasets/{ds['id']}/releases", state["keys"]["analyst"], body=req, expect=202)
    state.update(long_dataset=ds["id"], long_release=rel["id"])
    save_state(state)
    print(rel["id"])


def finish_long():
    state = load_state()
    owner = state["keys"]["owner"]
    t = time.monotonic()
    rel = wait_release(owner, state["long_release"], timeout=float(os.environ["SMOKE_FINISH_TIMEOUT"]))
    # Attempts and run times are for admins and auditors only; the shell reads them.
    print(f"  release ended '{rel['status']}' {time.monotonic() - t:.1f}s after the kill", flush=True)
    check(rel["status"] == "succeeded", f"release ended {rel['status']}: {rel.get('reason')}")
    d = int(os.environ["SMOKE_KILL_D"])
    basis = rel["result"]["basis"]
    check(len(basis) == d and all(len(r) == 5 for r in basis), "basis is not d x 5")
    _, budget = call("GET", f"/v1/datasets/{state['long_dataset']}/budget", owner, expect=200)
    check(dec(budget["epsilon_spent"]) == Decimal("0.7"), f"epsilon_spent {budget['epsilon_spent']} != 0.7 (charged once)")
    check(dec(budget["delta_spent"]) == Decimal("0.000001"), f"delta_spent {budget['delta_spent']}")
    print(f"  budget after the crash: epsilon_spent {budget['epsilon_spent']} = the release's epsilon 0.7, delta_spent {budget['delta_spent']}")


def reference():
    """A dataset by reference on the dask profile: register the Parquet rows the api container
    wrote to the object store, wait for a worker to read them, release, check the charge."""
    state = load_state()
    owner, analyst = state["keys"]["owner"], state["keys"]["analyst"]
    d = int(os.environ["SMOKE_REF_D"])
    body = {"name": "smoke lake", "epsilon_budget": "2", "delta_budget": "0.00001", "row_norm_bound": "1",
            "uri": os.environ["SMOKE_REF_URI"], "columns": [f"c{j}" for j in range(d)]}
    _, ds = call("POST", "/v1/dataset-references", owner, body=body, expect=202)
    check(ds["registration_status"] == "registering", f"registration {ds['registration_status']}")
    deadline = time.monotonic() + 300
    while ds["registration_status"] == "registering":
        if time.monotonic() > deadline:
            fail("reference still registering after 300s")
        time.sleep(0.5)
        _, ds = call("GET", f"/v1/datasets/{ds['id']}", owner, expect=200)
    check(ds["registration_status"] == "ready", f"registration {ds['registration_status']}: {ds.get('registration_reason')}")
    check(ds["n_rows"] == int(os.environ["SMOKE_REF_N"]), f"n_rows {ds['n_rows']}")
    print(f"  registered {ds['n_rows']} x {ds['n_cols']} by reference: {ds['reference']}", flush=True)
    req = {"mechanism": "analyze_gauss", "k": 3, "epsilon": "1", "delta": "0.000001", "params": {}}
    _, rel = call("POST", f"/v1/datasets/{ds['id']}/releases", analyst, body=req, expect=202)
    rel = wait_release(owner, rel["id"], timeout=300)
    check(rel["status"] == "succeeded", f"release by reference ended {rel['status']}: {rel.get('reason')}")
    basis = rel["result"]["basis"]
    check(len(basis) == d and all(len(r) == 3 for r in basis), "basis is not d x 3")
    _, budget = call("GET", f"/v1/datasets/{ds['id']}/budget", owner, expect=200)
    check(dec(budget["epsilon_spent"]) > 0, f"nothing charged: {budget}")
    print(f"  release {rel['id']} succeeded; epsilon_spent {budget['epsilon_spent']}", flush=True)
    print(rel["id"])


if __name__ == "__main__":
    {"walkthrough": walkthrough, "start-long": start_long,
     "finish-long": finish_long, "reference": reference}[sys.argv[1]]()
PY

pg_password=$(rand_hex 24)
admin_key=$(rand_hex 32)
port=${DPSS_SMOKE_PORT:-$(free_port)}
cat >"$work/smoke.env" <<EOF
POSTGRES_PASSWORD=$pg_password
DPSS_ADMIN_API_KEY=$admin_key
DPSS_IMAGE=$image
API_PUBLISH_ADDRESS=127.0.0.1
API_PUBLISH_PORT=$port
DPSS_WORKER_REPLICAS=2
DPSS_WORKER_LEASE_SECONDS=$lease_seconds
DPSS_WORKER_HEARTBEAT_SECONDS=2
DPSS_WORKER_POLL_SECONDS=0.5
DPSS_WORKER_MAX_ATTEMPTS=3
DPSS_DASK_SCHEDULER=tcp://dask-scheduler:8786
DPSS_S3_ENDPOINT_URL=http://object-store:9000
DPSS_REFERENCE_ROOTS=s3://dpss-smoke
AWS_ACCESS_KEY_ID=smoke
AWS_SECRET_ACCESS_KEY=smoke-secret
DASK_WORKER_REPLICAS=2
EOF
export SMOKE_BASE="http://127.0.0.1:$port" SMOKE_STATE="$work/state.json" SMOKE_ADMIN_KEY="$admin_key"
export SMOKE_KILL_N=$kill_n SMOKE_KILL_D=$kill_d

# ---- build ---------------------------------------------------------------------------------
phase "build image $image"
remove_stack || true # what a previous aborted run may have left
# podman writes OCI images by default, a format without HEALTHCHECK: ask for Docker's format.
build_args=()
[[ $engine == podman ]] && build_args=(--format docker)
"$engine" build "${build_args[@]}" -t "$image" "$root" >"$work/build.log" 2>&1 || { tail -n 40 "$work/build.log"; fail "image build failed"; }
log "image size: $("$engine" image inspect -f '{{.Size}}' "$image" | awk '{printf "%.0f MB", $1/1e6}')"

phase "image checks"
user=$("$engine" image inspect -f '{{.Config.User}}' "$image")
[[ -n $user && $user != root && $user != 0 && $user != 0:* && $user != root:* ]] || fail "image runs as root (User='$user')"
uid=$("$engine" run --rm --entrypoint id "$image" -u)
[[ $uid != 0 ]] || fail "container runs as uid 0"
"$engine" run --rm --entrypoint sh "$image" -c \
  'for c in gcc cc c++ g++ clang make ld as; do if command -v $c >/dev/null; then echo "compiler in image: $c"; exit 1; fi; done' ||
  fail "the final image contains a compiler or build tool"
for secret in "$pg_password" "$admin_key"; do
  if { "$engine" image inspect "$image"; "$engine" history --no-trunc "$image"; } 2>/dev/null | grep -qF "$secret"; then
    fail "a secret of this run is inside the image"
  fi
done
"$engine" image inspect -f '{{json .Config.Env}}' "$image" | grep -qiE 'PASSWORD|API_KEY' && fail "a secret-looking variable is set in the image"
"$engine" image inspect -f '{{json .Config.Healthcheck}}' "$image" | grep -q healthz || fail "image has no HEALTHCHECK on /healthz"
log "user $user (uid $uid), no compiler, no secret, HEALTHCHECK on /healthz"

# ---- up --------------------------------------------------------------------------------------
phase "stack up (db, migrate, api, 2 workers; dask scheduler, 2 dask workers, object store)"
stack_up=1
if [[ $engine == docker ]]; then
  # What a user runs: compose orders db (healthy) -> migrate (exit 0) -> api, workers.
  "${compose[@]}" up -d >>"$work/compose.log" 2>&1 || fail "compose up failed"
else
  # The same order, step by step: podman before 4.6 ignores `condition: service_healthy`, and
  # podman 4.3 cannot start a container whose dependency has a dependency (api -> migrate -> db).
  "${compose[@]}" up -d db >>"$work/compose.log" 2>&1 || fail "compose up db failed"
  for ((i = 0; ; i++)); do
    "$engine" exec "$(cid db)" pg_isready -h 127.0.0.1 -p 5432 -U postgres -d dpss >/dev/null 2>&1 && break
    ((i < 120)) || fail "database not ready after 120s"
    sleep 1
  done
  log "database ready"
  "${compose[@]}" up -d --no-deps migrate >>"$work/compose.log" 2>&1 || fail "compose up migrate failed"
fi
for ((i = 0; ; i++)); do
  state=$("$engine" inspect -f '{{.State.Status}} {{.State.ExitCode}}' "$(cid migrate -a)")
  [[ $state == exited* ]] && break
  ((i < 180)) || fail "migration still running after 180s"
  sleep 1
done
[[ $state == "exited 0" ]] || fail "migration failed ($state)"
if [[ $engine == podman ]]; then
  "${compose[@]}" up -d --no-deps api worker >>"$work/compose.log" 2>&1 || fail "compose up api worker failed"
  "${compose[@]}" up -d --no-deps dask-scheduler object-store >>"$work/compose.log" 2>&1 ||
    fail "compose up dask-scheduler object-store failed"
  "${compose[@]}" up -d --no-deps dask-worker >>"$work/compose.log" 2>&1 || fail "compose up dask-worker failed"
fi
[[ $(psql_db "select count(*) from alembic_version") == 1 ]] || fail "no alembic_version row after migrate"
log "migrate ran and exited 0 (alembic head $(psql_db 'select version_num from alembic_version'))"
for ((i = 0; ; i++)); do
  python3 -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1] + "/readyz", timeout=3)' \
    "$SMOKE_BASE" >/dev/null 2>&1 && break
  ((i < 120)) || fail "API not ready on $SMOKE_BASE after 120s"
  sleep 1
done
workers=$(cids worker | wc -l)
[[ $workers == 2 ]] || fail "expected 2 running worker containers, found $workers"
log "API ready on $SMOKE_BASE; $workers workers running"

# ---- walkthrough -----------------------------------------------------------------------------
phase "walkthrough over HTTP"
smoke_py walkthrough
"$engine" exec "$(cid api)" dpss audit verify || fail "dpss audit verify failed in the api container"
log "dpss audit verify: ok"

# ---- crash a worker mid-release --------------------------------------------------------------
phase "kill the worker running a release"
release_id=$(smoke_py start-long) || fail "could not request the long release"
t_req=$SECONDS
for ((i = 0; ; i++)); do
  # The database, not the API: only admins and auditors are shown a release's real state
  # before its visible_at (service.auth.sees_real_state), and the smoke needs it to kill.
  out=$(release_state) || fail "cannot read the release"
  read -r st attempts <<<"$out"
  [[ $st == running ]] && break
  [[ $st == queued ]] || fail "release $st before it could be observed running; raise DPSS_SMOKE_KILL_D"
  ((i < 600)) || fail "release not picked up by a worker within ~2 minutes"
  sleep 0.2
done
owner=$(psql_db "select coalesce(lease_owner, '') from releases where id = '$release_id'")
[[ -n $owner ]] || fail "running release has no lease_owner"
victim=""
for c in $(cids worker); do
  if [[ ${owner%%:*} == "$("$engine" inspect -f '{{.Config.Hostname}}' "$c")" ]]; then victim=$c; fi
done
[[ -n $victim ]] || fail "no worker container has the hostname of lease_owner '$owner'"
"$engine" kill "$victim" >/dev/null
t_kill=$SECONDS
out=$(release_state) || fail "cannot read the release"
read -r st attempts <<<"$out"
[[ $st == running ]] || fail "release was already '$st' when its worker was killed; raise DPSS_SMOKE_KILL_D"
log "release $release_id running on $owner (container ${victim:0:12}) $((t_kill - t_req))s after the request: killed it"
# The real end first (the database: another worker takes the job once the lease expires), then
# the analyst's view, which shows it at the release's public moment (visible_at, or a step of the
# late schedule after it). That moment follows the padding's modelled run time, which on a loaded
# machine is calibrated slow, so the view's wait is bounded by that moment, not by a constant.
while :; do
  read -r st attempts <<<"$(release_state)"
  [[ $st == succeeded || $st == failed || $st == no_result ]] && break
  ((SECONDS - t_kill < lease_seconds * 3 + 300)) || fail "release still '$st' in the database $((SECONDS - t_kill))s after the kill"
  sleep 0.2
done
shown_in=$(psql_db "select coalesce(greatest(0, ceil(extract(epoch from (visible_at - (now() at time zone 'utc'))))), 0)::int from releases where id = '$release_id'")
log "release ended '$st' in the database $((SECONDS - t_kill))s after the kill; visible_at in ${shown_in}s"
SMOKE_FINISH_TIMEOUT=$((shown_in * 2 + 300)) smoke_py finish-long
read -r st attempts <<<"$(release_state)"
log "release ended '$st' after $attempts attempt(s)"
((attempts >= 2)) || fail "attempts=$attempts: the killed worker did not hold the job"
charges=$(psql_db "select kind || ':' || count(*) from ledger_entries where release_id = '$release_id' group by kind order by kind" | tr '\n' ' ')
[[ $charges == "charge:1 " ]] || fail "ledger entries of the release: '$charges' (want exactly one charge, no refund)"
log "ledger: exactly one charge for the release; $(cids worker | wc -l) worker(s) running now"
"$engine" exec "$(cid api)" dpss audit verify >/dev/null || fail "dpss audit verify failed after the crash"

# ---- the dask profile: a dataset by reference, its passes on the cluster -------------------
phase "dataset by reference on the dask profile (scheduler, 2 dask workers, object store)"
dask_workers=$(cids dask-worker | wc -l)
[[ $dask_workers == 2 ]] || fail "expected 2 running dask-worker containers, found $dask_workers"
ref_n=3000 ref_d=12
# The object store is the deployment's: the rows are written there from inside the stack
# (the api container has s3fs and pyarrow and the stack's credentials), never through the API.
"$engine" exec -e SMOKE_REF_N=$ref_n -e SMOKE_REF_D=$ref_d "$(cid api)" python -c '
import os, random
import pyarrow as pa, pyarrow.parquet as pq, s3fs
n, d = int(os.environ["SMOKE_REF_N"]), int(os.environ["SMOKE_REF_D"])
fs = s3fs.S3FileSystem(client_kwargs={"endpoint_url": os.environ["DPSS_S3_ENDPOINT_URL"]})
fs.mkdir("dpss-smoke")
rng = random.Random(5)
scale = 1.0 / d**0.5
columns = {f"c{j}": [(rng.random() - 0.5) * scale * (3.0 if j < 3 else 1.0) / 3.0 for _ in range(n)] for j in range(d)}
for part in range(2):
    half = {k: v[part * n // 2:(part + 1) * n // 2] for k, v in columns.items()}
    with fs.open(f"dpss-smoke/rows/part-{part}.parquet", "wb") as out:
        pq.write_table(pa.table(half), out)
print(sorted(fs.ls("dpss-smoke/rows")))
' >"$work/ref-objects.log" 2>&1 || { cat "$work/ref-objects.log"; fail "could not write the Parquet objects"; }
scheduler_transitions() {
  "$engine" exec "$(cid api)" python -c '
from distributed import Client
with Client("tcp://dask-scheduler:8786", timeout=60) as client:
    print(client.run_on_scheduler(lambda dask_scheduler: dask_scheduler.transition_counter))
'
}
before=$(scheduler_transitions) || fail "cannot reach the dask scheduler from the api container"
SMOKE_REF_N=$ref_n SMOKE_REF_D=$ref_d SMOKE_REF_URI="s3://dpss-smoke/rows/" smoke_py reference >"$work/ref.out" ||
  fail "the release by reference failed"
cat "$work/ref.out" | head -n -1
after=$(scheduler_transitions) || fail "cannot reach the dask scheduler after the release"
((after > before)) || fail "the scheduler ran no task for the release by reference ($before -> $after transitions)"
log "registration and release ran on the cluster: scheduler transitions $before -> $after"
"$engine" exec "$(cid api)" dpss audit verify >/dev/null || fail "dpss audit verify failed after the release by reference"

phase ""
log "all checks passed"
