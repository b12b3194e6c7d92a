"""`hfbert serve`'s options (issue #66): TEI's names and defaults (but a loopback host), bad values refused naming
the option, and the command line that reads them importing no web framework (`import hfbert` never does)."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from hfbert.serve.options import Settings, add_arguments, settings_of


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="hfbert serve", exit_on_error=False)
    add_arguments(parser)
    return parser.parse_args(["MODEL", *argv])


def test_defaults_are_teis_on_loopback(monkeypatch):
    monkeypatch.delenv("HFBERT_API_KEY", raising=False)
    settings = settings_of(parse())
    assert (settings.host, settings.port, settings.api_key) == ("127.0.0.1", 8080, None)
    assert (settings.max_batch_tokens, settings.max_client_batch_size) == (16384, 32)
    assert (settings.max_concurrent_requests, settings.payload_limit, settings.auto_truncate) == (512, 2_000_000, True)


def test_options_are_read():
    arguments = parse(
        "--host", "0.0.0.0", "--port", "9000", "--api-key", "k", "--max-batch-tokens", "4096",
        "--max-client-batch-size", "8", "--max-concurrent-requests", "4", "--payload-limit", "1000",
        "--auto-truncate", "false", "--precision", "bf16", "--quantize", "int8", "--pooling", "splade",
        "--prompt-name", "query",
    )  # fmt: skip
    settings = settings_of(arguments)
    assert (settings.host, settings.port, settings.api_key, settings.max_batch_tokens) == ("0.0.0.0", 9000, "k", 4096)
    assert (settings.max_client_batch_size, settings.max_concurrent_requests, settings.payload_limit) == (8, 4, 1000)
    assert settings.auto_truncate is False
    assert (arguments.precision, arguments.quantize, arguments.pooling, arguments.prompt_name) == (
        "bf16", "int8", "splade", "query"
    )  # fmt: skip
    assert parse("--auto-truncate").auto_truncate is True


@pytest.mark.parametrize(
    "argv",
    [("--max-batch-tokens", "0"), ("--payload-limit", "-1"), ("--auto-truncate", "maybe"), ("--pooling", "median")],
)
def test_bad_values_are_refused(argv):
    with pytest.raises(argparse.ArgumentError, match=argv[0]):
        parse(*argv)


def test_settings_refuse_a_limit_below_one():
    with pytest.raises(ValueError, match="--max-client-batch-size must be at least 1"):
        Settings(max_client_batch_size=0)


def test_the_options_and_hfbert_import_no_web_framework():
    code = (
        "import sys, hfbert, hfbert.serve, hfbert.serve.options; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('fastapi', 'uvicorn', 'starlette', "
        "'prometheus_client', 'httpx')))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip() == "[]"
