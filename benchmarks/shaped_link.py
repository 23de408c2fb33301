"""The 1-bit allreduce on a link shaped like a real one, without touching the machine's own.

    python benchmarks/shaped_link.py [--repeats 5]     (benchmarks/kernels.py runs it too)

Each rate runs in a network namespace of its own (``unshare --user --map-root-user --net``:
no privileges needed where the kernel allows unprivileged user namespaces). Its loopback is
brought up and shaped with a ``tbf`` token bucket (``netem`` is not on these kernels), the two
gloo ranks talk over 127.0.0.1 of that namespace, and the namespace goes away with the
process. Where the namespace, ``ip`` or ``tc`` is not allowed, the rows are skipped with the
reason.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
# (rate, target speed-up over float32 all_reduce)
LINKS = (("10gbit", 1.0), ("1gbit", 4.0))
PORT = 29517


def _burst(rate: str) -> str:
    """A bucket of one millisecond at the rate, and at least one 64 KiB loopback packet."""
    bits_per_second = int(rate.rstrip("gbit")) * 10 ** 9
    return str(max(bits_per_second // 8 // 1000, 2 * 65536))


def _shell(rate: str) -> str:
    return (f"ip link set lo up && tc qdisc add dev lo root tbf rate {rate} burst {_burst(rate)} "
            f"latency 100ms")


def why_not():
    """None where a shaped namespace can be made here, else why not."""
    for tool in ("unshare", "ip", "tc"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed"
    probe = subprocess.run(["unshare", "--user", "--map-root-user", "--net", "sh", "-c",
                            _shell("1gbit")], capture_output=True, text=True)
    if probe.returncode != 0:
        return ("this process may not make a network namespace with a shaped loopback "
                f"({(probe.stderr or probe.stdout).strip()[:200]})")
    return None


def rows(repeats):
    """([row per link], None), or ([], why the rows are skipped)."""
    reason = why_not()
    if reason is not None:
        return [], reason
    found = []
    for rate, target in LINKS:
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "row.json")
            inside = f"{_shell(rate)} && exec {sys.executable} {os.path.join(HERE, 'shaped_link.py')} " \
                     f"--inside {rate} --repeats {repeats} --json {out}"
            result = subprocess.run(["unshare", "--user", "--map-root-user", "--net", "sh", "-c", inside],
                                    capture_output=True, text=True)
            if result.returncode != 0:
                raise RuntimeError(f"the {rate} run failed:\n{result.stderr[-3000:]}")
            with open(out) as f:
                row = json.load(f)
        import kernels
        found.append(kernels.finish_allreduce_row(row, target))
    return found, None


def _inside(rate, repeats, out):
    """In the namespace: both ranks over its loopback, through kernels.py's allreduce row."""
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    sys.path.insert(0, HERE)
    import kernels
    row = kernels.allreduce_row(repeats, init_method=f"tcp://127.0.0.1:{PORT}",
                                link=f"loopback shaped to {rate.replace('gbit', ' Gbit/s')} (tbf)")
    row.pop("timings"), row.pop("speeds")           # computed again outside, with the target
    with open(out, "w") as f:
        json.dump(row, f)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--inside", metavar="RATE", help=argparse.SUPPRESS)
    parser.add_argument("--json", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inside:
        _inside(args.inside, args.repeats, args.json)
        return
    found, reason = rows(args.repeats)
    if reason:
        print(f"skipped: {reason}")
    for row in found:
        ratio = row["speeds"]["plain"]
        print(f"{row['what']}: {row['timings']['compressed']['median_ms']:.1f} ms against "
              f"{row['timings']['plain']['median_ms']:.1f} ms, {ratio['median']:.2f}x "
              f"(middle half {ratio['low']:.2f}-{ratio['high']:.2f}; target {row['target']:.0f}x: {row['met']})")


if __name__ == "__main__":
    main()
