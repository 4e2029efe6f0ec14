"""zarr storage of runs: schema, ledger, fingerprint, atomic commits, the writer's lease.

The names are imported on first use (PEP 562): the command line imports the store's errors before it has read its
arguments, and importing zarr alone takes a third of a second.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import attach
from .errors import Damage, NotAStoreError, StoreDamagedError, StoreError, StoreMovedError

if TYPE_CHECKING:
    from .lease import Lease, LeaseInfo, LeaseLostError, StoreLockedError, read_lease, writing
    from .store import FORMAT_VERSION, RunStore, diff_fields, flatten
    from .views import LEDGER_COLUMNS, StoredRun, ledger_platforms, open_store, read_one_commit

#: where each name lives
_LAZY = {
    **dict.fromkeys(["FORMAT_VERSION", "RunStore", "diff_fields", "flatten"], ".store"),
    **dict.fromkeys(["LEDGER_COLUMNS", "StoredRun", "ledger_platforms", "open_store", "read_one_commit"], ".views"),
    **dict.fromkeys(["Lease", "LeaseInfo", "LeaseLostError", "StoreLockedError", "read_lease", "writing"], ".lease"),
}

__all__ = [
    "FORMAT_VERSION",
    "RunStore",
    "StoreError",
    "NotAStoreError",
    "StoreDamagedError",
    "StoreMovedError",
    "Damage",
    "diff_fields",
    "flatten",
    "LEDGER_COLUMNS",
    "StoredRun",
    "ledger_platforms",
    "open_store",
    "read_one_commit",
    "Lease",
    "LeaseInfo",
    "LeaseLostError",
    "StoreLockedError",
    "read_lease",
    "writing",
]


__getattr__, __dir__ = attach(__name__, _LAZY, __all__)
