import importlib.abc
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# benchmarks/ is not an installed package; tests import its harness from the checkout.
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# The same root holds estimator/, recipes/ and server/, the sources of the installed canifinetune.estimator,
# .recipes and .server (pyproject's package-dir). Imported by their bare names they would load a second copy of
# every module, with its own TrainingPlan class that the installed package's isinstance checks reject, so in the
# test session those names fail with a message; benchmarks keeps working.
CHECKOUT_ONLY = ("estimator", "recipes", "server")


class InstalledPackageOnly(importlib.abc.MetaPathFinder):
    """Refuses the top-level import of a package directory of the checkout; submodules of canifinetune pass."""

    def find_spec(self, fullname, path=None, target=None):
        if path is None and fullname in CHECKOUT_ONLY:
            raise ModuleNotFoundError(
                f"tests import the installed package: `import canifinetune.{fullname}`, not `import {fullname}` "
                f"(tests/conftest.py: {fullname}/ of the checkout is on sys.path only for benchmarks/, and would "
                f"load a second copy of every module)", name=fullname)
        return None


sys.meta_path.insert(0, InstalledPackageOnly())


@pytest.fixture(autouse=True)
def _fresh_term_caches():
    """Each test computes the memory terms afresh (estimator/term_cache.py keeps them across calls): a test that
    patches the memory model, or counts the constants it reads, must not be answered from another test's terms."""
    from canifinetune.estimator.term_cache import clear_all

    clear_all()
    yield
