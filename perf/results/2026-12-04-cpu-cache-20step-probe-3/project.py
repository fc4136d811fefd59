"""Table of the probe's JSONs (measured) with the H200 projections (projected), as in the report.

    .venv/bin/python perf/results/2026-12-04-cpu-cache-20step-probe-3/project.py [NAME ...]

Measured (tiny PixArt, CPU): PSNR/SSIM vs lossless, and per request the steps of each kind:
  full_compute (both rows, all blocks), full_reuse (both rows, middle blocks reused),
  cfg_compute (text row only, all blocks), cfg_reuse (text row only, middle blocks reused).
Work (brief's definition, blocks run fraction x rows computed / 2), per step kind, averaged:
  tiny (8 blocks, F2B1: a reused step runs 3/8) and PixArt-Sigma's 28 blocks (3/28).
Projected H200 PixArt-Sigma 1024px speed-ups vs lossless (step cost in units of a lossless step):
  solo: 1 - 0.753 r (docs/cache.md fit, r = block-reuse fraction) minus 0.753 (1 - c1) q, q =
        cfg_compute fraction, c1 = a 1-row forward / a 2-row forward: 38.2/49.3 = 0.775 (DESIGN.md
        raw diffusers B1/B2) and 46/47 = 0.98 (DESIGN.md 2026-12-01 eager 1 vs 2 rows); the
        text-row-only saving on block-reused steps is counted as 0 solo.
  saturated: 1 - 0.741 r (docs/cache.md: 2.25x at 75 % reused, 8 clients) with rows linear at
        1024px (8 rows 146 ms, 16 rows 289 ms): hi = a text-row-only step costs half its kind
        (cfg_compute 0.5, cfg_reuse 0.13); lo = only the middle blocks' part halves
        (cfg_compute 0.259 + 0.741 / 2 = 0.63, cfg_reuse 0.259).
"""
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOLO_A, SAT_A = 0.753, 0.741
C1 = (0.775, 0.98)


def project(k: dict, steps: float) -> dict:
    fc, fr, cc, cr = (k[x] / steps for x in ("full_compute", "full_reuse", "cfg_compute", "cfg_reuse"))
    r = fr + cr
    solo = {c1: 1 / (1 - SOLO_A * r - SOLO_A * (1 - c1) * cc) for c1 in C1}
    e = 1 - SAT_A
    sat_hi = 1 / (fc + fr * e + cc * 0.5 + cr * e * 0.5)
    sat_lo = 1 / (fc + fr * e + cc * (e + SAT_A / 2) + cr * e)
    return {
        "r": r, "cfg": cc + cr, "rows_saved": (cc + cr) / 2,
        "work8": fc + fr * 3 / 8 + cc * 0.5 + cr * 3 / 16,
        "work28": fc + fr * 3 / 28 + cc * 0.5 + cr * 3 / 56,
        "solo_lo": solo[0.98], "solo_hi": solo[0.775], "sat_lo": sat_lo, "sat_hi": sat_hi,
    }


def rows(name: str):
    record = json.loads((HERE / f"{name}.json").read_text())
    probe = record.get("cfg_probe", {}).get("tiers", {})
    for tier, res in record["tiers"].items():
        if tier == "lossless":
            continue
        k = probe.get(tier, {}).get("steps_by_kind_mean")
        if k is None:
            continue
        p = project(k, res["steps"])
        yield name, tier, res, p


def main() -> None:
    names = sys.argv[1:] or sorted(p.stem for p in HERE.glob("*.json"))
    print("| run | tier | thr | blocks reused | neg. rows dropped (steps) | PSNR mean (min) | SSIM mean (min) "
          "| work 8 / 28 blocks | H200 solo (c1 0.98 / 0.775) | H200 saturated (lo / hi) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name in names:
        for name_, tier, res, p in rows(name):
            print(f"| {name_} | {tier} | {res['threshold']} | {p['r']:.1%} | {p['rows_saved']:.1%} ({p['cfg']:.0%}) "
                  f"| {res['psnr_db_mean']:.2f} ({res['psnr_db_min']:.2f}) | {res['ssim_mean']:.4f} ({res['ssim_min']:.4f}) "
                  f"| {p['work8']:.3f} / {p['work28']:.3f} | {p['solo_lo']:.2f}x / {p['solo_hi']:.2f}x "
                  f"| {p['sat_lo']:.2f}x / {p['sat_hi']:.2f}x |")


if __name__ == "__main__":
    main()
