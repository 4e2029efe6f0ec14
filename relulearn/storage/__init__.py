"""zarr storage of runs: schema, ledger, fingerprint, atomic commits, the writer's lease."""

from .errors import Damage, NotAStoreError, StoreDamagedError, StoreError
from .store import FORMAT_VERSION, RunStore, diff_fields, flatten

__all__ = [
    "FORMAT_VERSION",
    "RunStore",
    "StoreError",
    "NotAStoreError",
    "StoreDamagedError",
    "Damage",
    "diff_fields",
    "flatten",
]
from .views import LEDGER_COLUMNS, StoredRun, ledger_platforms, open_store  # noqa: E402

__all__ += ["LEDGER_COLUMNS", "StoredRun", "ledger_platforms", "open_store"]
from .lease import Lease, LeaseInfo, LeaseLostError, StoreLockedError, read_lease, writing  # noqa: E402

__all__ += ["Lease", "LeaseInfo", "LeaseLostError", "StoreLockedError", "read_lease", "writing"]
