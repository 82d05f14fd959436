"""``python -m core.train --help`` is generated from the schema: every key of every section, with its type, the
composed value and its field docstring; the exit codes from the trial contract."""

import dataclasses
import subprocess
import sys

from core.config import SECTIONS, TrainConfig, load_config
from core.config.docs import field_docs, usage
from core.trial.contract import Exit, codes_text


def test_every_field_has_a_docstring():
    undocumented = [
        f"{section}.{f.name}"
        for section, cls in SECTIONS.items()
        for f in dataclasses.fields(cls)
        if not field_docs(cls).get(f.name)
    ]
    undocumented += [n for n in ("seed", "device") if not field_docs(TrainConfig).get(n)]
    assert not undocumented, f"fields without a docstring under them: {undocumented}"


def test_help_lists_every_key_with_its_composed_value_and_doc():
    text = usage(["model=moe-tiny", "parallel.dp_shard=2", "parallel.ep=2"], exit_codes=codes_text())
    cfg = load_config(["model=moe-tiny", "parallel.dp_shard=2", "parallel.ep=2"])
    for section, cls in SECTIONS.items():
        for f in dataclasses.fields(cls):
            head = next((line for line in text.splitlines() if line.startswith(f"  {section}.{f.name} (")), None)
            assert head is not None, f"{section}.{f.name} missing from --help"
            value = getattr(getattr(cfg, section), f.name)
            if isinstance(value, int | str) and not isinstance(value, bool):
                assert head.endswith(f"= {value}"), head
            first_words = " ".join(field_docs(cls)[f.name].replace("``", "").split()[:3])
            assert first_words in " ".join(text.split()), f"{section}.{f.name}'s doc missing: {first_words!r}"
    assert "  model.n_experts (int) = " in text and not text.count("  model.n_experts (int) = 0\n")
    assert "  parallel.dp_shard (int) = 2" in text


def test_help_names_every_exit_code():
    line = next(line for line in usage(exit_codes=codes_text()).splitlines() if line.startswith("Exit codes:"))
    for code in Exit:
        assert f"{int(code)} {code.status}" in line


def test_help_command_prints_it_without_running_a_trial(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "core.train", "--help", "model=small"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: python -m core.train")
    assert f"  model.d_model (int) = {load_config(['model=small']).model.d_model}" in proc.stdout
    assert not (tmp_path / "trials").exists()
    bad = subprocess.run(
        [sys.executable, "-m", "core.train", "--help", "parallel.tp=x"], capture_output=True, text=True
    )
    assert bad.returncode == int(Exit.INVALID) and "parallel.tp" in bad.stderr
