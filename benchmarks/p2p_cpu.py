"""CPU per message between two processes: a gloo ``isend``/``irecv`` pair against casync's TCP socket channel.

    python benchmarks/p2p_cpu.py [--sizes 50000,800000] [--messages 400] [--out benchmarks/results/p2p_cpu]

Between nodes the data plane sends each payload as one message to one peer.  Two processes on loopback
stream ``--messages`` messages of each size one way; each process's CPU (user + system, all its threads:
gloo's, the socket reader's) is read around the stream, and the report gives both ends' CPU per message and
the wall time per message.  The TCP side is ``casync.transport.sockets.SocketChannel`` over TCP, as RayEngine's
``transport="tcp"`` uses it between nodes; the gloo side is the process group ``transport="direct"`` uses there.
"""
from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from casync.table import markdown_table  # noqa: E402
from result_files import write_results  # noqa: E402


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _gloo_end(rank: int, size: int, count: int, port: int, out) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    buf = torch.zeros(size // 4)
    dist.barrier()
    cpu0, t0 = _cpu(), time.perf_counter()
    for i in range(count):
        if rank == 0:
            dist.isend(buf, 1, tag=i % 7).wait()
        else:
            dist.irecv(buf, 0, tag=i % 7).wait()
    dist.barrier()
    out.put((rank, _cpu() - cpu0, time.perf_counter() - t0))
    dist.destroy_process_group()


def _tcp_end(rank: int, size: int, count: int, up, down, out) -> None:
    from casync.transport.sockets import SocketChannel

    me, peer = f"worker:{rank}", f"worker:{1 - rank}"
    channel = SocketChannel(me, [peer], "", 60.0, host="127.0.0.1")
    up.put((me, channel.address))  # the parent hands every end both addresses, as RayEngine's driver does
    channel.connect(down.get(timeout=60))
    buf = np.zeros(size, np.uint8)
    ready = np.zeros(1, np.uint8)
    if rank == 0:  # a first message each way, so both ends start timing with the connection up
        channel.isend(ready, peer, 0).wait()
    else:
        channel.irecv(ready, peer, 0).wait()
    cpu0, t0 = _cpu(), time.perf_counter()
    for i in range(count):
        if rank == 0:
            channel.isend(buf, peer, 1 + i % 7).wait()
        else:
            channel.irecv(buf, peer, 1 + i % 7).wait()
    if rank == 1:
        channel.isend(ready, peer, 99).wait()
    else:
        channel.irecv(ready, peer, 99).wait()
    out.put((rank, _cpu() - cpu0, time.perf_counter() - t0))
    channel.close()


def measure(size: int, count: int, transport: str, port: int) -> dict[str, float]:
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    if transport == "gloo":
        procs = [ctx.Process(target=_gloo_end, args=(r, size, count, port, out)) for r in (0, 1)]
    else:
        up, downs = ctx.Queue(), [ctx.Queue(), ctx.Queue()]
        procs = [ctx.Process(target=_tcp_end, args=(r, size, count, up, downs[r], out)) for r in (0, 1)]
    for p in procs:
        p.start()
    if transport == "tcp":
        table = dict(up.get(timeout=120) for _ in procs)
        for down in downs:
            down.put(table)
    results = sorted(out.get(timeout=300) for _ in procs)
    for p in procs:
        p.join(60)
    cpu = sum(r[1] for r in results)
    wall = max(r[2] for r in results)
    return {"bytes": size, "transport": transport, "messages": count, "cpu_us_per_message": cpu / count * 1e6,
            "sender_cpu_us": results[0][1] / count * 1e6, "receiver_cpu_us": results[1][1] / count * 1e6,
            "wall_us_per_message": wall / count * 1e6}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="50000,800000", help="message sizes in bytes, comma-separated")
    p.add_argument("--messages", type=int, default=400)
    p.add_argument("--out", default="benchmarks/results/p2p_cpu")
    args = p.parse_args()
    started = time.time()
    rows = []
    for i, size in enumerate(int(s) for s in args.sizes.split(",")):
        for transport in ("gloo", "tcp"):
            rows.append(measure(size, args.messages, transport, port=29600 + 2 * i))
            print(rows[-1], flush=True)
    table = markdown_table(["bytes", "transport", "CPU µs per message (both ends)", "sender", "receiver",
                            "wall µs per message"],
                           [[r["bytes"], r["transport"], f"{r['cpu_us_per_message']:.1f}", f"{r['sender_cpu_us']:.1f}",
                             f"{r['receiver_cpu_us']:.1f}", f"{r['wall_us_per_message']:.1f}"] for r in rows])
    text = (f"# CPU per message: gloo isend/irecv against TCP sockets\n\nGenerated "
            f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(started))} by\n\n```\npython benchmarks/p2p_cpu.py "
            f"--sizes {args.sizes} --messages {args.messages} --out {args.out}\n```\n\n"
            f"Two processes on loopback, {args.messages} messages one way per row; CPU = user + system time of "
            f"each process over the stream, all threads.\n\n{table}\n")
    print(f"wrote {write_results(args.out, 'p2p_cpu', text, rows)}")


if __name__ == "__main__":
    main()
