#!/usr/bin/env python3
"""Asks every target (`IP PORT` per line of a file) for `GET /` over HTTP/1.0, many at once, in sweeps
until one whole sweep finds every target answering with a status line; prints the seconds from the
start until that sweep began, and the sweeps' count. bench/local-scale/run runs it in the client's
network namespace. A target answers when it sends `HTTP/1.x 200` within --timeout seconds.

  probe.py TARGETS [--timeout 1] [--concurrency 400] [--give-up 900] [--since EPOCH]

--since: count from this moment (seconds since the epoch, e.g. when the Services were created)
rather than from the start. Exit status 1 if not every target answered within --give-up seconds.
"""
import argparse
import asyncio
import sys
import time


async def answers(ip, port, timeout):
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(ip, int(port)), timeout)
    except (OSError, asyncio.TimeoutError):
        return False
    try:
        writer.write(b"GET / HTTP/1.0\r\nHost: probe\r\n\r\n")
        line = await asyncio.wait_for(reader.readline(), timeout)
        return line.startswith(b"HTTP/1.") and line.split()[1:2] == [b"200"]
    except (OSError, asyncio.TimeoutError, IndexError):
        return False
    finally:
        writer.close()


async def sweep(targets, timeout, concurrency):
    """The targets that did not answer."""
    slots = asyncio.Semaphore(concurrency)

    async def one(target):
        async with slots:
            return target, await answers(*target, timeout)

    results = await asyncio.gather(*(one(t) for t in targets))
    return [t for t, ok in results if not ok]


async def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("targets")
    parser.add_argument("--timeout", type=float, default=1.0)
    parser.add_argument("--concurrency", type=int, default=400)
    parser.add_argument("--give-up", type=float, default=900.0)
    parser.add_argument("--since", type=float)
    args = parser.parse_args()
    targets = [tuple(line.split()) for line in open(args.targets) if line.strip()]
    start = args.since if args.since is not None else time.time()
    sweeps = 0
    while True:
        began = time.time()
        failing = await sweep(targets, args.timeout, args.concurrency)
        sweeps += 1
        if not failing:
            print(f"{began - start:.1f} {sweeps}")
            return 0
        if time.time() - start > args.give_up:
            print(f"probe: {len(failing)} of {len(targets)} targets still do not answer after "
                  f"{args.give_up:.0f} s, e.g. {' '.join(':'.join(t) for t in failing[:5])}", file=sys.stderr)
            return 1
        await asyncio.sleep(0.5)


sys.exit(asyncio.run(main()))
