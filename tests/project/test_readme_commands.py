"""Every command in the ``bash`` blocks of the README and docs/ is accounted
for: run here as written (in a fresh directory, with the shared environment on
PATH as ``source .nox/_shared/bin/activate`` puts it; a long sweep over fewer
of its points, :data:`FEWER_POINTS`), or named with the reason it cannot run
in a test. A command added to a doc without a line here fails
:func:`test_every_documented_command_is_accounted_for`, so the docs cannot drift."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from matrix_cli import REPO
from test_readme import EXAMPLE, README

# The README and every doc it links to: a command moved between them stays run.
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
ENV_BIN = Path(sys.executable).parent

# Run as written, in order, one chain per test (each in a fresh directory).
CHAINS: dict[str, tuple[str, ...]] = {
    "help_and_one_point": (
        "nsa-cp-matrix --help",
        "nsa-cp-matrix +matrix=smoke --dry-run",
        "nsa-cp-matrix cp_size=2 'seq_lens=[1001,300]' hidden_size=256",
    ),
    "review": (
        "nsa-cp-matrix -m cp_size=2,4 'seq_lens=[1000],[1001,300]' hidden_size=256 iters=auto results_dir=results/base",
        "nsa-cp-matrix -m cp_size=2,4 'seq_lens=[1000],[1001,300]' hidden_size=256 iters=auto results_dir=results/new",
        "nsa-cp-matrix-report results/new",
        "nsa-cp-matrix-compare results/base results/new",
    ),
    "example": ("python example.py",),
    "plans": ("python -m matrix.plans --workload lognormal --batches 100000 --cp 8,16,32,64,128 --out plans/",),
    "engine_comm": (
        'pip install --no-deps "git+https://github.com/nsa-cp-comm/nsa-cp-comm#subdirectory=examples/engine_comm"',
        "nsa-cp-matrix -m impl=engine_comm,padded cp_size=2,3 'seq_lens=[1001,300],[1000],[1,1]' hidden_size=512 "
        "results_dir=results/engine",
        "nsa-cp-matrix -m impl=engine_comm.adapter:impl,padded cp_size=2 'seq_lens=[1001,300]' hidden_size=512 results_dir=results/engine",
        "nsa-cp-matrix-report results/engine",
    ),
}
# Appended to a chain's sweep, over fewer of its points (Hydra takes a key's
# last value): the command still runs as written, every other value as
# printed, but a sweep's cost grows with its points and the suite runs on
# loaded 2-core machines. Each value is one the command sweeps
# (test_fewer_points_narrow_the_sweep_they_follow).
FEWER_POINTS: dict[str, str] = {
    # iters=auto samples each point until its interval is known or its cap (30 s): one
    # point of the sweep times with it, the uneven one at cp=2 (padded timed, legacy
    # refused), and report and compare read its rows. gloo's loopback round trips on a
    # 2-core machine spread 1-9 ms, so the even point (two timed implementations) runs to
    # its cap even idle (30 s a sweep); the uneven one stops at its target (16 s idle).
    # The stopping rule itself is tests/lib/test_calibrate.py's, on warm ranks, and
    # compare's gate on even rows tests/review/test_compare*.py's. The cap stays the
    # reader's: compare must pass this A/A pair, failing rows whose samples could not show
    # a 1.3x slowdown, and with a 10 s cap a loaded 2-core machine's points took 60 samples
    # a side (P = 0.59).
    CHAINS["review"][0]: "cp_size=2 'seq_lens=[1001,300]'",
    CHAINS["review"][1]: "cp_size=2 'seq_lens=[1001,300]'",
    # cp=3 has the chain's empty rank ([1,1]) and an uneven plan; the plug-in
    # at cp=2 is the next command's (and tests/app/test_plugins.py's).
    CHAINS["engine_comm"][1]: "cp_size=3",
}
# Run instead of the command as written: the repository a URL names is this
# checkout, and the suite runs offline, so the doc's checkout form of the
# same install (docs/plugins.md names both).
CHECKOUT_FORM: dict[str, str] = {
    CHAINS["engine_comm"][0]: "pip install --no-deps -e examples/engine_comm",
}
# Run with --dry-run appended: a whole sweep is too long for the suite; its
# points still compose and pass preflight exactly as written.
DRY: tuple[str, ...] = (
    "nsa-cp-matrix -m cp_size=2,4 shared_kv=true,false page_size=64 'seq_lens=[1000,300],[1002],[5]' hidden_size=512",
    "nsa-cp-matrix +matrix=smoke results_dir=results/mine resume=true",
    "python -m matrix +matrix=designs results_dir=results/designs",
    "python -m matrix +matrix=designs engine=sglang_0_5_23 results_dir=results/designs-sglang",
    "python -m matrix -m workload=trace impl=designs cp_size=2,4 hidden_size=256",
)
# Not run here, and why.
ELSEWHERE: dict[str, str] = {
    "pip install torch --index-url https://download.pytorch.org/whl/cpu": "tests/project/test_install.py::"
    "test_the_readmes_install_lines_in_a_fresh_venv runs the Install section in a fresh venv (torch from this "
    "machine's wheel folder)",
    "pip install torch": "the Install section's CUDA choice: this machine has no CUDA build",
    "pip install git+https://github.com/nsa-cp-comm/nsa-cp-comm": "tests/project/test_install.py::"
    "test_the_readmes_install_lines_in_a_fresh_venv installs the checkout, the line's own alternative",
    "nsa-cp-matrix +matrix=smoke": "tests/project/test_install.py::test_the_readmes_install_lines_in_a_fresh_venv runs it "
    "in a fresh venv (the Install section), and tests/app/test_matrix_cli.py::"
    "test_smoke_sweep_through_the_cli_then_again_and_compare runs its checkout form (A sweep)",
    "nox -s matrix": "the main job: run from a fresh clone before every stop (its exit code is the check)",
    "nox -s tests": "this suite itself (.ci/run)",
    "source .nox/_shared/bin/activate": "test_the_shared_environment_has_what_activation_promises",
    "nsa-cp-matrix +matrix=conformance impl=YOURS,padded": "YOURS is the reader's implementation; "
    "tests/app/test_conformance.py expands the preset and runs it through the CLI with broken plug-ins",
    "nsa-cp-matrix-report results/<the sweep's folder>": "the folder is the reader's sweep's; the review "
    "chain runs the report as written",
    "python -m matrix.report results/designs --nccl-tests benchmarks/data/nccl_tests_sample_all_gather.json "
    "--nccl-tests benchmarks/data/nccl_tests_sample_reduce_scatter.json":
    "needs the designs preset's results (minutes); tests/lib/test_pad_at_split.py runs the report with these files",
    "python -m matrix -m hydra/launcher=slurm +matrix=deepseek_v32 results_dir=/shared/nsa-cp/v32 "
    "hydra.launcher.partition=PARTITION hydra.launcher.account=ACCOUNT": "needs a SLURM cluster",
    "torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HEAD:29500 --rdzv-id cp16 "
    "-m matrix.torchrun_point cp_size=16 +layout=zigzag 'seq_lens=[16384]' hidden_size=7168 dtype=bfloat16 "
    "results_dir=/shared/nsa-cp/cp16": "needs two nodes",
    'HEAD=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)': "needs a SLURM allocation",
    'pip install --no-deps "git+https://github.com/nsa-cp-comm/nsa-cp-comm#subdirectory=examples/sglang_cp_plugin"':
    "the engine_comm chain runs the same install of an example plug-in (in its checkout form, CHECKOUT_FORM); "
    "tests/lib/test_sglang_plugin.py imports this one from the checkout",
    "nsa-cp-matrix -m impl=sglang_cp,pad_at_split engine=sglang_0_5_23 +layout=round_robin,zigzag cp_size=2,3 "
    "'seq_lens=[7],[8],[1001,300]' hidden_size=64": "tests/lib/test_sglang_plugin.py::"
    "test_every_point_of_a_sweep_is_ok_or_skipped_with_the_engines_reason runs these plans (both strategies, "
    "cp 2 and 3, even and uneven) on warm ranks, without a second whole sweep in the slow set",
    'pip install --no-deps "git+https://github.com/nsa-cp-comm/nsa-cp-comm#subdirectory=examples/vllm_pcp_plugin"':
    "the engine_comm chain runs the same install of an example plug-in (in its checkout form, CHECKOUT_FORM); "
    "tests/lib/test_vllm_plugin.py imports this one from the checkout",
    "nsa-cp-matrix -m impl=vllm_pcp,pad_at_split engine=vllm_0_33 +layout=dual_chunk_swap,round_robin "
    "cp_size=2,3 'seq_lens=[1],[7],[1001,300]' hidden_size=64": "tests/lib/test_vllm_plugin.py::"
    "test_every_point_of_a_sweep_is_ok_or_skipped_with_vllms_reason runs these plans (cp 2 and 3, an empty rank, "
    "even and uneven, another split) on warm ranks",
    "nsa-cp-matrix -m impl=vllm_pcp engine=vllm_0_34 moe_quant=fp8_block_monolithic +layout=dual_chunk_swap "
    "cp_size=2,3 'seq_lens=[1],[7],[1001,300]' hidden_size=128": "tests/lib/test_vllm_plugin.py::"
    "test_on_vllms_quantized_gather_the_plugin_gathers_rows_scales_and_logits_as_its_rows runs these points "
    "(cp 2 and 3) on warm ranks",
    'srun --ntasks-per-node 1 torchrun --nnodes "$SLURM_NNODES" --nproc-per-node 8 --rdzv-backend c10d '
    '--rdzv-endpoint "$HEAD:29500" --rdzv-id "$SLURM_JOB_ID" -m matrix.torchrun_point cp_size=16 +layout=zigzag '
    "'seq_lens=[16384]' results_dir=/shared/nsa-cp/cp16": "needs a SLURM allocation",
}


def readme_commands(text: str) -> list[str]:
    """The commands of the ``bash`` blocks: continuation lines joined, comments
    and surrounding blanks dropped, inner runs of spaces as one."""
    out = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for cmd in re.sub(r"\\\n\s*", " ", block).splitlines():
            cmd = _strip_comment(cmd).strip()
            if cmd:
                out.append(re.sub(r"\s+", " ", cmd))
    return out


def _strip_comment(line: str) -> str:
    """``line`` without a trailing ``# ...`` outside quotes."""
    quote = ""
    for i, c in enumerate(line):
        if quote:
            quote = "" if c == quote else quote
        elif c in "'\"":
            quote = c
        elif c == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i]
    return line


KNOWN = {c for chain in CHAINS.values() for c in chain} | set(DRY) | set(ELSEWHERE)


def test_every_documented_command_is_accounted_for():
    found = [cmd for doc in DOCS for cmd in readme_commands(doc.read_text())]
    assert readme_commands(README), "no bash block found in the README"
    assert not set(found) - KNOWN, f"commands in the docs no test accounts for: {sorted(set(found) - KNOWN)}"
    assert not KNOWN - set(found), f"accounted for, but gone from the docs: {sorted(KNOWN - set(found))}"


def test_a_new_command_in_a_doc_is_seen():
    """The parsing the check relies on: a continued, commented command is one
    command, a ``#`` inside quotes is not a comment, other blocks are not read."""
    text = ("```bash\npython -m matrix cp_size=2 \\\n    'seq_lens=[1]'   # one point\necho '#x' # y\n```\n"
            "```python\nprint(1)\n```\n")
    assert readme_commands(text) == ["python -m matrix cp_size=2 'seq_lens=[1]'", "echo '#x'"]
    assert not set(readme_commands(text)) <= KNOWN


def _shell(cmd: str, cwd: Path, bin_dir: Path = ENV_BIN) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join(dict.fromkeys([str(bin_dir), str(ENV_BIN), env.get("PATH", "")]))  # activation
    env["VIRTUAL_ENV"] = str(bin_dir.parent)
    # This checkout's library, as its editable install gives it (the shared
    # environment's install may be of another checkout), and its app under the
    # installed name for the console commands (linked in by _fresh); nothing else.
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), str(cwd)])
    return subprocess.run(["bash", "-c", cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def overlay(at: Path, source: Path = ENV_BIN) -> Path:
    """The bin folder of a virtual environment at ``at`` that sees every package
    of the suite's own (a ``.pth`` adds that site folder) and installs into its
    own: a chain's ``pip install`` lands there and leaves the suite's
    environment as it was. The other tests, running beside it, read that
    environment's entry points, and a process started before the install could
    not import what it names. Its console commands are the suite's (``source``'s
    scripts), run by its interpreter: every script whose interpreter is one of
    ``source``'s Pythons, however its first lines name it (:func:`retarget`)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(at)], check=True, timeout=120)
    bin_dir = at / "bin"
    site_dir = at / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    (site_dir / "_suite_env.pth").write_text(f"import site; site.addsitedir({sysconfig.get_paths()['purelib']!r})\n")
    for script in source.iterdir():
        if not script.is_file() or (bin_dir / script.name).exists():
            continue
        moved = retarget(script.read_bytes(), source, bin_dir)
        if moved is not None:
            (bin_dir / script.name).write_bytes(moved)
            (bin_dir / script.name).chmod(0o755)
    return bin_dir


# A script's interpreter as its first lines name it: "#!DIR/python3.11", or (a path too long for a
# kernel's shebang) "#!/bin/sh" and then an exec line naming "DIR/python", as pip writes them.
_INTERPRETER = re.compile(rb"""^(#!|'''exec' ")(?P<dir>[^"\n]+)/python[0-9.]*(?=["\s])""", re.M)


def retarget(text: bytes, source: Path, bin_dir: Path) -> bytes | None:
    """``text`` (a script of ``source``) run by ``bin_dir``'s Python instead, or None where its first two
    lines name no interpreter of ``source``'s."""
    head_end = text.find(b"\n", text.find(b"\n") + 1)
    head = text if head_end < 0 else text[:head_end]
    found = [m for m in _INTERPRETER.finditer(head) if m.group("dir") == bytes(source)]
    if not found:
        return None
    for m in reversed(found):
        head = head[: m.start("dir")] + bytes(bin_dir) + b"/python" + head[m.end():]
    return head + (b"" if head_end < 0 else text[head_end:])


def installed() -> list[str]:
    """The distributions and path files of the suite's environment."""
    return sorted(n for n in os.listdir(sysconfig.get_paths()["purelib"]) if n.endswith((".dist-info", ".pth")))


def _fresh(tmp_path: Path) -> Path:
    # This checkout's app and benchmarks, linked in: the environment's install
    # may be of another checkout (a worktree). The examples are copied: a chain
    # installs one editable, which writes its metadata beside its sources.
    for folder in ("matrix", "benchmarks"):
        (tmp_path / folder).symlink_to(REPO / folder)
    shutil.copytree(REPO / "examples", tmp_path / "examples",
                    ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "build"))
    (tmp_path / "nsa_cp_matrix").symlink_to(REPO / "matrix")  # what nsa-cp-matrix imports
    (tmp_path / "example.py").write_text(EXAMPLE)
    return tmp_path


def _files(folder: Path) -> set[Path]:
    return {p for p in folder.rglob("*") if "__pycache__" not in p.parts}


@pytest.mark.parametrize("chain", sorted(CHAINS))
def test_readme_commands_run_as_written(chain: str, tmp_path: Path):
    cwd = _fresh(tmp_path)
    installs = any(c.startswith("pip install") for c in CHAINS[chain])
    bin_dir = overlay(tmp_path / "env") if installs else ENV_BIN
    suite_site = installed()
    checkout = _files(REPO / "examples")
    for cmd in CHAINS[chain]:
        cmd = CHECKOUT_FORM.get(cmd, cmd)
        proc = _shell(f"{cmd} {FEWER_POINTS[cmd]}" if cmd in FEWER_POINTS else cmd, cwd, bin_dir=bin_dir)
        assert proc.returncode == 0, f"{cmd}\nexit {proc.returncode}\n{proc.stdout[-1500:]}\n{proc.stderr[-1500:]}"
    if installs:  # into the overlay: the tests running beside this one see the environment they started with
        assert installed() == suite_site
    assert _files(REPO / "examples") == checkout, "a chain wrote into the checkout's examples"
    if chain == "help_and_one_point":  # the default, timestamped results folder: one
        assert len(list((cwd / "results").iterdir())) == 1


def test_fewer_points_narrow_the_sweep_they_follow():
    """Each override appended to a chain's command picks values that command
    already sweeps: the run is a subset of the README's sweep, not another one."""
    chained = {c for chain in CHAINS.values() for c in chain}
    for cmd, extra in FEWER_POINTS.items():
        assert cmd in chained, cmd
        words = shlex.split(cmd)
        assert "-m" in words, cmd  # a sweep
        narrowed = False
        for word in shlex.split(extra):
            key, _, values = word.partition("=")
            swept = [_choices(w.partition("=")[2]) for w in words if w.startswith(f"{key}=")]
            assert len(swept) == 1 and set(_choices(values)) <= set(swept[0]), (cmd, word)
            narrowed |= set(_choices(values)) < set(swept[0])
        assert narrowed, (cmd, extra)


def _choices(values: str) -> list[str]:
    """A sweep's comma-separated values, a bracketed list being one value."""
    return re.findall(r"\[[^\]]*\]|[^,]+", values)


@pytest.mark.parametrize("cmd", DRY)
def test_readme_sweeps_compose_as_written(cmd: str, tmp_path: Path):
    proc = _shell(cmd + " --dry-run", _fresh(tmp_path))
    assert proc.returncode == 0 and "estimate:" in proc.stdout, proc.stdout[-1500:] + proc.stderr[-1500:]


def test_the_shared_environment_has_what_activation_promises():
    """python, pip and this project, in the interpreter the suite runs in (the
    shared environment under nox): the README's pip installs land here."""
    pip = ENV_BIN / "pip"
    if (REPO / ".nox" / "_shared") not in ENV_BIN.parents:
        pytest.skip("requires the shared environment nox builds (the suite runs outside it)")
    assert (ENV_BIN / "activate").exists() and pip.exists()
    proc = subprocess.run([str(pip), "--version"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and str(ENV_BIN.parent) in proc.stdout


def checkout_only(commands: list[str]) -> list[str]:
    """Commands that run only from the repository root: the app by its checkout
    name, or a pip install of one of the checkout's folders."""
    return [c for c in commands if c.startswith(("python -m matrix ", "python -m matrix."))
            or (c.startswith("pip install") and any(w.startswith("examples/") for w in shlex.split(c)))]


def test_the_plugin_doc_runs_from_a_plugin_authors_folder():
    """docs/plugins.md's reader stands in their own folder with the package
    installed: its commands are the installed ones."""
    assert checkout_only(readme_commands((REPO / "docs" / "plugins.md").read_text())) == []
    # and the check sees both checkout forms, and passes the installed ones
    url_form = CHAINS["engine_comm"][0]
    seen = checkout_only(["python -m matrix -m impl=x", "pip install --no-deps -e examples/x", "nsa-cp-matrix -m",
                          CHECKOUT_FORM[url_form], url_form])
    assert seen == ["python -m matrix -m impl=x", "pip install --no-deps -e examples/x", CHECKOUT_FORM[url_form]]


def test_the_overlay_runs_every_script_of_the_suites_python_however_it_names_it(tmp_path):
    """A venv's scripts name their Python as `python`, `python3` or `python3.11`, or, where the path is
    too long for a shebang, in an exec line under `#!/bin/sh`: each runs the overlay's Python, so a
    chain's `pip install` lands in the overlay; a script of another interpreter is not copied."""
    src = tmp_path / "src" / "bin"
    src.mkdir(parents=True)
    scripts = {
        "pip": f"#!{src}/python3\nfrom pip import main\n",
        "pip3.11": f"#!{src}/python3.11\nfrom pip import main\n",
        "tool": f"#!{src}/python\nimport tool\n",
        "long": f"#!/bin/sh\n'''exec' \"{src}/python\" \"$0\" \"$@\"\n' '''\nimport long\n",
        "other": "#!/usr/bin/env bash\necho hi\n",
        "elsewhere": "#!/opt/python/bin/python3\nimport x\n",
    }
    for name, text in scripts.items():
        (src / name).write_text(text)
    bin_dir = overlay(tmp_path / "env", src)
    for name in ("pip", "pip3.11", "tool", "long"):
        text = (bin_dir / name).read_text()
        assert str(bin_dir / "python") in text and str(src) not in text, (name, text)
        assert text.splitlines()[-1] == scripts[name].splitlines()[-1]
    assert not (bin_dir / "other").exists() and not (bin_dir / "elsewhere").exists()
