"""Markdown of the loss-curve experiment (and its figures, ``plot``), written into docs/loss-curves.md
between the ``loss-curves`` markers; the text outside the markers is kept."""
from __future__ import annotations

import json
from pathlib import Path

BEGIN = "<!-- loss-curves:begin (written by `python -m benchmarks --only loss`) -->"
END = "<!-- loss-curves:end -->"


def _g(x) -> str:
    """A difference: exact 0 shown as 0, else 3 significant digits."""
    return "0" if x == 0 else f"{x:.3g}"


def _setup(R: dict) -> list[str]:
    s, mc, mach = R["settings"], R["settings"]["model"], R["machine"]
    g0, g1 = R.get("git_before", {}), R.get("git_after", {})
    st = g0.get("status") or []
    core_paths = [x for x in st if x[3:].startswith(("zephon/", "adapters/"))]
    shown = core_paths or st
    tree = "clean working tree" if not st else (
        f"uncommitted changes in {len(st)} paths (`git status --short`), {len(core_paths)} of them under zephon/ or "
        "adapters/: " + ", ".join(f"`{x.strip()}`" for x in shown[:12]) + (" ..." if len(shown) > 12 else ""))
    moved = "" if g1.get("head") in (None, g0.get("head")) and g1.get("status") == g0.get("status") else (
        f" (at the end: HEAD {str(g1.get('head'))[:10]}, {len(g1.get('status') or [])} uncommitted paths: "
        "the tree changed during the run)")
    v = mach.get("versions", {})
    vers = ", ".join(f"{k} {v[k]}" for k in ("torch", "mosaicml-streaming", "megatron-energon", "torchtitan",
                                             "datasets") if v.get(k))
    tokens = s["rows"] * mc["seq_len"]
    times = ", ".join(f"{n} {p['wall_seconds'] / 60:.1f}" for n, p in R["peers"].items()
                      if p and p.get("wall_seconds")) + (f", DDP check {R['ddp_seconds'] / 60:.1f}"
                                                         if R.get("ddp_seconds") else "")
    seen = {"start": R.get("core_before")}
    seen.update({f"{n} child": p.get("core") for n, p in R["peers"].items() if p and "error" not in p})
    seen.update({f"DDP {n} on {w}": r.get("core") for n, by in (R.get("ddp") or {}).items() for w, r in by.items()})
    seen["end"] = R.get("core_after")
    seen = {k: v for k, v in seen.items() if v}
    if len(set(seen.values())) == 1:
        one = next(iter(seen.values()))
        core = f" The core and adapter sources (zephon/, adapters/) were the same in every process (digest `{one}`)."
    else:
        core = (" **The core and adapter sources changed during the run** (another engineer's work): the processes "
                "imported different code; digests of zephon/ + adapters/ sources: "
                + ", ".join(f"{k} `{v}`" for k, v in seen.items()) + ".")
    return [
        f"Run {mach['date']} on {mach['nproc']} vCPUs ({mach['cpu']}), "
        f"{'quick mode' if R['quick'] else 'full run'}, {R['seconds'] / 60:.1f} minutes; load average (1 min) "
        f"before / after {mach['load_before']:.2f} / {R['load_after']:.2f}. Code: HEAD `{g0.get('head')}`, "
        f"{tree}{moved}.{core if seen else ''} Python {v.get('python')}; {vers}."
        + (f" Minutes per loader (child process, {R.get('jobs', 2)} at a time): {times}." if times else ""),
        "",
        f"Model: decoder-only transformer, {mc['layers']} layers, width {mc['d_model']}, {mc['heads']} heads, "
        f"vocabulary {mc['vocab']} (byte-level BPE trained on the demo corpus), tied embeddings, "
        f"{R.get('params', '?')} parameters; AdamW (lr {mc['lr']}, {mc['warmup']} warm-up steps, cosine to "
        f"lr/10 at step {s['steps']}), clip 1.0, fp32 on CPU, one thread, deterministic kernels. Global batch "
        f"{s['rows']} rows x {mc['seq_len']} tokens ({tokens:,} tokens per step), {s['steps']} steps; training "
        f"text: {R.get('train_docs', '?')} documents of the demo corpus (3 of its 4 shards of each dataset); "
        f"held-out: {s['heldout_rows']} rows of {mc['seq_len']} tokens from the 4th shards. Zephon: "
        f"canonical_replicas={s['replicas']}, chunk_size={s['chunk_size']}.",
    ]


def _ddp(R: dict) -> list[str]:
    if not R.get("ddp"):
        return []
    out = ["### Is the simulation what DDP computes?", "",
           f"Real `DistributedDataParallel` on gloo ranks (one process per rank, each with its own loader), "
           f"{R['settings']['ddp_steps']} steps, against the one-process simulation of the same ranks:", "",
           "| loader | ranks | max abs(DDP loss - simulated loss) | DDP losses |", "|---|---|---|---|"]
    for name, by_w in R["ddp"].items():
        for w, r in by_w.items():
            out.append(f"| {name} | {w} | {_g(r['max_abs_diff'])} | "
                       f"{', '.join(f'{x:.6f}' for x in r['real'])} |")
    z = list(R["ddp"].get("zephon", {}).values())
    if len(z) >= 2:  # same global batches, different all-reduce order: DDP's own rounding noise
        real = max(abs(a - b) for a, b in zip(z[0]["real"], z[-1]["real"]))
        sim = max(abs(a - b) for a, b in zip(z[0]["simulated"], z[-1]["simulated"]))
        ws = list(R["ddp"]["zephon"])
        out += ["", f"Real DDP with Zephon on {ws[0]} and on {ws[-1]} ranks (the same global batches): max abs loss "
                f"difference {_g(real)}; the simulation's runs on those rank counts: {_g(sim)}."]
    return out + [""]


def _resume(R: dict, img: str | None) -> list[str]:
    s = R["settings"]
    k, n, T = s["ckpt_step"], s["ckpt_dp"], s["steps"]
    out = [f"### 1. Checkpoint at step {k} on {n} ranks, resume on {', '.join(map(str, s['resume_dps']))}", "",
           f"Per-step training loss of steps {k + 1}-{T} after each resume against the uninterrupted {n}-rank run. "
           "**equal batches**: global batches byte-identical to the uninterrupted run's, rows in the same order; "
           "**same rows**: the same rows in another order. **held-out diff**: held-out loss at step "
           f"{T}, resumed minus uninterrupted.", "",
           "| loader | how it resumes on M ranks | M | max abs loss diff | mean abs loss diff | equal batches | "
           "same rows | held-out diff |", "|---|---|---|---|---|---|---|---|"]
    said = {}  # what the loaders said on resume (refusals, notes), once per message
    for p in R["peers"].values():
        if not p or "error" in p:
            continue
        ref = p["scratch"][str(n)]["final_heldout"]
        for M, r in sorted(p["resume"].items(), key=lambda kv: int(kv[0])):
            msg = r.get("refused") or r.get("note")
            if msg and msg != "restored":
                said.setdefault((p["name"], msg), []).append(M)
            if "refused" in r:
                out.append(f"| {p['name']} | {p['rule']} | {M} | refused | - | - | - | - |")
                continue
            H = T - k
            out.append(f"| {p['name']} | {p['rule']} | {M} | {_g(r['max_abs_diff'])} | {_g(r['mean_abs_diff'])} | "
                       f"{r['equal_batches']}/{H} | {r['same_rows']}/{H} | {_g(r['final_heldout'] - ref)} |")
    if said:
        out += ["", "What the loaders said when resumed:", ""]
        out += [f"- {name} on {', '.join(Ms)} ranks: {msg}" for (name, msg), Ms in said.items()]
    if img:
        out += ["", f"![resumed vs uninterrupted]({img})"]
    return out + [""]


def _scratch(R: dict, img: str | None) -> list[str]:
    s = R["settings"]
    dps = [str(d) for d in s["scratch_dps"]]
    out = [f"### 2. From scratch on {', '.join(dps)} ranks", "",
           f"Held-out loss after {s['steps']} steps for each rank count; **spread** = max - min over the rank "
           "counts. **train spread**: the same for the mean training loss of the last 20 steps.", "",
           "| loader | " + " | ".join(f"{d} ranks" for d in dps) + " | spread | train spread |",
           "|---|" + "---|" * (len(dps) + 2)]
    for p in R["peers"].values():
        if not p or "error" in p:
            continue
        h = [p["scratch"][d]["final_heldout"] for d in dps]
        tr = [sum(p["scratch"][d]["losses"][-20:]) / len(p["scratch"][d]["losses"][-20:]) for d in dps]
        out.append(f"| {p['name']} | " + " | ".join(f"{x:.4f}" for x in h) +
                   f" | {_g(max(h) - min(h))} | {_g(max(tr) - min(tr))} |")
    failed = [f"{n}: {p.get('error') if p else 'no result'}" for n, p in R["peers"].items() if not p or "error" in p]
    if failed:
        out += ["", "Failed: " + "; ".join(failed)]
    if img:
        out += ["", f"![from scratch on several rank counts]({img})"]
    return out + [""]


def render(R: dict, img_dir: Path, write_plots: bool = True) -> str:
    """The markdown section (markers included); writes the figures into ``img_dir`` when asked."""
    from .plot import resume_figure, scratch_figure

    R = json.loads(json.dumps(R, default=str))  # one shape whether fresh or loaded: string keys
    imgs = {}
    if write_plots:
        img_dir.mkdir(parents=True, exist_ok=True)
        suffix = "-quick" if R["quick"] else ""
        imgs["resume"] = resume_figure(R, img_dir / f"loss-resume{suffix}.png").name
        imgs["scratch"] = scratch_figure(R, img_dir / f"loss-scratch{suffix}.png").name
    lines = [BEGIN, "", "## The run", ""] + _setup(R) + [""] + _ddp(R)
    lines += _resume(R, f"img/{imgs['resume']}" if imgs else None)
    lines += _scratch(R, f"img/{imgs['scratch']}" if imgs else None)
    return "\n".join(lines + [END])


def write_doc(path: Path, md: str) -> None:
    """Replace the marked section of ``path`` (or create the file with it)."""
    text = path.read_text() if path.exists() else f"# Loss curves\n\n{BEGIN}\n{END}\n"
    if BEGIN not in text or END not in text:
        text = text.rstrip() + f"\n\n{BEGIN}\n{END}\n"
    head, rest = text.split(BEGIN, 1)
    tail = rest.split(END, 1)[1]
    path.write_text(head + md + tail)
