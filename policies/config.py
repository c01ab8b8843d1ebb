"""Configuration of the policies: pydantic models with units in names, unknown keys rejected."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

SolverName = Literal["highs", "cbc", "gurobi"]


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class WarmPlanConfig(_Frozen):
    """Settings of the warm-backup ILP (FailLite eq. 1-7 plus §3.4's extensions)."""

    alpha: float = Field(0.1, ge=0.0, le=1.0,
                         description="share of total free capacity kept for cold failover")
    replicas: int = Field(1, ge=0, le=16, description="warm backups per app in K (R)")
    site_independent: bool | None = Field(
        None, description="a backup never shares a site with its primary; an app's backups "
                          "use distinct sites (waived for a pinned app). None: on when two "
                          "or more sites have a live server "
                          "(policies/replica_rules.py resolve_site_independent)")
    solver: SolverName = "highs"
    time_limit_s: float = Field(30.0, gt=0.0)
    mip_rel_gap: float = Field(1e-4, ge=0.0, le=1.0)
    threads: int | None = Field(None, ge=1)
    method: Literal["decomposed", "full", "heuristic", "auto"] = Field(
        "decomposed", description="'decomposed': an aggregate ILP picks the variants, a packer "
                                  "places them, the aggregate bound certifies the gap; 'full': "
                                  "one MIP over every pruned app x variant x server column; "
                                  "'heuristic': FailLite Algorithm 1 over K, no ILP "
                                  "(policies/warm_heuristic.py); 'auto': 'decomposed' when "
                                  "(apps in K) x (live servers) <= auto_ilp_max_size, else "
                                  "'heuristic'")
    auto_ilp_max_size: int = Field(
        400_000, ge=0, description="largest (apps in K) x (live servers) that method 'auto' "
                                   "gives the ILP; 1964 x 100 solved in about 3.4 s on a "
                                   "2-core machine")
    exact_fallback_max_columns: int = Field(
        5000, ge=0, description="'decomposed' also solves the full MIP when its certified gap "
                                "exceeds mip_rel_gap and the instance has at most this many "
                                "columns (small instances are then solved exactly)")
    keep_current_bonus: float = Field(
        1e-3, ge=0.0, le=0.1,
        description="objective bonus (relative) for keeping an existing warm backup where it "
                    "is, so re-planning does not churn loaded models for nothing")


class ProgressiveConfig(_Frozen):
    """Settings of the progressive-failover heuristic (FailLite Algorithm 1)."""

    upgrade: bool = Field(True, description="run the upgrade_model pass")
    order: Literal["priority", "input"] = Field(
        "priority", description="'priority': critical apps first, then larger demand first; "
                                "'input': the order given (the paper's)")
    preempt_warm: bool = Field(
        False, description="when the free capacity cannot recover every affected app, unload "
                           "the fewest, least valuable warm backups of healthy apps that let "
                           "more affected apps recover (policies/preemption.py)")
