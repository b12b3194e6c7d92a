"""`python -m hfbert.serve MODEL [options]` (and `hfbert serve`): load the model, log what runs and the limits in
force, and serve it with uvicorn until SIGTERM / SIGINT (which stop accepting, finish what is in flight, exit 0).
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from collections.abc import Sequence
from types import FrameType

from hfbert.serve.options import add_arguments, settings_of

log = logging.getLogger("hfbert.serve")
# The command's options that are the library's load options (`hfbert.tools.retrieval.LoadOptions`), by one name.
LOAD_OPTIONS = ("precision", "quantize", "max_length", "device", "revision", "ignore_auto_map")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m hfbert.serve",
        description="Serve a model's embeddings, reranking or sparse vectors over HTTP (TEI- and OpenAI-compatible).",
    )
    add_arguments(parser)
    return parser


def run(arguments: argparse.Namespace) -> int:
    """Serve `arguments.model` as the parsed options say; returns the exit status."""
    from hfbert.tools.extras import import_optional

    for module in ("fastapi", "uvicorn", "prometheus_client"):
        import_optional(module, f"hfbert serve needs {module}, which is not installed: pip install 'hfbert[serve]'")
    import uvicorn

    from hfbert.platform.cpu import cpu_name, instruction_set
    from hfbert.serve.app import create_app
    from hfbert.serve.engine import Engine, EngineOptions
    from hfbert.tools.retrieval import LoadOptions

    logging.basicConfig(level=arguments.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = settings_of(arguments)
    load = LoadOptions(**{name: getattr(arguments, name) for name in LOAD_OPTIONS})
    options = EngineOptions(
        pooling=arguments.pooling, prompt_name=arguments.prompt_name, load=load, compile=arguments.compile
    )
    engine = Engine(arguments.model, options)
    mode = f"precision {load.precision}" + (f", quantize {load.quantize}" if load.quantize else "")
    where = "" if str(engine.directory) == settings.model_id else f" ({engine.directory})"
    normalize = "; vectors normalized per request (normalize, default true)" if engine.task in ("embed", "m3") else ""
    log.info("model %s%s: task %s, %s%s", settings.model_id, where, engine.task, engine.describe(), normalize)
    log.info("mode %s on %s, %s (%s)", mode, load.device, cpu_name(), instruction_set())
    log.info(
        "limits: max_input_length %d, max_batch_tokens %d, max_client_batch_size %d, max_concurrent_requests %d, "
        "payload_limit %d bytes, auto_truncate %s, api key %s",
        engine.max_input_length,
        settings.max_batch_tokens,
        settings.max_client_batch_size,
        settings.max_concurrent_requests,
        settings.payload_limit,
        settings.auto_truncate,
        "required" if settings.api_key else "none",
    )
    app = create_app(engine, settings)
    config = uvicorn.Config(
        app, host=settings.host, port=settings.port, log_level=arguments.log_level, access_log=False
    )
    _server_class()(config).run()
    return 0


def _server_class() -> type:
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn's server, except that a SIGTERM / SIGINT which shut it down gracefully exits 0: uvicorn raises the
        signal again once stopped, and the process would end killed by it (status 128 + N), which supervisors read
        as a crash."""

        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            if self.should_exit and sig == signal.SIGINT:
                self.force_exit = True  # a second Ctrl-C: stop without waiting
            else:
                self.should_exit = True

    return Server


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    arguments = parser.parse_args(argv)
    from hfbert.tools.extras import MissingExtraError

    try:
        return run(arguments)
    except MissingExtraError as error:
        print(f"hfbert serve: {error}", file=sys.stderr)
        return 2
    except (ValueError, OSError) as error:  # a model that does not load, a limit out of range, a port in use
        print(f"hfbert serve: {' '.join(str(error).split())}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
