"""The commands of the README and of every page of docs/, run as a new user would type them, with small budgets.

The pages are read in one order: the README, then docs/ in the site's order. Every
```bash block runs line by line, in that order, in one scratch directory that
holds the checkout's examples/ and tools/, so a command may use what an earlier
one made (``flare2 eval runs/ppo`` plays the run ``flare2 train`` wrote, and a
page may read the runs of the README's quickstart). Every ```python block runs
as a program there. A block right after a line ``<!-- not run: REASON -->`` is
left out; the reason says why it cannot run here and where it is covered
instead.

Commands that share no run directory run side by side, one per core: a command
waits for every earlier one that names a run directory it names (``runs/NAME``),
so each run directory sees its commands in the pages' order.

What changes, so that all the pages run in about a minute: a budget
(``--max-steps``, ``--episodes``, ``--trials``, ``--trial-steps``) becomes a
small one, ``flare2 train`` without one gets ``--max-steps``, a return
``--threshold`` that a small run cannot reach becomes 0, the install
in front of a command (``python -m pip install ... &&``) is dropped (the tests
run where flare2 is installed with its test extra), and a run goes in one
process (``--serial``: the same code, without starting a compute process and
agent processes for a few hundred steps; test_train_command.py and
test_examples.py run those).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path

from runs import REPO

_SKIP = re.compile(r"<!-- not run: .+ -->")
_RUN_DIRECTORY = re.compile(r"runs/[\w$.-]+")
_SMALL = {"--max-steps": "600", "--episodes": "1", "--trials": "2", "--trial-steps": "300", "--threshold": "0"}
_NAVIGATION_PAGE = re.compile(r"^\s*-\s*(?:[^:\n]+:\s*)?([\w-]+\.md)\s*$", re.M)


def pages() -> list[Path]:
    """The README, then the pages of docs/ in the site's order (mkdocs.yml's nav), then any page the nav lacks."""
    listed = _NAVIGATION_PAGE.findall((REPO / "mkdocs.yml").read_text(encoding="utf-8"))
    in_order = [REPO / "docs" / name for name in listed]
    return [REPO / "README.md", *in_order, *sorted(set((REPO / "docs").glob("*.md")) - set(in_order))]


def page_blocks(page: Path) -> list[tuple[int, str, str]]:
    """(line number, language, text) of each fenced bash or python block of ``page`` not marked to be left out."""
    blocks, lines = [], page.read_text(encoding="utf-8").splitlines()
    index = 0
    while index < len(lines):
        fence = re.fullmatch(r"\s*```(bash|python)\s*", lines[index])
        if not fence:
            index += 1
            continue
        indent = len(lines[index]) - len(lines[index].lstrip())
        end = next(i for i in range(index + 1, len(lines)) if lines[i].strip() == "```")
        skipped = index > 0 and _SKIP.fullmatch(lines[index - 1].strip())
        if not skipped:
            blocks.append((index + 1, fence.group(1), "\n".join(line[indent:] for line in lines[index + 1 : end])))
        index = end + 1
    return blocks


def test_a_block_marked_not_run_is_left_out_and_the_others_keep_their_line_numbers(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "```bash\nflare2 train\n```\n<!-- not run: needs a second machine -->\n```bash\nflare2 attach\n```\n"
        "  ```python\n  print(1)\n  ```\n```\nplain text\n```\n",
        encoding="utf-8",
    )
    assert page_blocks(page) == [(1, "bash", "flare2 train"), (8, "python", "print(1)")]


def small_budget(command: str) -> str:
    """``command`` with the changes the module docstring lists."""
    command = re.sub(r"^python -m pip install [^&]*&&\s*", "", command)
    for option, value in _SMALL.items():
        command = re.sub(rf"{option}(=|\s+)\S+", f"{option} {value}", command)
    if command.startswith("flare2 train") and "--max-steps" not in command:
        command += " --max-steps " + _SMALL["--max-steps"]
    if re.match(r"flare2 (train|tune) |python examples/", command) and "--serial" not in command:
        command += " --serial"
    return command


def commands(text: str) -> list[str]:
    """The commands of a bash block: one per line, a trailing backslash joining lines."""
    return [
        line.strip() for line in text.replace("\\\n", " ").splitlines() if line.strip() and not line.startswith("#")
    ]


def test_the_budget_rewrite_shrinks_every_budget_and_drops_the_install():
    assert small_budget('python -m pip install -e ".[plot]" && flare2 train --env X --max-steps 100000 --trials=9') == (
        "flare2 train --env X --max-steps 600 --trials 2 --serial"
    )
    assert small_budget("flare2 train --env X") == "flare2 train --env X --max-steps 600 --serial"
    assert small_budget("flare2 eval runs/x --episodes 10") == "flare2 eval runs/x --episodes 1"
    assert small_budget("python tools/steps_to_threshold.py runs/a --threshold 475") == (
        "python tools/steps_to_threshold.py runs/a --threshold 0"
    )
    assert small_budget("python examples/cartpole_a2c.py --max-steps 500000 --log-dir runs/a2c") == (
        "python examples/cartpole_a2c.py --max-steps 600 --log-dir runs/a2c --serial"
    )


def run_directories(command: str, seed: str) -> set[str]:
    """The run directories ``command`` names, ``$SEED`` expanded (``runs/ckpt/checkpoints/RL.pt`` names runs/ckpt)."""
    return {name.replace("$SEED", seed) for name in _RUN_DIRECTORY.findall(command)}


def dependencies(commands: list[str], seed: str) -> list[set[int]]:
    """For each command, the earlier ones that name one of its run directories."""
    named = [run_directories(command, seed) for command in commands]
    return [{earlier for earlier in range(index) if named[earlier] & named[index]} for index in range(len(commands))]


def test_commands_wait_for_every_earlier_command_on_their_run_directories():
    commands = [
        "flare2 train --log-dir runs/a_s$SEED",
        "flare2 train --log-dir runs/b",
        "python -c 'print(1)'",
        "flare2 eval runs/a_s0/checkpoints/RL.pt",
        "flare2 plot runs/a_s0 runs/b -o x.png",
    ]
    assert dependencies(commands, seed="0") == [set(), set(), set(), {0}, {0, 1, 3}]


def run_in_dependency_order(argvs: list[list[str]], waits_for: list[set[int]], workers: int, **options):
    """Run every argv, at most ``workers`` at once, none before those it waits for; the results in argv order.
    After a failure nothing new starts, so the first failure is not buried under the ones it causes."""
    results: dict[int, subprocess.CompletedProcess] = {}
    running: dict[Future, int] = {}
    waiting = list(range(len(argvs)))
    with ThreadPoolExecutor(workers) as pool:
        while waiting or running:
            failed = any(result.returncode != 0 for result in results.values())
            for index in [] if failed else list(waiting):
                if len(running) < workers and waits_for[index] <= results.keys():
                    running[pool.submit(subprocess.run, argvs[index], **options)] = index
                    waiting.remove(index)
            if not running:
                break
            finished, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in finished:
                results[running.pop(future)] = future.result()
    return [results.get(index) for index in range(len(argvs))]


def test_every_command_of_the_readme_and_the_docs_runs(tmp_path):
    for name in ("examples", "tools"):
        (tmp_path / name).symlink_to(REPO / name)
    seed = "0"
    places, texts, argvs = [], [], []
    for page in pages():
        for line, language, text in page_blocks(page):
            for command in [text] if language == "python" else [small_budget(command) for command in commands(text)]:
                places.append(f"{page.relative_to(REPO)} line {line}")
                texts.append(command)
                argvs.append([sys.executable, "-c", command] if language == "python" else ["bash", "-c", command])
    assert len(texts) >= 30, "the pages' blocks were not found"
    results = run_in_dependency_order(
        argvs,
        dependencies(texts, seed),
        workers=os.cpu_count() or 1,
        cwd=tmp_path,
        env={**os.environ, "SEED": seed},
        capture_output=True,
        text=True,
        timeout=300,
    )
    failures = [
        f"{place}: {text!r} exited with {result.returncode}:\n{result.stderr[-3000:]}"
        for place, text, result in zip(places, texts, results)
        if result and result.returncode != 0
    ]
    assert not failures, failures[0]
    assert None not in results, "a command did not start"
