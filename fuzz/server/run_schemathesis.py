"""Fuzz the HTTP server with schemathesis against its own OpenAPI document (GET /openapi.json).

Writes a tiny random model (the test suite's write_tiny_gguf), starts `python -m bonsai_runner.server`
on it on 127.0.0.1 (a free port; nothing else is contacted), runs `schemathesis run` with the checks
  not_a_server_error          no 5xx, ever (the server was started without fault injection),
  status_code_conformance     every status is one the document declares,
  content_type_conformance    every Content-Type is one the document declares,
  response_schema_conformance every JSON body matches the declared schema,
over every route, then prints how many cases were generated and sent, and every failure. Exit
status 0 when there were >= --min-cases cases and no failure, 1 otherwise.

    PYTHONPATH=python python3 fuzz/server/run_schemathesis.py                   # >= 2,000 cases
    PYTHONPATH=python python3 fuzz/server/run_schemathesis.py --smoke           # ~100 cases, < 1 min
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHECKS = "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_model(path: str) -> None:
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    from test_llama_api_e2e import write_tiny_gguf

    write_tiny_gguf(path)


def start_server(model: str, port: int, log) -> subprocess.Popen:
    # The source tree only when no bonsai_runner is importable otherwise: PYTHONPATH entries come
    # before site-packages, so adding it would hide an installed package (CI's virtual environment)
    # behind a checkout without its native module.
    env = dict(os.environ)
    if importlib.util.find_spec("bonsai_runner") is None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.environ.get("PYTHONPATH"), os.path.join(ROOT, "python")]))
    proc = subprocess.Popen([sys.executable, "-m", "bonsai_runner.server", "--model", model, "--host", "127.0.0.1",
                             "--port", str(port), "--parallel", "4", "--ctx-size", "256", "--threads", "1",
                             "--queue-limit", "64"], stdout=log, stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + 60
    while True:
        if proc.poll() is not None:
            log.flush()
            with open(log.name, "rb") as f:
                tail = f.read()[-2000:].decode("utf-8", "replace")
            raise SystemExit(f"fuzz: the server exited with status {proc.returncode} at start:\n{tail}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                return proc
        except OSError:
            if time.monotonic() > deadline:
                proc.kill()
                raise SystemExit("fuzz: the server did not answer /health within 60 s")
            time.sleep(0.2)


def count_cases(ndjson_path: str) -> tuple[int, list[str]]:
    """(cases sent, failure descriptions) from schemathesis' NDJSON event stream."""
    cases = 0
    failures: list[str] = []
    with open(ndjson_path, encoding="utf-8") as f:
        for line in f:
            event = json.loads(line)
            (kind, body), = event.items() if len(event) == 1 else [(None, event)]
            if kind == "ScenarioFinished":
                recorder = body.get("recorder", {})
                cases += len(recorder.get("cases", {}))
                for check_list in recorder.get("checks", {}).values():
                    for check in check_list:
                        if str(check.get("status")).lower() == "failure":
                            failures.append(f"{recorder.get('label')}: {check.get('name')}: "
                                            f"{(check.get('failure_info') or {}).get('failure', '')}"[:500])
            elif kind in ("NonFatalError", "FatalError"):
                failures.append(f"{body.get('label', '')}: schemathesis {kind}: {body.get('value')}"[:500])
    return cases, failures


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smoke", action="store_true", help="a short run: 20 cases per operation (~100 in all)")
    p.add_argument("--max-examples", type=int, default=None, help="cases per operation and phase (default 1000)")
    p.add_argument("--min-cases", type=int, default=None, help="fail if fewer cases ran (default 2000; smoke 50)")
    p.add_argument("--seed", type=int, default=13)
    p.add_argument("--keep", action="store_true", help="keep the work directory (model, logs, reports)")
    args = p.parse_args(argv)
    if shutil.which("schemathesis") is None:
        raise SystemExit("fuzz: schemathesis is not installed (pip install schemathesis)")
    max_examples = args.max_examples or (20 if args.smoke else 1000)
    min_cases = args.min_cases if args.min_cases is not None else (50 if args.smoke else 2000)
    work = tempfile.mkdtemp(prefix="bonsai-fuzz-")
    model = os.path.join(work, "tiny.gguf")
    write_model(model)
    port = free_port()
    log_path = os.path.join(work, "server.log")
    with open(log_path, "wb") as log:
        server = start_server(model, port, log)
        try:
            ndjson = os.path.join(work, "events.ndjson")
            cmd = ["schemathesis", "run", f"http://127.0.0.1:{port}/openapi.json", "--checks", CHECKS,
                   "--max-examples", str(max_examples), "--seed", str(args.seed), "--workers", "1",
                   "--request-timeout", "60", "--suppress-health-check", "all", "--continue-on-failure",
                   "--report", "ndjson", "--report-ndjson-path", ndjson]
            t0 = time.monotonic()
            run = subprocess.run(cmd, capture_output=True, text=True)
            wall = time.monotonic() - t0
        finally:
            server.terminate()
            try:
                server.wait(30)
            except subprocess.TimeoutExpired:
                server.kill()
    cases, failures = count_cases(ndjson)
    tail = "\n".join(run.stdout.strip().splitlines()[-25:])
    print(tail)
    print(f"fuzz: schemathesis sent {cases} generated cases to the server in {wall:.0f} s "
          f"(checks {CHECKS}); {len(failures)} failed checks")
    for f in failures[:50]:
        print(f"  FAIL {f}")
    ok = run.returncode == 0 and not failures and cases >= min_cases
    if cases < min_cases:
        print(f"fuzz: only {cases} cases ran, fewer than {min_cases}")
    if args.keep or not ok:
        print(f"fuzz: work directory kept: {work} (server.log, events.ndjson)")
    else:
        shutil.rmtree(work, ignore_errors=True)
    print("fuzz: " + ("PASS" if ok else "FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
