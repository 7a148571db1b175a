"""`relif audit SCORES --delta D`: output formats and one-line errors with exit status 2."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from relif_ray.audit import AuditSettings, fixed_delta_audit
from relif_ray.cli import main as relif_main
from relif_ray.cli.audit import add_parser


def main(argv: list[str]) -> int:
    return relif_main(["audit", *argv])


def write_scores(directory: Path, suffix: str = ".parquet", **columns: object) -> Path:
    rng = np.random.default_rng(0)
    table = pd.DataFrame(
        {
            "task": np.repeat(["seg", "depth", "normal"], 40),
            "example_id": np.tile(np.arange(40), 3),
            "score": rng.uniform(0, 1, 120),
            "split": "val",
        }
    )
    for name, values in columns.items():
        table[name] = values
    path = directory / f"scores{suffix}"
    if suffix == ".parquet":
        table.to_parquet(path)
    else:
        table.to_csv(path, index=False)
    return path


def test_add_parser_registers_the_audit_subcommand(tmp_path: Path, capsys) -> None:
    parser = argparse.ArgumentParser(prog="relif")
    add_parser(parser.add_subparsers(dest="command", required=True))
    path = write_scores(tmp_path)
    args = parser.parse_args(["audit", str(path), "--delta", "0.3", "--pairs", "500", "--json"])
    assert args.handler(args) == 0
    printed = json.loads(capsys.readouterr().out)
    expected = fixed_delta_audit(
        pd.read_parquet(path), 0.3, settings=AuditSettings(pairs=500)
    ).to_dict()
    assert printed == expected
    assert set(printed) == {"bias", "vr", "pairs"}
    assert set(printed["pairs"]) == {"depth|normal", "depth|seg", "normal|seg"}
    assert all(set(p) == {"bias", "vr", "n"} and p["n"] == 500 for p in printed["pairs"].values())


def test_table_output_and_csv_input(tmp_path: Path, capsys) -> None:
    path = write_scores(tmp_path, ".csv")
    assert main([str(path), "--delta", "0.2", "--pool-size", "16", "--pair-seed", "3"]) == 0
    out = capsys.readouterr().out.splitlines()
    result = fixed_delta_audit(
        pd.read_csv(path), 0.2, settings=AuditSettings(pool_size=16, pair_seed=3)
    )
    assert out[-1].split() == ["mean", f"{result.bias:.4f}", f"{result.vr:.4f}"]
    rows = {line.split()[0]: line.split()[1:] for line in out[2:-1]}
    assert rows["depth|seg"] == [
        f"{result.pairs['depth|seg'].bias:.4f}",
        f"{result.pairs['depth|seg'].vr:.4f}",
        "4096",
    ]


def test_split_selection(tmp_path: Path, capsys) -> None:
    path = write_scores(tmp_path, split=np.repeat(["val", "test"], 60))
    assert main([str(path), "--delta", "0.2"]) == 2
    assert "several splits" in capsys.readouterr().err
    assert main([str(path), "--delta", "0.2", "--split", "test", "--json"]) == 0
    only_test = pd.read_parquet(path).query("split == 'test'")
    assert json.loads(capsys.readouterr().out) == fixed_delta_audit(only_test, 0.2).to_dict()


@pytest.mark.parametrize(
    ("columns", "flags", "message"),
    [
        ({"score": np.linspace(0, 1.2, 120)}, [], "in [0, 1]"),
        ({"score": np.r_[np.nan, np.zeros(119)]}, [], "finite"),
        ({"task": "seg", "example_id": np.arange(120)}, [], "at least two tasks"),
        ({}, ["--delta", "1.5"], "--delta"),
        ({}, ["--pool-size", "0"], "--pool-size"),
        ({}, ["--pairs", "-1"], "--pairs"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, columns, flags, message) -> None:
    path = write_scores(tmp_path, **columns)
    argv = [str(path), "--delta", "0.2", *flags]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("relif: error: ") and message in err
    assert err.count("\n") == 1


def test_missing_columns_and_unreadable_files(tmp_path: Path, capsys) -> None:
    no_score = tmp_path / "no_score.csv"
    pd.DataFrame({"task": ["a", "b"]}).to_csv(no_score, index=False)
    broken = tmp_path / "broken.parquet"
    broken.write_bytes(b"not a parquet file")
    for path, message in (
        (no_score, "missing column 'score'"),
        (broken, "damaged file (Could not open Parquet input source"),
        (tmp_path / "absent.csv", "no such file"),
        (tmp_path / "scores.txt", ".parquet or .csv"),
    ):
        assert main([str(path), "--delta", "0.2"]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1 and str(path) in err


def test_module_entry_point_end_to_end(tmp_path: Path) -> None:
    path = write_scores(tmp_path)
    command = [
        sys.executable,
        "-m",
        "relif_ray.cli",
        "audit",
        str(path),
        "--delta",
        "0.25",
        "--json",
    ]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == fixed_delta_audit(pd.read_parquet(path), 0.25).to_dict()
    bad = subprocess.run([*command[:-2], "2"], capture_output=True, text=True, check=False)
    assert bad.returncode == 2 and bad.stderr.strip().startswith("relif: error: --delta")


@pytest.mark.slow
def test_a_command_imports_only_its_own_module(tmp_path: Path) -> None:
    """`relif audit` reads a score file with pandas: it loads neither torch nor Ray nor the
    other commands' modules (relif_ray.cli.console); `relif --help` still lists every command."""
    path = write_scores(tmp_path)
    probe = (
        "import sys; from relif_ray.cli import main; "
        f"status = main(['audit', {str(path)!r}, '--delta', '0.25', '--json']); "
        "loaded = [m for m in ('torch', 'ray', 'analysis', 'relif_ray.cli.sweep') "
        "if m in sys.modules]; print(status, loaded, file=sys.stderr)"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert done.stderr.strip() == "0 []", done.stderr
    usage = subprocess.run(
        [sys.executable, "-m", "relif_ray.cli", "--help"], capture_output=True, text=True
    )
    assert usage.returncode == 0
    for command in ("sweep", "make-data", "methods", "report", "audit", "export"):
        assert f"\n    {command} " in usage.stdout, usage.stdout
