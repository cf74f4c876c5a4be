"""memtune's web app.

    python app.py                                   # http://127.0.0.1:7860, this machine only
    python app.py --port 8080
    python app.py --host 0.0.0.0 --auth me:secret   # reachable from the network: a password is required
    MEMTUNE_AUTH=me:secret python app.py --share    # public gradio.live link: a password is required

Listening on anything but loopback, or a share link, without --auth (or MEMTUNE_AUTH) is refused: the page can
start training jobs and write files. On a Hugging Face Space (SPACE_ID set) the Space's own front end is the
exposure, so the app listens on 0.0.0.0 there as Spaces require.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import sys
import threading

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
    if not sep or not user.strip() or not password:
        raise ValueError("--auth / MEMTUNE_AUTH must look like user:password (both non-empty)")
    return user.strip(), password


def exposure_problem(host: str, share: bool, auth: tuple[str, str] | None, space: bool = False) -> str | None:
    """Why these launch settings are refused, or None if they are fine."""
    if auth is not None or space:
        return None
    if share:
        return ("Refusing to create a public share link without a password: anyone with the link could start "
                "training jobs and write files on this machine. Add --auth user:password (or set MEMTUNE_AUTH).")
    if not is_loopback(host):
        return (f"Refusing to listen on {host} without a password: other machines on the network could start "
                "training jobs and write files here. Add --auth user:password (or set MEMTUNE_AUTH), or use the "
                "default --host 127.0.0.1.")
    return None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    space = on_space()
    p = argparse.ArgumentParser(prog="python app.py", description="memtune: QLoRA fine-tuning in the browser.")
    p.add_argument("--host", default="0.0.0.0" if space else "127.0.0.1",
                   help="interface to listen on (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=int(os.environ.get("GRADIO_SERVER_PORT", 7860)),
                   help="port (default 7860)")
    p.add_argument("--share", action="store_true", help="also create a public gradio.live link (needs --auth)")
    p.add_argument("--auth", default=None, metavar="USER:PASSWORD",
                   help="require this login (default: the MEMTUNE_AUTH environment variable)")
    args = p.parse_args(argv)
    if not 1 <= args.port <= 65535:
        p.error(f"--port {args.port} is not a port number (1-65535)")
    return args


def warm_demo_model() -> None:
    """Build the offline demo model in the background so the first demo run starts at once."""
    def build() -> None:
        try:
            from core.demo import ensure_demo_model

            ensure_demo_model()
        except Exception as exc:  # noqa: BLE001 - the run itself will report it properly
            print(f"memtune: could not pre-build the demo model ({exc})", file=sys.stderr)

    threading.Thread(target=build, name="memtune-demo-warmup", daemon=True).start()


def end_training_on_exit() -> None:
    """Ctrl-C, SIGTERM or a normal exit: stop the training child (it saves after its step), then end its group."""
    import atexit
    import signal

    from core.jobs import MANAGER

    def on_term(signum, frame):
        raise KeyboardInterrupt  # gradio closes the server on it; atexit then ends the child

    signal.signal(signal.SIGTERM, on_term)
    atexit.register(MANAGER.shutdown)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        auth = parse_auth(args.auth if args.auth is not None else os.environ.get("MEMTUNE_AUTH"))
    except ValueError as exc:
        print(f"memtune: {exc}", file=sys.stderr)
        return 2
    problem = exposure_problem(args.host, args.share, auth, space=on_space())
    if problem:
        print(f"memtune: {problem}", file=sys.stderr)
        return 2

    from ui import CSS, build_ui, make_theme

    end_training_on_exit()
    warm_demo_model()
    demo = build_ui()
    demo.queue(default_concurrency_limit=1)
    demo.launch(
        server_name=args.host,
        server_port=args.port,
        share=args.share,
        auth=auth,
        auth_message="memtune: log in with the user:password given to --auth / MEMTUNE_AUTH." if auth else None,
        theme=make_theme(),
        css=CSS,
        footer_links=[],
        run_history=False,  # no copy of every poll in the browser's storage
        show_error=True,
        ssr_mode=False,
        pwa=False,
        mcp_server=False,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
