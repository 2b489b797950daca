"""The compatibility-matrix harness (compat_matrix/): manifest, the recording pytest plugin, the cell
rules and the committed MATRIX.md / MATRIX.json."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from compat_matrix import envs as E
from compat_matrix import freshness, matrix
from compat_matrix.contracts import BY_ID, CONTRACTS, HOSTS

REPO = Path(__file__).resolve().parent.parent


def test_manifest_has_the_issue_environments_and_default_is_the_readme_install():
    specs = {s.name: s for s in E.load_manifest()}
    assert {"default", "composer-0.32.1", "energon-7.3.2", "py3.13"} <= set(specs)
    readme_first = next(line for line in (REPO / "README.md").read_text().splitlines() if "pip install" in line)
    assert "-e '.[dev]'" in readme_first and specs["default"].install == (".[dev]",)
    # megatron-core needs CPython >= 3.12: its host group has its own column, not the 3.11 default.
    assert specs["default"].python == "3.11" and set(specs["default"].hosts) == set(HOSTS) - {"megatron", "llmfoundry"}
    assert specs["megatron-core-0.19.2"].python == "3.12" and specs["megatron-core-0.19.2"].hosts == ("megatron",)
    assert "megatron-core==0.19.2" in specs["megatron-core-0.19.2"].install
    # llm-foundry pins mosaicml-streaming <0.13 (the README's install has 0.13): its host runs in its own column only
    lf = specs["llm-foundry-0.22.0"]
    assert lf.hosts == ("llmfoundry",) and "llm-foundry==0.22.0" in lf.install and "torch==2.7.0" in lf.install
    assert lf.base == "composer-0.32.1" and "mosaicml==0.32.1" in specs[lf.base].install
    assert "mosaicml==0.32.1" in specs["composer-0.32.1"].install
    assert any(a.startswith("megatron-energon==7.3.") for a in specs["energon-7.3.2"].install)
    assert specs["py3.13"].python == "3.13"


def test_manifest_errors_name_the_entry(tmp_path):
    bad = tmp_path / "m.toml"
    bad.write_text('[[env]]\nname = "x"\npython = "3.11"\ninstall = ["."]\nhosts = ["nope"]\nwhy = ""\n')
    with pytest.raises(ValueError, match=r"env #1 \(x\): unknown hosts \['nope'\]"):
        E.load_manifest(bad)
    bad.write_text('[[env]]\nname = "x"\npython = "3.11"\n')
    with pytest.raises(ValueError, match=r"missing \['hosts', 'install', 'why'\]"):
        E.load_manifest(bad)
    entry = '[[env]]\nname = "{}"\npython = "{}"\ninstall = ["."]\nhosts = ["torch"]\nwhy = ""\n'
    for second, msg in ((entry.format("y", "3.11") + 'base = "x"\n', None),
                        (entry.format("y", "3.12") + 'base = "x"\n', "base must name an earlier environment"),
                        (entry.format("y", "3.11") + 'base = "z"\n', "base must name an earlier environment"),
                        (entry.format("y", "3.11") + 'bass = "x"\n', r"unknown \['bass'\]")):
        bad.write_text(entry.format("x", "3.11") + second)
        if msg is None:
            assert [s.base for s in E.load_manifest(bad)] == ["", "x"]
        else:
            with pytest.raises(ValueError, match=msg):
                E.load_manifest(bad)
    ok = {"name": '"x"', "python": '"3.11"', "install": '["."]', "hosts": '["torch"]', "why": '""'}
    for key, value, msg in (("name", '"."', "name must be"), ("name", '""', "name must be"),
                            ("name", '"../up"', "name must be"), ("python", "3.10", "quoted"),
                            ("install", '".[dev]"', "install must be a non-empty list"),
                            ("hosts", "[]", "hosts must be a non-empty list")):
        bad.write_text("[[env]]\n" + "".join(f"{k} = {value if k == key else v}\n" for k, v in ok.items()))
        with pytest.raises(ValueError, match=msg):
            E.load_manifest(bad)
    bad.write_text("[[env]]\n" + "".join(f"{k} = {v}\n" for k, v in ok.items()) * 1 + "[[env]]\n" +
                   "".join(f"{k} = {v}\n" for k, v in ok.items()))
    with pytest.raises(ValueError, match="duplicate env names"):
        E.load_manifest(bad)


def test_find_python():
    v = f"{sys.version_info.major}.{sys.version_info.minor}"
    assert E.find_python(v) == sys.executable
    with pytest.raises(E.EnvError, match="no CPython 2.1"):
        E.find_python("2.1")


def _pytest_with_plugin(tmp_path, hosts, report):
    """pytest over the test files in ``tmp_path`` with the recording plugin, as the harness runs it."""
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "compat_matrix.pytest_plugin", "-p",
                           "no:cacheprovider", "--contract-hosts", hosts, "--compat-report", str(report), "-q",
                           "--rootdir", str(tmp_path), str(tmp_path)],
                          capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(REPO)), cwd=tmp_path)


def test_plugin_records_outcomes_reasons_and_selects_by_host(tmp_path):
    (tmp_path / "test_x.py").write_text(textwrap.dedent('''
        import pytest

        @pytest.mark.contract("torch.dataloader")
        def test_ok():
            pass

        @pytest.mark.contract("torch.stateful", "torch.dataloader")
        def test_bad():
            assert 1 == 2, "state differs"

        @pytest.mark.contract("torch.finite")
        def test_skipped():
            pytest.skip("needs two ranks")

        @pytest.fixture
        def broken():
            raise RuntimeError("fixture broke")

        @pytest.mark.contract("torch.faults")
        def test_setup_error(broken):
            pass

        @pytest.mark.contract("energon.format")
        def test_other_host():
            pass

        @pytest.mark.contract("torch.finite")
        @pytest.mark.xfail(reason="known bug 12")
        def test_known_failure():
            assert False

        @pytest.mark.contract("torch.finite")
        @pytest.mark.xfail(reason="was broken")
        def test_xpass():
            pass

        def test_untagged():
            pass
    '''))
    (tmp_path / "test_y.py").write_text(textwrap.dedent('''
        import pytest
        pytest.importorskip("no_such_host_package", reason="host absent here")

        @pytest.mark.contract("torch.distributed")
        def test_needs_host():
            pass
    '''))
    (tmp_path / "test_z.py").write_text(textwrap.dedent('''
        import pytest
        import no_such_module_at_all

        @pytest.mark.contract("torch.stateful")
        def test_broken_module():
            pass
    '''))
    report = tmp_path / "r.json"
    out = _pytest_with_plugin(tmp_path, "torch", report)
    assert out.returncode == 2, out.stdout + out.stderr  # a collection error interrupts the session
    rep = json.loads(report.read_text())
    got = {t["id"].split("::")[1]: t for t in rep["tests"]}
    assert got["test_needs_host"] == {"id": "test_y.py::test_needs_host", "contracts": ["torch.distributed"],
                                      "outcome": "skipped", "reason": "host absent here", "seconds": 0.0}
    assert got["test_broken_module"]["outcome"] == "failed" and "no_such_module_at_all" in \
        got["test_broken_module"]["reason"]
    assert rep["collect_errors"][0]["id"] == "test_z.py"
    (tmp_path / "test_z.py").unlink()
    out = _pytest_with_plugin(tmp_path, "torch", report)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "2 deselected" in out.stdout
    rep = json.loads(report.read_text())
    got = {t["id"].split("::")[1]: t for t in rep["tests"]}
    assert set(got) == {"test_ok", "test_bad", "test_skipped", "test_setup_error", "test_needs_host",
                        "test_known_failure", "test_xpass"}
    assert got["test_known_failure"]["outcome"] == "failed"
    assert got["test_known_failure"]["reason"] == "expected failure (xfail): known bug 12"
    assert got["test_xpass"]["outcome"] == "failed" and got["test_xpass"]["reason"].startswith("xpass")
    assert got["test_ok"]["outcome"] == "passed" and got["test_ok"]["contracts"] == ["torch.dataloader"]
    assert got["test_bad"]["outcome"] == "failed" and "state differs" in got["test_bad"]["reason"]
    assert got["test_bad"]["contracts"] == ["torch.stateful", "torch.dataloader"]
    assert got["test_skipped"] == {**got["test_skipped"], "outcome": "skipped", "reason": "needs two ranks"}
    assert got["test_setup_error"]["outcome"] == "failed" and "fixture broke" in got["test_setup_error"]["reason"]
    assert rep["exitstatus"] == 1 and rep["collect_errors"] == []


def _env(name="e", hosts=("torch",), tests=(), status="ok", error="", collect_errors=()):
    return {"name": name, "why": "w", "hosts": list(hosts), "install": [], "date": "2026-11-29",
            "python_path": "", "versions": {"python": "3.11.7", "torch": "2.7.0"}, "status": status,
            "error": error, "exitstatus": 0, "seconds": {"install": 1, "tests": 2}, "tests": list(tests),
            "collect_errors": list(collect_errors)}


def _t(tid, outcome, contracts, reason=""):
    return {"id": tid, "contracts": contracts, "outcome": outcome, "reason": reason, "seconds": 0.1}


def test_cell_rules():
    c = BY_ID["torch.dataloader"]
    assert matrix.cell(BY_ID["energon.format"], _env())["status"] == "n/a"
    ok = matrix.cell(c, _env(tests=[_t("a", "passed", [c.id]), _t("b", "skipped", [c.id], "no gloo")]))
    assert ok == {"status": "pass", "reason": "1 of 2 skipped: no gloo", "tests": ["a", "b"]}
    bad = matrix.cell(c, _env(tests=[_t("a", "passed", [c.id]), _t("b", "failed", [c.id], "boom")]))
    assert bad["status"] == "fail" and bad["reason"] == "1/2 failed; b: boom"
    skip = matrix.cell(c, _env(tests=[_t("a", "skipped", [c.id], "composer not installed")]))
    assert skip == {"status": "skip", "reason": "composer not installed", "tests": ["a"]}
    none = matrix.cell(c, _env(tests=[_t("a", "passed", ["torch.finite"])]))
    assert none["status"] == "fail" and none["reason"] == "no test collected for this row"
    coll = matrix.cell(c, _env(collect_errors=[{"id": "tests/test_y.py", "reason": "ImportError: x"}]))
    assert coll["reason"] == "collection error: tests/test_y.py: ImportError: x"
    inst = matrix.cell(c, _env(status="install failed", error="pip exited 1: no torch==9"))
    assert inst == {"status": "fail", "reason": "install failed: pip exited 1: no torch==9", "tests": []}


def test_render_shows_every_reason_and_test_id():
    c = BY_ID["torch.stateful"]
    envs = [_env("good", tests=[_t(f"tests/t.py::{r.id}", "passed", [r.id]) for r in CONTRACTS if r.host == "torch"]),
            _env("bad", hosts=("torch", "energon"), tests=[_t("tests/t.py::x", "failed", [c.id], "state lost")])]
    m = matrix.build(envs, "2026-11-29 00:00 UTC", "test machine")
    md = matrix.render_md(m)
    assert "**FAIL**: 1/1 failed; tests/t.py::x: state lost" in md
    assert "no test collected for this row" in md  # bad's other torch rows
    assert f"`tests/t.py::{c.id}`" in md and "| 2.7.0 | 2.7.0 |" in md
    assert f"yes ({sum(r.host == 'torch' for r in CONTRACTS)}/" in md
    json.loads(matrix.dump_json(m))


def test_committed_matrix_is_generated_and_current():
    """MATRIX.md is exactly the rendering of MATRIX.json; every cell is what the cell rule gives for its
    column's recorded test outcomes (a pass needs a passing test); the columns are the manifest's
    environments as they stand (python, install, hosts) and carry a run date and source revision; the rows
    are today's contract rows; every test id cited still exists."""
    m = json.loads((REPO / "compat_matrix" / "MATRIX.json").read_text())
    assert (REPO / "compat_matrix" / "MATRIX.md").read_text() == matrix.render_md(m), \
        "MATRIX.md differs from its JSON: run `python -m compat_matrix render`"
    assert [r["id"] for r in m["rows"]] == [c.id for c in CONTRACTS], "rows changed: re-run the matrix"
    specs = E.load_manifest()
    assert [e["name"] for e in m["envs"]] == [s.name for s in specs], "environments changed: re-run the matrix"
    for spec, e in zip(specs, m["envs"]):
        assert (e["install"], e["hosts"]) == (list(spec.install), list(spec.hosts)), f"{spec.name}: re-run it"
        assert e["versions"]["python"].startswith(spec.python + "."), spec.name
        assert re.fullmatch(r"\d{4}-\d\d-\d\d", e["date"]) and re.fullmatch(r"[0-9a-f]{12}(\+changes)?", e["revision"])
    for r in m["rows"]:
        for e in m["envs"]:
            cl = r["cells"][e["name"]]
            assert cl == matrix.cell(BY_ID[r["id"]], e), f"{r['id']} x {e['name']} is not what its tests say"
            if cl["status"] == "pass":
                assert any(t["outcome"] == "passed" and t["id"] in cl["tests"] for t in e["tests"])
            for tid in cl["tests"]:
                path, func = tid.split("::")[0], re.split(r"[\[]", tid.split("::")[-1])[0]
                assert re.search(rf"def {func}\(", (REPO / path).read_text()), f"{tid} cited by {r['id']} is gone"


def test_plugin_refuses_a_contract_mark_naming_no_row(tmp_path):
    (tmp_path / "test_typo.py").write_text("import pytest\n\n@pytest.mark.contract('energon.vall')\n"
                                           "def test_typo():\n    pass\n")
    out = _pytest_with_plugin(tmp_path, "energon", tmp_path / "r.json")
    assert out.returncode == 4 and "'energon.vall'" in out.stderr, out.stdout + out.stderr


def test_matrix_is_not_older_than_the_adapters_host_and_contracts():
    """Every column of the committed MATRIX.json ran at a revision that contains the last commit changing
    adapters/, zephon/host/ or compat_matrix/contracts.py (git decides; skipped only outside a git clone)."""
    m = json.loads((REPO / "compat_matrix" / "MATRIX.json").read_text())
    try:
        stale = freshness.stale_columns(m, REPO)
    except freshness.NotAGitClone as e:
        pytest.skip(f"freshness needs the git history: {e}")
    assert not stale, ("the compatibility matrix is stale:\n  " + "\n  ".join(stale) + "\n" + freshness.REMEDY)


def _commit(repo: Path, path: str, text: str) -> str:
    f = repo / path
    f.parent.mkdir(parents=True, exist_ok=True)
    f.write_text(text)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    subprocess.run(git + ["add", "-A"], cwd=repo, check=True, capture_output=True)
    subprocess.run(git + ["commit", "-q", "-m", f"change {path}"], cwd=repo, check=True, capture_output=True)
    return subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=repo, check=True, capture_output=True,
                          text=True).stdout.strip()


def test_freshness_rule_on_a_scratch_repository(tmp_path, tmp_path_factory):
    """The rule itself, on a repository made here: a column is stale exactly when a watched path changed in a
    commit its revision does not contain; other paths, and a column run after the change, are fine."""
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True, capture_output=True)
    first = _commit(tmp_path, "adapters/a.py", "x = 1\n")
    docs = _commit(tmp_path, "docs/readme.md", "words\n")
    mat = {"envs": [{"name": "old", "revision": first}, {"name": "dirty", "revision": docs + "+changes"},
                    {"name": "none", "revision": ""}, {"name": "gone", "revision": "0123456789ab"}]}
    got = freshness.stale_columns(mat, tmp_path)
    assert [g.split(":")[0] for g in got] == ["none", "gone"], got  # a docs commit does not age a column
    host = _commit(tmp_path, "zephon/host/session.py", "y = 2\n")
    got = freshness.stale_columns(mat, tmp_path)
    assert [g.split(":")[0] for g in got] == ["old", "dirty", "none", "gone"]
    assert "change zephon/host/session.py" in got[0] and first in got[0]
    rows = _commit(tmp_path, "compat_matrix/contracts.py", "ROWS = []\n")
    assert freshness.stale_columns({"envs": [{"name": "n", "revision": host}]}, tmp_path) != []
    assert freshness.stale_columns({"envs": [{"name": "n", "revision": rows}]}, tmp_path) == []
    with pytest.raises(freshness.NotAGitClone, match="not a git work tree"):
        freshness.stale_columns(mat, tmp_path_factory.mktemp("not_a_clone"))
    shallow = tmp_path_factory.mktemp("shallow") / "c"
    subprocess.run(["git", "clone", "-q", "--depth", "1", f"file://{tmp_path}", str(shallow)], check=True,
                   capture_output=True)
    with pytest.raises(freshness.NotAGitClone, match="shallow clone"):
        freshness.stale_columns(mat, shallow)


def test_a_layered_environment_needs_its_base_and_follows_its_stamp(tmp_path):
    spec = E.EnvSpec("y", "3.11", (".",), ("torch",), "", base="x")
    with pytest.raises(E.EnvError, match="base environment 'x' is not built"):
        E.build(spec, tmp_path)
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "zephon-compat-stamp").write_text("abc")
    assert E.base_stamp(spec, tmp_path) == "abc"
    assert E.stamp(spec, "py", "abc") != E.stamp(spec, "py", "abd"), "a rebuilt base must rebuild its layer"


def test_cuda_runtime_wheels_of_built_siblings_are_hard_linked_before_pip(tmp_path):
    """A built sibling's ``nvidia-*`` distribution (py3-none wheel) is linked into a new environment, file by
    file (same inode); a cp-tagged or unbuilt one, or one already present, is not."""
    from compat_matrix.shared_wheels import link_shared

    def dist(env, name, tag, files, built=True):
        sp = tmp_path / env / "lib" / "python3.11" / "site-packages"
        di = sp / f"{name}.dist-info"
        di.mkdir(parents=True)
        (di / "WHEEL").write_text(f"Wheel-Version: 1.0\nTag: {tag}\n")
        for f in files:
            (sp / f).parent.mkdir(parents=True, exist_ok=True)
            (sp / f).write_text(f)
        (di / "RECORD").write_text("".join(f"{f},sha256=x,1\n" for f in files) + f"{name}.dist-info/RECORD,,\n")
        if built:
            (tmp_path / env / "zephon-compat-stamp").write_text("s")
        return sp

    a = dist("a", "nvidia_cublas-13.1.1.3", "py3-none-manylinux_2_27_x86_64", ["nvidia/cu13/lib/libcublas.so.13"])
    dist("a", "cuda_bindings-13.5.0", "cp311-cp311-manylinux_2_28_x86_64", ["cuda/bindings.so"])
    dist("b", "nvidia_nccl_cu13-2.30.7", "py3-none-manylinux_2_18_x86_64", ["nvidia/nccl/lib/libnccl.so.2"],
         built=False)
    new = tmp_path / "new" / "lib" / "python3.12" / "site-packages"
    new.mkdir(parents=True)
    assert link_shared(tmp_path, tmp_path / "new", log=lambda *_: None) == 1
    lib = new / "nvidia/cu13/lib/libcublas.so.13"
    assert lib.read_text() == "nvidia/cu13/lib/libcublas.so.13"
    assert os.stat(lib).st_ino == os.stat(a / "nvidia/cu13/lib/libcublas.so.13").st_ino
    assert (new / "nvidia_cublas-13.1.1.3.dist-info" / "RECORD").exists()
    assert not (new / "cuda").exists() and not (new / "nvidia/nccl").exists()
    assert link_shared(tmp_path, tmp_path / "new", log=lambda *_: None) == 0  # already there
