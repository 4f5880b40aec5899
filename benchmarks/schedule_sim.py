"""How long the causal forward's persistent CTAs idle at the end, for a tile order (no GPU needed).

    python benchmarks/schedule_sim.py

Each of 132 CTAs (an H100's SMs) takes the next query tile of the order as soon as it is free
(sm90/tile_scheduler.h: dynamic scheduling); a tile costs its key tiles plus `overhead` key tiles'
worth of per-tile work. Printed: the simulated time over the ideal one (all work spread evenly),
for sections of 1 head (one head's query tiles after the other's, longest first) and of 2 … 64
heads (the sections' last query tiles first, then their second-to-last, …), and for the section
the scheduler chooses (K and V of the section within 32 MB). L2 effects are not modelled.
"""

import argparse
import heapq

L2_BUDGET = 32 << 20


def makespan(order, cost, ctas):
    free = [(0.0, c) for c in range(ctas)]
    for tile in order:
        t, c = heapq.heappop(free)
        heapq.heappush(free, (t + cost(tile), c))
    return max(t for t, _ in free)


def section_order(units, m_blocks, section):
    """(m_block, unit) in the order of tile_scheduler.h's Sections with longest first."""
    order = []
    for first in range(0, units, section):
        width = min(section, units - first)
        for rank in range(m_blocks):
            order.extend((m_blocks - 1 - rank, first + u) for u in range(width))
    return order


def chosen_section(units, kv_bytes_per_head):
    section = 1
    while 2 * section <= units and 2 * section * kv_bytes_per_head <= L2_BUDGET:
        section *= 2
    return section


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ctas", type=int, default=132)
    p.add_argument("--overhead", type=float, default=0.5, help="per-tile work in key tiles")
    args = p.parse_args()
    sections = [1, 2, 4, 8, 16, 32, 64]
    print("| (B, H, S, D) | tile | " + " | ".join(f"{s} heads" for s in sections) + " | chosen |")
    print("|---|---|" + "---|" * (len(sections) + 1))
    for b, h, s, d, bm, bn in [(16, 16, 2048, 128, 128, 128), (8, 16, 4096, 128, 128, 128),
                               (4, 16, 8192, 128, 128, 128), (2, 16, 16384, 128, 128, 128),
                               (2, 64, 4096, 128, 128, 128), (4, 64, 8192, 128, 128, 128),
                               (1, 64, 1024, 128, 128, 128), (16, 16, 2048, 64, 192, 128),
                               (4, 16, 4096, 256, 128, 80)]:
        m_blocks, units = -(-s // bm), b * h

        def cost(tile, m_blocks=m_blocks, bm=bm, bn=bn, s=s):
            rows_end = min((tile[0] + 1) * bm, s)
            return -(-rows_end // bn) + args.overhead

        ideal = sum(cost((m, 0)) for m in range(m_blocks)) * units / args.ctas
        cells = [makespan(section_order(units, m_blocks, sec), cost, args.ctas) / ideal for sec in sections]
        chosen = chosen_section(units, 2 * s * d * 2)
        chosen_ratio = makespan(section_order(units, m_blocks, chosen), cost, args.ctas) / ideal
        print(f"| ({b}, {h}, {s}, {d}) | {bm}×{bn} | " + " | ".join(f"{c:.3f}" for c in cells)
              + f" | {chosen}: {chosen_ratio:.3f} |")


if __name__ == "__main__":
    main()
