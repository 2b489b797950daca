"""Figures of the loss-curve experiment (matplotlib, PNG): resumed vs uninterrupted training loss, and
from-scratch curves and final held-out loss per rank count. Input: the results of ``run.run`` after a
JSON round trip (dict keys are strings)."""
from __future__ import annotations

from pathlib import Path

FLOOR = 1e-9  # where an exact zero difference is drawn on the log axis
COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"]


def _smooth(xs: list[float], w: int) -> list[float]:
    """Trailing moving average over ``w`` steps (the first points average what exists)."""
    out, acc = [], 0.0
    for i, x in enumerate(xs):
        acc += x
        if i >= w:
            acc -= xs[i - w]
        out.append(acc / min(i + 1, w))
    return out


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def resume_figure(R: dict, path: Path) -> Path:
    """Per loader: training loss after the resume (uninterrupted run and each resumed run), and below it
    the absolute difference per step on a log axis (an exact 0 is drawn at ``FLOOR``)."""
    plt = _plt()
    s = R["settings"]
    k, T, n = s["ckpt_step"], s["steps"], s["ckpt_dp"]
    peers = [p for p in R["peers"].values() if p and "error" not in p]
    fig, axes = plt.subplots(2, len(peers), figsize=(3.6 * len(peers), 6.2), squeeze=False, sharex=True,
                             gridspec_kw={"height_ratios": [3, 2]})
    lo = max(0, k - 20)
    for j, p in enumerate(peers):
        top, bot = axes[0][j], axes[1][j]
        ref = p["scratch"][str(n)]["losses"]
        top.plot(range(lo + 1, T + 1), ref[lo:], color="black", lw=2.2, label=f"uninterrupted ({n} ranks)")
        zero, refused = [], []
        for i, (M, r) in enumerate(sorted(p["resume"].items(), key=lambda kv: int(kv[0]))):
            c = COLORS[i % len(COLORS)]
            if "refused" in r:
                top.plot([], [], color=c, ls=":", label=f"{M} ranks: refused")
                refused.append(M)
                continue
            if r["max_abs_diff"] == 0:
                zero.append(M)
            top.plot(range(k + 1, T + 1), r["losses"], color=c, lw=1.0, ls="--", label=f"resumed on {M}")
            d = [max(abs(a - b), FLOOR) for a, b in zip(ref[k:], r["losses"])]
            bot.plot(range(k + 1, T + 1), d, color=c, lw=1.0, label=f"{M}")
        note = (f"identical on {', '.join(zero)} ranks\n(every difference is 0)" if zero else "") + (
            f"refused on {', '.join(refused)} ranks" if refused else "")
        if note:
            bot.text(0.5, 0.5, note, transform=bot.transAxes, ha="center", va="center", fontsize=8)
        top.axvline(k, color="grey", lw=0.8)
        top.set_title(p["name"])
        top.legend(fontsize=7, loc="upper right")
        bot.set_yscale("log")
        bot.set_ylim(FLOOR / 3, 1.0)
        bot.axhline(FLOOR, color="grey", lw=0.5, ls=":")
        bot.set_xlabel("step")
        if j == 0:
            top.set_ylabel("training loss (nats/token)")
            bot.set_ylabel(f"|resumed - uninterrupted|\n(0 drawn at {FLOOR:g})")
    fig.suptitle(f"Checkpoint at step {k} on {n} ranks, resumed on "
                 f"{', '.join(str(x) for x in s['resume_dps'])} ranks", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def scratch_figure(R: dict, path: Path) -> Path:
    """Per loader: training loss from scratch (moving average over 10 steps) for each rank count; last
    panel: final held-out loss against the rank count, one line per loader."""
    plt = _plt()
    s = R["settings"]
    peers = [p for p in R["peers"].values() if p and "error" not in p]
    fig, axes = plt.subplots(1, len(peers) + 1, figsize=(3.4 * (len(peers) + 1), 3.6), squeeze=False)
    axes = axes[0]
    dps = [str(d) for d in s["scratch_dps"]]
    for j, p in enumerate(peers):
        ax = axes[j]
        for i, D in enumerate(dps):
            lo = p["scratch"][D]["losses"]
            ax.plot(range(1, len(lo) + 1), _smooth(lo, 10), color=COLORS[i % len(COLORS)], lw=1.0, label=f"{D} ranks")
        ax.set_title(p["name"])
        ax.set_xlabel("step")
        tail = [v for D in dps for v in _smooth(p["scratch"][D]["losses"], 10)[len(p["scratch"][D]["losses"]) // 3:]]
        ax.set_ylim(min(tail) - 0.05, max(tail) + 0.05)
        if j == 0:
            ax.set_ylabel("training loss, 10-step mean")
        ax.legend(fontsize=7)
    ax = axes[-1]
    for j, p in enumerate(peers):
        ax.plot([int(D) for D in dps], [p["scratch"][D]["final_heldout"] for D in dps], marker="o",
                color=COLORS[j % len(COLORS)], label=p["name"])
    ax.set_xscale("log", base=2)
    ax.set_xticks([int(D) for D in dps])
    ax.set_xticklabels(dps)
    ax.set_xlabel("data-parallel ranks")
    ax.set_ylabel(f"held-out loss at step {s['steps']}")
    ax.set_title("final held-out loss")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
