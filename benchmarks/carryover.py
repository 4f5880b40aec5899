"""What ran before each timing of a bench.py run, and the ratio of two implementations compared only
between timings that followed like work.

    python benchmarks/carryover.py results/bench.json                 # fa-sm90 against fa3
    python benchmarks/carryover.py bench.json --impl fa-sm90 --peer cudnn --light fa-sm80,flash

bench.py times each case in rounds, the implementations in another order each round
(bench.round_orders), and reports the median of the rounds. At the card's power limit a timing
reads a few percent faster after a light predecessor (an mma.sync implementation, fa Ampere or
FA2, at about half the tensor-core rate) than after a heavy one, through the warm-up: where the
orders give one implementation more light predecessors than another, the medians carry it
(benchmarks/NOTES.md, session 54). This prints, per case, the medians' ratio (peer's time over
impl's: above 1, impl is faster) beside the ratios of the mean times after light and after heavy
predecessors. bench.py's --settle (on by default since session 55) removes the cause instead: every
timing follows the same load.
"""

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import predecessors, round_orders  # noqa: E402

LIGHT_DEFAULT = "fa-sm80,flash,efficient,math,naive"


def case_key(row: dict) -> tuple:
    return (row["dtype"], row["batch"], row["heads"], row["seqlen"], row["head_dim"], bool(row["causal"]), row["mode"])


def round_predecessors(data: dict) -> list:
    """What ran before each implementation's timing in each round of the run `data` holds."""
    impls = data["meta"].get("impls") or list(dict.fromkeys(r["impl"] for r in data["results"]))
    return predecessors(round_orders(impls, data["meta"]["rounds"]))


def compare(data: dict, impl: str, peer: str, light: set) -> list:
    """Per case with both implementations timed in every round: (case key, the medians' ratio, the
    ratio after light predecessors, after heavy ones; None where either had no such round), each the
    peer's time over impl's."""
    rounds = data["meta"]["rounds"]
    before = round_predecessors(data)
    times = {}
    for row in data["results"]:
        if row.get("round_ms"):
            times.setdefault(case_key(row), {})[row["impl"]] = [float(t) for t in row["round_ms"].split()]
    out = []
    for key, by_impl in times.items():
        a, b = by_impl.get(impl), by_impl.get(peer)
        if not a or not b or len(a) != rounds or len(b) != rounds:
            continue
        ratios = [statistics.median(b) / statistics.median(a)]
        for want_light in (True, False):
            ta = [a[r] for r in range(rounds) if (before[r][impl] in light) == want_light]
            tb = [b[r] for r in range(rounds) if (before[r][peer] in light) == want_light]
            ratios.append(statistics.mean(tb) / statistics.mean(ta) if ta and tb else None)
        out.append((key, *ratios))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("json", type=Path, help="a bench.py results JSON (--suite shapes)")
    p.add_argument("--impl", default="fa-sm90")
    p.add_argument("--peer", default="fa3")
    p.add_argument("--light", default=LIGHT_DEFAULT, help="the implementations counted as light predecessors")
    args = p.parse_args(argv)
    data = json.loads(args.json.read_text())
    light = {i for i in args.light.split(",") if i}
    settle_ms = data.get("meta", {}).get("settle_ms") or 0
    if settle_ms:
        print(f"# this run settled every timing ({settle_ms:g} ms of GEMMs just before it): the predecessors below "
              "ran before that load")
    for r, row in enumerate(round_predecessors(data)):
        print(f"# round {r + 1}: {args.impl} after {row.get(args.impl)}, {args.peer} after {row.get(args.peer)}")
    fmt = lambda x: "-" if x is None else f"{x:.3f}"  # noqa: E731
    print(f"| dtype | shape (B, H, S, D) | causal | mode | {args.peer} / {args.impl}: medians | after light | after heavy |")
    print("|---|---|---|---|---|---|---|")
    for key, med, after_light, after_heavy in compare(data, args.impl, args.peer, light):
        dtype, b, h, s, d, causal, mode = key
        print(f"| {dtype} | ({b}, {h}, {s}, {d}) | {int(causal)} | {mode} | {med:.3f} | {fmt(after_light)} | {fmt(after_heavy)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
