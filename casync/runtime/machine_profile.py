"""This machine's calibrated profile, measured once and cached: what ``casync bench`` predicts and plans ``auto`` with.

A short calibration (:func:`measure_machine`: the default calibration's strategies and codecs on fewer, smaller
synthetic tensors, three timed syncs each, every plan on the same actors) fits the Ray runtime's costs on top of the
packaged profile.  The result is cached under a key of the machine (CPU, cores, host, libraries), of where it ran
(embedded Ray, or a cluster and its model), of casync's version and of a hash of the code the measurement runs
through, so that a change to any of them measures again; a cache file that cannot be read is measured again with a
warning, never used silently and never a crash.
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import socket
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ..sim.costmodel import ClusterModel, Profile

#: where the cache lives, when set (else ``$XDG_CACHE_HOME/casync``, else ``~/.cache/casync``)
CACHE_ENV = "CASYNC_CACHE_DIR"
CACHE_FORMAT = 1

#: the bench's calibration: synthetic log-spaced tensors (no model the bench measures), 2 workers, every
#: strategy and codec of ``casync.runtime.calibrate.CALIBRATION_CONFIGS``, this many timed syncs each
QUICK_RECIPE = {"tensors": 16, "smallest": 20_000, "largest": 1_000_000, "workers": 2, "iters": 3,
                "transport": "direct"}

#: what the calibration runs through, hashed into the key: its plans, engine, data plane, ops and fit, and the
#: packaged profile it is fitted against (the runtime's op scales are measured / packaged op times)
CODE_PACKAGES = ("casync.runtime", "casync.engines", "casync.transport", "casync.plan", "casync.sim",
                 "casync.strategies", "casync.primitives")
CODE_FILES = ("schedule.py", "build.py", "data/default_profile.json")


class CalibrationCacheWarning(UserWarning):
    """A cached calibration could not be read: it is measured again."""


@dataclass(frozen=True)
class Calibration:
    """A calibrated profile and where it came from: ``source`` ``"measured"`` (now) or ``"cache"``; ``seconds``
    the calibration took when it was measured, ``made_at`` when (UTC, ISO 8601), ``path`` its cache file, ``load``
    the machine's 1-minute load average as it began (None where unknown): on a shared machine a calibration holds
    for the load it was measured under."""

    profile: Profile
    source: str
    seconds: float
    made_at: str
    path: Path | None
    load: float | None = None

    def describe(self) -> str:
        """What a report says about it."""
        load = "" if self.load is None else f" at load average {self.load:.1f}"
        if self.source == "cache":
            return (f"its Ray runtime calibrated on this machine, from the cache made at {self.made_at}{load} "
                    f"({self.path}; that calibration took {self.seconds:.0f} s)")
        return f"its Ray runtime calibrated on this machine now{load}, in {self.seconds:.0f} s"

    def to_json(self) -> dict[str, Any]:
        return {"source": self.source, "seconds": self.seconds, "made_at": self.made_at, "load": self.load,
                "path": None if self.path is None else str(self.path), "runtime": self.profile.runtime.to_dict()}


def cache_dir() -> Path:
    """``$CASYNC_CACHE_DIR``, else ``$XDG_CACHE_HOME/casync``, else ``~/.cache/casync``."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "casync"


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _machine_id() -> str | None:
    for path in ("/etc/machine-id", "/var/lib/dbus/machine-id"):
        try:
            return Path(path).read_text().strip() or None
        except OSError:
            continue
    return None


def _load() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        return None


def machine_key() -> dict[str, Any]:
    """What makes this machine's calibration this machine's: CPU model and the cores this process may use, host
    name and machine id, OS, and the Python, NumPy, Ray and torch it runs (read without importing them)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"cpu": _cpu_model(), "cores": cores, "host": socket.gethostname(), "machine_id": _machine_id(),
            "system": platform.system(), "arch": platform.machine(), "python": platform.python_version(),
            **{lib: _version(lib) for lib in ("numpy", "ray", "torch")}}


def code_hash() -> str:
    """SHA-256 over the sources of :data:`CODE_PACKAGES` and :data:`CODE_FILES` (paths and contents)."""
    digest = hashlib.sha256()
    roots: list[tuple[str, Path]] = []
    for name in CODE_PACKAGES:
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.submodule_search_locations:
            raise RuntimeError(f"cannot find the package {name} to hash its code")
        roots += [(name, Path(p)) for p in spec.submodule_search_locations]
    base = Path(importlib.util.find_spec("casync").origin).parent
    files = [(f"casync/{rel}", base / rel) for rel in CODE_FILES]
    for name, root in roots:
        files += [(f"{name}/{p.relative_to(root).as_posix()}", p) for p in root.rglob("*")
                  if p.suffix in (".py", ".c", ".json") and "__pycache__" not in p.parts]
    for rel, path in sorted(files):
        digest.update(rel.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def where_key(address: str | None, cluster: ClusterModel | None) -> dict[str, Any]:
    """Where the calibration runs: an embedded Ray (``address`` None) or a cluster, and its model."""
    return {"address": address, "cluster": None if cluster is None else cluster.to_dict()}


def cache_key(address: str | None = None, cluster: ClusterModel | None = None) -> dict[str, Any]:
    """The full key a cached calibration must match to be used."""
    return {"machine": machine_key(), "where": where_key(address, cluster), "casync": _version("casync"),
            "code": code_hash(), "recipe": dict(QUICK_RECIPE)}


def cache_path(key: dict[str, Any], directory: Path | None = None) -> Path:
    """One file per machine and place: a newer casync or recipe replaces the stale entry instead of adding one."""
    ident = json.dumps({"machine": key["machine"], "where": key["where"]}, sort_keys=True)
    return (directory or cache_dir()) / f"calibration-{hashlib.sha256(ident.encode()).hexdigest()[:16]}.json"


def measure_machine(address: str | None = None, cluster: ClusterModel | None = None,
                    progress: bool = False) -> Profile:
    """The short calibration of :data:`QUICK_RECIPE` on this machine (or the cluster at ``address``, its
    workers placed as ``cluster`` says): the packaged profile with the fitted runtime."""
    from .calibrate import calibrate_ray, calibration_plans, calibration_tensors

    r = QUICK_RECIPE
    plans = calibration_plans(workers=r["workers"], tensors=calibration_tensors(r["tensors"], r["smallest"], r["largest"]))
    return calibrate_ray(plans=plans, iters=r["iters"], progress=progress, address=address, cluster=cluster,
                         transport=r["transport"])


def read_cache(path: Path, key: dict[str, Any]) -> tuple[Calibration | None, str]:
    """The calibration cached at ``path`` if it matches ``key``, else ``(None, why)``: a missing file and a stale
    key say so; an unreadable or malformed file also warns (:class:`CalibrationCacheWarning`)."""
    if not path.exists():
        return None, f"no cached calibration at {path}"
    try:
        data = json.loads(path.read_text())
        if not isinstance(data, dict) or data.get("format") != CACHE_FORMAT:
            raise ValueError(f"not a calibration cache of format {CACHE_FORMAT}")
        if data.get("key") != key:
            old = data.get("key") if isinstance(data.get("key"), dict) else {}
            changed = [k for k in key if old.get(k) != key[k]] or ["the key"]
            return None, f"the cached calibration at {path} is stale ({', '.join(changed)} changed)"
        profile = Profile.from_dict(data.get("profile"), source=str(path))
        if profile.runtime is None:
            raise ValueError("its profile has no calibrated runtime")
        seconds, made_at = data.get("seconds"), data.get("made_at")
        if not isinstance(seconds, (int, float)) or isinstance(seconds, bool) or not isinstance(made_at, str):
            raise ValueError("'seconds' or 'made_at' missing or malformed")
    except (OSError, ValueError, TypeError, KeyError) as exc:  # JSONDecodeError and UnicodeDecodeError too
        why = f"the cached calibration at {path} is unreadable ({type(exc).__name__}: {exc})"
        warnings.warn(f"{why}; measuring again", CalibrationCacheWarning, stacklevel=3)
        return None, why
    load = data.get("load")
    load = float(load) if isinstance(load, (int, float)) and not isinstance(load, bool) else None
    return Calibration(profile, "cache", float(seconds), made_at, path, load), "cached"


def write_cache(path: Path, key: dict[str, Any], calibration: Calibration) -> None:
    """Write atomically (a reader sees the old file or the new one, never half of one)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"format": CACHE_FORMAT, "key": key, "made_at": calibration.made_at,
                               "seconds": calibration.seconds, "load": calibration.load,
                               "profile": calibration.profile.to_dict()}, indent=1))
    os.replace(tmp, path)


def machine_calibration(address: str | None = None, cluster: ClusterModel | None = None, *, refresh: bool = False,
                        progress: bool = False, log: Callable[[str], None] | None = None) -> Calibration:
    """This machine's calibrated profile: from the cache where its key matches (unless ``refresh``), else measured
    now by :func:`measure_machine` and cached.  ``log`` hears what happened (a miss, a stale entry, the time)."""
    say = log or (lambda msg: None)
    key = cache_key(address, cluster)
    path = cache_path(key)
    if not refresh:
        cached, why = read_cache(path, key)
        if cached is not None:
            say(f"calibration: from the cache made at {cached.made_at} ({path})")
            return cached
        say(f"calibration: {why}; measuring this machine (about 20 s)")
    started, load = time.perf_counter(), _load()
    profile = measure_machine(address, cluster, progress=progress)
    made = Calibration(profile, "measured", time.perf_counter() - started,
                       time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), path, load)
    try:
        write_cache(path, key, made)
    except OSError as exc:  # an unwritable cache costs the next run a calibration, nothing more
        warnings.warn(f"could not cache the calibration at {path} ({exc})", CalibrationCacheWarning, stacklevel=2)
    say(f"calibration: measured in {made.seconds:.1f} s, cached at {path}")
    return made


__all__ = ["CACHE_ENV", "Calibration", "CalibrationCacheWarning", "QUICK_RECIPE", "cache_dir", "cache_key",
           "cache_path", "code_hash", "machine_calibration", "machine_key", "measure_machine", "read_cache",
           "write_cache"]
