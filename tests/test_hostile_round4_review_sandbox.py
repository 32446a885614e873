"""Issue 46, round 4 review, the sandbox: a reasoning-gym generator was built in a cage under
the task's limits, then again in the launcher (which has none) for the children to
inherit; but those limits are the stored config's word (up to 16 GiB and 600 CPU-s), so a
stranger's config that raised `memory_mb` had the launcher build round 4's 3.4 GB
`count_primes` again. The caged build is now bounded by the sandbox itself (1 GiB at most,
60 CPU-s), on the suite's sandbox and on an ordinary user's."""

from __future__ import annotations

import pytest

from seedledger.ledger.errors import SeedLedgerError
from seedledger.trainers.sandbox import Limits, Sandbox
from tests.support.sandbox import need_bwrap, user_box

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", params=["own", "unprivileged"])
def anybox(request):
    need_bwrap()
    box = Sandbox() if request.param == "own" else user_box()
    yield box
    box.close()


def test_a_stored_configs_limits_do_not_raise_the_generator_build_bound(anybox):
    """`count_primes` with max_n = 1.5e8 needs ~1.2 GB for its sieve alone; under a config's
    memory_mb = 16,384 it was built in the cage and then in the launcher. Now it is refused
    in one line at the 1 GiB build bound, and the launcher goes on serving."""
    pytest.importorskip("reasoning_gym")
    hog = {"name": "count_primes", "seed": 1, "size": 4, "options": {"max_n": 150_000_000}}
    with pytest.raises(SeedLedgerError, match=r"building count_primes within the task's limits "
                                              r"\(1024 MiB, 60 CPU-s\): memory") as err:
        anybox.run("rg_rows", [{"index": 0}], setup=hog, limits=Limits(cpu_seconds=600, memory_mb=16_384))
    assert "\n" not in str(err.value)
    fine = {**hog, "options": {"max_n": 1000}}
    outcomes = anybox.run("rg_rows", [{"index": 0}], setup=fine, limits=Limits(cpu_seconds=5, memory_mb=16_384))
    assert outcomes[0].ok and "prime" in outcomes[0].value["question"]
