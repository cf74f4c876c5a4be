"""memtune's web app.

    python app.py                                   # http://127.0.0.1:7860, this machine only
    python app.py --port 8080
    python app.py --host 0.0.0.0 --auth me:secret   # reachable from the network: a password is required
    MEMTUNE_AUTH=me:secret python app.py --share    # public gradio.live link: a password is required

Prefer MEMTUNE_AUTH to --auth: a command-line argument is visible to every user of the machine in `ps`, an
environment variable is not. A wrong login waits a second before the answer, to slow down guessing.

Listening on anything but loopback, or a share link, without --auth (or MEMTUNE_AUTH) is refused: the page can
start training jobs and write files. Public mode (--public, implied on a Hugging Face Space where SPACE_ID is set)
is the one exception, made explicit: the app listens on 0.0.0.0, the page shows a banner, the server reads no
local path a visitor types (datasets from uploads or the Hub, runs only in ./runs, History and Export only there)
and trust_remote_code is unavailable (core.runs.public).
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import sys

# Before gradio is imported: no usage analytics, no version check against the network.
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

LOOPBACK_NAMES = {"localhost", "ip6-localhost"}


def is_loopback(host: str) -> bool:
    host = host.strip().strip("[]")
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name or an interface address: treat as exposed


def on_space() -> bool:
    return bool(os.environ.get("SPACE_ID"))


def parse_auth(text: str | None) -> tuple[str, str] | None:
    """'user:password' -> (user, password); the password may contain ':'. Raises ValueError if malformed."""
    if text is None or text == "":
        return None
    user, sep, password = text.partition(":")
    if not sep or not user.strip() or not password.strip():
        raise ValueError("--auth / MEMTUNE_AUTH must look like user:password (both non-empty, the password not "
                         "just spaces)")
    return user.strip(), password


FAILED_LOGIN_DELAY_S = 1.0  # slows password guessing to about one try per second per connection


def auth_check(auth: tuple[str, str], delay_s: float = FAILED_LOGIN_DELAY_S):
    """Gradio's login callback: constant-time comparison, and a pause after a wrong guess (without blocking the
    server: Gradio awaits a coroutine function)."""
    import asyncio
    import hmac

    user, password = auth

    async def check(username: str, typed: str) -> bool:
        ok = hmac.compare_digest(username.encode(), user.encode()) & hmac.compare_digest(typed.encode(),
                                                                                         password.encode())
        if not ok:
            await asyncio.sleep(delay_s)
        return bool(ok)

    return check


def exposure_problem(host: str, share: bool, auth: tuple[str, str] | None, space: bool = False) -> str | None:
    """Why these launch settings are refused, or None if they are fine."""
    if auth is not None or space:
        return None
    if share:
        return ("Refusing to create a public share link without a password: anyone with the link could start "
                "training jobs and write files on this machine. Set MEMTUNE_AUTH=user:password (or add --auth, "
                "which other users see in `ps`).")
    if not is_loopback(host):
        return (f"Refusing to listen on {host} without a password: other machines on the network could start "
                "training jobs and write files here. Set MEMTUNE_AUTH=user:password (or add --auth), or use the "
                "default --host 127.0.0.1.")
    return None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python app.py", description="memtune: QLoRA fine-tuning in the browser.")
    p.add_argument("--public", action="store_true", default=on_space(),
                   help="public mode for anyone on the internet, without a password (implied on a Hugging Face "
                        "Space): listens on 0.0.0.0, reads no server paths typed by visitors, keeps runs in ./runs, "
                        "no trust_remote_code")
    p.add_argument("--host", default=None,
                   help="interface to listen on (default 127.0.0.1: this machine only; 0.0.0.0 in public mode)")
    p.add_argument("--port", type=int, default=int(os.environ.get("GRADIO_SERVER_PORT", 7860)),
                   help="port (default 7860)")
    p.add_argument("--share", action="store_true", help="also create a public gradio.live link (needs --auth)")
    p.add_argument("--auth", default=None, metavar="USER:PASSWORD",
                   help="require this login (default: the MEMTUNE_AUTH environment variable)")
    args = p.parse_args(argv)
    args.host = args.host or ("0.0.0.0" if args.public else "127.0.0.1")
    if not 1 <= args.port <= 65535:
        p.error(f"--port {args.port} is not a port number (1-65535)")
    return args


def tidy_runs() -> None:
    """Finish or undo what a crash left in the default output folder (an adapter replace cut in half, temp
    folders): only in folders carrying memtune's marker. Runs before any job can start."""
    try:
        from core.config.settings import TrainConfig
        from core.runs.history import tidy

        for line in tidy(TrainConfig().output_dir):  # a run written to recently (e.g. a CLI run) is left alone
            print(f"memtune: {line}", file=sys.stderr)
        from core.runs.public import is_public, limits, prune_visitors

        if is_public():  # visitors' runs and uploads past the Space owner's retention (MEMTUNE_SPACE_KEEP_HOURS)
            for path in prune_visitors(limits().keep_hours, lambda run: False):  # no job runs yet
                print(f"memtune: removed {path} (kept {limits().keep_hours:g} h)", file=sys.stderr)
    except Exception as exc:  # noqa: BLE001 - tidying is a courtesy; never stop the app for it
        print(f"memtune: could not tidy the runs folder ({exc})", file=sys.stderr)


def end_training_on_exit(manager) -> None:
    """Ctrl-C, SIGTERM or a normal exit: stop the training child (it saves after its step), then end its group;
    end the model-running children (Try it, merge, GGUF export) too."""
    import atexit
    import signal

    def on_term(signum, frame):
        raise KeyboardInterrupt  # gradio closes the server on it; atexit then ends the child

    signal.signal(signal.SIGTERM, on_term)
    atexit.register(manager.shutdown)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from core.files import long_lived

    with long_lived():  # the libraries and the page live as long as the app
        demo = launch(args)
    if demo is None:
        return 2
    demo.memtune_app.manager.prepare()  # the libraries imported once, in the background, for every run's process (core/jobs/warm.py)
    print(f"memtune: running on {demo.local_url}", flush=True)
    if demo.share_url:
        print(f"memtune: public link {demo.share_url} (log in with the --auth user:password)", flush=True)
    elif hint := remote_hint(args.host):
        print(hint, flush=True)
    demo.block_thread()
    return 0


LOOPBACK = ("127.0.0.1", "localhost", "::1")  # hosts only this machine reaches


def remote_hint(host: str) -> str | None:
    """How to open the page from another machine: said only while it listens on this machine alone (not under
    --public or --host 0.0.0.0, where it is reachable already)."""
    if host not in LOOPBACK:
        return None
    return ("memtune: to open it from another machine, set a login and start with --share (a public gradio.live "
            "link) or --host 0.0.0.0: MEMTUNE_AUTH=user:password python app.py --host 0.0.0.0 (MEMTUNE_AUTH rather "
            "than --auth, which every user of this machine sees in `ps`)")


def launch(args):
    """The page, built and listening (not blocking); None if the options are refused (said on stderr)."""
    from core.quiet import quiet_libraries

    quiet_libraries(progress_bars=False)  # no library's progress bars in the server's terminal
    try:
        auth = parse_auth(args.auth if args.auth is not None else os.environ.get("MEMTUNE_AUTH"))
    except ValueError as exc:
        print(f"memtune: {exc}", file=sys.stderr)
        return None
    problem = exposure_problem(args.host, args.share, auth, space=args.public)
    if problem:
        print(f"memtune: {problem}", file=sys.stderr)
        return None
    if args.public:
        from core.runs.public import PUBLIC_ENV, public_root

        os.environ[PUBLIC_ENV] = "1"  # core.runs.public reads it: validation and the loaders refuse visitors' paths
        print(f"memtune: PUBLIC MODE on {args.host}:{args.port}: anyone who reaches it can train. Visitors' server "
              f"paths are refused, runs stay in {public_root()}, trust_remote_code is off.", file=sys.stderr)

    from starlette.middleware import Middleware

    from core.estimate.measure import measuring_here
    from core.jobs.manager import JobManager
    from ui import CSS, EarlyScript, build_ui, make_theme
    from ui.state import AppState

    tidy_runs()
    manager = JobManager()  # the app's one manager (its queue, its children), handed to the page once
    end_training_on_exit(manager)
    # This process never builds a model (no torch, transformers or peft here): the estimate reads what inspect
    # children measured (core/jobs/actions.py Inspections), the first of which builds the offline demo model.
    measuring_here(False)
    demo = build_ui(app=AppState(manager))
    middleware = [Middleware(EarlyScript)]  # Gradio's frontend fixed before it loads (ui/early.py)
    if args.public:
        from ui.visitors import VisitorCookie

        middleware.append(Middleware(VisitorCookie))  # each visitor an id the server issued, in a signed cookie
        from ui.files_guard import FilesGuard

        middleware.append(Middleware(FilesGuard))  # inside it: a file Gradio handed a visitor, served to them only
    if auth:
        from ui.login import LoginRequired

        middleware.insert(0, Middleware(LoginRequired))  # outermost: no login, no route (Gradio leaves a few open)
    demo.queue(default_concurrency_limit=1)
    # Gradio's queue looks for work every 1 ms while it has none (every 50 ms on Windows) and for progress every
    # 10 ms: ~1,600 wake-ups a second, 8% of a core for a page nobody uses. Every 20 ms instead: an event waits at
    # most that long for its turn, and the idle app costs nothing measurable.
    queue = getattr(demo, "_queue", None)
    if queue is not None and hasattr(queue, "sleep_when_free"):
        queue.sleep_when_free = max(queue.sleep_when_free, 0.02)
        queue.progress_update_sleep_when_free = max(getattr(queue, "progress_update_sleep_when_free", 0), 0.05)
    demo.launch(
        server_name=args.host,
        server_port=args.port,
        share=args.share,
        auth=auth_check(auth) if auth else None,
        auth_message="memtune: log in with the user:password given to --auth / MEMTUNE_AUTH." if auth else None,
        theme=make_theme(),
        css=CSS,
        footer_links=[],
        run_history=False,  # no copy of every poll in the browser's storage
        show_error=True,
        ssr_mode=False,
        pwa=False,
        mcp_server=False,
        quiet=True,  # Gradio's own hint says "set share=True in launch()": memtune's line below says how here
        prevent_thread_lock=True,
        app_kwargs={"middleware": middleware},

    )
    return demo


if __name__ == "__main__":
    sys.exit(main())
