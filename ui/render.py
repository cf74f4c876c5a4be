"""HTML for the page's live parts: VRAM gauge, progress, result, config summary, data preview, problems.

Pure functions from data to HTML strings (every user-supplied string escaped), so they are tested without a
browser. Styling lives in ui/theme.py's CSS (classes prefixed `mt-`).
"""

from __future__ import annotations

import html
import math
from typing import Any, Iterable

from core.config import Problem, TrainConfig
from core.jobs import JobView

E = html.escape


def _gib(x: float | None, digits: int = 1) -> str:
    return "-" if x is None else f"{x:.{digits}f} GiB"


def _duration(s: float | None) -> str:
    if s is None or not math.isfinite(s):
        return "-"
    s = int(round(s))
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}:{m:02d}:{sec:02d}" if h else f"{m}:{sec:02d}"


def _bytes(n: int | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


# --- VRAM gauge -------------------------------------------------------------------------------------------------
def band(fraction: float) -> str:
    return "ok" if fraction < 0.70 else ("warn" if fraction < 0.90 else "high")


def gauge_html(gpus: list[dict[str, Any]], message: str = "", run_peak_gib: float | None = None,
               predicted_gib: float | None = None) -> str:
    """gpus: [{index, name, used_gib, total_gib}]. run_peak_gib marks this run's highest use on GPU 0."""
    if not gpus:
        text = message or "No NVIDIA GPU found"
        return (f'<div class="mt-gauge mt-nogpu" id="mt-gauge-none"><span class="mt-dot"></span><b>{E(text)}</b>'
                '<div class="mt-muted">Training runs on the CPU: fine for the offline demo, far too slow for a '
                'real model.</div></div>')
    parts = ['<div class="mt-gauges">']
    for i, g in enumerate(gpus):
        used, total = float(g.get("used_gib") or 0.0), float(g.get("total_gib") or 0.0)
        frac = used / total if total > 0 else 0.0
        marks = []
        if i == 0 and run_peak_gib and total:
            left = min(100.0, 100 * run_peak_gib / total)
            marks.append(f'<div class="mt-peak" style="left:{left:.1f}%" title="this run\'s peak: {run_peak_gib:.1f} GiB">'
                         '</div>')
        if i == 0 and predicted_gib and total:
            left = min(100.0, 100 * predicted_gib / total)
            marks.append(f'<div class="mt-predicted" style="left:{left:.1f}%" '
                         f'title="predicted peak: {predicted_gib:.1f} GiB"></div>')
        foot = []
        if i == 0 and run_peak_gib:
            foot.append(f'<span class="mt-peak-key"></span>this run\'s peak {run_peak_gib:.1f} GiB')
        if i == 0 and predicted_gib:
            foot.append(f'<span class="mt-pred-key"></span>predicted {predicted_gib:.1f} GiB')
        parts.append(
            f'<div class="mt-gauge" data-band="{band(frac)}">'
            f'<div class="mt-gauge-head"><b>GPU {E(str(g.get("index", i)))} &middot; {E(str(g.get("name", "GPU")))}</b>'
            f'<span>{used:.1f} / {total:.1f} GiB ({100 * frac:.0f}%)</span></div>'
            f'<div class="mt-bar mt-bands"><div class="mt-fill mt-{band(frac)}" style="width:{100 * frac:.1f}%"></div>'
            + "".join(marks) + "</div>"
            + (f'<div class="mt-gauge-foot">{" &nbsp; ".join(foot)}</div>' if foot else "")
            + "</div>")
    parts.append("</div>")
    return "".join(parts)


# --- progress and result --------------------------------------------------------------------------------------------
STATE_LABEL = {
    "idle": "Idle", "running": "Running", "stopping": "Stopping", "completed": "Finished", "stopped": "Stopped",
    "failed": "Failed", "interrupted": "Interrupted",
}
PHASE_LABEL = {
    "resolving": "Finding the model", "downloading": "Downloading", "loading_model": "Loading the model",
    "tokenizing": "Preparing the data", "training": "Training", "saving": "Saving the adapter", "done": "Done",
}


def progress_html(v: JobView) -> str:
    if v.state == "idle":
        return ('<div class="mt-progress" data-state="idle" data-step="0"><div class="mt-progress-top">'
                '<span class="mt-badge mt-badge-idle">Idle</span><span class="mt-muted">No run yet: press Start.'
                '</span></div><div class="mt-bar"><div class="mt-fill" style="width:0%"></div></div></div>')
    frac = v.fraction
    label = STATE_LABEL.get(v.state, v.state)
    if v.state in ("running", "stopping") and v.phase and v.phase != "training" and not v.step:
        where = PHASE_LABEL.get(v.phase, v.phase)
        detail = E(v.phase_message or where)
    else:
        total = v.total_steps or "?"
        detail = f"step <b class='mt-step'>{v.step}</b> / {total}" + (f" &middot; {100 * frac:.0f}%" if frac is not None else "")
    width = f"{100 * frac:.1f}%" if frac is not None else "100%"
    indeterminate = " mt-indeterminate" if frac is None and v.state in ("running", "stopping") else ""
    stats = []
    if v.state in ("running", "stopping") and v.eta_s is not None:
        stats.append(f"ETA {_duration(v.eta_s)}")
    if v.elapsed_s is not None:
        stats.append(f"elapsed {_duration(v.elapsed_s)}")
    if v.tokens_per_s:
        stats.append(f"{v.tokens_per_s:,.0f} tokens/s")
    if v.epoch is not None:
        stats.append(f"epoch {v.epoch:.2f}")
    if v.last_loss is not None:
        stats.append(f"loss {v.last_loss:.4f}")
    return (f'<div class="mt-progress" data-state="{E(v.state)}" data-step="{v.step}" data-total="{v.total_steps or 0}">'
            f'<div class="mt-progress-top"><span class="mt-badge mt-badge-{E(v.state)}">{E(label)}</span>'
            f'<span>{detail}</span></div>'
            f'<div class="mt-bar"><div class="mt-fill mt-run{indeterminate}" style="width:{width}"></div></div>'
            f'<div class="mt-stats">{" &middot; ".join(stats)}</div></div>')


def result_html(v: JobView) -> str:
    if v.state in ("idle", "running", "stopping"):
        return ""
    s = v.summary or {}
    if v.state in ("failed", "interrupted") or not v.adapter_dir:
        title = "The run failed" if v.state == "failed" else "The run was interrupted"
        msg = v.message or ("The server stopped while this run was going; its checkpoints (if any) are in "
                            f"{v.run_dir}." if v.state == "interrupted" else "No adapter was saved.")
        kind = f" ({E(v.error_type)})" if v.error_type else ""
        return (f'<div class="mt-result mt-result-failed" id="mt-result-failed"><b>{title}{kind}</b>'
                f'<pre class="mt-pre">{E(msg)}</pre>'
                + (f'<div class="mt-muted">Run folder: <code>{E(v.run_dir)}</code></div>' if v.run_dir else "")
                + "</div>")
    head = "Training finished" if v.state == "completed" else f"Stopped after step {s.get('steps', v.step)}: adapter saved"
    peak = []
    if s.get("peak_allocated_gib") is not None:
        peak.append(f"{s['peak_allocated_gib']:.2f} GiB allocated (torch)")
    if s.get("nvml_peak_gib") is not None:
        peak.append(f"{s['nvml_peak_gib']:.2f} GiB used (NVML)")
    rows = [
        ("Adapter", f'<code id="mt-adapter-path">{E(str(v.adapter_dir))}</code>'),
        ("Size", _bytes(s.get("adapter_bytes"))),
        ("Loss", (f"{s['first_loss']:.4f} &rarr; " if s.get("first_loss") is not None else "")
         + (f"<b>{s['final_loss']:.4f}</b>" if s.get("final_loss") is not None else "-")),
        ("Peak memory", " &middot; ".join(peak) if peak else "CPU run: no GPU memory used"),
        ("Steps", f"{s.get('steps', v.step)}" + (f" of {s['max_steps']}" if s.get("max_steps") else "")),
        ("Time", _duration(s.get("runtime_s"))
         + (f" &middot; {s['tokens_per_s']:,.0f} tokens/s" if s.get("tokens_per_s") else "")),
    ]
    table = "".join(f'<div class="mt-k">{k}</div><div class="mt-v">{val}</div>' for k, val in rows)
    cls = "mt-result-ok" if v.state == "completed" else "mt-result-stopped"
    return (f'<div class="mt-result {cls}" id="mt-result-{E(v.state)}"><b>{E(head)}</b>'
            f'<div class="mt-kv">{table}</div></div>')


def log_html(lines: list[str]) -> str:
    """The run log, newest line at the bottom; the box stays scrolled to the end (CSS column-reverse)."""
    body = E("\n".join(lines)) if lines else '<span class="mt-muted">The run\'s log appears here.</span>'
    return f'<div class="mt-log" id="mt-log"><pre class="mt-pre">{body}</pre></div>'


# --- config summary and problems -----------------------------------------------------------------------------------
def summary_html(cfg: TrainConfig | None, problems: list[Problem], checklist_on: dict[str, bool] | None = None,
                 predicted_gib: float | None = None) -> str:
    if cfg is None:
        return problems_html(problems, "These settings cannot be read")
    chips = [
        ("model", cfg.model),
        ("data", f"{cfg.dataset} [{cfg.dataset_split}]"),
        ("quant", f"4-bit {cfg.bnb_4bit_quant_type}" + (" + double quant" if cfg.bnb_4bit_use_double_quant else "")
         if cfg.load_in_4bit else "no quantization"),
        ("precision", cfg.precision),
        ("lora", f"LoRA r{cfg.lora_r} &alpha;{cfg.lora_alpha} on {','.join(m.replace('_proj', '') for m in cfg.lora_target_modules)}"),
        ("batch", f"batch {cfg.per_device_train_batch_size} &times; accum {cfg.gradient_accumulation_steps} "
                  f"= {cfg.effective_batch_size}"),
        ("length", f"max length {cfg.max_length}"),
        ("optim", cfg.optim),
        ("checkpointing", "checkpointing " + ("on" if cfg.gradient_checkpointing else "off")),
        ("schedule", f"{cfg.max_steps} steps" if cfg.max_steps > 0 else f"{cfg.num_train_epochs:g} epochs"),
        ("lr", f"lr {cfg.learning_rate:g}"),
    ]
    if cfg.packing:
        chips.append(("packing", "packing"))
    if predicted_gib:
        chips.append(("predicted", f"predicted peak &asymp; {predicted_gib:.1f} GiB"))
    out = ['<div class="mt-summary" id="mt-summary">']
    if checklist_on is not None:
        n = sum(checklist_on.values())
        out.append(f'<span class="mt-chip mt-chip-strong" data-key="checklist">checklist {n}/{len(checklist_on)}</span>')
    for key, text in chips:
        safe = text if "&" in text and key in ("lora", "batch", "predicted") else E(text)
        out.append(f'<span class="mt-chip" data-key="{key}">{safe}</span>')
    out.append("</div>")
    if problems:
        out.append(problems_html(problems, "Fix before starting"))
    return "".join(out)


def problems_html(problems: Iterable[Problem | str], title: str = "Problems") -> str:
    items = list(problems)
    if not items:
        return ""
    lis = []
    for p in items:
        if isinstance(p, Problem):
            lis.append(f"<li><code>{E(p.field)}</code> {E(p.message)} &rarr; <i>{E(p.fix)}</i></li>")
        else:
            lis.append(f"<li>{E(str(p))}</li>")
    return (f'<div class="mt-problems" id="mt-problems"><b>{E(title)} ({len(items)})</b>'
            f'<ul>{"".join(lis)}</ul></div>')


def message_html(text: str, kind: str = "info") -> str:
    """A one-off notice in place (kind: info | ok | warn | error)."""
    if not text:
        return ""
    return f'<div class="mt-note mt-note-{E(kind)}"><pre class="mt-pre">{E(text)}</pre></div>'


# --- data preview ---------------------------------------------------------------------------------------------------
def histogram_svg(lengths: list[int], max_length: int, bins: int = 32) -> str:
    if not lengths:
        return ""
    top = max(max(lengths), max_length) * 1.05
    width = top / bins
    counts = [0] * bins
    for x in lengths:
        counts[min(bins - 1, int(x / width))] += 1
    peak = max(counts) or 1
    W, H, pad = 600.0, 150.0, 22.0
    bw = (W - 2 * pad) / bins
    bars = []
    for i, c in enumerate(counts):
        if not c:
            continue
        h = (H - 2 * pad) * c / peak
        x0 = pad + i * bw
        over = (i * width) >= max_length
        cls = "mt-hist-over" if over else "mt-hist-ok"
        lo, hi = int(i * width), int((i + 1) * width)
        bars.append(f'<rect class="{cls}" x="{x0 + 1:.1f}" y="{H - pad - h:.1f}" width="{bw - 2:.1f}" height="{h:.1f}">'
                    f"<title>{lo}-{hi} tokens: {c} rows</title></rect>")
    xm = pad + (W - 2 * pad) * max_length / top
    return (f'<svg class="mt-hist" viewBox="0 0 {W:.0f} {H:.0f}" role="img" '
            f'aria-label="token length histogram">'
            + "".join(bars)
            + f'<line class="mt-hist-axis" x1="{pad}" y1="{H - pad}" x2="{W - pad}" y2="{H - pad}"/>'
            f'<line class="mt-hist-max" x1="{xm:.1f}" y1="8" x2="{xm:.1f}" y2="{H - pad}"/>'
            f'<text class="mt-hist-label" x="{min(xm + 4, W - 120):.1f}" y="16">max_length {max_length}</text>'
            f'<text class="mt-hist-tick" x="{pad}" y="{H - 6}">0</text>'
            f'<text class="mt-hist-tick" x="{W - pad}" y="{H - 6}" text-anchor="end">{int(top)} tokens</text>'
            "</svg>")


def preview_html(p: Any) -> str:
    """p: core.data.DataPreview."""
    st = p.stats or {}
    over = (f'<span class="mt-warn-text">{p.n_over_max} of {p.n_rows} rows are longer than max_length '
            f'{p.max_length} and will be truncated</span>' if p.n_over_max
            else f"every row fits in max_length {p.max_length}")
    dropped = f" &middot; {p.n_dropped} empty rows dropped" if getattr(p, "n_dropped", 0) else ""
    head = (f'<div class="mt-preview" id="mt-preview"><div class="mt-preview-head"><b>Format: {E(p.format)}</b>'
            f' &middot; {p.n_rows} rows{dropped} &middot; tokens: median {st.get("median", 0):.0f}, '
            f'p95 {st.get("p95", 0):.0f}, max {st.get("max", 0):.0f} &middot; {over}</div>')
    examples = []
    for i, ex in enumerate(p.examples):
        if "text" in ex:
            body = f'<pre class="mt-pre mt-completion">{E(str(ex["text"]))}</pre>'
        else:
            body = (f'<div class="mt-ex-label">prompt (not trained on)</div><pre class="mt-pre mt-prompt">'
                    f'{E(str(ex.get("prompt", "")))}</pre><div class="mt-ex-label">completion (trained on)</div>'
                    f'<pre class="mt-pre mt-completion">{E(str(ex.get("completion", "")))}</pre>')
        examples.append(f'<div class="mt-example"><div class="mt-ex-num">example {i + 1}</div>{body}</div>')
    return head + histogram_svg(p.token_lengths, p.max_length) + "".join(examples) + "</div>"


def error_box(title: str, message: str) -> str:
    return (f'<div class="mt-problems mt-data-error" id="mt-data-error"><b>{E(title)}</b>'
            f'<pre class="mt-pre">{E(message)}</pre></div>')
