"""Exit policies as data: what a remote inference runner needs to walk the chain the way the local one does.

``encode_policy(policy) -> bytes`` and ``decode_policy(bytes) -> ExitPolicy`` round-trip every policy the app
serves (fixed exit, budget-greedy, confidence and entropy thresholds, patience, the dynamic index at any operating
point) exactly: the tables travel as float64 arrays in an ``.npz`` (``allow_pickle=False``: nothing in it can run
code), its kind and scalars as JSON beside them. ``policy_key`` names the encoding (SHA-256), so a client sends
a policy once and then only its key.
"""

from __future__ import annotations

import hashlib
import io
import json
from typing import Any

import numpy as np

from models.chain import ChainSolution
from models.policies import (
    BudgetGreedy,
    ConfidenceThreshold,
    DynamicIndex,
    EntropyThreshold,
    ExitPolicy,
    FixedExit,
    Patience,
)


class PolicyWireError(ValueError):
    """Bytes that are not a policy this version can read."""


def encode_policy(policy: ExitPolicy) -> bytes:
    arrays: dict[str, np.ndarray] = {}
    if isinstance(policy, FixedExit):
        meta: dict[str, Any] = {"kind": "fixed", "exit": policy.exit}
    elif isinstance(policy, BudgetGreedy):
        meta = {"kind": "budget-greedy"}
    elif isinstance(policy, ConfidenceThreshold):
        meta = {"kind": "confidence", "threshold": policy.threshold}
    elif isinstance(policy, EntropyThreshold):
        meta = {"kind": "entropy", "threshold": policy.threshold}
    elif isinstance(policy, Patience):
        meta = {"kind": "patience", "patience": policy.patience}
    elif isinstance(policy, DynamicIndex):
        meta = {"kind": "dynamic-index", "name": policy.name, "agreement": policy.agreement,
                "min_exit": policy.min_exit, "statistic": policy.statistic,
                "solutions": [{"objective": s.expected_objective, "lam": s.lam} for s in policy.solutions]}
        arrays["bin_edges"] = np.asarray(policy.bin_edges, np.float64)
        for i, s in enumerate(policy.solutions):
            arrays[f"sigma{i}"] = np.asarray(s.sigma, np.float64)
            arrays[f"weighted{i}"] = np.asarray(s.weighted_loss, np.float64)
        if policy.answer_loss is not None:
            arrays["answer_loss"] = np.asarray(policy.answer_loss, np.float64)
    else:
        raise PolicyWireError(f"no wire form for the policy {type(policy).__name__}")
    buf = io.BytesIO()
    arrays["meta"] = np.frombuffer(json.dumps(meta, sort_keys=True).encode(), np.uint8)
    savez: Any = np.savez
    savez(buf, **arrays)
    return buf.getvalue()


def policy_key(blob: bytes) -> str:
    return hashlib.sha256(blob).hexdigest()


def decode_policy(blob: bytes) -> ExitPolicy:
    try:
        with np.load(io.BytesIO(blob), allow_pickle=False) as z:
            meta = json.loads(bytes(z["meta"]).decode())
            arrays = {k: z[k] for k in z.files if k != "meta"}
    except (ValueError, KeyError, OSError, json.JSONDecodeError) as exc:
        raise PolicyWireError(f"not an encoded policy ({exc})") from exc
    kind = meta.get("kind")
    if kind == "fixed":
        return FixedExit(int(meta["exit"]))
    if kind == "budget-greedy":
        return BudgetGreedy()
    if kind == "confidence":
        return ConfidenceThreshold(float(meta["threshold"]))
    if kind == "entropy":
        return EntropyThreshold(float(meta["threshold"]))
    if kind == "patience":
        return Patience(int(meta["patience"]))
    if kind == "dynamic-index":
        solutions = [ChainSolution(arrays[f"sigma{i}"], float(s["objective"]), arrays[f"weighted{i}"], float(s["lam"]))
                     for i, s in enumerate(meta["solutions"])]
        return DynamicIndex(arrays["bin_edges"], solutions, name=meta["name"], agreement=bool(meta["agreement"]),
                            answer_loss=arrays.get("answer_loss"), min_exit=int(meta["min_exit"]),
                            statistic=meta["statistic"])
    raise PolicyWireError(f"unknown policy kind {kind!r}")
