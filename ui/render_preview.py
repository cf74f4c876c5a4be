"""HTML for the data preview: core.data.plan's plan (counts per outcome, a token-length histogram, the first rows as they
train) and the data errors shown in its place. Pure functions, every user-supplied string escaped (as ui/render.py).
"""

from __future__ import annotations

from typing import Any

from core.i18n import t
from ui.render import E, integer, log_text


# --- data preview ---------------------------------------------------------------------------------------------------
# Bar colour per outcome (core.data.plan.REASONS); kept/dropped reuse the theme's classes.
HIST_CLASS = {"kept": "mt-hist-ok", "truncated": "mt-hist-trunc", "prompt_cut": "mt-hist-cut",
              "dropped_long": "mt-hist-over"}
HIST_FILL = {"mt-hist-trunc": "#f59e0b", "mt-hist-cut": "#8b5cf6"}
SWATCH = {"mt-hist-ok": "var(--primary-400)", "mt-hist-over": "#ef4444", **HIST_FILL}


def histogram_svg(lengths: list[int], max_length: int, bins: int = 32, lang: str = "en",
                  reasons: list[str] | None = None) -> str:
    """Token lengths as stacked bars (one colour per outcome), max_length marked, the share of each outcome."""
    if not lengths:
        return ""
    reasons = reasons or ["kept" if n <= max_length else "truncated" for n in lengths]
    ordered = sorted(lengths)
    # One huge row must not squash every other bar into the first one: rows beyond p99 share the last bin.
    top = max(ordered[int(0.99 * (len(ordered) - 1))], max_length) * 1.05
    width = top / bins
    counts = [dict.fromkeys(HIST_CLASS, 0) for _ in range(bins)]
    for n, reason in zip(lengths, reasons):
        counts[min(bins - 1, int(n / width))][reason] += 1
    peak = max(sum(c.values()) for c in counts) or 1
    W, H, pad = 600.0, 150.0, 22.0
    bw = (W - 2 * pad) / bins
    bars = []
    for i, per in enumerate(counts):
        y = H - pad
        lo, hi = int(i * width), int((i + 1) * width)
        for reason, c in per.items():
            if not c:
                continue
            h = (H - 2 * pad) * c / peak
            y -= h
            cls = HIST_CLASS[reason]
            fill = f' fill="{HIST_FILL[cls]}"' if cls in HIST_FILL else ""
            bars.append(f'<rect class="{cls}"{fill} x="{pad + i * bw + 1:.1f}" y="{y:.1f}" width="{bw - 2:.1f}" '
                        f'height="{h:.1f}"><title>{lo}-{hi} tokens: {c} '
                        f'{E(t(f"preview.legend.{reason}", lang))}</title></rect>')
    xm = pad + (W - 2 * pad) * max_length / top
    legend = " &middot; ".join(
        f'<span class="mt-legend" data-reason="{r}"><span style="display:inline-block;width:.7em;height:.7em;'
        f'background:{SWATCH[HIST_CLASS[r]]}"></span> <b>{share:.0%}</b> '
        f'{E(t(f"preview.legend.{r}", lang))}</span>'
        for r in HIST_CLASS if (share := reasons.count(r) / len(reasons)) or r == "kept")
    return (f'<svg class="mt-hist" viewBox="0 0 {W:.0f} {H:.0f}" role="img" '
            f'aria-label="{E(t("preview.histogram", lang))}">'
            + "".join(bars)
            + f'<line class="mt-hist-axis" x1="{pad}" y1="{H - pad}" x2="{W - pad}" y2="{H - pad}"/>'
            f'<line class="mt-hist-max" x1="{xm:.1f}" y1="8" x2="{xm:.1f}" y2="{H - pad}"/>'
            f'<text class="mt-hist-label" x="{min(xm + 4, W - 120):.1f}" y="16">max_length {max_length}</text>'
            f'<text class="mt-hist-tick" x="{pad}" y="{H - 6}">0</text>'
            f'<text class="mt-hist-tick" x="{W - pad}" y="{H - 6}" text-anchor="end">'
            f'{"≥ " if ordered[-1] > top else ""}{int(top)} tokens</text>'
            f'</svg><div class="mt-hist-legend" id="mt-hist-legend">{legend}</div>')


def preview_html(p: Any, lang: str = "en") -> str:
    """p: core.data.plan.DataPlan: the counts per outcome, the histogram and the first rows as they train."""
    st = p.stats or {}
    tokens = t("preview.tokens", lang, median=f'{st.get("median", 0):.0f}', p95=f'{st.get("p95", 0):.0f}',
               max=f'{st.get("max", 0):.0f}')
    counts = [(r, t(f"preview.reason.{r}", lang, n=n)) for r, n in p.counts.items() if n or r == "kept"]
    if p.packing and p.n_packs is not None:
        counts.append(("packs", t("preview.packs", lang, n=p.n_packs, max_length=p.max_length)))
    counts_html = " &middot; ".join(f'<span data-reason="{r}">{E(text)}</span>' for r, text in counts)
    train = t("preview.train", lang, n=p.n_train, rows=p.n_source)
    head = (f'<div class="mt-preview" id="mt-preview" data-train="{p.n_train}"><div class="mt-preview-head">'
            f'<b>{E(t("preview.format", lang, format=p.format))}</b> &middot; <b>{E(train)}</b> &middot; {E(tokens)}'
            f'</div><div class="mt-preview-counts" id="mt-preview-counts">{counts_html}</div>')
    refusal = p.refusal()
    if refusal:
        head += error_box(t("preview.refused", lang), log_text(refusal, lang))
    notes = "".join(f'<div class="mt-small mt-warn-text">{E(log_text(n, lang))}</div>' for n in p.notes)
    examples = []
    for ex in p.examples:
        label = t("preview.row", lang, n=ex["row"], tokens=integer(ex["tokens"], lang),
                  what=t(f"preview.one.{ex['reason']}", lang))  # one row: "tient", not the legend's "tiennent"
        note = f'<div class="mt-small mt-warn-text">{E(log_text(ex["note"], lang))}</div>' if ex.get("note") else ""
        if "text" in ex:
            body = f'<pre class="mt-pre mt-completion">{E(str(ex["text"]))}</pre>'
        else:
            body = (f'<div class="mt-ex-label">{E(t("preview.prompt", lang))}</div><pre class="mt-pre mt-prompt">'
                    f'{E(str(ex.get("prompt", "")))}</pre><div class="mt-ex-label">{E(t("preview.completion", lang))}'
                    f'</div><pre class="mt-pre mt-completion">{E(str(ex.get("completion", "")))}</pre>')
        examples.append(f'<div class="mt-example" data-reason="{E(ex["reason"])}"><div class="mt-ex-num">'
                        f'{E(label)}</div>{note}{body}</div>')
    return (head + notes + histogram_svg(p.lengths, p.max_length, lang=lang, reasons=p.reasons)
            + "".join(examples) + "</div>")


def images_html(found: dict[str, Any], notes: list[str], refusal: str = "", lang: str = "en") -> str:
    """Image rows' preview (core.jobs.preview.images' answer; `notes`: its notes said in `lang`): the counts, the
    token-length histogram (`refusal`: why nothing would train, said in `lang`), and the first rows, each with its images' thumbnails, its token and image-token counts and
    the exact text that trains, each run of image tokens one mark with its count."""
    p = found["plan"]
    lengths, max_length = p["lengths"], p["max_length"]
    reasons = ["kept" if n <= max_length else "dropped_long" for n in lengths]
    train = t("preview.train", lang, n=p["n_train"], rows=p["n_source"])
    image_tokens = t("preview.images.per_row", lang, n=integer(max(p["image_tokens"], default=0), lang))
    head = (f'<div class="mt-preview" id="mt-preview" data-train="{p["n_train"]}"><div class="mt-preview-head">'
            f'<b>{E(t("preview.format", lang, format="messages+images"))}</b> &middot; <b>{E(train)}</b> &middot; '
            f'{E(image_tokens)}</div>')
    if refusal:
        head += error_box(t("preview.refused", lang), refusal)
    lines = "".join(f'<div class="mt-small">{E(n)}</div>' for n in notes)
    rows = []
    for r in found["rows"]:
        label = t("preview.images.row", lang, n=r["row"], tokens=integer(r["tokens"], lang),
                  image_tokens=integer(r["image_tokens"], lang), what=t(f"preview.one.{r['reason']}", lang))
        thumbs = "".join(f'<img class="mt-thumb" src="{E(src)}" alt="{E(alt)}">' for i, src in enumerate(r["thumbs"])
                         if str(src).startswith("data:image/")  # made by the child: never a link to a file
                         and (alt := t("preview.images.alt", lang, n=r["row"], i=i + 1)))
        text = "".join(E(part["text"]) if "text" in part else f'<span class="mt-image-tokens">'
                       f'{E(t("preview.images.tokens", lang, n=integer(part["image_tokens"], lang)))}</span>'
                       for part in r["text"])
        rows.append(f'<div class="mt-example mt-image-row" data-reason="{E(r["reason"])}" data-image-tokens='
                    f'"{int(r["image_tokens"])}"><div class="mt-ex-num">{E(label)}</div><div class="mt-thumbs">'
                    f'{thumbs}</div><div class="mt-ex-label">{E(t("preview.images.trains", lang))}</div>'
                    f'<pre class="mt-pre mt-completion">{text}</pre></div>')
    return head + lines + histogram_svg(lengths, max_length, lang=lang, reasons=reasons) + "".join(rows) + "</div>"


def error_box(title: str, message: str) -> str:
    return (f'<div class="mt-problems mt-data-error" id="mt-data-error"><b>{E(title)}</b>'
            f'<pre class="mt-pre">{E(message)}</pre></div>')
