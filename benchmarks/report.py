"""Tables (markdown) and plots (matplotlib PNG) of the side-by-side suite's results."""
from __future__ import annotations

from pathlib import Path

from .common import median, ok

BEGIN = "<!-- side-by-side:begin (written by `python -m benchmarks`) -->"
END = "<!-- side-by-side:end -->"


def _k(x):
    if x is None:
        return "-"
    return f"{x / 1e6:.2f}M" if x >= 1e6 else f"{x / 1e3:.1f}k"


def _f(x, spec=".2f"):
    return "-" if x is None else format(x, spec)


def _rates(runs):
    return [r["rate"] for r in ok(runs) if r.get("rate")]


def _rate_table(runs_by_name: dict, ref_names, unit: str, ref_label: str):
    """Rows: name, median (min-max), ratio vs the best median of ref_names, CPU s, per-CPU-s rate,
    first batch, RSS main / largest worker, reps. Returns (lines, medians)."""
    med = {n: median(_rates(rs)) for n, rs in runs_by_name.items()}
    refs = [med[n] for n in ref_names if med.get(n)]
    ref = max(refs) if refs else None
    cols = ["configuration", f"{unit}/s median (min-max)", f"ratio vs {ref_label}", "CPU s (cores busy)",
            f"{unit}/CPU-s", "1st batch s", "peak RSS MiB main / largest worker", "reps"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for n, rs in runs_by_name.items():
        good = ok(rs)
        if not good:
            err = next((r.get("error") for r in rs if r and r.get("error")), "no result")
            lines.append(f"| {n} | failed: {err[:120]} |" + " |" * (len(cols) - 3) + f" 0/{len(rs)} |")
            continue
        rates = _rates(rs)
        amount = "tokens" if "tokens" in good[0] else "samples"
        cpu = median([r.get("cpu") for r in good])
        busy = median([r["cpu"] / r["seconds"] for r in good if r.get("cpu") and r.get("seconds")])
        per_cpu = median([(r[amount] / r["cpu"]) for r in good if r.get("cpu")])
        wr = [r["rss_worker_mib"] for r in good if r.get("rss_worker_mib")]
        lines.append("| " + " | ".join([
            n, f"{_k(med[n])} ({_k(min(rates))}-{_k(max(rates))})" if rates else "-",
            _f(med[n] / ref) if ref and med[n] else "-", f"{_f(cpu)} ({_f(busy, '.1f')})", _k(per_cpu),
            _f(median([r.get("first_batch") for r in good])),
            f"{max(r['rss_main_mib'] for r in good):.0f} / " + (f"{max(wr):.0f}" if wr else "-"),
            f"{len(good)}/{len(rs)}"]) + " |")
    return lines, med


def _bar(ax, names, values, title, xlabel):
    ys = range(len(names))
    colors = ["#1f77b4" if n.startswith("zephon") else "#999999" for n in names]
    ax.barh(list(ys), [v or 0 for v in values], color=colors)
    ax.set_yticks(list(ys))
    ax.set_yticklabels(names)
    ax.invert_yaxis()
    ax.set_title(title)
    ax.set_xlabel(xlabel)


class _Plots:
    """The figures of one render: pyplot (None when no plots are written) and the files written so far.

    Args:
        img_dir: directory the PNG files go to (created when plots are written).
        write: whether to draw and write plots at all.
    """

    def __init__(self, img_dir: Path, write: bool):
        self.img_dir = img_dir
        self.files: list[Path] = []
        self.plt = None
        if write:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as pyplot

            img_dir.mkdir(parents=True, exist_ok=True)
            self.plt = pyplot

    def save(self, fig, name: str, alt: str) -> list[str]:
        """Lay out, write as img_dir/name and close fig; returns the markdown lines that show it.

        Args:
            fig: the matplotlib figure.
            name: file name of the PNG inside img_dir.
            alt: alternative text of the image in the markdown.
        """
        fig.tight_layout()
        p = self.img_dir / name
        fig.savefig(p, dpi=110)
        self.plt.close(fig)
        self.files.append(p)
        return [f"![{alt}](img/{p.name})", ""]


def _header(R: dict) -> list[str]:
    """The section title, then the machine, command, corpus, load and peer versions of the run."""
    mi = R["machine"]
    v = mi["versions"]
    return [BEGIN, "", "## Side by side: `python -m benchmarks`", "",
            f"Run {mi['date']} on {mi['nproc']} vCPUs ({mi['cpu']}, {_f(mi['mem_gib'], '.1f')} GiB), "
            f"{mi['os']}, Python {v['python']}; code {mi['code']}. Command: `{R['command']}` "
            f"({'quick: a quarter of the corpus, ' if R['quick'] else ''}{R['repeats']} repetitions, "
            f"{R['docs']} documents, {R['seconds'] / 60:.1f} minutes in all). Load average (1 min) before / after: "
            f"{mi['load_before']:.2f} / {R['load_after']:.2f} (a shared machine: read the ratios, not the "
            f"absolute rates).", "",
            "Versions: " + ", ".join(f"{k} {val}" for k, val in v.items() if k != "python" and val) + ".", ""]


# ------------------------------------------------------------------------------ 1. tokenize + pack + batch

def _pipeline_section(pipeline: dict, plots: _Plots, summary: list[str]) -> list[str]:
    """Comparison 1: its description, then a table (and plot) per input format; appends ratios to summary."""
    out = ["### 1. Tokenize + pack(2048) + batch(8), from JSONL and Parquet", "",
           "Same documents, same tokenizer (the corpus' local byte-level BPE), 2 workers where the loader "
           "has workers. tokens/s: real (non-padding) tokens of one timed pass / its wall time, after one "
           "untimed warm-up pass; worker start-up is outside the timed pass for every loader "
           "(benchmarks/throughput/peers.py says how). **ratio** = median / the best Grain median of the same format. "
           "Zephon packs best-fit per lane (8 lanes); Grain packs with `experimental.BestFitPackIterDataset` "
           "(8 bins); the torch baseline concatenates and splits (no padding, a cheaper packer). RSS of the "
           "main process and of the largest worker process.", ""]
    for fmt, runs in pipeline.items():
        out += _pipeline_format(fmt, runs, plots, summary)
    return out


def _pipeline_format(fmt: str, runs: dict, plots: _Plots, summary: list[str]) -> list[str]:
    """Comparison 1 on one input format: table, token-count check and plot; appends ratios to summary."""
    grains = [n for n in runs if n.startswith("grain")]
    lines, med = _rate_table(runs, grains, "tokens", "best Grain")
    out = [f"**{fmt}**", ""] + lines + [""] + [_token_count_note(runs), ""]
    summary += _pipeline_ratios(fmt, med, grains)
    if plots.plt:
        fig, ax = plots.plt.subplots(figsize=(7, 0.45 * len(runs) + 1.2))
        names = list(runs)
        _bar(ax, names, [med[n] for n in names], f"tokenize + pack + batch ({fmt}), median tokens/s",
             "tokens/s")
        out += plots.save(fig, f"bench-pipeline-{fmt}.png", f"tokens/s, {fmt}")
    return out


def _token_count_note(runs: dict) -> str:
    """Whether every configuration (but Grain with mp_prefetch) delivered the same number of real tokens."""
    exact = {n: {r["tokens"] for r in ok(rs)} for n, rs in runs.items() if not n.startswith("grain/mp")}
    toks = set().union(*exact.values()) if exact else set()
    return (("Every configuration delivered the same " + f"{next(iter(toks)):,} real tokens per pass"
             if len(toks) == 1 else f"NOTE: token counts differ between configurations: {exact}") +
            " (Grain with `mp_prefetch` is timed on one pass's worth of batches of the repeated dataset, "
            "so its count differs by the few rows that straddle the pass boundary).")


def _pipeline_ratios(fmt: str, med: dict, grains: list[str]) -> list[str]:
    """Best Zephon median against the best Grain median and against torch's DataLoader, for one format."""
    zb = max((med[n] or 0, n) for n in med if n.startswith("zephon"))
    gb = max(((med[n] or 0, n) for n in grains), default=(0, None))
    tb = med.get("torch DataLoader/2 workers")
    ratios = []
    if gb[0]:
        ratios.append(f"1/{fmt}: best Zephon ({zb[1]}) / best Grain ({gb[1]}) = {zb[0] / gb[0]:.2f}")
    if tb:
        ratios.append(f"1/{fmt}: best Zephon / torch DataLoader = {zb[0] / tb:.2f}")
    return ratios


# ------------------------------------------------------------------------------ 2. MDS, 3. Energon

def _mds_ref(name: str) -> str:
    """The Mosaic configuration a Zephon MDS configuration is compared with."""
    return "streaming.StreamingDataset"


def _energon_ref(name: str) -> str:
    """The megatron-energon configuration (same task encoder) a Zephon Energon configuration is compared with."""
    return "megatron.energon" + (" + tokenize" if "tokenize" in name else "")


def _mds_section(runs: dict, plots: _Plots, summary: list[str]) -> list[str]:
    """Comparison 2 (MDS reading): description, table, plot; appends ratios to summary."""
    desc = ("`StreamingDataset(local=<mds>, batch_size=8, shuffle=True)` through each library's "
            "`StreamingDataLoader` with 2 workers; one warm-up epoch, then one timed epoch. Zephon drops "
            "the tail that does not fill a last global batch on every lane (its documented epoch rule), "
            "so it yields slightly fewer samples per epoch; the rate is per delivered sample.")
    lines, med = _rate_table(runs, [_mds_ref("")], "samples", "Mosaic")
    out = ["### 2. MDS reading (the same shards)", "", desc, ""] + lines + [""]
    return out + _peer_ratios_and_plot("mds", "2", runs, med, _mds_ref, plots, summary)


def _energon_section(runs: dict, plots: _Plots, summary: list[str]) -> list[str]:
    """Comparison 3 (Energon-prepared WebDataset): description, one table without then with the tokenizing task
    encoder, plot; appends ratios to summary."""
    desc = ("`get_train_dataset(<wds>, batch_size=8, shuffle_buffer_size=100, max_samples_per_sequence=100, "
            "WorkerConfig(num_workers=2))` + `get_loader`; 1.25 passes worth of batches timed from `iter()` "
            "on, start-up included (the two loaders prefetch to different depths: a window timed after a "
            "warm-up measured buffers, not throughput). `+ tokenize`: a `TaskEncoder` whose `encode_sample` "
            "tokenizes the text and whose `batch` pads to one tensor. **ratio** is against megatron-energon "
            "with the same task encoder.")
    lines = []
    med = {}
    for te in (False, True):
        sub = {n: rs for n, rs in runs.items() if ("tokenize" in n) == te}
        ls, sub_med = _rate_table(sub, [_energon_ref("tokenize" if te else "")], "samples",
                                  "megatron.energon" + (" + tokenize" if te else ""))
        lines += ls if not lines else ls[2:]
        med.update(sub_med)
    out = ["### 3. Energon-prepared WebDataset (the same dataset)", "", desc, ""] + lines + [""]
    return out + _peer_ratios_and_plot("energon", "3", runs, med, _energon_ref, plots, summary)


def _peer_ratios_and_plot(key: str, number: str, runs: dict, med: dict, ref_of, plots: _Plots,
                          summary: list[str]) -> list[str]:
    """Appends each Zephon configuration's ratio to its peer's to summary; returns the plot's markdown lines.

    Args:
        key: results key ("mds" or "energon"), also names the plot.
        number: the comparison's number in the summary.
        runs: results per configuration name.
        med: median rate per configuration name.
        ref_of: configuration name -> name of the peer configuration it is compared with.
    """
    for n in runs:
        if n.startswith("zephon") and med.get(n) and med.get(ref_of(n)):
            summary.append(f"{number}: {n} / {ref_of(n)} = {med[n] / med[ref_of(n)]:.2f}")
    if not plots.plt:
        return []
    fig, ax = plots.plt.subplots(figsize=(7, 0.45 * len(runs) + 1.2))
    _bar(ax, list(runs), [med[n] for n in runs], f"{key}: median samples/s", "samples/s")
    return plots.save(fig, f"bench-{key}.png", f"{key} samples/s")


# ------------------------------------------------------------------------------ 4. checkpoints

def _checkpoints_section(results: dict, plots: _Plots, summary: list[str]) -> list[str]:
    """Comparison 4 (state size, restore time): description, table, plot; appends ratios to summary."""
    out = ["### 4. Checkpoint size and time to first batch after a restore", "",
           "Read + batch 8 documents per step (no tokenization, so step 10,000 is reachable), shuffled, "
           "repeating, 2 workers; see benchmarks/checkpoints/peers.py for each loader's set-up. **bytes**: the "
           "state as each library serialises it (JSON for Zephon, Grain and Streaming; `torch.save` of "
           "the state object for torchdata and Energon). **restore s**: a fresh loader, restore, first "
           "batch. **cold s**: a fresh loader's first batch without a state. **exact**: the first batch "
           "after the restore equals the uninterrupted run's next batch.", "",
           "| loader | step | state bytes | restore s | cold s | restore / cold | exact |",
           "|---|---|---|---|---|---|---|"]
    for impl, res in results.items():
        out += _checkpoint_rows(impl, res, summary)
    out.append("")
    if plots.plt:
        out += _checkpoints_plot(results, plots)
    return out


def _checkpoint_rows(impl: str, res: dict | None, summary: list[str]) -> list[str]:
    """Table rows of one loader (one per step, or a failure); appends its growth ratios to summary."""
    if not res or "error" in res:
        return [f"| {impl} | failed: {(res or {}).get('error', 'no result')[:150]} | | | | | |"]
    rows = [f"| {impl} | {row['step']:,} | {row['bytes']:,} | {row['restore']:.2f} | {res['cold']:.2f} | "
            f"{row['restore'] / res['cold']:.2f} | {'yes' if row['exact'] else 'NO'} |" for row in res["rows"]]
    r0, r1 = res["rows"][0], res["rows"][-1]
    summary.append(f"4: {impl}: state bytes step {r1['step']:,} / step {r0['step']:,} = "
                   f"{r1['bytes'] / r0['bytes']:.2f}; restore s step {r1['step']:,} / step {r0['step']:,} = "
                   f"{r1['restore'] / r0['restore']:.2f}; restore / cold at step {r1['step']:,} = "
                   f"{r1['restore'] / res['cold']:.2f}")
    return rows


def _checkpoints_plot(results: dict, plots: _Plots) -> list[str]:
    """State bytes and restore time against step, log-log, one line per loader; returns the markdown lines."""
    fig, (a1, a2) = plots.plt.subplots(1, 2, figsize=(10, 3.8))
    for impl, res in results.items():
        if res and "rows" in res:
            st = [r["step"] for r in res["rows"]]
            a1.plot(st, [r["bytes"] for r in res["rows"]], marker="o", label=impl)
            a2.plot(st, [r["restore"] for r in res["rows"]], marker="o", label=impl)
    for a, t in ((a1, "state bytes"), (a2, "restore to first batch, s")):
        a.set_xscale("log")
        a.set_yscale("log")
        a.set_xlabel("step")
        a.set_title(t)
    a1.legend(fontsize=8)
    return plots.save(fig, "bench-checkpoints.png", "checkpoint size and restore time")


# ------------------------------------------------------------------------------ 5. divergence

_RESUME_RULES = {"zephon": "merge_states of the rank states, restored by every new rank",
                 "distributed_sampler": "new DistributedSampler(M), each rank skips k*G/M indices",
                 "grain": "experimental.ElasticIterator state, set on every new shard",
                 "energon": "`energon checkpoint redist --new-world-size M` (worker slices kept)",
                 "streaming": "rank 0's state_dict(k*G) loaded by every rank (num_canonical_nodes=8)"}


def _divergence_section(results: dict, summary: list[str]) -> list[str]:
    """Comparison 5 (resume at another number of ranks): description and table; appends counts to summary."""
    any_res = next((r for r in results.values() if r and "H" in r), {"k": "?", "H": "?", "N": 4})
    out = ["### 5. Divergence after a resume at another number of ranks", "",
           f"Global batch 16 documents; checkpoint after step {any_res['k']} on {any_res['N']} ranks; resume on 2 "
           f"and 8 ranks; the {any_res['H']} following global batches compared with the uninterrupted "
           f"{any_res['N']}-rank run's, as sorted lists of sample keys (order inside a global batch ignored: "
           "the most lenient reading). Each peer resumes by its own rules (benchmarks/divergence.py).", "",
           "| loader | how it resumes at M ranks | M | equal steps | divergent steps |", "|---|---|---|---|---|"]
    for impl, res in results.items():
        out += _divergence_rows(impl, res, summary)
    out.append("")
    return out


def _divergence_rows(impl: str, res: dict | None, summary: list[str]) -> list[str]:
    """Table rows of one loader (one per resume rank count, or a failure); appends its counts to summary."""
    if not res or "error" in res:
        return [f"| {impl} | {_RESUME_RULES[impl]} | - | failed: {(res or {}).get('error', 'no result')[:150]} | |"]
    rows = []
    for M, eq in res["equal"].items():
        rule, H = _RESUME_RULES[impl], res["H"]
        if isinstance(eq, dict):
            rows.append(f"| {impl} | {rule} | {M} | refused: {eq['refused']} | {H} (cannot resume) |")
            summary.append(f"5: {impl} at {M} ranks: refused ({H} of {H} steps count as divergent)")
        else:
            rows.append(f"| {impl} | {rule} | {M} | {eq} / {H} | {H - eq} |")
            summary.append(f"5: {impl} at {M} ranks: {H - eq} of {H} steps divergent")
    return rows


# ------------------------------------------------------------------------------ 6. lanes scaling

def _scaling_section(runs: dict, plots: _Plots, summary: list[str]) -> list[str]:
    """Comparison 6 (Zephon with more lanes): description, table, plot; appends ratios to summary."""
    out = ["### 6. Zephon: the cost of lanes", "",
           "The pipeline of comparison 1 (JSONL, threads runner, 2 workers) with 8 to 1024 lanes "
           "(`chunk_size` = min(1024, documents / lanes / 2) so every lane gets work). More lanes mean "
           "more open packing bins, more flushes (padded rows) and smaller units of work.", "",
           "| lanes | tokens/s median | ratio vs 8 lanes | rows | peak RSS MiB "
           "| RSS above 8 lanes, KiB per lane | reps |",
           "|---|---|---|---|---|---|---|"]
    med = {n: median(_rates(rs)) for n, rs in runs.items()}
    base_n = next(iter(runs))
    rss = {n: median([r["rss_main_mib"] for r in ok(rs)]) for n, rs in runs.items()}
    for n, rs in runs.items():
        good = ok(rs)
        if not good:
            out.append(f"| {n} | failed | | | | | 0/{len(rs)} |")
            continue
        lanes = good[0]["lanes"]
        extra = (rss[n] - rss[base_n]) * 1024 / lanes if n != base_n and rss[n] and rss[base_n] else None
        out.append(f"| {lanes} | {_k(med[n])} | {_f(med[n] / med[base_n]) if med[base_n] else '-'} | "
                   f"{good[0]['rows']} | {rss[n]:.0f} | {_f(extra, '.1f')} | {len(good)}/{len(rs)} |")
        if n != base_n and med[base_n] and med[n]:
            summary.append(f"6: {lanes} lanes / 8 lanes tokens/s = {med[n] / med[base_n]:.2f}")
    out.append("")
    if plots.plt:
        out += _scaling_plot(runs, med, rss, plots)
    return out


def _scaling_plot(runs: dict, med: dict, rss: dict, plots: _Plots) -> list[str]:
    """Median tokens/s and peak RSS against the lane count; returns the markdown lines."""
    good = [(ok(rs)[0]["lanes"], med[n], rss[n]) for n, rs in runs.items() if ok(rs)]
    fig, a1 = plots.plt.subplots(figsize=(6, 3.6))
    a1.plot([g[0] for g in good], [g[1] for g in good], marker="o", color="#1f77b4")
    a1.set_xscale("log", base=2)
    a1.set_xlabel("canonical_replicas (lanes)")
    a1.set_ylabel("tokens/s", color="#1f77b4")
    a2 = a1.twinx()
    a2.plot([g[0] for g in good], [g[2] for g in good], marker="s", color="#d62728")
    a2.set_ylabel("peak RSS MiB", color="#d62728")
    a1.set_title("Zephon: throughput and memory vs lanes")
    return plots.save(fig, "bench-lanes.png", "lanes scaling")


def render(R: dict, img_dir: Path, write_plots: bool = True):
    """Markdown for the doc and the list of plot files written."""
    out = _header(R)
    plots = _Plots(img_dir, write_plots)
    summary: list[str] = []
    if "pipeline" in R:
        out += _pipeline_section(R["pipeline"], plots, summary)
    if "mds" in R:
        out += _mds_section(R["mds"], plots, summary)
    if "energon" in R:
        out += _energon_section(R["energon"], plots, summary)
    if "checkpoints" in R:
        out += _checkpoints_section(R["checkpoints"], plots, summary)
    if "divergence" in R:
        out += _divergence_section(R["divergence"], summary)
    if "scaling" in R:
        out += _scaling_section(R["scaling"], plots, summary)
    out += ["### Every ratio", ""] + [f"- {s}" for s in summary] + ["", END]
    return "\n".join(out), plots.files
