"""Write docs/cli.md, the `hfbert` command reference, from the argparse parser itself (`hfbert.cli.build_parser`).

    python docs/cli_reference.py            # rewrite docs/cli.md
    python docs/cli_reference.py --check    # exit 1 if docs/cli.md is not what the parser gives now

The reference is built from the parser's actions (names, choices, defaults, help), not from argparse's help text,
whose layout changes between Python versions and terminal widths. tests/test_docs.py runs the check.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUTPUT = ROOT / "docs" / "cli.md"
WIDTH = 100  # usage lines

HEADER = """# The `hfbert` command

<!-- Written by `python docs/cli_reference.py` from hfbert.cli.build_parser(); do not edit by hand. -->

{description}

Every command also takes `-h` / `--help`. Options and positional arguments may come in any order
(`hfbert rerank MODEL --query Q DOC1 DOC2`). What can be checked without the model (input files, their UTF-8, the
output's folder, config.json's `model_type`) is checked before it loads. Exit status: 0 on success; 1 on failure,
with one line on stderr naming the argument, file or line (`parity`: also when an output is less accurate than
transformers' own against float64); 2 for a usage error or a missing optional dependency (the message says what to
install); 130 on Ctrl-C, 143 on SIGTERM; 141, silently, when the reader of standard output has gone (`| head`).
`HFBERT_TRACEBACK=1` shows the traceback of an unexpected error.

{contents}
"""


def value_text(action: argparse.Action) -> str:
    """What an option takes: its choices, its metavar, or nothing for a flag."""
    if action.nargs == 0:
        return ""
    if not action.option_strings:  # a positional: its name says it, unless it has choices
        return "one or more" if action.nargs == "+" else "zero or more" if action.nargs == "*" else ""
    if action.choices is not None:
        return " \\| ".join(f"`{choice}`" for choice in action.choices)
    return f"`{action.metavar or action.dest.upper()}`".replace("|", "\\|")


def default_text(action: argparse.Action) -> str:
    if action.nargs == 0 or action.default in (None, argparse.SUPPRESS) or action.required:
        return ""
    if isinstance(action.default, list) and not action.default:
        return ""
    return f"`{action.default}`"


def help_text(action: argparse.Action) -> str:
    text = action.help or ""
    if "%(" in text:
        text = text % {**vars(action), "prog": ""}
    return " ".join(text.split()).replace("|", "\\|")


def usage(name: str, parser: argparse.ArgumentParser) -> str:
    parts = [f"hfbert {name}"]
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction) or action.help == argparse.SUPPRESS:
            continue
        if not action.option_strings:
            metavar = action.metavar or action.dest.upper()
            parts.append(f"[{metavar} ...]" if action.nargs in ("*", "+") else metavar)
            continue
        flag = action.option_strings[-1]
        if action.nargs == 0:
            parts.append(f"[{flag}]")
        elif action.choices is not None:
            parts.append(f"[{flag} {'|'.join(str(choice) for choice in action.choices)}]")
        else:
            parts.append(f"[{flag} {action.metavar or action.dest.upper()}]")
    lines, indent = [parts[0]], " " * (len(parts[0]) + 1)
    for part in parts[1:]:  # wrapped at WIDTH, continuation lines under the first argument
        if len(lines[-1]) + 1 + len(part) > WIDTH and lines[-1].strip():
            lines.append(indent + part)
        else:
            lines[-1] += " " + part
    return "\n".join(lines)


def command_section(name: str, summary: str, parser: argparse.ArgumentParser) -> str:
    lines = [f"## `hfbert {name}`", "", (summary[0].upper() + summary[1:] + ".") if summary else "", ""]
    lines += ["```", usage(name, parser), "```", ""]
    lines += ["| argument | takes | default | what it does |", "|---|---|---|---|"]
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction) or action.help == argparse.SUPPRESS:
            continue
        names = ", ".join(f"`{option}`" for option in action.option_strings)
        if not action.option_strings:
            names = f"`{action.metavar or action.dest.upper()}`"
        lines.append(f"| {names} | {value_text(action)} | {default_text(action)} | {help_text(action)} |")
    return "\n".join(lines)


def render() -> str:
    from hfbert.cli import build_parser

    parser = build_parser()
    commands = next(action for action in parser._actions if isinstance(action, argparse._SubParsersAction))
    summaries = {choice.dest: choice.help or "" for choice in commands._choices_actions}
    contents = "\n".join(f"- [`hfbert {name}`](#hfbert-{name}): {summaries[name]}" for name in commands.choices)
    sections = [command_section(name, summaries[name], sub) for name, sub in commands.choices.items()]
    description = (parser.description or "").strip()
    return HEADER.format(description=description, contents=contents) + "\n" + "\n\n".join(sections) + "\n"


def main() -> int:
    arguments = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    arguments.add_argument("--check", action="store_true", help="change nothing; exit 1 if docs/cli.md is stale")
    check = arguments.parse_args().check
    text = render()
    if check:
        if not OUTPUT.exists() or OUTPUT.read_text() != text:
            print(f"{OUTPUT.relative_to(ROOT)} is out of date: run python docs/cli_reference.py", file=sys.stderr)
            return 1
        return 0
    OUTPUT.write_text(text)
    print(f"wrote {OUTPUT.relative_to(ROOT)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))  # run as a script: the checkout's hfbert, not another installed one
    sys.exit(main())
