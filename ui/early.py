"""A script at the top of the page's <head>, before Gradio's own modules run: `EarlyScript` is an ASGI middleware
app.py hands to Gradio's FastAPI app (launch's app_kwargs), so it applies to every page Gradio serves.

Why early: Gradio's status tracker (assets/statustracker-*.js, 6.x) keeps `requestAnimationFrame` in a variable when
its module loads, so only a wrapper installed before that changes what it calls; `head=` and `js=` run after it.

What it fixes: the tracker counts elapsed seconds with a requestAnimationFrame loop that only its own status change
stops. A tracker removed while still "pending" (the page's "Loading..." tracker, on every load) keeps that loop
running for as long as the tab is open: 60 frames a second on an idle page, half a CPU core in a headless browser
and a laptop's fan on a user's. The wrapper lets those callbacks (the loop's `()=>{set(elapsed,
(performance.now()-start)/1e3), running&&again()}`) through a few times a second, together in one frame: the
visible timers still count, the orphaned loops cost ~5 frames a second in all. Any other callback is untouched.
tests/test_browser_layout.py counts the frames an idle page asks for, so a Gradio release that changes the loop is
noticed.
"""

from __future__ import annotations

from typing import Any, Callable

FRAME_MS = 200  # the elapsed-time loops' pace: Gradio shows tenths of a second, users read whole ones

THROTTLE_TIMER_FRAMES_JS = """(() => {
  const raf = window.requestAnimationFrame.bind(window);
  // Gradio's elapsed-time loop, minified: ()=>{F(Pe,(performance.now()-w(de))/1e3),W&&ze()}
  const timerLoop = /^\\(\\)=>\\{[\\w$]+\\([\\w$]+,\\(performance\\.now\\(\\)-[\\w$]+\\([\\w$]+\\)\\)\\/1e3\\),[\\w$]+&&[\\w$]+\\(\\)\\}$/;
  let waiting = [];
  window.requestAnimationFrame = function (cb) {
    if (typeof cb !== "function" || cb.length !== 0 || !timerLoop.test(String(cb))) return raf(cb);
    if (waiting.push(cb) === 1) {
      setTimeout(() => raf((t) => { const due = waiting; waiting = []; for (const f of due) f(t); }), %d);
    }
    return 0;  // nothing to cancel: Gradio never cancels this loop (the bug above)
  };
})();""" % FRAME_MS


class EarlyScript:
    """ASGI middleware: `script` inserted right after `<head>` of every HTML response; anything else passes as is."""

    def __init__(self, app: Callable[..., Any], script: str = THROTTLE_TIMER_FRAMES_JS) -> None:
        self.app = app
        self.tag = f"<script>{script}</script>".encode()

    async def __call__(self, scope: dict, receive: Callable[..., Any], send: Callable[..., Any]) -> None:
        if scope["type"] != "http" or scope.get("method") != "GET":
            await self.app(scope, receive, send)
            return
        start: dict | None = None
        body: list[bytes] = []
        html = False

        async def edit(message: dict) -> None:
            nonlocal start, html
            if message["type"] == "http.response.start":
                ctype = dict((k.lower(), v) for k, v in message.get("headers", [])).get(b"content-type", b"")
                html = ctype.startswith(b"text/html")
                if html:
                    start = message  # held until the body is complete: its length changes
                    return
            if not html or message["type"] != "http.response.body":
                await send(message)
                return
            body.append(message.get("body", b""))
            if message.get("more_body"):
                return
            data = b"".join(body).replace(b"<head>", b"<head>" + self.tag, 1)
            headers = [(k, v) for k, v in start["headers"] if k.lower() != b"content-length"]
            await send({**start, "headers": headers + [(b"content-length", str(len(data)).encode())]})
            await send({"type": "http.response.body", "body": data})

        await self.app(scope, receive, edit)
