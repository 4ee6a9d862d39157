"""The extreme preset on one real coordinator process (issue 20): its own peak RSS,
its checkpoints and journal per version, and its restart.

``crowdgrad coordinator --job examples/extreme/job.toml`` (2.1 B parameters,
8.6 GB as float32, held in a memory-mapped file beside the store) serves
``--clients`` real ``crowdgrad client`` processes on loopback for ``--seconds``
seconds, then is stopped with SIGTERM and started again on the same store. The
clients are separate processes, so the coordinator's memory is its own (the
simulator's extreme run shares its process with 700 simulated players).

Reported: the time from launch to serving (mapping the model, writing version 0
and the first, whole checkpoint), results merged, the coordinator's peak RSS
(VmHWM) against the model's float32 size and how much of it is the mapped file's
pages (file-backed, reclaimable) against anonymous memory, each checkpoint's
bytes and whether it was whole or incremental, the journal's bytes per merge,
the stop time, and the restart: the time to serving again (the newest
checkpoint read back into the file, the journal replayed on it) and the version
it came back at. It writes about 26 GB under ``--dir`` (the model file, the
store, the journal) and needs about 10 GB of memory; 2 clients on a 2-core
machine keep the coordinator's core busy.

    python benchmarks/extreme_coordinator.py [--clients 2] [--seconds 120]
        [--link lan] [--checkpoint-every N] [--dir DIR] [--keep] [--json]
"""

from __future__ import annotations

import argparse
import http.client
import json
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
JOB = ROOT / "examples" / "extreme" / "job.toml"
URL = re.compile(r"volunteers: http://127\.0\.0\.1:(\d+)/")


class Memory(threading.Thread):
    """Samples a process's VmHWM and its anonymous and file-backed RSS."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.hwm_kb = 0
        self.peak_anon_kb = 0
        self.peak_file_kb = 0
        self._stop = threading.Event()

    def sample(self) -> None:
        try:
            status = Path(f"/proc/{self.pid}/status").read_text()
        except OSError:
            return
        fields = dict(
            line.split(":", 1) for line in status.splitlines() if line.startswith(("VmHWM", "Rss"))
        )
        kb = {k: int(v.split()[0]) for k, v in fields.items()}
        self.hwm_kb = max(self.hwm_kb, kb.get("VmHWM", 0))
        self.peak_anon_kb = max(self.peak_anon_kb, kb.get("RssAnon", 0))
        self.peak_file_kb = max(self.peak_file_kb, kb.get("RssFile", 0))

    def run(self) -> None:
        while not self._stop.wait(0.2):
            self.sample()

    def stop(self) -> None:
        self._stop.set()


def status(port: int) -> dict[str, Any] | None:
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5.0)
        conn.request("GET", "/api/status")
        body = conn.getresponse().read()
        conn.close()
        return json.loads(body)
    except (OSError, ValueError, http.client.HTTPException):
        return None


def start(
    store: Path, link: str, log: Path, every: int | None = None
) -> tuple[subprocess.Popen, int, float, Memory]:
    """Launch the coordinator; returns it, its port, seconds to serving, its sampler."""
    cmd = [sys.executable, "-m", "crowdgrad", "coordinator", "--job", str(JOB),
           "--store", str(store), "--port", "0", "--link", link, "--keep-running"]  # fmt: skip
    if every is not None:
        cmd += ["--checkpoint-every", str(every)]
    t0 = time.monotonic()
    out = open(log, "a")  # noqa: SIM115 - the process writes it until it exits
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=out, text=True)
    mem = Memory(proc.pid)
    mem.start()
    port = None
    assert proc.stdout is not None
    for line in proc.stdout:
        out.write(line)
        if m := URL.search(line):
            port = int(m.group(1))
            break
    if port is None:
        raise RuntimeError(f"the coordinator exited before serving; see {log}")
    threading.Thread(target=lambda: [out.write(x) for x in proc.stdout], daemon=True).start()
    while status(port) is None:
        time.sleep(0.1)
    return proc, port, time.monotonic() - t0, mem


def stop(proc: subprocess.Popen, mem: Memory) -> float:
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    proc.wait(1800)
    mem.sample()
    mem.stop()
    return time.monotonic() - t0


def store_figures(store: Path) -> dict[str, Any]:
    with sqlite3.connect(f"file:{store}?mode=ro", uri=True) as c:
        rows = c.execute("SELECT version, nbytes, manifest FROM checkpoints ORDER BY version")
        checkpoints = [
            {"version": v, "bytes": n, "base": json.loads(man).get("base")} for v, n, man in rows
        ]
    journal = Path(f"{store}.journal")
    entries, logged = 0, 0
    if journal.exists():
        with sqlite3.connect(f"file:{journal}?mode=ro", uri=True) as c:
            entries, logged = c.execute("SELECT count(*), sum(length(data)) FROM deltas").fetchone()
    return {"checkpoints": checkpoints, "journal_entries": entries, "journal_bytes": logged or 0}


def run(clients: int, seconds: float, link: str, work: Path, every: int | None) -> dict[str, Any]:
    store, log = work / "job.db", work / "coordinator.log"
    proc, port, ready_s, mem = start(store, link, log, every)
    st0 = status(port) or {}
    url = f"ws://127.0.0.1:{port}/ws"
    crowd = [
        subprocess.Popen(
            [sys.executable, "-m", "crowdgrad", "client", url, "-q", "--name", f"c{i}"],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for i in range(clients)
    ]
    writes: dict[int, dict[str, Any]] = {}  # each checkpoint the status showed
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(0.5)
        ck = (status(port) or {}).get("checkpoints") or {}
        if ck.get("last") is not None and ck.get("last_seconds") is not None:
            writes[ck["last"]] = {"seconds": round(ck["last_seconds"], 2),
                                  "bytes": ck["last_bytes"], "base": ck["last_base"]}  # fmt: skip
    st = status(port) or {}
    for c in crowd:
        c.terminate()
    for c in crowd:
        c.wait(60)
    stop_s = stop(proc, mem)
    figures = store_figures(store)
    proc2, port2, restart_s, mem2 = start(store, link, log)
    st2 = status(port2) or {}
    stop(proc2, mem2)
    model_bytes = 4 * 2_148_237_322
    merged = int(st.get("accepted_results", 0))
    first = figures["checkpoints"][0] if figures["checkpoints"] else {}
    return {
        "clients": clients,
        "seconds": seconds,
        "link": link,
        "model_bytes": model_bytes,
        "start_to_serving_s": round(ready_s, 1),
        "version_at_start": st0.get("version"),
        "results_merged": merged,
        "results_per_s": round(merged / seconds, 2),
        "version_at_stop": st.get("version"),
        "peak_rss_bytes": mem.hwm_kb * 1024,
        "peak_rss_x_model": round(mem.hwm_kb * 1024 / model_bytes, 3),
        "peak_anon_bytes": mem.peak_anon_kb * 1024,
        "peak_file_bytes": mem.peak_file_kb * 1024,
        "last_checkpoint": st.get("checkpoints"),
        "checkpoint_every": every,
        "checkpoint_writes": [{"version": v, **w} for v, w in sorted(writes.items())],
        "stop_s": round(stop_s, 1),
        "checkpoints": figures["checkpoints"],
        "first_checkpoint_bytes": first.get("bytes"),
        "journal_entries_left": figures["journal_entries"],
        "journal_bytes_per_merge": (
            round(figures["journal_bytes"] / figures["journal_entries"])
            if figures["journal_entries"]
            else None
        ),
        "restart_to_serving_s": round(restart_s, 1),
        "restart": {
            "version": st2.get("version"),
            "restored_from": (st2.get("checkpoints") or {}).get("restored_from"),
            "journal": (st2.get("checkpoints") or {}).get("journal"),
            "peak_rss_x_model": round(mem2.hwm_kb * 1024 / model_bytes, 3),
        },
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=2, help="client processes (default 2)")
    ap.add_argument("--seconds", type=float, default=120.0, help="serving time (default 120)")
    ap.add_argument("--link", default="lan", help="link profile (default lan: most merges)")
    ap.add_argument("--checkpoint-every", type=int, default=None, metavar="N",
                    help="a checkpoint every N versions (default: the job's, 2500)")  # fmt: skip
    ap.add_argument("--dir", type=Path, default=None, help="work dir (default: a temp dir)")
    ap.add_argument("--keep", action="store_true", help="keep the work dir")
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    a = ap.parse_args()
    if a.clients < 1 or a.seconds <= 0:
        ap.error("--clients must be >= 1 and --seconds > 0")
    if a.checkpoint_every is not None and a.checkpoint_every < 1:
        ap.error("--checkpoint-every must be >= 1")
    work = Path(tempfile.mkdtemp(prefix="crowdgrad-extreme-", dir=a.dir))
    try:
        if shutil.disk_usage(work).free < 30e9:
            ap.error(f"{work}: needs about 30 GB free")
        out = run(a.clients, a.seconds, a.link, work, a.checkpoint_every)
    finally:
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
    if a.json:
        print(json.dumps(out, indent=2))
        return
    gb = 1e9
    print(f"extreme on one coordinator, {a.clients} clients on {a.link}, {a.seconds:.0f} s")
    print(f"  start to serving   {out['start_to_serving_s']} s (map, v0, first checkpoint)")
    print(f"  results merged     {out['results_merged']} ({out['results_per_s']}/s)")
    print(f"  peak RSS           {out['peak_rss_bytes'] / gb:.2f} GB = "
          f"{out['peak_rss_x_model']}x the model (anon {out['peak_anon_bytes'] / gb:.2f} GB, "
          f"file {out['peak_file_bytes'] / gb:.2f} GB)")  # fmt: skip
    for c in out["checkpoint_writes"]:
        kind = "whole" if c["base"] is None else f"patch on v{c['base']}"
        print(f"  checkpoint v{c['version']:<8} {c['bytes'] / 1e6:10.1f} MB in "
              f"{c['seconds']:6.2f} s  {kind}")  # fmt: skip
    print(f"  journal            {out['journal_bytes_per_merge']} bytes per merge")
    print(f"  stop               {out['stop_s']} s")
    back = out["restart"]["version"]
    print(f"  restart to serving {out['restart_to_serving_s']} s, back at v{back}")


if __name__ == "__main__":
    main()
