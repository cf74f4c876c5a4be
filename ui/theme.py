"""Look and feel: a Gradio theme with system fonts only (nothing fetched from a CDN) and the page's CSS."""

from __future__ import annotations

import inspect
import json

import gradio as gr

SANS = ["ui-sans-serif", "system-ui", "-apple-system", "Segoe UI", "Roboto", "Helvetica Neue", "Arial", "sans-serif"]
MONO = ["ui-monospace", "SFMono-Regular", "Menlo", "Consolas", "DejaVu Sans Mono", "monospace"]


# Tabs that do not fit one line wrap onto a second instead of hiding in Gradio's "..." menu, where nobody finds
# them (French once hid "4 · Réglages et code" at 1280 px). Older Gradio 6 releases lack the option.
TABS_KW = {"overflow_behavior": "wrap"} if "overflow_behavior" in inspect.signature(gr.Tabs.__init__).parameters else {}


# Gradio writes its own strings ("Drop File Here - or - Click to Upload", "Loading...", the table's and plots'
# buttons) in the locale its frontend took from the browser, not in the page's. Its frontend switches locale
# through `changeLocale`, what its own settings panel calls; the module is found by the name it was loaded under
# (hashed per release). Without it (another Gradio), only the page's lang attribute follows. memtune's pt is
# Brazilian Portuguese, Gradio's "pt" European.
GRADIO_LOCALES = {"en": "en", "pt": "pt-BR", "fr": "fr", "es": "es", "de": "de", "zh": "zh-CN", "ja": "ja", "ko": "ko"}
GRADIO_LOCALE_JS = """async (lang) => {
  const code = %s[lang] || "en";
  const core = performance.getEntriesByType("resource").map(e => e.name)
    .find(n => /\\/core-[^\\/]*\\.js(\\?|$)/.test(n));
  try {
    const m = core && await import(core);
    if (m && m.changeLocale) {
      m.changeLocale(code);
      // It returns before the language's strings are loaded; they are once Gradio sets the page's lang attribute.
      for (let i = 0; i < 100 && document.documentElement.lang !== code; i++) await new Promise(r => setTimeout(r, 30));
    }
  } catch (e) { console.warn("memtune: Gradio's locale stays", e); }
  document.documentElement.lang = code;
  return [];
}""" % json.dumps(GRADIO_LOCALES)


def make_theme() -> gr.themes.Base:
    # Plain font names (str): gr.themes.GoogleFont would make every page load fetch fonts from Google.
    return gr.themes.Soft(primary_hue="indigo", secondary_hue="sky", neutral_hue="slate",
                          font=SANS, font_mono=MONO, radius_size="md").set(
        block_title_text_weight="600",
        button_primary_background_fill="*primary_600",
        button_primary_background_fill_hover="*primary_700",
    )


CSS = """
.gradio-container { max-width: 1500px !important; }
#mt-header h1 { margin: 0 0 2px 0; font-size: 1.6rem; letter-spacing: -0.01em; }
#mt-header p { margin: 0; color: var(--body-text-color-subdued); }
#mt-hw { font-size: 0.9rem; }
.mt-muted { color: var(--body-text-color-subdued); font-size: 0.85rem; }
.mt-pre { white-space: pre-wrap; word-break: break-word; margin: 4px 0; font-family: var(--font-mono);
          font-size: 0.82rem; background: transparent; border: none; padding: 0; }

/* bars: gauge and progress */
.mt-bar { position: relative; height: 14px; border-radius: 7px; background: var(--neutral-200);
          overflow: visible; margin: 6px 0 4px 0; }
.dark .mt-bar { background: var(--neutral-700); }
.mt-bands { background: linear-gradient(90deg, rgba(34,197,94,.18) 0 70%, rgba(245,158,11,.22) 70% 90%,
                                              rgba(239,68,68,.25) 90% 100%); }
.mt-fill { height: 100%; border-radius: 7px; transition: width .6s ease; background: var(--primary-500); }
.mt-fill.mt-ok { background: #16a34a; } .mt-fill.mt-warn { background: #d97706; } .mt-fill.mt-high { background: #dc2626; }
.mt-peak { position: absolute; top: -4px; width: 3px; height: 22px; background: #7c3aed; border-radius: 2px; }
.mt-predicted { position: absolute; top: -4px; width: 0; height: 22px; border-left: 3px dashed #0ea5e9; }
.mt-peak-key, .mt-pred-key { display: inline-block; width: 10px; height: 10px; margin-right: 4px; border-radius: 2px;
                             vertical-align: -1px; }
.mt-peak-key { background: #7c3aed; } .mt-pred-key { background: #0ea5e9; }
.mt-gauge { padding: 4px 2px; }
.mt-run-gpu-tag { font-size: .78em; padding: 0 6px; margin-left: 6px; border-radius: 8px;
  background: var(--primary-100); color: var(--primary-700); }
.mt-gauge-head, .mt-progress-top { display: flex; justify-content: space-between; gap: 8px; font-size: 0.9rem;
                                   align-items: center; }
.mt-gauge-foot, .mt-stats { font-size: 0.82rem; color: var(--body-text-color-subdued); }
.mt-nogpu { display: block; padding: 8px 10px; border-radius: 8px; background: var(--neutral-100); }
.dark .mt-nogpu { background: var(--neutral-800); }
.mt-dot { display: inline-block; width: 9px; height: 9px; border-radius: 50%; background: #94a3b8; margin-right: 6px; }
.mt-indeterminate { background: repeating-linear-gradient(45deg, var(--primary-400) 0 10px, var(--primary-300) 10px 20px) !important;
                    background-size: 28px 28px !important; animation: mt-stripes 1s linear infinite; }
@keyframes mt-stripes { from { background-position: 0 0; } to { background-position: 28px 0; } }

/* badges */
.mt-badge { font-size: 0.75rem; font-weight: 600; padding: 2px 8px; border-radius: 999px; text-transform: uppercase;
            letter-spacing: .03em; background: var(--neutral-200); color: var(--neutral-700); }
.mt-badge-running { background: #e0e7ff; color: #3730a3; } .mt-badge-stopping { background: #fef3c7; color: #92400e; }
.mt-badge-completed { background: #dcfce7; color: #166534; } .mt-badge-stopped { background: #fef3c7; color: #92400e; }
.mt-badge-failed, .mt-badge-interrupted { background: #fee2e2; color: #991b1b; }

/* summary chips */
.mt-summary { display: flex; flex-wrap: wrap; gap: 6px; }
.mt-chip { font-size: 0.8rem; padding: 3px 9px; border-radius: 999px; background: var(--neutral-100);
           border: 1px solid var(--border-color-primary); white-space: nowrap; max-width: 100%;
           overflow: hidden; text-overflow: ellipsis; }
.dark .mt-chip { background: var(--neutral-800); }
.mt-chip-strong { background: var(--primary-100); border-color: var(--primary-300); font-weight: 600; }
.dark .mt-chip-strong { background: var(--primary-900); }

/* problems, notes, results */
.mt-problems { margin-top: 8px; padding: 8px 12px; border-radius: 8px; border: 1px solid #fca5a5; background: #fef2f2;
               color: #7f1d1d; font-size: 0.88rem; }
.mt-problems ul { margin: 4px 0 0 18px; padding: 0; } .mt-problems li { margin: 2px 0; }
.dark .mt-problems { background: #450a0a; color: #fecaca; border-color: #7f1d1d; }
.mt-note { padding: 6px 10px; border-radius: 8px; font-size: 0.88rem; border: 1px solid var(--border-color-primary); }
.mt-note-ok { background: #f0fdf4; border-color: #86efac; color: #14532d; }
.mt-note-warn { background: #fffbeb; border-color: #fcd34d; color: #78350f; }
.mt-note-error { background: #fef2f2; border-color: #fca5a5; color: #7f1d1d; }
.mt-result { padding: 10px 14px; border-radius: 10px; border: 1px solid var(--border-color-primary); }
.mt-result-ok { background: #f0fdf4; border-color: #86efac; }
.mt-result-stopped { background: #fffbeb; border-color: #fcd34d; }
.mt-result-failed { background: #fef2f2; border-color: #fca5a5; color: #7f1d1d; }
.dark .mt-result-ok, .dark .mt-result-stopped, .dark .mt-result-failed { background: var(--neutral-800); color: inherit; }
.mt-kv { display: grid; grid-template-columns: max-content 1fr; gap: 3px 14px; margin-top: 6px; font-size: 0.88rem; }
.mt-k { color: var(--body-text-color-subdued); white-space: nowrap; }
.mt-v { overflow-wrap: anywhere; }  /* a path breaks where it must, a sentence between its words */
.mt-log { display: flex; flex-direction: column-reverse; height: 210px; overflow-y: auto; padding: 6px 10px;
          border: 1px solid var(--border-color-primary); border-radius: 8px; background: var(--neutral-50); }
.dark .mt-log { background: var(--neutral-900); }
/* log lines wrap (long paths and tracebacks were cut off at the panel's edge); indentation is kept */
.mt-log .mt-pre { font-size: 0.76rem; line-height: 1.4; white-space: pre-wrap; overflow-wrap: anywhere; }
.mt-warn-text { color: #b45309; font-weight: 600; }

/* checklist */
.mt-check-row { align-items: center !important; border-bottom: 1px solid var(--border-color-primary); padding: 2px 0 6px 0; }
.mt-check-row:last-child { border-bottom: none; }
.mt-check input[type=checkbox] { transform: scale(1.15); }
.mt-check label span { font-weight: 600; }

/* data preview */
.mt-preview-head { font-size: 0.88rem; margin-bottom: 4px; }
.mt-hist { width: 100%; height: auto; max-height: 170px; }
.mt-hist-ok { fill: var(--primary-400); } .mt-hist-over { fill: #ef4444; }
.mt-hist-axis { stroke: var(--neutral-400); stroke-width: 1; }
.mt-hist-max { stroke: #dc2626; stroke-width: 2; stroke-dasharray: 5 3; }
.mt-hist-label { fill: #dc2626; font-size: 12px; font-weight: 600; }
.mt-hist-tick { fill: var(--body-text-color-subdued); font-size: 11px; }
.mt-example { border: 1px solid var(--border-color-primary); border-radius: 8px; padding: 6px 10px; margin-top: 8px; }
.mt-ex-num, .mt-ex-label { font-size: 0.72rem; text-transform: uppercase; letter-spacing: .04em;
                           color: var(--body-text-color-subdued); }
.mt-prompt { color: var(--body-text-color-subdued); }
.mt-completion { font-weight: 600; }
.mt-thumbs { display: flex; gap: 6px; margin: 4px 0; }
.mt-thumb { width: 96px; height: 96px; object-fit: contain; border: 1px solid var(--border-color-primary);
  border-radius: 4px; image-rendering: pixelated; background: #fff; }
.mt-image-tokens { background: var(--primary-100); color: var(--primary-800); border-radius: 4px; padding: 0 4px;
  font-weight: 400; }

/* header and language picker */
#mt-top { align-items: flex-start !important; }
#lang-select { max-width: 200px; margin-left: auto; }
/* a zip to download: its size is in the label, in the page's units (ui/live.py, ui/tryexport.py); Gradio's own
   "148.8 KB" in the link (English units, a dot in every language) is hidden, its arrow kept */
#adapter-download td.download a, #export-zip-file td.download a { font-size: 0 !important; display: inline-block; }
#adapter-download td.download a::after, #export-zip-file td.download a::after { content: "\\21E3"; font-size: var(--text-md, 14px); }
/* toasts (gr.Warning / gr.Info) at the bottom right: at the top they covered the language picker */
.toast-wrap { top: auto !important; bottom: var(--size-4, 16px) !important; }

/* predicted peak on the gauge */
.mt-pred-seg { position: absolute; top: 0; height: 100%; border-radius: 7px;
               background: repeating-linear-gradient(135deg, rgba(14,165,233,.55) 0 6px, rgba(14,165,233,.25) 6px 12px);
               outline: 1px solid #0ea5e9; }
.mt-pred-seg.mt-pred-over { background: repeating-linear-gradient(135deg, rgba(220,38,38,.55) 0 6px,
                                                                  rgba(220,38,38,.25) 6px 12px); outline-color: #dc2626; }
.mt-cpu-pred { margin-top: 10px; padding-top: 8px; border-top: 1px dashed var(--border-color-primary); }
.mt-cpu-pred .mt-bar { margin-top: 6px; }

/* checklist facts: what an item saves here, what it costs in speed */
.mt-facts { display: flex; flex-direction: column; gap: 3px; margin: 0 0 4px 0; font-size: 0.8rem; }
.mt-fact { display: flex; gap: 8px; align-items: baseline; }
.mt-fact-k { flex: 0 0 72px; font-size: 0.68rem; font-weight: 700; text-transform: uppercase; letter-spacing: .04em;
             padding: 1px 6px; border-radius: 999px; text-align: center; }
.mt-fact-mem .mt-fact-k { background: #dcfce7; color: #166534; }
.mt-fact-mem.mt-fact-zero .mt-fact-k { background: var(--neutral-200); color: var(--neutral-600); }
.mt-fact-mem .mt-fact-v { font-weight: 600; }
.mt-fact-mem.mt-fact-zero .mt-fact-v { font-weight: 400; color: var(--body-text-color-subdued); }
.mt-fact-speed .mt-fact-k { background: #e0f2fe; color: #075985; }
.mt-fact-v { display: flex; flex-direction: column; gap: 2px; }
.mt-fact-line { line-height: 1.35; }
.mt-fact-mem .mt-fact-v .mt-fact-chapter { font-weight: 600; color: var(--body-text-color); }  /* the 8B figure */
.mt-src { display: block; font-size: 0.7rem; line-height: 1.3; color: var(--body-text-color-subdued); font-style: italic; }
.dark .mt-fact-mem .mt-fact-k { background: #14532d; color: #dcfce7; }
.dark .mt-fact-speed .mt-fact-k { background: #0c4a6e; color: #e0f2fe; }

/* predicted vs measured peaks */
.mt-peaks-title { margin-top: 8px; font-size: 0.8rem; font-weight: 600; color: var(--body-text-color-subdued); }
.mt-peaks { border-collapse: collapse; font-size: 0.84rem; margin-top: 2px; width: 100%; }
.mt-peaks, .mt-peaks thead, .mt-peaks tbody, .mt-peaks tr, .mt-peaks th, .mt-peaks td {
    border: none !important; background: transparent !important; }
.mt-peaks th, .mt-peaks td { text-align: left; padding: 2px 12px 2px 0 !important; white-space: nowrap; }
.mt-peaks td.mt-peaks-cpu { vertical-align: middle; white-space: normal; }
.mt-peaks thead th { font-size: 0.72rem; text-transform: uppercase; letter-spacing: .04em;
                     color: var(--body-text-color-subdued); }
.mt-peaks tbody th { font-weight: 400; color: var(--body-text-color-subdued); white-space: nowrap; }

/* try it, history */
.mt-answer textarea { font-size: 0.95rem !important; line-height: 1.45 !important; }
.mt-answer-tuned textarea { background: #f0fdf4 !important; }
.dark .mt-answer-tuned textarea { background: #052e16 !important; }
.mt-history-detail { background: var(--neutral-50); }
/* column headers break between words only ("Resumable", not "Resuma|ble") */
#history-table th, #history-table th * { word-break: normal !important; overflow-wrap: normal !important;
                                         hyphens: none !important; }
.dark .mt-history-detail { background: var(--neutral-900); }
/* a picked run is a row, not a cell being edited: no cell outline (Gradio 6 draws it on the cell's text), no
   move handles, no cell menu (the table is read-only) */
#history-table .cell-selected, #history-table .cell-selected * { box-shadow: none !important; outline: none !important;
                                                               animation: none !important; }
#history-table .selection-button, #history-table .cell-menu-button { display: none !important; }
#history-confirm { padding: 0 !important; border: none !important; background: none !important; }  /* one frame:
   the confirmation note's own */
.mt-note { margin: 4px 0; }

/* the settings tabs fit one line in every language (the hidden copy is what Gradio measures for overflow) */
#settings-tabs .tab-container > button { padding-left: 8px !important; padding-right: 8px !important;
                                         font-size: 0.9rem !important; }

#mt-run-panel { position: sticky; top: 8px; }
#start-btn, #stop-btn { min-height: 44px; font-size: 1rem; }
#fit-row { align-items: flex-end !important; }
#fit-btn { align-self: flex-end; max-height: 42px; margin-bottom: 2px; }
.mt-bottom-row { align-items: flex-end !important; }
.mt-bottom-row > button { align-self: flex-end; max-height: 42px; margin-bottom: 2px; }
.mt-small, .mt-small p, .mt-small li { font-size: 0.8rem !important; color: var(--body-text-color-subdued); }
footer { display: none !important; }

/* Long words (German compounds) and a phone's width: a label breaks inside a word rather than being clipped by its
   field's box, and below 640 px each settings field takes the whole row (three checkboxes side by side left each
   ~100 px at 390 px, their help cut off). */
[data-testid=block-info], .info-text { overflow-wrap: anywhere; }
@media (max-width: 640px) {
  #settings-tabs .form > .block, #settings-tabs .row > .block { min-width: 100% !important; }
}
"""
