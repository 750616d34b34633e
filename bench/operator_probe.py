"""`loom operator` in a child process with its handlers timed, for bench/operator_scale.py.

Owns the child (the CLI's own `main`, its output in a log file), one record per handler call
(seconds, Kube API requests by verb, error) sent back over a pipe, the child's memory, and the
per-handler summary of the records; never creates a card or reads the cluster itself.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import inspect
import multiprocessing
import os
import statistics
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from loom_operator.k8s.kube import APPLY, RESOURCES, Kube

PLURALS = {plural for _, plural in RESOURCES.values()} | {"leases", "events"}
ROUNDS = {"_fleet_round": "fleet_round", "_look": "fleet_look", "_reapply": "drift_reapply"}
"""Functions of loom_operator.k8s.card_loop that a card's loop calls once per round (or per look:
the probes, and the round when one is due; or per drift correction), timed as such."""
_TALLY: contextvars.ContextVar[Counter[str] | None] = contextvars.ContextVar("tally", default=None)


def verb(method: str, path: str, content_type: str) -> str:
    if method == "GET":
        return "list" if path.rstrip("/").rsplit("/", 1)[-1] in PLURALS else "get"
    if method == "PATCH":
        return "apply" if content_type == APPLY else "patch"
    return {"POST": "create", "PUT": "update", "DELETE": "delete"}.get(method, method)


class Recorder:
    """In the child: one record per handler call (seconds, requests by verb, error), and the
    operator's Kube client, whose `call` it wraps once to tally requests to the call in hand."""

    def __init__(self) -> None:
        self.lock, self.records = threading.Lock(), list[dict[str, Any]]()
        self.kube: Kube | None = None

    def _found(self, kube: Kube) -> None:
        if self.kube is not None:
            return
        self.kube, inner = kube, kube.call

        def call(method: str, path: str, *args: Any, **kwargs: Any) -> Any:
            if (tally := _TALLY.get()) is not None:
                tally[verb(method, path, kwargs.get("content_type", "application/json"))] += 1
            return inner(method, path, *args, **kwargs)

        kube.call = call  # type: ignore[method-assign]

    @contextlib.contextmanager
    def _record(
        self, handler: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Iterator[None]:
        if (kube := getattr(kwargs.get("memo"), "kube", None)) is not None:
            self._found(kube)
        body = next((a for a in args if hasattr(a, "metadata")), kwargs.get("body"))
        tally: Counter[str] = Counter()
        token, began, error = _TALLY.set(tally), time.monotonic(), ""
        try:
            yield
        except BaseException as exc:
            error = repr(exc)[:300]
            raise
        finally:
            _TALLY.reset(token)
            card, seconds = body and str(body.metadata.name), time.monotonic() - began
            record = {"handler": handler, "card": card, "s": seconds, "requests": dict(tally),
                      "error": error}  # fmt: skip
            with self.lock:
                self.records.append(record)

    def timed(self, handler: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def run_async(*args: Any, **kwargs: Any) -> Any:
                with self._record(handler, args, kwargs):
                    return await fn(*args, **kwargs)

            return run_async

        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            with self._record(handler, args, kwargs):
                return fn(*args, **kwargs)

        return run

    def instrument(self, loops: Any) -> None:
        """Every change handler, and each round of a card's loop (`loops`: the card_loop module;
        a loop runs until stopped: what it does outside its rounds shows only in the client's
        totals)."""
        import kopf

        for name, label in ROUNDS.items():
            if hasattr(loops, name):
                setattr(loops, name, self.timed(label, getattr(loops, name)))
        registry = kopf.get_default_registry()
        for h in registry._changing.get_all_handlers():
            object.__setattr__(h, "fn", self.timed(str(h.id).split("/")[0], h.fn))

    def serve(self, conn: Connection) -> None:
        """Answers each request with the records since the last one and the client's totals."""
        with contextlib.suppress(EOFError):
            while conn.recv():
                with self.lock:
                    batch, self.records = self.records, []
                totals: dict[str, int] = dict(self.kube.requests) if self.kube else {}
                conn.send({"records": batch, "totals": totals})


def operator_main(
    conn: Connection, kubeconfig: str, namespace: str, log: str, flags: tuple[str, ...]
) -> None:
    """The child: `loom operator` with its handlers timed, its output in `log`."""
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    from loom_operator.cli import main
    from loom_operator.k8s import card_loop, handlers

    assert handlers.configure is not None  # the import registers the handlers with kopf
    recorder = Recorder()
    recorder.instrument(card_loop)
    threading.Thread(target=recorder.serve, args=(conn,), daemon=True).start()
    sys.exit(main(["operator", "--kubeconfig", kubeconfig, "--namespace", namespace,
                   "--kv-connector", "tcp", *flags]))  # fmt: skip


class OperatorProcess:
    def __init__(
        self, kubeconfig: Path, namespace: str, log: Path, flags: tuple[str, ...] = ()
    ) -> None:
        # kopf logs in through the kubernetes library, which reads $KUBECONFIG when imported:
        # before `loom operator --kubeconfig` sets it. The child inherits it from here.
        os.environ["KUBECONFIG"] = str(kubeconfig)
        ctx = multiprocessing.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.log, self.records = log, list[dict[str, Any]]()
        args = (child, str(kubeconfig), namespace, str(log), flags)
        self.proc = ctx.Process(target=operator_main, daemon=True, args=args)
        self.proc.start()

    def stats(self) -> dict[str, int]:
        """Collects the new handler records; the client's request totals by method."""
        if not self.proc.is_alive():
            raise RuntimeError(f"the operator exited ({self.proc.exitcode}); see {self.log}")
        self.conn.send("stats")
        if not self.conn.poll(30):
            raise TimeoutError(f"the operator did not report its stats in 30 s; see {self.log}")
        out = self.conn.recv()
        self.records += out["records"]
        return dict(out["totals"])

    def memory_mib(self) -> dict[str, float]:
        """VmRSS (now) and VmHWM (the peak) of the operator process."""
        out = {}
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = round(int(value.split()[0]) / 1024, 1)
        return out

    def stop(self, timeout: float = 20.0) -> float | None:
        """SIGTERM; the seconds it took to exit, or None when it did not exit within `timeout`
        and was killed."""
        t0 = time.monotonic()
        self.proc.terminate()
        self.proc.join(timeout)
        if not self.proc.is_alive():
            return time.monotonic() - t0
        self.proc.kill()
        self.proc.join(10)
        return None


def handler_stats(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    out = {}
    for handler in sorted({r["handler"] for r in records}):
        mine = [r for r in records if r["handler"] == handler]
        s, verbs = sorted(r["s"] for r in mine), Counter[str]()
        for r in mine:
            verbs.update(r["requests"])
        errors = [r["error"] for r in mine if r["error"]]
        out[handler] = {
            "calls": len(mine), "p50_s": round(statistics.median(s), 4),
            "p90_s": round(s[int(0.9 * (len(s) - 1))], 4), "max_s": round(s[-1], 4),
            "requests_per_call": {v: round(n / len(mine), 2) for v, n in sorted(verbs.items())},
            "errors": len(errors), "first_error": errors[0] if errors else None,
        }  # fmt: skip
    return out
