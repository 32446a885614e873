"""Issue 52's frictions, as a newcomer meets them on `tiny`: the version, what `log` and
`show` say about a run (backend, noise kind, σ in full), a mistyped model alias, a run of
zero generations, `plot`'s two scales, `help(seedledger)` and `sl.evolve`'s result."""

from __future__ import annotations

import importlib.metadata
import pydoc
import re

import pytest
from test_newcomer import Shell

import seedledger as sl

pytestmark = pytest.mark.slow

LONG = "a-run-name-as-long-as-a-users-own"


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Shell:
    """The quickstart trained as a long-named low-rank run, scored every generation."""
    sh = Shell(tmp_path_factory.mktemp("friction"))
    sh.write("quickstart.yaml", "example", "quickstart")
    sh.run("train", "quickstart.yaml", "--run", LONG, "--set", "perturbation=lowrank",
           "--set", "evaluation.every=1", "--set", "evaluation.rows=4")
    return sh


def test_the_version_is_printed_and_importable(tmp_path):
    proc = Shell(tmp_path).run("--version")
    assert proc.stdout == f"seedledger {sl.__version__}\n"
    assert sl.__version__ == importlib.metadata.version("seedledger")


def test_log_and_show_say_the_backend_and_the_noise_kind_and_sigma_in_full(trained):
    log = trained.run("log", LONG).stdout  # 80 columns, an eval column and a long name
    assert f"{LONG}  (tiny on hf, lowrank r=1 noise, finished)" in log, log
    table = log.split("events")[0]
    assert table.count("0.000999928") == 3 and "…" not in table, log
    data = trained.json("log", LONG)["run"]
    assert (data["backend"], data["perturbation"]) == ("hf", "lowrank r=1")
    show = trained.run("show", f"{LONG}@2").stdout
    assert re.search(r"backend / noise +hf / lowrank r=1\b", show), show
    assert [(r["backend"], r["perturbation"]) for r in trained.json("log")] == [("hf", "lowrank r=1")]


def test_a_mistyped_model_alias_gets_a_suggestion(trained):
    line = trained.bad("train", "quickstart.yaml", "--run", "typo", "--set", "model=tinny")
    assert line == ("error: unknown model 'tinny' (did you mean 'tiny'?): use an alias "
                    "(smollm2-135m-instruct, tiny) or a local Hugging Face directory")


def test_zero_generations_say_that_nothing_was_trained(trained):
    out = trained.run("train", "quickstart.yaml", "--run", "zero", "--set", "generations=0").stdout
    base = trained.json("log", "zero")["run"]
    assert base["generations"] == 0
    assert out.strip().splitlines()[-1].startswith(
        "run zero: nothing trained (0 generations asked): it stays at generation 0, fingerprint ")
    assert out.strip().endswith("; `seedledger resume zero --generations N` trains N")


def test_plot_draws_held_out_rewards_on_a_scale_of_their_own(trained):
    both = trained.json("plot", LONG, "-o", "both.png")
    assert both["axes"] == ["reward (train batch)", "held-out reward (greedy)"]
    assert [p["generation"] for p in both["runs"][0]["held_out"]] == [0, 1, 2, 3]
    trained.run("train", "quickstart.yaml", "--run", "plain", "--set", "generations=1")
    assert trained.json("plot", "plain", "-o", "one.png")["axes"] == ["reward (train batch)"]


def test_help_of_the_package_is_short_and_names_its_classes():
    text = pydoc.render_doc(sl, renderer=pydoc.plaintext)
    assert len(text.splitlines()) < 200, len(text.splitlines())
    assert "class Ledger" not in text and "`sl.Ledger`" in text and "train(" in text
    assert sl.Ledger.__name__ == "Ledger" and "Ledger" in dir(sl)


def test_the_result_of_evolve_prints_in_one_line(tmp_path):
    torch = pytest.importorskip("torch")
    net = torch.nn.Linear(2, 1)

    def fitness(model):
        with torch.no_grad():
            return -float(model(torch.ones(1, 2)).square().sum())

    result = sl.evolve(net, fitness, population=4, sigma=0.0625, generations=2, ledger=tmp_path / "l.db", run="e")
    text = repr(result)
    assert "\n" not in text and len(text) < 300, text
    assert text.startswith("SessionResult(run='e', status='finished', trained=1..2, latest_generation=2, ")
    assert result.fingerprint in text
