"""The gloo/DDP baseline ranks: they run on the CPU wherever they start, and a rank that fails is reported with
its cause, in the table and on stderr, also without a progress bar."""
from __future__ import annotations

import dataclasses

import pytest

from casync.bench.baselines import RankLauncher, run_baselines
from casync.bench.grid import Grid
from casync.bench.runner import run_bench
from casync.bench.setup import Setup, _free_local_port, local_setup


def _wrapped(script: str, env=lambda r: {}) -> RankLauncher:
    """Ranks on loopback, each started through ``sh -c script`` (which ends with ``exec "$@"`` to run it)."""
    return RankLauncher(master_addr="127.0.0.1", prefix=lambda r: ["sh", "-c", script, "sh"],
                        env=lambda r: {"GLOO_SOCKET_IFNAME": "lo", **env(r)}, port=_free_local_port)


def test_baseline_ranks_run_with_gpus_hidden():
    """PyTorch's powerSGD_hook raises on a CPU bucket wherever CUDA is available (it synchronizes the
    bucket's device as a CUDA one), so the ranks must not see a GPU: a rank that could refuses to start here."""
    script = ('if [ "${CUDA_VISIBLE_DEVICES-unset}" != "" ]; then echo "sees GPUs: ${CUDA_VISIBLE_DEVICES-unset}" >&2; '
              'exit 3; fi; exec "$@"')
    raw = run_baselines(_wrapped(script), "tiny", 2, ["ddp-powersgd-r1"], iters=1, timeout_s=120)
    assert len(raw["ddp-powersgd-r1"]["sync_s"]) == 1 and raw["ddp-powersgd-r1"]["consistent"]


@dataclasses.dataclass(frozen=True)
class _RankOneFails(Setup):
    def launcher(self) -> RankLauncher:
        script = 'if [ "$RANK_UNDER_TEST" = 1 ]; then echo "ValueError: boom in rank 1" >&2; exit 7; fi; exec "$@"'
        return _wrapped(script, env=lambda r: {"RANK_UNDER_TEST": str(r)})


def test_a_failed_rank_is_reported_with_its_cause_without_a_progress_bar(capsys):
    local = local_setup()
    setup = _RankOneFails(**{f.name: getattr(local, f.name) for f in dataclasses.fields(local)})
    grid = Grid(models=("tiny",), workers=(2,), strategies=(), codecs=(), baselines=("gloo-bucket",), hooks=())
    result = run_bench(grid, setup, simulate=False, progress=False, iters=1)
    (row,) = result.rows
    assert "rank 1 exited with 7" in row.error and "ValueError: boom in rank 1" in row.error
    err = capsys.readouterr().err
    assert "baselines on tiny N=2 failed" in err and "ValueError: boom in rank 1" in err


def test_an_auto_hook_variant_needs_the_cluster_it_plans_for():
    """Refused before any rank starts (a rank would otherwise fail deep inside DDP's first iteration)."""
    with pytest.raises(ValueError, match="cluster model"):
        run_baselines(local_setup().launcher(), "tiny", 2, ["ddp-casync:auto:onebit"])
