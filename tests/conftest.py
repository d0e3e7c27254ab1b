import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# benchmarks/ is not an installed package; tests import its harness from the checkout.
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
