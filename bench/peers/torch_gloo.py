# PyTorch's Gloo collectives between 2 processes on this machine (the peer of bench_multiprocess):
# prints "op bytes seconds" lines, the median of repeated runs, sizes counted as the whole array.
import os, statistics, sys, time
import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def median_seconds(reps, run):
    run()
    times = []
    for _ in range(reps):  # the same count on both processes (as bench_multiprocess)
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def worker(rank, world, port):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    size = 4 << 10
    while size <= 64 << 20:
        count = size // 4
        reps = 200 if size <= 256 << 10 else 40 if size <= 4 << 20 else 8
        x = torch.ones(count)
        parts = [torch.empty(count // world) for _ in range(world)]
        out = torch.empty(count // world)
        ar = median_seconds(reps, lambda: dist.all_reduce(x))
        ag = median_seconds(reps, lambda: dist.all_gather(parts, x[: count // world]))
        # Gloo has no reduce_scatter in torch 1.13: the peer is all_reduce + the rank's slice.
        def rs():
            dist.all_reduce(x)
            out.copy_(x[rank * (count // world):(rank + 1) * (count // world)])
        rsc = median_seconds(reps, rs)
        if rank == 0:
            print(f"all_reduce {size} {ar:.9f}\nall_gather {size} {ag:.9f}\nreduce_scatter {size} {rsc:.9f}", flush=True)
        size *= 4
    dist.destroy_process_group()


if __name__ == "__main__":
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    mp.spawn(worker, args=(2, port), nprocs=2)
